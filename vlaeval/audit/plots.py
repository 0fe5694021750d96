"""The residual audit's figure: score vs gradient RMS, permutation nulls, leave-one-out and the
per-anchor spread across estimator seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import numpy as np

from vlaeval.artifacts import atomic_write_bytes


def plot_audit(
    score: np.ndarray,
    gradient_rms: np.ndarray,
    matrix: np.ndarray,
    alignment: Dict[str, Any],
    robustness: Dict[str, Any],
    null_spearman: np.ndarray,
    null_ratio: np.ndarray,
    path: Path,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    rho = alignment["spearman_residual_vs_gradient_rms"]
    ax[0, 0].loglog(score, gradient_rms, "o", markersize=4)
    ax[0, 0].set(xlabel="residual score", ylabel="gradient RMS", title=f"score vs gradient RMS (Spearman {rho:.3f})")
    ax[0, 1].hist(null_spearman, bins=60, color="grey")
    ax[0, 1].axvline(rho, color="red", label=f"observed {rho:.3f}")
    ax[0, 1].set(title="permutation null: Spearman", xlabel="Spearman")
    ax[0, 1].legend()
    ratio = alignment["proposal"]["information_to_baseline_ratio"]
    ax[0, 2].hist(null_ratio, bins=60, color="grey")
    ax[0, 2].axvline(ratio, color="red", label=f"observed {ratio:.3f}")
    ax[0, 2].axvline(alignment["proposal"]["oracle_ratio"], color="green", linestyle="--", label="in-sample oracle")
    if alignment["proposal"].get("attainable_oracle_ratio") is not None:
        ax[0, 2].axvline(
            alignment["proposal"]["attainable_oracle_ratio"],
            color="green",
            linestyle=":",
            label="attainable oracle (cross-fitted)",
        )
    ax[0, 2].set(title="permutation null: second-moment ratio", xlabel="ratio (1 = uniform)")
    ax[0, 2].legend()
    ax[1, 0].plot(robustness["spearman"], ".")
    ax[1, 0].axhline(0, color="black", linewidth=1)
    ax[1, 0].set(title="leave-one-out Spearman", xlabel="anchor left out")
    ax[1, 1].plot(robustness["second_moment_ratios"], ".")
    ax[1, 1].axhline(1, color="black", linewidth=1)
    ax[1, 1].set(title="leave-one-out second-moment ratio", xlabel="anchor left out")
    order = np.argsort(score)
    ax[1, 2].errorbar(np.arange(score.size), score[order], yerr=matrix.std(axis=0, ddof=1)[order], fmt=".", capsize=2)
    ax[1, 2].set(
        yscale="log",
        title="per-anchor spread across estimator seeds",
        xlabel="anchor (sorted by score)",
        ylabel="residual",
    )
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
    plt.close(fig)
    return path
