"""The gauntlet's console report: the strata table with each policy's success rate, the events and
the recommendation (job=gauntlet prints it; job=gauntlet_history prints saved results with it)."""

from __future__ import annotations

from typing import Any, Optional

from vlaeval import console
from vlaeval.gauntlet.result import GauntletResult
from vlaeval.seqtest import DECISION_PASS, DECISION_REGRESSION, MODE_EXACT
from vlaeval.seqtest.units import SuccessRateInterval
from vlaeval.tracking.record import RunRecord


def evalue(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def rate(interval: Optional[SuccessRateInterval]) -> str:
    """A success rate with its 95% interval, compactly: 0.903 [.893,.913]."""
    if interval is None or interval.rate is None or interval.lower is None or interval.upper is None:
        return "-"
    short = lambda x: f"{x:.3f}".lstrip("0") if x < 1 else "1"  # noqa: E731
    return f"{interval.rate:.3f} [{short(interval.lower)},{short(interval.upper)}]"


MODE_LABEL = {"exact": "", "asymptotic": "ASYMPTOTIC", "group_sequential": "GROUP-SEQUENTIAL"}


def planted_text(effect: Any) -> str:
    """A success-rate difference as +0.030; a rollout degradation as its non-zero settings."""
    if isinstance(effect, dict):
        return ", ".join(f"{k} {v:g}" for k, v in effect.items() if v) or "-"
    return f"{effect:+.3f}"


def print_summary(result: GauntletResult, run: Optional[RunRecord] = None) -> None:
    """The strata table, events and recommendation (also for results saved by older versions:
    GauntletResult.from_json); `run`: what publish recorded (the result file, the MLflow run)."""
    label = MODE_LABEL.get(result.test_mode, result.test_mode.upper())
    cs_title = f"{1 - result.strata[0].alpha:.0%} CS" if result.strata else "CS"
    cs_title += f" ({label})" if label else ""
    planted = any(s.planted_effect for s in result.strata)
    rows = []
    approximate = result.test_mode != MODE_EXACT
    for s in result.strata:
        cs = s.confidence_sequence
        decided = s.decision in (DECISION_PASS, DECISION_REGRESSION)
        rows.append(
            (s.priority, s.stratum, s.data_label)
            + ((planted_text(s.planted_effect),) if planted else ())
            + (
                f"approximate {s.decision}" if approximate and decided else s.decision,
                f"{s.units_evaluated}/{s.unit_limit}",
                "-" if s.decided_at_unit is None else f"{s.decided_at_unit:,}",
                rate(s.success_rates.get("baseline")),
                rate(s.success_rates.get("candidate")),
                f"{s.delta_estimate:+.4f}" if s.delta_estimate is not None else "-",
                f"[{cs.lower:+.3f}, {cs.upper:+.3f}]",
                evalue(s.e_value_regression),
                evalue(s.e_value_pass),
            )
        )
    width = len(rows[0]) if rows else 12
    before_decision = ("",) * (1 + int(planted))  # the data label (and planted effect) columns
    for name, status in [(n, "not evaluated") for n in result.not_evaluated] + [
        (n, "absent") for n in result.absent_strata
    ]:
        row = ("", name, *before_decision, status)
        rows.append(row + ("",) * (width - len(row)))
    console.show(
        console.table(
            f"Launch gauntlet {result.candidate_version} vs {result.baseline_version}"
            + (f"  [{label} test mode: not exact]" if label else ""),
            ["#", "stratum", "data"]
            + (["planted"] if planted else [])
            + [
                "decision",
                "units",
                "decided at",
                "baseline (95% CI)",
                "candidate (95% CI)",
                "delta",
                cs_title,
                "e(reg)",
                "e(pass)",
            ],
            rows,
        )
    )
    for s in result.strata:  # an outcome file's test: what earlier evidence it continued
        continuation = s.continuation
        if continuation.get("note"):
            console.show(f"  {s.stratum}: {continuation['note']}")
    for e in result.events:
        console.show(f"  {e.event}: {e.detail}")
    rec, scale = result.recommendation, result.scale
    console.show(
        f"recommendation: {console.styled(rec.recommendation)}   units evaluated "
        f"{scale.units_evaluated:,} of {scale.total_units_defined:,} defined (budget "
        f"{scale.budget_units:,})   lineage {'valid' if result.lineage_valid else 'INVALID'}"
    )
    for line in rec.blockers:
        console.show(f"  blocker: {line}")
    for line in rec.review_reasons:
        console.show(f"  review: {line}")
    if run is not None:
        console.show(run.where())
