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
    exact = result.get("test_mode", "exact") == "exact"
    for s in strata:
        units = [p["units"] for p in s["trajectory"]]
        color = None
        if exact:
            # Every e-process starts at 1 (log10 = 0) before the first unit.
            line, = e_axis.plot([0] + units, [0.0] + [math.log10(max(p["e_value_regression"], 1e-300)) for p in s["trajectory"]],
                                label=f"{s['stratum']} regression", linestyle="--", marker=".")
            color = line.get_color()
            e_axis.plot([0] + units, [0.0] + [math.log10(max(p["e_value_pass"], 1e-300)) for p in s["trajectory"]],
                        color=color, label=f"{s['stratum']} pass", marker="o", markersize=3)
        line, = cs_axis.plot(units, [p["delta_estimate"] for p in s["trajectory"]], color=color, label=s["stratum"],
                             marker="o", markersize=3)
        cs_axis.fill_between(units, [p["cs_lower"] for p in s["trajectory"]], [p["cs_upper"] for p in s["trajectory"]],
                             color=line.get_color(), alpha=0.2)
    alpha = strata[0]["alpha"] if strata else 0.05
    alarm = strata[0].get("alarm_alpha", alpha) if strata else alpha
    if exact:
        e_axis.axhline(math.log10(1 / alpha), color="black", linewidth=1, label=f"PASS at 1/alpha = {1 / alpha:g}")
        if alarm != alpha:
            e_axis.axhline(math.log10(1 / alarm), color="black", linewidth=1, linestyle="--",
                           label=f"REGRESSION at 1/alarm_alpha = {1 / alarm:g}")
        e_axis.set_title("e-processes per stratum (solid: PASS side, dashed: REGRESSION side)")
        e_axis.legend(fontsize=7, ncol=2)
    else:
        e_axis.text(0.5, 0.5, "ASYMPTOTIC test mode: no e-values (decisions from asymptotic CSs)",
                    ha="center", va="center", transform=e_axis.transAxes)
    e_axis.set_ylabel("log10 e-value")
    if strata:
        cs_axis.axhline(-strata[0]["margin_delta"], color="black", linewidth=1, linestyle=":", label="-margin")
        halting = [s for s in strata if s.get("catastrophic_delta") is not None]
        if halting:
            cs_axis.axhline(-halting[0]["catastrophic_delta"], color="red", linewidth=1, linestyle=":",
                            label="-catastrophic (halt when a halting stratum's CS is below)")
    cs_axis.set_xlabel("units evaluated in stratum")
    cs_axis.set_ylabel("Delta (candidate - baseline)")
    cs_axis.set_title("point estimate and anytime-valid confidence sequence" if exact else
                      "point estimate and ASYMPTOTIC confidence sequence (opt-in mode, not exact)")
    cs_axis.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path
