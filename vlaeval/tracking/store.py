"""The door for a tracking backend: where a published run is recorded and read back.

A job hands `publish` (vlaeval/runs.py) its result; the result is saved first, then the run's
record -- backend-neutral JSON built by vlaeval.tracking.build_record: params, metrics, history,
gate checks, tags, artifacts, nested runs -- goes to the store `tracking.backend` names. The same
record is what an unreachable store leaves queued for job=sync. Reading back is typed: a store lists
a job's runs as `StoredRun` rows (job=gauntlet_history) and hands a run's saved config with its
metrics and tags as a `SavedRun` (job=reproduce). MLflow implements it
(vlaeval/tracking/mlflow_store.py); a store of your own is registered by name in RUN_STORES.
Sweep parents (vlaeval/tracking/sweeps.py) are MLflow's own and not part of the door.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

from vlaeval.config import TrackingSection

# name -> (module, class): imported on first use (a backend imports its client library then).
RUN_STORES: Dict[str, Tuple[str, str]] = {"mlflow": ("vlaeval.tracking.mlflow_store", "MlflowStore")}


@dataclass(frozen=True)
class StoredRun:
    """A run as a store lists it."""

    store_run_id: str  # the backend's own id (MLflow's run id)
    status: str  # FINISHED, FAILED, RUNNING
    start_ms: int
    end_ms: Optional[int]
    params: Mapping[str, str]
    metrics: Mapping[str, float]
    tags: Mapping[str, str]

    @property
    def run_id(self) -> str:
        """vlaeval's own run id (the `vlaeval.run_id` tag), else the store's."""
        return str(self.tags.get("vlaeval.run_id", self.store_run_id))

    @property
    def wall_s(self) -> Optional[float]:
        return None if self.end_ms is None else (self.end_ms - self.start_ms) / 1000


@dataclass(frozen=True)
class SavedRun:
    """What job=reproduce reads of a stored run: its saved config (downloaded), metrics and tags."""

    config_path: Path
    metrics: Mapping[str, float]
    tags: Mapping[str, str]


@runtime_checkable
class RunStore(Protocol):
    """A tracking backend. `record` publishes one run's record (spooling it beside the result while it
    uploads: a store that cannot be reached raises vlaeval.tracking.TrackingError and leaves it queued);
    `destination` is the store a queued record goes to (the one it was queued for, or this one:
    `to_configured`), shown without its password, and `sync` uploads it there, returning the run's id; `runs` lists a job's runs newest
    first whose params or tags equal `equals` ({"params.<key>" or "tags.<key>": value}); `read_json`
    reads a JSON artifact of a listed run; `saved_run` fetches a run by id; `annotate` adds tags,
    metrics and files to a finished run."""

    name: str
    uri: str  # shown without its password

    def record(self, record: Mapping[str, Any], base_dir: Path, result_path: Path) -> str: ...

    def destination(self, record: Mapping[str, Any], *, to_configured: bool = False) -> str: ...

    def sync(self, record: Mapping[str, Any], base_dir: Path, *, to_configured: bool = False) -> str: ...

    def runs(self, job: str, limit: int, equals: Optional[Mapping[str, str]] = None) -> List[StoredRun]: ...

    def read_json(self, run: StoredRun, name: str) -> Optional[Dict[str, Any]]: ...

    def saved_run(self, run_id: str, into: Path) -> SavedRun: ...

    def annotate(
        self,
        run_id: str,
        *,
        tags: Optional[Mapping[str, str]] = None,
        metrics: Optional[Mapping[str, float]] = None,
        artifacts: Sequence[Path] = (),
    ) -> None: ...


MEMBERS = ("name", "uri", "record", "destination", "sync", "runs", "read_json", "saved_run", "annotate")


def check_backend(name: str) -> None:
    """A registered backend's name (nothing imported: a job checks it before any work)."""
    from vlaeval.errors import UserInputError

    if name not in RUN_STORES:
        raise UserInputError(
            f"tracking.backend={name} is not a registered tracking store; choose one of "
            f"{', '.join(sorted(RUN_STORES))} (or register yours in vlaeval.tracking.store.RUN_STORES)"
        )


def run_store(tracking_cfg: TrackingSection) -> RunStore:
    """The store `tracking.backend` names, made for these tracking settings and checked against the
    protocol (a member it lacks is one line, naming it)."""
    from vlaeval.errors import UserInputError

    name = str(tracking_cfg.backend)
    check_backend(name)
    module, cls = RUN_STORES[name]
    store = getattr(importlib.import_module(module), cls)(tracking_cfg)
    missing = [m for m in MEMBERS if not hasattr(store, m)]
    if missing:
        raise UserInputError(
            f"tracking store {name} ({module}.{cls}) lacks {', '.join(missing)} of vlaeval/tracking/store.py"
        )
    return store
