"""job=offline_validity: does an offline number rank checkpoints the way closed-loop success does?

Find the checkpoints (validity.checkpoints: job=train's model.pt files, or folders holding them, such
as a multirun's sweep folder) and refuse a set that is not one policy family on this data; load the
data's training anchors and its held-out scenes; per checkpoint, built as its sidecar records it, the
offline metrics (vlaeval/residual/offline.py); then closed-loop success on the same held-out episodes
(evaluate.*), every checkpoint's episodes handed to the rollout engine at once; per metric and scope
(each task, and all tasks pooled) Pearson, Spearman and MMRV with two-level bootstrap intervals over
checkpoints and paired episodes, beside the success rates' split-half ceiling (vlaeval/validity);
save result.json, the per-checkpoint table (checkpoints.csv) and the plot, then track the run with a
nested run per checkpoint.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from omegaconf import OmegaConf

from vlaeval import console
from vlaeval.artifacts import atomic_write_text, sha256_file, stable_seed
from vlaeval.config import AuditConfig, EstimatorConfig, PolicyJobSettings, ValidityConfig, to_plain
from vlaeval.errors import require, require_at_least
from vlaeval.policy.builtin import PolicySpec, load_policy
from vlaeval.policy.checkpoint import read_sidecar, validate_checkpoint_config
from vlaeval.records import JsonRecord
from vlaeval.residual.estimators import estimator_arguments, validate_estimator_config
from vlaeval.residual.offline import CheckpointMetrics, MetricSpec, OfflineSettings, metric_specs, offline_metrics
from vlaeval.rollouts.engine import RolloutJob, held_out_episodes, run_rollout_jobs
from vlaeval.rollouts.evaluation import validate_evaluate
from vlaeval.runs import JobResult, RunReport, SavedAsJson, load_data, load_heldout_data, now_ms, output_dir, publish
from vlaeval.tracking.record import ChildRun
from vlaeval.validity.plots import plot_validity
from vlaeval.validity.statistics import (
    MIN_CHECKPOINTS,
    Agreement,
    SuccessReliability,
    agreement,
    oriented,
    success_reliability,
)

JOB = "offline_validity"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()
CHECKPOINT_NAME = "model.pt"  # what job=train writes into its run folder
POOLED = "pooled"
GRADIENT_BATCH = 256  # (seed, anchor) pairs per per-sample-gradient call


@dataclass(frozen=True, kw_only=True)
class OfflineValidityJobConfig(PolicyJobSettings):
    """The sections job=offline_validity reads (vlaeval.config.JobSettings). model, flow and train are
    each checkpoint's own, from its sidecar; the job's are used for a checkpoint without one."""

    validity: ValidityConfig
    estimator: EstimatorConfig
    audit: AuditConfig


@dataclass(frozen=True)
class CheckpointRow(JsonRecord):
    """One checkpoint: where it is, its digest, what sets it apart from the others (the settings its
    sidecar records that vary across the set), its offline metrics and its closed-loop success."""

    label: str
    path: str
    sha256: str
    varies: Mapping[str, Any]
    metrics: Mapping[str, float]
    per_task_metrics: Mapping[str, Tuple[float, ...]]
    success_rate: float
    per_task_success: Tuple[float, ...]
    # Each held-out episode's outcome (1: success), in the order of the result's episode_tasks: the
    # same episodes for every checkpoint, so any subset of checkpoints can be re-analysed.
    episode_successes: Tuple[int, ...] = ()


@dataclass(frozen=True)
class OfflineValidityResult(SavedAsJson):
    """job=offline_validity's result: the checkpoints, every agreement (metric x scope), the
    success rates' reliability per scope, which metrics validate pooled, the episodes' tasks."""

    tasks: Tuple[str, ...]
    episodes_per_task: int
    episode_tasks: Tuple[int, ...]  # each held-out episode's task (an index into tasks)
    checkpoints: Tuple[CheckpointRow, ...]
    agreements: Tuple[Agreement, ...]
    reliability: Tuple[SuccessReliability, ...]
    validated: Tuple[str, ...]


def validate_validity(cfg: OfflineValidityJobConfig) -> None:
    v = cfg.validity
    require(
        len(v.checkpoints) > 0, "validity.checkpoints is empty; give job=train model.pt files or folders holding them"
    )
    require(len(v.metrics) > 0, "validity.metrics is empty; name at least one offline metric")
    require_at_least("validity.heldout_episodes_per_task", v.heldout_episodes_per_task, 1)
    require_at_least("validity.heldout_draws", v.heldout_draws, 1)
    require_at_least("validity.time_bins", v.time_bins, 2)
    require_at_least("validity.anchors", v.anchors, 4)
    require(len(v.gradient_seeds) >= 2, "validity.gradient_seeds needs >= 2 seeds (a gradient RMS over seeds)")
    require(0.5 < v.level < 1.0, f"validity.level={v.level} must be in (0.5, 1)")
    require_at_least("validity.resamples", v.resamples, 100)
    validate_estimator_config(cfg.estimator)
    validate_evaluate(cfg)
    require("scenes" in cfg.data, f"the data component {cfg.data.get('_target_')} has no held-out scenes")


def find_checkpoints(entries: Sequence[str]) -> List[Path]:
    """Every model.pt the entries name (files) or hold (folders, searched recursively), in order."""
    found: List[Path] = []
    for entry in entries:
        path = Path(str(entry))
        if path.is_dir():
            inside = sorted(path.rglob(CHECKPOINT_NAME))
            require(
                bool(inside), f"validity.checkpoints: {path} holds no {CHECKPOINT_NAME}; give job=train run folders"
            )
            found += inside
        else:
            require(path.is_file(), f"validity.checkpoints: {path} is not a file or folder; give model.pt files")
            found.append(path)
    require(len(found) >= 3, f"validity.checkpoints holds {len(found)} checkpoint(s); an agreement needs >= 3")
    return found


def _flat(prefix: str, node: object) -> Dict[str, object]:
    if isinstance(node, Mapping):
        out: Dict[str, object] = {}
        for key, value in node.items():
            out.update(_flat(f"{prefix}.{key}" if prefix else str(key), value))
        return out
    return {prefix: node}


@dataclass(frozen=True)
class CheckpointSpec:
    """A checkpoint to validate: its file, the spec it is built from (model, flow and train from its
    sidecar; the job's where it has none) on the job's data, and its recorded settings flattened
    (what `varying` compares across the set), with the steps it was trained for (`trained_steps`: a
    snapshot's, or train.steps)."""

    path: Path
    policy: PolicySpec
    settings: Mapping[str, object]


def checkpoint_specs(cfg: OfflineValidityJobConfig, paths: Sequence[Path]) -> List[CheckpointSpec]:
    """Every checkpoint's spec; refused when the set is not one policy family."""
    out = []
    for path in paths:
        validate_checkpoint_config(OmegaConf.create({"kind": "path", "path": str(path)}))
        sidecar = read_sidecar(path) or {}
        recorded = sidecar.get("config") or {}
        model, flow, train = (recorded.get(name, to_plain(getattr(cfg, name))) for name in ("model", "flow", "train"))
        spec = PolicySpec(OmegaConf.create(model), cfg.data, OmegaConf.create(flow), OmegaConf.create(train))
        steps = (sidecar.get("metrics") or {}).get("steps")
        flat = _flat("", {"model": model, "flow": flow, "train": train, "data": recorded.get("data", {})})
        out.append(CheckpointSpec(path, spec, {**flat, "trained_steps": steps}))
    families = sorted({str(c.policy.model.get("_target_")) for c in out})
    require(
        len(families) == 1,
        f"validity.checkpoints mixes policy families ({', '.join(families)}); validate one family per run",
    )
    return out


def varying(settings: Sequence[Mapping[str, object]]) -> List[str]:
    """The settings that differ across the checkpoints (what the set varies: steps, rate, seed, ...)."""
    keys = sorted(set().union(*settings))
    return [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1]


def offline_settings(cfg: OfflineValidityJobConfig, training_anchors: int) -> OfflineSettings:
    v = cfg.validity
    rng = np.random.default_rng(stable_seed("offline-validity-anchors", int(v.seed)))
    count = min(int(v.anchors), training_anchors)
    return OfflineSettings(
        metrics=tuple(str(m.value if hasattr(m, "value") else m) for m in v.metrics),
        draws=int(v.heldout_draws),
        time_bins=int(v.time_bins),
        residual_anchors=np.sort(rng.choice(training_anchors, size=count, replace=False)),
        estimator=estimator_arguments(cfg.estimator),
        gradient_seeds=tuple(int(s) for s in v.gradient_seeds),
        gradient_batch_size=GRADIENT_BATCH,
        alpha=float(cfg.audit.alpha),
        percentile_epsilon=float(cfg.audit.percentile_epsilon),
        proposal_power=float(cfg.audit.proposal_power),
    )


def agreements_of(
    specs: Sequence[MetricSpec],
    measured: Sequence[CheckpointMetrics],
    successes: np.ndarray,
    episode_task: np.ndarray,
    tasks: Sequence[str],
    groups: Mapping[str, Sequence[int]],
    validity: ValidityConfig,
) -> Tuple[List[Agreement], List[SuccessReliability]]:
    """Every metric against success: pooled, per task (the per-task metrics), and pooled among the
    checkpoints of each group (validity.within: e.g. the snapshots trained equally long, scope
    "<setting>=<value>": what a metric ranks once that setting, which every metric may track, is held
    fixed; groups of fewer than 3 checkpoints left out). And the success rates' reliability, pooled
    and per task."""
    every, all_episodes = np.arange(len(measured)), np.ones(episode_task.size, dtype=bool)

    def measure(spec: MetricSpec, scope: str, values: List[float], rows: np.ndarray, episodes: np.ndarray) -> Agreement:
        return agreement(
            spec.name,
            scope,
            oriented(values, spec.lower_is_better),
            successes[np.ix_(rows, episodes)],
            episode_task[episodes],
            level=float(validity.level),
            resamples=int(validity.resamples),
            seed=int(validity.seed),
        )

    found = [measure(s, POOLED, [m.pooled[s.name] for m in measured], every, all_episodes) for s in specs]
    reliability = [success_reliability(POOLED, successes, episode_task)]
    for k, task in enumerate(tasks):
        mine = episode_task == k
        reliability.append(success_reliability(task, successes[:, mine], episode_task[mine]))
        found += [measure(s, task, [m.per_task[s.name][k] for m in measured], every, mine) for s in specs if s.per_task]
    for scope, members in groups.items():
        if len(members) >= 3:
            rows = np.asarray(members)
            found += [measure(s, scope, [measured[k].pooled[s.name] for k in rows], rows, all_episodes) for s in specs]
    return found, reliability


def grouped(specs: Sequence[CheckpointSpec], within: Optional[str]) -> Dict[str, List[int]]:
    """The checkpoints' indices by the value of the setting validity.within names ({} for none)."""
    if within is None:
        return {}
    known = varying([c.settings for c in specs])
    require(
        within in known,
        f"validity.within={within} is not a setting these checkpoints differ in; use one of {', '.join(known) or 'none'}",
    )
    out: Dict[str, List[int]] = {}
    for k, c in enumerate(specs):
        out.setdefault(f"{within}={c.settings.get(within)}", []).append(k)
    return out


def run(cfg: OfflineValidityJobConfig) -> JobResult[OfflineValidityResult]:
    started_ms = now_ms()
    validate_validity(cfg)
    paths = find_checkpoints(cfg.validity.checkpoints)
    specs = checkpoint_specs(cfg, paths)
    groups = grouped(specs, cfg.validity.within)
    repeated = duplicate_digests([sha256_file(p) for p in paths], paths)
    require(not repeated, f"validity.checkpoints holds the same weights twice ({repeated}); list each checkpoint once")
    data = load_data(cfg)
    heldout = load_heldout_data(cfg, int(cfg.validity.heldout_episodes_per_task))
    settings = offline_settings(cfg, len(data.anchors))
    metrics = metric_specs(settings.metrics, settings.time_bins)
    tasks = list(data.demonstrations.tasks)

    handles, policies, measured = [], [], []
    with console.unit_progress("offline metrics", len(specs)) as update:
        for k, checkpoint in enumerate(specs):
            handle = load_policy(checkpoint.policy, data, checkpoint.path)
            check_vocabulary(handle.sidecar, data.vocabulary, checkpoint.path)
            # Bound to the data's tasks: the held-out scenes are the same component's (task k is task k).
            policy = data.bind(handle.model, checkpoint.policy.flow, cfg.device)
            measured.append(offline_metrics(policy, heldout.anchors, data.anchors, settings))
            handles.append(handle)
            policies.append(data.bind(handle.model, checkpoint.policy.flow))  # rollouts run on the CPU
            update(completed=k + 1, description=checkpoint.path.parent.name)
    successes, episode_task = closed_loop(cfg, policies, tasks)
    found, reliability = agreements_of(metrics, measured, successes, episode_task, tasks, groups, cfg.validity)

    vary = varying([c.settings for c in specs])
    rows = tuple(
        checkpoint_row(c, paths, h.sha256, vary, m, successes[k], episode_task, len(tasks))
        for k, (c, h, m) in enumerate(zip(specs, handles, measured))
    )
    result = OfflineValidityResult(
        tasks=tuple(tasks),
        episodes_per_task=int(cfg.evaluate.episodes_per_task),
        episode_tasks=tuple(int(k) for k in episode_task),
        checkpoints=rows,
        agreements=tuple(found),
        reliability=tuple(reliability),
        validated=tuple(a.metric for a in found if a.scope == POOLED and a.validates),
    )
    out = output_dir(cfg)
    table = write_table(rows, [m.name for m in metrics], out / "checkpoints.csv")
    plots = [plot_pooled(result, [m.name for m in metrics], out / "offline_validity.png")] if cfg.validity.plot else []
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"offline-validity-{len(rows)}-checkpoints",
            metrics=validity_metrics(result),
            checks={},
            tags={"validity.validated": ",".join(result.validated) or "none", "validity.varies": ",".join(vary)},
            plots=plots,
            artifacts=[(table, None)],
            children=[child_run(row) for row in rows],
        ),
    )
    print_validity(result)
    return JobResult(result, published)


def closed_loop(
    cfg: OfflineValidityJobConfig, policies: Sequence[Any], tasks: List[str]
) -> Tuple[np.ndarray, np.ndarray]:
    """Every policy on the evaluation's held-out episodes, all handed to the rollout engine at once:
    successes (checkpoints, episodes) as 0/1, and each episode's task index."""
    episodes, _ = held_out_episodes(tasks, cfg.evaluate, cfg.simulator)
    with console.unit_progress("closed-loop episodes", len(episodes) * len(policies)) as update:
        outcomes = run_rollout_jobs(
            [RolloutJob(policy, episodes, cfg.simulator) for policy in policies],
            cfg.evaluate,
            cfg.rollout,
            lambda done, total: update(completed=done, total=total),
        )
    return np.stack([o.success for o in outcomes]).astype(np.float64), np.asarray([e.task_index for e in episodes])


def checkpoint_row(
    checkpoint: CheckpointSpec,
    paths: Sequence[Path],
    sha256: str,
    vary: Sequence[str],
    measured: CheckpointMetrics,
    successes: np.ndarray,
    episode_task: np.ndarray,
    tasks: int,
) -> CheckpointRow:
    return CheckpointRow(
        label=label_of(checkpoint.path, paths),
        path=str(checkpoint.path),
        sha256=sha256,
        varies={key: checkpoint.settings.get(key) for key in vary},
        metrics=dict(measured.pooled),
        per_task_metrics=dict(measured.per_task),
        success_rate=float(successes.mean()),
        per_task_success=tuple(float(successes[episode_task == k].mean()) for k in range(tasks)),
        episode_successes=tuple(int(x) for x in successes),
    )


def plot_pooled(result: OfflineValidityResult, metrics: Sequence[str], path: Path) -> Path:
    """Each metric's pooled value against success, one point per checkpoint."""
    pooled = {a.metric: a for a in result.agreements if a.scope == POOLED}
    values = {m: [r.metrics[m] for r in result.checkpoints] for m in metrics}
    return plot_validity(values, [r.success_rate for r in result.checkpoints], pooled, path)


def check_vocabulary(sidecar: Mapping[str, Any], vocabulary: Sequence[str], path: Path) -> None:
    """A checkpoint trained on other tasks' words reads this data's instructions as other tokens."""
    recorded = sidecar.get("vocab")
    require(
        recorded is None or list(recorded) == list(vocabulary),
        f"checkpoint {path} was trained on another vocabulary than this data's instructions; "
        "give the data (data.tasks) it was trained on",
    )


def duplicate_digests(digests: Sequence[str], paths: Sequence[Path]) -> str:
    """The first two paths holding the same weights ('' when every checkpoint is distinct)."""
    first: Dict[str, Path] = {}
    for digest, path in zip(digests, paths):
        if digest in first:
            return f"{first[digest]} and {path}"
        first[digest] = path
    return ""


def label_of(path: Path, paths: Sequence[Path]) -> str:
    """A checkpoint's short name: its path below the folder all the checkpoints share."""
    common = Path(os.path.commonpath([str(p.parent) for p in paths])) if len(paths) > 1 else path.parent.parent
    relative = path.parent.relative_to(common) if path.parent != common else Path(path.name)
    return str(relative) or path.parent.name


def write_table(rows: Sequence[CheckpointRow], metrics: Sequence[str], path: Path) -> Path:
    """One line per checkpoint: its label, what varies, its pooled metrics and success rate."""
    buffer = io.StringIO()
    varies = list(rows[0].varies) if rows else []
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["checkpoint", "sha256", *varies, *metrics, "success_rate"])
    for row in rows:
        writer.writerow(
            [
                row.label,
                row.sha256,
                *(row.varies[k] for k in varies),
                *(f"{row.metrics[m]:.6g}" for m in metrics),
                f"{row.success_rate:.4f}",
            ]
        )
    atomic_write_text(path, buffer.getvalue())
    return path


def validity_metrics(result: OfflineValidityResult) -> Dict[str, Optional[float]]:
    """Per pooled agreement: Pearson, Spearman and MMRV with their interval ends; the ceiling."""
    out: Dict[str, Optional[float]] = {"validity.checkpoints": float(len(result.checkpoints))}
    for a in result.agreements:
        if a.scope != POOLED:
            continue
        for name, value, interval in (
            ("pearson", a.pearson, a.pearson_interval),
            ("spearman", a.spearman, a.spearman_interval),
            ("mmrv", a.mmrv, a.mmrv_interval),
        ):
            out[f"validity.{a.metric}.{name}"] = value
            out[f"validity.{a.metric}.{name}_low"], out[f"validity.{a.metric}.{name}_high"] = interval
        out[f"validity.{a.metric}.mmrv_unrelated"] = a.mmrv_unrelated
        true_low, true_high = a.pearson_true_success_interval or (None, None)
        out[f"validity.{a.metric}.pearson_true_success"] = a.pearson_true_success
        out[f"validity.{a.metric}.pearson_true_success_low"] = true_low
        out[f"validity.{a.metric}.pearson_true_success_high"] = true_high
        out[f"validity.{a.metric}.validates"] = float(a.validates)
    pooled = next(r for r in result.reliability if r.scope == POOLED)
    out["validity.success_reliability"] = pooled.reliability
    return out


def child_run(row: CheckpointRow) -> ChildRun:
    """A checkpoint as a nested run: what sets it apart as params, its metrics and success as metrics."""
    metrics: Dict[str, Optional[float]] = {f"offline.{k}": v for k, v in row.metrics.items()}
    metrics["eval.policy_success_rate"] = row.success_rate
    return ChildRun(
        name=row.label,
        params={k: str(v) for k, v in row.varies.items()},
        metrics=metrics,
        history={},
        tags={"checkpoint.sha256": row.sha256, "checkpoint.path": row.path},
        result={"label": row.label, "path": row.path, "sha256": row.sha256, "metrics": dict(row.metrics)},
    )


def span(interval: Tuple[float, float]) -> str:
    return f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"


def print_validity(result: OfflineValidityResult) -> None:
    pooled = [a for a in result.agreements if a.scope == POOLED]
    print_pooled(result, pooled)
    if len(result.checkpoints) < MIN_CHECKPOINTS:
        console.print_warning(
            f"{len(result.checkpoints)} checkpoints: fewer than {MIN_CHECKPOINTS}, so no metric is said to validate "
            "(give more checkpoints: a multirun over steps, learning rates, data sizes and seeds)"
        )
    ceiling = next(r for r in result.reliability if r.scope == POOLED)
    console.show(
        f"success rates' split-half reliability {ceiling.reliability:.2f} (a correlation with success is at most "
        f"about {np.sqrt(max(ceiling.reliability, 0.0)):.2f} on these episodes); validated: "
        + (", ".join(result.validated) or "none")
    )
    within = [a for a in result.agreements if "=" in a.scope]  # validity.within's groups: "<setting>=<value>"
    if within:
        print_within(within)
    if not any(a.validates for a in (within or pooled)):
        print_success_per_task(result, "within its groups" if within else "")


def print_pooled(result: OfflineValidityResult, pooled: Sequence[Agreement]) -> None:
    """Every metric against success over all the checkpoints."""
    console.show(
        console.table(
            f"offline metric vs closed-loop success over {len(result.checkpoints)} checkpoints "
            f"({result.episodes_per_task} episodes per task; {int(100 * pooled[0].level)}% intervals)",
            ["metric", "Pearson", "Pearson, true success", "Spearman", "MMRV (unrelated)", "validates"],
            [
                (
                    a.metric,
                    f"{a.pearson:+.2f} {span(a.pearson_interval)}",
                    "-"
                    if a.pearson_true_success is None or a.pearson_true_success_interval is None
                    else f"{a.pearson_true_success:+.2f} {span(a.pearson_true_success_interval)}",
                    f"{a.spearman:+.2f} {span(a.spearman_interval)}",
                    f"{a.mmrv:.3f} [{a.mmrv_interval[0]:.3f}, {a.mmrv_interval[1]:.3f}] ({a.mmrv_unrelated:.3f})",
                    "yes" if a.validates else "no",
                )
                for a in pooled
            ],
        )
    )
    console.show(
        "Pearson, Spearman and MMRV read success measured on these episodes (episode noise attenuates them); "
        "'true success' corrects Pearson by the success rates' split-half reliability"
    )


def print_within(within: Sequence[Agreement]) -> None:
    """validity.within's comparisons, group by group."""
    console.show(
        console.table(
            "within each group (the setting held fixed): what a metric ranks beyond it",
            ["group", "metric", "checkpoints", "Spearman", "validates"],
            [
                (
                    a.scope,
                    a.metric,
                    a.checkpoints,
                    f"{a.spearman:+.2f} {span(a.spearman_interval)}",
                    "yes" if a.validates else "no",
                )
                for a in within
            ],  # fmt: skip
        )
    )


def print_success_per_task(result: OfflineValidityResult, where: str) -> None:
    """Where no metric ranks the checkpoints, what there is to read: each one's closed-loop success
    per task, best first."""
    console.show(
        console.table(
            f"no offline metric ranks these checkpoints{' ' + where if where else ''}: their closed-loop success "
            "per task is the result",
            ["checkpoint", "success", *result.tasks],
            [
                (row.label, f"{row.success_rate:.2f}", *(f"{x:.2f}" for x in row.per_task_success))
                for row in sorted(result.checkpoints, key=lambda r: -r.success_rate)
            ],
        )
    )
