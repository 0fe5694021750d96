"""The test over training seeds (vlaeval/seqtest/seeds.py) where it is most likely to break: seed-level
designs built like a recipe's real evaluations (fixed episodes of varying difficulty, a training seed
that shifts every episode and each task its own way, Bernoulli outcomes on 20 episodes per task), at
the measured seed SD and far above it, rare success (skewed differences), unequal spread on the two
sides, the null on both sides of zero and at both edges of the equivalence margin -- every one run
to 20 seed pairs, so the sequence is read at every look. The negative control, a t-interval re-read
after every seed, must fail on the same designs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import t as student_t
from test_seqtest import clopper_pearson_lower

from vlaeval.seqtest.seeds import (
    BETTER,
    EQUIVALENT,
    UNDECIDED,
    WORSE,
    critical_ratio,
    decide,
    log_bayes_factor,
    plan_seeds,
    seed_interval,
    seed_spread,
    seed_test,
)

ALPHA = 0.05
MARGIN = 0.05
SEEDS = 20
TASKS = 6
EPISODES = 20  # per task: the recipe comparison's presets
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(40)  # E[f(u)], u ~ N(0, 1): sum(w f(nodes)) / sqrt(2 pi)
WEIGHTS = WEIGHTS / math.sqrt(2 * math.pi)


def expected_success(logits: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """E over training seeds of each episode's success: sigmoid(logit + u), u ~ N(0, sd^2)."""
    return expit(logits[..., None] + sd[..., None] * NODES) @ WEIGHTS


def shift_for(target: float, base: np.ndarray, sd_b: np.ndarray, sd_c: np.ndarray) -> float:
    """The candidate's logit shift that makes the mean seed-pair difference on these episodes `target`."""
    low, high = -12.0, 12.0
    reference = expected_success(base, sd_b).mean()
    for _ in range(60):
        mid = (low + high) / 2
        if expected_success(base + mid, sd_c).mean() - reference < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def simulate(design: str, truth: float, reps: int, rng: np.random.Generator):
    """(differences (reps, SEEDS), the true mean difference of each experiment)."""
    success, task_sd, global_sd, spread_c = 0.5, 0.35, 0.25, 1.0
    if design == "rare":  # success near 0.05: most differences are a few episodes, skewed
        success = 0.05
    elif design == "large_seed_sd":  # seeds that differ like the review's 0.60 vs 0.33
        task_sd, global_sd = 1.2, 0.8
    elif design == "unequal":  # the candidate's seeds spread three times as far
        spread_c = 3.0
    out = np.empty((reps, SEEDS))
    truths = np.empty(reps)
    task_of = np.repeat(np.arange(TASKS), EPISODES)
    for r in range(reps):
        base = np.log(success / (1 - success)) + rng.normal(0.0, 1.5, TASKS * EPISODES)  # the fixed episodes
        sd_b = np.full(base.size, math.hypot(task_sd, global_sd))
        shift = shift_for(truth, base, sd_b, spread_c * sd_b)
        truths[r] = expected_success(base + shift, spread_c * sd_b).mean() - expected_success(base, sd_b).mean()

        def seeds(offset: float, scale: float, base: np.ndarray = base) -> np.ndarray:
            u = scale * (rng.normal(0.0, global_sd, (SEEDS, 1)) + rng.normal(0.0, task_sd, (SEEDS, TASKS))[:, task_of])
            return (rng.random((SEEDS, base.size)) < expit(base + offset + u)).mean(axis=1)

        out[r] = seeds(shift, spread_c) - seeds(0.0, 1.0)
    return out, truths


def ever_misses(differences: np.ndarray, truths: np.ndarray, *, naive: bool = False) -> np.ndarray:
    """Per experiment: did the sequence (or the naive t-interval re-read each seed) ever exclude the truth?"""
    missed = np.zeros(len(differences), dtype=bool)
    for r, d in enumerate(differences):
        for n in range(2, SEEDS + 1):
            if naive:
                mean, sd = d[:n].mean(), d[:n].std(ddof=1)
                half = student_t.ppf(1 - ALPHA / 2, n - 1) * max(sd, 1 / (TASKS * EPISODES)) / math.sqrt(n)
                low, high = mean - half, mean + half
            else:
                interval = seed_interval(d[:n], ALPHA, 2.0, 1 / (TASKS * EPISODES))
                low, high = interval.low, interval.high
            if not low <= truths[r] <= high:
                missed[r] = True
                break
    return missed


def test_the_interval_is_where_the_bayes_factor_reaches_one_over_alpha():
    rng = np.random.default_rng(0)
    for n in (4, 7, 20):
        for g in (0.5, 2.0, 8.0):
            d = rng.normal(0.1, 0.05, n)
            interval = seed_interval(d, ALPHA, g)
            if not interval.bounded:
                assert critical_ratio(n, ALPHA, g) == math.inf
                assert max(log_bayes_factor(d, mu, g) for mu in np.linspace(-1, 1, 201)) < math.log(1 / ALPHA)
                continue
            for edge in (interval.low, interval.high):
                assert log_bayes_factor(d, edge, g) == pytest.approx(math.log(1 / ALPHA), abs=1e-9)
            inside = (interval.low + interval.high) / 2
            assert log_bayes_factor(d, inside, g) < math.log(1 / ALPHA)
    # Two seed pairs bound nothing; a prior that expects large effects bounds sooner.
    assert critical_ratio(2, ALPHA, 2.0) == math.inf
    assert min(n for n in range(2, 30) if math.isfinite(critical_ratio(n, ALPHA, 8.0))) < min(
        n for n in range(2, 30) if math.isfinite(critical_ratio(n, ALPHA, 0.5))
    )


@pytest.mark.parametrize(
    "design, truth",
    [
        ("measured", 0.0),
        ("measured", -0.10),
        ("large_seed_sd", 0.0),
        ("large_seed_sd", 0.15),
        ("rare", 0.0),
        ("rare", 0.03),
        ("unequal", 0.0),
        ("unequal", -0.05),
    ],
)
def test_the_sequence_holds_the_true_difference_at_every_seed_and_the_naive_interval_does_not(design, truth):
    rng = np.random.default_rng([len(design), int(truth * 1000) + 500])
    reps = 400
    differences, truths = simulate(design, truth, reps, rng)
    missed = ever_misses(differences, truths)
    assert clopper_pearson_lower(int(missed.sum()), reps) <= ALPHA, (design, truth, missed.mean())
    # The negative control: the same designs, a fixed-level t-interval read after every seed pair.
    naive = ever_misses(differences, truths, naive=True)
    assert naive.mean() > 2 * ALPHA, (design, truth, naive.mean())


@pytest.mark.parametrize("side", [-1, 1])
def test_no_false_equivalence_at_either_edge_of_the_margin_and_no_false_sign_at_zero(side):
    """At |truth| = margin EQUIVALENT is wrong; at truth = 0 BETTER and WORSE are. Decisions as the
    job takes them: the first look that decides stops the run."""
    rng = np.random.default_rng([7, side + 1])
    reps = 400
    for truth, wrong in ((side * MARGIN, {EQUIVALENT}), (0.0, {BETTER, WORSE})):
        differences, _ = simulate("measured", truth, reps, rng)
        decisions = [
            seed_test(d, alpha=ALPHA, margin=MARGIN, prior_scale=2.0, resolution=1 / (TASKS * EPISODES)).decision
            for d in differences
        ]
        k = sum(d in wrong for d in decisions)
        assert clopper_pearson_lower(k, reps) <= ALPHA, (truth, k)


def test_a_real_difference_is_certified_in_the_right_direction_and_an_a_a_as_equivalent():
    rng = np.random.default_rng(3)
    worse, _ = simulate("measured", -0.15, 100, rng)
    same, _ = simulate("measured", 0.0, 100, rng)
    floor = 1 / (TASKS * EPISODES)
    down = [seed_test(d, alpha=ALPHA, margin=0.1, prior_scale=2.0, resolution=floor).decision for d in worse]
    flat = [seed_test(d, alpha=ALPHA, margin=0.1, prior_scale=2.0, resolution=floor).decision for d in same]
    assert down.count(WORSE) >= 90 and BETTER not in down
    assert flat.count(EQUIVALENT) >= 50 and flat.count(BETTER) + flat.count(WORSE) <= 5


def test_tied_differences_never_shrink_the_interval_to_a_point():
    """Two checkpoints a few episodes apart tie on the grid of 1 / episodes: without the floor, two equal
    differences would certify at once."""
    tied = [0.25, 0.25, 0.25]
    assert seed_test(tied, alpha=ALPHA, margin=0.0, prior_scale=8.0).decision == BETTER  # the hole
    assert seed_test(tied, alpha=ALPHA, margin=0.0, prior_scale=8.0, resolution=0.25).decision == UNDECIDED


def test_the_decision_reads_the_interval():
    from vlaeval.seqtest.seeds import SeedInterval

    assert decide(SeedInterval(5, 0.2, 0.1, 0.01, 0.4), 0.05) == BETTER
    assert decide(SeedInterval(5, -0.2, 0.1, -0.4, -0.01), 0.05) == WORSE
    assert decide(SeedInterval(5, 0.0, 0.1, -0.04, 0.04), 0.05) == EQUIVALENT
    assert decide(SeedInterval(5, 0.0, 0.1, -0.04, 0.04), 0.0) == UNDECIDED
    assert decide(SeedInterval(5, 0.0, 0.1, -0.06, 0.04), 0.05) == UNDECIDED


def test_the_planner_predicts_what_the_test_then_does():
    """Seeds the planner says give 80% power do, on fresh simulations; it is deterministic."""
    rows = plan_seeds([0.1, 0.2, -0.2, 0.0], 0.06, alpha=ALPHA, margin=0.1, prior_scale=2.0, max_seeds=12)
    assert rows == plan_seeds([0.1, 0.2, -0.2, 0.0], 0.06, alpha=ALPHA, margin=0.1, prior_scale=2.0, max_seeds=12)
    rng = np.random.default_rng(11)
    for row in rows:
        assert row.seeds is not None, row
        wanted = BETTER if row.effect > 0 else WORSE if row.effect < 0 else EQUIVALENT
        runs = rng.normal(row.effect, row.sd, (2000, row.seeds))
        hit = np.mean([seed_test(d, alpha=ALPHA, margin=0.1, prior_scale=2.0).decision == wanted for d in runs])
        assert hit >= 0.8 - 0.03, (row, hit)
        if row.seeds > 2:
            fewer = np.mean(
                [seed_test(d[:-1], alpha=ALPHA, margin=0.1, prior_scale=2.0).decision == wanted for d in runs]
            )
            assert fewer < 0.8 + 0.03, (row, fewer)
    # Larger differences need fewer seeds.
    assert rows[1].seeds <= rows[0].seeds


def test_the_seed_spread_matrix():
    m = seed_spread([0.6, 0.33, 0.5])
    assert m.shape == (3, 3) and np.allclose(np.diag(m), 0) and np.allclose(m, -m.T)
    assert m[0, 1] == pytest.approx(0.27)
