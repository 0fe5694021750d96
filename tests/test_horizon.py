"""The horizon-aware exact paired test (vlaeval/seqtest/horizon.py), attacked where it is most likely
to break: the size certificate recomputed by brute force; Type-I at the certificate's own worst rate,
with arms that never both succeed (every pair discordant: STEP's .20), negative within-pair
correlation, rare discordance, clusters of several trials at a margin through the randomised
rounding, unequal clusters under the unit estimand, both sides; a boundary one step lower and a
restart past the horizon as negative controls that the same check must reject. Every rate is judged
by its one-sided 95% Clopper-Pearson lower bound."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from vlaeval.seqtest import TestSettings, make_sequential_test
from vlaeval.seqtest.horizon import (
    NEVER_REJECTS,
    HorizonDesign,
    certify,
    independent_alternative,
    rejection_given_discordant,
    round_steps,
    scaled_payoffs,
    synthesise,
)
from vlaeval.seqtest.state import HorizonSettings

ALPHA, N = 0.05, 60


def cp_lower(k: int, n: int) -> float:
    return 0.0 if k == 0 else float(beta_dist.ppf(0.05, k, n - k + 1))


@pytest.fixture(scope="module")
def design() -> HorizonDesign:
    return synthesise(N, ALPHA)


def walk_rejects(
    boundary: np.ndarray, x: np.ndarray, margin: float, upper: bool, rng: np.random.Generator, weights=None
) -> np.ndarray:
    """(reps,) whether the horizon test on each row of cluster means x rejects within the horizon: the
    vectorised walk (the test object is checked against it below)."""
    z = scaled_payoffs(x, margin, upper, weights)
    steps = round_steps(z, rng.random(z.shape))
    t = np.arange(1, x.shape[1] + 1)
    k = np.cumsum(steps != 0, axis=1)
    n = np.cumsum(steps > 0, axis=1)
    bound = boundary[np.minimum(t, boundary.shape[0] - 1)[None, :], k]
    bound = np.where(t[None, :] < boundary.shape[0], bound, NEVER_REJECTS)
    return np.asarray((n >= bound).any(axis=1))


def paired(rng, reps, p_baseline, p_candidate, corr=0.0):
    """(reps, N) paired differences of single trials with a within-pair correlation (Gaussian copula
    thresholds: 'never both succeed' is corr=-1 at p=.5)."""
    from scipy.stats import norm

    g = rng.standard_normal((reps, N, 2))
    g[..., 1] = corr * g[..., 0] + np.sqrt(1 - corr**2) * g[..., 1]
    b = g[..., 0] < norm.ppf(p_baseline)
    c = g[..., 1] < norm.ppf(p_candidate)
    return c.astype(float) - b


def test_the_size_certificate_matches_a_brute_force_count():
    """c_D (reject within N | D discordant) from the forward pass against simulation of the
    conditional model itself: D discordant positions uniform among N, fair signs."""
    small = synthesise(30, ALPHA)
    c = rejection_given_discordant(small.boundary)
    rng = np.random.default_rng(3)
    reps = 20_000
    for d in (4, 12, 30):
        positions = np.argsort(rng.random((reps, 30)), axis=1) < d
        signs = np.where(rng.random((reps, 30)) < 0.5, 1.0, -1.0)
        x = np.where(positions, signs, 0.0)
        hits = walk_rejects(small.boundary, x, 0.0, True, rng)
        sd = np.sqrt(c[d] * (1 - c[d]) / reps)
        assert abs(hits.mean() - c[d]) <= 4 * sd + 1e-9, (d, hits.mean(), c[d])
    size, _ = certify(small.boundary)
    assert size.bound <= ALPHA and np.allclose(size.by_discordant, c)


def test_a_design_is_deterministic_and_round_trips(design):
    again = synthesise(N, ALPHA)
    assert np.array_equal(again.boundary, design.boundary)
    back = HorizonDesign.from_arrays(design.to_arrays())
    assert np.array_equal(back.boundary, design.boundary) and back.size.bound == design.size.bound
    assert design.size.bound <= ALPHA


NULLS = {
    "arms never both succeed (p = .5, every pair discordant)": lambda rng, r: paired(rng, r, 0.5, 0.5, corr=-1.0),
    "negative within-pair correlation -0.13 (p = .5)": lambda rng, r: paired(rng, r, 0.5, 0.5, corr=-0.13),
    "positive within-pair correlation +0.6 (p = .3)": lambda rng, r: paired(rng, r, 0.3, 0.3, corr=0.6),
    "rare discordance (p = .02 both)": lambda rng, r: paired(rng, r, 0.02, 0.02),
}


@pytest.mark.parametrize("name", list(NULLS))
@pytest.mark.parametrize("upper", [True, False])
def test_type_i_holds_for_any_within_pair_dependence(design, name, upper):
    rng = np.random.default_rng([7, len(name), int(upper)])
    reps = 6000
    hits = walk_rejects(design.boundary, NULLS[name](rng, reps), 0.0, upper, rng)
    assert cp_lower(int(hits.sum()), reps) <= ALPHA, (name, hits.mean())


def test_type_i_at_the_certificates_own_worst_rate_and_a_lower_boundary_fails_there(design):
    """The rate the certificate found hardest, as independent discordance; the same boundary one
    positive step lower (the negative control) must be caught by the same check."""
    rng = np.random.default_rng(11)
    reps = 20_000
    r = max(design.size.worst_rate, 0.02)
    disc = rng.random((reps, N)) < r
    x = np.where(disc, np.where(rng.random((reps, N)) < 0.5, 1.0, -1.0), 0.0)
    hits = walk_rejects(design.boundary, x, 0.0, True, rng)
    assert cp_lower(int(hits.sum()), reps) <= ALPHA, hits.mean()
    lowered = np.where(design.boundary < NEVER_REJECTS, design.boundary - 1, NEVER_REJECTS)
    size, _ = certify(lowered)
    worst = size.worst_rate
    disc = rng.random((reps, N)) < worst
    x = np.where(disc, np.where(rng.random((reps, N)) < 0.5, 1.0, -1.0), 0.0)
    lowered_hits = walk_rejects(lowered, x, 0.0, True, rng)
    assert size.bound > ALPHA and cp_lower(int(lowered_hits.sum()), reps) > ALPHA, lowered_hits.mean()


def test_a_restart_past_the_horizon_is_invalid(design):
    """Looking on: a fresh horizon test on clusters N+1..2N after an undecided first (what 'switch to
    the longer policy / restart' does) must exceed alpha on a null where the first alone holds it."""
    rng = np.random.default_rng(12)
    reps = 20_000
    r = design.size.worst_rate  # where the first test spends its whole level
    x = np.where(rng.random((reps, 2 * N)) < 0.5, 1.0, -1.0) * (rng.random((reps, 2 * N)) < r)
    first = walk_rejects(design.boundary, x[:, :N], 0.0, True, rng)
    second = walk_rejects(design.boundary, x[:, N:], 0.0, True, rng)
    either = first | second
    assert cp_lower(int(first.sum()), reps) <= ALPHA
    assert cp_lower(int(either.sum()), reps) > ALPHA, either.mean()


def scene_nulls(rng, reps, size, margin):
    """Clusters of `size` trials at the boundary Delta = margin, skewed: 3% broken scenes where the
    candidate fails everything the baseline solves, the rest offset so the mean is exactly `margin`."""
    base = rng.uniform(0.3, 0.9, (reps, N, 1))
    broken = rng.random((reps, N, 1)) < 0.03
    b = rng.random((reps, N, size)) < base
    shift = (margin + 0.03 * 0.6) / 0.97  # the broken scenes cost about 0.6 each
    c = np.where(broken, False, rng.random((reps, N, size)) < np.clip(base + shift, 0, 1))
    return (c.astype(float) - b).mean(axis=2)


@pytest.mark.parametrize("size", [2, 5])
def test_type_i_through_the_rounding_for_clusters_at_a_margin(design, size):
    """Non-inferiority at -0.02 on clusters of several trials: payoffs are rounded to steps (the
    randomisation is what keeps it exact); the null's realised mean is measured, not assumed."""
    rng = np.random.default_rng([13, size])
    reps = 6000
    x = scene_nulls(rng, reps, size, -0.02)
    margin = float(x.mean())  # the design's mean, to within its own sampling error: the hardest margin
    hits_up = walk_rejects(design.boundary, x, margin - 0.002, True, rng)
    hits_down = walk_rejects(design.boundary, x, margin + 0.002, False, rng)
    for hits in (hits_up, hits_down):
        assert cp_lower(int(hits.sum()), reps) <= ALPHA, (size, hits.mean())


def test_type_i_for_unequal_clusters_under_the_unit_estimand(design):
    """Cluster sizes 1..30 whose means depend on the size (small concordant, large slightly worse):
    the unit-weighted mean is the margin; weights n / n_max with n_max declared."""
    rng = np.random.default_rng(14)
    reps = 6000
    sizes = rng.integers(1, 31, (reps, N))
    p = np.where(sizes > 15, 0.45, 0.55)
    b = rng.binomial(sizes, 0.5)
    c = rng.binomial(sizes, p)
    x = (c - b) / sizes
    w = sizes / 30.0
    unit_mean = float((x * sizes).sum() / sizes.sum())
    for upper, margin in ((True, unit_mean - 0.002), (False, unit_mean + 0.002)):
        hits = walk_rejects(design.boundary, x, margin, upper, rng, weights=w)
        assert cp_lower(int(hits.sum()), reps) <= ALPHA, (upper, hits.mean())


def test_power_is_exact_and_the_test_object_follows_the_walk(design):
    """design.power's forward pass against simulation; the HorizonTest object decides where the
    vectorised walk does, cluster for cluster, for batches of any size."""
    r, p = independent_alternative(0.3, 0.6)
    rng = np.random.default_rng(15)
    reps = 20_000
    disc = rng.random((reps, N)) < r
    x = np.where(disc, np.where(rng.random((reps, N)) < p, 1.0, -1.0), 0.0)
    power, _ = design.power(r, p)
    hits = walk_rejects(design.boundary, x, 0.0, True, rng)
    assert abs(hits.mean() - power) < 4 * np.sqrt(power * (1 - power) / reps)

    def designs(horizon: int, level: float) -> HorizonDesign:
        assert horizon == N and level == ALPHA
        return design

    for row in x[:40]:
        test = make_sequential_test(TestSettings(0.0, ALPHA), HorizonSettings(horizon=N, design=designs))
        for lo in range(0, N, 7):
            state = test.update(row[lo : lo + 7])
        n = np.cumsum(row > 0)
        k = np.cumsum(row != 0)
        t = np.arange(1, N + 1)
        crossed = np.flatnonzero(n >= design.boundary[t, k])
        if crossed.size:
            assert (state.decision, state.decided_at_cluster) == ("PASS", int(crossed[0]) + 1)
        else:
            assert state.decision != "PASS"


def test_past_the_horizon_is_refused(design):
    test = make_sequential_test(
        TestSettings(0.0, ALPHA), HorizonSettings(horizon=N, design=lambda horizon, level: design)
    )
    test.update(np.zeros(N))
    with pytest.raises(ValueError, match="not valid past"):
        test.update(np.zeros(1))
    assert "not valid past its horizon" in test.state.settings.to_json()["valid_within"]
