"""main.py as a user runs it: one-line errors with nothing written, determinism across
processes, and a tracking failure that never loses the result."""

from __future__ import annotations

import json

import pytest

from helpers.configs import compose_config, typed_gauntlet
from helpers.outcomes import outcome_table
from helpers.processes import run_main
from helpers.reliability import record_outcome


def _outcome_file(workdir, mutate):
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    path = workdir / "outcomes.csv"
    mutate(outcome_table(strata)).to_csv(path, index=False)
    return ["job=gauntlet", "strata=small", "outcomes=file", f"outcomes.path={path}"]


def _flipped_checkpoint(workdir):
    """A weights file torch.load reads without complaint, one bit of one tensor flipped (no sidecar)."""
    import torch

    path = workdir / "flipped.pt"
    torch.save({"weight": torch.arange(4096, dtype=torch.float32)}, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the tensor's record
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["weight"].shape == (4096,)  # loads: the defect this catches
    return path


BAD_INPUTS = {
    "EMA decay out of range": (
        lambda w: ["job=train", "data=tiny", "train.ema_decay=1.5"],
        "train.ema_decay=1.5 must be in (0, 1) (null: evaluate and save the last weights)",
    ),
    "regression videos without a rollout source": (
        lambda w: ["job=regressions", "regressions.videos=2"],
        "regressions.videos films with the baseline and candidate of a rollout source: add outcomes=rollout",
    ),
    "LeRobot data without a root": (
        lambda w: ["job=residual_audit", "data=lerobot"],
        "data.root is required by vlaeval.data.lerobot.LeRobotDemonstrations",
    ),
    "checkpoint=path without a path": (
        lambda w: ["job=residual_audit", "checkpoint=path"],
        "checkpoint=path needs checkpoint.path=<file.pt>",
    ),
    "checkpoint file missing": (
        lambda w: ["job=gradients", "checkpoint=path", f"checkpoint.path={w / 'nowhere.pt'}"],
        "nowhere.pt does not exist",
    ),
    "success-rate effect planted in rollouts": (
        lambda w: ["job=gauntlet", "outcomes=rollout_small", "+effects.nominal=-0.05"],
        "effects.nominal=-0.05 is a success-rate difference, which only synthetic outcomes can plant",
    ),
    "rollout degradation planted in synthetic outcomes": (
        lambda w: ["job=gauntlet", "+effects.nominal={action_noise: 0.5}"],
        "is a rollout degradation; synthetic outcomes plant a success-rate difference",
    ),
    "unknown degradation": (
        lambda w: ["job=gauntlet", "outcomes=rollout_small", "+effects.nominal={action_nois: 0.5}"],
        "effects.nominal.action_nois is not a perturbation",
    ),
    "unknown built-in policy": (
        lambda w: ["job=gauntlet", "outcomes=rollout_small", "outcomes.candidate=builtin:better"],
        "outcomes.candidate=builtin:better: no built-in policy 'better'",
    ),
    "rollout checkpoint missing": (
        lambda w: ["job=gauntlet", "outcomes=rollout_small", f"outcomes.candidate={w / 'nowhere.pt'}"],
        "nowhere.pt does not exist; give a checkpoint file or builtin:<name>",
    ),
    "unknown scenario-family key": (
        lambda w: ["job=gauntlet", "outcomes=rollout_small", "+outcomes.scenarios.nominal.variant=[0,3]"],
        "outcomes.scenarios.nominal.variant is not a scenario-family setting",
    ),
    "scenario variants out of range": (
        lambda w: ["job=gauntlet", "outcomes=rollout_small", "outcomes.scenarios.nominal.variants=[40,60]"],
        "outcomes.scenarios.nominal.variants=[40, 60] must be [first, stop)",
    ),
    "safety monitor without an obstacle": (
        lambda w: ["job=gauntlet", "outcomes=rollout_small", "outcomes.scenarios.safety_critical.tasks=[reach-v3]"],
        "task reach-v3 has no body named wall to monitor",
    ),
    "repeated training variant family": (
        lambda w: ["job=train", "data.train_families=[0,0]"],
        "data.train_families=[0, 0] must list distinct variant families",
    ),
    "unknown stratum in effects": (
        lambda w: ["job=gauntlet", "+effects.moon_base=-0.1"],
        "effects.moon_base: unknown stratum",
    ),
    "negative units": (
        lambda w: ["job=gauntlet", "strata.nominal.units=-5"],
        "strata.nominal.units=-5 must be a positive",
    ),
    "base rate above 1": (
        lambda w: ["job=gauntlet", "strata.new_odd.base_rate=1.2"],
        "base_rate=1.2 must be a success rate in [0, 1]",
    ),
    "base rate below 0": (
        lambda w: ["job=gauntlet", "strata.new_odd.base_rate=-0.1"],
        "base_rate=-0.1 must be a success rate in [0, 1]",
    ),
    "cluster size 0": (lambda w: ["job=gauntlet", "strata.rare_events.cluster_size=0"], "cluster_size=0 must be >= 1"),
    "alpha 0": (lambda w: ["job=gauntlet", "gauntlet.alpha=0"], "gauntlet.alpha=0.0 must be in (0, 1)"),
    "alpha 1": (lambda w: ["job=gauntlet", "gauntlet.alpha=1"], "gauntlet.alpha=1.0 must be in (0, 1)"),
    "missing column": (
        lambda w: _outcome_file(w, lambda t: t.drop(columns=["candidate"])),
        "lacks column(s) candidate",
    ),
    "non-0/1 outcome": (
        lambda w: _outcome_file(w, lambda t: t.assign(baseline=t["baseline"].where(t.index != 4, 3))),
        "baseline=3 on line 6 is not a 0/1 outcome",
    ),
    "duplicate scenario id": (
        lambda w: _outcome_file(w, lambda t: t.assign(scenario_id="same")),
        "scenario_id 'same' appears more than once",
    ),
    "unknown stratum in file (outcomes.strata=config)": (
        lambda w: _outcome_file(w, lambda t: t.assign(stratum="moon_base")) + ["outcomes.strata=config"],
        "unknown stratum 'moon_base'",
    ),
    "unit estimand on a file without a declared largest cluster": (
        lambda w: _outcome_file(w, lambda t: t) + ["gauntlet.estimand=unit"],
        "needs strata.safety_critical.max_cluster_size: the largest cluster its scenario distribution can produce",
    ),
    "margin 0 for a launch": (
        lambda w: ["job=gauntlet", "gauntlet.margin_delta=0"],
        "to ask whether the candidate is better, set gauntlet.question=superiority (or two_sided)",
    ),
    "a negative superiority gain": (
        lambda w: ["job=gauntlet", "gauntlet.question=superiority", "gauntlet.superiority_gain=-0.01"],
        "gauntlet.superiority_gain=-0.01 must be in [0, 1)",
    ),
    "the horizon test on an outcome file in no declared order": (
        lambda w: _outcome_file(w, lambda t: t) + ["gauntlet.test_mode=horizon"],
        "an outcome file has none: leave test_mode=exact",
    ),
    "version columns naming two versions": (
        lambda w: _outcome_file(w, lambda t: t.assign(candidate_version=["ab"[i % 2] for i in range(len(t))])),
        "column candidate_version holds a, b; give it one version for the whole file",
    ),
    "an order seed for an outcome file": (
        lambda w: _outcome_file(w, lambda t: t) + ["gauntlet.order_seed=7"],
        "gauntlet.order_seed=7 cannot be set for outcomes that all exist (an outcome file)",
    ),
    "a cluster larger than the declared largest": (
        lambda w: (
            _outcome_file(w, lambda t: t[t["stratum"] == "nominal"])
            + ["gauntlet.estimand=unit", "strata.nominal.max_cluster_size=3"]
        ),
        "stratum nominal has a cluster of 40 units, more than its declared strata.nominal.max_cluster_size=3",
    ),
    "a stratum name one edit from a configured one": (
        lambda w: _outcome_file(
            w, lambda t: t.assign(stratum=t["stratum"].replace("distribution_shift", "distribution_shfit"))
        ),
        "holds stratum 'distribution_shfit': did you mean 'distribution_shift'?",
    ),
    "one row of a misspelt stratum": (
        lambda w: _outcome_file(w, lambda t: t.assign(stratum=t["stratum"].where(t.index != 7, "nomnal"))),
        "holds stratum 'nomnal': did you mean 'nominal'?",
    ),
    "two data labels in one stratum": (
        lambda w: _outcome_file(
            w, lambda t: t.assign(data_label=["REPLAYED", "SIMULATED"] * (len(t) // 2) + ["REPLAYED"] * (len(t) % 2))
        ),
        "has data_label REPLAYED, SIMULATED; give each stratum one of",
    ),
    "confidence grid step not dividing a margin": (
        lambda w: ["job=gauntlet", "gauntlet.cs_grid_step=0.003"],
        "gauntlet.margin_delta=0.02 is not a multiple of gauntlet.cs_grid_step=0.003",
    ),
    "file source without path": (
        lambda w: ["job=gauntlet", "outcomes=file"],
        "outcomes.path is required by vlaeval.gauntlet.outcomes.FileOutcomes and has no value",
    ),
    "ablation with one seed": (
        lambda w: ["job=ablation", "ablation.seeds=[0]"],
        "ablation.seeds has 1 seed(s); give >= 2 (intervals are across seeds)",
    ),
    "ablation proposal listed twice": (
        lambda w: ["job=ablation", "ablation.proposals=[uniform,residual,uniform]"],
        "ablation.proposals repeats ['uniform']",
    ),
    "ablation audit result missing": (
        lambda w: ["job=ablation", f"ablation.audit_result={w / 'nowhere.json'}"],
        "is not a file; give a job=residual_audit result.json",
    ),
    "ablation held-out loss on data without held-out scenes": (
        lambda w: ["job=ablation", "data=lerobot", f"data.root={w}"],
        "has no held-out scenes (a `scenes` argument); set ablation.heldout_episodes_per_task=0",
    ),
    "unknown data scene split": (
        lambda w: ["job=train", "data.scenes=heldout"],
        "data.scenes='heldout' must be one of train, held_out, validation, test",
    ),
    "a directory given as a checkpoint": (
        lambda w: ["job=gradients", "checkpoint=path", f"checkpoint.path={w}"],
        "is a directory; give the file itself: e.g. checkpoint.path=policy.pt",
    ),
    "a directory given as an outcome file": (
        lambda w: ["job=gauntlet", "outcomes=file", f"outcomes.path={w}"],
        "is a directory; give the file itself: pass a CSV or Parquet file of paired outcomes",
    ),
    "a bit-flipped checkpoint without a sidecar": (
        lambda w: ["job=gradients", "checkpoint=path", f"checkpoint.path={_flipped_checkpoint(w)}"],
        "fails its CRC check at record",
    ),
    "a GPU this machine does not have": (lambda w: ["job=gradients", "device=cuda:64"], "device=cuda:64: "),
    "not a device": (lambda w: ["job=score", "device=gpu"], "device='gpu' is not a device vlaeval runs on"),
    "unknown job": (lambda w: ["job.name=launch_rocket"], "unknown job 'launch_rocket'"),
    "reproduce without run id": (lambda w: ["job=reproduce"], "job=reproduce needs reproduce.run_id"),
}


# Through the real CLI (a process each, ~4 s): the exit code, stderr's one line and Hydra's own run
# folder removed. The rest are checked in-process: the same check, the same message, before any work.
THROUGH_THE_CLI = (
    "unknown job",
    "checkpoint file missing",
    "missing column",
    "file source without path",
    "a GPU this machine does not have",
    "rollout checkpoint missing",
)


@pytest.mark.parametrize("case", sorted(set(BAD_INPUTS) - set(THROUGH_THE_CLI)))
def test_bad_input_is_one_line_before_any_work_in_process(workdir, case):
    from vlaeval.errors import UserInputError
    from vlaeval.jobs import dispatch

    make_args, needle = BAD_INPUTS[case]
    args = make_args(workdir)
    before = {p for p in workdir.rglob("*")}
    cfg = compose_config(args, output_dir=workdir / "run", cache_dir=workdir / "cache")
    with pytest.raises(UserInputError) as caught:
        dispatch(cfg)
    message = str(caught.value)
    assert "\n" not in message and needle in message, message
    after = {p for p in workdir.rglob("*")}
    assert after == before, f"files written: {sorted(map(str, after - before))}"
    area = "outcome files" if "outcomes" in " ".join(args) else "configs"
    record_outcome(area, case, f"one line before any work, nothing written: `{message}`", kind="bad input")


@pytest.mark.parametrize("case", THROUGH_THE_CLI)
def test_bad_input_is_one_line_and_writes_nothing(workdir, case):
    make_args, needle = BAD_INPUTS[case]
    args = make_args(workdir)
    before = {p for p in workdir.rglob("*")}
    proc = run_main(args, workdir, env={"MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    after = {p for p in workdir.rglob("*")}
    assert after == before, f"files written: {sorted(map(str, after - before))}"
    area = "outcome files" if "outcomes" in " ".join(args) else "configs"
    record_outcome(area, case, f"exit 2, nothing written: `{lines[0]}`", kind="bad input")


def _comparable(result):
    out = {k: v for k, v in result.items() if k not in ("timing", "result_path", "mlflow_run_id", "tags", "run_id")}
    out["lineage"] = {k: v for k, v in out["lineage"].items() if k != "created_at"}
    out["metrics"] = {k: v for k, v in out["metrics"].items() if not k.startswith("timing.")}
    return out


def test_identical_results_under_different_hash_seeds(workdir):
    results = []
    for hash_seed in ("0", "12345"):
        run_dir = workdir / f"run{hash_seed}"
        proc = run_main(
            [
                "job=gauntlet",
                "tracking=disabled",
                "gauntlet.plot=false",
                "gauntlet.use_cache=false",
                f"hydra.run.dir={run_dir}",
            ],
            workdir,
            env={"PYTHONHASHSEED": hash_seed},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads((run_dir / "result.json").read_text()))
    assert _comparable(results[0]) == _comparable(results[1])
    assert results[0]["recommendation"]["recommendation"] == "NEEDS_REVIEW"  # generated outcomes: a demonstration
    assert results[0]["recommendation"]["demonstration"] and not results[0]["recommendation"]["blockers"]


def test_tracking_failure_keeps_the_result_and_says_where(workdir):
    run_dir = workdir / "run"
    proc = run_main(
        ["job=gauntlet", "tracking.uri=http://127.0.0.1:9", "gauntlet.plot=false", f"hydra.run.dir={run_dir}"],
        workdir,
        env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"},
    )
    assert proc.returncode == 3
    assert "MLflow tracking at http://127.0.0.1:9 failed" in proc.stderr
    assert str(run_dir / "result.json") in proc.stderr.replace("\n", "")
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["recommendation"]["recommendation"] == "NEEDS_REVIEW" and saved["recommendation"]["demonstration"]
    record_outcome(
        "tracking", "tracking URI with nothing listening", "exit 3; result.json saved and named in the error"
    )


def test_a_checkpoint_that_does_not_fit_names_the_keys(workdir):
    """A state-dict mismatch says which keys are missing, unexpected or of another shape."""
    import torch

    from vlaeval.errors import UserInputError
    from vlaeval.jobs import dispatch

    path = workdir / "other.pt"
    torch.save({"weight": torch.zeros(3)}, path)
    cfg = compose_config(
        ["job=gradients", "data=tiny", "model=tiny_vla_small", "checkpoint=path", f"checkpoint.path={path}"],
        output_dir=workdir / "run",
        cache_dir=workdir / "cache",
    )
    with pytest.raises(UserInputError) as caught:
        dispatch(cfg)
    message = str(caught.value)
    assert "\n" not in message and "unexpected weight" in message and "missing " in message and "(+" in message


def test_ctrl_c_is_one_line_and_leaves_nothing_half_written(workdir):
    """A first run says what it trains before it does; an interrupted job (SIGINT while it trains) says so in one line, exits 130, and leaves no
    temporary or partial file: its run folder (Hydra's files only) is removed, finished cache entries stay."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers.configs import MAIN
    from vlaeval.artifacts import TEMP_SUFFIX

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "VLAEVAL_"))}
    env.update({"VLAEVAL_CACHE_DIR": str(workdir / "cache"), "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"})
    args = ["job=residual_audit", "data=tiny", "model=tiny_vla_small", "train.steps=1000000", "tracking=disabled"]
    proc = subprocess.Popen(
        [sys.executable, str(MAIN), *args],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal delivers it: a shell's background job (a CI step, `make test &`) starts
        # with SIGINT ignored, which the job would inherit and never see the interrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not list((workdir / "cache").glob("demonstrations/*/arrays.npz")) and time.monotonic() < deadline:
        time.sleep(0.2)  # interrupt once the data is recorded: the job is training
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["error: interrupted; nothing half-written (a finished cache entry is kept for the next run)"], err
    assert "Traceback" not in out + err
    # The first run said, before it trained, what it trains, that it is once, and how to shorten it.
    assert "note: training the built-in TinyVLA for 1,000,000 steps on first use (once:" in out, out
    assert "train.steps=500" in out
    assert not [p for p in workdir.rglob("*") if p.name.endswith(TEMP_SUFFIX)]
    assert not list(workdir.glob("outputs/*")) and not list((workdir / "cache").glob("checkpoints/*/*.pt"))
