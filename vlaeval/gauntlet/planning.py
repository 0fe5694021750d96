"""The planner: how many clusters and units each stratum needs to decide, before any is spent.

For every stratum, in priority order, the configured test (mode, bet rule, cap, margin, alpha,
alarm level, estimand) is simulated on the gauntlet's generator at the stratum's base rate and an
assumed effect (0: the candidate as good as the baseline), with the cluster sizes of the stratum's
real scenario plan (the configured sizes for synthetic outcomes, the file's clusters for an
outcome file); the plan reports the median and 90th-percentile clusters and units to a decision,
the chance of deciding within the units the stratum is allowed, the information floor, and
warnings where the stratum's units or the budget cannot reach a decision. For a source that holds
its outcomes already (a file), a stratum that cannot decide also gets the clusters it would need
at its observed effect (the file's own cluster means, resampled). `job=plan` prints it; the
gauntlet runs it as a pre-flight. Pure apart from its seeded generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.config import GauntletConfig, StratumConfig
from vlaeval.gauntlet.outcomes import OutcomeRequest, PlantedEffect, planned_cluster_sizes, success_rate_effect
from vlaeval.gauntlet.question import Asked
from vlaeval.gauntlet.result import GauntletPlan, ObservedNeeds, StratumPlanRow
from vlaeval.gauntlet.sources import checked_source
from vlaeval.gauntlet.strata import alarm_alpha, priority_order
from vlaeval.seqtest import MODE_ASYMPTOTIC, MODE_GROUP_SEQUENTIAL, plan_batches, size_adaptive_cap
from vlaeval.seqtest.simulation import (
    NEVER,
    asymptotic_decision_times,
    decision_time,
    exact_decision_times,
    fixed_n_clusters,
    group_sequential_decision_times,
    information_floor,
    realistic_cluster_means,
)

# A stratum "can decide" when at least this share of simulated runs decide within its limit.
MIN_DECISION_PROBABILITY = 0.9
HORIZON_CAP_CLUSTERS = 20_000
SIMULATED_UNITS_PER_CHUNK = 2_000_000


@dataclass
class StratumPlan:
    """What is known about a stratum before its test starts."""

    cluster_sizes: np.ndarray  # the scenario plan, in the source's order
    base_rate: float  # the baseline's success rate the simulation assumes
    observed_cluster_means: Optional[np.ndarray] = None  # a file's paired differences (planner only)


def stratum_plans(
    source: Any, settings: GauntletConfig, strata: Mapping[str, StratumConfig], effects: Mapping[str, PlantedEffect]
) -> Dict[str, StratumPlan]:
    """Each stratum's plan from its outcome source: the source's cluster sizes; for a source that
    already holds its outcomes, the baseline's observed success rate and the observed cluster means."""
    source = checked_source(source)
    plans = {}
    for name, spec in strata.items():
        request = OutcomeRequest(
            name,
            spec,
            success_rate_effect(effects.get(name)),
            settings.seed,
            settings.baseline_version,
            settings.candidate_version,
        )
        sizes = np.asarray(source.cluster_sizes(request), dtype=np.int64)
        if source.traits.holds_outcomes:
            outcomes, _ = source.load(request, None)
            plans[name] = StratumPlan(sizes, float(outcomes.baseline.mean()), outcomes.paired_means())
        else:
            plans[name] = StratumPlan(sizes, float(spec.base_rate))
    return plans


def configured_plans(strata: Mapping[str, StratumConfig]) -> Dict[str, StratumPlan]:
    """Plans from the configuration alone (the synthetic source's scenario plan)."""
    return {name: StratumPlan(planned_cluster_sizes(spec), float(spec.base_rate)) for name, spec in strata.items()}


def stratum_unit_limits(
    settings: GauntletConfig, strata: Mapping[str, StratumConfig], plans: Mapping[str, StratumPlan]
) -> Dict[str, int]:
    """Units each stratum may use if every stratum before it PASSes (the plan's expected path):
    its own units, the nominal allowance (expanded once the critical stratum has passed)."""
    limits = {}
    allowance = settings.nominal_base_allowance
    if settings.critical_stratum in strata:
        allowance = int(allowance * settings.nominal_expand_factor)
    for name in strata:
        units = int(plans[name].cluster_sizes.sum())
        limits[name] = min(units, allowance) if name == settings.nominal_stratum else units
    return limits


def _decision_times(
    settings: GauntletConfig,
    x: np.ndarray,
    sizes: np.ndarray,
    delta: float,
    alarm: float,
    cap: float,
    weights: Optional[np.ndarray],
    looks: np.ndarray,
    limit_clusters: int,
    known_smallest: Optional[int] = None,
) -> Dict[str, np.ndarray]:
    if settings.test_mode == MODE_ASYMPTOTIC:
        return asymptotic_decision_times(
            x,
            delta,
            settings.alpha,
            burn_in_clusters=settings.burn_in_clusters,
            tuning_clusters=max(limit_clusters, 1),
            weights=weights,
        )
    if settings.test_mode == MODE_GROUP_SEQUENTIAL:
        usable = looks[looks <= x.shape[-1]]
        return group_sequential_decision_times(
            x,
            delta,
            settings.alpha,
            looks=usable,
            cluster_sizes=sizes,
            alarm_alpha=alarm,
            weights=weights,
            burn_in_clusters=settings.burn_in_clusters,
        )
    return exact_decision_times(
        x,
        delta,
        settings.alpha,
        rule=settings.bet_rule,
        cap=cap,
        alarm_alpha=alarm,
        weights=weights,
        min_cluster_size=known_smallest,
    )


def plan_stratum(
    settings: GauntletConfig,
    name: str,
    spec: StratumConfig,
    plan: StratumPlan,
    unit_limit: int,
    alarm: float,
    effect: float,
    replications: int,
    asked: Asked,
) -> StratumPlanRow:
    # The test's margin m = -delta: the launch's -margin_delta, a comparison's gain or 0.
    delta = -asked.margin(spec.margin_delta if spec.margin_delta is not None else settings.margin_delta)
    sizes = plan.cluster_sizes
    equal = bool(np.all(sizes == sizes[0]))
    mean_size = float(sizes.mean())
    rng = np.random.default_rng([int(settings.seed), stable_seed("plan", name)])

    def draw_sizes(reps: int, clusters: int) -> int | np.ndarray:
        # Clusters come in random order: each simulated cluster takes a size drawn from the plan.
        return int(sizes[0]) if equal else rng.choice(sizes, size=(reps, clusters))

    reference_clusters = max(int(200_000 // mean_size), 2000)
    reference = realistic_cluster_means(
        rng, 1, reference_clusters, draw_sizes(1, reference_clusters), effect, base_rate=plan.base_rate
    )[0]
    expected = "PASS" if effect > -delta else "REGRESSION"  # the test's words; the row says the question's
    side_alpha = settings.alpha if expected == "PASS" else alarm
    floor = information_floor(reference, delta, side_alpha)
    batches = plan_batches(sizes, settings.batch_units, unit_limit)
    limit_clusters = batches[-1][1] if batches else 0
    looks = np.array([end for _, end in batches] or [1], dtype=np.int64)
    horizon = int(min(max(limit_clusters, 3 * floor if math.isfinite(floor) else 0, 50), HORIZON_CAP_CLUSTERS))
    smallest = spec.min_cluster_size or int(sizes.min())  # undeclared for a file: the running minimum's limit
    # What the test knows before its first cluster (the mixture's weights): a declared size, or the plan's
    # smallest where the plan is fixed in advance (not a file's).
    known = spec.min_cluster_size or (None if plan.observed_cluster_means is not None else int(sizes.min()))
    largest = spec.max_cluster_size or int(sizes.max())  # the unit estimand's normaliser
    cap = float(size_adaptive_cap(smallest)) if settings.bet_cap is None else settings.bet_cap
    firsts, passes, within = [], [], []
    chunk = max(1, SIMULATED_UNITS_PER_CHUNK // int(horizon * sizes.max()))  # bounded memory for big strata
    for start in range(0, replications, chunk):
        reps = min(chunk, replications - start)
        drawn = draw_sizes(reps, horizon)
        x = realistic_cluster_means(rng, reps, horizon, drawn, effect, base_rate=plan.base_rate)
        full = np.broadcast_to(np.asarray(drawn), x.shape)
        weights = full / largest if settings.estimand == "unit" else None
        first, passed = decision_time(
            _decision_times(settings, x, full, delta, alarm, cap, weights, looks, limit_clusters, known)
        )
        fits = np.minimum(np.sum(np.cumsum(full, axis=-1) <= unit_limit, axis=-1), sizes.size)
        firsts.append(first)
        passes.append(passed)
        within.append(first <= fits)
    first, passed = np.concatenate(firsts), np.concatenate(passes)

    def quantile(q: float) -> float:
        value = float(np.quantile(first, q))
        return math.inf if value >= NEVER else value

    median, p90 = quantile(0.5), quantile(0.9)
    within_share = float(np.mean(np.concatenate(within)))
    observed = None
    if plan.observed_cluster_means is not None and plan.observed_cluster_means.size:
        observed = observed_needs(settings, plan, delta, alarm, (cap, known), largest, replications, rng, looks, asked)
    return StratumPlanRow(
        stratum=name,
        margin_delta=delta,
        assumed_effect=effect,
        expected_decision=asked.answer(expected),
        cluster_size=int(sizes[0]) if equal else f"{int(sizes.min())}-{int(sizes.max())}",
        clusters_available=int(sizes.size),
        unit_limit=unit_limit,
        median_clusters=median,
        median_units=median * mean_size,
        p90_units=p90 * mean_size,
        decision_probability_within_limit=within_share,
        # What a run most likely ends in: the expected decision only if most runs reach it in time.
        likely_outcome=asked.answer(expected if within_share >= 0.5 else "INSUFFICIENT"),
        pass_share=float(np.mean(passed & (first < NEVER))),
        floor_clusters=floor,
        fixed_n_z_clusters=fixed_n_clusters(reference, delta, side_alpha),
        replications=replications,
        observed=observed,
    )


def observed_needs(
    settings: GauntletConfig,
    plan: StratumPlan,
    delta: float,
    alarm: float,
    bet: Tuple[float, Optional[int]],
    largest: int,
    replications: int,
    rng: np.random.Generator,
    looks: np.ndarray,
    asked: Asked,
) -> ObservedNeeds:
    """Clusters to a decision at the observed effect: the stratum's own cluster means, resampled
    (an estimate for planning only -- the test itself never looks at this); and what a file like
    this one, as many clusters resampled, most likely decides (a stream's test looking after every
    cluster: what the stream's anytime test would do, not the file's order-free certificate)."""
    observed, sizes = plan.observed_cluster_means, plan.cluster_sizes
    assert observed is not None and sizes is not None, "observed needs are planned only for strata with outcomes"
    effect = float(np.dot(observed, sizes) / sizes.sum()) if settings.estimand == "unit" else float(observed.mean())
    floor = information_floor(observed, delta, settings.alpha if effect > -delta else alarm)
    horizon = int(min(max(3 * floor if math.isfinite(floor) else 0, 4 * sizes.size, 50), HORIZON_CAP_CLUSTERS))
    reps = min(replications, max(20, SIMULATED_UNITS_PER_CHUNK // horizon))
    pick = rng.integers(0, observed.size, size=(reps, horizon))
    weights = sizes[pick] / largest if settings.estimand == "unit" else None
    step = int(looks[0])  # group-sequential: the plan's batches continued, a look every `step` clusters
    extended = np.arange(step, horizon + 1, step)
    first, passed = decision_time(
        _decision_times(settings, observed[pick], sizes[pick], delta, alarm, bet[0], weights, extended, horizon, bet[1])
    )
    median = float(np.median(first))
    median = math.inf if median >= NEVER else median
    within = first <= sizes.size
    share = float(np.mean(within))
    likely = "INSUFFICIENT"
    if share >= 0.5:
        likely = "PASS" if np.mean(passed[within]) >= 0.5 else "REGRESSION"
    return ObservedNeeds(effect, median, median * float(sizes.mean()), asked.answer(likely), share)


def plan_gauntlet(
    settings: GauntletConfig,
    strata: Mapping[str, StratumConfig],
    *,
    assumed_effect: float,
    replications: int,
    plans: Optional[Mapping[str, StratumPlan]] = None,
) -> GauntletPlan:
    """The plan of every stratum in priority order, plus the budget check and warnings. `plans`:
    each stratum's scenario plan (default: the configured, synthetic one)."""
    plans = configured_plans(strata) if plans is None else plans
    asked = Asked(settings.question, settings.superiority_gain)
    alarm = alarm_alpha(settings, strata) if asked.launch else settings.alpha  # a comparison: each side at alpha
    limits = stratum_unit_limits(settings, strata, plans)
    rows: List[StratumPlanRow] = []
    warnings: List[str] = []
    for name in priority_order(strata):
        row = plan_stratum(
            settings, name, strata[name], plans[name], limits[name], alarm, assumed_effect, replications, asked
        )
        rows.append(row)
        if row.decision_probability_within_limit < MIN_DECISION_PROBABILITY:
            median = (
                "no simulated run decided at all"
                if not math.isfinite(row.median_units)
                else f"the median run needs {row.median_units:,.0f} units"
            )
            at_margin = abs(assumed_effect + row.margin_delta) < 1e-12  # the assumed effect is the margin itself
            line = (
                f"{name}: only {row.decision_probability_within_limit:.0%} of simulated runs decide within its "
                f"{row.unit_limit:,}-unit limit ({row.clusters_available:,} clusters; {median} at effect "
                f"{assumed_effect:+g}"
                + (
                    ", the question's margin itself, where no test can decide: plan at the effect you expect with "
                    "gauntlet.assumed_effect)"
                    if at_margin
                    else ")"
                )
            )
            if row.observed is not None:
                # The outcomes exist: advice drawn from them must not touch the margin (choosing delta
                # after seeing the data voids the guarantee), and more data is a new test.
                needed = row.observed.clusters_needed_at_observed_effect
                need = (
                    f"about {needed:,.0f} clusters"
                    if math.isfinite(needed)
                    else f"more clusters than the {HORIZON_CAP_CLUSTERS:,} simulated (no resampled run decided)"
                )
                line += (
                    f"; at its observed effect {row.observed.observed_effect:+.3f} a stream would need {need}; the "
                    "margin is fixed in advance (choosing it after seeing these outcomes voids the guarantee), and "
                    "an extended file continues this test through the evidence ledger -- without the ledger a "
                    "re-run is a new test, whose errors add up"
                )
                warnings.append(line)
            else:
                warnings.append(line + f"; add clusters (strata.{name}), or choose a wider margin before any outcome")
    expected_units = sum(min(r.median_units, r.unit_limit) for r in rows)
    if expected_units > settings.budget_units:
        warnings.append(
            f"the strata need about {expected_units:,.0f} units to decide (medians) but "
            f"gauntlet.budget_units={settings.budget_units:,}; raise the budget or trim strata"
        )
    return GauntletPlan(
        assumed_effect=assumed_effect,
        test_mode=str(settings.test_mode),
        alpha=settings.alpha,
        alarm_alpha=alarm,
        expected_units=expected_units,
        budget_units=settings.budget_units,
        strata=tuple(rows),
        warnings=tuple(warnings),
    )
