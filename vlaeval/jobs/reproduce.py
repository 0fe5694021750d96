"""job=reproduce: re-run a logged run from its saved config and compare the numbers.

Fetch the run's saved `.hydra/config.yaml` (from MLflow by run id, or from a local run
directory), refuse `_target_` values outside `vlaeval.` and the prefixes in
reproduce.trusted_targets (a saved config is untrusted input), validate it against today's schema,
warn when the code version differs, re-run the same job into <this run's output dir>/rerun, and
print original vs re-run for each key metric, gate check and decision: identical or differs, and
whether the input data changed (its digest). The comparison is logged to the re-run's MLflow run;
the job exits 4 when the run did not reproduce.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, cast

from omegaconf import DictConfig, OmegaConf

from vlaeval import console
from vlaeval.artifacts import atomic_write_json, atomic_write_text, read_json
from vlaeval.config import JobSettings, ReproduceConfig, VlaevalConfig
from vlaeval.errors import UserInputError, first_line, require
from vlaeval.gauntlet.constants import ORDER_FROM_FRESH_DRAW
from vlaeval.jobs import dispatch
from vlaeval.provenance import code_version
from vlaeval.runs import RESULT_FILE, VOLATILE_METRIC_PREFIXES, JobResult, RunRecord, output_dir

JOB = "reproduce"
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
COMPONENTS: Tuple[str, ...] = ()  # no `_target_` groups
REPRODUCIBLE_JOBS = ("gauntlet", "train", "evaluate", "gradients", "residual_audit")
TRUSTED_TARGET_PREFIX = "vlaeval."
COMPARED_TAG_PREFIXES = (
    "recommendation",
    "halted",
    "gate.pass",
    "gate.failed",
    "stratum.",
    "config.sha256",
    "checkpoint.sha256",
    "data.manifest_sha256",
)
EXIT_NOT_REPRODUCED = 4


@dataclass(frozen=True, kw_only=True)
class ReproduceJobConfig(JobSettings):
    """The sections job=reproduce reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    reproduce: ReproduceConfig


@dataclass(frozen=True)
class Comparison:
    """One metric or tag of the original run against the re-run's."""

    key: str
    original: Any
    rerun: Any
    verdict: str  # "identical" or "differs"

    @property
    def identical(self) -> bool:
        return self.verdict == "identical"


@dataclass(frozen=True)
class ReproduceResult:
    """job=reproduce's report (reproduce.json): each compared metric and tag, then and now, and where
    the re-run's result went (its run in the tracking store: None when tracking is off)."""

    source: str
    job: str
    warnings: List[str]
    all_identical: bool
    data_changed: bool
    comparisons: List[Comparison]
    rerun_result: str
    rerun_store: str
    rerun_store_run_id: Optional[str]


def run(cfg: ReproduceJobConfig) -> JobResult[ReproduceResult]:
    source = cfg.reproduce.run_id
    require(
        source is not None and str(source).strip() != "",
        "job=reproduce needs reproduce.run_id=<MLflow run id or local run directory>",
    )
    saved, original = load_original(cfg, str(source))
    refuse_untrusted_targets(saved, list(cfg.reproduce.trusted_targets))
    rerun_cfg = rerun_config(cfg, saved, original["tags"])
    job_name = str(rerun_cfg.job.name)
    require(
        job_name in REPRODUCIBLE_JOBS,
        f"run {source} is a job={job_name} run; reproduce re-runs {', '.join(REPRODUCIBLE_JOBS)}",
    )

    warnings = version_warnings(original["tags"])
    for w in warnings:
        console.show(f"[yellow]warning:[/yellow] {w}")
    rerun_dir = Path(str(rerun_cfg.paths.output_dir))
    atomic_write_text(rerun_dir / ".hydra" / "config.yaml", OmegaConf.to_yaml(rerun_cfg))
    rerun = dispatch(rerun_cfg, overrides=[])  # a saved config: its overrides were checked when it first ran

    assert rerun.run is not None  # every reproducible job publishes its run
    comparisons = compare(original, rerun.run)
    all_identical = all(c.identical for c in comparisons)
    console.show(
        console.table(
            f"Reproduction of {source} ({job_name})",
            ["key", "original", "re-run", "verdict"],
            [(c.key, _show(c.original), _show(c.rerun), c.verdict) for c in comparisons],
        )
    )
    differing = sum(not c.identical for c in comparisons)
    data_change = next((c for c in comparisons if c.key == "data.manifest_sha256" and not c.identical), None)
    if data_change is not None:
        console.show(
            f"[yellow]the input data changed[/yellow]: manifest digest {str(data_change.original)[:16]}... "
            f"then, {str(data_change.rerun)[:16]}... now -- the numbers cannot be expected to match"
        )
    console.show(
        f"{len(comparisons) - differing} identical, {differing} differ"
        + ("" if all_identical else "  <- NOT reproduced (exit code 4)")
    )
    report = ReproduceResult(
        source=str(source),
        job=job_name,
        warnings=warnings,
        all_identical=all_identical,
        data_changed=data_change is not None,
        comparisons=comparisons,
        rerun_result=str(rerun.run.result_path),
        rerun_store=rerun.run.store,
        rerun_store_run_id=rerun.run.store_run_id,
    )
    report_path = atomic_write_json(output_dir(cfg) / "reproduce.json", dataclasses.asdict(report))
    if rerun.run.store_run_id:
        from vlaeval.tracking.store import run_store

        run_store(cfg.tracking).annotate(
            rerun.run.store_run_id,
            artifacts=[report_path],
            tags={
                "vlaeval.reproduced_from": str(source),
                "reproduce.verdict": "identical" if all_identical else "differs",
            },
            metrics={"reproduce.identical": float(len(comparisons) - differing), "reproduce.differs": float(differing)},
        )
    return JobResult(report, None, 0 if all_identical else EXIT_NOT_REPRODUCED)


# ------------------------------------------------------------------ loading
def load_original(cfg: ReproduceJobConfig, source: str) -> Tuple[DictConfig, Dict[str, Any]]:
    """(saved config, {"metrics": ..., "tags": ...}) from a run directory or an MLflow run."""
    directory = Path(source)
    if directory.is_dir():
        config_path = directory / ".hydra" / "config.yaml"
        require(config_path.is_file(), f"{directory} has no .hydra/config.yaml; pass a Hydra run directory of vlaeval")
        require((directory / RESULT_FILE).is_file(), f"{directory} has no {RESULT_FILE}: that run did not finish")
        result = read_json(directory / RESULT_FILE)
        metrics = dict(result.get("metrics", {}))
        metrics.update({f"gate.{k}": float(v) for k, v in result.get("checks", {}).items()})
        return _load_yaml(config_path), {"metrics": metrics, "tags": result.get("tags", {})}
    require(cfg.tracking.enabled, f"{source} is not a directory and tracking is disabled: cannot look up a tracked run")
    from vlaeval.tracking.store import run_store

    with tempfile.TemporaryDirectory() as tmp:
        stored = run_store(cfg.tracking).saved_run(source, Path(tmp))
        saved = _load_yaml(stored.config_path)
    return saved, {"metrics": dict(stored.metrics), "tags": dict(stored.tags)}


def _load_yaml(path: Path) -> DictConfig:
    try:
        loaded = OmegaConf.load(path)
    except Exception as error:
        raise UserInputError(f"saved config {path} is not valid YAML ({type(error).__name__})") from None
    require(isinstance(loaded, DictConfig), f"saved config {path} is not a mapping")
    return cast(DictConfig, loaded)


def _walk_targets(node: Any, where: str = "") -> Iterator[Tuple[str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key == "_target_":
                yield path, value
            else:
                yield from _walk_targets(value, path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk_targets(value, f"{where}.{i}")


def refuse_untrusted_targets(saved: DictConfig, trusted: Sequence[str] = ()) -> None:
    """A saved config names classes to build: only vlaeval's own and the prefixes the user trusts."""
    prefixes = (TRUSTED_TARGET_PREFIX, *[str(t) for t in trusted])
    plain = OmegaConf.to_container(saved, resolve=False)
    for path, target in _walk_targets(plain):
        if not (isinstance(target, str) and target.startswith(prefixes)):
            raise UserInputError(
                f"saved config sets {path}={target!r}, outside the {TRUSTED_TARGET_PREFIX!r} "
                "namespace: refused (a saved config is untrusted input); if you trust that code, "
                f"add reproduce.trusted_targets=[{str(target).split('.')[0]}.]"
            )


def rerun_config(
    cfg: ReproduceJobConfig, saved: DictConfig, original_tags: Mapping[str, Any] | None = None
) -> DictConfig:
    """The saved config, validated by today's schema, writing into <output>/rerun and tracking
    to where this run tracks; a rollout gauntlet's freshly drawn cluster-order seed (tag
    gauntlet.order_seed) is replayed."""
    schema = OmegaConf.structured(VlaevalConfig)
    try:
        rerun = OmegaConf.merge(schema, saved)
        overrides = list(cfg.reproduce.job_overrides)
        if overrides:
            rerun = OmegaConf.merge(rerun, OmegaConf.from_dotlist(overrides))
    except Exception as error:
        raise UserInputError(
            f"saved config does not fit today's schema ({first_line(error)}); "
            "reproduce it with the vlaeval version that made it"
        ) from None
    rerun.paths.output_dir = str(output_dir(cfg) / "rerun")
    rerun.paths.cache_dir = cfg.paths.cache_dir
    rerun.tracking = cfg.tracking
    rerun.reproduce = OmegaConf.structured(VlaevalConfig().reproduce)
    tags = original_tags or {}
    if tags.get("gauntlet.order_seed_basis") == ORDER_FROM_FRESH_DRAW:
        rerun.reproduce.replay_order_seed = int(tags["gauntlet.order_seed"])
    return cast(DictConfig, rerun)


def version_warnings(original_tags: Mapping[str, Any]) -> List[str]:
    code = code_version()
    out = []
    for tag, now, label in (
        ("git.sha", code.git_sha, "git sha"),
        ("vlaeval.version", code.vlaeval_version, "vlaeval version"),
    ):
        then = original_tags.get(tag)
        if then is not None and now is not None and str(then) != str(now):
            out.append(f"{label} differs: original {then}, now {now}")
    return out


# ------------------------------------------------------------------ comparing
def compare(original: Mapping[str, Any], rerun: RunRecord) -> List[Comparison]:
    rerun_metrics = dict(rerun.metrics)
    rerun_metrics.update({f"gate.{k}": float(v) for k, v in rerun.checks.items()})
    rows: List[Comparison] = []
    for key in sorted(rerun_metrics):
        if key.startswith(VOLATILE_METRIC_PREFIXES):
            continue
        rows.append(_compare_one(key, original["metrics"].get(key), rerun_metrics[key]))
    for key in sorted(rerun.tags):
        if key.startswith(COMPARED_TAG_PREFIXES):
            rows.append(_compare_one(key, original["tags"].get(key), rerun.tags[key]))
    return rows


def _compare_one(key: str, a: Any, b: Any) -> Comparison:
    if isinstance(b, (int, float)) and not isinstance(b, bool) and a is not None:
        same = float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    else:
        same = a is not None and str(a) == str(b)
    return Comparison(key, a, b, "identical" if same else "differs")


def _show(value: Any) -> str:
    return "-" if value is None else (repr(float(value)) if isinstance(value, (int, float)) else str(value))
