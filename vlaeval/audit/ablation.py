"""What the importance-sampling ablation's runs add up to, per proposal, across training seeds: the
realized second-moment ratio at each measured step, the held-out loss and its paired difference
from uniform's, closed-loop success, the minibatch check, and the audit's prediction against what
was realized. Pure: the runs' records in, typed summaries out (job=ablation runs them)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from vlaeval.audit.proposals import prediction_agreement, seed_interval
from vlaeval.audit.result import AblationRun, AuditPrediction, Measurement, ProposalSummary
from vlaeval.choices import AblationProposal


def summarise_proposals(
    runs: Sequence[AblationRun],
    names: List[str],
    prediction: AuditPrediction,
    measured: List[int],
) -> Dict[str, ProposalSummary]:
    """Per proposal, across seeds: the realized ratio at each measured step, the final held-out
    loss (and its difference from uniform's, paired by seed), success (where every run has it),
    minibatch check, time."""
    by = {(r.proposal, r.seed): r for r in runs}
    seeds = sorted({r.seed for r in runs})
    out: Dict[str, ProposalSummary] = {}
    for name in names:
        mine = [by[(name, s)] for s in seeds]
        row: Dict[str, Any] = {
            "realized_ratio": per_step(mine, measured, lambda m: m.ratio),
            "wall_seconds": float(np.mean([r.wall_seconds for r in mine])),
            "train_seconds": float(np.mean([r.train_seconds for r in mine])),
        }
        row["gain_is_real"] = bool(row["realized_ratio"][str(measured[-1])]["high"] < 1.0)
        if all(m.minibatch is not None for r in mine for m in r.measurements):
            row["minibatch_variance_ratio"] = per_step(mine, measured, minibatch_variance_ratio)
        if all(r.heldout_loss for r in mine):
            uniform = None
            if AblationProposal.uniform in names and name != AblationProposal.uniform:
                uniform = [by[(AblationProposal.uniform.value, s)] for s in seeds]
            row.update(heldout_losses(mine, uniform))
        succeeded = [r.success.success_rate for r in mine if r.success is not None]
        if len(succeeded) == len(mine):
            row["success_rate"] = seed_interval(succeeded).as_dict()
        if name == AblationProposal.residual:
            row.update(prediction_against_realized(row["realized_ratio"], prediction, measured))
        out[name] = ProposalSummary.from_json(row)
    return out


def minibatch_variance_ratio(m: Measurement) -> float:
    assert m.minibatch is not None, "asked for only where every measurement has its minibatch check"
    return float(m.minibatch.variance_ratio["ratio"])


def per_step(
    runs: Sequence[AblationRun], measured: List[int], value: Callable[[Measurement], float]
) -> Dict[str, Dict[str, Any]]:
    """At each measured step, the across-seed interval of `value` of that step's measurements."""
    return {
        str(step): seed_interval([value(m) for r in runs for m in r.measurements if m.step == step]).as_dict()
        for step in measured
    }


def heldout_losses(runs: Sequence[AblationRun], uniform: Optional[Sequence[AblationRun]]) -> Dict[str, Dict[str, Any]]:
    """The final held-out loss across seeds, and (given uniform's runs, seed by seed) its paired
    difference from uniform's."""
    finals = [float(r.heldout_loss[-1][1]) for r in runs]
    out = {"final_heldout_loss": seed_interval(finals).as_dict()}
    if uniform is not None:
        base = [float(u.heldout_loss[-1][1]) for u in uniform]
        out["heldout_loss_minus_uniform"] = seed_interval([f - b for f, b in zip(finals, base)]).as_dict()
    return out


def prediction_against_realized(
    realized: Dict[str, Dict[str, Any]], prediction: AuditPrediction, measured: List[int]
) -> Dict[str, object]:
    """The audit's predicted ratio against the realized one at the first and the last measured step.
    At step 0 the run's parameters are the audited ones: the like-for-like comparison; the last step
    says whether the prediction still holds as training moves the parameters."""
    predicted = prediction.predicted_ratio
    return {
        "predicted_ratio": predicted,
        "prediction_vs_realized": {
            str(step): prediction_agreement(realized[str(step)]["values"], predicted, prediction.predicted_ratio_sd)
            for step in (measured[0], measured[-1])
        },
    }
