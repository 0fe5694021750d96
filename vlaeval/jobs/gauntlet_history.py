"""job=gauntlet_history: what did past gauntlets recommend?

List the newest gauntlet runs -- from MLflow, and from local run folders MLflow does not have (run
with tracking disabled, or queued for job=sync) -- optionally only one candidate's or one
recommendation's, marking halted runs; then show one run in full: the one `history.run_id` names
(a vlaeval run id or an MLflow run id), else the newest finished one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from vlaeval import console
from vlaeval.artifacts import atomic_write_json, read_json
from vlaeval.config import HistoryConfig, JobSettings
from vlaeval.errors import require, require_at_least
from vlaeval.gauntlet.recommendation import DO_NOT_LAUNCH, LAUNCH, NEEDS_REVIEW
from vlaeval.gauntlet.report import print_summary
from vlaeval.gauntlet.result import GauntletResult
from vlaeval.runs import RESULT_FILE, JobResult, output_dir
from vlaeval.tracking import PENDING_FILE
from vlaeval.tracking.store import run_store

JOB = "gauntlet_history"
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
COMPONENTS: Tuple[str, ...] = ()  # no `_target_` groups
RECOMMENDATIONS = (LAUNCH, DO_NOT_LAUNCH, NEEDS_REVIEW)


@dataclass(frozen=True, kw_only=True)
class HistoryJobConfig(JobSettings):
    """The sections job=gauntlet_history reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    history: HistoryConfig


@dataclass(frozen=True)
class HistoryResult:
    """job=gauntlet_history's result (history.json): the runs listed, newest first, where they were
    found (None: tracking off), and the result of the run shown in full (None: none)."""

    tracking_uri: Optional[str]
    runs: List[Dict[str, Any]]
    shown: Optional[Dict[str, Any]]

    def to_json(self) -> Dict[str, Any]:
        return {"tracking_uri": self.tracking_uri, "runs": self.runs, "shown": self.shown}


def run(cfg: HistoryJobConfig) -> JobResult[HistoryResult]:
    h = cfg.history
    require_at_least("history.limit", h.limit, 1)
    require(
        h.recommendation is None or h.recommendation in RECOMMENDATIONS,
        f"history.recommendation={h.recommendation!r} is unknown; use one of {', '.join(RECOMMENDATIONS)}",
    )
    tracked: List[Dict[str, Any]] = []
    uri = None
    if cfg.tracking.enabled:
        tracked, uri = tracked_rows(cfg)
    local = [r for r in local_rows(cfg) if r["run_id"] not in {t["run_id"] for t in tracked}]
    rows = sorted(tracked + local, key=lambda r: r["started"], reverse=True)[: int(h.limit)]
    where = (f"{uri} and " if uri else "") + "local run folders " + ", ".join(h.local_paths)
    if not rows:
        console.show(f"no gauntlet runs in {where} yet: run `python main.py job=gauntlet`")
        return JobResult(HistoryResult(uri, [], None), None)
    show_runs(rows, where)
    shown = pick(rows, h.run_id)
    if h.run_id is not None:
        require(
            shown is not None,
            f"history.run_id={h.run_id} is not among the listed gauntlet runs; check the id or raise history.limit",
        )
    result = show_run(shown, "run" if h.run_id is not None else "latest finished run")
    history = HistoryResult(uri, [{k: v for k, v in r.items() if k != "load"} for r in rows], result)
    atomic_write_json(output_dir(cfg) / "history.json", history.to_json())
    return JobResult(history, None)


COLUMNS = ["run id", "mlflow run", "started", "status", "candidate", "recommendation", "halted", "units", "wall s"]


def show_runs(rows: List[Dict[str, Any]], where: str) -> None:
    """The table of runs, newest first."""
    table = [
        (
            r["run_id"],
            r["mlflow_run_id"] or r["where"],
            r["started"],
            r["status"],
            r["candidate_version"],
            r["recommendation"],
            "HALTED" if r["halted"] else "",
            r["units_evaluated"],
            r["wall_s"],
            r["overrides"],
        )
        for r in rows
    ]
    console.show(console.table(f"Gauntlet runs in {where} (newest first)", [*COLUMNS, "overrides"], table))


def show_run(shown: Optional[Dict[str, Any]], which: str) -> Optional[Dict[str, Any]]:
    """The picked run's saved result, its full report printed (None: no run, or its result is gone)."""
    result = shown["load"]() if shown is not None else None
    if shown is not None and result is not None:
        mlflow_id = f" (mlflow {shown['mlflow_run_id']})" if shown["mlflow_run_id"] else ""
        console.show(f"\n{which} {shown['run_id']}{mlflow_id}:")
        print_summary(GauntletResult.from_json(result))  # a result of any earlier version reads
    return result


def pick(rows: List[Dict[str, Any]], run_id: Optional[str]) -> Optional[Dict[str, Any]]:
    if run_id is not None:
        return next((r for r in rows if run_id in (r["run_id"], r["mlflow_run_id"])), None)
    return next((r for r in rows if r["status"] == "FINISHED"), None)


def tracked_rows(cfg: HistoryJobConfig) -> tuple[List[Dict[str, Any]], str]:
    """The gauntlet's runs in the tracking store (tracking.backend), newest first, as table rows."""
    h, equals = cfg.history, {}
    if h.candidate_version is not None:
        equals["params.gauntlet.candidate_version"] = str(h.candidate_version)
    if h.recommendation is not None:
        equals["tags.recommendation"] = str(h.recommendation)
    store = run_store(cfg.tracking)
    rows = []
    for r in store.runs("gauntlet", int(h.limit), equals):
        rows.append(
            {
                "run_id": r.run_id,
                "mlflow_run_id": r.store_run_id,
                "where": store.name,
                "started": _time(r.start_ms),
                "status": r.status,
                "candidate_version": r.params.get("gauntlet.candidate_version", "-"),
                "recommendation": r.tags.get("recommendation", "-"),
                "halted": r.tags.get("halted") == "true",
                "units_evaluated": int(r.metrics["scale.units_evaluated"])
                if "scale.units_evaluated" in r.metrics
                else None,
                "wall_s": None if r.wall_s is None else round(r.wall_s, 1),
                "overrides": r.tags.get("hydra.overrides", ""),
                "load": lambda r=r: store.read_json(r, RESULT_FILE),
            }
        )
    return rows, store.uri


def local_rows(cfg: HistoryJobConfig) -> List[Dict[str, Any]]:
    """Gauntlet results in the local run folders that MLflow does not hold: run with tracking
    disabled, or queued for job=sync (the result and the queue file sit side by side)."""
    rows = []
    for folder in cfg.history.local_paths:
        for path in sorted(Path(str(folder)).rglob(RESULT_FILE)) if Path(str(folder)).is_dir() else []:
            try:
                result = read_json(path)
            except (OSError, ValueError):
                continue
            if result.get("job") != "gauntlet":
                continue
            queued = (path.parent / PENDING_FILE).is_file()
            if result.get("tracked", True) and not queued:
                continue  # tracked and uploaded: MLflow lists it
            rec = result.get("recommendation", {}).get("recommendation", "-")
            version = result.get("candidate_version", "-")
            if cfg.history.candidate_version is not None and version != cfg.history.candidate_version:
                continue
            if cfg.history.recommendation is not None and rec != cfg.history.recommendation:
                continue
            rows.append(
                {
                    "run_id": result.get("run_id", path.parent.name),
                    "mlflow_run_id": None,
                    "where": "queued for sync" if queued else "local (untracked)",
                    "started": _time(path.stat().st_mtime * 1000),
                    "status": "FINISHED",
                    "candidate_version": version,
                    "recommendation": rec,
                    "halted": bool(result.get("halted")),
                    "units_evaluated": result.get("scale", {}).get("units_evaluated"),
                    "wall_s": round(result.get("metrics", {}).get("timing.job_s", 0.0), 1) or None,
                    "overrides": result.get("tags", {}).get("hydra.overrides", ""),
                    "load": lambda result=result: result,
                }
            )
    return rows


def _time(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
