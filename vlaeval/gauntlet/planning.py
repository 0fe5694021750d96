"""The planner: how many clusters and units each stratum needs to decide, before any is spent.

For every stratum, in priority order, the configured test (mode, bet rule, cap, margin, alpha,
alarm level, cluster size) is simulated on the gauntlet's generator at the stratum's base rate
and an assumed effect (0: the candidate as good as the baseline); the plan reports the median
and 90th-percentile clusters and units to a decision, the chance of deciding within the units
the stratum is allowed, the information floor, and warnings where the stratum's units or the
budget cannot reach a decision. `job=plan` prints it; the gauntlet runs it as a pre-flight.
Pure apart from its seeded generator.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.config import GauntletConfig, StratumConfig
from vlaeval.seqtest import MODE_ASYMPTOTIC, size_adaptive_cap
from vlaeval.seqtest.simulation import (
    NEVER,
    asymptotic_decision_times,
    decision_time,
    exact_decision_times,
    fixed_n_clusters,
    information_floor,
    realistic_cluster_means,
)

# A stratum "can decide" when at least this share of simulated runs decide within its limit.
MIN_DECISION_PROBABILITY = 0.9
HORIZON_CAP_CLUSTERS = 20_000
SIMULATED_UNITS_PER_CHUNK = 2_000_000


def alarm_alpha(settings: GauntletConfig, n_strata: int) -> float:
    """Level of each stratum's REGRESSION alarm: alpha / K with the Bonferroni split, so the
    chance of any false alarm across the K strata stays <= alpha (family-wise error)."""
    return settings.alpha / n_strata if settings.alarm_fwer == "bonferroni" else settings.alpha


def stratum_unit_limits(settings: GauntletConfig, strata: Mapping[str, StratumConfig]) -> Dict[str, int]:
    """Units each stratum may use if every stratum before it PASSes (the plan's expected path):
    its own units, the nominal allowance (expanded once the critical stratum has passed)."""
    limits = {}
    allowance = settings.nominal_base_allowance
    if settings.critical_stratum in strata:
        allowance = int(allowance * settings.nominal_expand_factor)
    for name, spec in strata.items():
        limits[name] = min(int(spec.units), allowance) if name == settings.nominal_stratum else int(spec.units)
    return limits


def plan_stratum(settings: GauntletConfig, name: str, spec: StratumConfig, unit_limit: int, alarm: float,
                 effect: float, replications: int) -> Dict[str, Any]:
    delta = spec.margin_delta if spec.margin_delta is not None else settings.margin_delta
    size = int(spec.cluster_size)
    rng = np.random.default_rng([int(settings.seed), stable_seed("plan", name)])
    reference = realistic_cluster_means(rng, 1, max(200_000 // size, 2000), size, effect, base_rate=spec.base_rate)[0]
    floor = information_floor(reference, delta, settings.alpha)
    limit_clusters = unit_limit // size
    horizon = int(min(max(limit_clusters, 3 * floor if math.isfinite(floor) else 0, 50), HORIZON_CAP_CLUSTERS))
    cap = float(size_adaptive_cap(size)) if settings.bet_cap is None else settings.bet_cap
    firsts, passes = [], []
    chunk = max(1, SIMULATED_UNITS_PER_CHUNK // (horizon * size))  # bounded memory for big strata
    for start in range(0, replications, chunk):
        x = realistic_cluster_means(rng, min(chunk, replications - start), horizon, size, effect,
                                    base_rate=spec.base_rate)
        if settings.test_mode == MODE_ASYMPTOTIC:
            times = asymptotic_decision_times(x, delta, settings.alpha, burn_in_clusters=settings.burn_in_clusters,
                                              tuning_clusters=max(limit_clusters, 1))
        else:
            times = exact_decision_times(x, delta, settings.alpha, rule=settings.bet_rule, cap=cap, alarm_alpha=alarm)
        first, passed = decision_time(times)
        firsts.append(first)
        passes.append(passed)
    first, passed = np.concatenate(firsts), np.concatenate(passes)

    def quantile(q: float) -> float:
        value = float(np.quantile(first, q))
        return math.inf if value >= NEVER else value

    median, p90 = quantile(0.5), quantile(0.9)
    within = float(np.mean(first <= limit_clusters))
    return {
        "stratum": name,
        "margin_delta": delta,
        "assumed_effect": effect,
        "expected_decision": "PASS" if effect > -delta else "REGRESSION",
        "cluster_size": size,
        "unit_limit": unit_limit,
        "median_clusters": median,
        "median_units": median * size,
        "p90_units": p90 * size,
        "decision_probability_within_limit": within,
        "pass_share": float(np.mean(passed & (first < NEVER))),
        "floor_clusters": floor,
        "fixed_n_z_clusters": fixed_n_clusters(reference, delta, settings.alpha),
        "replications": replications,
    }


def plan_gauntlet(settings: GauntletConfig, strata: Mapping[str, StratumConfig], *,
                  assumed_effect: float, replications: int) -> Dict[str, Any]:
    """The plan of every stratum in priority order, plus the budget check and warnings."""
    from vlaeval.gauntlet.scheduler import priority_order

    alarm = alarm_alpha(settings, len(strata))
    limits = stratum_unit_limits(settings, strata)
    rows: List[Dict[str, Any]] = []
    warnings: List[str] = []
    for name in priority_order(strata):
        row = plan_stratum(settings, name, strata[name], limits[name], alarm, assumed_effect, replications)
        rows.append(row)
        if row["decision_probability_within_limit"] < MIN_DECISION_PROBABILITY:
            median = "never" if not math.isfinite(row["median_units"]) else f"{row['median_units']:,.0f}"
            warnings.append(
                f"{name}: only {row['decision_probability_within_limit']:.0%} of simulated runs decide within its "
                f"{row['unit_limit']:,}-unit limit (median {median} units at effect {assumed_effect:+g}); "
                f"add units (strata.{name}.units) or widen its margin")
    expected_units = sum(min(r["median_units"], r["unit_limit"]) for r in rows)
    if expected_units > settings.budget_units:
        warnings.append(f"the strata need about {expected_units:,.0f} units to decide (medians) but "
                        f"gauntlet.budget_units={settings.budget_units:,}; raise the budget or trim strata")
    return {
        "assumed_effect": assumed_effect,
        "test_mode": settings.test_mode,
        "alpha": settings.alpha,
        "alarm_alpha": alarm,
        "expected_units": expected_units,
        "budget_units": settings.budget_units,
        "strata": rows,
        "warnings": warnings,
        "ok": not warnings,
    }
