"""Reading runs back from MLflow: a job's runs for job=gauntlet_history, a run's saved config,
metrics and tags for job=reproduce, and tagging a run afterwards."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from vlaeval.artifacts import read_json
from vlaeval.config import TrackingSection
from vlaeval.errors import UserInputError, first_line
from vlaeval.tracking import ensure_store, experiment_name, resolve_uri


def client_for(tracking_cfg: TrackingSection) -> Tuple[Any, str]:
    from mlflow.tracking import MlflowClient

    uri = resolve_uri(tracking_cfg)
    ensure_store(uri)
    return MlflowClient(tracking_uri=uri), uri


def filter_literal(value: str, setting: str) -> str:
    """`value` as a string literal of an MLflow filter: MLflow's parser has no escape, so a value with
    an apostrophe is double-quoted, one with a double quote single-quoted (never pasted in raw: a
    version `a' or '1'='1` would rewrite the query); one with both cannot be searched for."""
    text = str(value)
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    raise UserInputError(
        f"{setting}={text!r} holds both quote characters, which an MLflow filter cannot express; "
        "search for the run by its id (history.run_id) instead"
    )


def search_job_runs(
    tracking_cfg: TrackingSection, job_name: str, limit: int, filter_string: str = ""
) -> Tuple[Any, List[Any]]:
    """(client, runs) of a job's experiment, newest first, sweep parents left out."""
    client, _ = client_for(tracking_cfg)
    experiment = client.get_experiment_by_name(experiment_name(tracking_cfg, job_name))
    if experiment is None:
        return client, []
    where = "tags.`vlaeval.run_kind` != 'sweep_parent'" + (f" and {filter_string}" if filter_string else "")
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=where, order_by=["attributes.start_time DESC"], max_results=limit
    )
    return client, list(runs)


def run_json(client: Any, run_id: str, tags: Mapping[str, str], name: str) -> Optional[Dict[str, Any]]:
    """A JSON artifact of the run (its result), else the copy in the local output dir it names."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return read_json(client.download_artifacts(run_id, name, tmp))
    except Exception:
        local = Path(tags.get("hydra.output_dir", "")) / name
        return read_json(local) if local.is_file() else None


def saved_run(tracking_cfg: TrackingSection, run_id: str, into: Path) -> Tuple[Path, Dict[str, float], Dict[str, str]]:
    """(path of the run's hydra/config.yaml downloaded into `into`, its metrics, its tags)."""
    from mlflow.exceptions import MlflowException

    client, uri = client_for(tracking_cfg)
    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        raise UserInputError(
            f"no MLflow run {run_id!r} in {uri} ({first_line(error)}); "
            "pass a run id from the MLflow UI or a local run directory"
        ) from None
    try:
        path = Path(client.download_artifacts(run_id, "hydra/config.yaml", str(into)))
    except Exception as error:
        raise UserInputError(
            f"MLflow run {run_id} has no hydra/config.yaml artifact ({type(error).__name__}); "
            "it was not logged by vlaeval with tracking.log_artifacts=true"
        ) from None
    return path, dict(run.data.metrics), dict(run.data.tags)


def annotate_run(
    tracking_cfg: TrackingSection,
    run_id: str,
    *,
    tags: Optional[Mapping[str, str]] = None,
    metrics: Optional[Mapping[str, float]] = None,
    artifacts: Sequence[Path] = (),
) -> None:
    """Tags, metrics and artifacts added to a finished run (reproduce logs its comparison this way)."""
    import time

    from mlflow.entities import Metric, RunTag

    client, _ = client_for(tracking_cfg)
    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in dict(metrics or {}).items()],
        tags=[RunTag(k, str(v)) for k, v in dict(tags or {}).items()],
    )
    for path in artifacts:
        client.log_artifact(run_id, str(path))
