"""The priority-ordered launch gauntlet.

Strata are evaluated one at a time in safety-first priority order, in batches of whole clusters,
each stopped by its own anytime-valid test -- the loop has no other stopping rule than the
e-process (plus the unit limits). Between strata the scheduler reacts to what it learned:

* CATASTROPHIC_HALT: a halting stratum (safety_critical) certifies Delta < -catastrophic_delta
  at level alpha: the candidate is halted and the remaining strata are not evaluated;
* REGRESSION_PRIORITIZE_RELATED: any other certified regression moves the stratum's related
  strata to the front of the remaining queue;
* CRITICAL_PASS_EXPAND: the critical stratum PASSes: the nominal stratum's unit allowance is
  multiplied (cheap volume evidence only once the safety evidence is in);
* BUDGET_EXHAUSTED: the unit budget ran out with strata still queued.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np

from vlaeval.config import GauntletConfig, StratumConfig, require
from vlaeval.gauntlet.cache import ArrayCache
from vlaeval.gauntlet.outcomes import OutcomeRequest
from vlaeval.gauntlet.planning import alarm_alpha
from vlaeval.gauntlet.recommendation import launch_recommendation
from vlaeval.seqtest import (
    BET_RULES,
    ESTIMANDS,
    MODES,
    CATASTROPHIC,
    CATASTROPHIC_UNDECIDED,
    DECISION_INSUFFICIENT,
    DECISION_PASS,
    DECISION_REGRESSION,
    cluster_means,
    cluster_offsets,
    make_sequential_test,
    plan_batches,
)

ALARM_FWER = ("bonferroni", "none")
PREFLIGHT = ("warn", "error", "off")


@dataclass
class BatchProgress:
    stratum: str
    batch: int
    units_in_stratum: int
    unit_limit: int
    units_evaluated_total: int
    decision: str


def priority_order(strata: Mapping[str, StratumConfig]) -> List[str]:
    return sorted(strata, key=lambda name: (strata[name].priority, name))


def validate_gauntlet(settings: GauntletConfig, strata: Mapping[str, StratumConfig],
                      effects: Mapping[str, float]) -> None:
    """Every check that needs more than a type, as a one-line UserInputError."""
    s = settings
    require(0.0 < s.alpha < 1.0, f"gauntlet.alpha={s.alpha} must be in (0, 1), e.g. gauntlet.alpha=0.05")
    require(0.0 < s.margin_delta < 1.0, f"gauntlet.margin_delta={s.margin_delta} must be in (0, 1)")
    require(s.margin_delta <= s.catastrophic_delta < 1.0,
            f"gauntlet.catastrophic_delta={s.catastrophic_delta} must be in [margin_delta={s.margin_delta}, 1)")
    require(s.batch_units >= 1, f"gauntlet.batch_units={s.batch_units} must be >= 1")
    require(s.budget_units >= 1, f"gauntlet.budget_units={s.budget_units} must be >= 1")
    require(s.nominal_base_allowance >= 0, f"gauntlet.nominal_base_allowance={s.nominal_base_allowance} must be >= 0")
    require(s.nominal_expand_factor >= 1.0, f"gauntlet.nominal_expand_factor={s.nominal_expand_factor} must be >= 1")
    require(s.test_mode in MODES, f"gauntlet.test_mode={s.test_mode!r} is unknown; use one of {', '.join(MODES)}")
    require(s.bet_rule in BET_RULES, f"gauntlet.bet_rule={s.bet_rule!r} is unknown; use one of {', '.join(BET_RULES)}")
    require(s.bet_cap is None or 0.0 < s.bet_cap <= 1.0,
            f"gauntlet.bet_cap={s.bet_cap} must be in (0, 1], or null for the size-adaptive cap")
    require(s.estimand in ESTIMANDS, f"gauntlet.estimand={s.estimand!r} is unknown; use one of {', '.join(ESTIMANDS)}")
    require(s.alarm_fwer in ALARM_FWER, f"gauntlet.alarm_fwer={s.alarm_fwer!r} is unknown; use one of {', '.join(ALARM_FWER)}")
    require(s.burn_in_clusters >= 2, f"gauntlet.burn_in_clusters={s.burn_in_clusters} must be >= 2")
    require(s.preflight in PREFLIGHT, f"gauntlet.preflight={s.preflight!r} is unknown; use one of {', '.join(PREFLIGHT)}")
    require(-1.0 < s.assumed_effect < 1.0, f"gauntlet.assumed_effect={s.assumed_effect} must be in (-1, 1)")
    require(s.plan_replications >= 20, f"gauntlet.plan_replications={s.plan_replications} must be >= 20")
    require(0.0 < s.cs_grid_step <= 0.1, f"gauntlet.cs_grid_step={s.cs_grid_step} must be in (0, 0.1]")
    require(bool(strata), "no strata configured; pick a preset, e.g. strata=default")
    for name, spec in strata.items():
        where = f"strata.{name}"
        require(spec.units >= 1, f"{where}.units={spec.units} must be a positive number of scenario units")
        require(0.0 <= spec.base_rate <= 1.0, f"{where}.base_rate={spec.base_rate} must be a success rate in [0, 1]")
        require(spec.cluster_size >= 1, f"{where}.cluster_size={spec.cluster_size} must be >= 1")
        require(spec.kind in ("safety", "global"), f"{where}.kind={spec.kind!r} must be 'safety' or 'global'")
        if spec.margin_delta is not None:
            require(0.0 < spec.margin_delta <= s.catastrophic_delta,
                    f"{where}.margin_delta={spec.margin_delta} must be in (0, catastrophic_delta={s.catastrophic_delta}]")
        for other in spec.related:
            require(other in strata, f"{where}.related names unknown stratum {other!r}; known: {', '.join(strata)}")
    priorities: Dict[int, str] = {}
    for name in strata:
        p = strata[name].priority
        require(p not in priorities, f"strata.{name}.priority={p} is also {priorities.get(p)}'s; give each stratum its own priority")
        priorities[p] = name
    for name in effects:
        require(name in strata, f"effects.{name}: unknown stratum {name!r}; known strata: {', '.join(strata)}")
    for role, name in (("nominal_stratum", s.nominal_stratum), ("critical_stratum", s.critical_stratum)):
        require(name == "" or name in strata,
                f"gauntlet.{role}={name!r} is not a configured stratum; name one of {', '.join(strata)} or set ''")


def _evaluate_stratum(test: Any, outcomes, unit_limit: int, batch_units: int,
                      halting: bool, report: Callable[[int, int, str], None]) -> Dict[str, Any]:
    """Feed whole-cluster batches until the e-process decides (and, in a halting stratum with a
    regression, until the catastrophic question is decided too) or the unit limit is reached."""
    sizes = outcomes.cluster_sizes
    offsets = cluster_offsets(sizes)
    differences = outcomes.candidate.astype(np.int8) - outcomes.baseline.astype(np.int8)
    used, batches = 0, 0
    baseline_successes = candidate_successes = 0
    for first, end in plan_batches(sizes, batch_units, unit_limit):
        start_unit, end_unit = int(offsets[first]), int(offsets[end])
        test.update_clusters(cluster_means(differences[start_unit:end_unit], sizes[first:end]), sizes[first:end])
        baseline_successes += int(outcomes.baseline[start_unit:end_unit].sum())
        candidate_successes += int(outcomes.candidate[start_unit:end_unit].sum())
        used, batches = end_unit, batches + 1
        test.record_trajectory_point(batch=batches)
        decision = test.evaluate()
        report(batches, used, decision)
        catastrophic = test.catastrophic_status()
        if halting and catastrophic == CATASTROPHIC:
            break
        if decision != DECISION_INSUFFICIENT and (
            not halting or decision == DECISION_PASS or catastrophic != CATASTROPHIC_UNDECIDED
        ):
            break
    return {
        "units_evaluated": used,
        "batches": batches,
        "baseline_success_rate": baseline_successes / used if used else None,
        "candidate_success_rate": candidate_successes / used if used else None,
    }


def run_gauntlet(
    settings: GauntletConfig,
    strata: Mapping[str, StratumConfig],
    effects: Mapping[str, float],
    source: Any,
    cache: ArrayCache,
    lineage: Mapping[str, Any],
    *,
    on_batch: Optional[Callable[[BatchProgress], None]] = None,
) -> Dict[str, Any]:
    """Run the whole gauntlet; pure apart from the outcome source and its cache."""
    s = settings
    started = time.perf_counter()
    cache_before = cache.stats.as_dict()
    order = priority_order(strata)
    queue = list(order)
    alarm = alarm_alpha(s, len(strata))  # family-wise error of the REGRESSION alarms
    nominal_allowance = int(s.nominal_base_allowance)
    budget_left = int(s.budget_units)
    units_evaluated = 0
    halted = False
    events: List[Dict[str, Any]] = []
    results: List[Dict[str, Any]] = []
    processed: List[str] = []

    while queue and budget_left > 0 and not halted:
        name = queue.pop(0)
        spec = strata[name]
        processed.append(name)
        effect = float(effects.get(name, 0.0))
        outcomes, cache_status = source.load(
            OutcomeRequest(name, spec, effect, s.seed, s.baseline_version, s.candidate_version), cache)
        unit_limit = min(outcomes.units, budget_left)
        if name == s.nominal_stratum:
            unit_limit = min(unit_limit, nominal_allowance)
        margin = spec.margin_delta if spec.margin_delta is not None else s.margin_delta
        test = make_sequential_test(
            s.test_mode, margin, s.alpha,
            catastrophic_delta=s.catastrophic_delta if spec.catastrophic_halt else None,
            alarm_alpha=alarm, estimand=s.estimand, max_cluster_size=int(outcomes.cluster_sizes.max()),
            bet_rule=s.bet_rule, bet_cap=s.bet_cap, cs_grid_step=s.cs_grid_step,
            burn_in_clusters=s.burn_in_clusters, tuning_clusters=max(unit_limit // int(spec.cluster_size), 1),
        )

        def report(batch: int, used: int, decision: str) -> None:
            if on_batch is not None:
                on_batch(BatchProgress(name, batch, used, unit_limit, units_evaluated + used, decision))

        run = _evaluate_stratum(test, outcomes, unit_limit, s.batch_units, spec.catastrophic_halt, report)
        used = run["units_evaluated"]
        budget_left -= used
        units_evaluated += used
        snapshot = test.snapshot()
        results.append({
            "stratum": name,
            "priority": order.index(name) + 1,
            "data_label": str(getattr(spec.data_label, "value", spec.data_label)),
            "kind": spec.kind,
            "planted_effect": effect,
            "units_available": outcomes.units,
            "unit_limit": unit_limit,
            **run,
            "units_saved_by_early_stop": unit_limit - used,
            "cache": cache_status,
            **snapshot,
            "trajectory": test.trajectory,
        })

        estimate = snapshot["delta_estimate"]
        if spec.catastrophic_halt and test.catastrophic_status() == CATASTROPHIC:
            halted = True
            events.append({
                "event": "CATASTROPHIC_HALT", "stratum": name, "delta_estimate": estimate,
                "cs_upper": snapshot["confidence_sequence"]["upper"],
                "detail": f"{name}: Delta < -{s.catastrophic_delta} certified at level {snapshot['catastrophic_alpha']:.3g} "
                          f"(confidence sequence upper bound {snapshot['confidence_sequence']['upper']:+.3f}"
                          + (f", e-value {snapshot['e_value_catastrophic']:.3g} >= {1 / snapshot['catastrophic_alpha']:.3g}"
                             if snapshot.get("e_value_catastrophic") is not None else "")
                          + "); candidate halted, remaining strata not evaluated",
            })
        elif snapshot["decision"] == DECISION_REGRESSION:
            promoted = [r for r in spec.related if r in queue]
            for r in reversed(promoted):
                queue.remove(r)
                queue.insert(0, r)
            events.append({
                "event": "REGRESSION_PRIORITIZE_RELATED", "stratum": name, "delta_estimate": estimate,
                "promoted": promoted,
                "detail": f"certified regression in {name}; related strata promoted: {promoted or 'none pending'}",
            })
        elif snapshot["decision"] == DECISION_PASS and name == s.critical_stratum:
            nominal_allowance = int(nominal_allowance * s.nominal_expand_factor)
            events.append({
                "event": "CRITICAL_PASS_EXPAND", "stratum": name, "nominal_allowance": nominal_allowance,
                "detail": f"{name} passed; nominal allowance expanded to {nominal_allowance} units",
            })
    not_evaluated = list(queue)
    if not_evaluated and not halted:
        events.append({"event": "BUDGET_EXHAUSTED", "not_evaluated": not_evaluated,
                       "detail": f"budget of {s.budget_units} units spent; not evaluated: {not_evaluated}"})

    elapsed = time.perf_counter() - started
    cache_after = cache.stats.as_dict()
    cache_stats = {k: cache_after[k] - cache_before[k] for k in ("hits", "misses", "corrupt_recomputed")}
    looked_up = cache_stats["hits"] + cache_stats["misses"]
    cache_stats["hit_rate"] = cache_stats["hits"] / looked_up if looked_up else None
    cache_stats["corrupt_entries"] = cache_after["corrupt_entries"][len(cache_before["corrupt_entries"]):]
    total_units = int(sum(strata[n].units for n in strata))
    recommendation = launch_recommendation(results, not_evaluated, halted=halted, lineage=lineage,
                                            test_mode=s.test_mode)
    return {
        "candidate_version": s.candidate_version,
        "baseline_version": s.baseline_version,
        "planted_effects": dict(effects),
        "scale": {
            "total_units_defined": total_units,
            "units_evaluated": units_evaluated,
            "units_saved": total_units - units_evaluated,
            "budget_units": int(s.budget_units),
            "budget_remaining": budget_left,
            "nominal_allowance_final": nominal_allowance,
        },
        "timing": {"wall_s": elapsed, "units_per_second": units_evaluated / elapsed if elapsed > 0 else None},
        "cache": cache_stats,
        "priority_order": order,
        "processed_order": processed,
        "not_evaluated": not_evaluated,
        "halted": halted,
        "status": "halted" if halted else "completed",
        "events": events,
        "strata": results,
        "lineage": dict(lineage),
        "lineage_valid": bool(lineage.get("valid")),
        "valid_for_launch": bool(lineage.get("valid")) and not halted,
        "recommendation": recommendation,
        "test_mode": s.test_mode,
        "multiplicity": {
            "launch": "intersection-union: LAUNCH needs every stratum to PASS its own level-alpha test",
            "regression_alarms": (f"Bonferroni: each stratum's REGRESSION alarm at alpha / {len(strata)} = {alarm:.4g}, "
                                  "family-wise false-alarm rate <= alpha") if s.alarm_fwer == "bonferroni"
            else "none: each REGRESSION alarm at alpha (family-wise false-alarm rate up to n_strata * alpha)",
            "alarm_alpha": alarm,
        },
        "statistical_validity": (
            "every stopping decision is an anytime-valid betting e-process on cluster means "
            "(Ville's inequality); decisions are sticky; the catastrophic halt is decided on the "
            "confidence sequence: its upper bound below -catastrophic_delta") if s.test_mode == "exact" else (
            "ASYMPTOTIC mode (opt-in): decisions from asymptotic confidence sequences (Waudby-Smith et al. "
            "2024) after a burn-in; valid only as clusters grow, not at every sample size"),
    }
