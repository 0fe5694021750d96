"""The residual audit: statistics against closed forms and scipy, estimators' bias, the gate,
every input check, and the job end to end."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from scipy.stats import kendalltau, spearmanr

from helpers.configs import AUDIT_SMALL, builtin_policy, compose_config, for_job
from helpers.processes import run_main
from helpers.reliability import record_outcome
from helpers.runs import check_sweep, summary_of
from vlaeval.audit import alignment_audit, gate_decision, leave_one_out_robustness, repeatability
from vlaeval.audit.alignment import (
    Alignment,
    AlignmentReliability,
    BaselineComparison,
    PermutationControl,
    ProposalStatistics,
    ScoreAlignment,
    SharedDrawsLoss,
    cross_fitted_baseline,
    permutation_control,
    row_spearman,
)
from vlaeval.audit.statistics import (
    LeaveOneOut,
    Repeatability,
    information_to_baseline_ratio,
    oracle_ratio,
    proposal_distribution,
)
from vlaeval.data.anchors import draw
from vlaeval.residual.estimators import UNBIASED, score_anchors


def test_ratio_closed_forms():
    rng = np.random.default_rng(0)
    r = rng.lognormal(0, 1, 50)
    uniform = proposal_distribution(np.ones(50), alpha=0.2, percentile_epsilon=0.1)
    assert information_to_baseline_ratio(r, uniform) == pytest.approx(1.0, abs=1e-12)
    oracle = proposal_distribution(r, alpha=0.0, percentile_epsilon=0.0, proposal_power=1.0)
    assert information_to_baseline_ratio(r, oracle) == pytest.approx(r.sum() ** 2 / (50 * np.sum(r**2)), rel=1e-12)
    assert oracle_ratio(r) == pytest.approx(r.sum() ** 2 / (50 * np.sum(r**2)))
    fully_mixed = proposal_distribution(rng.lognormal(0, 2, 50), alpha=1.0, percentile_epsilon=0.1)
    assert information_to_baseline_ratio(r, fully_mixed) == pytest.approx(1.0, abs=1e-12)
    # Cauchy-Schwarz: no proposal beats the oracle
    for _ in range(20):
        q = proposal_distribution(rng.lognormal(0, 1, 50), alpha=0.1, percentile_epsilon=0.05)
        assert information_to_baseline_ratio(r, q) >= oracle_ratio(r) - 1e-12


def test_statistics_match_scipy_on_random_data():
    rng = np.random.default_rng(1)
    r = rng.lognormal(0, 1, 40)
    scores = r * rng.lognormal(0, 0.5, 40)
    losses = rng.lognormal(0, 1, 40)
    out = alignment_audit(
        scores, r, losses, alpha=0.2, percentile_epsilon=0.1, permutation_count=200, permutation_seed=3
    )
    assert out.spearman_residual_vs_gradient_rms == pytest.approx(spearmanr(scores, r).statistic)
    assert out.kendall_residual_vs_gradient_rms == pytest.approx(kendalltau(scores, r).statistic)
    assert out.training_loss_shared_draws.spearman_vs_gradient_rms == pytest.approx(spearmanr(losses, r).statistic)
    assert out.baseline_comparison is None  # no per-seed values given
    assert out.as_dict()["baseline_comparison"]["available"] is False
    assert Alignment.from_json(out.as_dict()) == out  # the saved layout reads back as the same result
    matrix = scores[None, :] * rng.lognormal(0, 0.3, (6, 40))
    rep = repeatability(matrix)
    assert rep.spearman == pytest.approx(spearmanr(matrix[:3].mean(0), matrix[3:].mean(0)).statistic)
    assert rep.spearman_brown_reliability == pytest.approx(2 * rep.spearman / (1 + rep.spearman))
    loo = leave_one_out_robustness(scores, r, alpha=0.2, percentile_epsilon=0.1)
    assert loo.spearman[7] == pytest.approx(spearmanr(np.delete(scores, 7), np.delete(r, 7)).statistic)
    q = proposal_distribution(np.delete(scores, 7), alpha=0.2, percentile_epsilon=0.1)
    assert loo.second_moment_ratios[7] == pytest.approx(float(information_to_baseline_ratio(np.delete(r, 7), q)))


def test_vectorised_permutations_equal_a_loop():
    rng = np.random.default_rng(2)
    r = rng.lognormal(0, 1, 30)
    scores = r * rng.lognormal(0, 1, 30)
    out = permutation_control(
        scores,
        r,
        alpha=0.2,
        percentile_epsilon=0.1,
        proposal_power=0.5,
        permutation_count=300,
        permutation_seed=11,
        keep_null_distributions=True,
    )
    perms = np.random.default_rng(11).permuted(np.tile(np.arange(30), (300, 1)), axis=1)
    loop_rho = np.array([spearmanr(scores[p], r).statistic for p in perms])
    np.testing.assert_allclose(out.null_spearman, loop_rho, atol=1e-12)
    loop_ratio = [
        information_to_baseline_ratio(
            r, proposal_distribution(scores[p], alpha=0.2, percentile_epsilon=0.1, proposal_power=0.5)
        )
        for p in perms
    ]
    np.testing.assert_allclose(out.null_second_moment, loop_ratio, rtol=1e-12)


def test_permutation_pvalues_are_in_range_and_monotone():
    rng = np.random.default_rng(3)
    r = rng.lognormal(0, 1, 40)
    noise = rng.lognormal(0, 1, 40)
    previous = None
    for strength in (0.0, 0.5, 1.0, 2.0, 4.0):  # stronger alignment -> larger rho -> smaller p
        scores = r**strength * noise
        out = permutation_control(
            scores, r, alpha=0.2, percentile_epsilon=0.1, proposal_power=1.0, permutation_count=2000, permutation_seed=5
        )
        p = out.one_sided_pvalue_rho_at_least_observed
        assert 0 < p <= 1 and 0 < out.one_sided_pvalue_second_moment_at_most_observed <= 1
        if previous is not None:
            assert p <= previous[1] or out.observed_spearman < previous[0]
        previous = (out.observed_spearman, p)
    assert previous[1] == pytest.approx(1 / 2001)


def test_permutation_pvalues_agree_with_scipys_permutation_test():
    """scipy.stats.permutation_test as the oracle (its own random permutations): both p-values agree
    within Monte Carlo error at a p-value in the middle of the range, where an off-by-one or a wrong
    side would show."""
    from scipy.stats import permutation_test

    rng = np.random.default_rng(21)
    r = rng.lognormal(0, 1, 40)
    scores = r**0.1 * rng.lognormal(0, 1, 40)
    kwargs = dict(alpha=0.2, percentile_epsilon=0.1, proposal_power=0.5)
    ours = permutation_control(scores, r, **kwargs, permutation_count=4000, permutation_seed=5)

    def ratio(x, y):
        return information_to_baseline_ratio(y, proposal_distribution(x, **kwargs))

    def check(p_ours: float, p_scipy: float) -> None:
        se = np.sqrt(p_scipy * (1 - p_scipy) * (1 / 4000 + 1 / 4000))
        assert 0.01 < p_scipy < 0.9 and abs(p_ours - p_scipy) < 4 * se + 1e-3, (p_ours, p_scipy)

    rho = permutation_test(
        (scores, r),
        lambda x, y: spearmanr(x, y).statistic,
        permutation_type="pairings",
        n_resamples=4000,
        alternative="greater",
        random_state=np.random.default_rng(6),
    )
    check(ours.one_sided_pvalue_rho_at_least_observed, rho.pvalue)
    second_moment = permutation_test(
        (scores, r), ratio, permutation_type="pairings", n_resamples=4000, alternative="less", random_state=7
    )
    assert second_moment.statistic == pytest.approx(ours.observed_second_moment_ratio)
    check(ours.one_sided_pvalue_second_moment_at_most_observed, second_moment.pvalue)


def test_paired_bootstrap_agrees_with_scipys_bootstrap():
    """scipy.stats.bootstrap (paired, percentile) as the oracle for the hand-vectorised paired
    bootstrap of cross_fitted_baseline: the same statistic (the fold-averaged Spearman difference,
    residual minus independent training loss) resampled over anchors; the 95% intervals agree
    within Monte Carlo error. Negative control: an unpaired resampling (scores and targets drawn
    independently) gives a different, wider interval, which the same tolerance must reject."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(4)
    seeds, n = 8, 60
    truth = rng.lognormal(0, 0.6, n)
    rms = truth * rng.lognormal(0, 0.3, (seeds, n))
    loss = truth**2 * rng.lognormal(0, 0.5, (seeds, n))
    scores = truth**2 * rng.lognormal(0, 0.25, n)
    kwargs = dict(alpha=0.2, percentile_epsilon=0.1, proposal_power=0.5)
    ours = cross_fitted_baseline(scores, rms, loss, **kwargs, bootstrap=6000, bootstrap_seed=3)
    half = seeds // 2
    a_rms = np.sqrt((rms[:half] ** 2).mean(axis=0))
    b_rms = np.sqrt((rms[half:] ** 2).mean(axis=0))
    a_loss, b_loss = loss[:half].mean(axis=0), loss[half:].mean(axis=0)

    def statistic(s, ta, tb, la, lb, axis=-1):
        fold1 = row_spearman(s, ta) - row_spearman(lb, ta)
        fold2 = row_spearman(s, tb) - row_spearman(la, tb)
        return (fold1 + fold2) / 2

    for _ in range(3):  # the vectorised row-wise Spearman is scipy's, row by row
        row = rng.integers(0, n, n)
        assert row_spearman(scores[row][None], a_rms[row][None])[0] == pytest.approx(
            spearmanr(scores[row], a_rms[row]).statistic, abs=1e-12
        )
    oracle = bootstrap(
        (scores, a_rms, b_rms, a_loss, b_loss),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=6000,
        method="percentile",
        random_state=np.random.default_rng(9),
    )
    low, high = oracle.confidence_interval
    width = high - low
    ours_low, ours_high = ours.spearman_difference_ci95
    assert abs(ours_low - low) < 0.08 * width and abs(ours_high - high) < 0.08 * width, (ours_low, ours_high, low, high)
    unpaired = rng.integers(0, n, (6000, n)), rng.integers(0, n, (6000, n))
    broken = statistic(
        scores[unpaired[0]], a_rms[unpaired[1]], b_rms[unpaired[1]], a_loss[unpaired[0]], b_loss[unpaired[0]]
    )
    b_low, b_high = np.quantile(broken, [0.025, 0.975])
    assert abs(b_low - low) > 0.08 * width or abs(b_high - high) > 0.08 * width


def _gate_inputs(n, rho_rep, rho_align, ratio):
    rep = Repeatability(rho_rep, 0.0, rho_rep, 0.0, 2 * rho_rep / (1 + rho_rep), 0.0, 0.0, 1.0, 0.1, 0.1)
    proposal = ProposalStatistics(ratio, 0.85, 0.5, 0.2, 0.1, 0.5, 10.0)
    alignment = Alignment(
        spearman_residual_vs_gradient_rms=rho_align,
        spearman_residual_vs_gradient_rms_pvalue_asymptotic=0.0,
        kendall_residual_vs_gradient_rms=rho_align,
        kendall_residual_vs_gradient_rms_pvalue_asymptotic=0.0,
        top25_overlap=0.6,
        proposal=proposal,
        raw_score_proposal=proposal,
        training_loss_shared_draws=SharedDrawsLoss(0.5, 0.5, 0.95),
        random_permutation_control=PermutationControl(500, 0, rho_align, ratio, 0.001, 0.001, (0, 0, 0), (1, 1, 1)),
        baseline_comparison=None,
        reliability=AlignmentReliability(None, None),
    )
    loo = LeaveOneOut((0.5,) * n, (0.9,) * n, 0.5, 0.9, True, True)
    return dict(sample_count=n, repeatability=rep, alignment=alignment, robustness=loo)


def test_gate_logic_and_derived_check_names():
    formal = compose_config(["gate=formal"]).gate
    ok = gate_decision(**_gate_inputs(64, 0.95, 0.7, 0.9), gate=formal)
    assert ok.passed and ok.eligible_for_500_step_ablation and ok.status == "formal_64_anchor_gate"
    assert "score_repeatability_spearman_at_least_0_90" in ok.checks and "sample_count_at_least_64" in ok.checks
    weak = gate_decision(**_gate_inputs(64, 0.89, 0.7, 0.9), gate=formal)
    assert not weak.passed and weak.checks["score_repeatability_spearman_at_least_0_90"] is False
    worse_than_uniform = gate_decision(**_gate_inputs(64, 0.95, 0.7, 0.99), gate=formal)
    assert not worse_than_uniform.checks["second_moment_ratio_at_most_0_98"]
    smoke = compose_config(["gate=smoke"]).gate
    small = gate_decision(**_gate_inputs(16, 0.95, 0.7, 0.9), gate=smoke)
    assert small.passed and not small.eligible_for_500_step_ablation
    assert small.status == "smoke_not_a_gate_certificate"
    custom = copy.deepcopy(formal)
    custom.score_gradient_spearman = 0.65
    assert (
        "score_gradient_spearman_at_least_0_65" in gate_decision(**_gate_inputs(64, 0.95, 0.7, 0.9), gate=custom).checks
    )


@pytest.fixture(scope="module")
def small_policy(tmp_path_factory):
    cfg = compose_config(
        AUDIT_SMALL, output_dir=tmp_path_factory.mktemp("out"), cache_dir=tmp_path_factory.mktemp("cache")
    )
    return (cfg, *builtin_policy(cfg))


@pytest.mark.parametrize("kind", [k for k, unbiased in UNBIASED.items() if unbiased])
def test_unbiased_estimators_agree_with_a_high_sample_iid_reference(small_policy, kind):
    cfg, data, handle = small_policy
    index, _ = draw(data.anchors, 6, 0)
    common = dict(samples_per_estimator=8, anchor_batch_size=6)
    reference = score_anchors(
        data.bind(handle.model, cfg.flow),
        data.anchors,
        index,
        kind="iid",
        seeds=list(range(50_000, 50_016)),
        **{**common, "samples_per_estimator": 512},
    )
    ref_mean = reference.estimator_residuals.mean(axis=0)
    ref_se = reference.sample_losses.transpose(1, 0, 2).reshape(6, -1).std(axis=1) / np.sqrt(16 * 512)
    estimate = score_anchors(
        data.bind(handle.model, cfg.flow), data.anchors, index, kind=kind, seeds=list(range(1, 401)), **common
    )
    est_mean = estimate.estimator_residuals.mean(axis=0)
    est_se = estimate.estimator_residuals.std(axis=0, ddof=1) / np.sqrt(400)
    z = (est_mean - ref_mean) / np.sqrt(est_se**2 + ref_se**2)
    assert np.all(np.abs(z) < 4.0), z


def test_midpoint_estimator_is_declared_biased_and_repeats_its_times(small_policy):
    cfg, data, handle = small_policy
    index, _ = draw(data.anchors, 3, 0)
    out = score_anchors(
        data.bind(handle.model, cfg.flow),
        data.anchors,
        index,
        kind="midpoint_antithetic",
        seeds=[1, 2],
        samples_per_estimator=8,
        anchor_batch_size=3,
    )
    assert not UNBIASED["midpoint_antithetic"]
    np.testing.assert_array_equal(out.time_values[0, 0], out.time_values[1, 2])  # fixed midpoints everywhere
    assert np.all(out.time_values[0, 0, ::2] == out.time_values[0, 0, 1::2])  # each time used by an antithetic pair


def test_batched_scoring_equals_one_anchor_at_a_time(small_policy):
    cfg, data, handle = small_policy
    index, _ = draw(data.anchors, 10, 0)
    kwargs = dict(kind="stratified", seeds=[1, 2, 3, 4], samples_per_estimator=8)
    batched = score_anchors(data.bind(handle.model, cfg.flow), data.anchors, index, anchor_batch_size=10, **kwargs)
    single = score_anchors(data.bind(handle.model, cfg.flow), data.anchors, index, anchor_batch_size=1, **kwargs)
    np.testing.assert_allclose(batched.estimator_residuals, single.estimator_residuals, rtol=1e-5)


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory):
    """One real audit run (small config) whose artifact the input-check tests mutate."""
    work = tmp_path_factory.mktemp("audit")
    env = {"VLAEVAL_CACHE_DIR": str(work / "cache")}
    grad = run_main(
        ["job=gradients", "tracking=disabled", *for_job("gradients", AUDIT_SMALL), f"hydra.run.dir={work / 'grad'}"],
        work,
        env=env,
    )
    assert grad.returncode == 0, grad.stderr[-3000:]
    audit = run_main(
        [
            "job=residual_audit",
            "tracking=disabled",
            *AUDIT_SMALL,
            f"audit.gradient_artifact={work / 'grad' / 'gradient_artifact.json'}",
            f"hydra.run.dir={work / 'audit'}",
        ],
        work,
        env=env,
    )
    assert audit.returncode == 0, audit.stderr[-3000:]
    return work, env, json.loads((work / "grad" / "gradient_artifact.json").read_text()), audit


def test_audit_job_end_to_end(audit_run):
    work, _, artifact, proc = audit_run
    result = json.loads((work / "audit" / "result.json").read_text())
    assert result["status"] == "smoke_not_a_gate_certificate" and result["sample_count"] == 16
    assert result["score_definition"]["estimator"] == "sobol" and result["score_definition"]["unbiased"]
    assert (
        result["gradient_artifact"]["checkpoint_sha256"] == artifact["checkpoint_sha256"] == result["checkpoint_sha256"]
    )
    assert len(result["anchors"][0]["estimator_residuals"]) == 4 and len(result["anchors"][0]["sample_losses"][0]) == 64
    assert [a["sampling_trace"] for a in result["anchors"]] == [a["sampling_trace"] for a in artifact["anchors"]]
    al = result["alignment"]
    assert {"spearman_residual_vs_gradient_rms", "top25_overlap", "training_loss_shared_draws", "reliability"} <= set(
        al
    )
    baseline = al["baseline_comparison"]
    assert baseline["seeds_per_half"] == 8 and "score_beats_training_loss" in baseline
    assert "score_beats_training_loss" in result["gate"]["informational"]  # gate=smoke: informational
    assert al["proposal"]["attainable_oracle_ratio"] >= al["proposal"]["oracle_ratio"] - 1e-12
    assert "APPROXIMATE" in al["reliability"].get("attenuation_correction", "APPROXIMATE")
    assert "baseline on independent draws" in proc.stdout
    assert al["random_permutation_control"]["permutation_count"] == 500
    assert set(result["gate"]["checks"]) == set(result["checks"]) and "Residual audit gate" in proc.stdout
    # The saved result reads back as the typed AuditResult it was written from, metrics and all.
    from vlaeval.audit.result import AuditResult

    typed = AuditResult.from_json(result)
    assert typed.to_json() == {k: result[k] for k in typed.to_json()}
    assert {k: v for k, v in typed.metrics().items() if not k.startswith("timing.")} == {
        k: result["metrics"][k] for k in typed.metrics() if not k.startswith("timing.")
    }
    assert typed.gate.exit_code == 13  # a smoke run: every check passed on too few anchors
    verdict = result["gate"]["verdict"]  # the ratio's three-way verdict on its two-level bootstrap
    assert verdict["verdict"] == "PASS" and verdict["high"] < verdict["threshold"]  # gate=smoke's threshold
    assert verdict["low"] <= verdict["ratio"] <= verdict["high"] and verdict["gradient_seeds"] == 16
    # r* from counted work: the dataset's anchors scored once against the planned run (train.steps=40 of 32).
    assert 0 < verdict["break_even_ratio"] < 1 and verdict["training_gflop"] > 0 and verdict["scoring_gflop"] > 0
    assert verdict["break_even_ratio"] == pytest.approx(1 / (1 + verdict["scoring_gflop"] / verdict["training_gflop"]))
    assert result["tags"]["gate.verdict"] == "PASS" and "verdict on the ratio: PASS" in proc.stdout
    memory = result["score_runtime"]
    assert memory["peak_rss_bytes"] > 10_000_000 and memory["scope"] == "sampled while this work ran"
    assert 0 <= memory["peak_rss_increase_bytes"] < memory["peak_rss_bytes"]  # scoring's own peak, not training's
    assert (work / "audit" / "residual_audit.png").stat().st_size > 10_000
    # The prediction's error from auditing these anchors, and where the gradient's noise is (the
    # artifact records each draw's flow time)
    low, high = al["proposal"]["ratio_interval"]
    assert low <= al["proposal"]["information_to_baseline_ratio"] <= high and al["proposal"]["ratio_bootstrap_sd"] > 0
    decomposition = result["noise_decomposition"]
    assert decomposition["anchors"] == 16 and decomposition["draws"] == 16 and decomposition["bins"] == 10
    assert abs(sum(decomposition["variance_shares"].values()) - 1) < 1e-9
    assert abs(sum(decomposition["second_moment_by_time_bin"]) - 1) < 1e-9
    assert len(artifact["anchors"][0]["per_seed"]["flow_time"]) == 16
    assert (work / "audit" / "noise_decomposition.png").stat().st_size > 10_000
    assert "where the gradient's noise is" in proc.stdout


def _bad_artifact(audit_run, mutate, name):
    work, _, artifact, _ = audit_run
    # A hand-edited artifact without vlaeval's own digest: the checks below must catch each edit.
    bad = mutate({k: v for k, v in copy.deepcopy(artifact).items() if k != "content_sha256"})
    path = work / f"{name}.json"
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    return path


BAD_AUDIT_INPUTS = {
    "fewer than 4 anchors": (lambda a: {**a, "anchors": a["anchors"][:3]}, [], "must contain at least four anchors"),
    "missing field": (
        lambda a: {**a, "anchors": [{k: v for k, v in x.items() if k != "gradient_rms"} for x in a["anchors"]]},
        [],
        "anchor 0 lacks gradient_rms",
    ),
    "non-finite gradient": (
        lambda a: json.dumps(a).replace(f'"gradient_rms": {a["anchors"][2]["gradient_rms"]}', '"gradient_rms": NaN', 1),
        [],
        "anchor 2 has gradient_rms=nan",
    ),
    "non-positive gradient": (
        lambda a: {**a, "anchors": [{**x, "gradient_rms": 0.0} for x in a["anchors"]]},
        [],
        "anchor 0 has gradient_rms=0.0; it must be finite and > 0",
    ),
    "truncated artifact": (lambda a: json.dumps(a)[:500], [], "is not valid JSON"),
    "checkpoint differs": (lambda a: {**a, "checkpoint_sha256": "0" * 64}, [], "differs from the gradient artifact's"),
    "seed overlap": (
        lambda a: a,
        ["estimator.seeds=[100,9301,9302,9303]"],
        "estimator.seeds overlap the gradient artifact's",
    ),
    "anchor not in the dataset": (
        lambda a: {**a, "anchors": [a["anchors"][0], {**a["anchors"][1], "frame": 99_999}, *a["anchors"][2:]]},
        [],
        "anchor 1 (episode",
    ),
    "trace mismatch": (
        lambda a: {
            **a,
            "anchors": [
                a["anchors"][0],
                {
                    **a["anchors"][1],
                    "sampling_trace": {
                        **a["anchors"][1]["sampling_trace"],
                        "base_index": a["anchors"][1]["sampling_trace"]["base_index"] + 1,
                    },
                },
                *a["anchors"][2:],
            ],
        },
        [],
        "sampling_trace base_index is",
    ),
    "task mismatch": (
        lambda a: {**a, "anchors": [{**a["anchors"][0], "task": "fold the laundry"}, *a["anchors"][1:]]},
        [],
        "the artifact says task 'fold the laundry'",
    ),
    "another dataset": (lambda a: {**a, "dataset_sha256": "1" * 64}, [], "indexes dataset 111111111111..."),
    "schema violation": (
        lambda a: {**a, "anchors": [{**a["anchors"][0], "episode": "first"}, *a["anchors"][1:]]},
        [],
        "does not follow docs/gradient_artifact.schema.json at anchors/0/episode",
    ),
    "old schema version": (
        lambda a: {**a, "schema_version": 1},
        [],
        "has schema_version 1; this vlaeval reads version 2",
    ),
    "anchor listed twice": (
        lambda a: {**a, "anchors": [a["anchors"][0], *a["anchors"][:-1]]},
        [],
        "lists 1 anchor(s) twice",
    ),
    "duplicate estimator seeds": (lambda a: a, ["estimator.seeds=[1,1,2,3]"], "estimator.seeds repeats [1]"),
    "odd estimator seed count": (lambda a: a, ["estimator.seeds=[1,2,3,4,5]"], "give an even number >= 4"),
    "too few estimator seeds": (lambda a: a, ["estimator.seeds=[1,2]"], "give an even number >= 4"),
    "odd samples per estimator": (lambda a: a, ["estimator.samples_per_estimator=7"], "must be an even number >= 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_AUDIT_INPUTS))
def test_bad_audit_input_is_one_line_and_writes_nothing(audit_run, case):
    work, env, _, _ = audit_run
    mutate, extra, needle = BAD_AUDIT_INPUTS[case]
    path = _bad_artifact(audit_run, mutate, case.replace(" ", "_"))
    before = set(work.rglob("*"))
    proc = run_main(
        ["job=residual_audit", "tracking=disabled", *AUDIT_SMALL, f"audit.gradient_artifact={path}", *extra],
        work,
        env=env,
    )
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert set(work.rglob("*")) == before
    area = "gradient artifacts" if not extra else "configs"
    record_outcome(area, case, f"exit 2, nothing written: `{lines[0]}`", kind="bad input")


@pytest.mark.slow
def test_reproduce_of_an_audit_gives_identical_numbers(audit_run):
    work, env, _, _ = audit_run
    rep = run_main(
        ["job=reproduce", "tracking=disabled", f"reproduce.run_id={work / 'audit'}", f"hydra.run.dir={work / 'rep'}"],
        work,
        env=env,
    )
    assert rep.returncode == 0, rep.stderr[-3000:]
    report = json.loads((work / "rep" / "reproduce.json").read_text())
    assert report["all_identical"], [c for c in report["comparisons"] if c["verdict"] != "identical"]
    assert any(c["key"] == "alignment.spearman_residual_vs_gradient_rms" for c in report["comparisons"])


@pytest.mark.slow
def test_audit_sweep_logs_gate_checks_and_a_summary_to_mlflow(audit_run, store):
    from mlflow.tracking import MlflowClient

    work, env, _, _ = audit_run
    artifact = work / "grad" / "gradient_artifact.json"
    proc = run_main(
        [
            "-m",
            "job=residual_audit",
            "estimator=iid,midpoint_antithetic",
            *AUDIT_SMALL,
            f"audit.gradient_artifact={artifact}",
            "audit.plot=false",
        ],
        work,
        env={**env, "MLFLOW_TRACKING_URI": store},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Sweep summary" in proc.stdout and "midpoint_antithetic" in proc.stdout
    client = MlflowClient(tracking_uri=store)
    sweep = check_sweep(client, "vlaeval-residual_audit", 2)
    children = sweep.children
    for child in children:
        gates = {k for k in child.data.metrics if k.startswith("gate.")}
        assert "gate.score_repeatability_spearman_at_least_0_50" in gates and len(gates) == 7
        assert child.data.tags["gate.pass"] in ("true", "false")
        assert "proposal.information_to_baseline_ratio" in child.data.metrics
        assert child.data.params["estimator.kind"] == child.data.tags["estimator.kind"]
    biased = [c for c in children if c.data.tags["estimator.kind"] == "midpoint_antithetic"][0]
    assert biased.data.tags["estimator.unbiased"] == "false"
    rows = summary_of(client, sweep, work)
    assert {r["estimator"] for r in rows} == {"iid", "midpoint_antithetic"} and all("ratio" in r for r in rows)
    assert all(r["failed checks"] for r in rows)  # one readable column of gate outcomes


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset,jobs,param",
    [("audit_seeds", 3, "estimator.seeds"), ("audit_samples", 5, "estimator.samples_per_estimator")],
)
def test_the_design_cards_sweeps_run_end_to_end(audit_run, migrated_store, tmp_path, preset, jobs, param):
    """+sweep=audit_seeds and +sweep=audit_samples as a user runs them (small): a FINISHED parent
    named after the preset, one child per value named after it, the swept value one param column,
    the summary logged with a row per child."""
    import shutil

    from mlflow.tracking import MlflowClient

    work, env, _, _ = audit_run
    db = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, db)
    store = f"sqlite:///{db}"
    artifact = work / "grad" / "gradient_artifact.json"
    proc = run_main(
        [
            f"+sweep={preset}",
            *AUDIT_SMALL,
            f"audit.gradient_artifact={artifact}",
            "audit.plot=false",
            "audit.permutations=200",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        work,
        env={**env, "MLFLOW_TRACKING_URI": store},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=store)
    sweep = check_sweep(client, "vlaeval-residual_audit", jobs, workdir=tmp_path)
    assert (
        sweep.parent.data.tags["vlaeval.sweep_preset"] == preset and preset in sweep.parent.data.tags["mlflow.runName"]
    )
    values = [child.data.params[param] for child in sweep.children]
    assert len(set(values)) == jobs, values  # one column shows what each child swept
    assert all(param.split(".")[-1] in c.data.tags["mlflow.runName"] for c in sweep.children)
    rows = summary_of(client, sweep, tmp_path)
    assert len(rows) == jobs and all(r["status"] == "FINISHED" for r in rows)


# ----------------------------------------------------------------------------- fair baselines
def _shared_noise_artifact(seed=0, anchors=64, seeds=64):
    """Per-seed gradient RMS and loss that share their (t, eps) noise, as a real artifact's do: a
    draw with a high loss also has a large gradient. Both depend on the anchor's true difficulty."""
    rng = np.random.default_rng(seed)
    difficulty = rng.lognormal(0, 0.5, anchors)
    draw = rng.lognormal(0, 0.8, (seeds, anchors))  # the shared per-draw factor (flow time, noise)
    loss = difficulty * draw
    rms = np.sqrt(difficulty) * draw**0.7 * rng.lognormal(0, 0.1, (seeds, anchors))
    return difficulty, rms, loss


def test_the_training_loss_baseline_is_scored_on_independent_draws():
    """On shared draws the loss looks better aligned than it is; cross-fitted over seed halves it is
    judged like any other score: its figure matches a loss drawn independently of the gradients."""
    difficulty, rms, loss = _shared_noise_artifact()
    residual = difficulty * np.random.default_rng(1).lognormal(0, 0.05, difficulty.size)
    out = cross_fitted_baseline(residual, rms, loss, alpha=0.2, percentile_epsilon=0.1, proposal_power=0.5)
    shared, fair = out.training_loss_shared_draws.spearman, out.training_loss.spearman
    assert shared > fair + 0.05, (shared, fair)
    # The fair figure equals what an independent set of loss draws gives against the same halves.
    independent = difficulty * np.random.default_rng(2).lognormal(0, 0.8, (64, 64))  # draws of their own
    half = 32
    target = np.sqrt(np.mean(rms[:half] ** 2, axis=0))
    reference = spearmanr(independent[:half].mean(axis=0), target).statistic
    assert fair == pytest.approx(reference, abs=0.12)
    assert out.spearman_difference == pytest.approx(out.residual.spearman - fair)
    low, high = out.spearman_difference_ci95
    assert low <= out.spearman_difference <= high
    rho_low, rho_high = out.spearman_difference_ci95
    ratio_low, ratio_high = out.second_moment_ratio_difference_ci95
    expected = "beats" if rho_low > 0 and ratio_high < 0 else "loses" if rho_high < 0 or ratio_low > 0 else "tie"
    assert out.verdict == expected and out.score_beats_training_loss == (expected == "beats")
    assert BaselineComparison.from_json(out.as_dict()) == out
    # With a noisier loss (8 draws a half), the anchors' true difficulty beats it; another loss of
    # the same quality, drawn independently, ties with it.
    kwargs = dict(alpha=0.2, percentile_epsilon=0.1, proposal_power=0.5)
    difficulty, rms, loss = _shared_noise_artifact(seed=5, anchors=128, seeds=16)
    assert cross_fitted_baseline(difficulty, rms, loss, **kwargs).verdict == "beats"
    same_quality = difficulty * np.random.default_rng(2).lognormal(0, 0.8, (8, 128)).mean(axis=0)
    assert cross_fitted_baseline(same_quality, rms, loss, **kwargs).verdict == "tie"


def test_the_attainable_oracle_is_cross_fitted_and_the_in_sample_one_optimistic():
    difficulty, rms, loss = _shared_noise_artifact(seed=3, seeds=16)
    out = cross_fitted_baseline(difficulty, rms, loss, alpha=0.2, percentile_epsilon=0.1, proposal_power=0.5)
    in_sample = np.mean([oracle_ratio(np.sqrt(np.mean(rms[h] ** 2, axis=0))) for h in (slice(0, 8), slice(8, 16))])
    assert out.attainable_oracle_ratio > in_sample  # noise it cannot know about makes it worse
    a, b = np.sqrt(np.mean(rms[:8] ** 2, axis=0)), np.sqrt(np.mean(rms[8:] ** 2, axis=0))
    expected = np.mean([information_to_baseline_ratio(a, b / b.sum()), information_to_baseline_ratio(b, a / a.sum())])
    assert out.attainable_oracle_ratio == pytest.approx(expected, rel=1e-12)


def test_strict_gate_requires_beating_the_training_loss_and_formal_reports_it():
    inputs = _gate_inputs(64, 0.95, 0.7, 0.9)
    loses = BaselineComparison(
        8, ScoreAlignment(0.6, 0.95), ScoreAlignment(0.7, 0.93), ScoreAlignment(0.8, 0.9), 0.92, -0.1, (-0.2, -0.01),
        0.02, (0.01, 0.03), 2000, 0, "loses",
    )  # fmt: skip
    inputs["alignment"] = dataclasses.replace(inputs["alignment"], baseline_comparison=loses)
    formal = gate_decision(**inputs, gate=compose_config(["gate=formal"]).gate)
    assert formal.passed and formal.informational == {"score_beats_training_loss": False}
    strict = gate_decision(**inputs, gate=compose_config(["gate=strict"]).gate)
    assert not strict.passed and strict.checks["score_beats_training_loss"] is False
    assert strict.preset == "strict" and "score_repeatability_spearman_at_least_0_90" in strict.checks
    inputs["alignment"] = dataclasses.replace(inputs["alignment"], baseline_comparison=None)
    assert (
        gate_decision(**inputs, gate=compose_config(["gate=strict"]).gate).checks["score_beats_training_loss"] is False
    )


@pytest.mark.parametrize("bad", [-0.1, np.nan, np.inf])
def test_negative_or_non_finite_scores_are_refused_by_the_proposal(bad):
    scores = np.linspace(0.1, 1.0, 20)
    scores[4] = bad
    with pytest.raises(ValueError, match="must be finite and >= 0; score .* at index 4"):
        proposal_distribution(scores, alpha=0.2, percentile_epsilon=0.1)
    with pytest.raises(ValueError, match="at index 4"):
        alignment_audit(
            scores,
            np.ones(20),
            np.ones(20),
            alpha=0.2,
            percentile_epsilon=0.1,
            permutation_count=10,
            permutation_seed=0,
        )


def test_sobol_points_use_full_double_precision():
    from vlaeval.residual.estimators import draw_pairs

    flow = compose_config().flow
    t, noise = draw_pairs("sobol", 3, 4, 16, (4, 4), flow)
    u = ((t - float(flow.time_offset)) / float(flow.time_scale)) ** float(flow.beta_a)  # back to the uniform
    on_lattice = np.abs(u * 2**30 - np.round(u * 2**30)) < 1e-6
    assert on_lattice.mean() < 0.05  # 30-bit points would all sit on the 2^-30 lattice


def test_a_given_artifact_and_checkpoint_that_disagree_are_refused_before_any_recording(audit_run, tmp_path):
    work, _, artifact, _ = audit_run
    [checkpoint] = (work / "cache" / "checkpoints").glob("*/model.pt")
    path = tmp_path / "other_checkpoint.json"
    path.write_text(
        json.dumps({**{k: v for k, v in artifact.items() if k != "content_sha256"}, "checkpoint_sha256": "0" * 64})
    )
    fresh = tmp_path / "fresh_cache"
    proc = run_main(
        [
            "job=residual_audit",
            "tracking=disabled",
            *AUDIT_SMALL,
            f"audit.gradient_artifact={path}",
            "checkpoint=path",
            f"checkpoint.path={checkpoint}",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(fresh)},
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "differs from the gradient artifact's" in lines[0], proc.stderr
    assert not fresh.exists()  # no demonstrations recorded, no policy trained


def test_the_audit_gate_can_block_ci(audit_run):
    """audit.exit_code_from_gate=true: 0 for a formal pass, 12 when a check fails, 13 for a smoke run
    (every check passed on too few anchors for a certificate); the result is saved either way."""
    from vlaeval.audit.result import GateDecision

    def exit_code(passed: bool, eligible: bool) -> int:
        return GateDecision({}, passed, eligible, "", "").exit_code

    assert (exit_code(True, True), exit_code(False, False), exit_code(True, False)) == (0, 12, 13)
    # With the ratio's verdict: it decides the ratio (its point check aside); the other checks still gate.
    import numpy as np

    from vlaeval.audit.verdict import ratio_verdict

    def with_verdict(replicates, others_pass=True, status="formal_64_anchor_gate") -> int:
        v = ratio_verdict(0.975, np.asarray(replicates), threshold=0.98, level=0.95, anchors=64, gradient_seeds=8)
        checks = {"second_moment_ratio_at_most_0_98": True, "top25_overlap_at_least_0_50": others_pass}
        return GateDecision(
            checks, True, True, status, "", verdict=v, ratio_check="second_moment_ratio_at_most_0_98"
        ).exit_code

    assert with_verdict(np.linspace(0.95, 0.97, 50)) == 0  # PASS, formal
    assert with_verdict(np.linspace(0.95, 0.97, 50), status="smoke_not_a_gate_certificate") == 13
    assert with_verdict(np.linspace(0.96, 0.99, 50)) == 14  # UNDECIDED
    assert with_verdict(np.linspace(0.985, 0.99, 50)) == 12  # FAIL
    assert with_verdict(np.linspace(0.95, 0.97, 50), others_pass=False) == 12
    work, env, _, _ = audit_run
    failing = run_main(
        [
            "job=residual_audit",
            "tracking=disabled",
            *AUDIT_SMALL,
            f"audit.gradient_artifact={work / 'grad' / 'gradient_artifact.json'}",
            "audit.exit_code_from_gate=true",
            "gate.score_gradient_spearman=0.999",
            f"hydra.run.dir={work / 'gate_fails'}",
        ],
        work,
        env=env,
    )
    assert failing.returncode == 12, failing.stderr[-2000:]
    saved = json.loads((work / "gate_fails" / "result.json").read_text())
    failed = [name for name, ok in saved["checks"].items() if not ok]
    assert not saved["gate"]["pass"] and any(name.startswith("score_gradient_spearman_at_least_") for name in failed)
