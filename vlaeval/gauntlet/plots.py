"""Plots of the gauntlet's e-process trajectories and confidence sequences, cluster by cluster."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List

import numpy as np

from vlaeval.artifacts import atomic_write_bytes
from vlaeval.gauntlet.result import GauntletResult, StratumResult


def _log10(values: Any) -> np.ndarray:
    return np.log10(np.maximum(np.asarray(values, dtype=np.float64), 1e-300))


def _plot_e_processes(axis: Any, s: StratumResult, units: np.ndarray) -> Any:
    """A stratum's two decision e-processes (log10 wealth, from 1 before the first unit) and a star
    where the deciding one crossed; returns the stratum's colour."""
    (line,) = axis.plot(
        np.r_[0, units],
        np.r_[0.0, _log10(s.trajectory["e_value_regression"])],
        label=f"{s.stratum} regression",
        linestyle="--",
        linewidth=1,
    )
    color = line.get_color()
    axis.plot(
        np.r_[0, units], np.r_[0.0, _log10(s.trajectory["e_value_pass"])], color=color, label=f"{s.stratum} pass",
        linewidth=1.3,
    )  # fmt: skip
    if s.decided_at_unit is not None and s.decision_wealth is not None:
        axis.plot(
            [s.decided_at_unit],
            [math.log10(max(s.decision_wealth, 1e-300))],
            marker="*",
            markersize=12,
            color=color,
            markeredgecolor="black",
            linestyle="none",
        )
    return color


def _plot_halt(axis: Any, result: GauntletResult, s: StratumResult, units: np.ndarray, color: Any) -> None:
    """A halting stratum's one-sided upper bound, a triangle where the candidate was halted, an X
    where the bound certified a catastrophic regression."""
    tr = s.trajectory
    axis.plot(
        units,
        tr["catastrophic_upper"],
        color=color,
        linestyle="-.",
        linewidth=1,
        label=f"{s.stratum} halt bound (level {1 - (s.catastrophic_alpha or 0.0):.3g})",
    )
    halt = next((e for e in result.events if e.event == "CATASTROPHIC_HALT" and e.stratum == s.stratum), None)
    if halt is not None and s.decided_at_unit is not None:  # where the candidate was halted
        axis.plot(
            [s.units_evaluated],
            [s.delta_estimate],
            marker="v",
            markersize=10,
            color="red",
            markeredgecolor="black",
            linestyle="none",
            label=f"{s.stratum} halted ({halt.figures.get('halt_rule', 'certified_catastrophic')})",
        )
    bound = s.catastrophic_bound
    if s.catastrophic == "CATASTROPHIC" and bound is not None and bound.decided_at_unit is not None:
        axis.plot(
            [bound.decided_at_unit],
            [bound.upper_bound_at_decision],
            marker="X",
            markersize=11,
            color="red",
            markeredgecolor="black",
            linestyle="none",
        )


def _frame_e_axis(axis: Any, result: GauntletResult, strata: List[StratumResult]) -> None:
    """The PASS and REGRESSION thresholds, or, in an approximate mode, why there is nothing to draw."""
    if result.test_mode == "exact":
        alpha = strata[0].alpha if strata else 0.05
        alarm = strata[0].alarm_alpha if strata else alpha
        axis.axhline(math.log10(1 / alpha), color="black", linewidth=1, label=f"PASS at 1/alpha = {1 / alpha:g}")
        if alarm != alpha:
            axis.axhline(
                math.log10(1 / alarm),
                color="black",
                linewidth=1,
                linestyle="--",
                label=f"REGRESSION at 1/alarm_alpha = {1 / alarm:g}",
            )
        axis.set_title(
            f"e-processes after every {_step(strata)} (solid: PASS side, dashed: REGRESSION side; * = decision)"
        )
        axis.legend(fontsize=7, ncol=2)
    else:
        axis.text(
            0.5,
            0.5,
            f"{result.test_mode.upper()} test mode: no e-values (decisions from normal-approximation boundaries)",
            ha="center",
            va="center",
            transform=axis.transAxes,
        )
    axis.set_ylabel("log10 wealth")
    axis.set_xlabel("units evaluated in stratum")


def _frame_cs_axis(axis: Any, result: GauntletResult, strata: List[StratumResult]) -> None:
    """Limits that frame the estimates and the lines that decide (the first clusters' bounds span
    [-1, 1]), the margin and the catastrophic line, labels."""
    if strata:
        estimates = np.concatenate([np.asarray(s.trajectory["delta_estimate"], dtype=np.float64) for s in strata])
        lines = [-s.margin_delta for s in strata] + [
            -s.catastrophic_delta for s in strata if s.catastrophic_delta is not None
        ]
        axis.set_ylim(max(-1.0, min(estimates.min(), *lines) - 0.1), min(1.0, max(estimates.max(), *lines) + 0.1))
        axis.axhline(-strata[0].margin_delta, color="black", linewidth=1, linestyle=":", label="-margin")
        halting = [s.catastrophic_delta for s in strata if s.catastrophic_delta is not None]
        if halting:
            axis.axhline(
                -halting[0],
                color="red",
                linewidth=1,
                linestyle=":",
                label="-catastrophic (X: the halt bound certifies it)",
            )
    axis.set_xlabel("units evaluated in stratum")
    axis.set_ylabel("Delta (candidate - baseline)")
    axis.set_title(
        f"point estimate and confidence sequence after every {_step(strata)} (dots: batch ends)"
        if result.test_mode == "exact"
        else f"point estimate and {result.test_mode.upper()} confidence bounds (opt-in mode, not exact)"
    )
    axis.legend(fontsize=7, ncol=2)


def _step(strata: List[StratumResult]) -> str:
    """What one record of the plotted trajectories is: a cluster, or (an outcome file's order-free
    test, whose e-values are averages over its orders) a look."""
    per_look = [(s.details.get("cluster_order") or {}).get("mode") == "order_free" for s in strata]
    if per_look and all(per_look):
        return "look (an outcome file: e-values averaged over its fixed orders)"
    return "cluster" + (" (an outcome file's strata: after every look)" if any(per_look) else "")


def plot_trajectories(result: GauntletResult, path: Path) -> Path:
    """Top: each stratum's two decision e-processes after every cluster (log10 wealth), with a star
    where the deciding one crossed its threshold. Bottom (a triangle where the candidate was halted,
    an X where the halt bound certified a catastrophic regression): the
    point estimate and the confidence sequence after every cluster; dots mark batch ends; a
    halting stratum also shows the one-sided upper bound the halt is decided on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strata = [s for s in result.strata if s.trajectory.get("clusters")]
    fig, axes = plt.subplots(2, 1, figsize=(10, 8), sharex=False)
    e_axis, cs_axis = axes
    for s in strata:
        tr = s.trajectory
        units = np.asarray(tr["units"], dtype=np.float64)
        ends = np.asarray(s.look_ends(), dtype=np.int64)
        color = _plot_e_processes(e_axis, s, units) if result.test_mode == "exact" else None
        (line,) = cs_axis.plot(units, tr["delta_estimate"], color=color, label=s.stratum, linewidth=1.2)
        color = line.get_color()
        cs_axis.fill_between(units, tr["cs_lower"], tr["cs_upper"], color=color, alpha=0.2, step="post")
        cs_axis.plot(
            units[ends], np.asarray(tr["delta_estimate"])[ends], marker="o", markersize=3, color=color, linestyle="none"
        )
        if "catastrophic_upper" in tr:
            _plot_halt(cs_axis, result, s, units, color)
    _frame_e_axis(e_axis, result, strata)
    _frame_cs_axis(cs_axis, result, strata)
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path
