"""What the training comparison rests on: every arm ends at the same compute (train.budget_samples),
what a learning rate is chosen on never shares a scene with what is reported (validation and test
halves of the held-out scenes), and the realised second-moment ratio is the quantity it names."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.configs import AUDIT_SMALL, compose_config, for_job
from helpers.reliability import record_outcome
from vlaeval.audit.proposals import Proposal, per_sample_second_moment, time_bin
from vlaeval.config import EvaluateConfig, TrainConfig
from vlaeval.envs.episodes import held_out_split
from vlaeval.envs.metaworld import HELD_OUT_VARIANTS
from vlaeval.errors import UserInputError
from vlaeval.policy.builtin import PolicySpec, obtain_policy, prepare_data
from vlaeval.policy.training import learning_rate_schedule
from vlaeval.residual.ablation import anchor_gradients, realised_second_moment_ratio
from vlaeval.rollouts.engine import held_out_episodes

BASE = [*for_job("train", AUDIT_SMALL), "job=train", "train.evaluate_after=false", "tracking=disabled"]
PROBES = [
    "train.heldout_every=10",
    "train.heldout_episodes_per_task=1",
    "train.heldout_scenes=test",
    "train.validation_scenes=validation",
    "train.second_moment_anchors=32",
]
BUDGET = 32 * 60  # pairs: 60 steps of AUDIT_SMALL's batch of 32


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def train(tmp_path, cache, overrides, name):
    from vlaeval.jobs import dispatch

    cfg = compose_config([*BASE, *overrides], output_dir=tmp_path / name, cache_dir=cache)
    dispatch(cfg, list(overrides))
    result = json.loads((tmp_path / name / "result.json").read_text())
    return result["train"], result["checkpoint_sha256"]


def test_every_arm_ends_at_the_same_compute_and_the_schedule_with_it(tmp_path, cache):
    """Under train.budget_samples: uniform at batch 32 trains budget / 32 steps, 1.5x the batch 2/3 of
    them, and the residual arm what its scoring's counted FLOPs leave; each run's work (scoring plus
    its steps) is the budget's to within one step."""
    budget = [f"train.budget_samples={BUDGET}", "estimator.samples_per_estimator=8"]
    arms = {
        "uniform": [],
        "large_batch": ["+arm=uniform_large_batch", "train.batch_size=48"],
        "residual": ["+arm=adaptive_time_residual"],
    }
    runs = {name: train(tmp_path, cache, [*budget, *extra], name)[0] for name, extra in arms.items()}
    assert runs["uniform"]["steps"] == 60 and runs["large_batch"]["steps"] == 40
    per_pair = runs["uniform"]["step_gflop"] / 32
    assert runs["large_batch"]["step_gflop"] / 48 == pytest.approx(per_pair)
    scoring = runs["residual"]["gflop_before"]
    assert scoring > 0 and runs["uniform"]["gflop_before"] == 0
    assert runs["residual"]["steps"] == int((BUDGET - scoring / per_pair) // 32) < 60
    for run in runs.values():
        work = run["gflop_before"] + run["steps"] * run["step_gflop"]
        assert BUDGET * per_pair - run["step_gflop"] < work <= BUDGET * per_pair * (1 + 1e-9)


def test_the_schedule_ends_where_the_budget_does():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = learning_rate_schedule(optimizer, TrainConfig(steps=100, warmup_steps=2), steps=10)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:2] == pytest.approx([0.5, 1.0]) and rates[-1] == pytest.approx(0.5 * (1 + np.cos(np.pi * 7 / 8)))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0)


def test_validation_test_and_evaluation_scenes_are_disjoint_halves_of_the_held_out_ones(cache):
    cfg = compose_config(BASE, cache_dir=cache)
    from vlaeval.runs import load_heldout_data

    variants = {
        split: set(load_heldout_data(cfg, 4, split).demonstrations.episode_variant.tolist())
        for split in ("validation", "test")
    }
    assert variants["validation"] <= set(range(25, 37)) and variants["test"] <= set(range(37, 50))
    assert held_out_split(HELD_OUT_VARIANTS, "held_out") == HELD_OUT_VARIANTS
    tasks = list(cfg.data.tasks)
    for split, scenes in (("validation", range(25, 37)), ("test", range(37, 50)), ("held_out", range(25, 50))):
        episodes, used = held_out_episodes(tasks, EvaluateConfig(episodes_per_task=30, scenes=split))
        assert used == scenes and {e.variant for e in episodes} == set(scenes)


def test_what_is_measured_along_the_way_leaves_the_run_untouched(tmp_path, cache):
    """The probes (validation and test curves, the realised ratio) read the run, never its draws:
    the same weights as a run without them. Uniform draws realise a ratio of exactly 1; the adaptive
    sampler's moves off 1 once its warmup is over."""
    plain = train(tmp_path, cache, [], "plain")
    probed = train(tmp_path, cache, PROBES, "probed")
    assert probed[1] == plain[1]
    run = probed[0]
    steps = [s for s, _, _ in run["heldout_curve"]]
    assert steps == [s for s, _, _ in run["validation_curve"]] == [s for s, _ in run["second_moment_curve"]]
    assert [x for _, _, x in run["heldout_curve"]] != [x for _, _, x in run["validation_curve"]]
    assert all(m == 1.0 for _, m in run["second_moment_curve"])
    adaptive = train(tmp_path, cache, [*PROBES, "+arm=adaptive_time", "train.time_warmup_steps=5"], "adaptive")[0]
    assert any(abs(m - 1.0) > 1e-3 for s, m in adaptive["second_moment_curve"] if s >= 10)
    # what MLflow shows of them: curves a user compares across a sweep's runs, the work done as a metric
    from vlaeval.jobs.train import training_view
    from vlaeval.policy.training import TrainingRun

    headline, curves = training_view(TrainingRun.from_json(adaptive))
    assert curves["train.validation_loss"] == [(s, x) for s, _, x in adaptive["validation_curve"]]
    assert curves["train.second_moment_ratio"] == [tuple(p) for p in adaptive["second_moment_curve"]]
    assert headline["train.gflop"] == pytest.approx(adaptive["steps"] * adaptive["step_gflop"])


@pytest.fixture(scope="module")
def policy(cache):
    cfg = compose_config(AUDIT_SMALL, cache_dir=cache)
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
    return data.bind(handle.model, cfg.flow), data.anchors


def skewed(n, rng):
    """An anchor proposal with most mass on a tenth of the anchors and flow-time bins far from uniform:
    weights from ~0.2 to ~5, where an inverted or misplaced weight shows."""
    q = np.full(n, 0.3 / n)
    q[rng.choice(n, size=max(1, n // 10), replace=False)] += 0.7 / max(1, n // 10)
    p = rng.dirichlet(np.full(8, 2.0))
    return q / q.sum(), 0.5 * p + 0.5 / 8


def test_the_realised_ratio_is_the_second_moment_of_draws_from_the_proposal(policy):
    """E_p[w^2 ||g||^2] / E_u[||g||^2], measured by drawing (anchor, flow time) from the proposal itself
    with exact per-sample norms, agrees with the ratio estimated on uniform draws -- within 4 standard
    errors, on a skewed proposal -- and with the audit's definition (per_sample_second_moment) on the
    same draws. The inverse-oracle proposal must come out above 1, the oracle below."""
    bound, anchors = policy
    n = len(anchors)
    rng = np.random.default_rng(7)
    q, p = skewed(n, rng)
    every = np.arange(n)
    key = ("test", "realised")
    estimated = realised_second_moment_ratio(
        bound, anchors, every, anchor_probabilities=q, time_bin_probabilities=p, key=key
    )
    # the audit's definition on the same anchors and draws
    grads = anchor_gradients(bound, anchors, trainable="all", draw_keys=[key], batch_size=256, stream="second-moment")
    audit = per_sample_second_moment(grads.sq_norms, grads.u, Proposal("p", q, p)) / per_sample_second_moment(
        grads.sq_norms, grads.u, Proposal("u", np.full(n, 1.0 / n))
    )
    assert estimated == pytest.approx(audit, rel=1e-9)
    # draws from the proposal itself: anchors from q, a bin from p and u uniform inside it
    draws = 40 * n
    index = rng.choice(n, size=draws, p=q)
    k = rng.choice(p.size, size=draws, p=p)
    u = (k + rng.random(draws)) / p.size
    assert np.array_equal(time_bin(u, p.size), k)
    s = exact_norms(bound, anchors, index, u, rng)
    w = (1.0 / p.size) / p[k] / (n * q[index])
    uniform = exact_norms(bound, anchors, rng.integers(0, n, draws), rng.random(draws), rng)
    direct = np.mean(w**2 * s) / np.mean(uniform)
    se = direct * np.sqrt(
        np.var(w**2 * s) / draws / np.mean(w**2 * s) ** 2 + np.var(uniform) / draws / np.mean(uniform) ** 2
    )
    assert abs(estimated - direct) < 4 * se, (estimated, direct, se)
    # the oracle anchor proposal (q ~ sqrt of each anchor's norm) buys; its inverse costs
    root = np.sqrt(grads.sq_norms[0])
    for proposal, side in ((root / root.sum(), -1), ((1 / root) / (1 / root).sum(), +1)):
        ratio = realised_second_moment_ratio(
            bound, anchors, every, anchor_probabilities=proposal, time_bin_probabilities=None, key=key
        )
        assert side * (ratio - 1.0) > 0.05


def exact_norms(bound, anchors, index, u, rng):
    from vlaeval.residual.gradients import PerSampleGradNorms, only_trainable

    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    out = []
    model = bound.model.eval()
    with only_trainable(model, "all") as parameters:
        norms = PerSampleGradNorms(model, parameters, bound.flow)
        for start in range(0, len(index), 1024):
            rows = index[start : start + 1024]
            t = torch.from_numpy(bound.flow.time_quantile(u[start : start + 1024]).astype(np.float32))
            noise = torch.from_numpy(rng.standard_normal((len(rows), *chunk)).astype(np.float32))
            s, _ = norms(bound.anchor_batch(anchors, rows), t, noise)
            out.append(s.double().numpy())
    return np.concatenate(out)


CASES = {
    "train.heldout_scenes='train' is not a held-out split": "the held-out curve on the training scenes",
    "train.validation_scenes=held_out and train.heldout_scenes=held_out share scenes": "a validation curve on the scenes it is reported on",
    "train.validation_scenes=test and train.heldout_scenes=test share scenes": "validation and held-out curves on the same half",
    "train.validation_scenes is measured at": "a validation curve with no held-out steps",
    "train.second_moment_anchors is measured at the held-out steps": "a second-moment ratio with no held-out steps",
    "train.second_moment_anchors=-1 must be >= 0": "a negative number of anchors for the second-moment ratio",
    "train.budget_samples=16 is less than one step of train.batch_size=32": "a compute budget smaller than one step",
    "train.budget_samples=64 leaves no training step once scoring every anchor spends": "a compute budget the residual arm's scoring alone exhausts",
    "evaluate.scenes='heldout' is not a held-out split": "an evaluation on scenes that are not a held-out split",
}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.heldout_scenes=train"], "train.heldout_scenes='train' is not a held-out split"),
        (
            ["train.heldout_every=10", "train.validation_scenes=held_out"],
            "train.validation_scenes=held_out and train.heldout_scenes=held_out share scenes",
        ),
        (
            ["train.heldout_every=10", "train.validation_scenes=test", "train.heldout_scenes=test"],
            "train.validation_scenes=test and train.heldout_scenes=test share scenes",
        ),
        (["train.validation_scenes=validation", "train.heldout_scenes=test"], "train.validation_scenes is measured at"),
        (["train.second_moment_anchors=16"], "train.second_moment_anchors is measured at the held-out steps"),
        (["train.second_moment_anchors=-1"], "train.second_moment_anchors=-1 must be >= 0"),
        (["train.budget_samples=16"], "train.budget_samples=16 is less than one step of train.batch_size=32"),
        (
            ["train.budget_samples=64", "+arm=adaptive_time_residual"],
            "train.budget_samples=64 leaves no training step once scoring every anchor spends",
        ),
        (["train.evaluate_after=true", "evaluate.scenes=heldout"], "evaluate.scenes='heldout' is not a held-out split"),
    ],
)
def test_bad_comparison_settings_are_one_line_errors_before_anything_is_written(tmp_path, cache, overrides, message):
    from vlaeval.jobs import dispatch

    cfg = compose_config([*BASE, *overrides], output_dir=tmp_path / "run", cache_dir=cache)
    with pytest.raises(UserInputError) as error:
        dispatch(cfg, list(overrides))
    assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)
    assert not (tmp_path / "run" / "model.pt").exists() and not (tmp_path / "run" / "result.json").exists()
    record_outcome(
        "training comparison",
        f"job=train: {CASES[message]}",
        f"one-line error before any training, nothing written: `{message} ...`",
        kind="bad input",
    )
