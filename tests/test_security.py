"""Untrusted input: secrets never reach the tracking store, queued artifact paths cannot escape
their folder, and outcome-file contents never become file names. (Weights-only checkpoint
loading and `_target_` outside vlaeval. on reproduce are tested in test_policy_data and
test_tracking.)"""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from helpers.configs import compose_config, typed_gauntlet
from helpers.outcomes import outcome_table
from helpers.processes import run_main
from helpers.reliability import record_outcome
from vlaeval.config import to_plain
from vlaeval.tracking import MASK, flatten, mask_secrets

DEAD_SERVER = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def test_secret_keys_and_uri_passwords_are_masked_in_the_logged_params():
    plain = to_plain(
        compose_config(
            ["tracking.uri=postgresql://vlaeval:hunter2@db.internal:5432/mlflow"],
            output_dir=Path("out"),
            cache_dir=Path("cache"),
        )
    )
    plain["outcomes"]["api_token"] = "tok-123"
    plain["storage"] = {"aws_secret_access_key": "AKIA-SECRET", "password": "pw", "key": "k", "monkey": "banana"}
    params = mask_secrets(flatten(plain))
    assert params["tracking.uri"] == f"postgresql://vlaeval:{MASK}@db.internal:5432/mlflow"
    assert params["outcomes.api_token"] == params["storage.aws_secret_access_key"] == MASK
    assert params["storage.password"] == params["storage.key"] == MASK
    assert params["storage.monkey"] == "banana"  # a word that merely ends in "key" is not a secret key
    assert not any(secret in str(v) for v in params.values() for secret in ("hunter2", "tok-123", "AKIA", "pw"))
    record_outcome(
        "tracking",
        "secrets in the config (password, token, secret, key, URI password)",
        "masked as ***** in every logged param",
        kind="bad input",
    )


def _queued_run(workdir: Path) -> Path:
    proc = run_main(
        ["job=plan", "gauntlet.plan_replications=50", "tracking=server", "tracking.uri=http://127.0.0.1:9"],
        workdir,
        env=DEAD_SERVER,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    return next(workdir.glob("outputs/*_plan/mlflow_pending.json"))


def test_tampered_queued_artifact_paths_cannot_escape_their_folder(workdir, store):
    pending = _queued_run(workdir)
    record = json.loads(pending.read_text())
    for tampered, needle in (
        ({"root": "run", "path": "../../../../../etc/passwd", "artifact_path": None}, "escapes its folder (run)"),
        ({"root": "run", "path": "result.json", "artifact_path": "../../outside"}, "escapes the run's artifact root"),
        ({"root": "/", "path": "etc/passwd", "artifact_path": None}, "escapes its folder"),
    ):
        pending.write_text(json.dumps({**record, "artifacts": record["artifacts"] + [tampered]}))
        # The run was queued for a dead server: sync.to_configured_store sends it to this store instead.
        proc = run_main(["job=sync", f"tracking.uri={store}", "sync.to_configured_store=true"], workdir)
        assert proc.returncode == 3 and "0 uploaded, 1 failed" in proc.stdout
        report = json.loads(sorted(workdir.glob("outputs/*_sync/sync.json"))[-1].read_text())
        assert needle in report["runs"][0]["status"]
        client = MlflowClient(tracking_uri=store)
        experiment = client.get_experiment_by_name("vlaeval-plan")
        assert experiment is None or not client.search_runs([experiment.experiment_id])  # nothing uploaded
        assert pending.exists()  # still queued, for a human to look at
        record_outcome(
            "tracking",
            f"queued run whose artifact entry is {tampered}",
            f"job=sync refuses it ({needle}), uploads nothing, exit 3, the queue file stays",
            kind="bad input",
        )
    pending.write_text(json.dumps(record))  # the untampered record goes through
    proc = run_main(["job=sync", f"tracking.uri={store}", "sync.to_configured_store=true"], workdir)
    assert proc.returncode == 0 and "1 uploaded, 0 failed" in proc.stdout


def test_a_queued_run_goes_to_the_store_it_was_queued_for(workdir, store):
    """A run queued for a tracking server is not quietly uploaded to whatever store job=sync is
    configured with (the local SQLite store by default): it goes to its own store, or to the
    configured one when sync.to_configured_store=true says so."""
    pending = _queued_run(workdir)
    assert json.loads(pending.read_text())["tracking_uri"] == "http://127.0.0.1:9"
    proc = run_main(["job=sync", f"tracking.uri={store}"], workdir, env=DEAD_SERVER)
    assert proc.returncode == 3 and "0 uploaded, 1 failed" in proc.stdout
    report = json.loads(sorted(workdir.glob("outputs/*_sync/sync.json"))[-1].read_text())
    assert report["runs"][0]["tracking_uri"] == "http://127.0.0.1:9" and pending.exists()
    assert MlflowClient(tracking_uri=store).get_experiment_by_name("vlaeval-plan") is None  # nothing here
    moved = run_main(["job=sync", f"tracking.uri={store}", "sync.to_configured_store=true"], workdir)
    assert moved.returncode == 0 and "1 uploaded, 0 failed" in moved.stdout and not pending.exists()
    experiment = MlflowClient(tracking_uri=store).get_experiment_by_name("vlaeval-plan")
    assert experiment is not None and len(MlflowClient(tracking_uri=store).search_runs([experiment.experiment_id])) == 1
    record_outcome(
        "tracking",
        "job=sync with another store than the one a run was queued for",
        "uploads to the run's own store (here unreachable: exit 3, still queued); "
        "sync.to_configured_store=true moves it",
        kind="fault",
    )


def test_outcome_ids_that_look_like_paths_never_become_file_names(workdir):
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    table = outcome_table(strata)
    table["scenario_id"] = [f"../../../../escape/{i}" for i in range(len(table))]
    table["cluster_id"] = "../../" + table["cluster_id"] + "/x"
    path = workdir / "outcomes.csv"
    table.to_csv(path, index=False)
    proc = run_main(
        [
            "job=gauntlet",
            "strata=small",
            "outcomes=file",
            f"outcomes.path={path}",
            "tracking=disabled",
            "gauntlet.plot=false",
        ],
        workdir,
        env={"VLAEVAL_CACHE_DIR": str(workdir / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (workdir.parent / "escape").exists() and not Path("/escape").exists()
    written = [p for p in workdir.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(workdir.resolve()) for p in written)
    assert not any("escape" in str(p) for p in written)
    record_outcome(
        "outcome files",
        "scenario and cluster ids shaped like ../../ paths",
        "treated as opaque ids: the gauntlet runs, every file stays under its own folder",
        kind="bad input",
    )
