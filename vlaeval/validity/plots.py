"""job=offline_validity's figure: each offline metric against closed-loop success, one point per
checkpoint, with its agreements in the panel's title."""

from __future__ import annotations

import math
from pathlib import Path
from typing import BinaryIO, Mapping, Sequence

import numpy as np

from vlaeval.artifacts import atomic_write_bytes
from vlaeval.validity.statistics import Agreement


def plot_validity(
    metrics: Mapping[str, Sequence[float]],
    success: Sequence[float],
    agreements: Mapping[str, Agreement],
    path: Path,
) -> Path:
    """One panel per metric (its pooled value per checkpoint, as measured) against success."""
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    names = list(metrics)
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        a = agreements[name]
        ax.plot(np.asarray(metrics[name]), np.asarray(success), "o", markersize=4)
        ax.set(
            xlabel=name,
            ylabel="closed-loop success",
            title=f"Spearman {a.spearman:+.2f} [{a.spearman_interval[0]:+.2f}, {a.spearman_interval[1]:+.2f}]\n"
            f"MMRV {a.mmrv:.3f} (unrelated {a.mmrv_unrelated:.3f})",
        )
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)

    def write(handle: BinaryIO) -> None:
        handle.write(buffer.getvalue())

    atomic_write_bytes(path, write)
    return path
