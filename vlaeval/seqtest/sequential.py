"""Paired, clustered non-inferiority testing with anytime-valid e-processes.

Observations are cluster means of paired differences (candidate - baseline, in [-1, 1]); a
cluster is the unit of independence, so within-scene correlation cannot make stopping
anti-conservative. At the margin -delta two one-sided betting e-processes run side by side:

* REGRESSION rejects H0: Delta >= -delta (the candidate is certified worse than the margin);
* PASS rejects H0: Delta <= -delta (the candidate is certified non-inferior).

A decision is declared the first time an e-value reaches 1/alpha and is sticky. The same
machinery on a grid of margins, each side at alpha/2, gives an anytime-valid (1 - alpha)
confidence sequence for Delta (running intersection: a rejected margin stays rejected). The
catastrophic question is a second pair of e-processes at -catastrophic_delta: "catastrophic" is
the statement that the one-sided (1 - alpha) upper confidence bound lies below it, never a point
estimate compared with a threshold.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import numpy as np

from vlaeval.seqtest.eprocess import BET_RULES, LOWER, UPPER, MomentState, WealthFamily, predictable_moments

DECISION_REGRESSION = "REGRESSION"
DECISION_PASS = "PASS"
DECISION_INSUFFICIENT = "INSUFFICIENT"

CATASTROPHIC = "CATASTROPHIC"
NOT_CATASTROPHIC = "NOT_CATASTROPHIC"
CATASTROPHIC_UNDECIDED = "UNDECIDED"

CS_FIRST_CHUNK = 8  # clusters in the first confidence-sequence sub-chunk of a batch (then doubling)
CS_SMALL_GRID = 256  # margins still alive below which a batch is processed in one chunk


class PairedSequentialTest:
    """Anytime-valid paired non-inferiority test on cluster means; decisions are sticky."""

    def __init__(
        self,
        delta: float,
        alpha: float,
        *,
        catastrophic_delta: Optional[float] = None,
        bet_rule: str = "agrapa",
        bet_cap: float = 0.95,
        cs_grid_step: float = 0.001,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if not 0.0 <= delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {delta}")
        if bet_rule not in BET_RULES:
            raise ValueError(f"unknown bet rule {bet_rule!r}; use one of {BET_RULES}")
        if not 0.0 < bet_cap <= 1.0:
            raise ValueError(f"bet_cap must be in (0, 1], got {bet_cap}")
        if catastrophic_delta is not None and not delta <= catastrophic_delta < 1.0:
            raise ValueError("catastrophic_delta must be in [delta, 1)")
        if not 0.0 < cs_grid_step <= 0.1:
            raise ValueError(f"cs_grid_step must be in (0, 0.1], got {cs_grid_step}")
        self.delta = float(delta)
        self.alpha = float(alpha)
        self.catastrophic_delta = None if catastrophic_delta is None else float(catastrophic_delta)
        self.bet_rule = bet_rule
        self.bet_cap = float(bet_cap)

        # One family per side over [decision margins..., confidence-sequence grid...]:
        # index 0 is the margin -delta, index 1 the catastrophic margin (when configured).
        decision_margins = [-self.delta]
        if self.catastrophic_delta is not None:
            decision_margins.append(-self.catastrophic_delta)
        self._n_decision = len(decision_margins)
        steps = int(round(2.0 / cs_grid_step))
        self._cs_grid = np.round(np.linspace(-1.0, 1.0, steps + 1)[1:-1], 12)
        margins = np.concatenate((decision_margins, self._cs_grid))
        self._upper = WealthFamily.start(margins, UPPER)  # PASS side; the grid's rejects Delta <= m
        self._lower = WealthFamily.start(margins, LOWER)  # REGRESSION side; the grid's rejects Delta >= m
        # Decisions at alpha; each side of the (1 - alpha) confidence sequence at alpha / 2.
        self._thresholds = np.concatenate((np.full(self._n_decision, math.log(1.0 / alpha)),
                                           np.full(self._cs_grid.size, math.log(2.0 / alpha))))
        self._active = np.ones(margins.shape, dtype=bool)  # decision margins stay active always

        self._moments = MomentState()
        self._units = 0
        self._unit_weighted_sum = 0.0
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
        seen = int(self._moments.count)
        kwargs = dict(rule=self.bet_rule, cap_fraction=self.bet_cap, alpha=self.alpha, threshold_log=self._thresholds)
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
            moments = predictable_moments(part, state)
            up = self._upper.update(part, moments, active=self._active, **kwargs)
            low = self._lower.update(part, moments, active=self._active, **kwargs)
            for first, new in ((upper_first, up), (lower_first, low)):
                hit = (first < 0) & (new >= 0)
                first[hit] = new[hit] + start + seen
            self._active[self._n_decision:] &= (upper_first[self._n_decision:] < 0) & (lower_first[self._n_decision:] < 0)
            state, start, chunk = state.advanced(part), start + part.size, chunk * 2

        if self._decision == DECISION_INSUFFICIENT:
            # Sticky: the first e-process to reach 1/alpha decides (regression wins a tie).
            crossed = {k: v for k, v in ((DECISION_REGRESSION, lower_first[0]), (DECISION_PASS, upper_first[0])) if v >= 0}
            if crossed:
                self._decision = min(crossed, key=lambda k: (crossed[k], k != DECISION_REGRESSION))
                self._decided_at_cluster = int(crossed[self._decision]) + 1
        if self.catastrophic_delta is not None and self._catastrophic == CATASTROPHIC_UNDECIDED:
            crossed = {k: v for k, v in ((CATASTROPHIC, lower_first[1]), (NOT_CATASTROPHIC, upper_first[1])) if v >= 0}
            if crossed:
                self._catastrophic = min(crossed, key=lambda k: (crossed[k], k != CATASTROPHIC))
                self._catastrophic_at_cluster = int(crossed[self._catastrophic]) + 1

        self._moments = self._moments.advanced(x)
        self._units += int(sizes.sum())
        self._unit_weighted_sum += float(np.dot(x, sizes))

    # ------------------------------------------------------------------ reading
    def evaluate(self) -> str:
        return self._decision

    def catastrophic_status(self) -> str:
        return self._catastrophic

    @property
    def clusters_seen(self) -> int:
        return int(self._moments.count)

    @property
    def units_seen(self) -> int:
        return self._units

    def delta_estimate(self) -> Optional[float]:
        """Mean of the cluster means: the estimand the e-processes test."""
        n = self._moments.count
        return None if n == 0 else self._moments.total / n

    def unit_weighted_estimate(self) -> Optional[float]:
        return None if self._units == 0 else self._unit_weighted_sum / self._units

    def confidence_sequence(self) -> tuple[float, float]:
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

    def e_values(self) -> Dict[str, float]:
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

    def record_trajectory_point(self, **extra: Any) -> Dict[str, Any]:
        lower, upper = self.confidence_sequence()
        point = {
            "clusters": self.clusters_seen,
            "units": self.units_seen,
            "delta_estimate": self.delta_estimate(),
            "cs_lower": lower,
            "cs_upper": upper,
            "decision": self._decision,
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
            "alpha": self.alpha,
            "margin_delta": self.delta,
            "bet_rule": self.bet_rule,
            "bet_cap": self.bet_cap,
            "clusters": self.clusters_seen,
            "units": self.units_seen,
            "delta_estimate": self.delta_estimate(),
            "unit_weighted_delta_estimate": self.unit_weighted_estimate(),
            "confidence_sequence": {"lower": lower, "upper": upper, "level": 1.0 - self.alpha,
                                    "kind": "betting CS, running intersection (anytime-valid)"},
            **self.e_values(),
        }
        if self.catastrophic_delta is not None:
            snap["catastrophic_delta"] = self.catastrophic_delta
            snap["catastrophic"] = self._catastrophic
            snap["catastrophic_at_cluster"] = self._catastrophic_at_cluster
        return snap
