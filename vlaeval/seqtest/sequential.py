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

from vlaeval.seqtest.eprocess import BET_RULES, LOWER, UPPER, MomentState, WealthFamily

DECISION_REGRESSION = "REGRESSION"
DECISION_PASS = "PASS"
DECISION_INSUFFICIENT = "INSUFFICIENT"

CATASTROPHIC = "CATASTROPHIC"
NOT_CATASTROPHIC = "NOT_CATASTROPHIC"
CATASTROPHIC_UNDECIDED = "UNDECIDED"


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
        self._threshold_log = math.log(1.0 / alpha)
        self._cs_threshold_log = math.log(2.0 / alpha)

        decision_margins = [-self.delta]
        if self.catastrophic_delta is not None:
            decision_margins.append(-self.catastrophic_delta)
        # index 0: the margin -delta; index 1: the catastrophic margin (when configured)
        self._pass = WealthFamily.start(np.array(decision_margins), UPPER)
        self._regression = WealthFamily.start(np.array(decision_margins), LOWER)
        steps = int(round(2.0 / cs_grid_step))
        self._cs_grid = np.round(np.linspace(-1.0, 1.0, steps + 1)[1:-1], 12)
        self._cs_lower = WealthFamily.start(self._cs_grid, UPPER)  # rejects Delta <= m
        self._cs_upper = WealthFamily.start(self._cs_grid, LOWER)  # rejects Delta >= m
        self._cs_alive = np.ones(self._cs_grid.shape, dtype=bool)

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
        kwargs = dict(rule=self.bet_rule, cap_fraction=self.bet_cap, alpha=self.alpha)

        pass_cross = self._pass.update(x, self._moments, threshold_log=self._threshold_log, **kwargs)
        regression_cross = self._regression.update(x, self._moments, threshold_log=self._threshold_log, **kwargs)
        if self._decision == DECISION_INSUFFICIENT:
            # Sticky: the first e-process to reach 1/alpha decides (both at once cannot happen
            # under either hypothesis with meaningful probability; regression wins the tie).
            first = {DECISION_REGRESSION: regression_cross[0], DECISION_PASS: pass_cross[0]}
            crossed = {k: v for k, v in first.items() if v >= 0}
            if crossed:
                self._decision = min(crossed, key=lambda k: (crossed[k], k != DECISION_REGRESSION))
                self._decided_at_cluster = seen + int(crossed[self._decision]) + 1
        if self.catastrophic_delta is not None and self._catastrophic == CATASTROPHIC_UNDECIDED:
            hits = {CATASTROPHIC: regression_cross[1], NOT_CATASTROPHIC: pass_cross[1]}
            crossed = {k: v for k, v in hits.items() if v >= 0}
            if crossed:
                self._catastrophic = min(crossed, key=lambda k: (crossed[k], k != CATASTROPHIC))
                self._catastrophic_at_cluster = seen + int(crossed[self._catastrophic]) + 1

        lower_cross = self._cs_lower.update(x, self._moments, threshold_log=self._cs_threshold_log,
                                            active=self._cs_alive, **kwargs)
        upper_cross = self._cs_upper.update(x, self._moments, threshold_log=self._cs_threshold_log,
                                            active=self._cs_alive, **kwargs)
        self._cs_alive &= (lower_cross < 0) & (upper_cross < 0)

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
        alive = np.flatnonzero(self._cs_alive)
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
            "e_value_regression": e(self._regression.log_wealth[0]),
            "e_value_pass": e(self._pass.log_wealth[0]),
            "max_e_value_regression": e(self._regression.log_max_wealth[0]),
            "max_e_value_pass": e(self._pass.log_max_wealth[0]),
        }
        if self.catastrophic_delta is not None:
            out["e_value_catastrophic"] = e(self._regression.log_wealth[1])
            out["e_value_not_catastrophic"] = e(self._pass.log_wealth[1])
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
