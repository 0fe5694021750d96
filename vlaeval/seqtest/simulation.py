"""Simulation tools for the sequential tests (pure array functions, seeded generators).

Outcome models, vectorised over replications:
* realistic_cluster_means: the gauntlet's synthetic generator (vlaeval.gauntlet.outcomes) --
  one shared uniform per scenario decides both policies (paired), a N(0, 0.02) scene offset per
  cluster moves the success rate, 4% of the candidate's scenarios draw a fresh uniform;
* skewed_null_cluster_means: an adversarial null, most clusters a little below the margin and a
  rare cluster at +1, mean exactly the margin (where plug-in-variance tests fail);
* unequal_cluster_means: clusters of unequal sizes whose paired differences depend on the size;
* rare_giant_cluster_means: the unit estimand's attack -- rare clusters ~40x the typical size carry
  the scenario-weighted mean, so a file that lacks them looks like another stratum;
* broken_scene_cluster_means: 2% (or any share of) scenes where the candidate fails every scenario
  the baseline solves, the rest equal (where plug-in variances collapse when no broken scene shows).

Stopping times, vectorised over replications: first crossings of the exact e-processes and of
the asymptotic confidence sequence, and the information quantities the benchmark compares them
with (KL_inf, the cap-limited closed form, a fixed-n z-test's sample size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
from scipy.stats import norm

from vlaeval.seqtest.eprocess import LOWER, UPPER, log_wealth_paths, mixture_plug_in_weight, size_adaptive_cap
from vlaeval.seqtest.group_sequential import crossing_look, one_sided_boundaries, standard_error
from vlaeval.seqtest.sequential import asymptotic_half_width, asymptotic_running

NEVER = np.iinfo(np.int64).max  # the stopping time of a path that never decides

# The gauntlet's synthetic paired generator (vlaeval.gauntlet.outcomes uses the same constants):
# a N(0, SCENE_SD) offset per cluster moves both policies' success rates, FRESH_FRACTION of the
# candidate's scenarios draw a fresh uniform, and rates are clipped to RATE_RANGE.
SCENE_SD = 0.02
FRESH_FRACTION = 0.04
RATE_RANGE = (0.02, 0.995)


# ----------------------------------------------------------------------------- outcome models
def realistic_cluster_means(
    rng: np.random.Generator,
    reps: int,
    clusters: int,
    cluster_size: int | np.ndarray,
    effect: float,
    base_rate: float = 0.90,
    scene_sd: float = SCENE_SD,
    fresh_fraction: float = FRESH_FRACTION,
) -> np.ndarray:
    """(reps, clusters) cluster means of paired differences from the gauntlet's generator.
    cluster_size: one size for every cluster, or an integer array of shape (reps, clusters)."""
    sizes = np.asarray(cluster_size)
    width = int(sizes.max()) if sizes.ndim else int(sizes)
    shape = (reps, clusters, width)
    u = rng.random(shape)
    scene = rng.normal(0.0, scene_sd, size=(reps, clusters, 1))
    p_base = np.clip(base_rate + scene, *RATE_RANGE)
    p_cand = np.clip(p_base + effect, *RATE_RANGE)
    fresh = rng.random(shape) < fresh_fraction
    candidate_u = np.where(fresh, rng.random(shape), u)
    differences = (candidate_u < p_cand).astype(np.int8) - (u < p_base).astype(np.int8)
    if not sizes.ndim:
        return differences.mean(axis=2)
    inside = np.arange(width) < sizes[..., None]  # units beyond a cluster's size are padding
    return np.where(inside, differences, 0).sum(axis=2) / sizes


def skewed_null_cluster_means(
    rng: np.random.Generator, reps: int, clusters: int, mean: float, low: float = -0.03, high: float = 1.0
) -> np.ndarray:
    """Clusters at `low` except a rare one at `high`, with P(high) set so the mean is exactly
    `mean` (low < mean < high)."""
    if not low < mean < high:
        raise ValueError("need low < mean < high")
    p_high = (mean - low) / (high - low)
    return np.where(rng.random((reps, clusters)) < p_high, high, low)


def unequal_cluster_means(
    rng: np.random.Generator, reps: int, clusters: int, sizes: np.ndarray, p_plus: np.ndarray, p_minus: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """Clusters of random sizes drawn from `sizes`; a unit's difference is +1 with p_plus[k] and
    -1 with p_minus[k] for a cluster of size sizes[k]. Returns (cluster means, cluster sizes)."""
    kind = rng.integers(0, len(sizes), size=(reps, clusters))
    n = np.asarray(sizes)[kind]
    plus = rng.binomial(n, np.asarray(p_plus)[kind])
    minus = rng.binomial(n - plus, np.asarray(p_minus)[kind] / (1.0 - np.asarray(p_plus)[kind]))
    return (plus - minus) / n, n


def rare_giant_cluster_means(
    rng: np.random.Generator,
    reps: int,
    clusters: int,
    side: str,
    *,
    delta: float = 0.02,
    small: int = 5,
    giant: int = 200,
    giant_share: float = 0.0015,
) -> Tuple[np.ndarray, np.ndarray]:
    """Clusters of `small` units, and with probability `giant_share` of `giant` units, with the
    scenario-weighted mean exactly -delta. side="regression": the giants are 30 points better and
    the small clusters worse than the margin (a test that forgets the giants certifies REGRESSION);
    side="pass": the giants are 50 points worse and the small clusters better (it certifies PASS).
    Returns (cluster means, cluster sizes), each (reps, clusters)."""
    if side not in ("regression", "pass"):
        raise ValueError(f"side must be 'regression' or 'pass', got {side!r}")
    q, mean_size = giant_share, (1.0 - giant_share) * small + giant_share * giant
    giant_plus, giant_minus = (0.35, 0.05) if side == "regression" else (0.05, 0.55)
    small_mean = (-delta * mean_size - q * giant * (giant_plus - giant_minus)) / ((1.0 - q) * small)
    small_plus, small_minus = (0.021, 0.021 - small_mean) if side == "regression" else (0.04 + small_mean, 0.04)
    is_giant = rng.random((reps, clusters)) < q
    n = np.where(is_giant, giant, small)
    p_plus = np.where(is_giant, giant_plus, small_plus)
    p_minus = np.where(is_giant, giant_minus, small_minus)
    plus = rng.binomial(n, p_plus)
    minus = rng.binomial(n - plus, p_minus / (1.0 - p_plus))
    return (plus - minus) / n, n


def broken_scene_cluster_means(
    rng: np.random.Generator, reps: int, scenes: int, size: int, broken_share: float, base_rate: float = 0.9
) -> np.ndarray:
    """(reps, scenes) cluster means: a share of broken scenes (the candidate fails every scenario,
    the baseline solves every one: -1), the rest from the gauntlet's generator with no effect (mean 0):
    Delta is exactly -broken_share. With 2% broken scenes and 48 scenes, 38% of strata hold none."""
    x = realistic_cluster_means(rng, reps, scenes, size, 0.0, base_rate=base_rate)
    return np.where(rng.random((reps, scenes)) < broken_share, -1.0, x)


@dataclass(frozen=True)
class SizeDependentDesign:
    """An unequal-size null built to break a size-dependent bet cap: the cap binds (clusters are
    nearly concordant, so plug-in bets reach it) and the cluster mean depends on the cluster size,
    with Delta exactly at the margin -delta for the design's estimand. `mirror` negates the data and
    the margin (delta < 0: a superiority margin), which turns a REGRESSION-side attack into a
    PASS-side one and back (a size-1 cluster cannot sit just below a negative margin)."""

    name: str
    estimand: str  # "cluster" or "unit"
    side: str  # the decision the design attacks: "regression" or "pass"
    sizes: Tuple[int, int]  # small, large
    small_share: float  # probability that a cluster is small
    small_failure: float  # P(a small cluster's mean is -1), else 0
    large_mean: float  # the large clusters' (fixed) mean
    delta: float = 0.02
    mirror: bool = False

    def draw(self, rng: np.random.Generator, reps: int, clusters: int) -> Tuple[np.ndarray, np.ndarray]:
        """(cluster means, cluster sizes), each (reps, clusters)."""
        small = rng.random((reps, clusters)) < self.small_share
        failures = rng.random((reps, clusters)) < self.small_failure
        x = np.where(small, -failures.astype(np.float64), self.large_mean)
        n = np.where(small, self.sizes[0], self.sizes[1])
        return (-x if self.mirror else x), n

    def margin_delta(self) -> float:
        return -self.delta if self.mirror else self.delta

    def weights(self, n: np.ndarray) -> Optional[np.ndarray]:
        return n / self.sizes[1] if self.estimand == "unit" else None

    def null_mean(self) -> float:
        """Delta of the design for its estimand (checked equal to -margin_delta by the tests)."""
        q, (small, large) = self.small_share, self.sizes
        small_mean = -self.small_failure
        if self.estimand == "unit":
            value = (q * small * small_mean + (1 - q) * large * self.large_mean) / (q * small + (1 - q) * large)
        else:
            value = q * small_mean + (1 - q) * self.large_mean
        return -value if self.mirror else value


def size_dependent_designs() -> Tuple[SizeDependentDesign, ...]:
    """The four estimand x side attacks on a size-dependent cap (each mean exactly at the margin)."""
    regression = SizeDependentDesign(
        "cluster/REGRESSION: 60% single concordant scenarios, 40% scenes of 20 with one candidate-only failure",
        "cluster",
        "regression",
        (1, 20),
        0.6,
        0.0,
        -0.05,
    )
    # Unit estimand: (q * 1 * (-p) + (1 - q) * 40 * 0) / (q + 40 (1 - q)) = -0.02 with q = 1/2.
    unit_pass = SizeDependentDesign(
        "unit/PASS: half single scenarios failing 82% of the time, half concordant scenes of 40",
        "unit",
        "pass",
        (1, 40),
        0.5,
        0.82,
        0.0,
    )
    return (
        regression,
        SizeDependentDesign(
            regression.name.replace("REGRESSION", "PASS") + " (mirrored: superiority margin)",
            "cluster",
            "pass",
            (1, 20),
            0.6,
            0.0,
            -0.05,
            mirror=True,
        ),
        unit_pass,
        SizeDependentDesign(
            unit_pass.name.replace("PASS", "REGRESSION") + " (mirrored: superiority margin)",
            "unit",
            "regression",
            (1, 40),
            0.5,
            0.82,
            0.0,
            mirror=True,
        ),
    )


def unit_weighted_mean(sizes: np.ndarray, p_plus: np.ndarray, p_minus: np.ndarray) -> float:
    """The scenario-weighted Delta of unequal_cluster_means (sizes equally likely)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    return float(np.dot(sizes, np.asarray(p_plus) - np.asarray(p_minus)) / sizes.sum())


# ----------------------------------------------------------------------------- stopping times
def first_crossing(log_values: np.ndarray, threshold: float) -> np.ndarray:
    """Per row, the 1-based index of the first value >= threshold (NEVER where none)."""
    crossed = log_values >= threshold
    return np.where(crossed.any(axis=-1), crossed.argmax(axis=-1) + 1, NEVER)


def exact_decision_times(
    x: np.ndarray,
    delta: float,
    alpha: float,
    *,
    rule: str,
    cap: Union[float, np.ndarray],
    alarm_alpha: Optional[float] = None,
    weights: Optional[np.ndarray] = None,
    min_cluster_size: Optional[int] = None,
) -> Dict[str, np.ndarray]:
    """Clusters until PASS and until REGRESSION for each replication (rows of x), as the exact
    test would declare them if the other decision did not stop it first. `cap` is the stratum's one
    cap, or (to measure what a per-cluster cap would have done) an array of x's shape;
    `min_cluster_size`: the smallest cluster known before the stratum (the mixture's weights)."""
    alarm_alpha = alpha if alarm_alpha is None else alarm_alpha
    common: Dict[str, Any] = dict(
        rule=rule,
        cap_fraction=cap,
        alpha=alpha,
        weights=weights,
        plug_in_weight=mixture_plug_in_weight(min_cluster_size),
    )
    return {
        "pass": first_crossing(log_wealth_paths(x, -delta, UPPER, **common), math.log(1.0 / alpha)),
        "regression": first_crossing(log_wealth_paths(x, -delta, LOWER, **common), math.log(1.0 / alarm_alpha)),
    }


def asymptotic_decision_times(
    x: np.ndarray,
    delta: float,
    alpha: float,
    *,
    burn_in_clusters: int,
    tuning_clusters: int,
    weights: Optional[np.ndarray] = None,
) -> Dict[str, np.ndarray]:
    """The same for the asymptotic mode (the computation AsymptoticSequentialTest runs)."""
    t, mean, sd = asymptotic_running(np.asarray(x, dtype=np.float64), weights)
    half = asymptotic_half_width(t, sd, 2.0 * alpha, tuning_clusters)
    ready = t >= burn_in_clusters
    return {
        "pass": first_crossing(np.where(ready & (mean - half > -delta), 1.0, 0.0), 0.5),
        "regression": first_crossing(np.where(ready & (mean + half < -delta), 1.0, 0.0), 0.5),
    }


def group_sequential_decision_times(
    x: np.ndarray,
    delta: float,
    alpha: float,
    *,
    looks: np.ndarray,
    cluster_sizes: np.ndarray | float,
    alarm_alpha: Optional[float] = None,
    weights: Optional[np.ndarray] = None,
    burn_in_clusters: int = 30,
) -> Dict[str, np.ndarray]:
    """The same for the group-sequential mode, looking only at the planned cluster counts `looks`
    (the computation GroupSequentialTest runs); cluster_sizes: one size, or an array like x."""
    looks = np.asarray(looks, dtype=np.int64)
    alarm_alpha = alpha if alarm_alpha is None else alarm_alpha
    t, mean, sd = asymptotic_running(np.asarray(x, dtype=np.float64), weights)
    sizes = np.broadcast_to(np.asarray(cluster_sizes, dtype=np.float64), np.shape(x))
    mean_size = np.cumsum(sizes, axis=-1) / t
    at = looks - 1
    se = standard_error(sd[..., at], t[..., at], mean_size[..., at])
    fractions = looks / looks[-1]
    ready = looks >= burn_in_clusters
    out = {}
    for kind, z, level in (
        ("pass", (mean[..., at] + delta) / se, alpha),
        ("regression", (-delta - mean[..., at]) / se, alarm_alpha),
    ):
        look = crossing_look(z, np.where(ready, one_sided_boundaries(fractions, level), np.inf))
        out[kind] = np.where(look > 0, looks[np.maximum(look - 1, 0)], NEVER)
    return out


def every_mode_decision_times(
    x: np.ndarray,
    delta: float,
    alpha: float,
    *,
    cluster_size: int,
    looks: np.ndarray,
    alarm_alpha: Optional[float] = None,
    burn_in_clusters: int = 30,
    rule: str = "blend",
) -> Dict[str, Dict[str, np.ndarray]]:
    """The decision times of each test mode on the same clusters of equal size: exact (the
    size-adaptive cap), asymptotic (tuned to the clusters available) and group-sequential at `looks`."""
    return {
        "exact": exact_decision_times(
            x, delta, alpha, rule=rule, cap=float(size_adaptive_cap(cluster_size)), alarm_alpha=alarm_alpha
        ),
        "asymptotic": asymptotic_decision_times(
            x, delta, alpha, burn_in_clusters=burn_in_clusters, tuning_clusters=x.shape[-1]
        ),
        "group_sequential": group_sequential_decision_times(
            x,
            delta,
            alpha,
            looks=looks,
            cluster_sizes=cluster_size,
            alarm_alpha=alarm_alpha,
            burn_in_clusters=burn_in_clusters,
        ),
    }


def fixed_n_decision_times(
    x: np.ndarray,
    delta: float,
    alpha: float,
    *,
    clusters: int,
    cluster_sizes: np.ndarray | float,
    alarm_alpha: Optional[float] = None,
    weights: Optional[np.ndarray] = None,
) -> Dict[str, np.ndarray]:
    """The reference: one look, a one-sided z-test (same stabilised standard error) on the first
    `clusters` cluster means."""
    return group_sequential_decision_times(
        x,
        delta,
        alpha,
        looks=np.array([clusters]),
        cluster_sizes=cluster_sizes,
        alarm_alpha=alarm_alpha,
        weights=weights,
        burn_in_clusters=2,
    )


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

    from scipy.optimize import minimize_scalar  # imported here: ~0.5 s, and only this fit uses it

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
    """Clusters a one-sided fixed-n z-test at level alpha needs for `power` at the sample's mean: a
    whole number, and at least 2 (a test that estimates its variance needs two clusters)."""
    gap = abs(float(sample.mean()) + delta)
    z = norm.ppf(1.0 - alpha) + norm.ppf(power)
    return math.inf if gap == 0 else float(max(2, math.ceil((z * sample.std() / gap) ** 2)))
