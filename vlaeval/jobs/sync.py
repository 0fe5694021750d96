"""job=sync: upload the runs that were saved locally while the tracking store was unreachable.

Find every queued run (mlflow_pending.json beside a result) under sync.paths; upload each to the
store it was queued for (the configured one supplies credentials when it is that store;
sync.to_configured_store=true sends every run to the configured store) -- once: a run already there under the same record id is not uploaded again, and
a partial run a killed upload left behind is deleted first; replace the queue file by a receipt
(mlflow_synced.json) naming the run; report what was uploaded and what still failed (exit 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

from vlaeval import console, tracking
from vlaeval.artifacts import atomic_write_json, read_json
from vlaeval.config import JobSettings, SyncConfig
from vlaeval.errors import describe, require
from vlaeval.runs import JobResult, SavedAsJson, output_dir
from vlaeval.tracking.store import run_store

JOB = "sync"
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
COMPONENTS: Tuple[str, ...] = ()  # no `_target_` groups
SYNCED_FILE = "mlflow_synced.json"


@dataclass(frozen=True, kw_only=True)
class SyncJobConfig(JobSettings):
    """The sections job=sync reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    sync: SyncConfig


@dataclass(frozen=True)
class SyncResult(SavedAsJson):
    """job=sync's report (sync.json): each queued run found, where it went and how it ended."""

    tracking_uri: str
    searched: List[str]
    runs: List[Dict[str, Any]]
    uploaded: int
    failed: int


def run(cfg: SyncJobConfig) -> JobResult[SyncResult]:
    require(
        cfg.tracking.enabled,
        "job=sync uploads to a tracking store: drop tracking=disabled (use tracking=server or tracking.uri=<store>)",
    )
    roots = [Path(str(p)) for p in cfg.sync.paths]
    store = run_store(cfg.tracking)
    shown_uri = store.uri
    queued = sorted(q for root in roots if root.is_dir() for q in root.rglob(tracking.PENDING_FILE))
    rows: List[Dict[str, Any]] = []
    for pending in queued:
        record = read_json(pending)
        row = {"run_dir": str(pending.parent), "experiment": record["experiment"], "record_id": record["record_id"]}
        try:
            to_configured = bool(cfg.sync.to_configured_store)
            row["tracking_uri"] = store.destination(record, to_configured=to_configured)
            row["run_id"] = store.sync(record, pending.parent, to_configured=to_configured)
            row["status"] = "uploaded"
            atomic_write_json(pending.parent / SYNCED_FILE, row)
            pending.unlink()
        except Exception as error:
            row["status"] = f"failed: {describe(error)}"
        rows.append(row)
    report = SyncResult(
        tracking_uri=shown_uri,
        searched=[str(r) for r in roots],
        runs=rows,
        uploaded=sum(r["status"] == "uploaded" for r in rows),
        failed=sum(r["status"] != "uploaded" for r in rows),
    )
    atomic_write_json(output_dir(cfg) / "sync.json", report.to_json())
    console.show(
        console.table(
            f"Queued runs synced to {shown_uri}",
            ["run dir", "experiment", "store", "run id", "status"],
            [
                (r["run_dir"], r["experiment"], r.get("tracking_uri", "-"), r.get("run_id", "-"), r["status"])
                for r in rows
            ],
        )
    )
    console.show(
        f"{report.uploaded} uploaded, {report.failed} failed, of {len(rows)} queued under {', '.join(report.searched)}"
    )
    if report.failed:
        first = next(r for r in rows if r["status"] != "uploaded")
        raise tracking.TrackingError(
            f"{report.failed} queued run(s) could not be uploaded ({first['run_dir']}: {first['status']}); "
            "they stay queued: run job=sync again once the store is reachable"
        )
    return JobResult(report, None)
