"""Group-sequential z-tests with O'Brien-Fleming-type alpha spending over planned looks (opt-in).

A gauntlet knows each stratum's batch plan before it starts, which is exactly what a group-
sequential design needs: at look k (after n_k of the planned n_K clusters, information fraction
tau_k = n_k / n_K) the z-statistic of the cluster means is compared with a boundary b_k chosen so
that, under the null and the normal approximation, the chance of crossing at look k (and not
before) is the increment of the Lan-DeMets O'Brien-Fleming spending function

    alpha(tau) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(tau))      (one-sided level alpha; alpha(1) = alpha)

Each one-sided question (PASS at alpha, REGRESSION at the alarm level, the catastrophic halt at
its level) spends its own alpha; they are non-binding for one another. Boundaries come from the
recursive numerical integration of Armitage, McPherson & Rowe (1969) on a uniform grid of the
score S_k = Z_k sqrt(tau_k), a Brownian motion in information time.

What it assumes (why it is labelled, like the asymptotic mode, and never a LAUNCH without review):
cluster means are i.i.d. in random order, the z-statistic with a plug-in standard deviation is
normal at every planned look, and looks happen only where planned (a look elsewhere is refused).
A look with fewer than `burn_in_clusters` clusters decides nothing (its alpha is forfeited), and
the standard error is stabilised with two pseudo-clusters (`standard_error`).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from scipy.special import ndtr
from scipy.stats import norm

from vlaeval.seqtest.eprocess import MomentState
from vlaeval.seqtest.sequential import MODE_GROUP_SEQUENTIAL, SequentialTest, asymptotic_running, running_extreme
from vlaeval.seqtest.state import GroupSequentialReport, GroupSequentialSettings, TestSettings

GRID_STEP = 0.002  # spacing of the score grid (the score's sd is at most 1)
GRID_SPAN = 9.0  # the grid covers [-9, 9] sd of the score: mass outside is < 1e-18


def obf_spending(fractions: np.ndarray, alpha: float) -> np.ndarray:
    """Cumulative alpha spent by information fraction tau (Lan & DeMets 1983, O'Brien-Fleming type)."""
    tau = np.clip(np.asarray(fractions, dtype=np.float64), 1e-12, 1.0)
    return 2.0 - 2.0 * norm.cdf(norm.ppf(1.0 - alpha / 2.0) / np.sqrt(tau))


def one_sided_boundaries(fractions: Sequence[float], alpha: float) -> np.ndarray:
    """z-boundaries b_1..b_K of a one-sided level-alpha group-sequential test with O'Brien-Fleming-type
    spending at information fractions 0 < tau_1 < ... < tau_K = 1 (np.inf where a look spends nothing).

    P_H0(Z_1 < b_1, ..., Z_{k-1} < b_{k-1}, Z_k >= b_k) = alpha(tau_k) - alpha(tau_{k-1}) exactly up to
    the grid's discretisation (checked against published boundaries in the tests)."""
    tau = np.asarray(fractions, dtype=np.float64)
    if tau.ndim != 1 or tau.size == 0 or np.any(np.diff(tau) <= 0) or tau[0] <= 0 or abs(tau[-1] - 1.0) > 1e-12:
        raise ValueError("information fractions must increase strictly from > 0 to 1")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    # Imported here: scipy.signal and scipy.optimize take ~1 s to import, and every job that imports
    # the gauntlet (job=plan, a CLI start) paid it while only group-sequential boundaries use them.
    from scipy.optimize import brentq
    from scipy.signal import fftconvolve

    spent = np.diff(np.concatenate(([0.0], obf_spending(tau, alpha))))
    centres = np.arange(-GRID_SPAN, GRID_SPAN + GRID_STEP / 2, GRID_STEP)
    h = GRID_STEP
    bounds = np.empty(tau.size)
    mass: Optional[np.ndarray] = None  # probability mass of S_{k-1} on the grid, paths still running
    previous = 0.0

    def crossing(c: float, sd: float, mass: Optional[np.ndarray]) -> float:
        """P(S_k >= c, no earlier crossing): from the start, or from the masses still running."""
        return float(norm.sf(c / sd)) if mass is None else float(np.dot(mass, ndtr((centres - c) / sd)))

    for k, (t, pi) in enumerate(zip(tau, spent)):
        sd = float(np.sqrt(t - previous))
        if pi <= 1e-15:
            c = np.inf
        else:
            c = brentq(
                lambda v, sd=sd, mass=mass, pi=pi: crossing(v, sd, mass) - pi, -GRID_SPAN * 2, GRID_SPAN * 2, xtol=1e-10
            )
        bounds[k] = c / np.sqrt(t)
        # Masses of S_k on the grid, cells at or above the boundary removed (those paths stopped).
        if mass is None:
            new = ndtr((centres + h / 2) / sd) - ndtr((centres - h / 2) / sd)
        else:
            reach = int(np.ceil(9.0 * sd / h)) + 1
            offsets = np.arange(-reach, reach + 1) * h
            kernel = ndtr((offsets + h / 2) / sd) - ndtr((offsets - h / 2) / sd)
            new = np.maximum(fftconvolve(mass, kernel, mode="same"), 0.0)
        if np.isfinite(c):
            upper_edges = centres + h / 2
            keep = np.clip((c - (centres - h / 2)) / h, 0.0, 1.0)  # the share of each cell below c
            new = new * np.where(upper_edges <= c, 1.0, keep)
        mass, previous = new, t
    return bounds


def standard_error(sd: np.ndarray, n: np.ndarray, mean_cluster_size: np.ndarray | float) -> np.ndarray:
    """Standard error of the mean of n cluster means with plug-in sd, stabilised the way Agresti &
    Caffo stabilise a difference of proportions: two pseudo-clusters one scenario either side of
    the mean (+-1 / mean cluster size). Without it a look at which every cluster so far agreed has
    zero variance and certifies on the sign alone -- on nearly concordant data (most robot scenes)
    that was a 35% false PASS at an early look."""
    n = np.asarray(n, dtype=np.float64)
    squares = (
        np.asarray(sd, dtype=np.float64) ** 2 * np.maximum(n - 1.0, 0.0) + 2.0 / np.asarray(mean_cluster_size) ** 2
    )
    return np.sqrt(squares / (n + 1.0) / n)


def crossing_look(z: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    """Per row of z (replications x looks), the 1-based index of the first look where z reaches its
    boundary (0 where none)."""
    crossed = z >= boundaries
    return np.where(crossed.any(axis=-1), crossed.argmax(axis=-1) + 1, 0)


class GroupSequentialTest(SequentialTest):
    """GROUP-SEQUENTIAL (opt-in): z-tests on cluster means at the planned looks, O'Brien-Fleming-
    type spending per one-sided question; repeated confidence intervals as the CS. Not exact."""

    mode = MODE_GROUP_SEQUENTIAL
    cs_kind = (
        "GROUP-SEQUENTIAL repeated confidence intervals (O'Brien-Fleming-type spending over the "
        "planned looks, normal approximation); not exact"
    )

    def __init__(self, settings: TestSettings, mode: GroupSequentialSettings) -> None:
        """mode.planned_looks: the cluster counts after each planned batch (strictly increasing);
        looks with fewer than mode.burn_in_clusters clusters decide nothing."""
        super().__init__(settings)
        planned_looks, burn_in_clusters = mode.planned_looks, mode.burn_in_clusters
        if burn_in_clusters < 2:
            raise ValueError(f"burn_in_clusters must be >= 2, got {burn_in_clusters}")
        self.burn_in_clusters = int(burn_in_clusters)
        looks = np.asarray(list(planned_looks), dtype=np.int64)
        if looks.size == 0 or looks[0] < 1 or np.any(np.diff(looks) <= 0):
            raise ValueError("planned_looks must be strictly increasing positive cluster counts")
        self.planned_looks = looks
        fractions = looks / looks[-1]
        self._boundaries = {
            "pass": one_sided_boundaries(fractions, self.alpha),
            "regression": one_sided_boundaries(fractions, self.alarm_alpha),
            "cs": one_sided_boundaries(fractions, self.alpha / 2.0),
        }
        if self.catastrophic_delta is not None:
            self._boundaries["catastrophic"] = one_sided_boundaries(fractions, self.catastrophic_alpha)
        self._moments_state: Optional[MomentState] = None
        self._bounds = {"cs_lower": -1.0, "cs_upper": 1.0, "catastrophic_upper": 1.0}

    def _report(self) -> GroupSequentialReport:
        return GroupSequentialReport(
            planned_looks=tuple(int(k) for k in self.planned_looks),
            burn_in_clusters=self.burn_in_clusters,
            spending="O'Brien-Fleming type (Lan-DeMets)",
            boundaries={
                k: tuple(None if not np.isfinite(b) else float(b) for b in v) for k, v in self._boundaries.items()
            },
        )

    def _advance(
        self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray
    ) -> Tuple[Dict[str, int], Dict[str, np.ndarray]]:
        look = len(self._looks)
        after = self._clusters + x.size
        if look >= self.planned_looks.size or after != self.planned_looks[look]:
            planned = "none left" if look >= self.planned_looks.size else f"{int(self.planned_looks[look])} clusters"
            raise ValueError(
                f"look {look + 1} of the group-sequential design is planned at {planned}, "
                f"but this update brings the count to {after}; looks must follow the plan"
            )
        state = self._moments_state or MomentState()
        t, mean, sd = asymptotic_running(x, weights, state)
        self._moments_state = state.advanced(x, weights)
        mean_size = (self._units + float(sizes.sum())) / after
        estimate, se = float(mean[-1]), float(standard_error(sd[-1:], t[-1:], mean_size)[0])
        ready = after >= self.burn_in_clusters
        b = {k: float(v[look]) if ready else np.inf for k, v in self._boundaries.items()}
        firsts = {"pass": -1, "regression": -1, "catastrophic": -1, "not_catastrophic": -1}
        last = x.size - 1
        if (estimate + self.delta) / se >= b["pass"]:
            firsts["pass"] = last
        if (-self.delta - estimate) / se >= b["regression"]:
            firsts["regression"] = last
        lower = max(self._bounds["cs_lower"], estimate - b["cs"] * se)
        upper = min(self._bounds["cs_upper"], estimate + b["cs"] * se)
        if lower > upper:
            lower = upper = estimate
        series = {
            "cs_lower": np.full(x.size, self._bounds["cs_lower"]),
            "cs_upper": np.full(x.size, self._bounds["cs_upper"]),
        }
        series["cs_lower"][last], series["cs_upper"][last] = lower, upper
        self._bounds.update(cs_lower=lower, cs_upper=upper)
        if self.catastrophic_delta is not None:
            cat_upper = estimate + b["catastrophic"] * se
            carried = running_extreme(np.full(x.size, 1.0), self._bounds["catastrophic_upper"], upper=True)
            carried[last] = min(self._bounds["catastrophic_upper"], cat_upper)
            series["catastrophic_upper"] = carried
            self._bounds["catastrophic_upper"] = float(carried[last])
            if carried[last] < -self.catastrophic_delta:
                firsts["catastrophic"] = last
            if estimate - b["catastrophic"] * se > -self.catastrophic_delta:
                firsts["not_catastrophic"] = last
        return firsts, series
