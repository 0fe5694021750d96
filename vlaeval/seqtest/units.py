"""Clusters as the unit of independence: cluster means of paired differences, batch plans whose
boundaries never split a cluster, and cluster-robust success-rate intervals."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import t as student_t

METHOD = (
    "cluster-robust Wilson, Student t with C - 1 df, each bound also with one pseudo-scene at the far outcome weighted "
    "by the share of scenes that never showed it (a broken scene the sample did not draw); where fewer than 10 scenes "
    "(and not all) hold the rarer outcome, a scene-level Clopper-Pearson interval (the C scenes as the sample)"
)
# Below this many scenes holding a failure (or a success), the cluster-robust variance rests on a few
# terms and is too often small: 48 scenes of 8 with 2% broken scenes and 0.5% stray failures covered
# the true rate 0.70 of the time. The interval is then widened to a scene-level Clopper-Pearson one.
FEW_SCENES = 10


def cluster_offsets(cluster_sizes: np.ndarray) -> np.ndarray:
    """Start offsets of contiguous clusters plus the end: shape (C + 1,)."""
    return np.concatenate(([0], np.cumsum(np.asarray(cluster_sizes, dtype=np.int64))))


def cluster_means(differences: np.ndarray, cluster_sizes: np.ndarray) -> np.ndarray:
    """Mean of each contiguous cluster of unit-level differences (sizes must sum to the length)."""
    sizes = np.asarray(cluster_sizes, dtype=np.int64)
    if sizes.sum() != differences.size:
        raise ValueError("cluster sizes must add up to the number of units")
    if sizes.size == 0:
        return np.zeros(0)
    sums = np.add.reduceat(np.asarray(differences, dtype=np.float64), cluster_offsets(sizes)[:-1])
    return sums / sizes


def plan_batches(cluster_sizes: np.ndarray, batch_units: int, limit_units: int) -> list[tuple[int, int]]:
    """Batches as (first cluster, end cluster) index pairs over whole clusters.

    Each batch takes whole clusters until it holds at least `batch_units` units; the plan stops
    before the first cluster that would take the total past `limit_units` (a partial cluster is
    never evaluated).
    """
    if batch_units < 1:
        raise ValueError("batch_units must be >= 1")
    offsets = cluster_offsets(cluster_sizes)
    last = int(np.searchsorted(offsets, limit_units, side="right")) - 1  # clusters fitting the limit
    batches: list[tuple[int, int]] = []
    start = 0
    while start < last:
        target = offsets[start] + batch_units
        end = min(int(np.searchsorted(offsets, target, side="left")), last)
        batches.append((start, end))
        start = end
    return batches


@dataclass(frozen=True)
class SuccessRateInterval:
    """A policy's success rate over some clusters' units, with its cluster-robust interval (all None
    over no units): the units and clusters it rests on and the design effect used."""

    rate: Optional[float]
    lower: Optional[float]
    upper: Optional[float]
    level: float
    units: int
    clusters: int
    design_effect: Optional[float]
    method: str = METHOD

    def covers(self, rate: float) -> bool:
        """Whether the interval holds `rate` (never, over no units)."""
        return self.lower is not None and self.upper is not None and self.lower <= rate <= self.upper

    @property
    def width(self) -> float:
        """upper - lower (nan over no units)."""
        return float("nan") if self.lower is None or self.upper is None else self.upper - self.lower

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SuccessRateInterval":
        """A saved interval; a field an older result lacks reads as None (0 for the counts)."""
        return cls(
            rate=data.get("rate"),
            lower=data.get("lower"),
            upper=data.get("upper"),
            level=float(data.get("level", 0.95)),
            units=int(data.get("units", 0)),
            clusters=int(data.get("clusters", 0)),
            design_effect=data.get("design_effect"),
            method=str(data.get("method", METHOD)),
        )


@dataclass(frozen=True)
class Drift:
    """The estimand over the first and the second half of the evaluated clusters, their difference
    and its z-score (None with fewer than 4 clusters, or when both halves are constant)."""

    clusters: int
    first_half: Optional[float]
    second_half: Optional[float]
    difference: Optional[float]
    z: Optional[float]

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Drift":
        return cls(
            int(data.get("clusters", 0)),
            data.get("first_half"),
            data.get("second_half"),
            data.get("difference"),
            data.get("z"),
        )


def success_rate_interval(
    successes: np.ndarray,
    sizes: np.ndarray,
    level: float = 0.95,
    few_scenes: int = FEW_SCENES,
    unseen_scene: bool = True,
) -> SuccessRateInterval:
    """A policy's success rate over the units of some clusters, with a cluster-robust Wilson interval.

    successes, sizes: per cluster, shape (C,). The rate is p = sum(s) / sum(n). Scenarios of one
    cluster share a scene, so their outcomes are correlated: the variance of p is the cluster-robust
    (ratio-estimator) one, V = C/(C-1) * sum_c (s_c - p n_c)^2 / (sum n)^2, and the Wilson interval
    is taken at the effective sample size n / deff with design effect deff = V / (p(1-p)/n), never
    below 1 (so never narrower than the unit-level Wilson interval; Korn & Graubard 1998). The
    variance is estimated from C clusters, so the critical value is Student's t with C - 1 degrees
    of freedom, not the normal's. When fewer than FEW_SCENES scenes hold a failure (or a success) the
    design effect cannot be estimated from them: the scenes are then taken to be all-or-nothing and
    the interval is a scene-level Clopper-Pearson one (scene_level_interval) -- with deff 1 at 0% or
    100%, 48 scenes of 8 without a failure read [0.990, 1.000] and covered a 0.98 rate with 2% broken
    scenes only 57% of the time; with the estimated design effect near the ceiling, 0.70.

    Past that floor a scene kind the sample never drew still escapes the variance: 48 scenes of 20
    with 2% broken scenes and 1% stray failures hold no broken scene 38% of the time, and then read
    about 0.99 +- 0.007 around a true 0.970 (coverage 0.84; 0.44-0.70 on other rare-broken designs).
    Each bound is therefore also computed with one pseudo-scene at the far outcome (all failed for the
    lower bound, all succeeded for the upper, of the mean size) weighted by the share of scenes of
    two or more scenarios that never showed that outcome's rarer side -- where most scenes are clean,
    an unseen broken one is what the sample cannot rule out; where most scenes mix outcomes (the
    synthetic world's 50 x 20 at 0.9: 12% clean), the pseudo-scene weighs little; a scene of one
    scenario is one draw, with nothing unseen within it -- and the interval is the wider of the two
    (coverage >= 0.946 on a 45-design grid of rare broken scenes and stray failures, where the
    cluster-robust interval alone held 0.44-0.96; benchmarks/certified_decisions.py, section 5).
    `few_scenes`: that threshold (0: never widened to it); `unseen_scene=False`: no pseudo-scene (the
    interval before, for the benchmark's and tests' comparisons)."""
    s = np.asarray(successes, dtype=np.float64)
    n_c = np.asarray(sizes, dtype=np.float64)
    n, clusters = float(n_c.sum()), int(n_c.size)
    if n == 0:
        return SuccessRateInterval(None, None, None, level, 0, 0, None)
    p = float(s.sum() / n)
    rarer = int(min(np.count_nonzero(s < n_c), np.count_nonzero(s > 0)))  # scenes holding the rarer outcome
    if rarer < min(few_scenes, clusters):  # some scenes never show it, and few do
        return scene_level_interval(p, n, clusters, level)
    if clusters == 1 or p in (0.0, 1.0):
        # one scene, or all-or-nothing scenes: nothing in the data says the C scenes are more than C draws
        lower, upper, deff = *_wilson(p, float(clusters), level, clusters), n / clusters
    else:
        lower, upper, deff = _cluster_robust(s, n_c, level)
    if unseen_scene and clusters > 1 and 0.0 < p < 1.0:
        # A scene of one scenario is a single draw (nothing within it to be unseen): only scenes that
        # could mix outcomes count towards the pseudo-scene's weight.
        mean_size, mixable = float(n_c.mean()), n_c >= 2
        clean, spoilt = float(np.mean(mixable & (s >= n_c))), float(np.mean(mixable & (s <= 0)))
        unseen_broken = _cluster_robust(s, n_c, level, pseudo=(0.0, mean_size, clean))
        unseen_perfect = _cluster_robust(s, n_c, level, pseudo=(mean_size, mean_size, spoilt))
        lower, upper = min(lower, unseen_broken[0]), max(upper, unseen_perfect[1])
    return SuccessRateInterval(
        rate=p,
        lower=max(lower, 0.0),
        upper=min(upper, 1.0),
        level=level,
        units=int(n),
        clusters=clusters,
        design_effect=deff,
    )


@functools.lru_cache(maxsize=4096)
def _critical_value(level: float, clusters: int) -> float:
    """Student's t quantile with clusters - 1 df (scipy's ppf costs ~0.1 ms; a gauntlet asks it often)."""
    return float(student_t.ppf(0.5 + level / 2.0, df=max(clusters - 1, 1)))


def _wilson(p: float, n_eff: float, level: float, clusters: int) -> Tuple[float, float]:
    """Wilson's interval at effective sample size n_eff, Student's t with clusters - 1 df."""
    z = _critical_value(level, clusters)
    denominator = 1.0 + z * z / n_eff
    centre = (p + z * z / (2.0 * n_eff)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n_eff + z * z / (4.0 * n_eff * n_eff)) / denominator
    return centre - half, centre + half


def _cluster_robust(
    s: np.ndarray, n_c: np.ndarray, level: float, pseudo: Tuple[float, float, float] = (0.0, 0.0, 0.0)
) -> Tuple[float, float, float]:
    """(lower, upper, design effect) of the cluster-robust Wilson interval over C >= 2 clusters, with
    an optional pseudo-scene (successes, size, weight) counted at that weight (the t's df stay C - 1)."""
    extra_s, extra_n, weight = pseudo
    total_n = float(n_c.sum()) + weight * extra_n
    p = (float(s.sum()) + weight * extra_s) / total_n
    if p <= 0.0 or p >= 1.0:
        return 0.0, 1.0, 1.0
    effective = s.size + weight
    spread = float(np.sum((s - p * n_c) ** 2)) + weight * (extra_s - p * extra_n) ** 2
    variance = effective / (effective - 1.0) * spread / total_n**2
    deff = max(variance / (p * (1.0 - p) / total_n), 1.0)
    return *_wilson(p, total_n / deff, level, s.size), deff


def scene_level_interval(p: float, n: float, clusters: int, level: float) -> SuccessRateInterval:
    """Clopper-Pearson at the all-or-nothing floor: the C scenes are the sample (design effect n / C)
    and p C of them succeed (fractional counts through the beta quantiles). Nothing in a few scenes
    holding a failure says the failures are spread thinner than whole scenes, so none is assumed."""
    k, tail = p * clusters, (1.0 - level) / 2.0
    lower = 0.0 if k <= 0 else float(beta_dist.ppf(tail, k, clusters - k + 1))
    upper = 1.0 if k >= clusters else float(beta_dist.ppf(1.0 - tail, k + 1, clusters - k))
    return SuccessRateInterval(p, lower, upper, level, int(n), clusters, n / clusters)


def drift_diagnostic(means: np.ndarray, sizes: np.ndarray, estimand: str = "cluster") -> Drift:
    """The stationarity check beside a decision: the estimand over the first and the second half of
    the clusters in evaluation order, their difference and its z-score (two independent halves,
    cluster-robust standard errors). The test's guarantee is about a fixed scenario distribution
    sampled in random order; rollouts are evaluated in time order, so a policy, simulator or
    environment that drifts during the run may show up here -- what a rollout decision certifies is
    Delta over the evaluated window. It sees only that window and rarely fires (a steady linear drift
    that makes most runs certify REGRESSION is flagged in a minority of them): a diagnostic, not a
    test; |z| > 3 deserves a look.

    means, sizes: per evaluated cluster, in evaluation order, shape (C,)."""
    x = np.asarray(means, dtype=np.float64)
    n = np.asarray(sizes, dtype=np.float64)
    if x.size < 4:
        return Drift(int(x.size), None, None, None, None)
    half = x.size // 2

    def estimate(xs: np.ndarray, ns: np.ndarray) -> tuple[float, float]:
        w = ns if estimand == "unit" else np.ones_like(ns)
        mean = float(np.dot(w, xs) / w.sum())
        k = xs.size
        se = math.sqrt(k / (k - 1) * float(np.sum((w * (xs - mean)) ** 2))) / float(w.sum())
        return mean, se

    (first, se1), (second, se2) = estimate(x[:half], n[:half]), estimate(x[half:], n[half:])
    se = math.hypot(se1, se2)
    difference = second - first
    # z is None when both halves are constant (nothing to compare).
    return Drift(int(x.size), first, second, difference, difference / se if se > 0 else None)


def fit_dirichlet_multinomial(counts: np.ndarray) -> np.ndarray:
    """Dirichlet parameters for clusters' category counts (C, K) by the method of moments: the pooled
    category shares, and the intra-cluster correlation rho from the counts' spread beyond the multinomial
    (Var n_ck = n_c pi_k (1 - pi_k) (1 + (n_c - 1) rho)); alpha = pi (1 - rho) / rho. rho is kept in
    [1e-6, 0.999]: near 0 the model is the multinomial of independent episodes."""
    n = counts.sum(axis=1)
    pi = counts.sum(axis=0) / n.sum()
    spread = float(np.sum((counts - n[:, None] * pi) ** 2))
    binomial = float(np.sum(pi * (1.0 - pi)))
    pairs = float(np.sum(n * (n - 1.0)))
    rho = (spread / binomial - n.sum()) / pairs if binomial > 0 and pairs > 0 else 0.0
    rho = min(max(rho, 1e-6), 0.999)
    return pi * (1.0 - rho) / rho


def dirichlet_multinomial_logpmf(counts: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """log P(counts) per row of (C, K) under a Dirichlet-multinomial with parameters alpha (K,);
    a category with alpha 0 never occurs (its counts are 0) and drops out."""
    from scipy.special import gammaln

    used = alpha > 0
    x, a = counts[:, used], alpha[used]
    n, total = x.sum(axis=1), a.sum()
    return (
        gammaln(n + 1.0)
        - gammaln(x + 1.0).sum(axis=1)
        + gammaln(total)
        - gammaln(n + total)
        + (gammaln(x + a) - gammaln(a)).sum(axis=1)
    )
