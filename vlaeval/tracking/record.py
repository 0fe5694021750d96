"""A published run as every backend records it: backend-neutral, what a job's result carries back to
its caller (the command line's exit code, job=reproduce's comparison, the summary's last line)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class ChildRun:
    """A run nested under a job's run (one per proposal and seed of an ablation): its name, params,
    metrics, metric history (step, value), tags, its own result (saved as children/<name>.json) and,
    once saved, the artifacts it is logged with."""

    name: str
    params: Mapping[str, Any]
    metrics: Mapping[str, Optional[float]]
    history: Mapping[str, Sequence[Tuple[int, Optional[float]]]]
    tags: Mapping[str, Any]
    result: Mapping[str, Any]
    artifacts: Sequence[Tuple[Path, Optional[str]]] = ()


@dataclass(frozen=True)
class RunRecord:
    """What publishing a run recorded: its unique id, its saved result file, its run in the tracking
    store (None: tracking off), the gate's checks, the metrics and tags logged."""

    run_id: str
    job: str
    result_path: Path
    store: str  # the tracking backend's name (tracking.backend)
    store_run_id: Optional[str]  # the backend's id of the run (MLflow's run id)
    tracked: bool
    config_sha256: str
    checks: Mapping[str, bool]
    metrics: Mapping[str, Optional[float]]
    tags: Mapping[str, Any]

    def where(self) -> str:
        """`result: <file>   mlflow run: <id>`: the line a job's summary ends with."""
        return f"result: {self.result_path}" + (
            f"   {self.store} run: {self.store_run_id}" if self.store_run_id else ""
        )
