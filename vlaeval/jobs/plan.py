"""job=plan: how many clusters and units will each stratum need, before any is spent?

Validate the gauntlet settings, strata and outcome source (`outcomes=file` plans the file's own
strata, cluster counts and sizes); simulate the configured sequential test on each stratum at
gauntlet.assumed_effect; print expected clusters and units to a decision per stratum with warnings
where a stratum's clusters or the budget cannot reach one (with a file: how many clusters it would
need at its observed effect); save and log the plan.
The gauntlet runs the same plan as its pre-flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from vlaeval import console
from vlaeval.choices import TestMode
from vlaeval.config import OutcomeJobSettings
from vlaeval.gauntlet.inputs import gauntlet_inputs, run_context, strata_chosen
from vlaeval.gauntlet.result import GauntletPlan, ObservedNeeds
from vlaeval.runs import JobResult, RunReport, SavedAsJson, now_ms, publish

JOB = "plan"
COMPONENTS = ("outcomes",)  # `_target_` groups checked against their signatures before run()


@dataclass(frozen=True, kw_only=True)
class PlanJobConfig(OutcomeJobSettings):
    """The sections job=plan reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    pass


@dataclass(frozen=True)
class PlanResult(SavedAsJson):
    """job=plan's result: the planner's simulation of every stratum (vlaeval/gauntlet/planning.py)."""

    plan: GauntletPlan


def run(cfg: PlanJobConfig) -> JobResult[PlanResult]:
    started_ms = now_ms()
    inputs = gauntlet_inputs(
        cfg.gauntlet, cfg.strata, cfg.effects, cfg.outcomes, run_context(cfg), strata_chosen=strata_chosen()
    )
    settings = inputs.settings
    for line in inputs.resolved.notices:
        console.show(f"notice: {line}")
    plan = inputs.plan()
    metrics: Dict[str, Any] = {"plan.expected_units": plan.expected_units, "plan.ok": float(plan.ok)}
    for row in plan.strata:
        key = f"stratum.{row.stratum}"
        metrics[f"{key}.median_units"] = row.median_units if math.isfinite(row.median_units) else None
        metrics[f"{key}.decision_probability_within_limit"] = row.decision_probability_within_limit
    result = PlanResult(plan)
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"plan-{settings.candidate_version}",
            metrics=metrics,
            checks={"plan_ok": plan.ok},
            tags={"plan.test_mode": plan.test_mode},
        ),
    )
    print_plan(plan)
    return JobResult(result, published)


def units(value: float) -> str:
    return "never" if not math.isfinite(value) else f"{value:,.0f}"


def observed_columns(observed: Optional[ObservedNeeds]) -> Tuple[str, str, str]:
    if observed is None:  # a stratum of the file with no outcomes to resample
        return ("", "", "")
    share = observed.decision_probability_at_observed_effect
    likely = observed.likely_outcome_at_observed_effect
    return (
        f"{observed.observed_effect:+.3f}",
        f"{likely} ({share:.0%} decide)" if likely else "",
        units(observed.clusters_needed_at_observed_effect),
    )


def print_plan(plan: GauntletPlan) -> None:
    observed = plan.from_outcomes  # a file's plan: each row's needs at its observed effect
    rows = [
        (
            r.stratum,
            f"{r.margin_delta:g}",
            r.cluster_size,
            r.likely_outcome,
            units(r.median_clusters),
            units(r.median_units),
            units(r.p90_units),
            f"{r.unit_limit:,}",
            f"{r.decision_probability_within_limit:.0%}",
            units(r.floor_clusters),
            units(r.fixed_n_z_clusters),
        )
        + (observed_columns(r.observed) if observed else ())
        for r in plan.strata
    ]
    console.show(
        console.table(
            f"Plan at assumed effect {plan.assumed_effect:+g} ({plan.test_mode} test, alpha {plan.alpha:g}, "
            f"alarms at {plan.alarm_alpha:.3g})",
            [
                "stratum",
                "margin",
                "cluster",
                "likely outcome (assumed)",
                "clusters (median)",
                "units (median)",
                "units (p90)",
                "limit",
                "P(decide)",
                "floor clusters",
                "fixed-n z clusters",
            ]
            + (["observed effect", "likely at it (a stream)", "clusters needed at it"] if observed else []),
            rows,
        )
    )
    console.show(
        f"expected units to decide every stratum: {units(plan.expected_units)} of budget {plan.budget_units:,}"
    )
    if plan.test_mode == TestMode.horizon:
        console.show(
            "  test_mode=horizon is planned as the anytime test; the horizon test's own power and expected "
            "clusters within a horizon are measured in docs/figures/peer_comparison.md"
        )
    for line in plan.warnings:
        console.print_warning(line)
    if plan.ok:
        console.show("  every stratum can reach a decision within its units and the budget")
