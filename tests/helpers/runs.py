"""Finding and checking MLflow runs and sweeps (the one place the tests read a sweep back)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from vlaeval.config import POLICY_SECTIONS, SHARED_SECTIONS
from vlaeval.jobs import job_module, reads


def experiment_runs(client: MlflowClient, name: str, view=ViewType.ACTIVE_ONLY) -> List[Any]:
    experiment = client.get_experiment_by_name(name)
    return (
        []
        if experiment is None
        else client.search_runs([experiment.experiment_id], run_view_type=view, max_results=1000)
    )


def runs_of(uri: str, experiment: str = "vlaeval-gauntlet"):
    """(client, runs) of an experiment that must exist."""
    client = MlflowClient(tracking_uri=uri)
    assert client.get_experiment_by_name(experiment) is not None, experiment
    return client, experiment_runs(client, experiment)


@dataclass
class Sweep:
    experiment_id: str
    parent: Any
    children: List[Any]  # in job order


def sweep_of(client: MlflowClient, experiment: str) -> Sweep:
    """The one sweep of an experiment: its parent run and children."""
    runs = experiment_runs(client, experiment)
    parents = [r for r in runs if r.data.tags.get("vlaeval.run_kind") == "sweep_parent"]
    assert len(parents) == 1, [r.info.run_id for r in parents]
    children = sorted(
        (r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id),
        key=lambda r: int(r.data.tags["hydra.job_num"]),
    )
    return Sweep(parents[0].info.experiment_id, parents[0], children)


def check_sweep(
    client: MlflowClient,
    experiment: str,
    expected_children: int,
    *,
    sweep_root: Optional[Path] = None,
    workdir: Optional[Path] = None,
    proxied: bool = False,
) -> Sweep:
    """A finished sweep: one FINISHED parent with its summary, every child FINISHED under it in job
    order, named after what it swept, with the whole config as params and the gate tags; with
    `workdir`, every child's metrics equal its local result.json; with `proxied`, artifacts went
    through the server."""
    sweep = sweep_of(client, experiment)
    parent, children = sweep.parent, sweep.children
    assert parent.info.status == "FINISHED"
    assert len(children) == expected_children
    assert [int(c.data.tags["hydra.job_num"]) for c in children] == list(range(expected_children))
    assert parent.data.metrics["sweep.jobs"] == expected_children
    passed = int(parent.data.metrics["sweep.gate_passed_jobs"])
    assert parent.info.run_name.endswith(f" · gate passed {passed} of {expected_children}"), parent.info.run_name
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"sweep_summary.json", "sweep_summary.md"}
    names = [c.data.tags["mlflow.runName"] for c in children]
    assert len(set(names)) == len(names), names  # told apart by what they swept
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags["vlaeval.run_kind"] == "job"
        assert {"gate.pass", "gate.failed", "vlaeval.run_id"} <= set(child.data.tags)
        # Its gate's outcome leads its name: seen in the runs table without ticking a column.
        outcome = "PASS" if child.data.tags["gate.pass"] == "true" else "FAIL"
        assert child.data.tags["mlflow.runName"].startswith(f"gate {outcome} · "), child.data.tags["mlflow.runName"]
        # The job's own config sections, flattened: no section the job does not read.
        job_name = child.data.tags["vlaeval.job"]
        sections = {key.split(".")[0] for key in child.data.params}
        allowed = {*SHARED_SECTIONS, *reads(job_module(job_name)), *POLICY_SECTIONS}
        assert "job" in sections and sections <= allowed, sorted(sections - allowed)
        assert len(child.data.params) > 20
        if proxied:
            assert child.info.artifact_uri.startswith("mlflow-artifacts:/")
        if workdir is not None:
            assert_run_matches_its_result(client, child, workdir)
    if sweep_root is not None:
        sweep_dirs = list(Path(sweep_root).glob("*"))
        assert len(sweep_dirs) == 1 and (sweep_dirs[0] / "sweep_summary.md").exists()
    return sweep


def summary_of(client: MlflowClient, sweep: Sweep, into: Path) -> list:
    return json.loads(
        Path(client.download_artifacts(sweep.parent.info.run_id, "sweep_summary.json", str(into))).read_text()
    )


def assert_run_matches_its_result(client: MlflowClient, run: Any, workdir: Path) -> dict:
    """Every metric and gate check in the local result.json arrived, and so did the artifacts."""
    result = json.loads(Path(client.download_artifacts(run.info.run_id, "result.json", str(workdir))).read_text())
    for key, value in result["metrics"].items():
        if value is not None:
            assert run.data.metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    for name, ok in result["checks"].items():
        assert run.data.metrics[f"gate.{name}"] == float(ok)
    assert run.data.tags["gate.pass"] == result["tags"]["gate.pass"]
    assert run.data.tags["vlaeval.run_id"] == result["run_id"]
    assert run.data.params["job.name"] == result["job"]
    assert run.data.tags["config.sha256"] == result["config_sha256"]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "hydra")} >= {
        "hydra/config.yaml",
        "hydra/overrides.yaml",
    }
    return result
