"""MLflow as a tracking store (vlaeval/tracking/store.py: RunStore): a run's record becomes an MLflow
run (vlaeval.tracking: upload_record), a job's runs are read back as typed rows, filters quote the
user's values (vlaeval.tracking.queries: filter_literal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from vlaeval import tracking
from vlaeval.config import TrackingSection
from vlaeval.tracking import queries
from vlaeval.tracking.store import SavedRun, StoredRun


class MlflowStore:
    name = "mlflow"

    def __init__(self, tracking_cfg: TrackingSection) -> None:
        self.settings = tracking_cfg
        self._uri = tracking.resolve_uri(tracking_cfg)
        self.uri = tracking.redact_uri(self._uri)

    def record(self, record: Mapping[str, Any], base_dir: Path, result_path: Path) -> str:
        return tracking.record_run(self.settings, dict(record), base_dir, result_path)

    def destination(self, record: Mapping[str, Any], *, to_configured: bool = False) -> str:
        return tracking.redact_uri(tracking.sync_target(record, self._uri, to_configured=to_configured))

    def sync(self, record: Mapping[str, Any], base_dir: Path, *, to_configured: bool = False) -> str:
        tracking.configure_http(self.settings)
        target = tracking.sync_target(record, self._uri, to_configured=to_configured)
        return tracking.upload_record(target, dict(record), base_dir)

    def runs(self, job: str, limit: int, equals: Optional[Mapping[str, str]] = None) -> List[StoredRun]:
        filters = []
        for key, value in dict(equals or {}).items():
            kind, _, name = key.partition(".")
            if kind not in ("params", "tags") or not name:
                raise ValueError(f"a run filter is params.<key> or tags.<key>, not {key!r}")
            filters.append(f"{kind}.`{name}` = {queries.filter_literal(value, key)}")
        _, found = queries.search_job_runs(self.settings, job, int(limit), " and ".join(filters))
        return [
            StoredRun(
                store_run_id=r.info.run_id,
                status=str(r.info.status),
                start_ms=int(r.info.start_time),
                end_ms=int(r.info.end_time) if r.info.end_time else None,
                params=dict(r.data.params),
                metrics=dict(r.data.metrics),
                tags=dict(r.data.tags),
            )
            for r in found
        ]

    def read_json(self, run: StoredRun, name: str) -> Optional[Dict[str, Any]]:
        client, _ = queries.client_for(self.settings)
        return queries.run_json(client, run.store_run_id, run.tags, name)

    def saved_run(self, run_id: str, into: Path) -> SavedRun:
        path, metrics, tags = queries.saved_run(self.settings, run_id, into)
        return SavedRun(path, metrics, tags)

    def annotate(
        self,
        run_id: str,
        *,
        tags: Optional[Mapping[str, str]] = None,
        metrics: Optional[Mapping[str, float]] = None,
        artifacts: Sequence[Path] = (),
    ) -> None:
        queries.annotate_run(self.settings, run_id, tags=tags, metrics=metrics, artifacts=artifacts)
