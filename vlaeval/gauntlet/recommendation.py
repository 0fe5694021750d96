"""The launch recommendation: LAUNCH, DO_NOT_LAUNCH or NEEDS_REVIEW, with blockers and reasons.

Launch is an intersection-union decision: every stratum must PASS on its own anytime-valid
test, so no multiplicity correction is needed for it (a wrong LAUNCH needs every test wrong,
including the one on the stratum that is truly worse). REGRESSION alarms are the opposite, a union
over strata, so the scheduler splits their level (vlaeval.gauntlet.strata.alarm_alpha). Any
certified REGRESSION, a catastrophic halt or invalid lineage blocks; an undecided or unevaluated
stratum, a required stratum the outcome source lacks, or a PASS from an opt-in approximate mode
(asymptotic, group-sequential) needs a human.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from vlaeval.seqtest import DECISION_INSUFFICIENT, DECISION_PASS, DECISION_REGRESSION

LAUNCH = "LAUNCH"
DO_NOT_LAUNCH = "DO_NOT_LAUNCH"
NEEDS_REVIEW = "NEEDS_REVIEW"


def launch_recommendation(
    strata_results: Sequence[Mapping[str, Any]],
    not_evaluated: Sequence[str],
    *,
    halted: bool,
    lineage: Mapping[str, Any],
    test_mode: str = "exact",
    required_absent: Sequence[str] = (),
) -> Dict[str, Any]:
    blockers: List[str] = []
    review: List[str] = []
    if halted:
        blockers.append("gauntlet halted: certified catastrophic regression")
    for problem in lineage.get("problems", []):
        blockers.append(f"invalid lineage: {problem}")
    for r in strata_results:
        name, decision = r["stratum"], r["decision"]
        cs = r["confidence_sequence"]
        if decision == DECISION_REGRESSION:
            blockers.append(
                f"{name}: REGRESSION (delta {r['delta_estimate']:+.4f}, CS [{cs['lower']:+.3f}, {cs['upper']:+.3f}])"
            )
        elif decision == DECISION_INSUFFICIENT:
            kind = " (a safety stratum)" if r.get("kind") == "safety" else ""
            review.append(
                f"{name}{kind}: undecided after {r['units_evaluated']} units "
                f"(CS [{cs['lower']:+.3f}, {cs['upper']:+.3f}])"
            )
    for name in not_evaluated:
        review.append(f"{name}: not evaluated" + (" (halted)" if halted else " (budget exhausted)"))
    for name in required_absent:
        review.append(f"{name}: required (strata.{name}.required) but absent from the outcome source")
    evaluated_labels = sorted({r["data_label"] for r in strata_results if r["units_evaluated"] > 0})
    if strata_results and "REPLAYED" not in evaluated_labels:
        review.append("no stratum with REPLAYED (real-world) data was evaluated")
    passed = [r["stratum"] for r in strata_results if r["decision"] == DECISION_PASS]
    if passed and test_mode != "exact":
        # An asymptotic or group-sequential PASS rests on a normal approximation: never an automatic launch.
        review.append(
            f"PASS decisions are {test_mode.upper().replace('_', '-')} (gauntlet.test_mode={test_mode}), not "
            "exact: re-run with test_mode=exact before launching"
        )
    recommendation = DO_NOT_LAUNCH if blockers else (NEEDS_REVIEW if review else LAUNCH)
    return {
        "recommendation": recommendation,
        "blockers": blockers,
        "review_reasons": review,
        "passed_strata": passed,
        "data_labels": evaluated_labels,
        "rule": "intersection-union: LAUNCH only if every stratum PASSes its own level-alpha test",
    }
