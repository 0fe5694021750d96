"""Paired, clustered non-inferiority testing with anytime-valid e-processes.

Observations are cluster means of paired differences (candidate - baseline, in [-1, 1]); a
cluster is the unit of independence, so within-scene correlation cannot make stopping
anti-conservative. At the margin -delta two one-sided tests run side by side:

* REGRESSION rejects H0: Delta >= -delta (the candidate is certified worse than the margin),
  at level alarm_alpha (alpha, or alpha split across the gauntlet's alarms by the caller);
* PASS rejects H0: Delta <= -delta (the candidate is certified non-inferior), at level alpha.

What Delta is: the mean over the scenario distribution from which the clusters are an i.i.d.
sample, presented in random order (the caller shuffles clusters; see vlaeval.gauntlet). A betting
e-process controls the conditional mean given the past at every step, so it says nothing about
a file's average when the file is grouped (worse scenes first): order matters, not only content.

A decision is declared the first time its test rejects and is sticky. The same machinery on a
grid of margins, each side at alpha/2, gives a (1 - alpha) confidence sequence (CS) for Delta
(running intersection: a rejected margin stays rejected). Every decision margin must lie on that
grid (cs_grid_step divides it), so a decision and the CS speak about the same e-processes.

The catastrophic halt is decided literally on a confidence sequence: a one-sided upper CS for
Delta at level catastrophic_alpha (its own family of e-processes over the same grid); the halt
fires the first time that upper bound is at or below -catastrophic_delta, i.e. every margin
>= -catastrophic_delta is rejected. Its figures are reported at that level, not at the level of
the two-sided CS.

Estimands: `cluster` weights every cluster equally (the mean of cluster means); `unit` weights a
cluster by its size, the payoff of cluster c being (n_c / n_max) (x_c - m) with n_max the largest
cluster size the stratum's scenario distribution can produce (declared, or the plan of a source
that fixes its clusters before producing outcomes): the test is about the scenario-weighted mean.

Bets and caps depend only on earlier clusters and on constants fixed before the stratum starts
(the bet cap comes from a smallest cluster size declared before the stratum, `min_cluster_size`,
or from the smallest cluster seen before each bet; the unit estimand's normaliser is a declared
largest size): a cluster's size arrives with the cluster, and a size-dependent cap broke the
supermartingale property. Neither constant may be read off the outcomes being tested: a file's
largest cluster is one of its outcomes (a file without the rare large clusters gave every cluster
weight 1 and 59% false REGRESSION at alpha = 0.05 on the validity harness's rare-giant design).

Three modes:
* PairedSequentialTest ("exact", the default): betting e-processes, valid at every sample size
  for any distribution on [-1, 1] (Ville's inequality), with a look after every cluster;
* AsymptoticSequentialTest ("asymptotic", opt-in): the asymptotic confidence sequences of
  Waudby-Smith, Arnold, Wu, Wang & Ramdas (2024), valid only as the number of clusters grows;
* GroupSequentialTest ("group_sequential", opt-in, vlaeval.seqtest.group_sequential): z-tests on
  cluster means at the planned looks only, O'Brien-Fleming-type alpha spending; CLT-based.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from vlaeval.choices import Estimand, TestMode
from vlaeval.seqtest.eprocess import (
    BET_RULES,
    FIXED_HORIZON,
    LOWER,
    MIXTURE_CONSTANTS,
    MIXTURE_PRIOR,
    MIXTURE_TOP,
    UPPER,
    BetSettings,
    MomentState,
    WealthFamily,
    mixture_plug_in_weight,
    predictable_moments,
    size_adaptive_cap,
)
from vlaeval.seqtest.state import (
    ASYMPTOTIC_DEFAULTS,
    EXACT_DEFAULTS,
    AsymptoticReport,
    AsymptoticSettings,
    CatastrophicBound,
    CatastrophicState,
    ConfidenceSequence,
    EValues,
    ExactReport,
    ExactSettings,
    ModeReport,
    TestSettings,
    TestState,
)

DECISION_REGRESSION = "REGRESSION"
DECISION_PASS = "PASS"
DECISION_INSUFFICIENT = "INSUFFICIENT"

CATASTROPHIC = "CATASTROPHIC"
NOT_CATASTROPHIC = "NOT_CATASTROPHIC"
CATASTROPHIC_UNDECIDED = "UNDECIDED"

MODE_EXACT = TestMode.exact.value
MODE_ASYMPTOTIC = TestMode.asymptotic.value
MODE_GROUP_SEQUENTIAL = TestMode.group_sequential.value
MODES = TestMode.values()
ESTIMANDS = Estimand.values()

CS_FIRST_CHUNK = 8  # clusters in the first confidence-sequence sub-chunk of a batch (then doubling)
CS_SMALL_GRID = 256  # margins still alive below which a batch is processed in one chunk
NEVER = np.iinfo(np.int64).max  # "not rejected yet", as a cluster count
MAX_LOG_WEALTH = 700.0  # exp(700) ~ 1e304: beyond that, only "huge" matters (and JSON has no inf)


def wealth(log_wealth: float) -> float:
    return float(np.exp(min(float(log_wealth), MAX_LOG_WEALTH)))


def on_grid(value: float, step: float) -> bool:
    ratio = value / step
    return abs(ratio - round(ratio)) < 1e-6


class SequentialTest:
    """What every mode shares: arguments, cluster weights, sticky decisions, per-cluster records."""

    mode = ""
    cs_kind = ""
    records_looks_only = False  # the trajectory holds every cluster (False) or each look's end (True)

    def __init__(self, settings: TestSettings) -> None:
        """`settings` (state.TestSettings): the margin, the levels, the estimand and the cluster-size
        bounds, fixed before the first cluster. A cluster larger than max_cluster_size or smaller
        than min_cluster_size is refused; min_cluster_size None: the bet cap follows a predictable
        running minimum (the smallest cluster seen *before* each bet, 1 before the first)."""
        delta, alpha, catastrophic_delta = settings.delta, settings.alpha, settings.catastrophic_delta
        estimand, cs_grid_step = str(settings.estimand), settings.cs_grid_step
        max_cluster_size, min_cluster_size = settings.max_cluster_size, settings.min_cluster_size
        alarm_alpha = settings.alarm_alpha
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        alarm_alpha = alpha if alarm_alpha is None else float(alarm_alpha)
        if not 0.0 < alarm_alpha <= alpha:
            raise ValueError(f"alarm_alpha must be in (0, alpha], got {alarm_alpha}")
        if not -1.0 < delta < 1.0:
            raise ValueError(f"delta must be in (-1, 1), got {delta}")
        if catastrophic_delta is not None and not delta <= catastrophic_delta < 1.0:
            raise ValueError("catastrophic_delta must be in [delta, 1)")
        if estimand not in ESTIMANDS:
            raise ValueError(f"estimand must be one of {ESTIMANDS}, got {estimand!r}")
        if estimand == "unit" and (max_cluster_size is None or max_cluster_size < 1):
            raise ValueError("the unit estimand needs max_cluster_size (the largest cluster of the stratum)")
        if min_cluster_size is not None and min_cluster_size < 1:
            raise ValueError(f"min_cluster_size must be >= 1, got {min_cluster_size}")
        if not 0.0 < cs_grid_step <= 0.1:
            raise ValueError(f"cs_grid_step must be in (0, 0.1], got {cs_grid_step}")
        self.delta = float(delta)
        self.alpha = float(alpha)
        self.alarm_alpha = alarm_alpha
        self.catastrophic_alpha = min(alpha / 2.0, alarm_alpha)  # never looser than the CS's side
        self.catastrophic_delta = None if catastrophic_delta is None else float(catastrophic_delta)
        self.estimand = estimand
        self.max_cluster_size = None if max_cluster_size is None else int(max_cluster_size)
        self.min_cluster_size = None if min_cluster_size is None else int(min_cluster_size)
        self._smallest_seen = math.inf  # the running minimum's state (min_cluster_size None)
        self.cs_grid_step = float(cs_grid_step)
        self._clusters = 0
        self._units = 0
        self._unit_weighted_sum = 0.0
        self._cluster_mean_sum = 0.0
        self._decision = DECISION_INSUFFICIENT
        self._decided_at_cluster: Optional[int] = None
        self._decided_at_unit: Optional[int] = None
        self._decision_wealth: Optional[float] = None
        self._catastrophic = CATASTROPHIC_UNDECIDED
        self._catastrophic_at_cluster: Optional[int] = None
        self._catastrophic_detail: Dict[str, Any] = {}
        self._series: Dict[str, List[np.ndarray]] = defaultdict(list)
        self._looks: List[int] = []

    # ------------------------------------------------------------------ updates
    def update(self, cluster_means: np.ndarray, cluster_sizes: Optional[np.ndarray] = None) -> TestState:
        """Feed the next clusters' mean paired differences (each in [-1, 1]), in order: one look.
        Returns the test's state after it."""
        x, sizes, weights = self._checked(cluster_means, cluster_sizes)
        if x.size:
            self._record(x, sizes, *self._advance(x, weights, sizes))
        return self.state

    def _checked(
        self, cluster_means: np.ndarray, cluster_sizes: Optional[np.ndarray]
    ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """(cluster means, sizes, unit-estimand weights or None), every input check in one place."""
        x = np.asarray(cluster_means, dtype=np.float64).ravel()
        if x.size == 0:
            return x, np.zeros(0), None
        if not np.all(np.isfinite(x)) or np.any(np.abs(x) > 1.0):
            raise ValueError("cluster means of paired differences must be finite and in [-1, 1]")
        sizes = np.ones_like(x) if cluster_sizes is None else np.asarray(cluster_sizes, dtype=np.float64).ravel()
        if sizes.shape != x.shape or np.any(sizes < 1):
            raise ValueError("cluster_sizes must match cluster_means and be >= 1")
        if self.min_cluster_size is not None and np.any(sizes < self.min_cluster_size):
            raise ValueError(
                f"a cluster of {int(sizes.min())} units is smaller than min_cluster_size="
                f"{self.min_cluster_size}, the smallest size the bet cap was fixed for"
            )
        weights = None
        if self.estimand == "unit":
            largest = int(self.max_cluster_size or 0)  # set whenever the estimand is unit (checked in __init__)
            if np.any(sizes > largest):
                raise ValueError(f"a cluster is larger than max_cluster_size={largest}")
            weights = sizes / largest
        return x, sizes, weights

    def _record(self, x: np.ndarray, sizes: np.ndarray, firsts: Dict[str, int], series: Dict[str, np.ndarray]) -> None:
        """Take in a look's outcome: sticky decisions at their first rejection (`firsts`: index into x,
        -1 none), the estimate after each cluster, and the per-cluster `series` of the mode."""
        seen, seen_units = self._clusters, self._units
        units_after = seen_units + np.cumsum(sizes).astype(np.int64)
        if self._decision == DECISION_INSUFFICIENT:
            name, index = _first_decision((DECISION_REGRESSION, firsts["regression"]), (DECISION_PASS, firsts["pass"]))
            if name is not None:
                self._decision, self._decided_at_cluster = name, seen + index + 1
                self._decided_at_unit = int(units_after[index])
                side = "log_wealth_regression" if name == DECISION_REGRESSION else "log_wealth_pass"
                if side in series:
                    self._decision_wealth = wealth(series[side][index])
        if self.catastrophic_delta is not None and self._catastrophic == CATASTROPHIC_UNDECIDED:
            name, index = _first_decision(
                (CATASTROPHIC, firsts["catastrophic"]), (NOT_CATASTROPHIC, firsts["not_catastrophic"])
            )
            if name is not None:
                self._catastrophic, self._catastrophic_at_cluster = name, seen + index + 1
                detail: Dict[str, Any] = {"decided_at_unit": int(units_after[index])}
                if name == CATASTROPHIC:
                    detail["upper_bound_at_decision"] = float(series["catastrophic_upper"][index])
                side = "log_wealth_catastrophic" if name == CATASTROPHIC else "log_wealth_not_catastrophic"
                if side in series:  # the e-process at -catastrophic_delta on the deciding side
                    detail["wealth_at_decision"] = wealth(series[side][index])
                self._catastrophic_detail = detail
        weighted = np.cumsum(x * sizes) + self._unit_weighted_sum
        plain = np.cumsum(x) + self._cluster_mean_sum
        counts = seen + np.arange(1, x.size + 1)
        estimate = weighted / units_after if self.estimand == "unit" else plain / counts
        empty = series["cs_lower"] > series["cs_upper"]  # every margin rejected: a degenerate, empty CS
        series["cs_lower"] = np.where(empty, estimate, series["cs_lower"])
        series["cs_upper"] = np.where(empty, estimate, series["cs_upper"])
        for key, values in (
            ("clusters", counts),
            ("units", units_after),
            ("delta_estimate", estimate),
            *series.items(),
        ):
            # A mode that decides only at the end of a look records only that end.
            self._series[key].append(np.asarray(values)[-1:] if self.records_looks_only else np.asarray(values))
        self._clusters += x.size
        self._units = int(units_after[-1])
        self._smallest_seen = min(self._smallest_seen, float(sizes.min()))
        self._unit_weighted_sum = float(weighted[-1])
        self._cluster_mean_sum = float(plain[-1])
        self._looks.append(self._clusters)

    def _advance(
        self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray
    ) -> Tuple[Dict[str, int], Dict[str, np.ndarray]]:
        """Consume a batch. Returns, per question (regression, pass, catastrophic,
        not_catastrophic), the batch index of its first rejection (-1: none); and per-cluster
        series (cs_lower, cs_upper, catastrophic_upper, log-wealths where the mode has them)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ reading
    def _delta_estimate(self) -> Optional[float]:
        """The point estimate of the estimand the tests are about."""
        if self._clusters == 0:
            return None
        return self._unit_weighted_estimate() if self.estimand == "unit" else self._cluster_mean_sum / self._clusters

    def _unit_weighted_estimate(self) -> Optional[float]:
        return None if self._units == 0 else self._unit_weighted_sum / self._units

    def _confidence_sequence(self) -> Tuple[float, float]:
        """The current (1 - alpha) two-sided confidence sequence for Delta."""
        if not self._series:
            return -1.0, 1.0
        return float(self._series["cs_lower"][-1][-1]), float(self._series["cs_upper"][-1][-1])

    def _catastrophic_upper_bound(self) -> Optional[float]:
        """The one-sided (1 - catastrophic_alpha) upper confidence bound the halt is decided on."""
        if self.catastrophic_delta is None:
            return None
        return 1.0 if not self._series else float(self._series["catastrophic_upper"][-1][-1])

    def _e_values(self) -> EValues:
        """The current wealth of the decision e-processes (None where the mode has none)."""
        return EValues()

    def trajectory(self) -> Dict[str, List[float] | List[int]]:
        """Per-cluster records, as columns: clusters and units seen, the estimate, the CS (and the
        catastrophic upper bound), the e-processes' wealth where the mode has them; `looks` are the
        cluster counts at which batches ended."""
        out: Dict[str, List[float] | List[int]] = {}
        for key, chunks in self._series.items():
            values = np.concatenate(chunks)
            if key.startswith("log_wealth_"):
                out["e_value_" + key[len("log_wealth_") :]] = np.exp(np.minimum(values, MAX_LOG_WEALTH)).tolist()
            else:
                out[key] = values.tolist()
        out["looks"] = list(self._looks)
        return out

    @property
    def state(self) -> TestState:
        """The test after its last look, as a frozen record (what `update` returns)."""
        lower, upper = self._confidence_sequence()
        catastrophic = None
        if self.catastrophic_delta is not None:
            catastrophic = CatastrophicState(
                delta=self.catastrophic_delta,
                alpha=self.catastrophic_alpha,
                status=self._catastrophic,
                at_cluster=self._catastrophic_at_cluster,
                bound=CatastrophicBound(
                    upper=self._catastrophic_upper_bound(),
                    level=1.0 - self.catastrophic_alpha,
                    **self._catastrophic_detail,
                ),
            )
        return TestState(
            decision=self._decision,
            decided_at_cluster=self._decided_at_cluster,
            decided_at_unit=self._decided_at_unit,
            decision_wealth=self._decision_wealth,
            test_mode=self.mode,
            alpha=self.alpha,
            alarm_alpha=self.alarm_alpha,
            margin_delta=self.delta,
            estimand=self.estimand,
            min_cluster_size=self.min_cluster_size,
            clusters=self._clusters,
            units=self._units,
            looks=len(self._looks),
            delta_estimate=self._delta_estimate(),
            unit_weighted_delta_estimate=self._unit_weighted_estimate(),
            confidence_sequence=ConfidenceSequence(lower, upper, 1.0 - self.alpha, self.cs_kind),
            e_values=self._e_values(),
            catastrophic=catastrophic,
            settings=self._report(),
        )

    def _report(self) -> ModeReport:
        return ModeReport()


def _first_decision(*candidates: Tuple[str, int]) -> Tuple[Optional[str], int]:
    """The earliest rejection in this batch (the alarm, listed first, wins a tie): (name, index)."""
    crossed = [(index, order, name) for order, (name, index) in enumerate(candidates) if index >= 0]
    if not crossed:
        return None, -1
    index, _, name = min(crossed)
    return name, int(index)


def hull_bounds(grid: np.ndarray, rejected_after: np.ndarray, counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per cluster count c: the nearest rejected grid points below and above the margins still
    alive after c clusters (alive: rejected_after > c), i.e. the running-intersection CS's hull,
    conservative by one grid step; (-1, 1) where nothing is rejected on that side."""
    prefix = np.maximum.accumulate(rejected_after)  # first alive index = first prefix max > c
    first_alive = np.searchsorted(prefix, counts, side="right")
    suffix = np.maximum.accumulate(rejected_after[::-1])[::-1]  # non-increasing
    last_alive = np.searchsorted(-suffix, -counts, side="left") - 1
    lower = np.where(first_alive > 0, grid[np.maximum(first_alive - 1, 0)], -1.0)
    upper = np.where(last_alive + 1 < grid.size, grid[np.minimum(last_alive + 1, grid.size - 1)], 1.0)
    return lower, upper


class PairedSequentialTest(SequentialTest):
    """Exact anytime-valid test: betting e-processes on (weighted) cluster means."""

    mode = MODE_EXACT
    cs_kind = "betting CS, running intersection (anytime-valid, exact)"

    def __init__(self, settings: TestSettings, mode: ExactSettings = EXACT_DEFAULTS) -> None:
        """mode.bet_cap: the cap fraction c in (0, 1], or None for the size-adaptive cap
        1 - 0.2 / n_min (eprocess.size_adaptive_cap) with n_min the declared min_cluster_size
        (one cap for the whole stratum) or, undeclared, the running minimum before each bet."""
        super().__init__(settings)
        bet_rule, bet_cap = str(mode.bet_rule), mode.bet_cap
        if bet_rule not in BET_RULES:
            raise ValueError(f"unknown bet rule {bet_rule!r}; use one of {BET_RULES}")
        if bet_cap is not None and not 0.0 < bet_cap <= 1.0:
            raise ValueError(f"bet_cap must be in (0, 1] or None (size-adaptive), got {bet_cap}")
        margins = {"delta": self.delta, "catastrophic_delta": self.catastrophic_delta}
        for name, value in margins.items():
            if value is not None and not on_grid(value, self.cs_grid_step):
                raise ValueError(
                    f"{name}={value} is not a multiple of cs_grid_step={self.cs_grid_step}: every "
                    "decision margin must lie on the confidence sequence's grid"
                )
        self.bet_rule = bet_rule
        self.bet_cap = None if bet_cap is None else float(bet_cap)
        self.cap_fraction = (
            float(size_adaptive_cap(self.min_cluster_size or 1)) if bet_cap is None else float(bet_cap)
        )  # the first bet's cap (a running minimum starts at 1, then follows the smallest cluster seen)
        # The mixture's constant bets: no cap depends on cluster sizes (eprocess.MIXTURE_TOP); its weight
        # on the scaled plug-ins from the smallest cluster declared before the stratum.
        self.constant_cap = MIXTURE_TOP if bet_cap is None else float(bet_cap)
        self.plug_in_weight = mixture_plug_in_weight(self.min_cluster_size)

        steps = int(round(2.0 / self.cs_grid_step))
        self._grid = np.round(np.linspace(-1.0, 1.0, steps + 1)[1:-1], 12)
        grid_levels = np.full(self._grid.size, self.alpha / 2.0)
        # Decision margins first, then the grid. PASS side: -delta at alpha (and -catastrophic_delta
        # at catastrophic_alpha: "certainly not catastrophic", which ends a halting stratum's search).
        upper_margins, upper_levels = [-self.delta], [self.alpha]
        if self.catastrophic_delta is not None:
            upper_margins.append(-self.catastrophic_delta)
            upper_levels.append(self.catastrophic_alpha)
        self._n_upper, self._n_lower = len(upper_margins), 1
        self._upper = WealthFamily.start(np.concatenate((upper_margins, self._grid)), UPPER)
        self._lower = WealthFamily.start(np.concatenate(([-self.delta], self._grid)), LOWER)
        self._upper_thresholds = np.log(1.0 / np.concatenate((upper_levels, grid_levels)))
        self._lower_thresholds = np.log(1.0 / np.concatenate(([self.alarm_alpha], grid_levels)))
        self._grid_rejected_after = np.full(self._grid.size, NEVER, dtype=np.int64)  # two-sided CS
        if self.catastrophic_delta is not None:
            # The halt's own one-sided upper CS at catastrophic_alpha, over the same grid.
            self._cat_family = WealthFamily.start(self._grid, LOWER)
            self._cat_threshold = math.log(1.0 / self.catastrophic_alpha)
            self._cat_rejected_after = np.full(self._grid.size, NEVER, dtype=np.int64)
            self._cat_index = int(np.argmin(np.abs(self._grid + self.catastrophic_delta)))
            # The halt's bound is an upper bound: margins below -catastrophic_delta change it only
            # once it has fallen to -catastrophic_delta (the halt). They are computed from then
            # on, replayed over the stratum's chunks so far (same arithmetic, same rejections);
            # until then they would cost half the grid for every cluster and change nothing.
            self._cat_floor = self._cat_index
            self._cat_chunks: List[Tuple[np.ndarray, Optional[np.ndarray], Any, MomentState, int]] = []
        self._moments = MomentState()

    def _report(self) -> ExactReport:
        cap: Optional[float]
        if self.bet_cap is not None:
            rule, cap = "fixed", self.cap_fraction
        elif self.min_cluster_size is not None:
            rule, cap = "size-adaptive 1 - 0.2/min_cluster_size (declared before the stratum)", self.cap_fraction
        else:
            rule = "size-adaptive 1 - 0.2/(smallest cluster seen before the bet: a predictable running minimum)"
            cap = float(size_adaptive_cap(self._smallest_seen)) if math.isfinite(self._smallest_seen) else None
        if self.bet_rule == "mixture":
            a, b = MIXTURE_PRIOR
            rule = (
                f"mixture: {self.plug_in_weight:g} on the blend bet x1, x2, x3 capped at the {rule} cap; "
                f"{1 - self.plug_in_weight:g} on {MIXTURE_CONSTANTS} constant bets, Beta({a:g}, {b:g}) fractions of "
                f"{self.constant_cap:g} x the largest safe bet"
            )
        return ExactReport(bet_rule=str(self.bet_rule), bet_cap=cap, bet_cap_rule=rule)

    def bet_settings(
        self, cap: float | np.ndarray, weights: Optional[np.ndarray], horizon: Optional[float] = None
    ) -> BetSettings:
        """What every WealthFamily.update of this test bets with: the rule, this chunk's caps and
        weights, and the mixture's constants (all fixed before the stratum but the running caps);
        `horizon`: the observations to come, known before the first (a file's block): the
        fixed-horizon plug-in then replaces the rule."""
        return BetSettings(
            rule=self.bet_rule if horizon is None else FIXED_HORIZON,
            cap_fraction=cap,
            alpha=self.alpha,
            weights=weights,
            constant_cap=self.constant_cap,
            plug_in_weight=self.plug_in_weight,
            horizon=horizon,
        )

    def _caps(self, sizes: np.ndarray) -> float | np.ndarray:
        """The cap fraction of each cluster's bet: one number when it is fixed (bet_cap, or a declared
        min_cluster_size), else 1 - 0.2 / (the smallest cluster seen *before* that cluster, 1 before
        the first) -- predictable, so the supermartingale holds."""
        if self.bet_cap is not None or self.min_cluster_size is not None:
            return self.cap_fraction
        before = np.minimum.accumulate(np.concatenate(([self._smallest_seen], sizes)))[:-1]
        return size_adaptive_cap(np.where(np.isfinite(before), before, 1.0))

    def _advance(
        self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray
    ) -> Tuple[Dict[str, int], Dict[str, np.ndarray]]:
        seen = self._clusters
        halting = self.catastrophic_delta is not None
        firsts = {"regression": -1, "pass": -1, "catastrophic": -1, "not_catastrophic": -1}
        kept: Dict[str, List[np.ndarray]] = defaultdict(list)
        state, start, chunk = self._moments, 0, CS_FIRST_CHUNK
        caps = self._caps(sizes)
        # Growing sub-chunks with pruning in between: a rejected grid margin stays rejected, so
        # this gives exactly the unchunked result while most of the grid (far from the data) is
        # dropped after the first few clusters.
        while start < x.size:
            alive = self._grid_rejected_after == NEVER
            if np.count_nonzero(alive) <= CS_SMALL_GRID:
                chunk = x.size  # little left to prune: one pass costs less than many small ones
            part = x[start : start + chunk]
            w = None if weights is None else weights[start : start + chunk]
            moments = predictable_moments(part, state, w)
            cap = caps[start : start + chunk] if isinstance(caps, np.ndarray) else caps
            common = self.bet_settings(cap, w)
            up_first, up_paths = self._upper.update(
                part,
                moments,
                threshold_log=self._upper_thresholds,
                keep=range(self._n_upper),
                active=np.concatenate((np.ones(self._n_upper, bool), alive)),
                **common,
            )
            low_first, low_paths = self._lower.update(
                part,
                moments,
                threshold_log=self._lower_thresholds,
                keep=range(self._n_lower),
                active=np.concatenate((np.ones(self._n_lower, bool), alive)),
                **common,
            )
            kept["log_wealth_pass"].append(up_paths[0])
            kept["log_wealth_regression"].append(low_paths[0])
            if halting:
                kept["log_wealth_not_catastrophic"].append(up_paths[1])
            for name, first in (("pass", up_first[0]), ("regression", low_first[0])) + (
                (("not_catastrophic", up_first[1]),) if halting else ()
            ):
                if firsts[name] < 0 and first >= 0:
                    firsts[name] = start + int(first)
            grid_first = np.where(up_first[self._n_upper :] >= 0, up_first[self._n_upper :], np.iinfo(np.int64).max)
            grid_first = np.minimum(grid_first, np.where(low_first[1:] >= 0, low_first[1:], np.iinfo(np.int64).max))
            newly = alive & (grid_first < np.iinfo(np.int64).max)
            self._grid_rejected_after[newly] = seen + start + grid_first[newly] + 1
            if halting:
                cat_alive = self._cat_rejected_after == NEVER
                cat_alive[: self._cat_floor] = False
                cat_alive[self._cat_index] = True  # the e-process at -catastrophic_delta itself, for its wealth
                cat_first, cat_paths = self._cat_family.update(
                    part, moments, threshold_log=self._cat_threshold, keep=[self._cat_index], active=cat_alive, **common
                )
                kept["log_wealth_catastrophic"].append(cat_paths[0])
                newly = cat_alive & (cat_first >= 0) & (self._cat_rejected_after == NEVER)
                self._cat_rejected_after[newly] = seen + start + cat_first[newly] + 1
                self._cat_chunks.append((part, w, cap, state, seen + start))
            state, start, chunk = state.advanced(part, w), start + part.size, chunk * 2
        self._moments = state

        counts = seen + np.arange(1, x.size + 1)
        series = {key: np.concatenate(parts) for key, parts in kept.items()}
        series["cs_lower"], series["cs_upper"] = hull_bounds(self._grid, self._grid_rejected_after, counts)
        if self.catastrophic_delta is not None:
            series["catastrophic_upper"] = self._catastrophic_upper(counts)
            below = np.flatnonzero(series["catastrophic_upper"] <= -self.catastrophic_delta + 1e-12)
            firsts["catastrophic"] = int(below[0]) if below.size else -1
        return firsts, series

    def _catastrophic_upper(self, counts: np.ndarray) -> np.ndarray:
        """The halt's upper bound after each count, exact: while it rests on the lowest margin computed
        so far, the margins below are brought in (replayed from the stratum's start) and it is
        recomputed; margins not yet computed count as not rejected, so it can only be too high."""
        step = 64
        while True:
            _, upper = hull_bounds(self._grid, self._cat_rejected_after, counts)
            if self._cat_floor == 0 or not np.any(upper <= self._grid[self._cat_floor]):
                return upper
            low = max(0, self._cat_floor - step)
            self._replay_catastrophic(low, self._cat_floor)
            self._cat_floor, step = low, step * 2

    def _replay_catastrophic(self, low: int, high: int) -> None:
        """Run the halt family's margins [low, high) over every chunk seen so far, as they would have run."""
        wanted = np.zeros(self._grid.size, dtype=np.bool_)
        wanted[low:high] = True
        for part, w, cap, state, offset in self._cat_chunks:
            alive = wanted & (self._cat_rejected_after == NEVER)
            if not alive.any():
                break
            first, _ = self._cat_family.update(
                part,
                predictable_moments(part, state, w),
                threshold_log=self._cat_threshold,
                active=alive,
                **self.bet_settings(cap, w),
            )
            newly = alive & (first >= 0)
            self._cat_rejected_after[newly] = offset + first[newly] + 1

    def _e_values(self) -> EValues:
        halting = self.catastrophic_delta is not None
        return EValues(
            regression=wealth(self._lower.log_wealth[0]),
            pass_=wealth(self._upper.log_wealth[0]),
            peak_regression=wealth(self._lower.log_peak_wealth[0]),
            peak_pass=wealth(self._upper.log_peak_wealth[0]),
            catastrophic=wealth(self._cat_family.log_wealth[self._cat_index]) if halting else None,
            not_catastrophic=wealth(self._upper.log_wealth[1]) if halting else None,
            halting=halting,
        )


def asymptotic_half_width(t: np.ndarray, sd: np.ndarray, alpha: float, tuning_clusters: float) -> np.ndarray:
    """Half-width of the two-sided level-alpha asymptotic CS (Waudby-Smith et al. 2024, Thm 2.2)
    after t clusters with plug-in standard deviation sd; rho makes it tightest at tuning_clusters."""
    rho_sq = (-2.0 * math.log(alpha) + math.log(-2.0 * math.log(alpha) + 1.0)) / tuning_clusters
    grow = t * rho_sq + 1.0
    return sd * np.sqrt(2.0 * grow / (t * t * rho_sq) * np.log(np.sqrt(grow) / alpha))


def asymptotic_running(
    x: np.ndarray, weights: Optional[np.ndarray] = None, state: Optional[MomentState] = None
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(clusters, running mean, plug-in sd) after each element along the last axis of x. With
    weights the mean is the ratio estimator sum w x / sum w and the sd is the delta method's, of
    w (x - mean) / mean(w)."""
    state = MomentState() if state is None else state
    w = np.ones_like(x) if weights is None else np.broadcast_to(weights, x.shape)
    m = predictable_moments(x, state, w)
    t = m.before + 1.0
    sum_w, sum_wx = m.sum_w + w, m.sum_wx + w * x
    sum_w2, sum_w2x, sum_w2x2 = m.sum_w2 + w * w, m.sum_w2x + w * w * x, m.sum_w2x2 + w * w * x * x
    mean = sum_wx / sum_w
    residual_ss = np.maximum(sum_w2x2 - 2.0 * mean * sum_w2x + mean * mean * sum_w2, 0.0)
    sd = np.sqrt(residual_ss / np.maximum(t - 1.0, 1.0)) / (sum_w / t)
    return t, mean, sd


def running_extreme(values: np.ndarray, start: float, upper: bool) -> np.ndarray:
    """Running minimum (upper bounds) or maximum (lower bounds) of values, continuing `start`."""
    if upper:
        return np.minimum.accumulate(np.concatenate(([start], values)))[1:]
    return np.maximum.accumulate(np.concatenate(([start], values)))[1:]


class AsymptoticSequentialTest(SequentialTest):
    """ASYMPTOTIC (opt-in): decisions from asymptotic confidence sequences after a burn-in.

    A one-sided decision at level a uses the two-sided boundary at level 2a (the Gaussian limit is
    symmetric); the reported CS is two-sided at alpha. Valid only asymptotically: a skewed
    distribution of cluster means can make it reject too often at realistic sample sizes."""

    mode = MODE_ASYMPTOTIC
    cs_kind = "ASYMPTOTIC CS (Waudby-Smith et al. 2024), running intersection; not exact"

    def __init__(self, settings: TestSettings, mode: AsymptoticSettings = ASYMPTOTIC_DEFAULTS) -> None:
        super().__init__(settings)
        burn_in_clusters, tuning_clusters = mode.burn_in_clusters, mode.tuning_clusters
        if burn_in_clusters < 2:
            raise ValueError(f"burn_in_clusters must be >= 2, got {burn_in_clusters}")
        if tuning_clusters < 1:
            raise ValueError(f"tuning_clusters must be >= 1, got {tuning_clusters}")
        self.burn_in_clusters = int(burn_in_clusters)
        self.tuning_clusters = int(tuning_clusters)
        self._moments = MomentState()
        self._bounds = {"cs_lower": -1.0, "cs_upper": 1.0, "catastrophic_upper": 1.0}

    def _report(self) -> AsymptoticReport:
        return AsymptoticReport(burn_in_clusters=self.burn_in_clusters, tuning_clusters=self.tuning_clusters)

    def _advance(
        self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray
    ) -> Tuple[Dict[str, int], Dict[str, np.ndarray]]:
        t, mean, sd = asymptotic_running(x, weights, self._moments)
        self._moments = self._moments.advanced(x, weights)
        ready = t >= self.burn_in_clusters

        def bound(level: float) -> np.ndarray:
            return asymptotic_half_width(t, sd, level, self.tuning_clusters)

        def first(condition: np.ndarray) -> int:
            hit = np.flatnonzero(condition & ready)
            return int(hit[0]) if hit.size else -1

        half = bound(self.alpha)
        series = {
            "cs_lower": running_extreme(np.where(ready, mean - half, -1.0), self._bounds["cs_lower"], upper=False),
            "cs_upper": running_extreme(np.where(ready, mean + half, 1.0), self._bounds["cs_upper"], upper=True),
        }
        firsts = {
            "pass": first(mean - bound(2.0 * self.alpha) > -self.delta),
            "regression": first(mean + bound(2.0 * self.alarm_alpha) < -self.delta),
            "catastrophic": -1,
            "not_catastrophic": -1,
        }
        if self.catastrophic_delta is not None:
            cat = bound(2.0 * self.catastrophic_alpha)
            series["catastrophic_upper"] = running_extreme(
                np.where(ready, mean + cat, 1.0), self._bounds["catastrophic_upper"], upper=True
            )
            firsts.update(
                catastrophic=first(series["catastrophic_upper"] < -self.catastrophic_delta),
                not_catastrophic=first(mean - cat > -self.catastrophic_delta),
            )
        for key in self._bounds:
            if key in series:
                self._bounds[key] = float(series[key][-1])
        return firsts, series


def catastrophic_message(catastrophic: CatastrophicState) -> str:
    """What the halt certified, with the figures at the level that decided it."""
    c, bound = catastrophic, catastrophic.bound
    text = (
        f"Delta < -{c.delta:g} certified at level {c.alpha:.3g} after {c.at_cluster} clusters: the one-sided "
        f"{1 - c.alpha:.2%} upper confidence bound is {bound.upper_bound_at_decision:+.3f}"
    )
    if bound.wealth_at_decision is not None:
        text += (
            f"; the e-process for H0: Delta >= -{c.delta:g} stood at "
            f"{bound.wealth_at_decision:.3g} (threshold 1/{c.alpha:.3g} = {1 / c.alpha:.3g})"
        )
    return text


def planned_looks_of(batches: Sequence[Tuple[int, int]]) -> List[int]:
    """Cluster counts at the end of each planned batch (the group-sequential design's looks)."""
    return [int(end) for _, end in batches]
