"""Built-in Meta-World data, anchors, the tiny VLA, checkpoints and per-sample gradients."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers.configs import REPO, compose_config
from helpers.processes import run_main
from helpers.reliability import record_outcome
from vlaeval.config import UserInputError
from vlaeval.data.anchors import TRACE_FIELDS, build_anchors, draw
from vlaeval.policy import FlowMatchingPolicy
from vlaeval.policy.builtin import PolicySpec, build_model, obtain_policy, prepare_data
from vlaeval.policy.checkpoint import load_state_dict
from vlaeval.policy.flow import sample_actions, sample_flow_time
from vlaeval.residual.gradients import (
    PerSampleGradNorms,
    gradient_draws,
    gradient_measurements,
    split_half_reliability,
)

SMALL = [
    "data=tiny",
    "model=tiny_vla_small",
    "train.steps=40",
    "train.batch_size=32",
    "train.log_every=10",
    "train.evaluate_after=false",
    "gradients.num_anchors=8",
    "gradients.seeds=${range:100,108}",
]
TRAINING = [a for a in SMALL if not a.startswith("gradients.")]  # job=train reads no gradients section


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    cfg = compose_config(SMALL, output_dir=tmp_path_factory.mktemp("out"), cache_dir=cache)
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    return cfg, data


def test_demonstrations_are_real_expert_episodes(small):
    cfg, data = small
    demos = data.demonstrations
    assert demos.tasks == ["reach-v3", "push-v3"] and len(demos.episode_length) == 6
    assert demos.observations.shape[1] == 39 and demos.actions.shape[1] == 4
    assert np.all(np.abs(demos.actions) <= 1.0)
    assert demos.episode_success.any()
    # an episode ends at success, or runs out of steps (data.max_steps=60 in data=tiny)
    assert np.all(demos.episode_length[~demos.episode_success] == 60)
    assert np.all(demos.episode_length[demos.episode_success] < 60)
    assert demos.instructions[1] == "push the puck to the goal"
    assert len(demos.manifest_sha256) == 64 and demos.manifest["steps"] == demos.observations.shape[0]
    again = prepare_data(cfg.data, str(cfg.paths.cache_dir))  # the cached build, verified against its manifest
    assert not again.built_now and again.demonstrations.manifest_sha256 == demos.manifest_sha256


def test_anchor_targets_are_masked_at_the_episode_end(small):
    _, data = small
    anchors = build_anchors(data.demonstrations, 4)
    last = data.demonstrations.episode_start[0] + data.demonstrations.episode_length[0] - 1
    assert anchors.target_mask[last].tolist() == [True, False, False, False]
    np.testing.assert_array_equal(anchors.target_actions[last, 1:], np.repeat(anchors.target_actions[last, :1], 3, 0))
    assert anchors.target_mask[0].all()
    np.testing.assert_array_equal(anchors.target_actions[0], data.demonstrations.actions[0:4])


def _order_in_subprocess(cache_dir):
    code = (
        "import json, sys; sys.path.insert(0, %r); from helpers.configs import compose_config; "
        "from vlaeval.policy.builtin import prepare_data; from vlaeval.data.anchors import draw; "
        "cfg = compose_config(%r, output_dir=%r, cache_dir=%r); d = prepare_data(cfg.data, str(cfg.paths.cache_dir)); "
        "idx, traces = draw(d.anchors, 20, 3); "
        "print(json.dumps({'sha': d.demonstrations.manifest_sha256, 'idx': idx.tolist(), 'traces': traces}))"
        % (str(REPO / "tests"), SMALL, str(cache_dir), str(cache_dir))
    )
    env = {**os.environ, "PYTHONHASHSEED": str(len(str(cache_dir)))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_manifest_and_anchor_order_are_identical_across_processes(tmp_path, small):
    _, data = small
    a = _order_in_subprocess(tmp_path / "a")  # each process records its own episodes from scratch
    b = _order_in_subprocess(tmp_path / "bb")
    assert a == b
    assert a["sha"] == data.demonstrations.manifest_sha256
    idx, traces = draw(data.anchors, 20, 3)
    assert a["idx"] == idx.tolist() and a["traces"] == traces
    assert set(traces[0]) == set(TRACE_FIELDS)
    assert (
        traces[0]["global_draw_id"] == 3 * len(data.anchors)
        and traces[1]["global_draw_id"] == traces[0]["global_draw_id"] + 1
    )


def test_policy_protocol_and_flow_convention(small):
    cfg, data = small
    model = build_model(PolicySpec.of(cfg), data)
    assert isinstance(model, FlowMatchingPolicy)
    t = sample_flow_time(np.random.default_rng(0), 100_000, cfg.flow)
    assert t.min() >= 0.001 and t.max() <= 1.0
    assert t.mean() == pytest.approx(0.001 + 0.999 * 1.5 / 2.5, abs=0.005)  # Beta(1.5, 1) mean 0.6
    batch = data.bind(model, cfg.flow).anchor_batch(data.anchors, np.arange(5))
    actions = sample_actions(model, model.encode(batch), 4, torch.Generator().manual_seed(0), cfg.flow)
    assert actions.shape == (5, 4, 4)


def test_training_twice_in_new_processes_gives_the_same_checkpoint(workdir):
    shas = []
    for name in ("one", "two"):
        proc = run_main(
            ["job=train", "tracking=disabled", *TRAINING, f"hydra.run.dir={workdir / name}"],
            workdir,
            env={"VLAEVAL_CACHE_DIR": str(workdir / f"cache-{name}")},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        sidecar = json.loads((workdir / name / "model.json").read_text())
        state = torch.load(workdir / name / "model.pt", weights_only=True)
        assert set(state) >= {"obs_mean", "action_head.0.weight"}
        shas.append(sidecar["sha256"])
        assert sidecar["manifest_sha256"] and sidecar["metrics"]["loss_curve"]
    assert shas[0] == shas[1]


def test_pickled_code_checkpoint_is_refused(workdir, tmp_path):
    evil = tmp_path / "evil.pt"
    torch.save({"weight": torch.zeros(2), "payload": os.system}, evil)
    proc = run_main(
        ["job=gradients", "tracking=disabled", *SMALL, "checkpoint=path", f"checkpoint.path={evil}"],
        workdir,
        env={"VLAEVAL_CACHE_DIR": str(workdir / "cache")},
    )
    assert proc.returncode == 2
    assert "holds pickled code or objects, refused" in proc.stderr
    assert not any((workdir / "outputs").glob("*")) if (workdir / "outputs").exists() else True
    with pytest.raises(UserInputError, match="pickled code"):
        load_state_dict(evil)
    record_outcome(
        "checkpoints",
        "checkpoint holding pickled code (os.system)",
        "exit 2: refused by weights-only loading, nothing written",
        kind="bad input",
    )


def test_modified_checkpoint_is_refused_and_builtin_retrains(small, tmp_path):
    cfg, data = small
    handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
    data_bytes = bytearray(handle.path.read_bytes())
    data_bytes[len(data_bytes) // 2] ^= 0x01
    handle.path.write_bytes(bytes(data_bytes))
    with pytest.raises(UserInputError, match="does not match the sha256"):
        load_state_dict(handle.path)
    again = obtain_policy(
        PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data
    )  # the builtin slot is recomputed, never trusted
    assert again.trained_now and again.sha256 == handle.sha256
    record_outcome(
        "checkpoints",
        "one bit flipped in a checkpoint",
        "refused: does not match the sha256 in its sidecar; the cached builtin one is retrained, same digest",
    )


@pytest.mark.parametrize("trainable", ["action_head", "all"])
def test_batched_gradient_norms_equal_a_per_sample_loop(small, trainable):
    cfg, data = small
    model = build_model(PolicySpec.of(cfg), data).double()
    index, _ = draw(data.anchors, 12, 0)
    batch = {
        k: (v.double() if v.is_floating_point() else v)
        for k, v in data.bind(model, cfg.flow).anchor_batch(data.anchors, index).items()
    }
    t, noise = gradient_draws(7, index.size, 4, 4, cfg.flow)
    params = list(model.trainable_parameters(trainable))
    for p in model.parameters():
        p.requires_grad_(any(p is q for q in params))
    norms = PerSampleGradNorms(model, params, cfg.flow)
    fast, fast_loss = norms(batch, t.double(), noise.double())
    slow, slow_loss = norms.loop(batch, t.double(), noise.double())
    np.testing.assert_allclose(fast.numpy(), slow.numpy(), rtol=1e-10)
    np.testing.assert_allclose(fast_loss.numpy(), slow_loss.numpy(), rtol=1e-12)


def test_gradient_rms_in_float32_matches_the_loop_to_1e5(small):
    cfg, data = small
    handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
    index, _ = draw(data.anchors, 8, 0)
    seeds = [1, 2, 3, 4]
    kwargs = dict(trainable="action_head", batch_size=16)
    policy = data.bind(handle.model, cfg.flow)
    fast = gradient_measurements(policy, data.anchors, index, seeds, **kwargs)
    slow = gradient_measurements(policy, data.anchors, index, seeds, method="loop", **kwargs)
    np.testing.assert_allclose(fast.rms(), slow.rms(), rtol=1e-5)


def test_split_half_reliability_is_high_for_consistent_anchors():
    rng = np.random.default_rng(0)
    truth = rng.lognormal(0, 1, 50)
    noisy = truth[None, :] * rng.lognormal(0, 0.1, (40, 50))
    assert split_half_reliability(noisy, 1).split_half_spearman > 0.95
    pure_noise = rng.lognormal(0, 1, (40, 50))
    assert abs(split_half_reliability(pure_noise, 1).split_half_spearman) < 0.4


def test_gradients_job_writes_the_artifact_the_audit_reads(workdir):
    run_dir = workdir / "grad"
    proc = run_main(
        ["job=gradients", "tracking=disabled", *SMALL, f"hydra.run.dir={run_dir}"],
        workdir,
        env={"VLAEVAL_CACHE_DIR": str(workdir / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    artifact = json.loads((run_dir / "gradient_artifact.json").read_text())
    assert artifact["schema_version"] == 2 and len(artifact["checkpoint_sha256"]) == 64
    assert artifact["gradient_seeds"] == list(range(100, 108)) and len(artifact["dataset_sha256"]) == 64
    assert len(artifact["anchors"]) == 8 and artifact["trainable"] == "action_head"
    first = artifact["anchors"][0]
    assert first["gradient_rms"] > 0 and np.isfinite(first["mean_gradient_loss"])
    assert set(first["sampling_trace"]) == set(TRACE_FIELDS) and len(first["per_seed"]["gradient_rms"]) == 8
    assert first["gradient_rms"] == pytest.approx(
        np.sqrt(np.mean(np.square(first["per_seed"]["gradient_rms"]))), rel=1e-9
    )
    assert {"split_half_spearman", "spearman_brown", "seeds_per_half"} <= set(artifact["reliability"])
    assert artifact["gradient_runtime"]["pairs"] == 64
    assert {"episode", "frame", "task"} <= set(first) and first["frame"] == first["sampling_trace"]["anchor_index"]
    assert set(artifact["layer_methods"].values()) == {"linear_rows"}  # the tiny VLA's head is per-sample Linear
    assert artifact["verification_against_loop"]["pairs"] == 8
    assert artifact["verification_against_loop"]["max_relative_difference"] < 1e-4


@pytest.mark.parametrize(
    "override,needle",
    [
        ("data.tasks=[reech-v3]", "unknown Meta-World task 'reech-v3'; did you mean reach-v3, push-v3, sweep-v3?"),
        ("data.tasks=[]", "data.tasks is empty"),
        ("data.episodes_per_task=0", "data.episodes_per_task=0 must be >= 1"),
        ("data.horizon=0", "data.horizon=0 must be >= 1"),
        ("gradients.seeds=[]", "gradients.seeds has 0 seed(s)"),
        ("gradients.seeds=[3,3,4]", "gradients.seeds repeats [3]"),
    ],
)
def test_bad_data_and_gradient_input_is_one_line_and_writes_nothing(workdir, override, needle):
    before = set(workdir.rglob("*"))
    proc = run_main(
        ["job=gradients", "tracking=disabled", *SMALL, override],
        workdir,
        env={"VLAEVAL_CACHE_DIR": str(workdir / "cache")},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert set(workdir.rglob("*")) == before
    record_outcome("configs", override, f"exit 2, nothing written: `{lines[0]}`", kind="bad input")


@pytest.mark.slow
def test_train_job_logs_loss_curve_checkpoint_and_success_to_mlflow(workdir, store):
    from mlflow.tracking import MlflowClient

    args = [
        "job=train",
        *[a for a in TRAINING if a != "train.evaluate_after=false"],
        "evaluate.episodes_per_task=1",
        "evaluate.max_steps=20",
    ]
    proc = run_main(args, workdir, env={"MLFLOW_TRACKING_URI": store, "VLAEVAL_CACHE_DIR": str(workdir / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Closed-loop success on held-out episodes" in proc.stdout
    client = MlflowClient(tracking_uri=store)
    run = client.search_runs([client.get_experiment_by_name("vlaeval-train").experiment_id])[0]
    curve = client.get_metric_history(run.info.run_id, "train.loss")
    assert [m.step for m in curve] == [10, 20, 30, 40]
    assert (
        "eval.reach-v3.policy_success_rate" in run.data.metrics
        and "eval.reach-v3.expert_success_rate" in run.data.metrics
    )
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")}
    assert artifacts == {"checkpoint/model.pt", "checkpoint/model.json"}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {"plots/success_rates.png"}


@pytest.mark.slow
def test_reproduce_of_a_training_run_gives_the_same_checkpoint(workdir):
    run_dir = workdir / "train"
    env = {"VLAEVAL_CACHE_DIR": str(workdir / "cache")}
    proc = run_main(["job=train", "tracking=disabled", *TRAINING, f"hydra.run.dir={run_dir}"], workdir, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = run_main(
        ["job=reproduce", "tracking=disabled", f"reproduce.run_id={run_dir}", f"hydra.run.dir={workdir / 'rep'}"],
        workdir,
        env=env,
    )
    assert rep.returncode == 0, rep.stderr[-3000:]
    report = json.loads((workdir / "rep" / "reproduce.json").read_text())
    assert report["all_identical"]
    keys = {c["key"] for c in report["comparisons"]}
    assert {"checkpoint.sha256", "train.final_loss"} <= keys


def test_the_default_episode_plan_is_pinned_and_more_episodes_cover_every_scene():
    """The default data's scenes never move (cached datasets and audit figures depend on them);
    more episodes than scenes visit every scene equally often; train_families adds other
    variant families' scenes as indices 50 * family + variant."""
    from collections import Counter

    from vlaeval.envs.metaworld import TRAIN_VARIANTS, episode_plan, scene_of

    default = [e["variant"] for e in episode_plan(["reach-v3"], 12, 0, TRAIN_VARIANTS)]
    assert default == [4, 7, 8, 23, 15, 5, 2, 22, 24, 16, 11, 0]
    counts = Counter(e["variant"] for e in episode_plan(["reach-v3"], 40, 0, TRAIN_VARIANTS))
    assert set(counts) == set(TRAIN_VARIANTS) and set(counts.values()) == {1, 2}
    wide = Counter(e["variant"] for e in episode_plan(["reach-v3"], 150, 0, TRAIN_VARIANTS, families=[0, 2, 3]))
    assert set(wide.values()) == {2} and {scene_of(s)[0] for s in wide} == {0, 2, 3}
    assert {scene_of(s)[1] for s in wide} == set(TRAIN_VARIANTS)


def test_a_scene_of_another_family_is_that_family_s_variant():
    import metaworld

    from vlaeval.envs.metaworld import EpisodeRunner

    runner = EpisodeRunner()
    try:
        _, obs = runner.env("reach-v3", 50 * 2 + 3)
        _, home = runner.env("reach-v3", 3)
    finally:
        runner.close()
    benchmark = metaworld.MT1("reach-v3", seed=2)
    env = benchmark.train_classes["reach-v3"]()
    env.set_task(benchmark.train_tasks[3])
    expected, _ = env.reset()
    env.close()
    assert np.allclose(obs[-3:], expected[-3:]) and not np.allclose(obs[-3:], home[-3:])  # its goal, not family 0's
