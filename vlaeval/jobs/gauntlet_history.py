"""job=gauntlet_history: list past gauntlet runs from MLflow and show the latest in full."""

from __future__ import annotations

import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict

from omegaconf import DictConfig

from vlaeval import console
from vlaeval.artifacts import atomic_write_json, read_json
from vlaeval.config import require
from vlaeval.jobs.common import RESULT_FILE, output_dir
from vlaeval.jobs.gauntlet import JOB as GAUNTLET_JOB
from vlaeval.jobs.gauntlet import print_summary
from vlaeval.tracking import resolve_uri, search_job_runs


def run(cfg: DictConfig) -> Dict[str, Any]:
    require(cfg.tracking.enabled, "job=gauntlet_history reads MLflow: drop tracking=disabled")
    require(cfg.history.limit >= 1, f"history.limit={cfg.history.limit} must be >= 1")
    client, runs = search_job_runs(cfg.tracking, GAUNTLET_JOB, int(cfg.history.limit))
    uri = resolve_uri(cfg.tracking)
    rows = [_row(r) for r in runs]
    if not rows:
        console.show(f"no gauntlet runs in {uri} yet: run `python main.py job=gauntlet`")
        return {"runs": [], "latest": None}
    console.show(console.table(
        f"Gauntlet runs in {uri} (newest first)",
        ["run id", "started", "status", "recommendation", "units evaluated", "wall s", "overrides"],
        [(r["run_id"], r["started"], r["status"], r["recommendation"], r["units_evaluated"],
          r["wall_s"], r["overrides"]) for r in rows]))
    latest = next((r for r in runs if r.info.status == "FINISHED"), None)
    latest_result = _load_result(client, latest) if latest is not None else None
    if latest_result is not None:
        console.show(f"\nlatest finished run {latest.info.run_id}:")
        print_summary(latest_result)
    history = {"tracking_uri": uri, "runs": rows, "latest": latest_result}
    atomic_write_json(output_dir(cfg) / "history.json", history)
    return history


def _row(r: Any) -> Dict[str, Any]:
    metrics, tags = r.data.metrics, r.data.tags
    wall = metrics.get("timing.wall_s")
    if wall is None and r.info.end_time:
        wall = (r.info.end_time - r.info.start_time) / 1000
    return {
        "run_id": r.info.run_id,
        "started": datetime.fromtimestamp(r.info.start_time / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "status": r.info.status,
        "recommendation": tags.get("recommendation", "-"),
        "units_evaluated": int(metrics["scale.units_evaluated"]) if "scale.units_evaluated" in metrics else None,
        "wall_s": None if wall is None else round(float(wall), 3),
        "overrides": tags.get("hydra.overrides", ""),
    }


def _load_result(client: Any, r: Any) -> Dict[str, Any] | None:
    """The run's result JSON: from its artifacts, else from the local output dir it names."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return read_json(client.download_artifacts(r.info.run_id, RESULT_FILE, tmp))
    except Exception:
        local = Path(r.data.tags.get("hydra.output_dir", "")) / RESULT_FILE
        return read_json(local) if local.is_file() else None
