"""tracking=server against a real `mlflow server`: PostgreSQL backend with proxied artifacts and
joblib sweeps; the server down before a run and killed mid-run, then job=sync -- nothing lost."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from helpers.configs import AUDIT_SMALL, GAUNTLET_SMALL
from helpers.processes import run_main
from helpers.reliability import record_outcome
from helpers.runs import assert_run_matches_its_result, check_sweep, experiment_runs
from helpers.servers import KillingProxy, MlflowServer, S3Server, postgres_server


@pytest.mark.slow
def test_joblib_sweeps_against_a_postgres_backed_tracking_server(tmp_path, workdir):
    artifacts = tmp_path / "artifact-store"
    with postgres_server() as backend, MlflowServer(backend, artifacts, tmp_path / "mlflow-server.log") as server:
        env = {"MLFLOW_TRACKING_URI": server.uri, "VLAEVAL_CACHE_DIR": str(workdir / "cache")}
        launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "tracking=server"]
        audit = run_main(
            ["-m", "job=residual_audit", "estimator=iid,sobol", *AUDIT_SMALL, "audit.plot=false", *launcher],
            workdir,
            env=env,
        )
        assert audit.returncode == 0, audit.stderr[-4000:]
        gauntlet = run_main(["-m", "effects=none,catastrophic_safety", *GAUNTLET_SMALL, *launcher], workdir, env=env)
        assert gauntlet.returncode == 0, gauntlet.stderr[-4000:]

        client = MlflowClient(tracking_uri=server.uri)
        audits = check_sweep(client, "vlaeval-residual_audit", 2, workdir=workdir, proxied=True).children
        assert {c.data.params["estimator.kind"] for c in audits} == {"iid", "sobol"}
        assert all(len([k for k in c.data.metrics if k.startswith("gate.")]) == 7 for c in audits)
        gauntlets = check_sweep(client, "vlaeval-gauntlet", 2, workdir=workdir, proxied=True).children
        assert sorted(c.data.tags["halted"] for c in gauntlets) == ["false", "true"]
        assert all(
            len(client.get_metric_history(c.info.run_id, "stratum.safety_critical.cs_lower")) > 1 for c in gauntlets
        )
        assert not any(workdir.rglob("mlflow_pending.json"))  # nothing queued: every run arrived
        # The artifacts really went through the server into its artifact store.
        assert any(artifacts.rglob("result.json")) and any(artifacts.rglob("sweep_summary.md"))
        # The same database used directly, with a password in the URI: logged masked, never in clear.
        secret_uri = backend.replace("vlaeval@", "vlaeval:hunter2@")
        direct = run_main(["job=plan", "gauntlet.plan_replications=50", f"tracking.uri={secret_uri}"], workdir)
        assert direct.returncode == 0, direct.stderr[-3000:]
        assert "hunter2" not in direct.stdout + direct.stderr
        [plan] = experiment_runs(client, "vlaeval-plan")
        assert plan.data.params["tracking.uri"] == backend.replace("vlaeval@", "vlaeval:*****@")
        assert "hunter2" not in json.dumps({"params": plan.data.params, "tags": plan.data.tags})
    record_outcome(
        "tracking",
        "password in a postgresql:// tracking URI, on a real run",
        "params hold vlaeval:*****@; the password appears in no param, tag or console line",
        kind="bad input",
    )
    record_outcome(
        "tracking",
        "joblib sweeps (2 audits, 2 gauntlets) against mlflow server + PostgreSQL",
        "every child FINISHED under its parent, params, gate metrics and artifacts arrived; 0 runs lost",
        kind="set-up",
    )


@pytest.mark.slow
def test_shipped_server_script_with_postgres_and_an_s3_compatible_artifact_store(tmp_path, workdir):
    """scripts/tracking_server.sh as documented: PostgreSQL backend, artifacts proxied into an S3
    bucket (moto's server); the jobs have no S3 credentials, only the tracking URI."""
    with (
        postgres_server() as backend,
        S3Server("vlaeval-artifacts", tmp_path / "s3.log") as s3,
        MlflowServer(
            backend, "s3://vlaeval-artifacts/mlflow", tmp_path / "mlflow-server.log", script=True, env=s3.env
        ) as server,
    ):
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(os.environ)  # the jobs have no S3 access
        proc = run_main(
            ["-m", "effects=none,catastrophic_safety", *GAUNTLET_SMALL, "tracking=server"],
            workdir,
            env={"MLFLOW_TRACKING_URI": server.uri},
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        client = MlflowClient(tracking_uri=server.uri)
        children = check_sweep(client, "vlaeval-gauntlet", 2, workdir=workdir, proxied=True).children
        keys = s3.keys()
        for child in children:
            prefix = f"mlflow/{child.info.experiment_id}/{child.info.run_id}/artifacts/"
            assert {prefix + "result.json", prefix + "hydra/config.yaml"} <= set(keys)
    record_outcome(
        "tracking",
        "sweep against scripts/tracking_server.sh (PostgreSQL + S3-compatible store)",
        "every child FINISHED with its metrics; its artifacts are objects in the S3 bucket; 0 runs lost",
        kind="set-up",
    )


def _sqlite_server(tmp_path: Path, migrated_store: Path, port=None) -> MlflowServer:
    db = tmp_path / "server.db"
    if not db.exists():
        shutil.copy(migrated_store, db)
    return MlflowServer(f"sqlite:///{db}", tmp_path / "server-artifacts", tmp_path / "mlflow-server.log", port=port)


def _sync(workdir: Path, uri: str):
    return run_main(["job=sync", "tracking=server"], workdir, env={"MLFLOW_TRACKING_URI": uri})


def test_server_down_before_the_run_saves_locally_and_sync_uploads_it(tmp_path, workdir, migrated_store):
    server = _sqlite_server(tmp_path, migrated_store)  # not started yet: the port is closed
    proc = run_main(GAUNTLET_SMALL + ["tracking=server"], workdir, env={"MLFLOW_TRACKING_URI": server.uri})
    assert proc.returncode == 3
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"MLflow tracking at {server.uri} failed" in error[0]
    run_dir = next(workdir.glob("outputs/*_gauntlet"))
    assert f"the result is saved at {run_dir / 'result.json'}" in error[0] and "job=sync" in error[0]
    assert (run_dir / "mlflow_pending.json").is_file()
    local = json.loads((run_dir / "result.json").read_text())

    with server:
        synced = _sync(workdir, server.uri)
        assert synced.returncode == 0, synced.stderr[-3000:]
        assert "1 uploaded, 0 failed" in synced.stdout
        again = _sync(workdir, server.uri)  # nothing left to do, nothing duplicated
        assert again.returncode == 0 and "0 uploaded, 0 failed, of 0 queued" in again.stdout
        client = MlflowClient(tracking_uri=server.uri)
        runs = experiment_runs(client, "vlaeval-gauntlet")
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        result = assert_run_matches_its_result(client, runs[0], tmp_path)
        assert result["run_id"] == local["run_id"]
    assert not (run_dir / "mlflow_pending.json").exists()
    assert json.loads((run_dir / "mlflow_synced.json").read_text())["run_id"] == runs[0].info.run_id
    record_outcome(
        "tracking",
        "tracking server down before the run",
        "exit 3, one-line error naming the saved result and job=sync; sync uploaded it once; 0 lost",
    )


def test_server_killed_mid_run_then_sync_replaces_the_partial_run(tmp_path, workdir, migrated_store):
    server = _sqlite_server(tmp_path, migrated_store).start()
    try:
        with KillingProxy(server) as proxy:
            proc = run_main(GAUNTLET_SMALL + ["tracking=server"], workdir, env={"MLFLOW_TRACKING_URI": proxy.uri})
            assert proxy.killed.is_set(), "the server was never killed: the run did not reach log-batch"
    finally:
        server.stop()
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "failed" in proc.stderr and "job=sync" in proc.stderr
    run_dir = next(workdir.glob("outputs/*_gauntlet"))
    pending = json.loads((run_dir / "mlflow_pending.json").read_text())
    assert pending["partial_run_id"]  # the run had been created when the server died

    with _sqlite_server(tmp_path, migrated_store) as restarted:  # same store, back up
        client = MlflowClient(tracking_uri=restarted.uri)
        half = client.get_run(pending["partial_run_id"])
        # Created with its tags, killed at its first log-batch: no metrics, still RUNNING.
        assert half.info.status == "RUNNING" and not half.data.metrics and "vlaeval.run_id" in half.data.tags
        # The run was queued for the proxy's address, gone now; the same store answers at another.
        synced = run_main(
            ["job=sync", "tracking=server", "sync.to_configured_store=true"],
            workdir,
            env={"MLFLOW_TRACKING_URI": restarted.uri},
        )
        assert synced.returncode == 0, synced.stderr[-3000:]
        active = experiment_runs(client, "vlaeval-gauntlet")
        assert len(active) == 1 and active[0].info.run_id != pending["partial_run_id"]
        assert_run_matches_its_result(client, active[0], tmp_path)
        deleted = experiment_runs(client, "vlaeval-gauntlet", ViewType.DELETED_ONLY)
        assert [r.info.run_id for r in deleted] == [pending["partial_run_id"]]
    record_outcome(
        "tracking",
        "tracking server SIGKILLed mid-run (after the run was created)",
        "exit 3, result saved locally; sync deleted the partial run and uploaded the whole one; 0 lost",
    )
