"""The anytime-valid paired test: bets, wealth, stickiness, confidence sequences, validity."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from vlaeval.seqtest import (
    CATASTROPHIC,
    DECISION_INSUFFICIENT,
    DECISION_PASS,
    DECISION_REGRESSION,
    NOT_CATASTROPHIC,
    AsymptoticSequentialTest,
    GroupSequentialTest,
    OrderFreeTest,
    PairedSequentialTest,
    TestState,
    cluster_means,
    log_wealth_paths,
    make_sequential_test,
    plan_batches,
)
from vlaeval.seqtest.eprocess import (
    FIXED_HORIZON,
    LOWER,
    UPPER,
    MomentState,
    WealthFamily,
    plug_in_bets,
    predictable_moments,
)
from vlaeval.seqtest.state import (
    AsymptoticSettings,
    ExactSettings,
    GroupSequentialSettings,
    OrderFreeSettings,
    TestSettings,
)


def clopper_pearson_lower(k: int, n: int, level: float = 0.95) -> float:
    return 0.0 if k == 0 else float(beta_dist.ppf((1 - level) / 2, k, n - k + 1))


def paired_cluster_means(rng, reps, clusters, size, delta, p_plus=0.01):
    """Cluster means of paired unit differences in {-1, 0, 1} with mean exactly `delta`."""
    p_minus = p_plus - delta
    u = rng.random((reps, clusters, size))
    d = (u < p_plus).astype(np.float64) - ((u >= p_plus) & (u < p_plus + p_minus))
    return d.mean(axis=2)


@pytest.mark.parametrize("cap", [0.5, 0.95, 1.0])
@pytest.mark.parametrize("side", [UPPER, LOWER])
def test_wealth_never_negative_on_adversarial_data(cap, side):
    rng = np.random.default_rng(3)
    x = rng.choice([-1.0, 1.0], size=(50, 400))  # the bounds themselves, in every order
    logw = log_wealth_paths(x, -0.02, side, cap_fraction=cap)
    assert not np.any(np.isnan(logw))
    if cap < 1.0:
        assert np.all(np.isfinite(logw))  # factor >= 1 - c > 0: wealth stays strictly positive
    else:
        assert np.all(logw < np.inf)


def test_bets_are_predictable():
    """Changing x_t must not change any bet up to and including t."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.2, 0.2, 200)
    y = x.copy()
    y[120] = -1.0
    margins = np.array([[-0.02], [0.0], [0.05]])
    a = plug_in_bets(
        predictable_moments(x, MomentState()), margins, UPPER, rule="agrapa", cap_fraction=0.95, alpha=0.05
    )
    b = plug_in_bets(
        predictable_moments(y, MomentState()), margins, UPPER, rule="agrapa", cap_fraction=0.95, alpha=0.05
    )
    np.testing.assert_array_equal(a[:, :121], b[:, :121])
    assert not np.array_equal(a[:, 121:], b[:, 121:])
    assert np.all(a >= 0) and np.all(a <= 0.95 / (1 + margins))


def test_batches_of_any_split_give_the_same_wealth():
    rng = np.random.default_rng(1)
    x = rng.normal(0.01, 0.05, 600).clip(-1, 1)
    whole = WealthFamily.start(np.array([-0.02, 0.03]), LOWER)
    whole.update(
        x, predictable_moments(x, MomentState()), rule="agrapa", cap_fraction=0.95, alpha=0.05, threshold_log=3.0
    )
    split = WealthFamily.start(np.array([-0.02, 0.03]), LOWER)
    state = MomentState()
    for chunk in np.array_split(x, [7, 100, 101, 350]):
        split.update(
            chunk, predictable_moments(chunk, state), rule="agrapa", cap_fraction=0.95, alpha=0.05, threshold_log=3.0
        )
        state = state.advanced(chunk)
    np.testing.assert_allclose(split.log_wealth, whole.log_wealth, rtol=1e-10)
    np.testing.assert_allclose(
        split.log_wealth,
        log_wealth_paths(x, -0.02, LOWER)[0, -1] * np.array([1, 0])
        + log_wealth_paths(x, 0.03, LOWER)[0, -1] * np.array([0, 1]),
        rtol=1e-10,
    )


def test_pass_regression_and_stickiness():
    rng = np.random.default_rng(5)
    test = PairedSequentialTest(TestSettings(delta=0.02, alpha=0.05))
    assert test.state.decision == DECISION_INSUFFICIENT and test.state.delta_estimate is None
    test.update(paired_cluster_means(rng, 1, 400, 20, 0.0)[0])
    assert test.state.decision == DECISION_PASS
    decided = test.state.decided_at_cluster
    assert 50 < decided < 400
    test.update(np.full(2000, -1.0))  # overwhelming contrary evidence afterwards
    assert test.state.decision == DECISION_PASS  # sticky
    assert test.state.decided_at_cluster == decided

    bad = PairedSequentialTest(TestSettings(delta=0.02, alpha=0.05))
    bad.update(paired_cluster_means(rng, 1, 400, 20, -0.06)[0])
    assert bad.state.decision == DECISION_REGRESSION
    assert bad.state.delta_estimate == pytest.approx(-0.06, abs=0.01)


@pytest.mark.parametrize(
    "mode",
    [
        ExactSettings(),
        OrderFreeSettings(orders=4),
        AsymptoticSettings(burn_in_clusters=10, tuning_clusters=300),
        GroupSequentialSettings(planned_looks=(100, 300)),
    ],
    ids=lambda m: type(m).__name__,
)
def test_update_returns_a_frozen_state_each_mode(mode):
    """`update` returns the test's state after the look: a new frozen record each time (an earlier
    one does not change), the figures the report is written from, the halt's question typed."""
    rng = np.random.default_rng(3)
    test = make_sequential_test(TestSettings(delta=0.02, alpha=0.05, catastrophic_delta=0.05), mode)
    assert (
        type(test)
        is {
            "ExactSettings": PairedSequentialTest,
            "OrderFreeSettings": OrderFreeTest,
            "AsymptoticSettings": AsymptoticSequentialTest,
            "GroupSequentialSettings": GroupSequentialTest,
        }[type(mode).__name__]
    )
    x = paired_cluster_means(rng, 1, 300, 20, -0.12, p_plus=0.02)[0]
    first = test.update(x[:100])
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.decision = DECISION_PASS
    second = test.update(x[100:])
    assert isinstance(first, TestState) and isinstance(second, TestState)
    assert (first.clusters, first.looks, second.clusters, second.looks) == (100, 1, 300, 2)
    assert second == test.state and second is not first
    assert second.decision == DECISION_REGRESSION and second.delta_estimate == pytest.approx(x.mean())
    assert second.catastrophic is not None and second.catastrophic.delta == 0.05
    report = second.to_json()
    assert report["decision"] == second.decision and report["catastrophic"] == second.catastrophic.status
    assert report["confidence_sequence"]["upper"] == second.confidence_sequence.upper
    assert report["catastrophic_bound"]["upper"] == second.catastrophic.bound.upper
    if isinstance(mode, ExactSettings):  # the betting modes report their wealth
        assert report["e_value_regression"] == second.e_values.regression > 1.0
        # A file's orders bet the fixed-horizon plug-in (their size is known), and the report says so.
        fixed = isinstance(mode, OrderFreeSettings) and mode.fixed_horizon
        assert report["bet_rule"] == (FIXED_HORIZON if fixed else mode.bet_rule)
    else:
        assert second.e_values.regression is None and report["e_value_regression"] is None
    assert make_sequential_test(TestSettings(0.02, 0.05), mode).state.catastrophic is None  # no halt question


def test_a_mode_is_picked_by_its_settings_type():
    with pytest.raises(TypeError, match="no sequential test takes dict"):
        make_sequential_test(TestSettings(0.02, 0.05), {"bet_rule": "blend"})


def test_catastrophic_status_is_certified_not_estimated():
    rng = np.random.default_rng(8)
    cat = PairedSequentialTest(TestSettings(delta=0.02, alpha=0.05, catastrophic_delta=0.05))
    cat.update(paired_cluster_means(rng, 1, 400, 20, -0.12, p_plus=0.02)[0])
    assert cat.state.catastrophic.status == CATASTROPHIC
    assert cat.state.confidence_sequence.upper < 0  # the CS agrees: the whole interval is below zero
    mild = PairedSequentialTest(TestSettings(delta=0.02, alpha=0.05, catastrophic_delta=0.05))
    mild.update(paired_cluster_means(rng, 1, 600, 20, -0.035, p_plus=0.02)[0])
    assert mild.state.decision == DECISION_REGRESSION
    assert mild.state.catastrophic.status == NOT_CATASTROPHIC
    # A point estimate below -0.05 on a handful of clusters is not a certificate.
    few = PairedSequentialTest(TestSettings(delta=0.02, alpha=0.05, catastrophic_delta=0.05))
    few.update(np.array([-0.1, -0.05, -0.1]))
    assert few.state.delta_estimate < -0.05 and few.state.catastrophic.status == "UNDECIDED"


def test_confidence_sequence_covers_uniformly_over_time_and_shrinks():
    """P(the CS ever excludes the truth) <= alpha, checked after every batch (300 replications)."""
    rng = np.random.default_rng(11)
    alpha, reps, truth = 0.1, 300, -0.01
    ever_missed, widths = 0, []
    for x in paired_cluster_means(rng, reps, 300, 10, truth, p_plus=0.03):
        test = PairedSequentialTest(TestSettings(delta=0.02, alpha=alpha, cs_grid_step=0.002))
        missed = False
        for chunk in np.array_split(x, 15):
            test.update(chunk)
            lo, hi = test.state.confidence_sequence.lower, test.state.confidence_sequence.upper
            missed |= not (lo < truth < hi)
        ever_missed += missed
        widths.append(hi - lo)
    assert clopper_pearson_lower(ever_missed, reps) <= alpha
    assert np.mean(widths) < 0.06


def test_cluster_means_and_batches_respect_clusters():
    sizes = np.array([3, 1, 4, 2])
    d = np.array([1, 0, -1, 1, 0, 0, 0, 1, -1, -1], dtype=float)
    np.testing.assert_allclose(cluster_means(d, sizes), [0.0, 1.0, 0.25, -1.0])
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    for batch_units in (1, 2, 3, 5, 100):
        for limit in (0, 3, 4, 7, 9, 10):
            plan = plan_batches(sizes, batch_units, limit)
            assert all(a < b for a, b in plan)
            assert all(p[1] == q[0] for p, q in zip(plan, plan[1:]))
            if plan:
                assert plan[0][0] == 0 and offsets[plan[-1][1]] <= limit
                # the next whole cluster would not have fitted
                assert plan[-1][1] == len(sizes) or offsets[plan[-1][1] + 1] > limit


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="alpha"):
        PairedSequentialTest(TestSettings(0.02, 1.5))
    with pytest.raises(ValueError, match="bet rule"):
        PairedSequentialTest(TestSettings(0.02, 0.05), ExactSettings(bet_rule="kelly"))
    test = PairedSequentialTest(TestSettings(0.02, 0.05))
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        test.update(np.array([0.5, 1.5]))


# ----------------------------------------------------------------------------- group-sequential mode
def test_obrien_fleming_boundaries_match_published_values():
    """Lan-DeMets O'Brien-Fleming spending, 5 equally spaced looks, one-sided alpha = 0.025: the
    boundaries published by gsDesign (sfLDOF) to 3 decimals; one look is the plain z-test."""
    from vlaeval.seqtest import one_sided_boundaries

    bounds = one_sided_boundaries(np.arange(1, 6) / 5, 0.025)
    np.testing.assert_allclose(bounds, [4.8769, 3.3569, 2.6803, 2.2898, 2.0310], atol=2e-3)
    assert one_sided_boundaries([1.0], 0.05)[0] == pytest.approx(1.6449, abs=1e-4)
    with pytest.raises(ValueError, match="increase strictly"):
        one_sided_boundaries([0.5, 0.5, 1.0], 0.05)


@pytest.mark.parametrize("fractions", [np.arange(1, 21) / 20, np.array([0.07, 0.1, 0.35, 0.36, 0.8, 1.0])])
def test_group_sequential_boundaries_spend_exactly_alpha_on_brownian_motion(fractions):
    """The design's own model (Gaussian increments): the crossing probability is alpha, look by look
    as the spending function says (200k simulated paths)."""
    from vlaeval.seqtest import obf_spending, one_sided_boundaries

    rng = np.random.default_rng(21)
    bounds = one_sided_boundaries(fractions, 0.05)
    steps = np.diff(np.concatenate(([0.0], fractions)))
    z = np.cumsum(rng.standard_normal((200_000, fractions.size)) * np.sqrt(steps), axis=1) / np.sqrt(fractions)
    crossed = z >= bounds
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    cumulative = np.array([(first[first >= 0] <= k).sum() for k in range(fractions.size)]) / z.shape[0]
    np.testing.assert_allclose(cumulative, obf_spending(fractions, 0.05), atol=0.0015)


def test_group_sequential_test_matches_its_vectorised_harness_and_refuses_unplanned_looks():
    from vlaeval.seqtest import GroupSequentialTest
    from vlaeval.seqtest.simulation import NEVER, group_sequential_decision_times, realistic_cluster_means

    rng = np.random.default_rng(4)
    looks = np.array([30, 60, 100, 150, 220, 300])
    x = realistic_cluster_means(rng, 40, 300, 10, -0.01)
    times = group_sequential_decision_times(x, 0.02, 0.05, looks=looks, cluster_sizes=10, alarm_alpha=0.05 / 6)
    for r in range(40):
        test = GroupSequentialTest(
            TestSettings(0.02, 0.05, alarm_alpha=0.05 / 6), GroupSequentialSettings(planned_looks=tuple(looks))
        )
        for start, end in zip(np.r_[0, looks[:-1]], looks):
            test.update(x[r, start:end], np.full(end - start, 10))
            if test.state.decision != DECISION_INSUFFICIENT:
                break
        expected = min(times["pass"][r], times["regression"][r])
        assert test.state.decided_at_cluster == (None if expected == NEVER else expected)
    test = GroupSequentialTest(TestSettings(0.02, 0.05), GroupSequentialSettings(planned_looks=tuple(looks)))
    with pytest.raises(ValueError, match="look 1 of the group-sequential design is planned at 30 clusters"):
        test.update(x[0, :31])


def test_group_sequential_type_one_error_where_its_normal_model_holds():
    """CLT-based, so its level is checked where the normal model holds (symmetric cluster means,
    30+ clusters at the first look): within alpha at the boundary for both decisions, and not
    wildly conservative. Where it does not hold (skewed, rare-event nulls) the efficiency benchmark
    measures it above alpha -- why the mode is opt-in, labelled and never a LAUNCH."""
    from vlaeval.seqtest.simulation import NEVER, group_sequential_decision_times

    rng = np.random.default_rng(31)
    x = np.clip(rng.normal(-0.02, 0.1, (4000, 300)), -1, 1)
    times = group_sequential_decision_times(x, 0.02, 0.05, looks=np.arange(30, 301, 30), cluster_sizes=40)
    for kind in ("pass", "regression"):
        k = int((times[kind] < NEVER).sum())
        assert clopper_pearson_lower(k, 4000, level=0.90) <= 0.05, (kind, k)
        assert k / 4000 > 0.03, (kind, k)  # it spends its alpha


def test_fixed_n_z_clusters_is_a_whole_number_of_at_least_two():
    from vlaeval.seqtest.simulation import fixed_n_clusters

    rng = np.random.default_rng(5)
    easy = rng.normal(0.3, 0.05, 400)  # far above the margin: the formula gives well under one cluster
    assert fixed_n_clusters(easy, 0.02, 0.05) == 2.0
    hard = rng.normal(0.0, 0.3, 400)
    n = fixed_n_clusters(hard, 0.02, 0.05)
    assert n == int(n) and n > 100
    assert fixed_n_clusters(np.zeros(10), 0.0, 0.05) == math.inf  # effect exactly at the margin: never


def textbook_bets(x, w, margins, side, rule, cap, alpha=0.05):
    """The plug-in bets written out from their definition, one margin and one observation at a time
    in closed form: the oracle for the expanded, blocked arithmetic of plug_in_bets."""
    sign = 1.0 if side == UPPER else -1.0
    out = np.zeros((margins.size, x.size))
    for g, m in enumerate(margins):
        for t in range(x.size):
            y = sign * w[:t] * (x[:t] - m)
            pseudo = -sign * m  # one pseudo-observation x = 0, w = 1
            edge = (y.sum() + pseudo) / (t + 1)
            spread = np.sum((w[:t] * (x[:t] - m) - (w[:t] * (x[:t] - m)).sum() / max(t, 1)) ** 2) if t else 0.0
            var = (0.25 + spread) / (t + 1)
            c = cap / (1 + m) if side == UPPER else cap / (1 - m)
            agrapa = min(max(edge / (var + edge * edge), 0.0), c)
            prpl = min(math.sqrt(2 * math.log(1 / alpha) / (var * (t + 1) * math.log1p(t + 1))), c)
            out[g, t] = {"agrapa": agrapa, "prpl": prpl, "blend": 0.5 * (agrapa + prpl)}[rule]
    return out


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("side", [UPPER, LOWER])
@pytest.mark.parametrize("rule", ["agrapa", "prpl", "blend"])
def test_plug_in_bets_equal_their_definition(weighted, side, rule):
    """The margin-expanded spread (unit weights: margin-free) gives the bets of the definition."""
    rng = np.random.default_rng(21)
    x = np.clip(rng.normal(-0.01, 0.3, 60), -1, 1)
    w = rng.integers(1, 40, 60) / 40.0 if weighted else np.ones(60)
    margins = np.array([-0.9, -0.3, -0.02, 0.0, 0.04, 0.5, 0.95])
    moments = predictable_moments(x, MomentState(), w if weighted else None)
    assert moments.unit_weights is not weighted
    fast = plug_in_bets(moments, margins[:, None], side, rule=rule, cap_fraction=0.9, alpha=0.05)
    np.testing.assert_allclose(fast, textbook_bets(x, w, margins, side, rule, 0.9), rtol=1e-9, atol=1e-12)


def _halt_series(design_mean, *, sizes=None, rule="blend", whole_grid=False, never_extend=False):
    """The halt's upper bound after every cluster, over batches, with the margins below
    -catastrophic_delta brought in lazily (the engine), from the start (whole_grid) or never."""
    rng = np.random.default_rng(17)
    unit = dict(estimand="unit", max_cluster_size=40, min_cluster_size=1) if sizes is not None else {}
    test = PairedSequentialTest(
        TestSettings(delta=0.02, alpha=0.05, catastrophic_delta=0.05, **unit), ExactSettings(bet_rule=rule)
    )
    if whole_grid:
        test._cat_floor = 0  # every margin from the first cluster: the reference
    if never_extend:
        test._replay_catastrophic = lambda low, high: None  # a broken engine: margins never brought in
    x = paired_cluster_means(rng, 1, 900, 20, design_mean, p_plus=0.03)[0]
    for part, size in zip(
        np.array_split(x, [40, 41, 300, 620]),
        np.array_split(sizes if sizes is not None else np.ones(900), [40, 41, 300, 620]),
    ):
        test.update(part, None if sizes is None else size)
    return np.asarray(test.trajectory()["catastrophic_upper"]), test


@pytest.mark.parametrize("rule", ["blend", "ons"])
@pytest.mark.parametrize("design_mean", [-0.20, -0.06, 0.0])
def test_halt_bound_with_late_margins_equals_the_whole_grid(rule, design_mean):
    """Margins below -catastrophic_delta are computed only once the halt's bound reaches them,
    replayed from the stratum's start: the bound, the halt and its time are those of the whole grid."""
    lazy, lazy_test = _halt_series(design_mean, rule=rule)
    whole, whole_test = _halt_series(design_mean, rule=rule, whole_grid=True)
    np.testing.assert_array_equal(lazy, whole)
    assert lazy_test.state.catastrophic.at_cluster == whole_test.state.catastrophic.at_cluster
    if design_mean == -0.20:  # the bound falls far below -0.05: the lower margins were needed
        assert lazy.min() < -0.1 and lazy_test._cat_floor < lazy_test._cat_index


def test_halt_bound_with_late_margins_weighted_and_the_broken_engine_differs():
    sizes = np.random.default_rng(4).integers(1, 41, 900).astype(float)
    lazy, _ = _halt_series(-0.20, sizes=sizes)
    whole, _ = _halt_series(-0.20, sizes=sizes, whole_grid=True)
    np.testing.assert_array_equal(lazy, whole)
    # Negative control: an engine that brings the lower margins in without replaying their past
    # starts them at wealth 1 mid-stratum; the exact comparison above must see the difference.
    broken, _ = _halt_series(-0.20, sizes=sizes, never_extend=True)
    assert not np.array_equal(broken, whole) and np.all(broken >= whole) and whole.min() < -0.1
