"""train.time_sampling=adaptive: the importance-weighted objective stays the policy's own (by Monte
Carlo on skewed and rare-event integrands, while the proposal moves, with a negative control), the
sampler settles where it is told, its weights stay bounded, training with it is seeded, and the
checkpoints cached before these settings existed keep their keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from helpers.configs import AUDIT_SMALL, compose_config, for_job
from helpers.processes import run_main
from vlaeval.choices import TimeSignal
from vlaeval.errors import UserInputError
from vlaeval.policy.builtin import PolicySpec, build_model, checkpoint_key, prepare_data, weight_train_settings
from vlaeval.policy.time_sampling import AdaptiveTimeSampler, validate_time_sampling
from vlaeval.policy.training import TrainingExtras, train_policy

ADAPTIVE = ["train.time_sampling=adaptive", "train.time_warmup_steps=5", "train.time_bins=8"]


def rare_event(u: np.ndarray) -> np.ndarray:
    """1 almost everywhere, 1000 on the lowest 1% of u: its integral is 0.99 + 10 = 10.99."""
    return np.where(u < 0.01, 1000.0, 1.0)


def skewed(u: np.ndarray) -> np.ndarray:
    """A heavy right tail: integral of exp(6u) over [0, 1) is (e^6 - 1) / 6."""
    return np.exp(6.0 * u)


INTEGRALS = {rare_event: 10.99, skewed: (np.exp(6.0) - 1.0) / 6.0}


@pytest.mark.parametrize("f", [rare_event, skewed], ids=["rare_event", "skewed"])
def test_weighted_draws_are_unbiased_while_the_proposal_moves_and_unweighted_ones_are_not(f):
    """200 steps of 64 draws, the sampler refreshed after each from a signal that pushes it far from
    uniform (and moves as it learns): the weighted mean of f over every draw is f's integral under
    the training distribution, within 4 standard errors, on both integrands. The same draws unweighted
    (the plausible bug: forgetting rho) must miss it by more."""
    rng = np.random.default_rng(0)
    sampler = AdaptiveTimeSampler(bins=10, decay=0.9, floor=0.1, warmup_steps=3)
    step_means, unweighted = [], []
    for _ in range(200):
        u, w = sampler.draw(rng, 64)
        step_means.append(np.mean(w * f(u)))
        unweighted.append(np.mean(f(u)))
        sampler.update(u, f(u) ** 2)  # the proposal chases f: most draws land where f is large
    assert not np.allclose(sampler.probabilities(), 0.1)  # it did move
    truth = INTEGRALS[f]
    x = np.asarray(step_means)
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert abs(x.mean() - truth) < 4 * se, (x.mean(), truth, se)
    biased = np.mean(unweighted)
    assert abs(biased - truth) > 10 * se, (biased, truth, se)


def test_the_sampler_settles_at_the_root_of_each_bins_signal_mixed_with_its_floor():
    """A signal constant within each bin: after warm-up, p_k = (1 - floor) sqrt(c_k) / sum sqrt(c) + floor / K
    exactly (the moving average of a constant is the constant); squared_loss tracks c^2. Before every
    bin is seen and before warm-up ends it samples uniformly; no weight exceeds 1 / floor."""
    c = np.array([9.0, 1.0, 4.0, 0.25])
    for signal, tracked in ((TimeSignal.loss, c), (TimeSignal.squared_loss, c**2)):
        sampler = AdaptiveTimeSampler(bins=4, decay=0.5, floor=0.2, warmup_steps=3, signal=signal)
        sampler.update(np.array([0.1, 0.3]), np.array([9.0, 1.0]))  # bins 2 and 3 unseen
        sampler.update(np.array([0.1, 0.3]), np.array([9.0, 1.0]))
        sampler.update(np.array([0.1, 0.3]), np.array([9.0, 1.0]))
        assert np.allclose(sampler.probabilities(), 0.25)  # warm-up over, two bins unseen: still uniform
        sampler.update(np.array([0.6, 0.9, 0.05]), np.array([4.0, 0.25, 9.0]))
        root = np.sqrt(tracked)
        expected = 0.8 * root / root.sum() + 0.2 / 4
        assert np.allclose(sampler.probabilities(), expected, rtol=0, atol=1e-12)
        u, w = sampler.draw(np.random.default_rng(1), 10_000)
        assert w.max() <= 1.0 / 0.2 + 1e-12
        observed = np.bincount(np.minimum((u * 4).astype(int), 3), minlength=4) / u.size
        assert np.allclose(observed, expected, atol=0.015)


def test_anchor_weights_scale_the_signal_by_their_square():
    plain = AdaptiveTimeSampler(bins=2, decay=0.0, floor=0.5, warmup_steps=0)
    weighted = AdaptiveTimeSampler(bins=2, decay=0.0, floor=0.5, warmup_steps=0)
    plain.update(np.array([0.2, 0.7]), np.array([4.0, 1.0]))
    weighted.update(np.array([0.2, 0.7]), np.array([1.0, 1.0]), anchor_weights=np.array([2.0, 1.0]))
    assert np.allclose(plain.probabilities(), weighted.probabilities())


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.time_floor=0", "train.time_floor=0.0 must be in (0, 1]"),
        ("train.time_bins=1", "train.time_bins"),
        ("train.time_decay=1", "train.time_decay=1.0 must be in [0, 1)"),
    ],
)
def test_bad_adaptive_settings_are_one_line_errors(override, message):
    cfg = compose_config(["train.time_sampling=adaptive", override])
    with pytest.raises(UserInputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        validate_time_sampling(cfg.train)


def test_checkpoints_cached_before_the_new_train_settings_keep_their_keys():
    """At AdamW and the training distribution the key sees exactly the settings it saw before they
    existed; switching either on changes it, and a setting only the switched-off mode uses does not."""
    off = ["data=tiny", "train.warmup_steps=0", "train.grad_clip_norm=null", "train.ema_decay=null"]  # the recipe
    cfg = compose_config(off)
    before = {"steps", "batch_size", "learning_rate", "weight_decay", "seed"}
    assert set(weight_train_settings(cfg.train)) == before
    unused = compose_config([*off, "train.time_bins=4", "train.momentum=0.5", "train.threads=1"])
    assert weight_train_settings(unused.train) == weight_train_settings(cfg.train)
    for switch in (["train.optimizer=sgd"], ["train.time_sampling=adaptive"]):
        other = compose_config([*off, *switch])
        assert weight_train_settings(other.train) != weight_train_settings(cfg.train)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = compose_config([*AUDIT_SMALL, *ADAPTIVE], cache_dir=tmp_path_factory.mktemp("cache"))
    return cfg, prepare_data(cfg.data, str(cfg.paths.cache_dir))


def trained(cfg, data, **train):
    spec = PolicySpec.of(cfg)
    spec = PolicySpec(spec.model, spec.data, spec.flow, OmegaConf.merge(cfg.train, train))
    model = build_model(spec, data)
    metrics = train_policy(data.bind(model, cfg.flow), data.anchors, spec.train)
    return model, metrics


def test_adaptive_training_is_seeded_moves_its_bins_and_differs_from_uniform(tiny):
    cfg, data = tiny
    a, metrics = trained(cfg, data)
    b, again = trained(cfg, data)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert metrics.loss_curve == again.loss_curve
    sampling = metrics.time_sampling
    p = np.asarray(sampling["probabilities"])
    assert p.size == 8 and abs(p.sum() - 1) < 1e-12 and p.max() / p.min() > 1.1  # the loss varies with t
    assert sampling["max_weight"] <= 1 / cfg.train.time_floor + 1e-12
    assert [step for step, _ in sampling["history"]] == [step for step, _ in metrics.loss_curve]
    uniform, _ = trained(cfg, data, time_sampling="uniform")
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), uniform.state_dict().values()))
    sgd, sgd_metrics = trained(cfg, data, optimizer="sgd", learning_rate=0.05)
    assert np.isfinite(sgd_metrics.final_loss)
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), sgd.state_dict().values()))
    assert checkpoint_key(PolicySpec.of(cfg), data) != checkpoint_key(
        PolicySpec(cfg.model, cfg.data, cfg.flow, OmegaConf.merge(cfg.train, {"time_sampling": "uniform"})), data
    )


def test_job_train_with_the_adaptive_sampler_logs_its_bins(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_main(
        [
            "job=train",
            *for_job("train", AUDIT_SMALL),
            *ADAPTIVE,
            "train.evaluate_after=false",
            "tracking=disabled",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    sampling = result["train"]["time_sampling"]
    assert sampling["sampling"] == "adaptive" and sampling["signal"] == "loss" and len(sampling["probabilities"]) == 8
    bad = run_main(
        [
            "job=train",
            *for_job("train", AUDIT_SMALL),
            "train.time_sampling=adaptive",
            "train.time_floor=0",
            "tracking=disabled",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert bad.returncode == 2 and "train.time_floor=0.0 must be in (0, 1]" in bad.stderr


def test_a_comparison_run_draws_anchors_from_its_proposal_and_measures_held_out_loss_on_its_clock(tiny):
    """train_policy with TrainingExtras: the held-out loss at steps 0, every 10 and the last, against a
    clock that starts at the charged seconds and only rises; a proposal that puts most of its mass
    on a few anchors trains a different model than uniform sampling from the same seed."""
    cfg, data = tiny
    calls = []

    def heldout(model):
        calls.append(model.training)
        return float(len(calls))

    n = len(data.anchors)
    q = np.full(n, 0.2 / n)
    q[:8] += 0.8 / 8
    spec = PolicySpec(cfg.model, cfg.data, cfg.flow, OmegaConf.merge(cfg.train, {"time_sampling": "uniform"}))
    runs = {}
    for name, probabilities in (("proposal", q), ("uniform", None)):
        model = build_model(spec, data)
        extras = TrainingExtras(
            anchor_probabilities=probabilities, seconds_before=12.5, heldout=heldout, heldout_every=10
        )
        metrics = train_policy(data.bind(model, cfg.flow), data.anchors, spec.train, extras=extras)
        runs[name] = (model, metrics)
    curve = runs["proposal"][1].heldout_curve
    assert [step for step, _, _ in curve] == [0, 10, 20, 30, 40]
    clocks = [clock for _, clock, _ in curve]
    assert clocks[0] == 12.5 and all(b > a for a, b in zip(clocks, clocks[1:]))
    assert not any(calls)  # evaluated in eval mode
    a, b = runs["proposal"][0], runs["uniform"][0]
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_job_train_compares_from_a_checkpoint_with_the_residual_proposal_and_held_out_loss(tmp_path):
    """job=train from a trained checkpoint (train.init_from), anchors from the residual proposal and
    adaptive flow time: its held-out loss starts where the checkpoint is (below a fresh start's), the
    clock starts at the scoring time, and a missing init_from is a one-line error."""
    env = {"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")}
    base = [*for_job("train", AUDIT_SMALL), "job=train", "train.evaluate_after=false", "tracking=disabled"]
    first = run_main([*base, f"hydra.run.dir={tmp_path / 'first'}"], tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    comparison = [
        *ADAPTIVE,
        "train.anchor_sampling=residual",
        "train.heldout_every=20",
        "train.heldout_episodes_per_task=1",
        "estimator.samples_per_estimator=8",
    ]
    results = {}
    for name, start in (("from_checkpoint", [f"train.init_from={tmp_path / 'first' / 'model.pt'}"]), ("fresh", [])):
        proc = run_main([*base, *comparison, *start, f"hydra.run.dir={tmp_path / name}"], tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "result.json").read_text())["train"]
    curve = results["from_checkpoint"]["heldout_curve"]
    assert [step for step, _, _ in curve] == [0, 20, 40]
    assert curve[0][1] > 0  # the scoring time, charged before the first step
    assert curve[0][2] < results["fresh"]["heldout_curve"][0][2]
    bad = run_main([*base, f"train.init_from={tmp_path / 'none.pt'}"], tmp_path, env=env)
    assert bad.returncode == 2 and "train.init_from=" in bad.stderr and "is not a file" in bad.stderr
