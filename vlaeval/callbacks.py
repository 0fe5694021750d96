"""Hydra callback that gives every multirun one MLflow parent run.

on_multirun_start (launching process, before any job): create the tracking store once -- parallel
jobs racing on a brand-new SQLite store corrupt it -- then open the parent run and write its id
to <sweep dir>/.vlaeval_parent_run.json, where every job (in this process or a joblib worker)
finds it and tags its own run as a child. on_job_end records a job that raised as a FAILED child
run. on_multirun_end closes the parent with a summary table of the children. Hydra does not call
on_multirun_end when a job fails, so an atexit hook closes a parent still RUNNING as FAILED.

Hydra instantiates callbacks before HydraConfig is set and swallows exceptions raised in them:
each hook therefore reads only the config it is given and reports its own failures.
"""

from __future__ import annotations

import atexit
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from vlaeval.artifacts import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)

# Columns of the sweep summary per job: (header, kind, key) read from each child run.
SUMMARY_COLUMNS = {
    "gauntlet": (("gate.pass", "tag", "gate.pass"), ("recommendation", "tag", "recommendation"),
                 ("units", "metric", "scale.units_evaluated"), ("halted", "tag", "halted")),
    "residual_audit": (("gate.pass", "tag", "gate.pass"), ("status", "tag", "gate.status"),
                       ("estimator", "tag", "estimator.kind"), ("repeat rho", "metric", "repeatability.spearman"),
                       ("grad rho", "metric", "alignment.spearman_residual_vs_gradient_rms"),
                       ("ratio", "metric", "proposal.information_to_baseline_ratio"),
                       ("oracle", "metric", "proposal.oracle_ratio"), ("p(ratio)", "metric", "permutation.p_second_moment"),
                       ("loss ratio", "metric", "baseline.training_loss_ratio")),
}
DEFAULT_COLUMNS = (("gate.pass", "tag", "gate.pass"),)


class SweepTrackingCallback(Callback):
    def __init__(self) -> None:
        self._parent: Optional[Dict[str, Any]] = None
        self._closed = False

    # ---------------------------------------------------------------- multirun
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.tracking.enabled:
            return
        from mlflow.tracking import MlflowClient

        from vlaeval import tracking

        uri = tracking.resolve_uri(config.tracking)
        tracking.configure_http(config.tracking)
        tracking.ensure_store(uri)
        client = MlflowClient(tracking_uri=uri)
        job_name = str(config.job.name)
        experiment_id = tracking.get_or_create_experiment(client, tracking.experiment_name(config.tracking, job_name))
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        overrides = " ".join(config.hydra.overrides.task)
        run = client.create_run(experiment_id, tags={
            "mlflow.runName": f"sweep {sweep_dir.name}",
            "vlaeval.run_kind": "sweep_parent",
            "vlaeval.job": job_name,
            "hydra.sweep_dir": str(sweep_dir),
            "hydra.overrides": tracking.redact_uri(overrides) or "(none)",
            "hydra.launcher": str(config.hydra.launcher.get("_target_", "")),
        })
        self._parent = {"run_id": run.info.run_id, "experiment_id": experiment_id, "tracking_uri": uri,
                        "sweep_dir": str(sweep_dir), "job": job_name}
        atomic_write_json(sweep_dir / tracking.PARENT_RUN_FILE, self._parent)
        atexit.register(self._close_parent, "FAILED")
        log.info("sweep parent run %s in %s", run.info.run_id, uri)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close_parent(None)

    # ---------------------------------------------------------------- jobs
    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """A job that raised leaves a FAILED run with its error, so a sweep shows every job."""
        from hydra.core.utils import JobStatus

        if job_return.status != JobStatus.FAILED or not config.tracking.enabled:
            return
        try:
            self._record_failed_job(config, job_return)
        except Exception as error:  # never mask the job's own error
            log.warning("could not record the failed job in MLflow: %s", error)

    def _record_failed_job(self, config: DictConfig, job_return: Any) -> None:
        from mlflow.tracking import MlflowClient

        from vlaeval import tracking
        from vlaeval.tracking import RunLogger, flatten, mask_secrets

        uri = tracking.resolve_uri(config.tracking)
        sweep_dir = str(Path(str(config.hydra.sweep.dir)).resolve()) if str(config.hydra.mode) == "RunMode.MULTIRUN" else None
        parent = tracking.read_parent_run(sweep_dir)
        client = MlflowClient(tracking_uri=uri)
        experiment_id = tracking.get_or_create_experiment(client, tracking.experiment_name(config.tracking, str(config.job.name)))
        error = job_return._return_value
        tags = {"vlaeval.run_kind": "job", "vlaeval.job": str(config.job.name),
                "vlaeval.error": f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}",
                "hydra.output_dir": str(config.hydra.runtime.output_dir),
                "hydra.overrides": " ".join(config.hydra.overrides.task)}
        if parent:
            tags["mlflow.parentRunId"] = parent["run_id"]
            tags["hydra.sweep_dir"] = sweep_dir
            tags["hydra.job_num"] = str(config.hydra.job.num)
        run = client.create_run(experiment_id, tags=tags)
        logger = RunLogger(client, run.info.run_id)
        from omegaconf import OmegaConf

        plain = OmegaConf.to_container(job_return.cfg, resolve=False)
        logger.log_params(mask_secrets(flatten(plain)))
        client.set_terminated(run.info.run_id, status="FAILED")

    # ---------------------------------------------------------------- parent
    def _close_parent(self, forced_status: Optional[str]) -> None:
        if self._parent is None or self._closed:
            return
        self._closed = True
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self._parent["tracking_uri"])
            children = client.search_runs([self._parent["experiment_id"]],
                                          filter_string=f"tags.`mlflow.parentRunId` = '{self._parent['run_id']}'",
                                          max_results=10_000)
            failed = [c for c in children if c.info.status != "FINISHED"]
            status = forced_status or ("FAILED" if failed else "FINISHED")
            rows = summary_rows(children, SUMMARY_COLUMNS.get(self._parent["job"], DEFAULT_COLUMNS))
            text = render_summary(rows)
            sweep_dir = Path(self._parent["sweep_dir"])
            summary_json = atomic_write_json(sweep_dir / "sweep_summary.json", rows)
            summary_md = atomic_write_text(sweep_dir / "sweep_summary.md", text)
            client.log_artifact(self._parent["run_id"], str(summary_json))
            client.log_artifact(self._parent["run_id"], str(summary_md))
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            client.log_batch(self._parent["run_id"], metrics=[
                Metric("sweep.jobs", float(len(children)), now, 0),
                Metric("sweep.failed_jobs", float(len(failed)), now, 0),
                Metric("sweep.gate_passed_jobs", float(sum(r.get("gate.pass") == "true" for r in rows)), now, 0),
            ])
            client.set_terminated(self._parent["run_id"], status=status)
            print_summary_table(rows)
        except Exception as error:
            log.error("could not close the sweep parent run %s: %s", self._parent["run_id"], error)


def summary_rows(children: List[Any], columns: Any) -> List[Dict[str, Any]]:
    rows = []
    for child in sorted(children, key=lambda r: int(r.data.tags.get("hydra.job_num", 10**9))):
        tags, metrics = child.data.tags, child.data.metrics
        row: Dict[str, Any] = {"job": tags.get("hydra.job_num"), "run_id": child.info.run_id,
                               "status": child.info.status, "overrides": tags.get("hydra.overrides", "")}
        for header, kind, key in columns:
            value = tags.get(key) if kind == "tag" else metrics.get(key)
            row[header] = round(value, 4) if isinstance(value, float) else value
        gate_metrics = {k[len("gate."):]: v for k, v in metrics.items() if k.startswith("gate.")}
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


def print_summary_table(rows: List[Dict[str, Any]]) -> None:
    from vlaeval import console

    headers = [h for h in (rows[0] if rows else {}) if h != "run_id"]
    console.show(console.table("Sweep summary", headers, [[r[h] for h in headers] for r in rows]))
