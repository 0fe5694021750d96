"""The gauntlet's console report: the strata table with each policy's success rate, the events and
the recommendation (job=gauntlet prints it; job=gauntlet_history prints saved results with it)."""

from __future__ import annotations

from typing import Any, Optional

from vlaeval import console
from vlaeval.choices import Question, TestMode
from vlaeval.gauntlet.question import Asked
from vlaeval.gauntlet.result import GauntletResult, StratumResult
from vlaeval.seqtest import DECISION_PASS, DECISION_REGRESSION
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


MODE_LABEL = {"exact": "", "horizon": "HORIZON", "asymptotic": "ASYMPTOTIC", "group_sequential": "GROUP-SEQUENTIAL"}
ORDER_FREE_NOTE = (
    "an outcome file's e-value is the average over its fixed orders of each order's e-value, each stopped once it "
    "reaches min(4, orders)/alpha: a decided file stratum reads at most min(4, orders)/alpha (80 at 16 orders and "
    "alpha 0.05)"
)


def planted_text(effect: Any) -> str:
    """A success-rate difference as +0.030; a rollout degradation as its non-zero settings."""
    if isinstance(effect, dict):
        return ", ".join(f"{k} {v:g}" for k, v in effect.items() if v) or "-"
    return f"{effect:+.3f}"


def e_value_legend(result: GauntletResult) -> str:
    """What the e-value columns mean, in one line under the table."""
    asked = Asked(Question(result.question), result.superiority_gain)
    up, down = ("e(better)", "e(worse)") if not asked.launch else ("e(pass)", "e(reg)")
    alpha = result.strata[0].alpha if result.strata else 0.05
    line = (
        f"{up} / {down}: the evidence (e-value) against Delta on the other side of the margin; a side decides "
        f"once it reaches 1/level (1/{alpha:g} = {1 / alpha:g} for {up})"
    )
    if any(s.details.get("cluster_order", {}).get("mode") == "order_free" for s in result.strata):
        line += "; " + ORDER_FREE_NOTE
    if result.test_mode == TestMode.horizon:
        line += "; in horizon mode they are the anytime test's, reported beside the horizon test's decisions"
    return line


def stratum_lines(s: StratumResult, asked: Asked) -> list[str]:
    """What a decided stratum certifies (one-sided) beside the two-sided CS, and for a file, where a
    stream in its recorded order would have decided."""
    lines = []
    cs = s.confidence_sequence
    if s.decision in (DECISION_PASS, DECISION_REGRESSION) and s.certifies:
        lines.append(
            f"{s.stratum}: {s.answer}: {s.certifies}; the {cs.level:.0%} CS [{cs.lower:+.3f}, {cs.upper:+.3f}] is "
            "two-sided (alpha/2 each side), so it can reach past the margin a one-sided decision has crossed"
        )
    recorded = s.recorded_order
    if recorded is not None:
        said = (
            f"decided {asked.answer(recorded.decision)} after {recorded.decided_at_cluster} of {recorded.clusters} "
            "clusters"
            if recorded.decided_at_cluster is not None
            else f"not decided within its {recorded.clusters} clusters"
        )
        lines.append(
            f"{s.stratum}: read as a stream in the file's recorded order, the anytime test {said} -- the recorded "
            "order, not the certificate (a file is decided order-free; to test it as a stream in its order, declare "
            "that order random before seeing it: gauntlet.test_mode=horizon gauntlet.cluster_order=as_given)"
        )
    return lines


def stratum_row(s: StratumResult, planted: bool, approximate: bool) -> tuple:
    """One evaluated stratum's row of the table."""
    cs = s.confidence_sequence
    decided = s.decision in (DECISION_PASS, DECISION_REGRESSION)
    return (
        (s.priority, s.stratum, s.data_label)
        + ((planted_text(s.planted_effect),) if planted else ())
        + (
            f"approximate {s.answer}" if approximate and decided else s.answer,
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


def strata_table(result: GauntletResult, asked: Asked) -> Any:
    """The strata table: evaluated strata, then those not evaluated and the required ones absent."""
    label = MODE_LABEL.get(result.test_mode, result.test_mode.upper())
    approximate = not TestMode(result.test_mode).certifies
    planted = any(s.planted_effect for s in result.strata)
    rows = [stratum_row(s, planted, approximate) for s in result.strata]
    width = len(rows[0]) if rows else 12
    before_decision = ("",) * (1 + int(planted))  # the data label (and planted effect) columns
    for name, status in [(n, "not evaluated") for n in result.not_evaluated] + [
        (n, "absent (required)") for n in result.required_absent
    ]:
        row = ("", name, *before_decision, status)
        rows.append(row + ("",) * (width - len(row)))
    cs_title = f"{1 - result.strata[0].alpha:.0%} CS, two-sided" if result.strata else "CS"
    mode = f"  [{label} test mode" + (": not exact]" if approximate else "]") if label else ""
    return console.table(
        f"{'Launch gauntlet' if asked.launch else 'Comparison'}: {result.candidate_version} vs "
        f"{result.baseline_version}{mode}",
        ["#", "stratum", "data"]
        + (["planted"] if planted else [])
        + [
            "decision" if asked.launch else "answer",
            "units",
            "decided at",
            "baseline (95% CI)",
            "candidate (95% CI)",
            "delta",
            cs_title + (f" ({label})" if label else ""),
            "e(reg)" if asked.launch else "e(worse)",
            "e(pass)" if asked.launch else "e(better)",
        ],
        rows,
    )


def print_summary(result: GauntletResult, run: Optional[RunRecord] = None) -> None:
    """The strata table, what it means, events and the recommendation (also for results saved by
    older versions: GauntletResult.from_json); `run`: what publish recorded (the result file, the
    MLflow run)."""
    asked = Asked(Question(result.question), result.superiority_gain)
    console.show(strata_table(result, asked))
    console.show(f"  question: {asked.title()}")
    others = [n for n in result.absent_strata if n not in result.required_absent]
    if others:
        console.show(f"  configured, not in the source (not evaluated, not required): {', '.join(others)}")
    console.show(f"  {e_value_legend(result)}")
    for s in result.strata:
        for line in stratum_lines(s, asked):
            console.show(f"  {line}")
        note = s.continuation.get("note")  # an outcome file's test: what earlier evidence it continued
        if note:
            console.show(f"  {s.stratum}: {note}")
    for e in result.events:
        console.show(f"  {e.event}: {e.detail}")
    rec, scale = result.recommendation, result.scale
    console.show(
        f"{'recommendation' if rec.launch else 'conclusion'}: {console.styled(rec.recommendation)}   units evaluated "
        f"{scale.units_evaluated:,} of {scale.total_units_defined:,} defined (budget "
        f"{scale.budget_units:,})   lineage {'valid' if result.lineage_valid else 'INVALID'}"
    )
    for line in rec.blockers:
        console.show(f"  blocker: {line}")
    for line in rec.review_reasons:
        console.show(f"  {'review' if rec.launch else 'note'}: {line}")
    if run is not None:
        console.show(run.where())
