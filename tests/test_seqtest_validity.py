"""The validity harness: Type-I error of every bet rule under continuous monitoring (a look after
every cluster), at the boundary Delta = -delta, on the gauntlet's realistic generator, on an
adversarial skewed null, with unequal cluster sizes and the scenario-weighted estimand; negative
controls that the harness must flag; the asymptotic mode; multiplicity; the planner.

Every rate is checked with the one-sided 95% Clopper-Pearson lower bound: a procedure fails when
even that bound exceeds alpha, so the assertions can fail (the negative controls show they do).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from conftest import compose_config, run_main, typed_gauntlet
from vlaeval.gauntlet import NEEDS_REVIEW, ArrayCache, SyntheticOutcomes, run_gauntlet, validate_gauntlet
from vlaeval.gauntlet.outcomes import synthetic_paired_outcomes
from vlaeval.gauntlet.planning import plan_gauntlet
from vlaeval.seqtest import (
    BET_RULES,
    CATASTROPHIC,
    DECISION_INSUFFICIENT,
    AsymptoticSequentialTest,
    PairedSequentialTest,
    cluster_means,
    size_adaptive_cap,
)
from vlaeval.seqtest.eprocess import LOWER, UPPER, MomentState, WealthFamily, predictable_moments
from vlaeval.seqtest.simulation import (
    NEVER,
    asymptotic_decision_times,
    exact_decision_times,
    realistic_cluster_means,
    skewed_null_cluster_means,
    unequal_cluster_means,
    unit_weighted_mean,
)

ALPHA, DELTA, REPS = 0.05, 0.02, 2000


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
    caps = size_adaptive_cap(n)
    for rule in BET_RULES:
        counts = false_decisions(exact_decision_times(x, DELTA, ALPHA, rule=rule, cap=caps, weights=weights))
        assert max(cp_lower(c, REPS) for c in counts.values()) <= ALPHA, (rule, counts)
    # The same data under the cluster estimand are not at the boundary (mean of cluster means
    # is about -0.007): that test PASSes most runs -- the two estimands really differ.
    cluster_mean_delta = float(np.mean(p_plus - p_minus))
    assert cluster_mean_delta > -DELTA / 2
    times = exact_decision_times(x, DELTA, ALPHA, rule="prpl", cap=caps)
    assert (times["pass"] < NEVER).mean() > 0.5


def test_cluster_estimand_is_valid_with_unequal_clusters():
    sizes = np.array([1, 5, 40])
    p_minus = np.array([0.03, 0.03, 0.03])
    p_plus = p_minus - DELTA  # every cluster at the boundary: the mean of cluster means is -delta
    x, n = unequal_cluster_means(np.random.default_rng(104), REPS, 400, sizes, p_plus, p_minus)
    counts = false_decisions(exact_decision_times(x, DELTA, ALPHA, rule="prpl", cap=size_adaptive_cap(n)))
    assert max(cp_lower(c, REPS) for c in counts.values()) <= ALPHA, counts


def test_sequential_test_object_matches_the_vectorised_harness():
    """The harness simulates exactly what PairedSequentialTest computes (unit estimand, ONS,
    size-adaptive caps, batches of any split)."""
    sizes, p_plus, p_minus = unequal_design()
    x, n = unequal_cluster_means(np.random.default_rng(5), 1, 300, sizes, p_plus, p_minus)
    for rule in BET_RULES:
        test = PairedSequentialTest(DELTA, ALPHA, bet_rule=rule, bet_cap=None, estimand="unit", max_cluster_size=40)
        for part in np.array_split(np.arange(300), [3, 50, 51, 170]):
            test.update_clusters(x[0, part], n[0, part])
        times = exact_decision_times(x, DELTA, ALPHA, rule=rule, cap=size_adaptive_cap(n), weights=n / 40)
        expected = min(times["pass"][0], times["regression"][0])
        assert test.snapshot()["decided_at_cluster"] == (None if expected == NEVER else expected), rule


def test_ons_state_carries_across_batches():
    x = np.random.default_rng(1).normal(0.01, 0.05, 500).clip(-1, 1)
    whole = WealthFamily.start(np.array([-0.02, 0.0]), UPPER)
    whole.update(x, predictable_moments(x, MomentState()), rule="ons", cap_fraction=0.9, alpha=ALPHA, threshold_log=3.0)
    split = WealthFamily.start(np.array([-0.02, 0.0]), UPPER)
    state = MomentState()
    for chunk in np.array_split(x, [1, 77, 300]):
        split.update(chunk, predictable_moments(chunk, state), rule="ons", cap_fraction=0.9, alpha=ALPHA,
                     threshold_log=3.0)
        state = state.advanced(chunk)
    np.testing.assert_allclose(split.log_wealth, whole.log_wealth, rtol=1e-12)
    assert np.all(whole.ons_bet <= 0.9 / (1 - np.array([0.02, 0.0])) + 1e-12)


def test_catastrophic_halt_is_decided_on_the_confidence_sequence():
    rng = np.random.default_rng(9)
    for effect in (-0.12, -0.07, -0.04):
        x = realistic_cluster_means(rng, 1, 400, 20, effect)[0]
        test = PairedSequentialTest(DELTA, ALPHA, catastrophic_delta=0.05, alarm_alpha=ALPHA / 6)
        for part in np.array_split(x, 40):
            test.update_clusters(part, np.full(part.size, 20))
            point = test.record_trajectory_point()
            if point["catastrophic"] == CATASTROPHIC:
                assert point["cs_upper"] < -0.05, (effect, point)
        if effect == -0.12:
            assert test.catastrophic_status() == CATASTROPHIC


def test_regression_alarms_control_the_family_wise_error():
    """Six strata at the boundary: P(any false REGRESSION) <= alpha with the Bonferroni split."""
    rng = np.random.default_rng(106)
    k = 6
    x = realistic_cluster_means(rng, REPS * k, 300, 10, -DELTA).reshape(REPS, k, 300)
    flat = x.reshape(REPS * k, 300)
    split = exact_decision_times(flat, DELTA, ALPHA, rule="prpl", cap=0.98, alarm_alpha=ALPHA / k)["regression"]
    any_false = int((split.reshape(REPS, k) < NEVER).any(axis=1).sum())
    assert cp_lower(any_false, REPS) <= ALPHA
    unsplit = exact_decision_times(flat, DELTA, ALPHA, rule="prpl", cap=0.98)["regression"]
    assert int((unsplit.reshape(REPS, k) < NEVER).any(axis=1).sum()) >= any_false


def test_scheduler_splits_the_alarm_level_and_launch_is_intersection_union():
    settings, strata, effects = typed_gauntlet(compose_config(["effects=distribution_shift_regression"]))
    validate_gauntlet(settings, strata, effects)
    result = run_gauntlet(settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False),
                          {"valid": True, "problems": []})
    assert result["multiplicity"]["alarm_alpha"] == pytest.approx(settings.alpha / len(strata))
    assert all(s["alarm_alpha"] == pytest.approx(settings.alpha / len(strata)) for s in result["strata"])
    assert "intersection-union" in result["recommendation"]["rule"]
    assert result["recommendation"]["recommendation"] != "LAUNCH"  # one regression blocks launch


def test_asymptotic_mode_is_labelled_and_waits_for_its_burn_in():
    x = realistic_cluster_means(np.random.default_rng(3), 1, 200, 20, 0.0)[0]
    test = AsymptoticSequentialTest(DELTA, ALPHA, burn_in_clusters=40)
    test.update_clusters(x[:39], np.full(39, 20))
    assert test.evaluate() == DECISION_INSUFFICIENT and test.confidence_sequence() == (-1.0, 1.0)
    test.update_clusters(x[39:], np.full(161, 20))
    snap = test.snapshot()
    assert snap["test_mode"] == "asymptotic" and "ASYMPTOTIC" in snap["confidence_sequence"]["kind"]
    assert snap["decision"] == "PASS" and snap["decided_at_cluster"] >= 40
    assert snap["e_value_pass"] is None  # no e-values to misread


def test_asymptotic_mode_is_invalid_on_the_skewed_null_which_is_why_it_is_opt_in(skewed_null):
    times = asymptotic_decision_times(skewed_null, DELTA, ALPHA, burn_in_clusters=30, tuning_clusters=500)
    assert cp_lower(int((times["regression"] < NEVER).sum()), REPS) > ALPHA


def test_asymptotic_gauntlet_needs_review_and_says_so(tmp_path):
    settings, strata, effects = typed_gauntlet(compose_config(["gauntlet.test_mode=asymptotic"]))
    validate_gauntlet(settings, strata, effects)
    result = run_gauntlet(settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False),
                          {"valid": True, "problems": []})
    assert result["test_mode"] == "asymptotic" and "ASYMPTOTIC" in result["statistical_validity"]
    assert result["recommendation"]["recommendation"] == NEEDS_REVIEW
    assert any("ASYMPTOTIC" in r for r in result["recommendation"]["review_reasons"])


def test_simulation_generator_matches_the_gauntlets():
    """The harness's realistic generator is the gauntlet's synthetic one, vectorised."""
    from vlaeval.config import StratumConfig

    spec = StratumConfig(units=400_000, base_rate=0.9, cluster_size=20)
    o = synthetic_paired_outcomes("check", spec, -0.01, 3)
    gauntlet_means = cluster_means(o.candidate.astype(float) - o.baseline, o.cluster_sizes)
    sim = realistic_cluster_means(np.random.default_rng(0), 1, 20_000, 20, -0.01)[0]
    assert sim.mean() == pytest.approx(gauntlet_means.mean(), abs=0.002)
    assert sim.std() == pytest.approx(gauntlet_means.std(), rel=0.05)


def test_default_configs_pass_their_own_preflight():
    for overrides in ([], ["strata=small"]):
        settings, strata, _ = typed_gauntlet(compose_config(overrides))
        plan = plan_gauntlet(settings, strata, assumed_effect=0.0, replications=200)
        assert plan["ok"], plan["warnings"]
        assert all(r["decision_probability_within_limit"] >= 0.9 for r in plan["strata"])


def test_plan_warns_when_a_stratum_cannot_decide():
    settings, strata, _ = typed_gauntlet(compose_config(["gauntlet.margin_delta=0.005"]))
    plan = plan_gauntlet(settings, strata, assumed_effect=0.0, replications=100)
    assert not plan["ok"]
    assert any(w.startswith("nominal:") for w in plan["warnings"])
    # Planned clusters agree with a real gauntlet run of the same stratum (within simulation noise).
    row = next(r for r in plan["strata"] if r["stratum"] == "safety_critical")
    assert 500 < row["median_clusters"] < 800


def test_job_plan_and_preflight_error_from_the_command_line(workdir):
    done = run_main(["job=plan", "tracking=disabled"], workdir)
    assert done.returncode == 0, done.stderr
    assert "every stratum can reach a decision" in done.stdout and "safety_critical" in done.stdout
    refused = run_main(["gauntlet.preflight=error", "gauntlet.margin_delta=0.005", "tracking=disabled"], workdir)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pre-flight:") and "strata." in lines[0]
    assert not list((workdir / "outputs").glob("*_gauntlet"))  # nothing written for the refused run
