"""The priority-ordered launch gauntlet.

Strata are evaluated one at a time in safety-first priority order, in batches of whole clusters
taken in a seeded random order, each stopped by its own sequential test -- the loop has no other
stopping rule than the test (plus the unit limits). A stratum whose outcomes all exist (an outcome
file) has no order to take: it is tested order-free (vlaeval.seqtest.order_free), the looks an
earlier run recorded in the evidence ledger first, then its new clusters as one more look. Between
strata the scheduler reacts to what it learned:

* CATASTROPHIC_HALT: a halting stratum (safety_critical) halts the candidate and the remaining
  strata are not evaluated, only when its one-sided upper confidence sequence at the halt's level
  has fallen to or below -catastrophic_delta, so the label "catastrophic" carries its own error rate.
  With gauntlet.halt_rule=regression_beyond_margin (the default) the stratum stops at its certified
  REGRESSION and the halt is read off that bound at the end of the deciding batch (a REGRESSION whose
  bound does not reach the margin is a plain REGRESSION, and the gauntlet goes on); with
  halt_rule=certified_catastrophic a REGRESSION keeps sampling until the catastrophic question is
  decided. (The prototype read the estimate at the stopping time, which is biased towards the
  alarm.) An approximate test mode never halts (its signal is recorded as APPROXIMATE_HALT_SIGNAL);
* REGRESSION_PRIORITIZE_RELATED: any other certified regression moves the stratum's related
  strata to the front of the remaining queue;
* CRITICAL_PASS_EXPAND: the critical stratum PASSes: the nominal stratum's unit allowance is
  multiplied (cheap volume evidence only once the safety evidence is in);
* BUDGET_EXHAUSTED: the unit budget ran out with strata still queued.

Multiplicity: LAUNCH is intersection-union (every stratum must PASS its own level-alpha test), so
it needs no correction; the alarms -- one REGRESSION per stratum and one halt per halting stratum
-- are a union, so with alarm_fwer=bonferroni each is tested at alpha / (K + H) and the chance of
any false alarm stays <= alpha (vlaeval.gauntlet.strata.alarm_alpha).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from vlaeval.artifacts import sha256_json, stable_seed
from vlaeval.choices import AlarmFwer, ClusterOrder, HaltRule, Question, TestMode
from vlaeval.config import GauntletConfig, StratumConfig
from vlaeval.errors import require, require_at_least
from vlaeval.gauntlet.cache import ArrayCache, CacheStats
from vlaeval.gauntlet.constants import ClusterSizeBounds, OrderSeed, cluster_size_bounds, run_order_seed
from vlaeval.gauntlet.ledger import (
    CONTINUES,
    COPIES,
    NOT_GIVEN,
    Comparison,
    Continuation,
    Evidence,
    EvidenceLedger,
    cluster_keys,
    copied_look,
    split_blocks,
)
from vlaeval.gauntlet.outcomes import (
    OutcomeRequest,
    PlantedEffect,
    StratumOutcomes,
    cluster_permutation,
    producer,
    stratum_data_label,
    success_rate_effect,
)
from vlaeval.gauntlet.question import Asked
from vlaeval.gauntlet.recommendation import comparison_conclusion, launch_recommendation
from vlaeval.gauntlet.result import (
    CacheUse,
    GauntletEvent,
    GauntletResult,
    Lineage,
    MultiplicityStatement,
    Recommendation,
    RecordedOrder,
    Scale,
    StratumResult,
)
from vlaeval.gauntlet.sources import checked_source
from vlaeval.gauntlet.strata import alarm_alpha, alarm_count, priority_order
from vlaeval.seqtest import (
    CATASTROPHIC,
    CATASTROPHIC_UNDECIDED,
    DECISION_INSUFFICIENT,
    DECISION_PASS,
    DECISION_REGRESSION,
    MODE_ASYMPTOTIC,
    MODE_EXACT,
    ORDER_FREE_BET,
    AsymptoticSettings,
    EValues,
    ExactSettings,
    GroupSequentialSettings,
    OrderFreeSettings,
    TestSettings,
    TestState,
    catastrophic_message,
    cluster_offsets,
    drift_diagnostic,
    make_sequential_test,
    on_grid,
    plan_batches,
    planned_looks_of,
)
from vlaeval.seqtest.horizon import HorizonDesign
from vlaeval.seqtest.sequential import SequentialTest
from vlaeval.seqtest.state import HorizonSettings, ModeSettings
from vlaeval.seqtest.units import Drift, SuccessRateInterval, success_rate_interval

__all__ = ["BatchProgress", "priority_order", "run_gauntlet", "validate_gauntlet"]


@dataclass
class BatchProgress:
    stratum: str
    batch: int
    units_in_stratum: int
    unit_limit: int
    units_evaluated_total: int
    decision: str
    clusters: int = 0  # clusters of the stratum evaluated so far
    e_values: EValues = EValues()  # the test's current wealth (None where the mode has none)
    final: bool = False  # the stratum's last batch


def validate_gauntlet(
    settings: GauntletConfig, strata: Mapping[str, StratumConfig], effects: Mapping[str, PlantedEffect]
) -> None:
    """Every check that needs more than a type (the choice sets are Enums, checked when the config
    is composed), as a one-line UserInputError."""
    s = settings
    require(0.0 < s.alpha < 1.0, f"gauntlet.alpha={s.alpha} must be in (0, 1), e.g. gauntlet.alpha=0.05")
    require(
        s.margin_delta != 0.0 or not Question(s.question).is_launch,
        "gauntlet.margin_delta=0 asks a launch to be certified not worse by 0 points, which no finite test can; "
        "to ask whether the candidate is better, set gauntlet.question=superiority (or two_sided)",
    )
    require(0.0 < s.margin_delta < 1.0, f"gauntlet.margin_delta={s.margin_delta} must be in (0, 1)")
    require(
        0.0 <= s.superiority_gain < 1.0,
        f"gauntlet.superiority_gain={s.superiority_gain} must be in [0, 1): the gain Delta must exceed "
        "(gauntlet.question=superiority)",
    )
    require(
        s.margin_delta <= s.catastrophic_delta < 1.0,
        f"gauntlet.catastrophic_delta={s.catastrophic_delta} must be in [margin_delta={s.margin_delta}, 1)",
    )
    require_at_least("gauntlet.batch_units", s.batch_units, 1)
    require(s.videos >= 0, f"gauntlet.videos={s.videos} must be >= 0 (0: no videos)")
    require_at_least("gauntlet.budget_units", s.budget_units, 1)
    require(s.nominal_base_allowance >= 0, f"gauntlet.nominal_base_allowance={s.nominal_base_allowance} must be >= 0")
    require(s.nominal_expand_factor >= 1.0, f"gauntlet.nominal_expand_factor={s.nominal_expand_factor} must be >= 1")
    require(
        s.bet_cap is None or 0.0 < s.bet_cap <= 1.0,
        f"gauntlet.bet_cap={s.bet_cap} must be in (0, 1], or null for the size-adaptive cap",
    )
    require(s.burn_in_clusters >= 2, f"gauntlet.burn_in_clusters={s.burn_in_clusters} must be >= 2")
    require(s.orders >= 1, f"gauntlet.orders={s.orders} must be >= 1 (fixed orders averaged on a file), e.g. 16")
    require(-1.0 < s.assumed_effect < 1.0, f"gauntlet.assumed_effect={s.assumed_effect} must be in (-1, 1)")
    require(s.plan_replications >= 20, f"gauntlet.plan_replications={s.plan_replications} must be >= 20")
    require(0.0 < s.cs_grid_step <= 0.1, f"gauntlet.cs_grid_step={s.cs_grid_step} must be in (0, 0.1]")
    require(bool(strata), "no strata configured; pick a preset, e.g. strata=default")
    if TestMode(s.test_mode).certifies:
        # Decisions and the confidence sequence must speak about the same e-processes.
        for where, value in [
            ("gauntlet.margin_delta", s.margin_delta),
            ("gauntlet.catastrophic_delta", s.catastrophic_delta),
            ("gauntlet.superiority_gain", s.superiority_gain),
        ] + [
            (f"strata.{n}.margin_delta", spec.margin_delta)
            for n, spec in strata.items()
            if spec.margin_delta is not None
        ]:
            require(
                on_grid(value, s.cs_grid_step),
                f"{where}={value} is not a multiple of gauntlet.cs_grid_step={s.cs_grid_step}; every decision "
                "margin must lie on the confidence sequence's grid (e.g. gauntlet.cs_grid_step=0.001)",
            )
    for name, spec in strata.items():
        where = f"strata.{name}"
        require(spec.units >= 1, f"{where}.units={spec.units} must be a positive number of scenario units")
        require(0.0 <= spec.base_rate <= 1.0, f"{where}.base_rate={spec.base_rate} must be a success rate in [0, 1]")
        require(spec.cluster_size >= 1, f"{where}.cluster_size={spec.cluster_size} must be >= 1")
        if spec.margin_delta is not None:
            require(
                0.0 < spec.margin_delta <= s.catastrophic_delta,
                f"{where}.margin_delta={spec.margin_delta} must be in (0, catastrophic_delta={s.catastrophic_delta}]",
            )
        for other in spec.related:
            require(other in strata, f"{where}.related names unknown stratum {other!r}; known: {', '.join(strata)}")
    priorities: Dict[int, str] = {}
    for name in strata:
        p = strata[name].priority
        require(
            p not in priorities,
            f"strata.{name}.priority={p} is also {priorities.get(p)}'s; give each stratum its own priority",
        )
        priorities[p] = name
    for name in effects:
        require(name in strata, f"effects.{name}: unknown stratum {name!r}; known strata: {', '.join(strata)}")
    for role, name in (("nominal_stratum", s.nominal_stratum), ("critical_stratum", s.critical_stratum)):
        require(
            name == "" or name in strata,
            f"gauntlet.{role}={name!r} is not a configured stratum; name one of {', '.join(strata)} or set ''",
        )


@dataclass(frozen=True)
class StratumRun:
    """What testing a stratum's clusters left: the test's state after its last look, the units and
    clusters evaluated in how many looks, each policy's success rate over them, and (a stream) the
    paired difference early vs late in the evaluation order."""

    state: TestState
    units_evaluated: int
    clusters_evaluated: int
    batches: int
    success_rates: Mapping[str, SuccessRateInterval]
    drift: Optional[Drift] = None


def _evaluate_stratum(
    test: SequentialTest,
    fetch: Callable[[int, int], StratumOutcomes],
    sizes: np.ndarray,
    batches: Sequence[tuple],
    await_certified_halt: bool,
    report: Callable[..., None],
) -> StratumRun:
    """Ask the source for each planned whole-cluster batch only when the test needs it, until the
    test decides (with `await_certified_halt`, a halting stratum's REGRESSION also waits until the
    catastrophic question is decided) or the plan ends. `sizes`: the plan's cluster sizes in
    evaluation order."""
    offsets = cluster_offsets(sizes)
    used_clusters, batch_count = 0, 0
    wins: Dict[str, List[np.ndarray]] = {"baseline": [], "candidate": []}
    evaluated_means: List[np.ndarray] = []
    state = test.state
    for first, end in batches:
        batch = fetch(first, end)
        end_unit = int(offsets[end])
        evaluated_means.append(batch.paired_means())
        state = test.update(evaluated_means[-1], sizes[first:end])
        baseline_wins, candidate_wins = batch.cluster_successes()
        wins["baseline"].append(baseline_wins)
        wins["candidate"].append(candidate_wins)
        used_clusters, batch_count = end, batch_count + 1
        catastrophic = state.catastrophic.status if state.catastrophic is not None else CATASTROPHIC_UNDECIDED
        stop = (await_certified_halt and catastrophic == CATASTROPHIC) or (
            state.decision != DECISION_INSUFFICIENT
            and (not await_certified_halt or state.decision == DECISION_PASS or catastrophic != CATASTROPHIC_UNDECIDED)
        )
        report(batch_count, end_unit, state.decision, end, state.e_values, stop or end == batches[-1][1])
        if stop:
            break
    seen = sizes[:used_clusters]
    means = np.concatenate(evaluated_means) if evaluated_means else np.zeros(0)
    baseline_wins, candidate_wins = (np.concatenate(p) if p else np.zeros(0, np.int64) for p in wins.values())
    return StratumRun(
        state=state,
        units_evaluated=int(offsets[used_clusters]),
        clusters_evaluated=used_clusters,
        batches=batch_count,
        success_rates=success_rates(baseline_wins, candidate_wins, seen),
        # Stationarity check: the paired difference early vs late in the evaluation order.
        drift=drift_diagnostic(means, seen, state.estimand),
    )


def success_rates(
    baseline_wins: np.ndarray, candidate_wins: np.ndarray, sizes: np.ndarray
) -> Dict[str, SuccessRateInterval]:
    """Each policy's success rate over the evaluated clusters, with its cluster-robust interval."""
    return {
        "baseline": success_rate_interval(baseline_wins, sizes),
        "candidate": success_rate_interval(candidate_wins, sizes),
    }


def evidence_blocks(
    name: str, keys: Sequence[str], sizes: np.ndarray, continuation: Continuation, unit_limit: int
) -> Optional[List[np.ndarray]]:
    """The clusters of each look of an order-free stratum: the ledger's earlier blocks as they were
    tested, then the new clusters -- within the unit limit, a prefix of an order seeded from their
    canonical digest (no file can choose which). None: the earlier blocks alone exceed the limit."""
    earlier, rest = split_blocks(keys, continuation)
    used = int(sum(int(sizes[b].sum()) for b in earlier))
    if used > unit_limit:
        return None
    canonical = rest[np.argsort(np.asarray([keys[i] for i in rest], dtype=object), kind="stable")]
    digest = sha256_json(sorted(keys[i] for i in rest))
    shuffled = canonical[np.random.default_rng(stable_seed("order-free-limit", name, digest)).permutation(rest.size)]
    fits = np.cumsum(sizes[shuffled]) <= unit_limit - used
    new = np.sort(shuffled[fits]) if not fits.all() else np.sort(shuffled)
    return [b for b in earlier if b.size] + ([new] if new.size else [])


class Halt(NamedTuple):
    """Whether a stratum's result halts the candidate (exact mode) or only signals it (an
    approximate mode), whether the halt is certified catastrophic, and the words for it."""

    halt: bool
    signal: bool
    certified_catastrophic: bool = False
    detail: str = ""


def halt_decision(settings: GauntletConfig, state: TestState) -> Halt:
    """Whether a halting stratum's result halts the candidate under `gauntlet.halt_rule`, and the
    words for it: what is certified (at which level) and what is only an estimate. An approximate
    test mode never halts; its would-be halt is a signal to confirm with test_mode=exact."""
    estimate = state.delta_estimate
    certified_catastrophic = state.catastrophic is not None and state.catastrophic.status == CATASTROPHIC
    regression = state.decision == DECISION_REGRESSION
    beyond = estimate is not None and estimate < -settings.catastrophic_delta
    if settings.halt_rule == HaltRule.certified_catastrophic:
        fires = certified_catastrophic
    else:
        # The estimate at a stopping time is biased towards the alarm (the test stopped because the
        # clusters so far looked bad): read off it, "catastrophic" was wrong in 12% of runs at Delta =
        # -0.04 with small batches. The label is decided on the halt's own one-sided confidence bound at
        # the end of the deciding batch instead, which carries its level at any stopping time.
        fires = regression and certified_catastrophic
    if not fires:
        return Halt(False, False)
    parts = []
    if regression:
        parts.append(
            f"REGRESSION (Delta < -{state.margin_delta:g}) certified at level {state.alarm_alpha:.3g} "
            f"after {state.decided_at_cluster} clusters ({state.decided_at_unit} units)"
        )
    if beyond:
        parts.append(f"estimate {estimate:+.4f} beyond the catastrophic margin -{settings.catastrophic_delta:g}")
    if certified_catastrophic and state.catastrophic is not None:
        parts.append("certified catastrophic: " + catastrophic_message(state.catastrophic))
    exact = TestMode(state.test_mode).certifies
    if not exact:
        parts = [f"approximate ({state.test_mode}) " + parts[0], *parts[1:]]
    return Halt(exact, not exact, certified_catastrophic, "; ".join(parts))


@dataclass
class Reaction:
    """What the scheduler does after a stratum: its events, whether the candidate is halted, and
    the nominal allowance from now on (the related strata are moved up the queue in place)."""

    events: List[GauntletEvent]
    halted: bool
    nominal_allowance: int


def react(
    settings: GauntletConfig,
    name: str,
    spec: StratumConfig,
    state: TestState,
    queue: List[str],
    nominal_allowance: int,
) -> Reaction:
    """The events a finished stratum triggers: a halt (or, in an approximate mode, only its signal),
    related strata promoted after a REGRESSION, the nominal allowance expanded after the critical
    stratum's PASS."""
    s, estimate = settings, state.delta_estimate
    exact = TestMode(state.test_mode).certifies
    events: List[GauntletEvent] = []
    halt = halt_decision(s, state) if spec.catastrophic_halt else Halt(False, False)
    if (halt.halt or halt.signal) and state.catastrophic is not None:
        events.append(
            GauntletEvent(
                "CATASTROPHIC_HALT" if halt.halt else "APPROXIMATE_HALT_SIGNAL",
                f"{name}: {halt.detail}; "
                + (
                    "candidate halted, remaining strata not evaluated"
                    if halt.halt
                    else "not a halt: confirm with gauntlet.test_mode=exact"
                ),
                name,
                {
                    "delta_estimate": estimate,
                    "halt_rule": str(s.halt_rule),
                    "certified_catastrophic": halt.certified_catastrophic,
                    "catastrophic_upper_bound": state.catastrophic.bound.upper,
                    "catastrophic_alpha": state.catastrophic.alpha,
                },
            )
        )
        if halt.halt:
            return Reaction(events, True, nominal_allowance)
    if state.decision == DECISION_REGRESSION:
        promoted = [r for r in spec.related if r in queue]
        for r in reversed(promoted):
            queue.remove(r)
            queue.insert(0, r)
        kind = "certified" if exact else f"approximate ({state.test_mode}, not certified)"
        events.append(
            GauntletEvent(
                "REGRESSION_PRIORITIZE_RELATED",
                f"{kind} regression in {name}; related strata promoted: {promoted or 'none pending'}",
                name,
                {"delta_estimate": estimate, "promoted": promoted},
            )
        )
    elif state.decision == DECISION_PASS and name == s.critical_stratum:
        nominal_allowance = int(nominal_allowance * s.nominal_expand_factor)
        events.append(
            GauntletEvent(
                "CRITICAL_PASS_EXPAND",
                f"{name} passed; nominal allowance expanded to {nominal_allowance} units",
                name,
                {"nominal_allowance": nominal_allowance},
            )
        )
    return Reaction(events, False, nominal_allowance)


HorizonDesigns = Callable[[int, float], HorizonDesign]


def stratum_test(
    settings: GauntletConfig,
    spec: StratumConfig,
    alarm: float,
    bounds: ClusterSizeBounds,
    batches: Sequence[Tuple[int, int]],
    *,
    order_free: bool = False,
    horizon: Optional[Tuple[int, HorizonDesigns]] = None,
) -> SequentialTest:
    """The stratum's sequential test, every constant fixed before its first cluster; `order_free`:
    the exact test on clusters that all exist (a file), averaged over gauntlet.orders fixed orders;
    `horizon`: test_mode=horizon's rounding seed and its designs. The question sets the margin and
    the levels: a launch's REGRESSION is an alarm (at `alarm`), a comparison's two sides are each at alpha."""
    s = settings
    asked = asked_of(s)
    common = TestSettings(
        delta=-asked.margin(stratum_margin(s, spec)),
        alpha=s.alpha,
        catastrophic_delta=s.catastrophic_delta if spec.catastrophic_halt and asked.launch else None,
        alarm_alpha=alarm if asked.launch else s.alpha,
        estimand=str(s.estimand),
        # Never read off the outcomes (constants.py): the unit estimand's normaliser and the bet
        # cap's smallest size (None: a running minimum).
        max_cluster_size=bounds.largest,
        min_cluster_size=bounds.smallest,
        cs_grid_step=s.cs_grid_step,
    )
    return make_sequential_test(common, mode_settings(s, batches, order_free=order_free, horizon=horizon))


def asked_of(settings: GauntletConfig) -> Asked:
    return Asked(Question(settings.question), float(settings.superiority_gain))


def mode_settings(
    settings: GauntletConfig,
    batches: Sequence[Tuple[int, int]],
    *,
    order_free: bool = False,
    horizon: Optional[Tuple[int, HorizonDesigns]] = None,
) -> ModeSettings:
    """The settings of gauntlet.test_mode's test (order-free: the exact test on a file; horizon: the
    stratum's planned clusters within its unit limit are the horizon)."""
    s = settings
    if order_free:
        return OrderFreeSettings(bet_rule=str(s.bet_rule), bet_cap=s.bet_cap, orders=s.orders)
    if s.test_mode == TestMode.horizon:
        assert horizon is not None, "test_mode=horizon needs its rounding seed and designs"
        seed, designs = horizon
        planned = batches[-1][1] if batches else 1
        return HorizonSettings(
            bet_rule=str(s.bet_rule), bet_cap=s.bet_cap, horizon=planned, rounding_seed=seed, design=designs
        )
    if s.test_mode == MODE_EXACT:
        return ExactSettings(bet_rule=str(s.bet_rule), bet_cap=s.bet_cap)
    if s.test_mode == MODE_ASYMPTOTIC:
        planned_clusters = batches[-1][1] if batches else 0
        return AsymptoticSettings(burn_in_clusters=s.burn_in_clusters, tuning_clusters=max(planned_clusters, 1))
    # No batch fits: the test sees nothing.
    return GroupSequentialSettings(tuple(planned_looks_of(batches) or [1]), burn_in_clusters=s.burn_in_clusters)


def stratum_margin(settings: GauntletConfig, spec: StratumConfig) -> float:
    return spec.margin_delta if spec.margin_delta is not None else settings.margin_delta


def test_fingerprint(
    settings: GauntletConfig, name: str, spec: StratumConfig, alarm: float, bounds: ClusterSizeBounds
) -> str:
    """What makes two runs' tests of a stratum the same test (the evidence ledger continues only those)."""
    s = settings
    return sha256_json(
        {
            "stratum": name,
            "margin": stratum_margin(s, spec),
            **({} if Question(s.question).is_launch else {"question": str(s.question), "gain": s.superiority_gain}),
            "alpha": s.alpha,
            "alarm_alpha": alarm,
            "estimand": str(s.estimand),
            "bet_rule": str(s.bet_rule),
            "bet_cap": s.bet_cap,
            "cs_grid_step": s.cs_grid_step,
            "catastrophic_delta": s.catastrophic_delta if spec.catastrophic_halt else None,
            "orders": s.orders,
            # How each order bets and stops: evidence tested under another bet is another test.
            "order_free_bet": ORDER_FREE_BET,
            "cluster_size_bounds": [bounds.largest, bounds.smallest],
        }
    )


def synthesised_designs() -> HorizonDesigns:
    """Horizon designs synthesised on first use and kept for the process (the job passes designs
    cached in the content-addressed store instead)."""
    from vlaeval.seqtest.horizon import synthesise

    kept: Dict[Tuple[int, float], HorizonDesign] = {}

    def design(horizon: int, level: float) -> HorizonDesign:
        if (horizon, level) not in kept:
            kept[(horizon, level)] = synthesise(horizon, level)
        return kept[(horizon, level)]

    return design


def multiplicity_statement(
    settings: GauntletConfig, strata: Mapping[str, StratumConfig], alarm: float
) -> MultiplicityStatement:
    """How the launch rule and the alarms control their errors, in words and the alarm level."""
    s = settings
    halts = alarm_count(strata) - len(strata)
    if not Question(s.question).is_launch:
        return MultiplicityStatement(
            launch=f"a comparison, not a launch: BETTER overall needs every stratum's BETTER at alpha "
            f"(intersection-union); each stratum's two directions are each tested at alpha = {s.alpha:g}, "
            f"uncorrected over the {len(strata)} strata",
            alarms="none: a comparison raises no alarm and never halts",
            alarm_alpha=s.alpha,
        )
    return MultiplicityStatement(
        launch="intersection-union: LAUNCH needs every stratum to PASS its own level-alpha test",
        alarms=(
            f"Bonferroni over {len(strata)} REGRESSION alarms and {halts} catastrophic halt(s): each at "
            f"alpha / {alarm_count(strata)} = {alarm:.4g}, so P(any false alarm) <= alpha"
        )
        if s.alarm_fwer == AlarmFwer.bonferroni
        else f"none: each REGRESSION alarm at alpha and each halt at alpha / 2 (P(any false alarm) up to "
        f"{alarm_count(strata)} x alpha)",
        alarm_alpha=alarm,
    )


def validity_statement(settings: GauntletConfig) -> str:
    """What the test mode's decisions are worth, in words (result.json, the report)."""
    s = settings
    halt = (
        "the catastrophic halt fires on a certified REGRESSION at the alarm level whose halt's own one-sided "
        "confidence sequence lies beyond -catastrophic_delta; while that question is open after the REGRESSION, "
        "the stratum keeps sampling until it is decided"
        if s.halt_rule == HaltRule.regression_beyond_margin
        else "the catastrophic halt is decided on a one-sided upper confidence sequence at its own level"
    )
    return {
        "exact": "every stopping decision is an anytime-valid betting e-process on cluster means in random order "
        "(Ville's inequality); decisions are sticky; " + halt,
        "horizon": "HORIZON mode (opt-in): each decision is a boundary that spends its level over the stratum's "
        "planned clusters, synthesised and certified exactly for every rate of discordant outcomes (any "
        "dependence between the policies within a pair); valid within that horizon only -- a continuation is a "
        "new test; the CS, e-values and the halt's bound beside it are anytime-valid; " + halt,
        "asymptotic": "ASYMPTOTIC mode (opt-in): evidence from asymptotic confidence sequences (Waudby-Smith et "
        "al. 2024) after a burn-in, valid only as clusters grow; its PASS and REGRESSION are approximate "
        "evidence for review, never a certificate: they never halt and never block by themselves",
        "group_sequential": "GROUP-SEQUENTIAL mode (opt-in): evidence from z-tests on cluster means at the planned "
        "batches, O'Brien-Fleming-type alpha spending, under the normal approximation; its PASS and "
        "REGRESSION are approximate evidence for review, never a certificate: they never halt and "
        "never block by themselves",
    }[s.test_mode]


class StratumEvaluator:
    """One stratum of a gauntlet run, evaluated: its plan (cluster order, size bounds, batches) known
    before any outcome, then outcomes asked for batch by batch (never beyond a decision), the test,
    and the stratum's record. Holds what every stratum of the run shares."""

    def __init__(
        self,
        settings: GauntletConfig,
        strata: Mapping[str, StratumConfig],
        effects: Mapping[str, float],
        source: Any,
        cache: ArrayCache,
        seed: OrderSeed,
        on_batch: Optional[Callable[[BatchProgress], None]],
        ledger: Optional[EvidenceLedger] = None,
        designs: Optional[HorizonDesigns] = None,
    ) -> None:
        self.s, self.strata, self.effects, self.source, self.cache = settings, strata, effects, source, cache
        self.seed, self.on_batch, self.ledger = seed, on_batch, ledger
        self.designs: HorizonDesigns = designs if designs is not None else synthesised_designs()
        self.order = priority_order(strata)
        self.alarm = alarm_alpha(settings, strata)  # family-wise error of the alarms (REGRESSION and halts)
        self.shuffled = settings.cluster_order == ClusterOrder.shuffled
        self.plan_fixed_in_advance = not source.traits.holds_outcomes
        # Outcomes that all exist (a file), tested exactly in random order: no order may be chosen, so
        # the test averages fixed orders seeded from the clusters themselves (seqtest.order_free).
        self.order_free = source.traits.holds_outcomes and self.shuffled and settings.test_mode == MODE_EXACT

    def request(self, name: str) -> OutcomeRequest:
        s = self.s
        return OutcomeRequest(
            name, self.strata[name], success_rate_effect(self.effects.get(name)), s.seed, s.baseline_version,
            s.candidate_version,
        )  # fmt: skip

    def units_defined(self) -> Dict[str, int]:
        return {name: int(np.sum(self.source.cluster_sizes(self.request(name)))) for name in self.order}

    def unit_limit(self, name: str, units_available: int, budget_left: int, nominal_allowance: int) -> int:
        limit = min(units_available, budget_left)
        return min(limit, nominal_allowance) if name == self.s.nominal_stratum else limit

    def reporter(self, name: str, unit_limit: int, units_before: int) -> Callable[..., None]:
        def report(batch: int, used: int, decision: str, clusters: int, e_values: EValues, final: bool) -> None:
            if self.on_batch is not None:
                self.on_batch(
                    BatchProgress(
                        name, batch, used, unit_limit, units_before + used, decision, clusters, e_values, final
                    )
                )

        return report

    def evaluate(
        self, name: str, budget_left: int, nominal_allowance: int, units_before: int
    ) -> Tuple[StratumResult, TestState]:
        """The stratum's record and its test's state (what the scheduler reacts to)."""
        if self.order_free:
            return self.evaluate_order_free(name, budget_left, nominal_allowance, units_before)
        s, spec = self.s, self.strata[name]
        plan = np.asarray(self.source.cluster_sizes(self.request(name)), dtype=np.int64)
        evaluation_order = (
            cluster_permutation(plan.size, self.seed.seed, name) if self.shuffled else np.arange(plan.size)
        )
        sizes = plan[evaluation_order]
        bounds = cluster_size_bounds(
            name, spec, sizes, estimand=s.estimand, plan_fixed_in_advance=self.plan_fixed_in_advance
        )
        units_available = int(sizes.sum())
        unit_limit = self.unit_limit(name, units_available, budget_left, nominal_allowance)
        batches = plan_batches(sizes, s.batch_units, unit_limit)
        produce = producer(self.source, self.request(name), self.cache)
        cache_statuses: List[str] = []

        def fetch(first: int, end: int) -> StratumOutcomes:
            outcomes, status = produce(evaluation_order[first:end])
            cache_statuses.append(status)
            require(
                np.array_equal(outcomes.cluster_sizes, sizes[first:end]),
                f"the outcome source returned clusters of other sizes than it planned for stratum {name}",
            )
            return outcomes

        rounding_seed = stable_seed("horizon-rounding", self.seed.seed, name)
        test = stratum_test(s, spec, self.alarm, bounds, batches, horizon=(rounding_seed, self.designs))
        # A halting stratum's REGRESSION leaves its halt question open until the halt's own bound
        # decides it: the stratum keeps sampling (within its units) until it does, then halts or goes on.
        await_certified_halt = spec.catastrophic_halt and asked_of(s).launch and TestMode(s.test_mode).certifies
        run = _evaluate_stratum(
            test, fetch, sizes, batches, await_certified_halt, self.reporter(name, unit_limit, units_before)
        )
        if self.source.traits.holds_outcomes:
            # A file holds every cluster: the drift reads them all in the evaluation order, not only the
            # prefix the test stopped in (a file sorted best scene first stops in a flat run of wins).
            whole, _ = produce(evaluation_order)
            run = dataclasses.replace(
                run, drift=drift_diagnostic(whole.paired_means(), whole.cluster_sizes, s.estimand)
            )
        cluster_order = (
            {"mode": "shuffled", **self.seed.as_dict(), "stream": f"cluster-order/{name}"}
            if self.shuffled
            else {"mode": "as_given", "declared_random_by_user": True}
        )
        return self.record(
            name, test, run, units_available, int(sizes.size), unit_limit, cache_statuses, bounds, cluster_order
        ), run.state  # fmt: skip

    def evaluate_order_free(
        self, name: str, budget_left: int, nominal_allowance: int, units_before: int
    ) -> Tuple[StratumResult, TestState]:
        """A stratum whose outcomes all exist: every cluster within the unit limit, tested order-free,
        the ledger's earlier blocks first (a continued test) and the new clusters as one more look."""
        s, spec = self.s, self.strata[name]
        plan = np.asarray(self.source.cluster_sizes(self.request(name)), dtype=np.int64)
        bounds = cluster_size_bounds(name, spec, plan, estimand=s.estimand, plan_fixed_in_advance=False)
        whole, status = producer(self.source, self.request(name), self.cache)(np.arange(plan.size))
        keys = cluster_keys(whole.baseline, whole.candidate, whole.cluster_sizes)
        unit_limit = self.unit_limit(name, int(plan.sum()), budget_left, nominal_allowance)
        fingerprint = test_fingerprint(s, name, spec, self.alarm, bounds)
        continuation = (
            self.ledger.find(name, Comparison(s.baseline_version, s.candidate_version), fingerprint, keys)
            if self.ledger is not None
            else Continuation.unconsulted()
            if not s.evidence_ledger
            else Continuation(ledger=NOT_GIVEN)
        )
        blocks = evidence_blocks(name, keys, plan, continuation, unit_limit)
        if blocks is None:  # the earlier evidence alone exceeds this run's unit limit: restart, and say so
            continuation = Continuation.cannot(
                f"run {continuation.run} tested {continuation.continued_clusters} of these clusters, more units "
                f"than this run's limit of {unit_limit}"
            )
            blocks = evidence_blocks(name, keys, plan, Continuation(), unit_limit) or []
        if continuation.status == CONTINUES and blocks:
            copies = copied_look(continuation.blocks, [keys[i] for i in blocks[-1]])
            if copies is not None:
                continuation = dataclasses.replace(continuation, status=COPIES, note=f"{continuation.note}; {copies}")
        test = stratum_test(s, spec, self.alarm, bounds, [], order_free=True)
        report = self.reporter(name, unit_limit, units_before)
        evaluated = np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
        units, state = 0, test.state
        for look, block in enumerate(blocks, start=1):
            outcomes = whole.reordered(block)
            state = test.update(outcomes.paired_means(), outcomes.cluster_sizes)
            units += outcomes.units
            report(look, units, state.decision, state.clusters, state.e_values, look == len(blocks))
        seen = whole.reordered(evaluated)
        baseline_wins, candidate_wins = seen.cluster_successes()
        run = StratumRun(
            state=state,
            units_evaluated=int(seen.units),
            clusters_evaluated=int(evaluated.size),
            batches=len(blocks),
            success_rates=success_rates(baseline_wins, candidate_wins, seen.cluster_sizes),
        )
        evidence = Evidence(fingerprint, tuple(Counter(keys[i] for i in block) for block in blocks), continuation)
        recorded = recorded_order_stream(s, spec, self.alarm, bounds, whole, unit_limit)
        cluster_order = {
            "mode": "order_free",
            "orders": s.orders,
            "basis": "the clusters' canonical digest (their outcomes as a multiset: no id, row order or format)",
        }
        return self.record(
            name, test, run, int(plan.sum()), int(plan.size), unit_limit, [status], bounds, cluster_order,
            evidence=evidence.to_json(), recorded_order_stream=recorded.to_json(),
        ), state  # fmt: skip

    def record(
        self,
        name: str,
        test: SequentialTest,
        run: StratumRun,
        units_available: int,
        clusters_available: int,
        unit_limit: int,
        cache_statuses: List[str],
        bounds: ClusterSizeBounds,
        cluster_order: Dict[str, Any],
        **extra: Any,
    ) -> StratumResult:
        """The stratum's record, built from its test's state and what testing it took."""
        spec, state, used = self.strata[name], run.state, run.units_evaluated
        # What the source made: on demand, only the units the test asked for.
        produced = used if self.source.traits.produces_on_demand else (units_available if cache_statuses else 0)
        asked = asked_of(self.s)
        margin = asked.margin(stratum_margin(self.s, spec))
        level = state.alpha if state.decision == DECISION_PASS else state.alarm_alpha
        details = {
            "answer": asked.answer(state.decision),
            "certifies": asked.certifies(state.decision, margin, level),
            "clusters_available": clusters_available,
            "batches": run.batches,
            "baseline_success_rate": run.success_rates["baseline"].rate,
            "candidate_success_rate": run.success_rates["candidate"].rate,
            "units_saved_by_early_stop": unit_limit - used,
            "cluster_order": cluster_order,
            "cluster_size_bounds": bounds.as_dict(),
            "cache": cache_statuses[0] if cache_statuses else "not requested",
            **state.to_json(),
            **extra,
        }
        return StratumResult.of_test(
            state,
            stratum=name,
            priority=self.order.index(name) + 1,
            # A source may say what its units are (rollouts: SIMULATED) whatever the stratum's label.
            data_label=stratum_data_label(self.source, name, spec),
            kind=spec.kind,
            planted_effect=self.effects.get(name, 0.0),  # a success-rate difference or a rollout degradation
            units_available=units_available,
            unit_limit=unit_limit,
            units_evaluated=used,
            clusters_evaluated=run.clusters_evaluated,
            units_produced=produced,
            success_rates=run.success_rates,
            drift=run.drift,
            trajectory=test.trajectory(),
            details=details,
        )


def recorded_order_stream(
    settings: GauntletConfig,
    spec: StratumConfig,
    alarm: float,
    bounds: ClusterSizeBounds,
    whole: StratumOutcomes,
    unit_limit: int,
) -> RecordedOrder:
    """Where the anytime test, reading a file's clusters as a stream in the order the file records them
    (first appearance), would have decided -- a description of the recorded order, never the file's
    certificate: an order a user can influence is not one the guarantee may rest on."""
    sizes = whole.cluster_sizes
    fits = int(np.searchsorted(np.cumsum(sizes), unit_limit, side="right"))
    exact = dataclasses.replace(settings, test_mode=TestMode.exact)
    test = stratum_test(exact, spec, alarm, bounds, [(0, fits)])
    state = test.update(whole.paired_means()[:fits], sizes[:fits])
    return RecordedOrder(state.decision, state.decided_at_cluster, state.decided_at_unit, fits)


def cache_delta(before: CacheStats, after: CacheStats) -> CacheUse:
    """What one run did to the outcome cache: hits, misses, corrupt entries recomputed, its hit rate."""
    hits, misses = after.hits - before.hits, after.misses - before.misses
    return CacheUse(
        hits=hits,
        misses=misses,
        corrupt_recomputed=after.corrupt - before.corrupt,
        hit_rate=hits / (hits + misses) if hits + misses else None,
        corrupt_entries=tuple(after.corrupt_entries[len(before.corrupt_entries) :]),
    )


class PriorityRun(NamedTuple):
    """What evaluating the strata in priority order left: the records and events, the order
    evaluated, the units spent, the budget and nominal allowance left, whether the candidate was
    halted, and the strata never reached."""

    results: List[StratumResult]
    events: List[GauntletEvent]
    processed: List[str]
    units_evaluated: int
    budget_left: int
    nominal_allowance: int
    halted: bool
    not_evaluated: List[str]


def evaluate_in_priority_order(
    s: GauntletConfig, strata: Mapping[str, StratumConfig], evaluator: StratumEvaluator
) -> PriorityRun:
    """Each stratum in turn until the queue, the budget or the candidate (halted) runs out; after
    each, the scheduler reacts (halt, promote related strata, expand the nominal allowance)."""
    queue = list(evaluator.order)
    nominal_allowance, budget_left = int(s.nominal_base_allowance), int(s.budget_units)
    units_evaluated, halted = 0, False
    events: List[GauntletEvent] = []
    results: List[StratumResult] = []
    processed: List[str] = []
    while queue and budget_left > 0 and not halted:
        name = queue.pop(0)
        processed.append(name)
        result, state = evaluator.evaluate(name, budget_left, nominal_allowance, units_evaluated)
        results.append(result)
        budget_left -= result.units_evaluated
        units_evaluated += result.units_evaluated
        reaction = (
            react(s, name, strata[name], state, queue, nominal_allowance)
            if asked_of(s).launch
            else Reaction([], False, nominal_allowance)  # a comparison: no halt, no promotion, no expansion
        )
        events.extend(reaction.events)
        halted, nominal_allowance = reaction.halted, reaction.nominal_allowance
    if queue and not halted:
        events.append(
            GauntletEvent(
                "BUDGET_EXHAUSTED",
                f"budget of {s.budget_units} units spent; not evaluated: {queue}",
                figures={"not_evaluated": list(queue)},
            )
        )
    return PriorityRun(results, events, processed, units_evaluated, budget_left, nominal_allowance, halted, list(queue))


def recommend(
    s: GauntletConfig, run: PriorityRun, lineage: Lineage, required_absent: Sequence[str], from_file: bool
) -> Recommendation:
    """The launch recommendation, or a comparison's conclusion, for the evaluated strata."""
    declared = s.cluster_order == ClusterOrder.as_given  # the order is the user's word
    if not asked_of(s).launch:
        return comparison_conclusion(
            asked_of(s),
            run.results,
            run.not_evaluated,
            test_mode=s.test_mode,
            declared_order=declared,
            order_from_file=from_file,
        )
    return launch_recommendation(
        run.results,
        run.not_evaluated,
        halted=run.halted,
        lineage=lineage,
        test_mode=s.test_mode,
        required_absent=required_absent,
        declared_order=declared,
        order_from_file=from_file,
    )


def run_gauntlet(
    settings: GauntletConfig,
    strata: Mapping[str, StratumConfig],
    effects: Mapping[str, float],
    source: Any,
    cache: ArrayCache,
    lineage: Lineage,
    *,
    absent: Sequence[str] = (),
    required_absent: Sequence[str] = (),
    on_batch: Optional[Callable[[BatchProgress], None]] = None,
    order_seed: Optional[OrderSeed] = None,
    ledger: Optional[EvidenceLedger] = None,
    designs: Optional[HorizonDesigns] = None,
) -> GauntletResult:
    """Run the whole gauntlet on the (resolved) strata; pure apart from the outcome source, its
    cache and the evidence ledger it reads. `absent`: configured strata the source lacks (reported;
    `required_absent` need review); `order_seed`: the run's cluster-order seed (default:
    constants.run_order_seed, drawn now); `ledger`: where an outcome file's strata find the evidence
    their test continues (None: every test starts afresh; the caller records the result in it);
    `designs`: test_mode=horizon's certified boundaries (None: synthesised in this process)."""
    s = settings
    source = checked_source(source)  # a no-op for the job's source, checked when it was built
    seed = run_order_seed(s, source) if order_seed is None else order_seed
    started = time.perf_counter()
    cache_before = cache.stats.snapshot()
    evaluator = StratumEvaluator(s, strata, effects, source, cache, seed, on_batch, ledger, designs)
    units_defined = evaluator.units_defined()
    run = evaluate_in_priority_order(s, strata, evaluator)
    elapsed = time.perf_counter() - started
    total_units = int(sum(units_defined.values()))
    return GauntletResult(
        candidate_version=s.candidate_version,
        baseline_version=s.baseline_version,
        planted_effects=dict(effects),
        scale=Scale(
            total_units_defined=total_units,  # the units the source holds for the evaluated strata
            units_evaluated=run.units_evaluated,
            units_saved=total_units - run.units_evaluated,
            # Units the source made: on demand (rollouts), only those evaluated; a whole-stratum
            # source (synthetic, file) makes every unit of a stratum it is asked about.
            units_produced=sum(r.units_produced for r in run.results),
            produced_on_demand=source.traits.produces_on_demand,
            budget_units=int(s.budget_units),
            budget_remaining=run.budget_left,
            nominal_allowance_final=run.nominal_allowance,
        ),
        strata=tuple(run.results),
        events=tuple(run.events),
        recommendation=recommend(s, run, lineage, required_absent, source.traits.holds_outcomes),
        question=str(s.question),
        superiority_gain=float(s.superiority_gain),
        halted=run.halted,
        test_mode=str(s.test_mode),
        not_evaluated=tuple(run.not_evaluated),
        absent_strata=tuple(absent),
        required_absent=tuple(required_absent),
        priority_order=tuple(evaluator.order),
        processed_order=tuple(run.processed),
        lineage=lineage,
        timing={"wall_s": elapsed, "units_per_second": run.units_evaluated / elapsed if elapsed > 0 else None},
        cache=cache_delta(cache_before, cache.stats),
        multiplicity=multiplicity_statement(s, strata, evaluator.alarm),
        statistical_validity=validity_statement(s),
        cluster_order=(
            {"mode": "order_free", "orders": s.orders}
            if evaluator.order_free
            else {"mode": "shuffled", **seed.as_dict()}
            if evaluator.shuffled
            else {"mode": "as_given"}
        ),
    )
