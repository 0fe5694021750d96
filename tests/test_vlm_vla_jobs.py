"""model=smolvlm_vla through every job, as a user runs them (main.py in a subprocess) on the small
preset and the built-in camera data: the residual audit with the action expert chosen by name, the
gradient artifact recording that choice, job=evaluate under bfloat16 autocast, the ablation and the
rollout gauntlet with its action chunks. One cache for the module: the checkpoint trains once."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers.processes import run_main
from helpers.servers import need, osmesa_installed

VLM = ["data=tiny_vision", "model=smolvlm_vla_small", "train.steps=40", "train.batch_size=32"]
GRADIENTS = ["gradients.num_anchors=16", "gradients.seeds=${range:100,116}"]
EXPERT = ["gradients.trainable=all", "gradients.parameters=[expert.*,action_out.*]"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    return {"VLAEVAL_CACHE_DIR": str(tmp_path_factory.mktemp("vlm-cache"))}


def run(args, tmp_path, env, name="run", timeout=600):
    proc = run_main([*args, f"hydra.run.dir={tmp_path / name}"], tmp_path, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / name / "result.json").read_text()), proc


def test_the_audit_scores_the_vlm_against_its_action_experts_gradients_chosen_by_name(tmp_path, env):
    result, _ = run(
        [*VLM, *GRADIENTS, *EXPERT, "gate=smoke", "audit.permutations=500", "tracking=disabled"],
        tmp_path,
        env,
    )
    artifact = result["gradient_artifact"]
    assert artifact["trainable"] == "all:expert.*,action_out.*"
    assert set(artifact["layer_methods"]) and all(
        name.startswith(("expert.", "action_out")) for name in artifact["layer_methods"]
    )
    assert "linear_gram" in artifact["layer_methods"].values()  # the Gram form, not per-sample gradients
    assert -1 <= result["alignment"]["spearman_residual_vs_gradient_rms"] <= 1
    assert result["gate"]["verdict"]["verdict"] in ("PASS", "FAIL", "UNDECIDED")

    artifact_result, proc = run(["job=gradients", *VLM, *GRADIENTS, *EXPERT, "tracking=disabled"], tmp_path, env, "g")
    written = json.loads((tmp_path / "g" / "gradient_artifact.json").read_text())
    names = written["trainable_parameters"]
    assert written["trainable"] == "all:expert.*,action_out.*" and names
    assert all(n.startswith(("expert.", "action_out.")) for n in names)
    assert written["verification_against_loop"]["pairs"] > 0  # checked against the per-sample loop
    assert f"{written['parameter_count']:,} parameters (all:expert.*,action_out.*" in proc.stdout


def test_the_vlm_trains_and_evaluates_in_bfloat16(tmp_path, env):
    result, _ = run(
        [
            "job=train",
            *VLM,
            "model.autocast=bfloat16",
            "train.log_every=10",
            "evaluate.episodes_per_task=2",
            "evaluate.max_steps=20",
            "rollout.workers=2",
            "rollout.lockstep_group=2",
            "tracking=disabled",
        ],
        tmp_path,
        env,
    )
    evaluation = result["evaluation"]
    assert len(evaluation["episodes"]) == 4 and 0.0 <= evaluation["policy_success_rate"] <= 1.0
    assert result["train"]["steps"] == 40 and 0 < result["train"]["final_loss"] < 10


def test_the_ablation_fine_tunes_the_vlms_expert_under_each_proposal(tmp_path, env):
    result, _ = run(
        [
            *VLM,
            *GRADIENTS,
            *EXPERT,
            "job=ablation",
            "gate=smoke",
            "ablation.proposals=[uniform,residual]",
            "ablation.seeds=[0,1]",
            "ablation.steps=10",
            "ablation.measure_every=10",
            "ablation.judge_draws=2",
            "ablation.build_draws=2",
            "ablation.minibatches=2",
            "ablation.batch_size=16",
            "ablation.heldout_every=10",
            "ablation.heldout_episodes_per_task=1",
            "ablation.evaluate=false",  # closed loop: job=train's evaluation above
            "estimator.samples_per_estimator=8",
            "tracking=disabled",
        ],
        tmp_path,
        env,
        timeout=900,
    )
    assert result["trainable"] == "all:expert.*,action_out.*"
    assert set(result["summary"]) == {"uniform", "residual"} and len(result["runs"]) == 4
    assert 0 < result["summary"]["residual"]["realized_ratio"]["0"]["mean"] < 1.5


def test_a_rollout_gauntlet_runs_two_vlms_on_visual_and_language_strata(tmp_path, env):
    result, _ = run(
        [
            "job=gauntlet",
            "model=smolvlm_vla_small",
            "strata=vision",
            "outcomes=rollout_vlm_small",
            # Shorter recipes than the preset's: the test is that every stratum runs and decides.
            "outcomes.policies.baseline.train.steps=60",
            "outcomes.policies.equivalent.train.steps=60",
            "outcomes.policies.worse.train.steps=10",
            "outcomes.max_steps=20",
            "gauntlet.plot=false",
            "gauntlet.preflight=off",
            "rollout.workers=2",
            "rollout.lockstep_group=4",
            "tracking=disabled",
        ],
        tmp_path,
        env,
    )
    strata = {s["stratum"]: s for s in result["strata"]}
    families = ["camera_pose", "paraphrase", "nominal"]
    assert set(families) <= set(strata) and all(strata[f]["decision"] for f in families)
    pairs = pd.read_csv(result["rollouts"]["paired_outcomes"])
    assert len(pairs) == sum(strata[f]["units_evaluated"] for f in families) > 0
    assert result["rollouts"]["episodes_run"] == 2 * len(pairs)
    assert result["lineage_valid"]
