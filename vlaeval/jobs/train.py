"""job=train: train the built-in tiny VLA on the built-in Meta-World demonstrations.

Build (or load the cached) demonstrations, train with the flow-matching loss, save a weights-only
checkpoint with its JSON sidecar into the run directory and into the builtin cache slot, evaluate
it closed-loop beside the scripted expert, and log the loss curve and success rates to MLflow.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Dict

from omegaconf import DictConfig

from vlaeval import console
from vlaeval.artifacts import atomic_write_bytes
from vlaeval.config import POLICY_SECTIONS
from vlaeval.errors import require, require_at_least
from vlaeval.policy.builtin import PolicySpec, checkpoint_key, train_and_save
from vlaeval.policy.checkpoint import sidecar_path
from vlaeval.policy.flow import FlowConvention
from vlaeval.rollouts.engine import evaluate_closed_loop
from vlaeval.rollouts.evaluation import evaluation_view, plot_success, print_evaluation, validate_evaluate
from vlaeval.runs import RunReport, lineage_tags, load_data, now_ms, output_dir, publish

JOB = "train"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
READS = ("train", "evaluate", *POLICY_SECTIONS)


def validate_train(cfg: DictConfig) -> None:
    t = cfg.train
    require_at_least("train.steps", t.steps, 1)
    require_at_least("train.batch_size", t.batch_size, 1)
    require(t.learning_rate > 0, f"train.learning_rate={t.learning_rate} must be > 0")
    require_at_least("train.log_every", t.log_every, 1)
    FlowConvention.of(cfg.flow).validate()


def run(cfg: DictConfig) -> Dict[str, Any]:
    started_ms = now_ms()
    validate_train(cfg)
    if cfg.train.evaluate_after:
        validate_evaluate(cfg)
    data = load_data(cfg)
    out = output_dir(cfg)
    with console.unit_progress("training", int(cfg.train.steps)) as update:
        handle = train_and_save(
            PolicySpec.of(cfg),
            data,
            out / "model.pt",
            lambda step, loss: update(completed=step, description=f"training loss {loss:.4f}"),
        )
    # The run's checkpoint also fills the builtin cache slot for this config.
    slot = cfg.paths.cache_dir + f"/checkpoints/{checkpoint_key(PolicySpec.of(cfg), data)}"
    _copy_checkpoint(handle.path, slot)
    metrics_train = handle.sidecar["metrics"]
    result: Dict[str, Any] = {
        "checkpoint": str(handle.path),
        "checkpoint_sha256": handle.sha256,
        "manifest_sha256": data.demonstrations.manifest_sha256,
        "dataset": data.demonstrations.manifest,
        "train": metrics_train,
        "parameters": sum(p.numel() for p in handle.model.parameters()),
    }
    metrics = {
        "train.final_loss": metrics_train["final_loss"],
        "timing.train_seconds": metrics_train["train_seconds"],
        "data.steps": data.demonstrations.manifest["steps"],
        "model.parameters": result["parameters"],
    }
    history = {"train.loss": metrics_train["loss_curve"]}
    checks: Dict[str, bool] = {}
    plots = []
    if cfg.train.evaluate_after:
        evaluation = evaluate_closed_loop(
            data.bind(handle.model, cfg.flow), data.demonstrations.tasks, cfg.evaluate, cfg.rollout
        )
        result["evaluation"] = evaluation
        eval_metrics, checks = evaluation_view(evaluation)
        metrics.update(eval_metrics)
        plots.append(plot_success(evaluation, out / "success_rates.png"))
    result = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result,
            started_ms=started_ms,
            run_name=f"train-{handle.sha256[:12]}",
            metrics=metrics,
            checks=checks,
            tags=lineage_tags(handle, data),
            history=history,
            plots=plots,
            artifacts=[(handle.path, "checkpoint"), (sidecar_path(handle.path), "checkpoint")],
        ),
    )
    console.show(
        f"trained {result['parameters']:,} parameters for {metrics_train['steps']} steps in "
        f"{metrics_train['train_seconds']:.1f} s: final loss {metrics_train['final_loss']:.4f}"
    )
    if "evaluation" in result:
        print_evaluation(result["evaluation"])
    console.show(f"checkpoint: {handle.path} (sha256 {handle.sha256[:16]}...)")
    return result


def _write_all(data: bytes, handle: BinaryIO) -> None:
    handle.write(data)


def _copy_checkpoint(path: Path, slot: str) -> None:
    for source in (path, sidecar_path(path)):
        atomic_write_bytes(Path(slot) / Path(source).name, partial(_write_all, Path(source).read_bytes()))
