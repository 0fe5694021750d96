"""job=gauntlet_history: what did past gauntlets recommend?

List the newest gauntlet runs -- from MLflow, and from local run folders MLflow does not have (run
with tracking disabled, or queued for job=sync) -- optionally only one candidate's or one
recommendation's, marking halted runs; then show one run in full: the one `history.run_id` names
(a vlaeval run id or an MLflow run id), else the newest finished one.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig

from vlaeval import console
from vlaeval.artifacts import atomic_write_json, read_json
from vlaeval.errors import require, require_at_least
from vlaeval.gauntlet.recommendation import DO_NOT_LAUNCH, LAUNCH, NEEDS_REVIEW
from vlaeval.gauntlet.report import print_summary
from vlaeval.gauntlet.result import GauntletResult
from vlaeval.runs import RESULT_FILE, output_dir
from vlaeval.tracking import PENDING_FILE, resolve_uri

JOB = "gauntlet_history"
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
COMPONENTS: Tuple[str, ...] = ()  # no `_target_` groups
READS = ("history",)
RECOMMENDATIONS = (LAUNCH, DO_NOT_LAUNCH, NEEDS_REVIEW)


def run(cfg: DictConfig) -> Dict[str, Any]:
    h = cfg.history
    require_at_least("history.limit", h.limit, 1)
    require(
        h.recommendation is None or h.recommendation in RECOMMENDATIONS,
        f"history.recommendation={h.recommendation!r} is unknown; use one of {', '.join(RECOMMENDATIONS)}",
    )
    tracked: List[Dict[str, Any]] = []
    uri = None
    if cfg.tracking.enabled:
        tracked, uri = mlflow_rows(cfg)
    local = [r for r in local_rows(cfg) if r["run_id"] not in {t["run_id"] for t in tracked}]
    rows = sorted(tracked + local, key=lambda r: r["started"], reverse=True)[: int(h.limit)]
    where = (f"{uri} and " if uri else "") + "local run folders " + ", ".join(h.local_paths)
    if not rows:
        console.show(f"no gauntlet runs in {where} yet: run `python main.py job=gauntlet`")
        return {"runs": [], "shown": None}
    console.show(
        console.table(
            f"Gauntlet runs in {where} (newest first)",
            [
                "run id",
                "mlflow run",
                "started",
                "status",
                "candidate",
                "recommendation",
                "halted",
                "units",
                "wall s",
                "overrides",
            ],
            [
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
            ],
        )
    )
    shown = pick(rows, h.run_id)
    if h.run_id is not None:
        require(
            shown is not None,
            f"history.run_id={h.run_id} is not among the listed gauntlet runs; check the id or raise history.limit",
        )
    result = shown["load"]() if shown is not None else None
    if shown is not None and result is not None:
        which = "run" if h.run_id is not None else "latest finished run"
        mlflow_id = f" (mlflow {shown['mlflow_run_id']})" if shown["mlflow_run_id"] else ""
        console.show(f"\n{which} {shown['run_id']}{mlflow_id}:")
        print_summary(GauntletResult.from_json(result), result)  # a result of any earlier version reads
    history = {
        "tracking_uri": uri,
        "runs": [{k: v for k, v in r.items() if k != "load"} for r in rows],
        "shown": result,
    }
    atomic_write_json(output_dir(cfg) / "history.json", history)
    return history


def pick(rows: List[Dict[str, Any]], run_id: Optional[str]) -> Optional[Dict[str, Any]]:
    if run_id is not None:
        return next((r for r in rows if run_id in (r["run_id"], r["mlflow_run_id"])), None)
    return next((r for r in rows if r["status"] == "FINISHED"), None)


def mlflow_rows(cfg: DictConfig) -> tuple[List[Dict[str, Any]], str]:
    from vlaeval.tracking.queries import filter_literal, run_json, search_job_runs

    h, filters = cfg.history, []
    if h.candidate_version is not None:
        value = filter_literal(h.candidate_version, "history.candidate_version")
        filters.append(f"params.`gauntlet.candidate_version` = {value}")
    if h.recommendation is not None:
        filters.append(f"tags.recommendation = {filter_literal(h.recommendation, 'history.recommendation')}")
    client, runs = search_job_runs(cfg.tracking, "gauntlet", int(cfg.history.limit), " and ".join(filters))
    rows = []
    for r in runs:
        metrics, tags, params = r.data.metrics, r.data.tags, r.data.params
        wall = (r.info.end_time - r.info.start_time) / 1000 if r.info.end_time else None
        rows.append(
            {
                "run_id": tags.get("vlaeval.run_id", r.info.run_id),
                "mlflow_run_id": r.info.run_id,
                "where": "mlflow",
                "started": _time(r.info.start_time),
                "status": r.info.status,
                "candidate_version": params.get("gauntlet.candidate_version", "-"),
                "recommendation": tags.get("recommendation", "-"),
                "halted": tags.get("halted") == "true",
                "units_evaluated": int(metrics["scale.units_evaluated"])
                if "scale.units_evaluated" in metrics
                else None,
                "wall_s": None if wall is None else round(wall, 1),
                "overrides": tags.get("hydra.overrides", ""),
                "load": lambda r=r: run_json(client, r, RESULT_FILE),
            }
        )
    return rows, resolve_uri(cfg.tracking)


def local_rows(cfg: DictConfig) -> List[Dict[str, Any]]:
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
