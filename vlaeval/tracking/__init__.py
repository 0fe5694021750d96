"""Everything MLflow: the store, runs, flattened params, metrics, gate checks, tags, artifacts.

mlflow is imported lazily (it costs ~2 s), so `--help`, `--cfg job` and config tests stay fast.
A brand-new SQLite store is created once, under a file lock: MLflow migrates a new database
without a lock, and parallel processes racing on that corrupt it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

from filelock import FileLock

from vlaeval.artifacts import atomic_write_json, sha256_json
from vlaeval.config import TrackingSection
from vlaeval.errors import describe, first_line
from vlaeval.provenance import CodeVersion
from vlaeval.tracking.record import ChildRun

PARENT_RUN_FILE = ".vlaeval_parent_run.json"
# A run that could not reach the tracking store waits here, beside its result, for job=sync.
PENDING_FILE = "mlflow_pending.json"
RECORD_SCHEMA_VERSION = 1
MAX_PARAM_CHARS = 6000
MAX_TAG_CHARS = 8000
# MLflow stores a run's name in a VARCHAR(250) column: PostgreSQL refuses a longer one (SQLite does not).
MAX_RUN_NAME_CHARS = 250
SECRET_KEY = re.compile(r"(password|passwd|secret|token|credential|(^|_)key$|api_?key|access_?key)", re.I)
MASK = "*****"
URI_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]+:)[^@\s]+(@)", re.I)
# Config sections that do not change a run's numbers: left out of the config digest.
VOLATILE_SECTIONS = (
    "paths",
    "tracking",
    "reproduce",
    "rollout",
)  # where a run writes, how it was asked for and where its episodes ran, not what it computes


class TrackingError(RuntimeError):
    """MLflow could not record a run; the result is already saved locally."""


def default_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def resolve_uri(tracking_cfg: TrackingSection) -> str:
    return tracking_cfg.uri or default_uri()


def experiment_name(tracking_cfg: TrackingSection, job_name: str) -> str:
    return f"{tracking_cfg.experiment_prefix}-{job_name}"


def ensure_store(uri: str) -> None:
    """Create a SQLite store once (migrations) under an exclusive lock; other stores pass."""
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(db.with_name(db.name + ".lock")):
        from mlflow.tracking import MlflowClient

        # Any read initialises (migrates) the schema; holding the lock serialises creators.
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def config_sha256(plain_cfg: Mapping[str, Any]) -> str:
    return sha256_json({k: v for k, v in plain_cfg.items() if k not in VOLATILE_SECTIONS})


def compact_list(values: Sequence[Any]) -> str:
    """A list of scalars as one readable param value: an integer progression of more than two as
    the range it is (gradient seeds: 'range(5000, 5512)'), anything else as JSON, cut to MLflow's
    limit."""
    if len(values) > 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        step = values[1] - values[0]
        if step != 0 and all(b - a == step for a, b in zip(values, values[1:])):
            stop = values[-1] + step
            return f"range({values[0]}, {stop})" if step == 1 else f"range({values[0]}, {stop}, {step})"
    text = json.dumps(list(values))
    if len(text) <= MAX_PARAM_CHARS:
        return text
    suffix = f" ... ({len(values)} values)"  # says how much was cut, which _clip's marker does not
    return text[: MAX_PARAM_CHARS - len(suffix)] + suffix


# Where a run writes is a machine path, not a setting: kept out of the params (the MLflow UI offers
# every param as a compare axis); the run's folder is its hydra.output_dir tag.
NOT_PARAMS = ("paths",)


def run_params(plain_cfg: Mapping[str, Any]) -> Dict[str, Any]:
    """A run's params: its config flattened (a.b.c), secrets masked, machine paths left out."""
    return mask_secrets(flatten({k: v for k, v in plain_cfg.items() if k not in NOT_PARAMS}))


def flatten(value: Any, prefix: str = "") -> Dict[str, Any]:
    """{'a': {'b': [1, {'c': 2}]}} -> {'a.b.0': 1, 'a.b.1.c': 2}; MLflow rejects 'a[0]'-style keys.
    A list of scalars is one param (see compact_list), whatever its length, so a swept list is one
    column: estimator.seeds = [9300, ...], 512 gradient seeds = range(5000, 5512)."""
    if (
        isinstance(value, (list, tuple))
        and prefix
        and value
        and not any(isinstance(v, (Mapping, list, tuple)) for v in value)
    ):
        return {prefix: compact_list(value)}
    if isinstance(value, Mapping):
        items: Iterable[Tuple[str, Any]] = ((str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    out: Dict[str, Any] = {}
    empty = True
    for key, item in items:
        empty = False
        out.update(flatten(item, f"{prefix}.{key}" if prefix else key))
    if empty and prefix:
        out[prefix] = "[]" if isinstance(value, (list, tuple)) else "{}"
    return out


def redact_uri(uri: str) -> str:
    return URI_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", uri)


def mask_secrets(flat: Mapping[str, Any]) -> Dict[str, Any]:
    """Values under secret-looking keys become *****, and so do passwords inside URIs
    (postgresql://user:pw@host -> postgresql://user:*****@host) under any key."""

    def masked(key: str, value: Any) -> Any:
        if SECRET_KEY.search(key.rsplit(".", 1)[-1]) and value not in (None, ""):
            return MASK
        return URI_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", value) if isinstance(value, str) else value

    return {k: masked(k, v) for k, v in flat.items()}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 13] + "...[clipped]"


def clip_run_name(text: str) -> str:
    """A run name every MLflow backend stores: one line, at most MAX_RUN_NAME_CHARS characters."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_RUN_NAME_CHARS else line[: MAX_RUN_NAME_CHARS - 1] + "…"


def override_key(override: str) -> str:
    """`estimator.seeds` of `+estimator.seeds=[...]`."""
    return override.lstrip("+~").partition("=")[0]


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class HydraRuntime:
    """The current Hydra job as tracking records it: its output dir, mode and overrides, and in a
    multirun its sweep dir and job number (all empty outside Hydra: a notebook, a test)."""

    output_dir: Optional[str] = None
    mode: Optional[str] = None
    overrides: Tuple[str, ...] = ()
    sweep_dir: Optional[str] = None  # a multirun's
    job_num: Optional[int] = None  # a multirun's


def hydra_runtime() -> HydraRuntime:
    """Output dir, sweep dir, job number and overrides of the current Hydra job (if any)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except Exception:
        return HydraRuntime()
    multirun = str(hc.mode) == "RunMode.MULTIRUN"
    return HydraRuntime(
        output_dir=hc.runtime.output_dir,
        mode=str(hc.mode),
        overrides=tuple(hc.overrides.task),
        sweep_dir=str(Path(hc.sweep.dir).resolve()) if multirun else None,
        job_num=int(hc.job.num) if multirun else None,
    )


def read_parent_run(sweep_dir: Optional[str]) -> Optional[Dict[str, Any]]:
    if not sweep_dir:
        return None
    path = Path(sweep_dir) / PARENT_RUN_FILE
    return json.loads(path.read_text()) if path.exists() else None


class RunLogger:
    """One MLflow run, written through MlflowClient (no global fluent state, safe in workers)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        entries = [Param(_clip(k, 250), _clip(str(v), MAX_PARAM_CHARS)) for k, v in params.items()]
        for chunk in _chunks(entries, 100):
            self.client.log_batch(self.run_id, params=list(chunk))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        entries = [RunTag(k, _clip(str(v), MAX_TAG_CHARS)) for k, v in tags.items() if v is not None]
        for chunk in _chunks(entries, 100):
            self.client.log_batch(self.run_id, tags=list(chunk))

    def log_metrics(self, metrics: Mapping[str, Optional[float]], step: int = 0) -> None:
        self.log_history({k: [(step, v)] for k, v in metrics.items()})

    def log_history(self, history: Mapping[str, Sequence[Tuple[int, Optional[float]]]]) -> None:
        """Metric series: {key: [(step, value), ...]}; None and non-finite values are skipped."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [
            Metric(key, float(value), now, int(step))
            for key, points in history.items()
            for step, value in points
            if value is not None and _finite(value)
        ]
        for chunk in _chunks(entries, 1000):
            self.client.log_batch(self.run_id, metrics=list(chunk))

    def log_checks(self, checks: Mapping[str, bool]) -> None:
        """Each check as a 0/1 metric gate.<name> (the gate.pass and gate.failed tags come with the
        run's tags, see gate_tags)."""
        self.log_metrics({f"gate.{name}": float(bool(ok)) for name, ok in checks.items()})

    def log_artifact(self, path: str | Path, artifact_path: Optional[str] = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(self.run_id, str(path), artifact_path)


def _finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))


def configure_http(tracking_cfg: TrackingSection) -> None:
    """Bound how long a dead server can stall a job: MLflow's defaults (7 retries, exponential
    backoff, 120 s timeouts) wait minutes before failing. Values the user exported win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(int(tracking_cfg.http_max_retries)))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(tracking_cfg.http_timeout_s)))


def build_record(
    tracking_cfg: TrackingSection,
    job_name: str,
    *,
    run_name: str,
    start_time_ms: int,
    plain_cfg: Mapping[str, Any],
    metrics: Mapping[str, Optional[float]],
    checks: Mapping[str, bool],
    tags: Mapping[str, Any],
    history: Mapping[str, Sequence[Tuple[int, Optional[float]]]],
    artifacts: Sequence[Tuple[Path, Optional[str]]],
    base_dir: Path,
    cache_dir: str | Path,
    children: Sequence[ChildRun] = (),
) -> Dict[str, Any]:
    """Everything one MLflow run holds, as JSON: what is uploaded now, or spooled and synced later.

    `record_id` is tagged on the run, so an upload that is retried never makes a second run.
    Artifacts are stored relative to the run folder (which may be moved) or the cache. `children`
    ({name, params, metrics, history, tags, artifacts}) become nested runs of this one (one per
    proposal and seed of an ablation), uploaded before the parent is marked FINISHED.
    """
    parent = read_parent_run(hydra_runtime().sweep_dir)
    all_tags = {"mlflow.runName": clip_run_name(run_name), "vlaeval.job": job_name, **tags}
    if parent is not None:
        all_tags["mlflow.parentRunId"] = parent["run_id"]
    roots = {"run": str(base_dir.resolve()), "cache": str(Path(cache_dir).resolve())}
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "record_id": uuid.uuid4().hex,
        "experiment": experiment_name(tracking_cfg, job_name),
        "start_time_ms": int(start_time_ms),
        "params": run_params(plain_cfg),
        "metrics": dict(metrics),
        "history": {k: [[int(s), v] for s, v in points] for k, points in dict(history).items()},
        "checks": {k: bool(v) for k, v in checks.items()},
        "tags": {k: redact_uri(str(v)) for k, v in all_tags.items() if v is not None},  # overrides may hold a URI
        "cache_dir": roots["cache"],
        "artifacts": [stored_artifact(path, artifact_path, roots) for path, artifact_path in artifacts]
        if tracking_cfg.log_artifacts
        else [],
        "partial_run_id": None,
        "children": [
            {
                "record_id": uuid.uuid4().hex,
                "start_time_ms": int(start_time_ms),
                "params": {**run_params(plain_cfg), **mask_secrets(flatten(dict(child.params)))},
                "metrics": dict(child.metrics),
                "history": {k: [[int(s), v] for s, v in points] for k, points in child.history.items()},
                "tags": {
                    "mlflow.runName": clip_run_name(child.name),
                    "vlaeval.job": job_name,
                    **{k: redact_uri(str(v)) for k, v in child.tags.items() if v is not None},
                },
                "artifacts": [stored_artifact(path, artifact_path, roots) for path, artifact_path in child.artifacts]
                if tracking_cfg.log_artifacts
                else [],
            }
            for child in children
        ],
    }


def stored_artifact(path: Path, artifact_path: Optional[str], roots: Mapping[str, str]) -> Dict[str, Any]:
    """An artifact as {root, path, artifact_path}: a path relative to the run folder or the cache."""
    resolved = Path(path).resolve()
    for root, folder in roots.items():
        if resolved.is_relative_to(folder):
            return {"root": root, "path": str(resolved.relative_to(folder)), "artifact_path": artifact_path}
    raise ValueError(f"artifact {path} lies outside the run folder and the cache; refusing to log it")


def artifact_source(entry: Mapping[str, Any], roots: Mapping[str, Path]) -> Path:
    """The file behind a stored artifact; a (tampered) entry that escapes its root is refused."""
    destination = str(entry.get("artifact_path") or "")
    if destination.startswith("/") or ".." in Path(destination).parts:
        raise TrackingError(f"queued artifact destination {destination!r} escapes the run's artifact root; refused")
    root = roots.get(str(entry.get("root")))
    source = (root / entry["path"]).resolve() if root is not None else None
    if root is None or source is None or not source.is_relative_to(root.resolve()):
        raise TrackingError(f"queued artifact {entry.get('path')!r} escapes its folder ({entry.get('root')}); refused")
    return source


def find_uploaded(client: Any, record: Mapping[str, Any]) -> Optional[str]:
    """The id of a FINISHED run already holding this record (an earlier upload or sync), if any."""
    experiment = client.get_experiment_by_name(record["experiment"])
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`vlaeval.record_id` = '{record['record_id']}'", max_results=10
    )
    finished = [r for r in runs if r.info.status == "FINISHED"]
    return finished[0].info.run_id if finished else None


def upload_record(
    uri: str, record: Dict[str, Any], base_dir: Path, on_created: Optional[Callable[[str], None]] = None
) -> str:
    """Log one record as a FINISHED run (FAILED if logging breaks off); returns its run id.
    A partial run an earlier attempt left behind is deleted, so each record is one run."""
    from mlflow.tracking import MlflowClient

    ensure_store(uri)
    client = MlflowClient(tracking_uri=uri)
    done = find_uploaded(client, record)
    if done is not None:
        return done
    if record.get("partial_run_id"):
        with contextlib.suppress(Exception):  # already gone, or never reached the server
            client.delete_run(record["partial_run_id"])
    roots = {"run": Path(base_dir), "cache": Path(record["cache_dir"])}
    sources = [(artifact_source(entry, roots), entry["artifact_path"]) for entry in record["artifacts"]]
    experiment_id = get_or_create_experiment(client, record["experiment"])
    tags = {**record["tags"], "vlaeval.record_id": record["record_id"]}
    run = client.create_run(
        experiment_id, start_time=record["start_time_ms"], tags={k: _clip(v, MAX_TAG_CHARS) for k, v in tags.items()}
    )
    run_id = run.info.run_id
    if on_created is not None:
        on_created(run_id)
    logger = RunLogger(client, run_id)
    try:
        logger.log_params(record["params"])
        logger.log_metrics(record["metrics"])
        if record["history"]:
            logger.log_history({k: [(s, v) for s, v in points] for k, points in record["history"].items()})
        if record["checks"]:
            logger.log_checks(record["checks"])
            if "gate.pass" not in record["tags"]:  # a record queued by an older version
                logger.set_tags(gate_tags(record["checks"]))
        for path, artifact_path in sources:
            logger.log_artifact(path, artifact_path)
        for child in record.get("children", []):
            upload_child(client, experiment_id, child, run_id, roots)
        client.set_terminated(run_id, status="FINISHED")
    except BaseException as error:
        with contextlib.suppress(Exception):
            logger.set_tags({"vlaeval.error": describe(error)})
            client.set_terminated(run_id, status="FAILED")
        raise
    return run_id


def upload_child(
    client: Any, experiment_id: str, child: Mapping[str, Any], parent_run_id: str, roots: Mapping[str, Path]
) -> str:
    """One nested run under `parent_run_id`. A child an earlier attempt finished is kept and moved
    under this parent (the earlier parent was a partial run, deleted); a partial one is replaced."""
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`vlaeval.record_id` = '{child['record_id']}'", max_results=10
    )
    for run in runs:
        if run.info.status == "FINISHED":
            client.set_tag(run.info.run_id, "mlflow.parentRunId", parent_run_id)
            return run.info.run_id
        with contextlib.suppress(Exception):
            client.delete_run(run.info.run_id)
    sources = [(artifact_source(entry, roots), entry["artifact_path"]) for entry in child["artifacts"]]
    tags = {**child["tags"], "vlaeval.record_id": child["record_id"], "mlflow.parentRunId": parent_run_id}
    run = client.create_run(
        experiment_id, start_time=child["start_time_ms"], tags={k: _clip(v, MAX_TAG_CHARS) for k, v in tags.items()}
    )
    logger = RunLogger(client, run.info.run_id)
    logger.log_params(child["params"])
    logger.log_metrics(child["metrics"])
    if child["history"]:
        logger.log_history({k: [(s, v) for s, v in points] for k, points in child["history"].items()})
    for path, artifact_path in sources:
        logger.log_artifact(path, artifact_path)
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id


def record_run(tracking_cfg: TrackingSection, record: Dict[str, Any], base_dir: Path, result_path: Path) -> str:
    """Spool the record beside the result, upload it, and drop the spool once the run is
    FINISHED. If the store is unreachable or dies mid-run, the spool stays and the TrackingError
    says how to upload it later (job=sync): nothing is lost."""
    uri = resolve_uri(tracking_cfg)
    configure_http(tracking_cfg)
    # The store the run is meant for travels with the queued record: job=sync sends it there.
    record = {**record, "tracking_uri": redact_uri(uri)}
    pending = atomic_write_json(base_dir / PENDING_FILE, record)

    def remember(run_id: str) -> None:  # sync deletes this partial run before re-uploading
        atomic_write_json(pending, {**record, "partial_run_id": run_id})

    try:
        run_id = upload_record(uri, record, base_dir, on_created=remember)
    except Exception as error:
        raise TrackingError(
            f"MLflow tracking at {redact_uri(uri)} failed ({type(error).__name__}: {first_line(error, 200)}); "
            f"the result is saved at {result_path} and the run is queued in {pending}: upload it "
            f"with `python main.py job=sync sync.paths=[{base_dir}]` once the store is back"
        ) from error
    pending.unlink(missing_ok=True)
    return run_id


def sync_target(record: Mapping[str, Any], configured_uri: str, *, to_configured: bool) -> str:
    """Where job=sync uploads a queued record: the store it was queued for (recorded without its
    password), unless `to_configured`; the configured store when it is that store (it carries the
    credentials) or the record predates the field. Raises ValueError, naming the fix, when the
    record's store needs a password this run was not given (job=sync reports it as that run's failure)."""
    meant = record.get("tracking_uri")
    if to_configured or meant is None or meant == redact_uri(configured_uri):
        return configured_uri
    if MASK in meant:
        raise ValueError(
            f"queued for {meant}, whose password is not stored: run job=sync with tracking.uri=<that store>, "
            "or sync.to_configured_store=true to upload it to the configured store instead"
        )
    return meant


def artifact_root(uri: str) -> Optional[str]:
    """Artifacts of a SQLite store go to mlartifacts/ beside the database. (MLflow's default,
    ./mlruns, would later make a bare `mlflow ui` in that folder open a file store instead.)"""
    if uri.startswith("sqlite:///"):
        return str(Path(uri[len("sqlite:///") :]).parent / "mlartifacts")
    return None  # a server decides (proxied artifacts)


def get_or_create_experiment(client: Any, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    root = artifact_root(client.tracking_uri)
    try:
        return client.create_experiment(name, artifact_location=None if root is None else f"{root}/{name}")
    except Exception:
        # Another process created it between our lookup and create.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def gate_passed(checks: Mapping[str, bool], passed: Optional[bool] = None) -> bool:
    """All checks passed, unless the job says otherwise (a smoke audit that is no certificate)."""
    return all(checks.values()) if passed is None else bool(passed)


def gate_tags(checks: Mapping[str, bool], passed: Optional[bool] = None) -> Dict[str, str]:
    """gate.pass (gate_passed) and gate.failed: the failed checks' names, or "none" -- one readable
    column that compares a sweep's gate outcomes in the MLflow runs table."""
    failed = [name for name, ok in checks.items() if not ok]
    return {
        "gate.pass": str(gate_passed(checks, passed)).lower(),
        "gate.failed": ", ".join(failed) if failed else "none",
    }


def standard_tags(
    plain_cfg: Mapping[str, Any], code: CodeVersion, extra: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
    runtime = hydra_runtime()
    tags = {
        "vlaeval.run_kind": "job",
        "vlaeval.version": code.vlaeval_version,
        "git.sha": code.git_sha,
        "git.dirty": None if code.git_dirty is None else str(code.git_dirty).lower(),
        "config.sha256": config_sha256(plain_cfg),
        "hydra.output_dir": plain_cfg.get("paths", {}).get("output_dir"),
        "hydra.sweep_dir": runtime.sweep_dir,
        "hydra.job_num": runtime.job_num,
        "hydra.overrides": " ".join(runtime.overrides) or None,
    }
    tags.update(dict(extra or {}))
    return tags
