"""Hydra callback that gives every multirun one MLflow parent run.

on_multirun_start (launching process, before any job): create the tracking store once -- parallel
jobs racing on a brand-new SQLite store corrupt it -- then open the parent run and write its id
to <sweep dir>/.vlaeval_parent_run.json, where every job (in this process or a joblib worker)
finds it and tags its own run as a child. on_job_end records a job that raised as a FAILED child
run. on_multirun_end closes the parent with a summary table of the children. Hydra does not call
on_multirun_end when a job fails, so an atexit hook closes a parent still RUNNING as FAILED.

Hydra instantiates callbacks before HydraConfig is set and swallows exceptions raised in them:
each hook therefore reads only the config it is given and reports its own failures. Every MLflow
call is in vlaeval.tracking.sweeps.
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, cast

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from vlaeval.errors import describe

log = logging.getLogger(__name__)

# Columns of the sweep summary per job: (header, kind, key) read from each child run.
SUMMARY_COLUMNS = {
    "gauntlet": (
        ("gate.pass", "tag", "gate.pass"),
        ("failed checks", "tag", "gate.failed"),
        ("recommendation", "tag", "recommendation"),
        ("units", "metric", "scale.units_evaluated"),
        ("halted", "tag", "halted"),
    ),
    "residual_audit": (
        ("gate.pass", "tag", "gate.pass"),
        ("failed checks", "tag", "gate.failed"),
        ("gate status", "tag", "gate.status"),
        ("estimator", "tag", "estimator.kind"),
        ("repeat rho", "metric", "repeatability.spearman"),
        ("grad rho", "metric", "alignment.spearman_residual_vs_gradient_rms"),
        ("ratio", "metric", "proposal.information_to_baseline_ratio"),
        ("oracle", "metric", "proposal.oracle_ratio"),
        ("p(ratio)", "metric", "permutation.p_second_moment"),
        ("loss ratio", "metric", "baseline.training_loss_ratio"),
    ),
    "ablation": (
        ("gate.pass", "tag", "gate.pass"),
        ("failed checks", "tag", "gate.failed"),
        ("predicted", "metric", "prediction.residual_ratio"),
        ("realized", "metric", "realized_ratio.residual"),
        ("realized high", "metric", "realized_ratio_high.residual"),
        ("x flow time", "metric", "realized_ratio.residual_flow_time"),
        ("held-out loss", "metric", "heldout_loss.residual"),
    ),
}
DEFAULT_COLUMNS = (("gate.pass", "tag", "gate.pass"), ("failed checks", "tag", "gate.failed"))


def sweep_preset(overrides: List[str]) -> Optional[str]:
    """The `+sweep=<name>` preset a sweep was started with, if any."""
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        if key == "sweep" and value:
            return value
    return None


class SweepTrackingCallback(Callback):
    def __init__(self) -> None:
        self._parent: Optional[Dict[str, Any]] = None
        self._closed = False

    # ---------------------------------------------------------------- multirun
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.tracking.enabled:
            return
        from vlaeval.tracking.sweeps import open_sweep_parent, swept_keys

        overrides = list(config.hydra.overrides.task)
        self._parent = open_sweep_parent(
            config.tracking,
            str(config.job.name),
            Path(str(config.hydra.sweep.dir)).resolve(),
            overrides,
            str(config.hydra.launcher.get("_target_", "")),
            sweep_preset(overrides),
            swept_keys(overrides, config.hydra.sweeper.get("params") or {}),
        )
        atexit.register(self._close_parent, "FAILED")
        log.info("sweep parent run %s in %s", self._parent["run_id"], self._parent["tracking_uri"])

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close_parent(None)

    # ---------------------------------------------------------------- jobs
    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """A job that raised leaves a FAILED run with its error, so a sweep shows every job."""
        from hydra.core.utils import JobStatus

        if job_return.status != JobStatus.FAILED or not config.tracking.enabled:
            return
        try:
            from omegaconf import OmegaConf

            from vlaeval.tracking.sweeps import record_failed_job

            multirun = str(config.hydra.mode) == "RunMode.MULTIRUN"
            record_failed_job(
                config.tracking,
                str(config.job.name),
                error=describe(job_return._return_value),
                output_dir=str(config.hydra.runtime.output_dir),
                overrides=list(config.hydra.overrides.task),
                sweep_dir=str(Path(str(config.hydra.sweep.dir)).resolve()) if multirun else None,
                job_num=int(config.hydra.job.num) if multirun else None,
                plain_cfg=cast(Dict[str, Any], OmegaConf.to_container(_job_config(job_return.cfg), resolve=False)),
            )
        except Exception as error:  # never mask the job's own error
            log.warning("could not record the failed job in MLflow: %s", error)

    # ---------------------------------------------------------------- parent
    def _close_parent(self, forced_status: Optional[str]) -> None:
        if self._parent is None or self._closed:
            return
        self._closed = True
        try:
            from vlaeval.tracking.sweeps import close_sweep_parent

            rows = close_sweep_parent(
                self._parent, forced_status, SUMMARY_COLUMNS.get(self._parent["job"], DEFAULT_COLUMNS)
            )
            print_summary_table(rows)
        except Exception as error:
            log.error("could not close the sweep parent run %s: %s", self._parent["run_id"], error)


def print_summary_table(rows: List[Dict[str, Any]]) -> None:
    from vlaeval import console

    headers = [h for h in (rows[0] if rows else {}) if h != "run_id"]
    console.show(console.table("Sweep summary", headers, [[r[h] for h in headers] for r in rows]))


def _job_config(cfg: Any) -> Any:
    """The failed job's config as its run would have logged it (its sections only), or all of it
    when even that cannot be worked out (an unknown job)."""
    from vlaeval.jobs import job_config

    try:
        return job_config(cfg)
    except Exception:
        return cfg
