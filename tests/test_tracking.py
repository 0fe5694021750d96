"""MLflow end to end: a run's params, metrics, checks, tags and artifacts; real -m sweeps with
the basic and joblib launchers into brand-new SQLite stores; history and reproduce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from helpers.processes import run_main, sqlite_uri
from helpers.reliability import record_outcome
from helpers.runs import check_sweep, runs_of
from vlaeval.tracking import MAX_RUN_NAME_CHARS, clip_run_name, flatten, mask_secrets
from vlaeval.tracking.sweeps import swept_keys


def test_flatten_and_mask():
    flat = flatten({"a": {"b": [1, {"c": 2}], "e": []}, "db": {"password": "hunter2", "api_key": "k", "token": None}})
    assert flat == {
        "a.b.0": 1,
        "a.b.1.c": 2,
        "a.e": "[]",
        "db.password": "hunter2",
        "db.api_key": "k",
        "db.token": None,
    }
    masked = mask_secrets(flat)
    assert masked["db.password"] == "*****" and masked["db.api_key"] == "*****" and masked["a.b.0"] == 1


def test_scalar_lists_are_one_param():
    flat = flatten(
        {
            "seeds": list(range(5000, 5512)),
            "evens": list(range(0, 20, 2)),
            "few": [3, 1, 2],
            "names": [f"t{i}" for i in range(9)],
            "mixed": [1, {"a": 2}] * 5,
            "huge": [0.5, 1] * 2000,
        }
    )
    assert flat["seeds"] == "range(5000, 5512)" and flat["evens"] == "range(0, 20, 2)"
    assert flat["few"] == "[3, 1, 2]" and "few.0" not in flat  # short lists too: one column for a swept list
    assert flatten({"seeds": [9300, 9301, 9302, 9303]})["seeds"] == "range(9300, 9304)"
    assert flat["names"] == json.dumps([f"t{i}" for i in range(9)])
    assert flat["mixed.1.a"] == 2  # lists holding structures are still flattened
    assert len(flat["huge"]) == 6000 and flat["huge"].endswith("... (4000 values)")
    assert not any(key.startswith("seeds.") for key in flat)


def test_run_names_fit_every_backend_and_name_what_was_swept():
    # PostgreSQL refuses a run name over 250 characters (a sweep of many overrides made one).
    long = "sweep " + " ".join(f"key{i}=value{i}" for i in range(60))
    assert len(clip_run_name(long)) == MAX_RUN_NAME_CHARS == 250 and clip_run_name(long).endswith("…")
    assert clip_run_name("audit  sobol\n#2") == "audit sobol #2"
    overrides = [
        "job=residual_audit",
        "estimator=iid,sobol",
        "data=tiny",
        "gradients.seeds=${range:100,116}",
        "+sweep=audit_seeds",
        "x=range(1,3)",
        "+y=choice(a,b)",
    ]
    assert swept_keys(overrides, {"estimator.seeds": "[1],[2]"}) == ["estimator", "x", "y", "estimator.seeds"]


@pytest.mark.slow
def test_single_run_logs_everything(workdir, store):
    proc = run_main(["job=gauntlet", "effects=safety_regression_mild"], workdir, env={"MLFLOW_TRACKING_URI": store})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REGRESSION_PRIORITIZE_RELATED" in proc.stdout and "DO_NOT_LAUNCH" in proc.stdout
    client, runs = runs_of(store)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
    assert params["gauntlet.margin_delta"] == "0.02"
    assert params["strata.safety_critical.related"] == '["historical_regressions", "rare_events"]'
    assert params["effects.safety_critical"] == "-0.035"
    assert not [k for k in params if k.startswith("paths.")]  # machine paths are no compare axis (a tag instead)
    assert metrics["stratum.safety_critical.decision_regression"] == 1.0
    assert metrics["gate.no_stratum_regression"] == 0.0 and metrics["gate.no_catastrophic_halt"] == 1.0
    assert tags["gate.pass"] == "false" and tags["recommendation"] == "DO_NOT_LAUNCH"
    assert tags["halted"] == "false" and tags["stratum.safety_critical.decision"] == "REGRESSION"
    for key in ("git.sha", "git.dirty", "vlaeval.version", "config.sha256", "hydra.output_dir"):
        assert key in tags, key
    history = client.get_metric_history(run.info.run_id, "stratum.safety_critical.e_value_regression")
    assert [m.step for m in history] == list(range(1, len(history) + 1)) and len(history) >= 2
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"result.json", "hydra", "plots"} <= artifacts
    assert {a.path for a in client.list_artifacts(run.info.run_id, "hydra")} >= {
        "hydra/config.yaml",
        "hydra/overrides.yaml",
    }
    local = Path(tags["hydra.output_dir"]) / "result.json"
    downloaded = json.loads(Path(client.download_artifacts(run.info.run_id, "result.json", str(workdir))).read_text())
    assert downloaded == json.loads(local.read_text())
    assert downloaded["processed_order"][:3] == ["safety_critical", "historical_regressions", "rare_events"]

    # gauntlet_history lists it and shows it in full
    hist = run_main(["job=gauntlet_history"], workdir, env={"MLFLOW_TRACKING_URI": store})
    assert hist.returncode == 0, hist.stderr[-3000:]
    assert run.info.run_id in hist.stdout and "DO_NOT_LAUNCH" in hist.stdout
    assert f"latest finished run {tags['vlaeval.run_id']} (mlflow {run.info.run_id})" in hist.stdout

    # reproduce by run id: identical numbers, a new run tagged with its origin
    rep = run_main(
        ["job=reproduce", f"reproduce.run_id={run.info.run_id}"], workdir, env={"MLFLOW_TRACKING_URI": store}
    )
    assert rep.returncode == 0, rep.stderr[-3000:]
    report = json.loads(next(workdir.glob("outputs/*_reproduce/reproduce.json")).read_text())
    assert report["all_identical"], [c for c in report["comparisons"] if c["verdict"] != "identical"]
    assert len(report["comparisons"]) > 40
    assert "0 differ" in rep.stdout
    _, runs = runs_of(store)
    reproduced = [r for r in runs if r.data.tags.get("vlaeval.reproduced_from") == run.info.run_id]
    assert (
        len(reproduced) == 1 and reproduced[0].data.metrics["scale.units_evaluated"] == metrics["scale.units_evaluated"]
    )


@pytest.mark.slow
def test_reproduce_from_a_run_directory_and_detects_differences(workdir):
    run_dir = workdir / "original"
    proc = run_main(["job=gauntlet", "tracking=disabled", "strata=small", f"hydra.run.dir={run_dir}"], workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same = run_main(
        ["job=reproduce", "tracking=disabled", f"reproduce.run_id={run_dir}", "hydra.run.dir=" + str(workdir / "rep1")],
        workdir,
    )
    assert same.returncode == 0, same.stderr[-3000:]
    assert json.loads((workdir / "rep1" / "reproduce.json").read_text())["all_identical"]
    # a changed setting on top of the saved config is reported as a difference
    changed = run_main(
        [
            "job=reproduce",
            "tracking=disabled",
            f"reproduce.run_id={run_dir}",
            'reproduce.job_overrides=["gauntlet.seed=12"]',
            "hydra.run.dir=" + str(workdir / "rep2"),
        ],
        workdir,
    )
    report = json.loads((workdir / "rep2" / "reproduce.json").read_text())
    assert not report["all_identical"] and "differ  <- NOT reproduced" in changed.stdout
    assert any(c["key"] == "config.sha256" and c["verdict"] == "differs" for c in report["comparisons"])


def test_reproduce_refuses_targets_outside_vlaeval(workdir):
    run_dir = workdir / "evil"
    (run_dir / ".hydra").mkdir(parents=True)
    config = {"job": {"name": "gauntlet"}, "outcomes": {"_target_": "os.system", "path": "rm -rf /"}}
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "result.json").write_text(json.dumps({"metrics": {}, "tags": {}}))
    proc = run_main(["job=reproduce", "tracking=disabled", f"reproduce.run_id={run_dir}"], workdir)
    assert proc.returncode == 2
    assert "outcomes._target_='os.system', outside the 'vlaeval.' namespace: refused" in proc.stderr
    assert not any(workdir.glob("outputs/*"))
    record_outcome(
        "configs",
        "saved config with _target_: os.system, reproduced",
        "exit 2: refused before anything is instantiated, nothing written",
        kind="bad input",
    )


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "local_processes", "local_submitit"])
def test_multirun_sweep_into_a_brand_new_store(workdir, launcher):
    """The basic launcher and our presets (conf/hydra/launcher/): local_processes is the joblib
    plugin (used as shipped, hydra/launcher=joblib, by the tracking-server tests); local_submitit
    goes through submitit's submit/pickle/result path, as the slurm preset does."""
    uri = sqlite_uri(workdir / "fresh" / "mlflow.db")  # does not exist yet: the callback creates it once
    args = [
        "-m",
        "job=gauntlet",
        "effects=none,catastrophic_safety,safety_regression_mild",
        "strata=small",
        "gauntlet.plot=false",
    ]
    if launcher != "basic":
        args += [f"hydra/launcher={launcher}"]
    proc = run_main(args, workdir, env={"MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Sweep summary" in proc.stdout
    client = MlflowClient(tracking_uri=uri)
    children = check_sweep(client, "vlaeval-gauntlet", 3, sweep_root=workdir / "multirun_sweeps").children
    assert all("gate.lineage_valid" in c.data.metrics for c in children)
    by_effect = {
        c.data.params["effects.safety_critical"] if "effects.safety_critical" in c.data.params else "none": c
        for c in children
    }
    assert by_effect["-0.15"].data.tags["halted"] == "true"  # conf/effects/catastrophic_safety.yaml
    assert by_effect["none"].data.tags["recommendation"] in ("LAUNCH", "NEEDS_REVIEW")
    if launcher == "local_submitit":  # one submitit job per sweep point, each with its own log
        [sweep_dir] = (workdir / "multirun_sweeps").glob("*")
        assert len(list((sweep_dir / ".submitit").glob("*_log.out"))) == 3


@pytest.mark.slow
def test_failed_job_in_a_sweep_leaves_nothing_running(workdir, store):
    proc = run_main(
        ["-m", "job=gauntlet", "gauntlet.alpha=0.05,1.5", "strata=small", "gauntlet.plot=false"],
        workdir,
        env={"MLFLOW_TRACKING_URI": store},
    )
    assert proc.returncode == 2
    assert "gauntlet.alpha=1.5 must be in (0, 1)" in proc.stderr
    _, runs = runs_of(store)
    assert runs and all(r.info.status != "RUNNING" for r in runs)
    parent = [r for r in runs if r.data.tags.get("vlaeval.run_kind") == "sweep_parent"][0]
    assert parent.info.status == "FAILED"
    assert [r.info.status for r in runs if r.data.tags.get("vlaeval.run_kind") == "job"] == ["FINISHED"]


@pytest.mark.slow
def test_job_that_raises_is_recorded_as_failed_child(workdir, store):
    """An unexpected exception (not bad input) in every job: FAILED children carrying the error,
    a FAILED parent, nothing left RUNNING, and a non-zero exit."""
    proc = run_main(
        ["-m", "job=gauntlet", "gauntlet.seed=1,2", "strata=small", "paths.cache_dir=/dev/null/cache"],
        workdir,
        env={"MLFLOW_TRACKING_URI": store},
    )
    assert proc.returncode == 1
    _, runs = runs_of(store)
    assert runs and all(r.info.status != "RUNNING" for r in runs)
    children = [r for r in runs if r.data.tags.get("vlaeval.run_kind") == "job"]
    parent = [r for r in runs if r.data.tags.get("vlaeval.run_kind") == "sweep_parent"][0]
    assert len(children) == 2 and all(c.info.status == "FAILED" for c in children)
    assert all("NotADirectoryError" in c.data.tags["vlaeval.error"] for c in children)
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert parent.info.status == "FAILED"


def test_asymptotic_mode_is_labelled_in_mlflow(workdir, store):
    proc = run_main(
        ["job=gauntlet", "strata=small", "gauntlet.test_mode=asymptotic"], workdir, env={"MLFLOW_TRACKING_URI": store}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ASYMPTOTIC" in proc.stdout and "NEEDS_REVIEW" in proc.stdout
    client, runs = runs_of(store)
    run = runs[0]
    assert run.data.tags["gauntlet.test_mode"] == "asymptotic"
    assert run.data.tags["recommendation"] == "NEEDS_REVIEW"
    assert "stratum.safety_critical.e_value_pass" not in run.data.metrics  # no e-values to misread
    assert len(client.get_metric_history(run.info.run_id, "stratum.safety_critical.cs_upper")) >= 1
    assert run.data.metrics["preflight.ok"] == 1.0


def test_a_sweep_childs_name_starts_with_what_differs():
    """The MLflow runs table cuts a long run name at its end: what tells children apart comes first."""
    from vlaeval.runs import sweep_child_label

    a = sweep_child_label("audit sobol 3e84c0ffee", 2, ["estimator.seeds=[1,2,3]"])
    b = sweep_child_label("audit sobol 3e84c0ffee", 3, ["estimator.seeds=[4,5,6]"])
    assert a.startswith("estimator.seeds=[1,2,3] #2") and b.startswith("estimator.seeds=[4,5,6] #3")
    assert a[:24] != b[:24] and a.endswith("· audit sobol 3e84c0ffee")
    assert sweep_child_label("gauntlet", 0, []) == "#0 · gauntlet"
    assert sweep_child_label("audit", 1, ["estimator=iid"], gate=False) == "gate FAIL · estimator=iid #1 · audit"


def test_user_values_in_history_filters_are_quoted_not_pasted(tmp_path):
    """A candidate version with an apostrophe is found, one shaped like an injection matches only
    itself, and one with both quote characters is one line (MLflow's filter parser has no escape)."""
    from mlflow.tracking import MlflowClient

    from vlaeval.errors import UserInputError
    from vlaeval.tracking.queries import filter_literal

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'q.db'}")
    experiment = client.create_experiment("q")
    versions = ["bob's-v2", 'say "hi"', "plain", "a' or '1'='1"]
    for version in versions:
        client.log_param(client.create_run(experiment).info.run_id, "gauntlet.candidate_version", version)
    for version in versions:
        where = f"params.`gauntlet.candidate_version` = {filter_literal(version, 'history.candidate_version')}"
        found = [r.data.params["gauntlet.candidate_version"] for r in client.search_runs([experiment], where)]
        assert found == [version], (version, found)
    with pytest.raises(UserInputError, match="holds both quote characters"):
        filter_literal("""it's "x\"""", "history.candidate_version")


class FolderStore:
    """A tracking store of the test's own (vlaeval/tracking/store.py: RunStore): each run's record a
    JSON file in the folder tracking.uri names."""

    name = "folder"

    def __init__(self, tracking_cfg):
        self.root = Path(str(tracking_cfg.uri))
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = f"folder:{self.root}"

    def record(self, record, base_dir, result_path):
        from vlaeval.artifacts import atomic_write_json

        entry = {**record, "status": "FINISHED", "base_dir": str(base_dir), "end_time_ms": record["start_time_ms"]}
        atomic_write_json(self.root / f"{record['record_id']}.json", entry)
        return str(record["record_id"])

    def destination(self, record, *, to_configured=False):
        return self.uri

    def sync(self, record, base_dir, *, to_configured=False):
        return self.record(record, base_dir, None)

    def runs(self, job, limit, equals=None):
        from vlaeval.artifacts import read_json
        from vlaeval.tracking.store import StoredRun

        found = []
        for path in sorted(self.root.glob("*.json")):
            r = read_json(path)
            if r["tags"].get("vlaeval.job") != job:
                continue
            run = StoredRun(
                r["record_id"], r["status"], r["start_time_ms"], r["end_time_ms"],
                {k: str(v) for k, v in r["params"].items()}, r["metrics"], r["tags"],
            )  # fmt: skip
            where = {"params": run.params, "tags": run.tags}
            if all(where[k.split(".", 1)[0]].get(k.split(".", 1)[1]) == v for k, v in dict(equals or {}).items()):
                found.append(run)
        return sorted(found, key=lambda run: -run.start_ms)[:limit]

    def read_json(self, run, name):
        from vlaeval.artifacts import read_json

        path = Path(read_json(self.root / f"{run.store_run_id}.json")["base_dir"]) / name
        return read_json(path) if path.is_file() else None

    def saved_run(self, run_id, into):
        from vlaeval.artifacts import read_json
        from vlaeval.tracking.store import SavedRun

        r = read_json(self.root / f"{run_id}.json")
        return SavedRun(Path(r["base_dir"]) / ".hydra" / "config.yaml", r["metrics"], r["tags"])

    def annotate(self, run_id, *, tags=None, metrics=None, artifacts=()):
        from vlaeval.artifacts import atomic_write_json, read_json

        r = read_json(self.root / f"{run_id}.json")
        r["tags"].update(dict(tags or {}))
        r["metrics"].update(dict(metrics or {}))
        atomic_write_json(self.root / f"{run_id}.json", r)


def test_a_tracking_store_of_ones_own_records_the_run_and_history_reads_it_back(tmp_path, monkeypatch):
    """tracking.backend chooses the store by name: a run is published to a store of the test's own
    (its record, its typed RunRecord), job=gauntlet_history lists it from there as typed rows, the
    candidate filter picks it out; an unregistered backend is one line before any work."""
    from helpers.configs import compose_config
    from vlaeval.errors import UserInputError
    from vlaeval.jobs import dispatch
    from vlaeval.tracking.store import RUN_STORES, RunStore, run_store

    monkeypatch.setitem(RUN_STORES, "folder", (__name__, "FolderStore"))
    store_args = ["tracking.backend=folder", f"tracking.uri={tmp_path / 'store'}"]
    assert isinstance(run_store(compose_config(store_args).tracking), RunStore)
    for version in ("cand-a", "cand-b"):
        overrides = ["job=gauntlet", "strata=small", "gauntlet.plot=false", f"gauntlet.candidate_version={version}"]
        cfg = compose_config([*overrides, *store_args], output_dir=tmp_path / version, cache_dir=tmp_path / "cache")
        ran = dispatch(cfg, [])
        assert ran.run.store == "folder" and ran.run.store_run_id is not None
        record = json.loads((tmp_path / "store" / f"{ran.run.store_run_id}.json").read_text())
        assert record["params"]["gauntlet.candidate_version"] == version
        assert record["tags"]["recommendation"] == ran.result.recommendation.recommendation
        assert ran.run.where().endswith(f"folder run: {ran.run.store_run_id}")

    history = ["job=gauntlet_history", "history.candidate_version=cand-a", f"history.local_paths=[{tmp_path / 'none'}]"]
    shown = dispatch(compose_config([*history, *store_args], output_dir=tmp_path / "history"), []).result
    assert [(r["candidate_version"], r["where"]) for r in shown.runs] == [("cand-a", "folder")]
    assert shown.shown is not None and shown.shown["candidate_version"] == "cand-a"  # read through the store

    with pytest.raises(UserInputError, match=r"^tracking.backend=wandb is not a registered tracking store"):
        dispatch(compose_config(["job=gauntlet", "tracking.backend=wandb"], output_dir=tmp_path / "x"), [])
    assert not (tmp_path / "x").exists()
