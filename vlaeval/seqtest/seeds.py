"""A recipe comparison's test over training seeds (pure): is the candidate recipe better, worse, or
no different beyond a margin, when the unit is one training run?

Seed pair s trains each recipe with train.seed=s and evaluates both checkpoints on the same episodes;
its difference d_s = candidate's success - baseline's is one draw from the recipes' seed-to-seed
distribution, so the variance of d holds the training seed's spread and the episodes' noise alike.
The claim is about mu = E[d]: the recipes' mean success on these episodes, averaged over training
seeds (a property of the recipes, not of any one checkpoint).

The test is a confidence sequence for mu that holds at every number of seeds at once: at each mu it
inverts the Gaussian-mixture t-test's Bayes factor -- the standardised effect (E[d] - mu) / sigma
drawn from N(0, g) and sigma from the scale-invariant prior 1 / sigma (Rouder et al. 2009's closed
form at a fixed g). Under i.i.d. normal d that Bayes factor at the true mu is a test martingale in
the filtration of scale-invariant statistics (Perez-Ortiz, Lardy, de Heide & Grunwald 2024), so
Ville's inequality bounds the chance it ever reaches 1 / alpha -- the chance the sequence ever
excludes the true mu -- by alpha, however the seeds are added and wherever they stop. The unknown
seed SD is inside the claim: nothing is plugged in. Each decision read from the sequence -- BETTER
(it lies above 0), WORSE (below 0), EQUIVALENT (inside (-margin, +margin)) -- is wrong only where it
misses mu, so all three together err with probability at most alpha.

Normality is the assumption: d is a mean over many episodes, but a recipe whose seeds sometimes
collapse makes it skewed; benchmarks/recipe_comparison.py and tests/test_seed_test.py measure the
error on such designs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from vlaeval.records import JsonRecord

BETTER = "BETTER"
WORSE = "WORSE"
EQUIVALENT = "EQUIVALENT"
UNDECIDED = "UNDECIDED"
MIN_SEEDS = 2  # one difference says nothing about the scale its mean is judged against
METHOD = (
    "confidence sequence for the mean seed-pair difference, inverting the Gaussian-mixture t-test's Bayes factor "
    "(standardised effect ~ N(0, g), scale prior 1/sigma) at every mean: valid at every number of seeds under "
    "i.i.d. normal differences"
)


@dataclass(frozen=True)
class SeedInterval:
    """The confidence sequence after n seed pairs: the mean difference, its bounds (infinite where
    n seeds cannot yet exclude anything) and the seed pairs' SD."""

    seeds: int
    mean: float
    sd: float
    low: float
    high: float

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


@dataclass(frozen=True)
class SeedTestState:
    """What the seed test says after its seed pairs: the decision, the seed pair it was reached at
    (None: undecided), and the sequence at every look."""

    decision: str
    decided_at: Optional[int]
    path: Tuple[SeedInterval, ...]
    alpha: float
    margin: float
    prior_scale: float

    @property
    def last(self) -> SeedInterval:
        return self.path[-1]


def critical_ratio(n: int, alpha: float, prior_scale: float) -> float:
    """The |t| (t = (mean - mu) / (sd / sqrt(n))) at which the Bayes factor against mu reaches
    1 / alpha after n seed pairs; infinite where it cannot (few seeds, or a strong prior on a small
    effect). From BF = (1 + n g)^(-1/2) ((1 + t^2/v) / (1 + t^2 / ((1 + n g) v)))^((v + 1) / 2),
    v = n - 1, which rises with t^2 towards (1 + n g)^(v / 2)."""
    if n < MIN_SEEDS:
        return math.inf
    v = n - 1
    spread = 1.0 + n * prior_scale
    # (1 + r) / (1 + r / spread) >= k, with r = t^2 / v
    log_k = (2.0 / (v + 1)) * (0.5 * math.log(spread) - math.log(alpha))
    k = math.exp(log_k)
    if k >= spread:
        return math.inf
    r = (k - 1.0) / (1.0 - k / spread)
    return math.sqrt(r * v)


def log_bayes_factor(differences: Sequence[float], mu: float, prior_scale: float) -> float:
    """log BF of 'mean != mu' against 'mean == mu' from the seed pairs' differences (0 below two
    pairs): the test the sequence inverts in closed form (critical_ratio), which its tests check
    against this definition."""
    d = np.asarray(differences, dtype=np.float64)
    n = d.size
    if n < MIN_SEEDS:
        return 0.0
    v = n - 1
    sd = float(d.std(ddof=1))
    gap = float(d.mean()) - mu
    if sd == 0.0:
        return math.inf if gap != 0.0 else 0.0
    t2 = gap * gap / (sd * sd / n)
    spread = 1.0 + n * prior_scale
    return -0.5 * math.log(spread) + 0.5 * (v + 1) * (math.log1p(t2 / v) - math.log1p(t2 / (spread * v)))


def seed_interval(
    differences: Sequence[float], alpha: float, prior_scale: float, resolution: float = 0.0
) -> SeedInterval:
    """The sequence's interval after these seed pairs: every mu whose Bayes factor stays below 1 / alpha.
    The SD is never taken below `resolution` (one episode's worth of success): differences on a grid
    of 1 / episodes tie, and a spread of exactly 0 -- impossible under the normal model -- would
    shrink the interval to a point."""
    d = np.asarray(differences, dtype=np.float64)
    n = int(d.size)
    mean = float(d.mean()) if n else 0.0
    sd = max(float(d.std(ddof=1)), resolution) if n >= 2 else math.nan
    ratio = critical_ratio(n, alpha, prior_scale)
    if not math.isfinite(ratio):
        return SeedInterval(n, mean, sd, -math.inf, math.inf)
    half = ratio * sd / math.sqrt(n)
    return SeedInterval(n, mean, sd, mean - half, mean + half)


def decide(interval: SeedInterval, margin: float) -> str:
    """BETTER / WORSE where the interval excludes 0, EQUIVALENT where it lies inside the margin."""
    if interval.low > 0.0:
        return BETTER
    if interval.high < 0.0:
        return WORSE
    if margin > 0.0 and -margin < interval.low and interval.high < margin:
        return EQUIVALENT
    return UNDECIDED


def seed_test(
    differences: Sequence[float],
    *,
    alpha: float,
    margin: float,
    prior_scale: float,
    min_seeds: int = MIN_SEEDS,
    resolution: float = 0.0,
) -> SeedTestState:
    """The test over seed pairs in the order they were added: it stops at the first look (from
    min_seeds pairs on) whose interval decides; later pairs, if any were run, are not read."""
    path: List[SeedInterval] = []
    for n in range(1, len(differences) + 1):
        interval = seed_interval(differences[:n], alpha, prior_scale, resolution)
        path.append(interval)
        decision = decide(interval, margin) if n >= min_seeds else UNDECIDED
        if decision != UNDECIDED:
            return SeedTestState(decision, n, tuple(path), alpha, margin, prior_scale)
    return SeedTestState(UNDECIDED, None, tuple(path), alpha, margin, prior_scale)


@dataclass(frozen=True)
class SeedsNeeded(JsonRecord):
    """The planner's row: a difference of this size at this seed-pair SD is certified (BETTER, or
    EQUIVALENT where the difference is 0) by `seeds` pairs with the stated probability, and takes
    `expected` pairs on average when the test may run to `max_seeds` (None: not within them)."""

    effect: float
    sd: float
    seeds: Optional[int]
    power_at_max: float
    expected: float


def plan_seeds(
    effects: Sequence[float],
    sd: float,
    *,
    alpha: float,
    margin: float,
    prior_scale: float,
    max_seeds: int,
    power: float = 0.8,
    simulations: int = 4000,
    seed: int = 0,
) -> Tuple[SeedsNeeded, ...]:
    """How many seed pairs a difference needs: normal seed-pair differences with this SD, the test
    run to max_seeds, the first n by which `power` of the runs have certified the right answer
    (BETTER for a positive effect, WORSE for a negative one, EQUIVALENT for 0)."""
    rng = np.random.default_rng(seed)
    rows = []
    for effect in effects:
        draws = rng.normal(effect, sd, size=(simulations, max_seeds))
        right = BETTER if effect > 0 else WORSE if effect < 0 else EQUIVALENT
        stopped = _stopping_seeds(draws, alpha=alpha, margin=margin, prior_scale=prior_scale, wanted=right)
        certified = np.isfinite(stopped)
        by_n = np.array([np.mean(stopped <= n) for n in range(1, max_seeds + 1)])
        enough = np.flatnonzero(by_n >= power)
        expected = float(np.mean(np.where(certified, stopped, max_seeds)))
        rows.append(
            SeedsNeeded(
                effect=float(effect),
                sd=float(sd),
                seeds=int(enough[0]) + 1 if enough.size else None,
                power_at_max=float(certified.mean()),
                expected=expected,
            )
        )
    return tuple(rows)


def _stopping_seeds(draws: np.ndarray, *, alpha: float, margin: float, prior_scale: float, wanted: str) -> np.ndarray:
    """Per simulated run (rows of draws), the seed pair at which the test first decides `wanted`
    (inf: it never does, or decides something else first)."""
    runs, max_seeds = draws.shape
    stopped = np.full(runs, np.inf)
    open_ = np.ones(runs, dtype=bool)
    sums = np.cumsum(draws, axis=1)
    squares = np.cumsum(draws * draws, axis=1)
    for n in range(MIN_SEEDS, max_seeds + 1):
        ratio = critical_ratio(n, alpha, prior_scale)
        if not math.isfinite(ratio):
            continue
        mean = sums[:, n - 1] / n
        var = np.maximum(squares[:, n - 1] - n * mean * mean, 0.0) / (n - 1)
        half = ratio * np.sqrt(var / n)
        low, high = mean - half, mean + half
        decision = np.where(
            low > 0, 1, np.where(high < 0, 2, np.where((margin > 0) & (low > -margin) & (high < margin), 3, 0))
        )
        code = {BETTER: 1, WORSE: 2, EQUIVALENT: 3}[wanted]
        newly = open_ & (decision != 0)
        stopped[newly & (decision == code)] = n
        open_ &= decision == 0
    return stopped


def seed_spread(success: Sequence[float]) -> np.ndarray:
    """The A/A's seed-spread matrix: entry (i, j) is seed i's success minus seed j's."""
    s = np.asarray(success, dtype=np.float64)
    return s[:, None] - s[None, :]


def per_task_sd(success_by_seed: Sequence[Dict[str, float]]) -> Dict[str, float]:
    """Each task's success SD across training seeds (ddof=1; nan below two seeds)."""
    tasks = list(success_by_seed[0]) if success_by_seed else []
    out: Dict[str, float] = {}
    for task in tasks:
        values = np.array([row[task] for row in success_by_seed], dtype=np.float64)
        out[task] = float(values.std(ddof=1)) if values.size >= 2 else math.nan
    return out


def paired_exact_p(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p of two checkpoints on the same episodes (the discordant episodes as
    fair coin flips): what an episode-level test says about two seeds of one recipe."""
    from scipy.stats import binomtest

    x = np.asarray(a, dtype=bool)
    y = np.asarray(b, dtype=bool)
    only_a = int(np.sum(x & ~y))
    only_b = int(np.sum(~x & y))
    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)
