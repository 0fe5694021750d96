"""A sweep's parent run in MLflow: opened before the jobs start, closed with a summary of their
gate outcomes, and a FAILED child for a job that raised (vlaeval.callbacks calls these)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from vlaeval.artifacts import atomic_write_json, atomic_write_text
from vlaeval.config import TrackingSection
from vlaeval.tracking import (
    PARENT_RUN_FILE,
    RunLogger,
    clip_run_name,
    configure_http,
    ensure_store,
    experiment_name,
    get_or_create_experiment,
    override_key,
    read_parent_run,
    redact_uri,
    resolve_uri,
    run_params,
)

Column = Tuple[str, str, str]  # (header, "tag" or "metric", key)


def swept_keys(overrides: Sequence[str], sweeper_params: Mapping[str, Any]) -> List[str]:
    """The keys a sweep varies: command-line sweep overrides (`estimator=iid,sobol`, `range(...)`,
    `choice(...)`) and a preset's `hydra.sweeper.params`, in that order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    keys = [override_key(o.input_line or "") for o in parsed if o.is_sweep_override()]
    return keys + [str(k) for k in sweeper_params if str(k) not in keys]


def open_sweep_parent(
    tracking_cfg: TrackingSection,
    job_name: str,
    sweep_dir: Path,
    overrides: Sequence[str],
    launcher: str,
    preset: Optional[str],
    swept: Sequence[str] = (),
) -> Dict[str, Any]:
    """Create the store once (parallel jobs racing on a new SQLite store corrupt it), open the
    parent run, and leave its id and the swept keys in the sweep folder for the jobs (and Slurm
    nodes) to find. The parent is named after the preset, or the sweep overrides."""
    from mlflow.tracking import MlflowClient

    uri = resolve_uri(tracking_cfg)
    configure_http(tracking_cfg)
    ensure_store(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment_id = get_or_create_experiment(client, experiment_name(tracking_cfg, job_name))
    sweeping = [o for o in overrides if override_key(o) in swept]
    described = preset or (" ".join(sweeping or overrides) or "(no overrides)")
    run = client.create_run(
        experiment_id,
        tags={
            "mlflow.runName": clip_run_name(f"sweep {described} ({sweep_dir.name})"),
            "vlaeval.run_kind": "sweep_parent",
            "vlaeval.job": job_name,
            "vlaeval.sweep_preset": preset or "(none)",
            "hydra.sweep_dir": str(sweep_dir),
            "hydra.overrides": redact_uri(" ".join(overrides)) or "(none)",
            "hydra.launcher": launcher,
        },
    )
    parent = {
        "run_id": run.info.run_id,
        "experiment_id": experiment_id,
        "tracking_uri": uri,
        "sweep_dir": str(sweep_dir),
        "job": job_name,
        "swept_keys": list(swept),
    }
    atomic_write_json(sweep_dir / PARENT_RUN_FILE, parent)
    return parent


def record_failed_job(
    tracking_cfg: TrackingSection,
    job_name: str,
    *,
    error: str,
    output_dir: str,
    overrides: Sequence[str],
    sweep_dir: Optional[str],
    job_num: Optional[int],
    plain_cfg: Mapping[str, Any],
) -> str:
    """A FAILED run for a job that raised, under the sweep's parent when there is one."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=resolve_uri(tracking_cfg))
    experiment_id = get_or_create_experiment(client, experiment_name(tracking_cfg, job_name))
    tags = {
        "vlaeval.run_kind": "job",
        "vlaeval.job": job_name,
        "vlaeval.error": error,
        "hydra.output_dir": output_dir,
        "hydra.overrides": redact_uri(" ".join(overrides)),
    }
    parent = read_parent_run(sweep_dir)
    if parent:
        tags.update(
            {"mlflow.parentRunId": parent["run_id"], "hydra.sweep_dir": str(sweep_dir), "hydra.job_num": str(job_num)}
        )
    run = client.create_run(experiment_id, tags=tags)
    RunLogger(client, run.info.run_id).log_params(run_params(dict(plain_cfg)))
    client.set_terminated(run.info.run_id, status="FAILED")
    return run.info.run_id


def close_sweep_parent(
    parent: Mapping[str, Any], forced_status: Optional[str], columns: Sequence[Column]
) -> List[Dict[str, Any]]:
    """Summarise the children (one row each, in job order) into sweep_summary.{json,md} logged to
    the parent, with sweep.* metrics, and close the parent: FINISHED unless a child failed."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client, parent_id = MlflowClient(tracking_uri=parent["tracking_uri"]), str(parent["run_id"])
    children = client.search_runs(
        [parent["experiment_id"]], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'", max_results=10_000
    )
    failed = [c for c in children if c.info.status != "FINISHED"]
    status = forced_status or ("FAILED" if failed else "FINISHED")
    rows = summary_rows(children, columns)
    sweep_dir = Path(parent["sweep_dir"])
    for path in (
        atomic_write_json(sweep_dir / "sweep_summary.json", rows),
        atomic_write_text(sweep_dir / "sweep_summary.md", render_summary(rows)),
    ):
        client.log_artifact(parent_id, str(path))
    now = int(time.time() * 1000)
    client.log_batch(
        parent_id,
        metrics=[
            Metric("sweep.jobs", float(len(children)), now, 0),
            Metric("sweep.failed_jobs", float(len(failed)), now, 0),
            Metric("sweep.gate_passed_jobs", float(sum(r.get("gate.pass") == "true" for r in rows)), now, 0),
        ],
    )
    gated = [r for r in rows if r.get("gate.pass") in ("true", "false")]
    if gated:  # the outcome in the parent's name: seen in the runs table without expanding it
        passed = sum(r["gate.pass"] == "true" for r in gated)
        name = client.get_run(parent_id).info.run_name
        client.update_run(parent_id, name=clip_run_name(f"{name} · gate passed {passed} of {len(gated)}"))
    client.set_terminated(parent_id, status=status)
    return rows


def summary_rows(children: List[Any], columns: Sequence[Column]) -> List[Dict[str, Any]]:
    rows = []
    for child in sorted(children, key=lambda r: int(r.data.tags.get("hydra.job_num", 10**9))):
        tags, metrics = child.data.tags, child.data.metrics
        row: Dict[str, Any] = {
            "job": tags.get("hydra.job_num"),
            "run_id": child.info.run_id,
            "status": child.info.status,
            "overrides": tags.get("hydra.overrides", ""),
        }
        for header, kind, key in columns:
            value = tags.get(key) if kind == "tag" else metrics.get(key)
            row[header] = round(value, 4) if isinstance(value, float) else value
        gate_metrics = {k[len("gate.") :]: v for k, v in metrics.items() if k.startswith("gate.")}
        row["gate_checks_passed"] = f"{int(sum(gate_metrics.values()))}/{len(gate_metrics)}" if gate_metrics else None
        row["error"] = tags.get("vlaeval.error")
        rows.append(row)
    return rows


def render_summary(rows: List[Dict[str, Any]]) -> str:
    if not rows:
        return "no child runs\n"
    headers = list(rows[0])
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join("" if r[h] is None else str(r[h]) for h in headers) + " |" for r in rows]
    return "\n".join(lines) + "\n"
