"""The launch recommendation: LAUNCH, DO_NOT_LAUNCH or NEEDS_REVIEW, with blockers and reasons.

Launch is an intersection-union decision: every stratum must PASS on its own anytime-valid
test, so no multiplicity correction is needed for it (a wrong LAUNCH needs every test wrong,
including the one on the stratum that is truly worse). REGRESSION alarms are the opposite, a union
over strata, so the scheduler splits their level (vlaeval.gauntlet.strata.alarm_alpha). Any
certified REGRESSION, a catastrophic halt or invalid lineage blocks; an undecided or unevaluated
stratum, a required stratum the outcome source lacks, or any decision of an opt-in approximate
mode (asymptotic, group-sequential: its PASS and its REGRESSION are evidence, never a certificate,
and never block by themselves) needs a human. Outcomes the synthetic generator made up (data label
GENERATED) are a demonstration: the recommendation says so, and never LAUNCHes on them alone. Where
the evaluation order is one the user declared random (`gauntlet.cluster_order=as_given`), the
guarantee rests on that declaration: a stratum whose estimand drifts between the first and the second
half of that order (the drift diagnostic, |z| > 3) needs a human before any launch, and so does any
PASS in an outcome file's declared order: the file's rows can be sorted to make it (a null file sorted
best scene first PASSes every time, and a prefix of wins stops the test before any drift shows), so the
launch certificate of a file is its order-free test.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from vlaeval.choices import DataLabel, TestMode
from vlaeval.gauntlet.ledger import CANNOT_CONTINUE, COPIES, LEDGER_OFF, UNTRACKED
from vlaeval.gauntlet.question import Asked
from vlaeval.gauntlet.result import DO_NOT_LAUNCH, LAUNCH, NEEDS_REVIEW, Lineage, Recommendation, StratumResult
from vlaeval.seqtest import DECISION_INSUFFICIENT, DECISION_PASS, DECISION_REGRESSION

# |z| of the first-half / second-half difference past which a declared order is not taken on trust:
# under a random order the two halves are exchangeable, so |z| > 3 happens ~0.3% of the time; a file
# sorted best scene first reads z ~ -20.
DRIFT_REVIEW_Z = 3.0


def declared_order_drift(r: StratumResult) -> Optional[str]:
    """Why a stratum evaluated in a declared order needs a look (None: its halves agree)."""
    d = r.drift
    if d is None or d.z is None or abs(d.z) <= DRIFT_REVIEW_Z:
        return None
    return (
        f"{r.stratum}: in the order declared random (gauntlet.cluster_order=as_given) the estimand drifts from "
        f"{d.first_half:+.3f} over the first {d.clusters // 2} clusters to {d.second_half:+.3f} over the rest "
        f"(z = {d.z:+.1f}): the decision rests on that order being random; check how it was made, or test "
        "without it (gauntlet.cluster_order=shuffled)"
    )


def launch_recommendation(
    strata_results: Sequence[StratumResult],
    not_evaluated: Sequence[str],
    *,
    halted: bool,
    lineage: Lineage,
    test_mode: str = "exact",
    required_absent: Sequence[str] = (),
    declared_order: bool = False,
    order_from_file: bool = False,
) -> Recommendation:
    """`declared_order`: the clusters were evaluated in the source's order, declared random by the user
    (gauntlet.cluster_order=as_given); `order_from_file`: that order is an outcome file's row order."""
    blockers: List[str] = []
    review: List[str] = []
    exact = TestMode(test_mode).certifies
    approximate = test_mode.upper().replace("_", "-")
    if halted:
        blockers.append("gauntlet halted: catastrophic regression in a halting stratum (the CATASTROPHIC_HALT event)")
    for problem in lineage.problems:
        blockers.append(f"invalid lineage: {problem}")
    for r in strata_results:
        name, decision = r.stratum, r.decision
        cs = r.confidence_sequence
        if decision == DECISION_REGRESSION:
            figures = f"delta {r.delta_estimate or 0.0:+.4f}, CS [{cs.lower:+.3f}, {cs.upper:+.3f}]"
            if exact:
                blockers.append(f"{name}: REGRESSION ({figures})")
            else:
                review.append(
                    f"{name}: approximate REGRESSION ({approximate}, {figures}): evidence, not a certificate; "
                    "confirm with gauntlet.test_mode=exact"
                )
        elif decision == DECISION_INSUFFICIENT:
            kind = " (a safety stratum)" if r.kind == "safety" else ""
            review.append(
                f"{name}{kind}: undecided after {r.units_evaluated} units (CS [{cs.lower:+.3f}, {cs.upper:+.3f}])"
            )
        review += evidence_reviews(r, declared_order, order_from_file)
    for name in not_evaluated:
        review.append(f"{name}: not evaluated" + (" (halted)" if halted else " (budget exhausted)"))
    for name in required_absent:
        review.append(f"{name}: required (strata.{name}.required) but absent from the outcome source")
    evaluated_labels, demonstration = data_labels(strata_results)
    if demonstration:
        review.append(
            "demonstration: every evaluated outcome was GENERATED by the synthetic source, not observed; it says "
            "nothing about these policies (use outcomes=file or outcomes=rollout)"
        )
    elif strata_results and DataLabel.REPLAYED.value not in evaluated_labels:
        review.append(
            "no stratum with REPLAYED (real-world) data was evaluated"
            + (
                " (the outcome file declares no data_label: add a data_label column saying where each stratum's "
                "outcomes came from)"
                if DataLabel.UNDECLARED.value in evaluated_labels
                else ""
            )
        )
    passed = [r.stratum for r in strata_results if r.decision == DECISION_PASS]
    if passed and not exact:
        # An asymptotic or group-sequential PASS rests on a normal approximation: never an automatic launch.
        review.append(
            f"approximate PASS in {', '.join(passed)} ({approximate}, gauntlet.test_mode={test_mode}): evidence, "
            "not a certificate; confirm with gauntlet.test_mode=exact before launching"
        )
    recommendation = DO_NOT_LAUNCH if blockers else (NEEDS_REVIEW if review else LAUNCH)
    return Recommendation(
        recommendation,
        tuple(blockers),
        tuple(review),
        tuple(passed),
        tuple(evaluated_labels),
        demonstration,
        "intersection-union: LAUNCH only if every stratum PASSes its own level-alpha test",
    )


def data_labels(strata_results: Sequence[StratumResult]) -> Tuple[List[str], bool]:
    """The data labels of the evaluated strata, and whether they are all GENERATED (a demonstration)."""
    labels = sorted({r.data_label for r in strata_results if r.units_evaluated > 0})
    return labels, bool(labels) and set(labels) <= {DataLabel.GENERATED.value}


def evidence_reviews(r: StratumResult, declared_order: bool, order_from_file: bool) -> List[str]:
    """What about a stratum's evidence -- rather than its decision -- needs a human: a re-test that
    could not continue the ledger's record, a PASS no earlier evidence was consulted for, an order
    declared random that drifts, a PASS in a file's own row order."""
    name, passed, continuation = r.stratum, r.decision == DECISION_PASS, r.continuation
    reasons: List[str] = []
    if continuation.get("status") in (CANNOT_CONTINUE, COPIES):
        reasons.append(f"{name}: {continuation.get('note')}")
    if continuation.get("ledger") in (LEDGER_OFF, UNTRACKED) and passed:
        # Without the ledger -- off, or empty with no tracking store read -- a re-test after a non-PASS
        # (drop the worst scenes, run again: 0.57-0.66 of null files of 300 scenes then PASS) is a fresh
        # test whose errors add up: such a PASS is not a certificate by itself.
        reasons.append(f"{name}: PASS with {continuation.get('note')}")
    drift = declared_order_drift(r) if declared_order else None
    if drift is not None:
        reasons.append(drift)
    elif declared_order and order_from_file and passed:
        reasons.append(
            f"{name}: PASS in the outcome file's row order (gauntlet.cluster_order=as_given), which the rows "
            "can be sorted to make: launch on the file's order-free test (leave gauntlet.cluster_order=shuffled "
            "and gauntlet.test_mode=exact)"
        )
    return reasons


def comparison_conclusion(
    asked: Asked,
    strata_results: Sequence[StratumResult],
    not_evaluated: Sequence[str],
    *,
    test_mode: str,
    declared_order: bool = False,
    order_from_file: bool = False,
) -> Recommendation:
    """A comparison's answer (BETTER, NOT_BETTER / WORSE, MIXED or UNDECIDED) from its strata's, with
    notes -- what was not decided or evaluated, what an approximate mode's answers are worth -- and no
    blocker: a comparison is not a launch. A stratum whose declared order drifts is UNDECIDED: its
    answer rests on an order the data say was not random."""
    answers, notes = declared_order_answers(asked, strata_results, declared_order, order_from_file)
    certifying = TestMode(test_mode).certifies
    notes += open_questions(strata_results, not_evaluated, test_mode)
    labels, demonstration = data_labels(strata_results)
    if demonstration:
        notes.append("demonstration: every evaluated outcome was GENERATED by the synthetic source, not observed")
    conclusion = asked.conclusion(answers) if certifying else "UNDECIDED"
    if not_evaluated and conclusion == "BETTER":
        conclusion = "UNDECIDED"  # BETTER needs every stratum
    return Recommendation(
        conclusion,
        (),
        tuple(notes),
        tuple(r.stratum for r, a in zip(strata_results, answers) if a == "BETTER"),
        tuple(labels),
        demonstration,
        "a comparison: BETTER only if every stratum is certified BETTER; each direction of each stratum at alpha",
        kind="comparison",
    )


def open_questions(strata_results: Sequence[StratumResult], not_evaluated: Sequence[str], test_mode: str) -> List[str]:
    """A comparison's notes on what it leaves open: approximate answers, undecided and unevaluated strata."""
    notes = []
    if not TestMode(test_mode).certifies:
        notes.append(
            f"approximate ({test_mode}) answers: evidence, not a certificate; confirm with gauntlet.test_mode=exact"
        )
    for r in strata_results:
        if r.decision == DECISION_INSUFFICIENT:
            cs = r.confidence_sequence
            notes.append(
                f"{r.stratum}: undecided after {r.units_evaluated} units ({cs.level:.0%} CS [{cs.lower:+.3f}, "
                f"{cs.upper:+.3f}])"
            )
    return notes + [f"{name}: not evaluated (budget exhausted)" for name in not_evaluated]


def declared_order_answers(
    asked: Asked, strata_results: Sequence[StratumResult], declared_order: bool, order_from_file: bool
) -> Tuple[List[str], List[str]]:
    """Each stratum's answer -- UNDECIDED where its declared order drifts -- and the notes that say why."""
    drifts = [declared_order_drift(r) if declared_order else None for r in strata_results]
    answers = [asked.answer(DECISION_INSUFFICIENT if drift else r.decision) for r, drift in zip(strata_results, drifts)]
    notes = [drift for drift in drifts if drift]
    if declared_order and order_from_file:
        notes.append(
            "the answers rest on the outcome file's row order being random, as declared "
            "(gauntlet.cluster_order=as_given); the file's order-free test (test_mode=exact) does not"
        )
    return answers, notes
