"""What every job does at its edges: the run directory, the built-in data and policy with progress,
the local result (written atomically first) and its tracking. Jobs (vlaeval/jobs/) import this;
no job imports another job."""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Generic, Mapping, Optional, Sequence, Tuple, TypeVar

from omegaconf import OmegaConf

from vlaeval import tracking
from vlaeval.artifacts import atomic_write_json
from vlaeval.config import JobSettings, PolicyJobSettings, to_plain
from vlaeval.provenance import CodeVersion, code_version
from vlaeval.records import JsonRecord
from vlaeval.tracking.record import ChildRun, RunRecord
from vlaeval.tracking.store import run_store

RESULT_FILE = "result.json"
# Metrics of the machine and its cache state, not of the method: reproduce does not compare them.
VOLATILE_METRIC_PREFIXES = ("timing.", "cache.")


def now_ms() -> int:
    return int(time.time() * 1000)


def output_dir(cfg: JobSettings) -> Path:
    path = Path(str(cfg.paths.output_dir))
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_data(cfg: PolicyJobSettings) -> Any:
    """The data component's demonstrations and anchors (recorded on first use, with progress)."""
    from vlaeval import console
    from vlaeval.policy.builtin import prepare_data

    with console.unit_progress("demonstrations", 1) as update:

        def progress(done: int, total: int, task: str) -> None:
            update(completed=done, total=total, description=f"recording {task}")

        return prepare_data(cfg.data, str(cfg.paths.cache_dir), progress)


def load_heldout_data(cfg: PolicyJobSettings, episodes_per_task: int, scenes: str = "held_out") -> Any:
    """The data component's held-out scenes (data.scenes=held_out, or the half `scenes` names),
    episodes_per_task per task: what a held-out flow-matching loss is measured on (recorded on first
    use, with progress)."""
    from vlaeval import console
    from vlaeval.errors import require
    from vlaeval.policy.builtin import prepare_data

    require(
        "scenes" in cfg.data,
        f"the data component {cfg.data.get('_target_')} has no held-out scenes (a `scenes` argument); "
        "turn the held-out loss off",
    )
    held = OmegaConf.create(OmegaConf.to_container(cfg.data, resolve=True))
    held.scenes = str(scenes)
    held.episodes_per_task = int(episodes_per_task)
    with console.unit_progress("held-out demonstrations", 1) as update:
        return prepare_data(
            held,
            str(cfg.paths.cache_dir),
            lambda done, total, task: update(completed=done, total=total, description=f"recording {task}"),
        )


def load_data_and_policy(cfg: PolicyJobSettings) -> Tuple[Any, Any]:
    """Demonstrations and the policy the checkpoint group names (checkpoint=builtin trains it on
    first use, with progress)."""
    data = load_data(cfg)
    return data, load_policy(cfg, data)


def load_policy(cfg: PolicyJobSettings, data: Any) -> Any:
    """The policy the checkpoint group names for this data (checkpoint=builtin trains it on first
    use, with progress)."""
    from vlaeval import console
    from vlaeval.policy.builtin import PolicySpec, obtain_policy

    with console.unit_progress("training on first use", int(cfg.train.steps)) as update:
        handle = obtain_policy(
            PolicySpec.of(cfg),
            cfg.checkpoint,
            str(cfg.paths.cache_dir),
            data,
            lambda step, loss: update(completed=step, description=f"loss {loss:.4f}"),
            console.print_notice,
        )
    return handle


def sweep_run_name(run_name: str, gate: Optional[bool] = None) -> str:
    """A sweep job's run is named after its gate's outcome (when it has a gate) and what it swept (the
    values of the keys the parent recorded as swept), so children are told apart -- and their
    outcome seen -- in the MLflow runs table without ticking a column; a single run keeps its name."""
    runtime = tracking.hydra_runtime()
    if runtime.job_num is None:
        return tracking.clip_run_name(run_name)
    overrides = [o for o in runtime.overrides if tracking.override_key(o) != "sweep"]
    swept = (tracking.read_parent_run(runtime.sweep_dir) or {}).get("swept_keys")
    if swept:
        overrides = [o for o in overrides if tracking.override_key(o) in swept]
    return sweep_child_label(run_name, runtime.job_num, overrides, gate)


def sweep_child_label(run_name: str, job_num: int, overrides: Sequence[str], gate: Optional[bool] = None) -> str:
    """`gate PASS · estimator.seeds=[1] #2 · audit sobol 3e84`: the gate's outcome and what differs
    between a sweep's children first (the runs table cuts a long name at its end), the job number,
    then the run's own name."""
    swept = " ".join(overrides)
    outcome = "" if gate is None else f"gate {'PASS' if gate else 'FAIL'} · "
    return tracking.clip_run_name(
        f"{outcome}{swept} #{job_num} · {run_name}" if swept else f"{outcome}#{job_num} · {run_name}"
    )


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def typed(node: Any) -> Any:
    """The structured-config dataclass behind a node (enums and types as the schema says)."""
    return OmegaConf.to_object(node)


def lineage_tags(handle: Any, data: Any) -> Dict[str, str]:
    """The tags that say which checkpoint and which data a run's numbers come from (job=reproduce
    compares them)."""
    return {"checkpoint.sha256": handle.sha256, "data.manifest_sha256": data.demonstrations.manifest_sha256}


class SavedAsJson(JsonRecord):
    """A job's result dataclass as its result.json holds it: the fields in their order, a None one
    left out (a field only some runs have), a nested result written by its own to_json()."""


R = TypeVar("R")


@dataclass(frozen=True)
class JobResult(Generic[R]):
    """What a job's run returns: its result (the object result.json holds, as the job types it) and
    the run it was published as; `exit_code` (0: none) is what main exits with outside a sweep (a
    gate or a recommendation the user asked to turn into an exit code)."""

    result: R
    run: Optional[RunRecord]  # None: a job that publishes no run of its own (sync, gauntlet_history)
    exit_code: int = 0


@dataclass(frozen=True)
class RunReport:
    """One finished run as its job hands it over: the result (JSON-ready; the job's result object's
    to_json()), what MLflow shows of it, and the files that go with it.

    `gate_pass` overrides the gate.pass tag's all-checks-passed (a smoke audit passes its checks but
    is no certificate); with `artifact_file`, result["artifact"] is also written on its own under
    that name (the gradient artifact); each of `children` ({name, params, metrics, history, tags,
    result}) is saved as children/<name>.json and becomes a nested MLflow run; `code` defaults to
    this checkout's code_version()."""

    job: str
    result: Dict[str, Any]
    run_name: str
    started_ms: int
    metrics: Mapping[str, Optional[float]]
    checks: Mapping[str, bool]
    tags: Mapping[str, Any] = field(default_factory=dict)
    history: Mapping[str, Sequence[Tuple[int, Optional[float]]]] = field(default_factory=dict)
    plots: Sequence[Path] = ()
    artifacts: Sequence[Tuple[Path, Optional[str]]] = ()
    artifact_file: Optional[str] = None
    gate_pass: Optional[bool] = None
    children: Sequence[ChildRun] = ()
    code: Optional[CodeVersion] = None


def publish(cfg: JobSettings, report: RunReport) -> RunRecord:
    """Write the result locally (atomic) first, then log the run to MLflow (spooled for job=sync
    if the store cannot be reached). Every result carries a unique run id (`run_id`, tag
    `vlaeval.run_id`), tracked or not."""
    job_name, result, started_ms = report.job, report.result, report.started_ms
    checks, history, children = report.checks, report.history, report.children
    code = code_version() if report.code is None else report.code
    gate_pass, artifact_file, run_name = report.gate_pass, report.artifact_file, report.run_name
    plots, extra_artifacts, tags = report.plots, report.artifacts, report.tags
    plain = to_plain(cfg)
    out = output_dir(cfg)
    run_id = uuid.uuid4().hex
    all_tags = tracking.standard_tags(
        plain, code, {"vlaeval.run_id": run_id, **tracking.gate_tags(checks, gate_pass), **tags}
    )
    metrics = {**report.metrics, "timing.job_s": (now_ms() - started_ms) / 1000.0}
    result.update(
        run_id=run_id,
        job=job_name,
        tracked=bool(cfg.tracking.enabled),
        metrics=dict(metrics),
        checks=dict(checks),
        tags={k: v for k, v in all_tags.items() if v is not None},
        config_sha256=all_tags["config.sha256"],
    )
    artifacts = [(out / ".hydra", "hydra")] + [(p, "plots") for p in plots] + list(extra_artifacts)
    if artifact_file is not None:
        artifact_path = atomic_write_json(out / artifact_file, result["artifact"])
        result["artifact_path"] = str(artifact_path)
        artifacts.append((artifact_path, None))
    child_records = []
    for child in children:
        child_path = atomic_write_json(out / "children" / f"{_slug(child.name)}.json", dict(child.result))
        child_records.append(dataclasses.replace(child, artifacts=[(child_path, None)]))
    result_path = atomic_write_json(out / RESULT_FILE, result)
    artifacts.insert(0, (result_path, None))
    store_run_id = None
    if cfg.tracking.enabled:
        record = tracking.build_record(
            cfg.tracking,
            job_name,
            # The gate's outcome, as its tag says (None: the job has no gate).
            run_name=sweep_run_name(
                run_name, None if not checks and gate_pass is None else tracking.gate_passed(checks, gate_pass)
            ),
            start_time_ms=started_ms,
            plain_cfg=plain,
            metrics=metrics,
            checks=checks,
            tags=all_tags,
            history=history or {},
            artifacts=artifacts,
            base_dir=out,
            cache_dir=str(cfg.paths.cache_dir),
            children=child_records,
        )
        store_run_id = run_store(cfg.tracking).record(record, out, result_path)
    return RunRecord(
        run_id=run_id,
        job=job_name,
        result_path=result_path,
        store=str(cfg.tracking.backend),
        store_run_id=store_run_id,
        tracked=bool(cfg.tracking.enabled),
        config_sha256=str(all_tags["config.sha256"]),
        checks=dict(checks),
        metrics=dict(metrics),
        tags=dict(result["tags"]),
    )
