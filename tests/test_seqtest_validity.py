"""The validity harness: Type-I error of every bet rule under continuous monitoring (a look after
every cluster), at the boundary Delta = -delta, where each guarantee is most likely to break:
the gauntlet's realistic generator, an adversarial skewed null, unequal cluster sizes whose
means depend on the size (where a size-dependent bet cap broke the supermartingale), files
grouped by difficulty (where file order broke the estimand), both estimands and both sides;
negative controls that the harness must flag; the approximate modes; multiplicity; the planner.

Every rate is checked with the one-sided 95% Clopper-Pearson lower bound: a procedure fails when
even that bound exceeds alpha, so the assertions can fail (the negative controls show they do).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import beta as beta_dist

from helpers.configs import compose_config, typed_gauntlet
from helpers.processes import run_main
from vlaeval.gauntlet import NEEDS_REVIEW, ArrayCache, FileOutcomes, SyntheticOutcomes, run_gauntlet, validate_gauntlet
from vlaeval.gauntlet.outcomes import cluster_permutation, synthetic_paired_outcomes
from vlaeval.gauntlet.planning import plan_gauntlet
from vlaeval.gauntlet.result import Lineage
from vlaeval.seqtest import (
    BET_RULES,
    CATASTROPHIC,
    DECISION_INSUFFICIENT,
    AsymptoticSequentialTest,
    PairedSequentialTest,
    cluster_means,
    size_adaptive_cap,
)
from vlaeval.seqtest.eprocess import UPPER, MomentState, WealthFamily, predictable_moments
from vlaeval.seqtest.simulation import (
    NEVER,
    asymptotic_decision_times,
    exact_decision_times,
    realistic_cluster_means,
    size_dependent_designs,
    skewed_null_cluster_means,
    unequal_cluster_means,
    unit_weighted_mean,
)
from vlaeval.seqtest.state import AsymptoticSettings, ExactSettings, TestSettings

ALPHA, DELTA, REPS = 0.05, 0.02, 2000
VALID_LINEAGE = Lineage(valid=True)


def cp_lower(k: int, n: int) -> float:
    """One-sided 95% Clopper-Pearson lower bound of a rate k / n."""
    return 0.0 if k == 0 else float(beta_dist.ppf(0.05, k, n - k + 1))


def false_decisions(times: dict) -> dict:
    return {kind: int((t < NEVER).sum()) for kind, t in times.items()}


@pytest.fixture(scope="module")
def realistic_null():
    return realistic_cluster_means(np.random.default_rng(101), REPS, 300, 10, -DELTA)


@pytest.fixture(scope="module")
def skewed_null():
    return skewed_null_cluster_means(np.random.default_rng(102), REPS, 800, -DELTA)


@pytest.mark.parametrize("rule", BET_RULES)
@pytest.mark.parametrize("null", ["realistic_null", "skewed_null"])
def test_type_one_error_of_every_rule_on_both_nulls(rule, null, request):
    x = request.getfixturevalue(null)
    cap = float(size_adaptive_cap(10))
    counts = false_decisions(exact_decision_times(x, DELTA, ALPHA, rule=rule, cap=cap))
    for kind in ("pass", "regression"):
        assert cp_lower(counts[kind], REPS) <= ALPHA, (rule, null, kind, counts)


@pytest.mark.parametrize("cap", [0.5, 1.0])
def test_type_one_error_at_the_extreme_caps(cap, skewed_null):
    counts = false_decisions(exact_decision_times(skewed_null, DELTA, ALPHA, rule="prpl", cap=cap))
    assert max(cp_lower(c, REPS) for c in counts.values()) <= ALPHA, counts


def test_negative_control_naive_z_test_peeking_after_every_cluster(realistic_null):
    x = realistic_null
    n = np.arange(1, x.shape[1] + 1)
    mean = np.cumsum(x, axis=1) / n
    var = np.maximum(np.cumsum(x * x, axis=1) / n - mean**2, 1e-12)
    z = (mean + DELTA) / np.sqrt(var / n)
    false_pass = int((z[:, 4:] > 1.6449).any(axis=1).sum())  # one-sided z at 5%, from 5 clusters on
    assert cp_lower(false_pass, REPS) > ALPHA, false_pass


def test_negative_control_plug_in_msprt_on_the_skewed_null(skewed_null):
    """A Gaussian mixture SPRT with a plug-in variance: exact for Gaussians, invalid here."""
    x = skewed_null
    n = np.arange(1, x.shape[1] + 1)
    mean = np.cumsum(x, axis=1) / n
    var = np.maximum(np.cumsum(x * x, axis=1) / n - mean**2, 1e-8)
    tau2 = 1e-3
    log_lr = 0.5 * np.log(var / (var + n * tau2)) + (n * (mean + DELTA)) ** 2 * tau2 / (2 * var * (var + n * tau2))
    false_regression = int(((log_lr >= math.log(1 / ALPHA)) & (mean < -DELTA))[:, 1:].any(axis=1).sum())
    assert cp_lower(false_regression, REPS) > ALPHA, false_regression


# ----------------------------------------------------------------------------- size-dependent caps
DESIGN_REPS, DESIGN_CLUSTERS = 1000, 4000
DESIGNS = size_dependent_designs()


@pytest.fixture(
    scope="module",
    params=range(len(DESIGNS)),
    ids=[d.name.split(":")[0] + (" mirrored" if d.mirror else "") for d in DESIGNS],
)
def design_draw(request):
    design = DESIGNS[request.param]
    x, n = design.draw(np.random.default_rng(200 + request.param), DESIGN_REPS, DESIGN_CLUSTERS)
    return design, x, n


def test_size_dependent_designs_sit_exactly_at_the_margin():
    for design in DESIGNS:
        assert design.null_mean() == pytest.approx(-design.margin_delta(), abs=1e-12), design.name
        x, n = design.draw(np.random.default_rng(0), 1, 400_000)
        w = n / n.sum()
        observed = float((x * w).sum()) if design.estimand == "unit" else float(x.mean())
        assert observed == pytest.approx(-design.margin_delta(), abs=0.003), design.name


def test_negative_control_a_cap_from_the_current_cluster_size_fails(design_draw):
    """The rule this project shipped until the fix (cap 1 - 0.2 / n of the cluster being bet on):
    on every size-dependent design it declares the attacked decision far more often than alpha
    (measured 11-24% at 4,000 clusters; ~25-36% at 10,000 through PairedSequentialTest)."""
    design, x, n = design_draw
    times = exact_decision_times(
        x, design.margin_delta(), ALPHA, rule="blend", cap=size_adaptive_cap(n), weights=design.weights(n)
    )
    attacked = int((times[design.side] < NEVER).sum())
    assert cp_lower(attacked, DESIGN_REPS) > ALPHA, (design.name, attacked)


def test_one_cap_per_stratum_is_valid_on_the_size_dependent_designs(design_draw):
    """The fix: one cap from the stratum's smallest planned cluster size, for every bet rule, both
    sides, both estimands."""
    design, x, n = design_draw
    cap = float(size_adaptive_cap(min(design.sizes)))
    for rule in BET_RULES:
        counts = false_decisions(
            exact_decision_times(x, design.margin_delta(), ALPHA, rule=rule, cap=cap, weights=design.weights(n))
        )
        assert max(cp_lower(c, DESIGN_REPS) for c in counts.values()) <= ALPHA, (design.name, rule, counts)


@pytest.mark.parametrize("index", range(len(DESIGNS)))
def test_object_api_on_the_size_dependent_designs(index):
    """PairedSequentialTest itself, with its defaults (blend, size-adaptive cap), fed in batches of
    uneven size: valid on every design (before the fix: 18-31% false decisions on these designs),
    and decision for decision what the vectorised harness computes."""
    design = DESIGNS[index]
    reps = 120
    x, n = design.draw(np.random.default_rng(300 + index), reps, DESIGN_CLUSTERS)
    times = exact_decision_times(
        x, design.margin_delta(), ALPHA, rule="blend", cap=float(size_adaptive_cap(1)), weights=design.weights(n)
    )
    expected = np.minimum(times["pass"], times["regression"])
    wrong = 0
    cuts = np.sort(np.random.default_rng(index).choice(np.arange(1, DESIGN_CLUSTERS), size=24, replace=False))
    for r in range(reps):
        test = PairedSequentialTest(
            TestSettings(
                design.margin_delta(),
                ALPHA,
                estimand=design.estimand,
                min_cluster_size=int(n[r].min()),
                max_cluster_size=design.sizes[1],
            )
        )
        for part in np.split(np.arange(DESIGN_CLUSTERS), cuts):
            test.update(x[r, part], n[r, part])
        decided = test.state.decided_at_cluster
        assert decided == (None if expected[r] == NEVER else expected[r]), (design.name, r)
        wrong += test.state.decision != DECISION_INSUFFICIENT
    assert cp_lower(wrong, reps) <= ALPHA, (design.name, wrong)


@pytest.mark.parametrize("small_share", [0.004, 0.01])
def test_a_cap_fixed_from_the_whole_file_stays_valid_on_a_rare_event_null(small_share):
    """A file's plan is its own clusters, so the stratum's cap comes from the smallest cluster in
    the file -- a function of all its clusters. Attacked where that matters most: rare single-
    scenario clusters where only the candidate succeeds (+1) against scenes of 40 with one
    candidate-only failure, Delta exactly at the margin, so files without a small cluster bet at
    0.995 and the others at 0.8. Measured: 2.5% / 4.0% false REGRESSION (a fixed 0.995 cap: 4.1% /
    5.0%), within alpha."""
    rng = np.random.default_rng(int(small_share * 1e4))
    reps, clusters = REPS, 1500
    small = rng.random((reps, clusters)) < small_share
    x = np.where(small, 1.0, -1.0 / 40)
    n = np.where(small, 1, 40)
    margin = small_share * 1.0 + (1 - small_share) * (-1.0 / 40)  # the population mean
    times = exact_decision_times(x, -margin, ALPHA, rule="blend", cap=size_adaptive_cap(n.min(axis=1))[:, None])
    counts = false_decisions(times)
    assert counts["regression"] > 0  # the null is hard: the test is close to its level here
    assert max(cp_lower(c, reps) for c in counts.values()) <= ALPHA, counts


def unequal_design():
    """Sizes 2, 10 and 40; the large clusters are the worse ones, so the scenario-weighted Delta
    sits exactly at -delta while the mean of cluster means is far above it."""
    sizes = np.array([2, 10, 40])
    p_minus = np.array([0.010, 0.020, 0.045])
    p_plus = p_minus.copy()
    p_plus[2] = 0.045 - (DELTA * sizes.sum() + np.dot(sizes[:2], p_plus[:2] - p_minus[:2])) / 40
    assert unit_weighted_mean(sizes, p_plus, p_minus) == pytest.approx(-DELTA, abs=1e-12)
    return sizes, p_plus, p_minus


def test_scenario_weighted_estimand_is_valid_with_unequal_clusters():
    sizes, p_plus, p_minus = unequal_design()
    x, n = unequal_cluster_means(np.random.default_rng(103), REPS, 400, sizes, p_plus, p_minus)
    weights = n / sizes.max()
    cap = float(size_adaptive_cap(sizes.min()))
    for rule in BET_RULES:
        counts = false_decisions(exact_decision_times(x, DELTA, ALPHA, rule=rule, cap=cap, weights=weights))
        assert max(cp_lower(c, REPS) for c in counts.values()) <= ALPHA, (rule, counts)
    # The same data under the cluster estimand are not at the boundary (mean of cluster means
    # is about -0.007): that test PASSes most runs -- the two estimands really differ.
    cluster_mean_delta = float(np.mean(p_plus - p_minus))
    assert cluster_mean_delta > -DELTA / 2
    times = exact_decision_times(x, DELTA, ALPHA, rule="prpl", cap=cap)
    assert (times["pass"] < NEVER).mean() > 0.5


def test_cluster_estimand_is_valid_with_a_size_trend():
    """Sizes 1..40, the candidate-only failure rate rising with the size, the mean of cluster
    means exactly at -delta (and the scenario-weighted mean below it)."""
    sizes = np.arange(1, 41)
    p_minus = 0.01 + 0.02 * (sizes - 1) / 39
    p_plus = p_minus - DELTA  # every size at the boundary in expectation, variance differs by size
    p_plus = np.clip(p_plus, 0.0, None)
    p_minus = p_plus + DELTA
    x, n = unequal_cluster_means(np.random.default_rng(104), REPS, 400, sizes, p_plus, p_minus)
    for rule in BET_RULES:
        counts = false_decisions(exact_decision_times(x, DELTA, ALPHA, rule=rule, cap=float(size_adaptive_cap(1))))
        assert max(cp_lower(c, REPS) for c in counts.values()) <= ALPHA, (rule, counts)


def test_sequential_test_object_matches_the_vectorised_harness():
    """The harness simulates exactly what PairedSequentialTest computes (unit estimand, ONS,
    the stratum's cap, batches of any split)."""
    sizes, p_plus, p_minus = unequal_design()
    x, n = unequal_cluster_means(np.random.default_rng(5), 1, 300, sizes, p_plus, p_minus)
    for rule in BET_RULES:
        test = PairedSequentialTest(
            TestSettings(DELTA, ALPHA, estimand="unit", max_cluster_size=40, min_cluster_size=2),
            ExactSettings(bet_rule=rule, bet_cap=None),
        )
        for part in np.array_split(np.arange(300), [3, 50, 51, 170]):
            test.update(x[0, part], n[0, part])
        times = exact_decision_times(x, DELTA, ALPHA, rule=rule, cap=float(size_adaptive_cap(2)), weights=n / 40)
        expected = min(times["pass"][0], times["regression"][0])
        assert test.state.decided_at_cluster == (None if expected == NEVER else expected), rule


def test_a_cluster_smaller_than_the_plan_is_refused():
    test = PairedSequentialTest(TestSettings(DELTA, ALPHA, min_cluster_size=5))
    with pytest.raises(ValueError, match="smaller than min_cluster_size=5"):
        test.update(np.array([0.0, 0.1]), np.array([5, 1]))


def test_ons_state_carries_across_batches():
    x = np.random.default_rng(1).normal(0.01, 0.05, 500).clip(-1, 1)
    whole = WealthFamily.start(np.array([-0.02, 0.0]), UPPER)
    whole.update(x, predictable_moments(x, MomentState()), rule="ons", cap_fraction=0.9, alpha=ALPHA, threshold_log=3.0)
    split = WealthFamily.start(np.array([-0.02, 0.0]), UPPER)
    state = MomentState()
    for chunk in np.array_split(x, [1, 77, 300]):
        split.update(
            chunk, predictable_moments(chunk, state), rule="ons", cap_fraction=0.9, alpha=ALPHA, threshold_log=3.0
        )
        state = state.advanced(chunk)
    np.testing.assert_allclose(split.log_wealth, whole.log_wealth, rtol=1e-12)
    assert np.all(whole.ons_bet <= 0.9 / (1 - np.array([0.02, 0.0])) + 1e-12)


# ----------------------------------------------------------------------------- cluster order
def grouped_files(rng, reps, scenes=200, size=8):
    """Files whose scenes are an i.i.d. sample (half the scenes 16 points worse for the candidate,
    half 12 points better: Delta exactly -0.02), listed worse half first -- grouped by difficulty as
    exported files often are. Returns (reps, scenes) cluster means."""
    worse = rng.random((reps, scenes)) < 0.5
    effect = np.where(worse, -0.16, 0.12)
    base = 0.8
    u = rng.random((reps, scenes, size))
    baseline = u < base
    candidate = u < base + effect[..., None]
    x = (candidate.astype(np.int8) - baseline.astype(np.int8)).mean(axis=2)
    order = np.argsort(~worse, axis=1, kind="stable")  # the worse scenes first
    return np.take_along_axis(x, order, axis=1)


def test_a_file_grouped_worse_first_gives_false_alarms_unless_shuffled():
    """Read in file order, the e-process sees the worse half first and certifies a regression (and
    a catastrophic one) that the stratum's mean does not have; shuffled with the gauntlet's seeded
    permutation, the false-alarm rate is within alpha."""
    reps = 1000
    x = grouped_files(np.random.default_rng(400), reps)
    cap = float(size_adaptive_cap(8))
    as_given = exact_decision_times(x, DELTA, ALPHA, rule="blend", cap=cap, alarm_alpha=ALPHA / 7)
    halts_as_given = exact_decision_times(x, 0.05, ALPHA, rule="blend", cap=cap, alarm_alpha=ALPHA / 7)["regression"]
    assert cp_lower(int((as_given["regression"] < NEVER).sum()), reps) > 0.9  # the defect, measured
    assert cp_lower(int((halts_as_given < NEVER).sum()), reps) > 0.9
    shuffled = np.stack([row[cluster_permutation(row.size, seed, "safety_critical")] for seed, row in enumerate(x)])
    counts = false_decisions(exact_decision_times(shuffled, DELTA, ALPHA, rule="blend", cap=cap))
    assert max(cp_lower(c, reps) for c in counts.values()) <= ALPHA, counts
    halts = exact_decision_times(shuffled, 0.05, ALPHA, rule="blend", cap=cap, alarm_alpha=ALPHA / 7)["regression"]
    assert int((halts < NEVER).sum()) == 0


def _grouped_file_table(x_row, path, stratum="safety_critical", size=8, seed=0):
    """One grouped file on disk: paired rows whose cluster means are x_row (scenes in file order)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, mean in enumerate(x_row):
        k = int(round(mean * size))  # net candidate-minus-baseline successes in the scene
        baseline = np.ones(size, int)
        candidate = np.ones(size, int)
        baseline[: max(k, 0)] = 0
        candidate[: max(-k, 0)] = 0
        idx = rng.permutation(size)
        for i in range(size):
            rows.append((stratum, f"s{c}-{i}", f"scene-{c}", baseline[idx[i]], candidate[idx[i]]))
    pd.DataFrame(rows, columns=["stratum", "scenario_id", "cluster_id", "baseline", "candidate"]).to_csv(
        path, index=False
    )


def test_the_gauntlet_shuffles_clusters_and_records_the_order(tmp_path):
    """Through FileOutcomes and the scheduler: the grouped file halts the candidate when read as
    given, and does not when tested order-free (the default for a file); what was done is recorded."""
    x = grouped_files(np.random.default_rng(401), 1)[0]
    path = tmp_path / "grouped.csv"
    _grouped_file_table(x, path)
    for order, halted in (("as_given", True), ("shuffled", False)):
        settings, strata, _ = typed_gauntlet(
            compose_config([f"gauntlet.cluster_order={order}", "gauntlet.preflight=off"])
        )
        source = FileOutcomes(str(path))
        source.validate(strata, {})
        only = {"safety_critical": strata["safety_critical"]}
        result = run_gauntlet(settings, only, {}, source, ArrayCache(tmp_path, enabled=False), VALID_LINEAGE).to_json()
        s = result["strata"][0]
        assert result["halted"] is halted, (order, s["decision"], s["delta_estimate"])
        assert s["cluster_order"]["mode"] == ("as_given" if order == "as_given" else "order_free")
        if order == "shuffled":  # no order is chosen: the clusters' canonical digest seeds 16 fixed orders
            assert s["cluster_order"]["orders"] == 16 and "canonical digest" in s["cluster_order"]["basis"]


# ----------------------------------------------------------------------------- catastrophic halt
def test_the_halt_is_decided_on_its_own_confidence_sequence_and_quotes_the_crossing():
    """At every simulated halt the one-sided upper bound at the halt's level is at or below
    -catastrophic_delta, and the wealth quoted is the e-process's at the crossing cluster (not at
    the end of the batch), at or above 1 / catastrophic_alpha."""
    rng = np.random.default_rng(9)
    halts = 0
    for effect in np.linspace(-0.12, -0.05, 15):
        x = realistic_cluster_means(rng, 1, 400, 20, effect)[0]
        test = PairedSequentialTest(
            TestSettings(DELTA, ALPHA, catastrophic_delta=0.05, alarm_alpha=ALPHA / 7, min_cluster_size=20)
        )
        for part in np.array_split(x, 5):  # batches of 80 clusters: crossings fall mid-batch
            test.update(part, np.full(part.size, 20))
        snap = test.state.to_json()
        if snap["catastrophic"] != CATASTROPHIC:
            continue
        halts += 1
        at = snap["catastrophic_at_cluster"]
        bound = snap["catastrophic_bound"]
        trajectory = test.trajectory()
        assert bound["upper_bound_at_decision"] <= -0.05 + 1e-12
        assert trajectory["catastrophic_upper"][at - 1] == bound["upper_bound_at_decision"]
        assert at == 1 or trajectory["catastrophic_upper"][at - 2] > -0.05  # the first cluster that certified it
        assert bound["wealth_at_decision"] == pytest.approx(trajectory["e_value_catastrophic"][at - 1])
        assert bound["wealth_at_decision"] >= 1 / snap["catastrophic_alpha"]
        assert bound["level"] == pytest.approx(1 - min(ALPHA / 2, ALPHA / 7))
    assert halts >= 8


def test_decision_margins_must_lie_on_the_confidence_grid():
    with pytest.raises(ValueError, match="catastrophic_delta=0.05 is not a multiple of cs_grid_step=0.003"):
        PairedSequentialTest(TestSettings(0.021, ALPHA, catastrophic_delta=0.05, cs_grid_step=0.003))
    settings, strata, effects = typed_gauntlet(
        compose_config(["gauntlet.cs_grid_step=0.003", "gauntlet.margin_delta=0.021"])
    )
    from vlaeval.config import UserInputError

    with pytest.raises(
        UserInputError, match=r"gauntlet.catastrophic_delta=0.05 is not a multiple of gauntlet.cs_grid_step=0.003"
    ):
        validate_gauntlet(settings, strata, effects)


def test_alarms_including_the_halt_control_the_family_wise_error():
    """Six strata, one halting, each at its alarm boundary (REGRESSION: Delta = -delta; the halt:
    Delta = -catastrophic_delta): P(any false alarm) <= alpha with the split over 6 + 1 alarms."""
    rng = np.random.default_rng(106)
    k, reps = 6, REPS
    alarm = ALPHA / (k + 1)
    regression = realistic_cluster_means(rng, reps * k, 300, 10, -DELTA).reshape(reps * k, 300)
    reg_times = exact_decision_times(regression, DELTA, ALPHA, rule="blend", cap=0.98, alarm_alpha=alarm)["regression"]
    halting = realistic_cluster_means(rng, reps, 300, 10, -0.05)
    halt_times = exact_decision_times(halting, 0.05, ALPHA, rule="blend", cap=0.98, alarm_alpha=min(ALPHA / 2, alarm))[
        "regression"
    ]
    any_false = (reg_times.reshape(reps, k) < NEVER).any(axis=1) | (halt_times < NEVER)
    assert cp_lower(int(any_false.sum()), reps) <= ALPHA


def test_scheduler_splits_the_alarm_level_over_regressions_and_halts():
    settings, strata, effects = typed_gauntlet(compose_config(["effects=distribution_shift_regression"]))
    validate_gauntlet(settings, strata, effects)
    result = run_gauntlet(
        settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False), VALID_LINEAGE
    ).to_json()
    alarms = len(strata) + sum(s.catastrophic_halt for s in strata.values())
    assert alarms == 7
    assert result["multiplicity"]["alarm_alpha"] == pytest.approx(settings.alpha / alarms)
    assert "catastrophic halt" in result["multiplicity"]["alarms"]
    assert all(s["alarm_alpha"] == pytest.approx(settings.alpha / alarms) for s in result["strata"])
    assert "intersection-union" in result["recommendation"]["rule"]
    assert result["recommendation"]["recommendation"] != "LAUNCH"  # one regression blocks launch


# ----------------------------------------------------------------------------- approximate modes
def test_asymptotic_mode_is_labelled_and_waits_for_its_burn_in():
    x = realistic_cluster_means(np.random.default_rng(3), 1, 200, 20, 0.0)[0]
    test = AsymptoticSequentialTest(TestSettings(DELTA, ALPHA), AsymptoticSettings(burn_in_clusters=40))
    test.update(x[:39], np.full(39, 20))
    assert test.state.decision == DECISION_INSUFFICIENT and (
        test.state.confidence_sequence.lower,
        test.state.confidence_sequence.upper,
    ) == (-1.0, 1.0)
    test.update(x[39:], np.full(161, 20))
    snap = test.state.to_json()
    assert snap["test_mode"] == "asymptotic" and "ASYMPTOTIC" in snap["confidence_sequence"]["kind"]
    assert snap["decision"] == "PASS" and snap["decided_at_cluster"] >= 40
    assert snap["e_value_pass"] is None  # no e-values to misread


def test_asymptotic_mode_is_invalid_on_the_skewed_null_which_is_why_it_is_opt_in(skewed_null):
    times = asymptotic_decision_times(skewed_null, DELTA, ALPHA, burn_in_clusters=30, tuning_clusters=500)
    assert cp_lower(int((times["regression"] < NEVER).sum()), REPS) > ALPHA


@pytest.mark.parametrize("mode", ["asymptotic", "group_sequential"])
def test_approximate_modes_need_review_and_say_so(mode):
    settings, strata, effects = typed_gauntlet(compose_config([f"gauntlet.test_mode={mode}"]))
    validate_gauntlet(settings, strata, effects)
    result = run_gauntlet(
        settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False), VALID_LINEAGE
    ).to_json()
    label = mode.upper().replace("_", "-")
    assert result["test_mode"] == mode and label in result["statistical_validity"]
    assert result["recommendation"]["recommendation"] == NEEDS_REVIEW
    assert any(label in r for r in result["recommendation"]["review_reasons"])
    assert all(label in s["confidence_sequence"]["kind"] for s in result["strata"])


def test_simulation_generator_matches_the_gauntlets():
    """The harness's realistic generator is the gauntlet's synthetic one, vectorised."""
    from vlaeval.config import StratumConfig

    spec = StratumConfig(units=400_000, base_rate=0.9, cluster_size=20)
    o = synthetic_paired_outcomes("check", spec, -0.01, 3)
    gauntlet_means = cluster_means(o.candidate.astype(float) - o.baseline, o.cluster_sizes)
    sim = realistic_cluster_means(np.random.default_rng(0), 1, 20_000, 20, -0.01)[0]
    assert sim.mean() == pytest.approx(gauntlet_means.mean(), abs=0.002)
    assert sim.std() == pytest.approx(gauntlet_means.std(), rel=0.05)
    # Unequal sizes: each cluster's mean is over its own units only.
    sizes = np.random.default_rng(1).integers(1, 30, size=(1, 20_000))
    unequal = realistic_cluster_means(np.random.default_rng(2), 1, 20_000, sizes, -0.01)[0]
    assert np.all(np.abs(unequal * sizes[0] - np.round(unequal * sizes[0])) < 1e-9)
    assert unequal.mean() == pytest.approx(-0.01, abs=0.003)


# ----------------------------------------------------------------------------- planner
def test_default_configs_pass_their_own_preflight():
    for overrides in ([], ["strata=small"]):
        settings, strata, _ = typed_gauntlet(compose_config(overrides))
        plan = plan_gauntlet(settings, strata, assumed_effect=0.0, replications=200)
        assert plan.ok, plan.warnings
        assert all(r.decision_probability_within_limit >= 0.9 for r in plan.strata)


def test_plan_warns_when_a_stratum_cannot_decide():
    settings, strata, _ = typed_gauntlet(compose_config(["gauntlet.margin_delta=0.005"]))
    plan = plan_gauntlet(settings, strata, assumed_effect=0.0, replications=100)
    assert not plan.ok
    assert any(w.startswith("nominal:") for w in plan.warnings)
    # Planned clusters agree with a real gauntlet run of the same stratum (within simulation noise).
    row = next(r for r in plan.strata if r.stratum == "safety_critical")
    assert 500 < row.median_clusters < 800
    # result.json's layout is the record's: written and read back whole
    assert type(plan).from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_the_planners_regression_floor_uses_the_alarm_level():
    settings, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    worse = plan_gauntlet(settings, strata, assumed_effect=-0.06, replications=40)
    row = worse.strata[0]
    assert row.expected_decision == "REGRESSION" and worse.alarm_alpha == pytest.approx(ALPHA / 7)
    from vlaeval.seqtest.simulation import information_floor

    reference = realistic_cluster_means(np.random.default_rng(0), 1, 20_000, 20, -0.06, base_rate=0.9)[0]
    at_alarm = information_floor(reference, DELTA, ALPHA / 7)
    at_alpha = information_floor(reference, DELTA, ALPHA)
    assert row.floor_clusters == pytest.approx(at_alarm, rel=0.1) and row.floor_clusters > 1.3 * at_alpha


def test_job_plan_and_preflight_error_from_the_command_line(workdir):
    done = run_main(["job=plan", "tracking=disabled"], workdir)
    assert done.returncode == 0, done.stderr
    assert "every stratum can reach a decision" in done.stdout and "safety_critical" in done.stdout
    refused = run_main(
        ["job=gauntlet", "gauntlet.preflight=error", "gauntlet.margin_delta=0.005", "tracking=disabled"], workdir
    )
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pre-flight:") and "strata." in lines[0]
    assert not list((workdir / "outputs").glob("*_gauntlet"))  # nothing written for the refused run
    warned = run_main(
        ["job=gauntlet", "gauntlet.margin_delta=0.005", "strata=small", "tracking=disabled", "gauntlet.plot=false"],
        workdir,
    )
    assert warned.returncode == 0, warned.stderr
    assert "warning: pre-flight: safety_critical: only 0% of simulated runs decide" in warned.stderr
    assert "error" not in warned.stderr  # a warning is not an error: the run went on
