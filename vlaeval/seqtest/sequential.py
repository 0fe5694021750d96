"""Paired, clustered non-inferiority testing with anytime-valid e-processes.

Observations are cluster means of paired differences (candidate - baseline, in [-1, 1]); a
cluster is the unit of independence, so within-scene correlation cannot make stopping
anti-conservative. At the margin -delta two one-sided tests run side by side:

* REGRESSION rejects H0: Delta >= -delta (the candidate is certified worse than the margin),
  at level alarm_alpha (alpha, or alpha split across strata by the caller: see the scheduler);
* PASS rejects H0: Delta <= -delta (the candidate is certified non-inferior), at level alpha.

A decision is declared the first time its test rejects and is sticky. The same machinery on a
grid of margins, each side at alpha/2, gives a (1 - alpha) confidence sequence (CS) for Delta
(running intersection: a rejected margin stays rejected). The catastrophic halt is decided on the
CS: "catastrophic" means the upper confidence bound at level min(alpha/2, alarm_alpha) lies below
-catastrophic_delta, so whenever it is declared the reported CS lies below that line too.

Estimands: `cluster` weights every cluster equally (the mean of cluster means); `unit` weights a
cluster by its size, the payoff of cluster c being (n_c / n_max) (x_c - m) with n_max the largest
cluster size of the stratum (known from the scenario plan before any outcome): the test is then
about the scenario-weighted mean difference when clusters are drawn in random order.

Two modes:
* PairedSequentialTest (mode "exact", the default): betting e-processes, valid at every sample
  size for any distribution on [-1, 1] (Ville's inequality);
* AsymptoticSequentialTest (mode "asymptotic", opt-in): the asymptotic confidence sequences of
  Waudby-Smith, Arnold, Wu, Wang & Ramdas (2024), a Gaussian-mixture boundary around the running
  mean with a plug-in variance, valid only as the number of clusters grows; no decision is taken
  during a burn-in. Faster, not exact: see benchmarks/seqtest_efficiency.py for its measured Type-I.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from vlaeval.seqtest.eprocess import (
    BET_RULES,
    LOWER,
    UPPER,
    MomentState,
    WealthFamily,
    predictable_moments,
    size_adaptive_cap,
)

DECISION_REGRESSION = "REGRESSION"
DECISION_PASS = "PASS"
DECISION_INSUFFICIENT = "INSUFFICIENT"

CATASTROPHIC = "CATASTROPHIC"
NOT_CATASTROPHIC = "NOT_CATASTROPHIC"
CATASTROPHIC_UNDECIDED = "UNDECIDED"

MODE_EXACT = "exact"
MODE_ASYMPTOTIC = "asymptotic"
MODES = (MODE_EXACT, MODE_ASYMPTOTIC)
ESTIMANDS = ("cluster", "unit")

# Chosen by benchmarks/seqtest_efficiency.py (the README's table): the rule and cap with the
# smallest worst-case ratio of median clusters-to-decision over the information floor.
DEFAULT_BET_RULE = "blend"
DEFAULT_BET_CAP: Optional[float] = None  # the size-adaptive cap 1 - 0.2 / n

CS_FIRST_CHUNK = 8  # clusters in the first confidence-sequence sub-chunk of a batch (then doubling)
CS_SMALL_GRID = 256  # margins still alive below which a batch is processed in one chunk


class _SequentialTest:
    """What both modes share: arguments, cluster weights, sticky decisions, reading."""

    mode = ""
    cs_kind = ""

    def __init__(self, delta: float, alpha: float, *, catastrophic_delta: Optional[float] = None,
                 alarm_alpha: Optional[float] = None, estimand: str = "cluster",
                 max_cluster_size: Optional[int] = None, cs_grid_step: float = 0.001) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        alarm_alpha = alpha if alarm_alpha is None else float(alarm_alpha)
        if not 0.0 < alarm_alpha <= alpha:
            raise ValueError(f"alarm_alpha must be in (0, alpha], got {alarm_alpha}")
        if not 0.0 <= delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {delta}")
        if catastrophic_delta is not None and not delta <= catastrophic_delta < 1.0:
            raise ValueError("catastrophic_delta must be in [delta, 1)")
        if estimand not in ESTIMANDS:
            raise ValueError(f"estimand must be one of {ESTIMANDS}, got {estimand!r}")
        if estimand == "unit" and (max_cluster_size is None or max_cluster_size < 1):
            raise ValueError("the unit estimand needs max_cluster_size (the largest cluster of the stratum)")
        if not 0.0 < cs_grid_step <= 0.1:
            raise ValueError(f"cs_grid_step must be in (0, 0.1], got {cs_grid_step}")
        self.delta = float(delta)
        self.alpha = float(alpha)
        self.alarm_alpha = alarm_alpha
        self.catastrophic_alpha = min(alpha / 2.0, alarm_alpha)  # never looser than the CS's side
        self.catastrophic_delta = None if catastrophic_delta is None else float(catastrophic_delta)
        self.estimand = estimand
        self.max_cluster_size = None if max_cluster_size is None else int(max_cluster_size)
        self.cs_grid_step = float(cs_grid_step)
        self._clusters = 0
        self._units = 0
        self._unit_weighted_sum = 0.0
        self._cluster_mean_sum = 0.0
        self._decision = DECISION_INSUFFICIENT
        self._decided_at_cluster: Optional[int] = None
        self._catastrophic = CATASTROPHIC_UNDECIDED
        self._catastrophic_at_cluster: Optional[int] = None
        self.trajectory: List[Dict[str, Any]] = []

    # ------------------------------------------------------------------ updates
    def update_clusters(self, cluster_means: np.ndarray, cluster_sizes: Optional[np.ndarray] = None) -> None:
        """Feed the next clusters' mean paired differences (each in [-1, 1]), in order."""
        x = np.asarray(cluster_means, dtype=np.float64).ravel()
        if x.size == 0:
            return
        if not np.all(np.isfinite(x)) or np.any(np.abs(x) > 1.0):
            raise ValueError("cluster means of paired differences must be finite and in [-1, 1]")
        sizes = np.ones_like(x) if cluster_sizes is None else np.asarray(cluster_sizes, dtype=np.float64).ravel()
        if sizes.shape != x.shape or np.any(sizes < 1):
            raise ValueError("cluster_sizes must match cluster_means and be >= 1")
        weights = None
        if self.estimand == "unit":
            if np.any(sizes > self.max_cluster_size):
                raise ValueError(f"a cluster is larger than max_cluster_size={self.max_cluster_size}")
            weights = sizes / self.max_cluster_size
        firsts = self._advance(x, weights, sizes)
        seen = self._clusters
        if self._decision == DECISION_INSUFFICIENT:
            self._decision, self._decided_at_cluster = _first_decision(
                seen, (DECISION_REGRESSION, firsts["regression"]), (DECISION_PASS, firsts["pass"]))
        if self.catastrophic_delta is not None and self._catastrophic == CATASTROPHIC_UNDECIDED:
            self._catastrophic, self._catastrophic_at_cluster = _first_decision(
                seen, (CATASTROPHIC, firsts["catastrophic"]), (NOT_CATASTROPHIC, firsts["not_catastrophic"]),
                undecided=CATASTROPHIC_UNDECIDED)
        self._clusters += x.size
        self._units += int(sizes.sum())
        self._unit_weighted_sum += float(np.dot(x, sizes))
        self._cluster_mean_sum += float(x.sum())

    def _advance(self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray) -> Dict[str, int]:
        """Consume a batch; return, per question, the batch index of its first rejection (-1)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ reading
    def evaluate(self) -> str:
        return self._decision

    def catastrophic_status(self) -> str:
        return self._catastrophic

    @property
    def clusters_seen(self) -> int:
        return self._clusters

    @property
    def units_seen(self) -> int:
        return self._units

    def delta_estimate(self) -> Optional[float]:
        """The point estimate of the estimand the tests are about."""
        if self._clusters == 0:
            return None
        return self.unit_weighted_estimate() if self.estimand == "unit" else self._cluster_mean_sum / self._clusters

    def unit_weighted_estimate(self) -> Optional[float]:
        return None if self._units == 0 else self._unit_weighted_sum / self._units

    def confidence_sequence(self) -> Tuple[float, float]:
        raise NotImplementedError

    def e_values(self) -> Dict[str, Optional[float]]:
        raise NotImplementedError

    def record_trajectory_point(self, **extra: Any) -> Dict[str, Any]:
        lower, upper = self.confidence_sequence()
        point = {
            "clusters": self.clusters_seen,
            "units": self.units_seen,
            "delta_estimate": self.delta_estimate(),
            "cs_lower": lower,
            "cs_upper": upper,
            "decision": self._decision,
            "catastrophic": self._catastrophic,
            **self.e_values(),
            **extra,
        }
        self.trajectory.append(point)
        return point

    def snapshot(self) -> Dict[str, Any]:
        lower, upper = self.confidence_sequence()
        snap = {
            "decision": self._decision,
            "decided_at_cluster": self._decided_at_cluster,
            "test_mode": self.mode,
            "alpha": self.alpha,
            "alarm_alpha": self.alarm_alpha,
            "margin_delta": self.delta,
            "estimand": self.estimand,
            **self._settings(),
            "clusters": self.clusters_seen,
            "units": self.units_seen,
            "delta_estimate": self.delta_estimate(),
            "unit_weighted_delta_estimate": self.unit_weighted_estimate(),
            "confidence_sequence": {"lower": lower, "upper": upper, "level": 1.0 - self.alpha, "kind": self.cs_kind},
            **self.e_values(),
        }
        if self.catastrophic_delta is not None:
            snap["catastrophic_delta"] = self.catastrophic_delta
            snap["catastrophic_alpha"] = self.catastrophic_alpha
            snap["catastrophic"] = self._catastrophic
            snap["catastrophic_at_cluster"] = self._catastrophic_at_cluster
        return snap

    def _settings(self) -> Dict[str, Any]:
        return {}


def _first_decision(seen: int, *candidates: Tuple[str, int], undecided: str = DECISION_INSUFFICIENT
                    ) -> Tuple[str, Optional[int]]:
    """The earliest rejection in this batch (the alarm, listed first, wins a tie)."""
    crossed = [(index, order, name) for order, (name, index) in enumerate(candidates) if index >= 0]
    if not crossed:
        return undecided, None
    index, _, name = min(crossed)
    return name, seen + int(index) + 1


class PairedSequentialTest(_SequentialTest):
    """Exact anytime-valid test: betting e-processes on (weighted) cluster means."""

    mode = MODE_EXACT
    cs_kind = "betting CS, running intersection (anytime-valid, exact)"

    def __init__(self, delta: float, alpha: float, *, bet_rule: str = DEFAULT_BET_RULE,
                 bet_cap: Optional[float] = DEFAULT_BET_CAP, **common: Any) -> None:
        """bet_cap: the cap fraction c in (0, 1], or None for the size-adaptive cap
        1 - 0.2 / cluster size (see eprocess.size_adaptive_cap)."""
        super().__init__(delta, alpha, **common)
        if bet_rule not in BET_RULES:
            raise ValueError(f"unknown bet rule {bet_rule!r}; use one of {BET_RULES}")
        if bet_cap is not None and not 0.0 < bet_cap <= 1.0:
            raise ValueError(f"bet_cap must be in (0, 1] or None (size-adaptive), got {bet_cap}")
        self.bet_rule = bet_rule
        self.bet_cap = None if bet_cap is None else float(bet_cap)

        # One family per side over [decision margins..., confidence-sequence grid...]:
        # index 0 is the margin -delta, index 1 the catastrophic margin (when configured).
        decision_margins = [-self.delta]
        upper_levels, lower_levels = [self.alpha], [self.alarm_alpha]
        if self.catastrophic_delta is not None:
            decision_margins.append(-self.catastrophic_delta)
            upper_levels.append(self.catastrophic_alpha)
            lower_levels.append(self.catastrophic_alpha)
        self._n_decision = len(decision_margins)
        steps = int(round(2.0 / self.cs_grid_step))
        self._cs_grid = np.round(np.linspace(-1.0, 1.0, steps + 1)[1:-1], 12)
        margins = np.concatenate((decision_margins, self._cs_grid))
        self._upper = WealthFamily.start(margins, UPPER)  # PASS side; the grid's rejects Delta <= m
        self._lower = WealthFamily.start(margins, LOWER)  # REGRESSION side; the grid's rejects Delta >= m
        cs_levels = np.full(self._cs_grid.size, self.alpha / 2.0)
        self._upper_thresholds = np.log(1.0 / np.concatenate((upper_levels, cs_levels)))
        self._lower_thresholds = np.log(1.0 / np.concatenate((lower_levels, cs_levels)))
        self._active = np.ones(margins.shape, dtype=bool)  # decision margins stay active always
        self._moments = MomentState()

    def _settings(self) -> Dict[str, Any]:
        return {"bet_rule": self.bet_rule,
                "bet_cap": "size-adaptive 1 - 0.2/n" if self.bet_cap is None else self.bet_cap}

    def _advance(self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray) -> Dict[str, int]:
        caps = size_adaptive_cap(sizes) if self.bet_cap is None else np.full(x.shape, self.bet_cap)
        upper_first = np.full(self._active.shape, -1, dtype=np.int64)
        lower_first = upper_first.copy()
        # Growing sub-chunks with pruning in between: a rejected grid margin stays rejected, so
        # this gives exactly the unchunked result while most of the grid (far from the data) is
        # dropped after the first few clusters.
        state, start, chunk = self._moments, 0, CS_FIRST_CHUNK
        while start < x.size:
            if np.count_nonzero(self._active) <= CS_SMALL_GRID:
                chunk = x.size  # little left to prune: one pass costs less than many small ones
            part = x[start:start + chunk]
            w = None if weights is None else weights[start:start + chunk]
            moments = predictable_moments(part, state, w)
            kwargs = dict(rule=self.bet_rule, cap_fraction=caps[start:start + chunk], alpha=self.alpha,
                          weights=w, active=self._active)
            up = self._upper.update(part, moments, threshold_log=self._upper_thresholds, **kwargs)
            low = self._lower.update(part, moments, threshold_log=self._lower_thresholds, **kwargs)
            for first, new in ((upper_first, up), (lower_first, low)):
                hit = (first < 0) & (new >= 0)
                first[hit] = new[hit] + start
            grid = slice(self._n_decision, None)
            self._active[grid] &= (upper_first[grid] < 0) & (lower_first[grid] < 0)
            state, start, chunk = state.advanced(part, w), start + part.size, chunk * 2
        self._moments = state
        firsts = {"regression": int(lower_first[0]), "pass": int(upper_first[0])}
        if self.catastrophic_delta is not None:
            firsts.update(catastrophic=int(lower_first[1]), not_catastrophic=int(upper_first[1]))
        return firsts

    def confidence_sequence(self) -> Tuple[float, float]:
        """Anytime-valid (1 - alpha) bounds for Delta: grid margins not yet rejected lie inside;
        the bounds are the nearest rejected grid points (conservative by one grid step)."""
        alive = np.flatnonzero(self._active[self._n_decision:])
        if alive.size == 0:  # cannot happen with valid data; keep the estimate as a degenerate CS
            est = self.delta_estimate() or 0.0
            return est, est
        lo_i, hi_i = alive[0] - 1, alive[-1] + 1
        lower = -1.0 if lo_i < 0 else float(self._cs_grid[lo_i])
        upper = 1.0 if hi_i >= self._cs_grid.size else float(self._cs_grid[hi_i])
        return lower, upper

    def e_values(self) -> Dict[str, Optional[float]]:
        def e(log_wealth: float) -> float:
            return float(np.exp(min(log_wealth, 700.0)))  # ~1e304: beyond that, only "huge" matters

        out = {
            "e_value_regression": e(self._lower.log_wealth[0]),
            "e_value_pass": e(self._upper.log_wealth[0]),
            "max_e_value_regression": e(self._lower.log_max_wealth[0]),
            "max_e_value_pass": e(self._upper.log_max_wealth[0]),
        }
        if self.catastrophic_delta is not None:
            out["e_value_catastrophic"] = e(self._lower.log_wealth[1])
            out["e_value_not_catastrophic"] = e(self._upper.log_wealth[1])
        return out


def asymptotic_half_width(t: np.ndarray, sd: np.ndarray, alpha: float, tuning_clusters: float) -> np.ndarray:
    """Half-width of the two-sided level-alpha asymptotic CS (Waudby-Smith et al. 2024, Thm 2.2)
    after t clusters with plug-in standard deviation sd; rho makes it tightest at tuning_clusters."""
    rho_sq = (-2.0 * math.log(alpha) + math.log(-2.0 * math.log(alpha) + 1.0)) / tuning_clusters
    grow = t * rho_sq + 1.0
    return sd * np.sqrt(2.0 * grow / (t * t * rho_sq) * np.log(np.sqrt(grow) / alpha))


def asymptotic_running(x: np.ndarray, weights: Optional[np.ndarray] = None,
                       state: Optional[MomentState] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
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


class AsymptoticSequentialTest(_SequentialTest):
    """ASYMPTOTIC (opt-in): decisions from asymptotic confidence sequences after a burn-in.

    A one-sided decision at level a uses the two-sided boundary at level 2a (the Gaussian limit is
    symmetric); the reported CS is two-sided at alpha. Valid only asymptotically: a skewed
    distribution of cluster means can make it reject too often at realistic sample sizes."""

    mode = MODE_ASYMPTOTIC
    cs_kind = "ASYMPTOTIC CS (Waudby-Smith et al. 2024), running intersection; not exact"

    def __init__(self, delta: float, alpha: float, *, burn_in_clusters: int = 30,
                 tuning_clusters: int = 500, **common: Any) -> None:
        super().__init__(delta, alpha, **common)
        if burn_in_clusters < 2:
            raise ValueError(f"burn_in_clusters must be >= 2, got {burn_in_clusters}")
        if tuning_clusters < 1:
            raise ValueError(f"tuning_clusters must be >= 1, got {tuning_clusters}")
        self.burn_in_clusters = int(burn_in_clusters)
        self.tuning_clusters = int(tuning_clusters)
        self._moments = MomentState()
        self._lower_bound, self._upper_bound = -1.0, 1.0

    def _settings(self) -> Dict[str, Any]:
        return {"burn_in_clusters": self.burn_in_clusters, "tuning_clusters": self.tuning_clusters}

    def _advance(self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray) -> Dict[str, int]:
        t, mean, sd = asymptotic_running(x, weights, self._moments)
        self._moments = self._moments.advanced(x, weights)
        ready = t >= self.burn_in_clusters

        def bound(level: float) -> np.ndarray:
            return asymptotic_half_width(t, sd, level, self.tuning_clusters)

        def first(condition: np.ndarray) -> int:
            hit = np.flatnonzero(condition & ready)
            return int(hit[0]) if hit.size else -1

        half = bound(self.alpha)
        if ready.any():
            self._lower_bound = max(self._lower_bound, float(np.max((mean - half)[ready])))
            self._upper_bound = min(self._upper_bound, float(np.min((mean + half)[ready])))
        firsts = {"pass": first(mean - bound(2.0 * self.alpha) > -self.delta),
                  "regression": first(mean + bound(2.0 * self.alarm_alpha) < -self.delta)}
        if self.catastrophic_delta is not None:
            cat = bound(2.0 * self.catastrophic_alpha)
            firsts.update(catastrophic=first(mean + cat < -self.catastrophic_delta),
                          not_catastrophic=first(mean - cat > -self.catastrophic_delta))
        return firsts

    def confidence_sequence(self) -> Tuple[float, float]:
        if self._lower_bound > self._upper_bound:  # the running intersection emptied: degenerate
            est = self.delta_estimate() or 0.0
            return est, est
        return self._lower_bound, self._upper_bound

    def e_values(self) -> Dict[str, Optional[float]]:
        return {"e_value_regression": None, "e_value_pass": None,
                "max_e_value_regression": None, "max_e_value_pass": None}


def make_sequential_test(mode: str, delta: float, alpha: float, **kwargs: Any) -> _SequentialTest:
    """The test for `mode` ("exact" or "asymptotic"); mode-specific keywords are dropped for the
    other mode (bet_rule/bet_cap are exact-only, burn_in_clusters/tuning_clusters asymptotic-only)."""
    exact_only, asymptotic_only = ("bet_rule", "bet_cap"), ("burn_in_clusters", "tuning_clusters")
    if mode == MODE_EXACT:
        return PairedSequentialTest(delta, alpha, **{k: v for k, v in kwargs.items() if k not in asymptotic_only})
    if mode == MODE_ASYMPTOTIC:
        return AsymptoticSequentialTest(delta, alpha, **{k: v for k, v in kwargs.items() if k not in exact_only})
    raise ValueError(f"unknown test mode {mode!r}; use one of {MODES}")
