"""Simulation tools for the sequential tests (pure array functions, seeded generators).

Outcome models, vectorised over replications:
* realistic_cluster_means: the gauntlet's synthetic generator (vlaeval.gauntlet.outcomes) --
  one shared uniform per scenario decides both policies (paired), a N(0, 0.02) scene offset per
  cluster moves the success rate, 4% of the candidate's scenarios draw a fresh uniform;
* skewed_null_cluster_means: an adversarial null, most clusters a little below the margin and a
  rare cluster at +1, mean exactly the margin (where plug-in-variance tests fail);
* unequal_cluster_means: clusters of unequal sizes whose paired differences depend on the size.

Stopping times, vectorised over replications: first crossings of the exact e-processes and of
the asymptotic confidence sequence, and the information quantities the benchmark compares them
with (KL_inf, the cap-limited closed form, a fixed-n z-test's sample size).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.stats import norm

from vlaeval.seqtest.eprocess import LOWER, UPPER, log_wealth_paths
from vlaeval.seqtest.sequential import asymptotic_half_width, asymptotic_running

NEVER = np.iinfo(np.int64).max  # the stopping time of a path that never decides


# ----------------------------------------------------------------------------- outcome models
def realistic_cluster_means(rng: np.random.Generator, reps: int, clusters: int, cluster_size: int,
                            effect: float, base_rate: float = 0.90, scene_sd: float = 0.02,
                            fresh_fraction: float = 0.04) -> np.ndarray:
    """(reps, clusters) cluster means of paired differences from the gauntlet's generator."""
    shape = (reps, clusters, cluster_size)
    u = rng.random(shape)
    scene = rng.normal(0.0, scene_sd, size=(reps, clusters, 1))
    p_base = np.clip(base_rate + scene, 0.02, 0.995)
    p_cand = np.clip(p_base + effect, 0.02, 0.995)
    fresh = rng.random(shape) < fresh_fraction
    candidate_u = np.where(fresh, rng.random(shape), u)
    differences = (candidate_u < p_cand).astype(np.int8) - (u < p_base).astype(np.int8)
    return differences.mean(axis=2)


def skewed_null_cluster_means(rng: np.random.Generator, reps: int, clusters: int, mean: float,
                              low: float = -0.03, high: float = 1.0) -> np.ndarray:
    """Clusters at `low` except a rare one at `high`, with P(high) set so the mean is exactly
    `mean` (low < mean < high)."""
    if not low < mean < high:
        raise ValueError("need low < mean < high")
    p_high = (mean - low) / (high - low)
    return np.where(rng.random((reps, clusters)) < p_high, high, low)


def unequal_cluster_means(rng: np.random.Generator, reps: int, clusters: int, sizes: np.ndarray,
                          p_plus: np.ndarray, p_minus: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Clusters of random sizes drawn from `sizes`; a unit's difference is +1 with p_plus[k] and
    -1 with p_minus[k] for a cluster of size sizes[k]. Returns (cluster means, cluster sizes)."""
    kind = rng.integers(0, len(sizes), size=(reps, clusters))
    n = np.asarray(sizes)[kind]
    plus = rng.binomial(n, np.asarray(p_plus)[kind])
    minus = rng.binomial(n - plus, np.asarray(p_minus)[kind] / (1.0 - np.asarray(p_plus)[kind]))
    return (plus - minus) / n, n


def unit_weighted_mean(sizes: np.ndarray, p_plus: np.ndarray, p_minus: np.ndarray) -> float:
    """The scenario-weighted Delta of unequal_cluster_means (sizes equally likely)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    return float(np.dot(sizes, np.asarray(p_plus) - np.asarray(p_minus)) / sizes.sum())


# ----------------------------------------------------------------------------- stopping times
def first_crossing(log_values: np.ndarray, threshold: float) -> np.ndarray:
    """Per row, the 1-based index of the first value >= threshold (NEVER where none)."""
    crossed = log_values >= threshold
    return np.where(crossed.any(axis=-1), crossed.argmax(axis=-1) + 1, NEVER)


def exact_decision_times(x: np.ndarray, delta: float, alpha: float, *, rule: str, cap: float,
                         alarm_alpha: Optional[float] = None, weights: Optional[np.ndarray] = None
                         ) -> Dict[str, np.ndarray]:
    """Clusters until PASS and until REGRESSION for each replication (rows of x), as the exact
    test would declare them if the other decision did not stop it first."""
    alarm_alpha = alpha if alarm_alpha is None else alarm_alpha
    common = dict(rule=rule, cap_fraction=cap, alpha=alpha, weights=weights)
    return {
        "pass": first_crossing(log_wealth_paths(x, -delta, UPPER, **common), math.log(1.0 / alpha)),
        "regression": first_crossing(log_wealth_paths(x, -delta, LOWER, **common), math.log(1.0 / alarm_alpha)),
    }


def asymptotic_decision_times(x: np.ndarray, delta: float, alpha: float, *, burn_in_clusters: int,
                              tuning_clusters: int, weights: Optional[np.ndarray] = None
                              ) -> Dict[str, np.ndarray]:
    """The same for the asymptotic mode (the computation AsymptoticSequentialTest runs)."""
    t, mean, sd = asymptotic_running(np.asarray(x, dtype=np.float64), weights)
    half = asymptotic_half_width(t, sd, 2.0 * alpha, tuning_clusters)
    ready = t >= burn_in_clusters
    return {
        "pass": first_crossing(np.where(ready & (mean - half > -delta), 1.0, 0.0), 0.5),
        "regression": first_crossing(np.where(ready & (mean + half < -delta), 1.0, 0.0), 0.5),
    }


def decision_time(times: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """(clusters to the first decision, whether it was PASS) per replication."""
    first = np.minimum(times["pass"], times["regression"])
    return first, times["pass"] < times["regression"]


# ----------------------------------------------------------------------------- information
def kl_inf(sample: np.ndarray, margin: float, side: str) -> float:
    """KL_inf of the sample's distribution to the bounded null on the far side of `margin`:
    max over bets in [0, 1/(1 +/- m)] of E log(1 + bet * payoff) (Honda & Takemura's duality),
    the best growth rate any e-process can reach, so log(1/alpha) / KL_inf is the floor."""
    payoff = (sample - margin) if side == UPPER else (margin - sample)
    top = 1.0 / (1.0 + margin) if side == UPPER else 1.0 / (1.0 - margin)

    def loss(bet: float) -> float:
        with np.errstate(divide="ignore"):
            return -float(np.mean(np.log(np.maximum(1.0 + bet * payoff, 0.0))))

    best = minimize_scalar(loss, bounds=(0.0, top), method="bounded", options={"xatol": 1e-9})
    return max(-float(best.fun), 0.0)


def information_floor(sample: np.ndarray, delta: float, alpha: float) -> float:
    """log(1/alpha) / KL_inf for the decision the sample's mean calls for."""
    side = UPPER if sample.mean() > -delta else LOWER
    information = kl_inf(sample, -delta, side)
    return math.inf if information <= 0 else math.log(1.0 / alpha) / information


def cap_limited_clusters(effect: float, delta: float, alpha: float, cap: float) -> float:
    """The closed form for clusters so homogeneous that the cap binds: the bet is c / (1 +/- m)
    and each cluster adds about that times |Delta + delta| to the log-wealth."""
    gap = abs(effect + delta)
    side_scale = (1.0 - delta) if effect > -delta else (1.0 + delta)
    return math.inf if gap == 0 else side_scale * math.log(1.0 / alpha) / (cap * gap)


def fixed_n_clusters(sample: np.ndarray, delta: float, alpha: float, power: float = 0.8) -> float:
    """Clusters a one-sided fixed-n z-test at level alpha needs for `power` at the sample's mean."""
    gap = abs(float(sample.mean()) + delta)
    z = norm.ppf(1.0 - alpha) + norm.ppf(power)
    return math.inf if gap == 0 else float((z * sample.std() / gap) ** 2)
