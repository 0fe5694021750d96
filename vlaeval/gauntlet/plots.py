"""Plots of the gauntlet's e-process trajectories and confidence sequences."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from vlaeval.artifacts import atomic_write_bytes


def plot_trajectories(result: Mapping[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strata = [s for s in result["strata"] if s["trajectory"]]
    fig, axes = plt.subplots(2, 1, figsize=(10, 8), sharex=False)
    e_axis, cs_axis = axes
    for s in strata:
        units = [p["units"] for p in s["trajectory"]]
        # Every e-process starts at 1 (log10 = 0) before the first unit.
        line, = e_axis.plot([0] + units, [0.0] + [math.log10(max(p["e_value_regression"], 1e-300)) for p in s["trajectory"]],
                            label=f"{s['stratum']} regression", linestyle="--", marker=".")
        e_axis.plot([0] + units, [0.0] + [math.log10(max(p["e_value_pass"], 1e-300)) for p in s["trajectory"]],
                    color=line.get_color(), label=f"{s['stratum']} pass", marker="o", markersize=3)
        cs_axis.fill_between(units, [p["cs_lower"] for p in s["trajectory"]], [p["cs_upper"] for p in s["trajectory"]],
                             color=line.get_color(), alpha=0.2)
        cs_axis.plot(units, [p["delta_estimate"] for p in s["trajectory"]], color=line.get_color(), label=s["stratum"],
                     marker="o", markersize=3)
    alpha = strata[0]["alpha"] if strata else 0.05
    e_axis.axhline(math.log10(1 / alpha), color="black", linewidth=1, label=f"1/alpha = {1 / alpha:g}")
    e_axis.set_ylabel("log10 e-value")
    e_axis.set_title("e-processes per stratum (solid: PASS side, dashed: REGRESSION side)")
    e_axis.legend(fontsize=7, ncol=2)
    if strata:
        cs_axis.axhline(-strata[0]["margin_delta"], color="black", linewidth=1, linestyle=":", label="-margin")
    cs_axis.set_xlabel("units evaluated in stratum")
    cs_axis.set_ylabel("Delta (candidate - baseline)")
    cs_axis.set_title("point estimate and anytime-valid confidence sequence")
    cs_axis.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path
