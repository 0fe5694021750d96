"""What the importance-sampling ablation's runs add up to, per proposal, across training seeds: the
realized second-moment ratio at each measured step, the held-out loss and its paired difference
from uniform's, closed-loop success, the minibatch check, and the audit's prediction against what
was realized. Pure: the runs' records in, typed summaries out (job=ablation runs them)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from vlaeval.audit.proposals import prediction_agreement, seed_interval
from vlaeval.audit.result import ProposalSummary
from vlaeval.choices import AblationProposal


def summarise_proposals(
    runs: List[Dict[str, Any]],
    names: List[str],
    prediction: Dict[str, Any],
    measured: List[int],
    success: Optional[Dict[str, Any]],
) -> Dict[str, ProposalSummary]:
    """Per proposal, across seeds: the realized ratio at each measured step, the final held-out
    loss (and its difference from uniform's, paired by seed), success, minibatch check, time."""
    by = {(r["proposal"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    out: Dict[str, ProposalSummary] = {}
    for name in names:
        mine = [by[(name, s)] for s in seeds]
        row: Dict[str, Any] = {
            "realized_ratio": {
                str(step): seed_interval(
                    [m["ratio"] for r in mine for m in r["measurements"] if m["step"] == step]
                ).as_dict()
                for step in measured
            },
            "wall_seconds": float(np.mean([r["wall_seconds"] for r in mine])),
            "train_seconds": float(np.mean([r["train_seconds"] for r in mine])),
        }
        final = row["realized_ratio"][str(measured[-1])]
        row["gain_is_real"] = bool(final["high"] < 1.0)
        if all("minibatch" in m for r in mine for m in r["measurements"]):
            row["minibatch_variance_ratio"] = {
                str(step): seed_interval(
                    [
                        m["minibatch"]["variance_ratio"]["ratio"]
                        for r in mine
                        for m in r["measurements"]
                        if m["step"] == step
                    ]
                ).as_dict()
                for step in measured
            }
        if all(r["heldout_loss"] for r in mine):
            row["final_heldout_loss"] = seed_interval([r["heldout_loss"][-1][1] for r in mine]).as_dict()
            if AblationProposal.uniform in names and name != AblationProposal.uniform:
                base = [by[(AblationProposal.uniform.value, s)]["heldout_loss"][-1][1] for s in seeds]
                row["heldout_loss_minus_uniform"] = seed_interval(
                    [r["heldout_loss"][-1][1] - b for r, b in zip(mine, base)]
                ).as_dict()
        if success is not None:
            row["success_rate"] = seed_interval([r["success"]["success_rate"] for r in mine]).as_dict()
        if name == AblationProposal.residual:
            # At step 0 the run's parameters are the audited ones: the like-for-like comparison; later
            # steps say whether the prediction still holds as training moves the parameters.
            predicted = prediction["predicted_ratio"]
            row["predicted_ratio"] = predicted
            row["prediction_vs_realized"] = {
                str(step): prediction_agreement(
                    row["realized_ratio"][str(step)]["values"], predicted, prediction.get("predicted_ratio_sd")
                )
                for step in (measured[0], measured[-1])
            }
        out[name] = ProposalSummary.from_json(row)
    return out
