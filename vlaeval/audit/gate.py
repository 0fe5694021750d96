"""The gate: is the score eligible to drive the 500-step importance-sampling ablation?

Check names are derived from the thresholds (gate=formal is the prototype's set), so a run's checks
say what they tested. Fewer anchors than the formal minimum make the result a smoke run, never
a gate certificate. Whether the score beats the training loss (on draws independent of the
gradient RMS) is an informational line in gate=formal and a required check in gate=strict.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from vlaeval.audit.alignment import Alignment
from vlaeval.audit.result import GateDecision
from vlaeval.audit.statistics import LeaveOneOut, Repeatability
from vlaeval.audit.verdict import RatioVerdict


def threshold_name(value: float) -> str:
    return f"{value:.2f}".replace(".", "_").replace("-", "minus_")


def gate_decision(
    *,
    sample_count: int,
    repeatability: Repeatability,
    alignment: Alignment,
    robustness: LeaveOneOut,
    gate: Any,
    verdict: Optional[RatioVerdict] = None,
) -> GateDecision:
    """The seed's screen (every check, the ratio's a point comparison: "the score carries signal")
    and, given the ratio's three-way verdict, the decision it makes instead of that point check."""
    permutation = alignment.random_permutation_control
    ratio = alignment.proposal.information_to_baseline_ratio
    ratio_check = f"second_moment_ratio_at_most_{threshold_name(gate.second_moment_ratio)}"
    checks = {
        f"sample_count_at_least_{int(gate.min_anchors)}": sample_count >= int(gate.min_anchors),
        f"score_repeatability_spearman_at_least_{threshold_name(gate.repeatability_spearman)}": repeatability.spearman
        >= gate.repeatability_spearman,
        f"score_gradient_spearman_at_least_{threshold_name(gate.score_gradient_spearman)}": alignment.spearman_residual_vs_gradient_rms
        >= gate.score_gradient_spearman,
        f"score_gradient_permutation_p_at_most_{threshold_name(gate.permutation_p)}": permutation.one_sided_pvalue_rho_at_least_observed
        <= gate.permutation_p,
        f"top25_overlap_at_least_{threshold_name(gate.top25_overlap)}": alignment.top25_overlap >= gate.top25_overlap,
        ratio_check: ratio <= gate.second_moment_ratio,
        f"second_moment_permutation_p_at_most_{threshold_name(gate.second_moment_permutation_p)}": permutation.one_sided_pvalue_second_moment_at_most_observed
        <= gate.second_moment_permutation_p,
    }
    if gate.leave_one_out:
        checks["leave_one_out_spearman_all_positive"] = robustness.all_spearman_positive
        checks["leave_one_out_second_moment_all_below_one"] = robustness.all_second_moment_ratios_below_one
    # Does the score beat the training loss it is cheaper than, judged on independent draws? A
    # required check in gate=strict, an informational line otherwise (None: cannot be judged).
    baseline = alignment.baseline_comparison
    beats = None if baseline is None else baseline.score_beats_training_loss
    informational: Dict[str, Any] = {}
    if gate.require_beating_training_loss:
        checks["score_beats_training_loss"] = bool(beats)
    else:
        informational["score_beats_training_loss"] = beats
    passed = all(checks.values())
    formal = sample_count >= int(gate.formal_min_anchors)
    return GateDecision(
        checks=checks,
        passed=passed,
        eligible_for_500_step_ablation=passed and formal,
        status=f"formal_{sample_count}_anchor_gate" if formal else "smoke_not_a_gate_certificate",
        preset=str(gate.name),
        informational=informational,
        verdict=verdict,
        ratio_check=ratio_check if verdict is not None else None,
    )
