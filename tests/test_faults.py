"""Faults a team will hit: a job SIGKILLed mid-scoring, damaged cache entries and artifacts, stale
temporary files, and eight jobs writing one SQLite store at once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from helpers.configs import AUDIT_SMALL, MAIN
from helpers.processes import run_main, sqlite_uri
from helpers.reliability import record_outcome
from vlaeval.artifacts import TEMP_SUFFIX, read_json, remove_stale_temporaries, sha256_file
from vlaeval.runs import VOLATILE_METRIC_PREFIXES

AUDIT = ["job=residual_audit", "tracking=disabled", *AUDIT_SMALL, "audit.plot=false"]


def _stable_metrics(result: dict) -> dict:
    return {k: v for k, v in result["metrics"].items() if not k.startswith(VOLATILE_METRIC_PREFIXES)}


def _assert_every_file_is_whole(root: Path) -> int:
    """Each file under root parses as what its name says and matches any digest recorded for it."""
    checked = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        assert not path.name.endswith(TEMP_SUFFIX), f"temporary file left behind: {path}"
        if path.suffix == ".json":
            payload = read_json(path)
            if path.parent.name != ".hydra" and isinstance(payload, dict) and "sha256" in payload and "file" in payload:
                assert sha256_file(path.with_name(payload["file"])) == payload["sha256"], path
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as stored:
                [stored[k] for k in stored.files]
        elif path.suffix == ".pt":
            torch.load(path, weights_only=True)
        checked += 1
    return checked


def _start(args, cwd: Path, env: dict) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "VLAEVAL_"))}
    full_env.update({"PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **env})
    return subprocess.Popen(
        [sys.executable, str(MAIN), *args], cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@pytest.mark.slow
def test_sigkill_mid_scoring_leaves_no_partial_output_and_the_rerun_completes(tmp_path):
    # Enough samples per anchor that scoring lasts seconds, so the kill lands inside it.
    audit = AUDIT + ["estimator.samples_per_estimator=2048"]
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    reference_dir.mkdir(), killed_dir.mkdir()
    reference = run_main(
        audit + [f"hydra.run.dir={reference_dir / 'run'}"],
        reference_dir,
        env={"VLAEVAL_CACHE_DIR": str(reference_dir / "cache")},
    )
    assert reference.returncode == 0, reference.stderr[-3000:]

    cache = killed_dir / "cache"
    job = _start(audit + [f"hydra.run.dir={killed_dir / 'run'}"], killed_dir, {"VLAEVAL_CACHE_DIR": str(cache)})
    # Scoring starts right after the gradient artifact lands in the cache: kill the job just after.
    deadline = time.monotonic() + 300
    while (
        not list(cache.glob("gradients/*/gradient_artifact.json"))
        and job.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    time.sleep(0.3)
    assert job.poll() is None, "the job finished before it could be killed mid-scoring"
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    assert job.returncode == -signal.SIGKILL
    assert not (killed_dir / "run" / "result.json").exists()  # no result, rather than half of one
    checked = _assert_every_file_is_whole(killed_dir)
    # A dead writer's temporary file, as a kill during a write leaves it, is cleaned up by the rerun.
    [entry_dir] = [p for p in (cache / "gradients").iterdir() if p.is_dir()]
    stale = entry_dir / f".x.json.{socket.gethostname()}-{2**22 + 12345}.abcd{TEMP_SUFFIX}"
    stale.write_text('{"half": ')

    rerun = run_main(
        audit + [f"hydra.run.dir={killed_dir / 'rerun'}"], killed_dir, env={"VLAEVAL_CACHE_DIR": str(cache)}
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert not stale.exists()
    expected = json.loads((reference_dir / "run" / "result.json").read_text())
    got = json.loads((killed_dir / "rerun" / "result.json").read_text())
    assert _stable_metrics(got) == _stable_metrics(expected)
    assert got["checks"] == expected["checks"]
    _assert_every_file_is_whole(killed_dir)
    record_outcome(
        "jobs",
        "residual audit SIGKILLed mid-scoring",
        f"no result.json, {checked} files left all whole (digests verified); the rerun reused the cache, "
        "removed a dead writer's temporary file, and gave the uninterrupted run's numbers",
    )


@pytest.mark.slow
def test_damaged_cached_gradient_artifact_is_reported_and_rebuilt(tmp_path):
    env = {"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")}
    first = run_main(AUDIT + [f"hydra.run.dir={tmp_path / 'first'}"], tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    [entry] = (tmp_path / "cache" / "gradients").glob("*/gradient_artifact.json")
    text = entry.read_text()
    # One digit of one anchor's gradient RMS changed: still valid JSON, caught only by the digest.
    position = text.index('"gradient_rms": ') + len('"gradient_rms": ') + 3
    flipped = "1" if text[position] != "1" else "2"
    entry.write_text(text[:position] + flipped + text[position + 1 :])
    second = run_main(AUDIT + [f"hydra.run.dir={tmp_path / 'second'}"], tmp_path, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "cached gradients at" in second.stdout + second.stderr and "rejected" in second.stdout + second.stderr
    assert "does not match its content_sha256" in second.stdout + second.stderr
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("first", "second"))
    assert _stable_metrics(a) == _stable_metrics(b)
    record_outcome(
        "caches",
        "one digit changed in a cached gradient artifact (still valid JSON)",
        "detected by its content_sha256, reported in the log, rebuilt; identical audit numbers",
    )

    # The same edit in an artifact given by the user is refused, not rebuilt.
    given = tmp_path / "edited.json"
    given.write_text(entry.read_text().replace('"gradient_rms": ', '"gradient_rms": 1', 1))
    refused = run_main(AUDIT + [f"audit.gradient_artifact={given}"], tmp_path, env=env)
    assert refused.returncode == 2
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "does not match its content_sha256" in lines[0]
    record_outcome(
        "gradient artifacts",
        "bit-flipped value in a vlaeval-written gradient artifact",
        f"exit 2, nothing written: `{lines[0]}`",
        kind="bad input",
    )


def test_only_dead_writers_temporaries_are_removed(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / "a" / f".entry.npz.{host}-{2**22 + 4321}.q1w2{TEMP_SUFFIX}"
    live = tmp_path / f".entry.json.{host}-{os.getpid()}.zz{TEMP_SUFFIX}"
    elsewhere = tmp_path / f".entry.json.otherhost-1.zz{TEMP_SUFFIX}"  # another machine's: not ours to judge
    dead.parent.mkdir()
    for path in (dead, live, elsewhere):
        path.write_bytes(b"partial")
    assert remove_stale_temporaries(tmp_path) == [dead]
    assert live.exists() and elsewhere.exists() and not dead.exists()


@pytest.mark.slow
def test_eight_parallel_jobs_on_one_brand_new_sqlite_store(workdir):
    uri = sqlite_uri(workdir / "shared" / "mlflow.db")  # does not exist yet
    jobs = [
        _start(
            [
                "job=plan",
                f"gauntlet.seed={seed}",
                "gauntlet.plan_replications=50",
                f"hydra.run.dir={workdir / f'run{seed}'}",
            ],
            workdir,
            {"MLFLOW_TRACKING_URI": uri},
        )
        for seed in range(8)
    ]
    codes = [job.wait(timeout=600) for job in jobs]
    assert codes == [0] * 8
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("vlaeval-plan").experiment_id], max_results=100)
    assert len(runs) == 8 and all(r.info.status == "FINISHED" for r in runs)
    assert sorted(int(r.data.params["gauntlet.seed"]) for r in runs) == list(range(8))  # none lost, none twice
    assert sorted(r.data.tags["hydra.output_dir"] for r in runs) == sorted(str(workdir / f"run{s}") for s in range(8))
    assert not any(workdir.rglob("mlflow_pending.json"))
    assert all(r.data.metrics["gate.plan_ok"] == 1.0 for r in runs)
    record_outcome(
        "tracking",
        "eight jobs started at once on one brand-new SQLite store",
        "store created once under a file lock; 8 FINISHED runs, one per job, none lost or duplicated",
    )
