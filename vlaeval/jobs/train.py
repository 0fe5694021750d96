"""job=train: train the built-in tiny VLA on the built-in Meta-World demonstrations.

Build (or load the cached) demonstrations; build the policy (from train.init_from's weights when
given); for a training comparison, score every anchor for the residual proposal
(train.anchor_sampling=residual, its time charged to the run's clock) and record the held-out scenes
(train.heldout_every); train with the flow-matching loss (flow time from the training distribution
or the adaptive sampler, every loss importance-weighted); save a weights-only checkpoint with its
JSON sidecar into the run directory and into the builtin cache slot, evaluate it closed-loop beside
the scripted expert, and log the loss curves and success rates to MLflow.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch

from vlaeval import console
from vlaeval.artifacts import stable_seed
from vlaeval.audit.statistics import proposal_distribution
from vlaeval.choices import AnchorSampling
from vlaeval.config import AuditConfig, EstimatorConfig, PolicyJobSettings, TrainConfig
from vlaeval.envs.episodes import require_held_out_split
from vlaeval.errors import UserInputError, require, require_at_least
from vlaeval.policy.builtin import (
    PolicyData,
    PolicyHandle,
    PolicySpec,
    checkpoint_key,
    load_policy,
    sidecar_for,
    train_and_save,
)
from vlaeval.policy.checkpoint import save_checkpoint, sidecar_path
from vlaeval.policy.flow import FlowConvention
from vlaeval.policy.time_sampling import validate_time_sampling
from vlaeval.policy.training import TrainingExtras, TrainingRun, step_gflop, validate_training_recipe
from vlaeval.residual.ablation import mean_loss, realised_second_moment_ratio
from vlaeval.residual.estimators import estimator_arguments, score_anchors, validate_estimator_config
from vlaeval.residual.estimators import scoring_gflop as count_scoring_gflop
from vlaeval.rollouts.engine import evaluate_closed_loop
from vlaeval.rollouts.evaluation import Evaluation, evaluation_view, plot_success, print_evaluation, validate_evaluate
from vlaeval.runs import (
    JobResult,
    RunReport,
    SavedAsJson,
    lineage_tags,
    load_data,
    load_heldout_data,
    now_ms,
    output_dir,
    publish,
)
from vlaeval.store import put

JOB = "train"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()


def validate_train(cfg: TrainJobConfig) -> None:
    t = cfg.train
    require_at_least("train.steps", t.steps, 1)
    require_at_least("train.batch_size", t.batch_size, 1)
    require(t.learning_rate > 0, f"train.learning_rate={t.learning_rate} must be > 0")
    require_at_least("train.log_every", t.log_every, 1)
    require(0.0 <= t.momentum < 1.0, f"train.momentum={t.momentum} must be in [0, 1)")
    validate_time_sampling(t)
    validate_training_recipe(t)
    FlowConvention.of(cfg.flow).validate()
    if AnchorSampling.parse(t.anchor_sampling, "train.anchor_sampling") == AnchorSampling.residual:
        validate_estimator_config(cfg.estimator)
        a = cfg.audit
        require(0.0 < a.alpha <= 1.0, f"audit.alpha={a.alpha} must be in (0, 1] to bound the weights 1 / (N q)")
        require(
            0.0 <= a.percentile_epsilon < 0.5, f"audit.percentile_epsilon={a.percentile_epsilon} must be in [0, 0.5)"
        )
        require(a.proposal_power > 0, f"audit.proposal_power={a.proposal_power} must be > 0")
    if t.init_from is not None:
        require(
            Path(str(t.init_from)).is_file(),
            f"train.init_from={t.init_from} is not a file; give a weights-only checkpoint (e.g. a job=train run's model.pt)",
        )
    require(t.heldout_every >= 0, f"train.heldout_every={t.heldout_every} must be >= 0 (0: no held-out loss)")
    validate_comparison_settings(t)
    require(t.save_every >= 0, f"train.save_every={t.save_every} must be >= 0 (0: no snapshots)")
    if t.heldout_every > 0:
        require_at_least("train.heldout_episodes_per_task", t.heldout_episodes_per_task, 1)
        require_at_least("train.heldout_draws", t.heldout_draws, 1)
        require(
            "scenes" in cfg.data,
            f"the data component {cfg.data.get('_target_')} has no held-out scenes; set train.heldout_every=0",
        )


def comparison_extras(cfg: TrainJobConfig, data: Any) -> Optional[Callable[[torch.nn.Module], TrainingExtras]]:
    """What a training comparison needs from the model training starts from: the residual proposal
    over every anchor (scored by that model; the scoring time charged to the run's clock and its
    FLOPs to the compute budget), the steps a compute budget leaves (train.budget_samples), and along
    the way the held-out and validation losses and the realised second-moment ratio. None for a
    plain run."""
    t = cfg.train
    residual = AnchorSampling.parse(t.anchor_sampling, "train.anchor_sampling") == AnchorSampling.residual
    along = int(t.heldout_every) > 0
    episodes = int(t.heldout_episodes_per_task)
    heldout = load_heldout_data(cfg, episodes, str(t.heldout_scenes)) if along else None
    validation = (
        load_heldout_data(cfg, episodes, str(t.validation_scenes))
        if along and t.validation_scenes is not None
        else None
    )
    probed = second_moment_anchors(t, len(data.anchors)) if along else None
    if not residual and heldout is None and t.budget_samples is None:
        return None

    def loss_on(held: PolicyData, model: torch.nn.Module, role: str) -> Callable[[torch.nn.Module], float]:
        policy = data.bind(model, cfg.flow).for_instructions(held.demonstrations.instructions)
        # the held-out curve keeps its key from before validation existed: the same draws, the same numbers
        key = ("train",) if role == "heldout" else ("train", role)
        return lambda m: mean_loss(policy.with_model(m), held.anchors, draws_per_anchor=int(t.heldout_draws), key=key)

    def make(model: torch.nn.Module) -> TrainingExtras:
        # the scoring's work is counted first, so a budget it would exhaust is refused before it runs
        gflop = scoring_gflop(cfg, data, model) if residual else 0.0
        steps = budget_steps(cfg, data, model, gflop) if t.budget_samples is not None else None
        q, seconds = residual_proposal(cfg, data, model) if residual else (None, 0.0)
        second_moment = None
        if probed is not None:

            def second_moment(online: torch.nn.Module, bins: Optional[np.ndarray]) -> float:
                return realised_second_moment_ratio(
                    data.bind(online, cfg.flow),
                    data.anchors,
                    probed,
                    anchor_probabilities=q,
                    time_bin_probabilities=bins,
                    key=("train", "second-moment"),
                )

        return TrainingExtras(
            anchor_probabilities=q,
            seconds_before=seconds,
            heldout=None if heldout is None else loss_on(heldout, model, "heldout"),
            heldout_every=int(t.heldout_every),
            validation=None if validation is None else loss_on(validation, model, "validation"),
            second_moment=second_moment,
            steps=steps,
            gflop_before=gflop,
        )

    return make


def scoring_gflop(cfg: TrainJobConfig, data: PolicyData, model: torch.nn.Module) -> float:
    """The work of scoring every anchor (estimator.*) with `model`, in GFLOP."""
    return count_scoring_gflop(data.bind(model.eval(), cfg.flow), data.anchors, estimator_arguments(cfg.estimator))


def residual_proposal(cfg: TrainJobConfig, data: PolicyData, model: torch.nn.Module) -> Tuple[np.ndarray, float]:
    """(q over every anchor, the seconds its scoring took): the audit's proposal over the residual of
    every anchor, scored (estimator.*) by the model training starts from."""
    bound = data.bind(model.eval(), cfg.flow)
    arguments = estimator_arguments(cfg.estimator)
    started = time.perf_counter()
    with console.unit_progress(f"scoring every anchor ({cfg.estimator.kind})", len(data.anchors)) as update:
        scores = score_anchors(
            bound,
            data.anchors,
            np.arange(len(data.anchors)),
            **arguments,
            progress=lambda done, total: update(completed=done),
        )
    q = proposal_distribution(
        scores.estimator_residuals.mean(axis=0),
        alpha=float(cfg.audit.alpha),
        percentile_epsilon=float(cfg.audit.percentile_epsilon),
        proposal_power=float(cfg.audit.proposal_power),
    )
    return q / q.sum(), time.perf_counter() - started


def budget_steps(cfg: TrainJobConfig, data: PolicyData, model: torch.nn.Module, gflop_before: float) -> int:
    """The steps train.budget_samples leaves: the budget in training pairs, less the work already
    spent (scoring) converted at a training pair's counted FLOPs, over train.batch_size."""
    t = cfg.train
    batch, draws = int(t.batch_size), int(t.draws_per_anchor or 1)
    per_pair = step_gflop(data.bind(model, cfg.flow), data.anchors, batch, draws) / batch
    spent = gflop_before / per_pair
    steps = int((int(t.budget_samples or 0) - spent) // batch)
    require(
        steps >= 1,
        f"train.budget_samples={t.budget_samples} leaves no training step once scoring every anchor spends "
        f"{spent:,.0f} training pairs' work; raise the budget, or train.anchor_sampling=uniform",
    )
    return steps


def second_moment_anchors(train: TrainConfig, anchors: int) -> Optional[np.ndarray]:
    """The fixed training anchors the realised second-moment ratio is measured on (None: off): the
    same ones for every run on this data, drawn once from their own stream."""
    count = int(train.second_moment_anchors)
    if count <= 0:
        return None
    rng = np.random.default_rng(stable_seed("second-moment-anchors", anchors))
    return np.sort(rng.choice(anchors, size=min(count, anchors), replace=False))


SNAPSHOTS = "snapshots"  # the run folder's snapshots/step_<N>/model.pt (train.save_every)


def with_snapshots(
    cfg: TrainJobConfig, data: PolicyData, out: Path, extras: Optional[Callable[[torch.nn.Module], TrainingExtras]]
) -> Optional[Callable[[torch.nn.Module], TrainingExtras]]:
    """`extras` with a checkpoint every train.save_every steps (its sidecar records the steps so far)."""
    every = int(cfg.train.save_every)
    if every <= 0:
        return extras
    spec = PolicySpec.of(cfg)

    def snapshot(step: int, model: torch.nn.Module, so_far: TrainingRun) -> None:
        save_checkpoint(model, out / SNAPSHOTS / f"step_{step:07d}" / "model.pt", sidecar_for(spec, data, so_far))

    def make(model: torch.nn.Module) -> TrainingExtras:
        made = extras(model) if extras is not None else TrainingExtras()
        return dataclasses.replace(made, snapshot=snapshot, snapshot_every=every)

    return make


def validate_comparison_settings(t: TrainConfig) -> None:
    """train.heldout_scenes, validation_scenes, second_moment_anchors and budget_samples: one-line
    errors before any work."""
    require_held_out_split("train.heldout_scenes", t.heldout_scenes)
    require(
        t.second_moment_anchors >= 0, f"train.second_moment_anchors={t.second_moment_anchors} must be >= 0 (0: off)"
    )
    if t.validation_scenes is not None:
        require_held_out_split("train.validation_scenes", t.validation_scenes)
        require(
            {str(t.validation_scenes), str(t.heldout_scenes)} == {"validation", "test"},
            f"train.validation_scenes={t.validation_scenes} and train.heldout_scenes={t.heldout_scenes} share scenes; "
            "choose on one half and report on the other: train.validation_scenes=validation train.heldout_scenes=test",
        )
    for name in ("validation_scenes", "second_moment_anchors"):
        if getattr(t, name) and t.heldout_every <= 0:
            raise UserInputError(f"train.{name} is measured at the held-out steps; set train.heldout_every > 0")
    if t.budget_samples is not None:
        require(
            int(t.budget_samples) >= int(t.batch_size),
            f"train.budget_samples={t.budget_samples} is less than one step of train.batch_size={t.batch_size}; "
            "raise it (or null: train.steps)",
        )


@dataclass(frozen=True, kw_only=True)
class TrainJobConfig(PolicyJobSettings):
    """The sections job=train reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    estimator: EstimatorConfig
    audit: AuditConfig


@dataclass(frozen=True)
class TrainResult(SavedAsJson):
    """job=train's result: the checkpoint, the data it learned from, the training's metrics and
    curves, and the held-out evaluation (None: not asked for, or the training diverged)."""

    checkpoint: str
    checkpoint_sha256: str
    manifest_sha256: str
    dataset: Dict[str, Any]
    train: TrainingRun
    parameters: int
    evaluation: Optional[Evaluation] = None


def run(cfg: TrainJobConfig) -> JobResult[TrainResult]:
    started_ms = now_ms()
    validate_train(cfg)
    if cfg.train.evaluate_after:
        validate_evaluate(cfg)
    data = load_data(cfg)
    out = output_dir(cfg)
    budget = cfg.train.budget_samples
    planned = int(cfg.train.steps) if budget is None else int(budget) // int(cfg.train.batch_size)  # at most
    with console.unit_progress("training", planned) as update:
        handle = train_and_save(
            PolicySpec.of(cfg),
            data,
            out / "model.pt",
            lambda step, loss: update(completed=step, description=f"training loss {loss:.4f}"),
            with_snapshots(cfg, data, out, comparison_extras(cfg, data)),
        )
    metrics_train = handle.training
    assert metrics_train is not None, "a checkpoint trained here records its training"
    diverged = metrics_train.diverged_at_step
    if cfg.train.anchor_sampling == AnchorSampling.uniform and diverged is None:
        fill_builtin_slot(cfg, data, handle)
    parameters = sum(p.numel() for p in handle.model.parameters())
    metrics, history = training_view(metrics_train)
    metrics.update({"data.steps": data.demonstrations.manifest["steps"], "model.parameters": parameters})
    checks: Dict[str, bool] = {}
    plots = []
    if diverged is not None:  # a learning-rate grid's too-high end: a result, not a crash of the sweep
        console.print_warning(
            f"training diverged at step {diverged} (its loss was not finite): train.learning_rate="
            f"{cfg.train.learning_rate} is too high for train.optimizer={cfg.train.optimizer}; not evaluated"
        )
        checks["train.trained_to_the_end"] = False
    evaluation = None
    if diverged is None and cfg.train.evaluate_after:
        evaluation = evaluate_closed_loop(
            data.bind(handle.model, cfg.flow),
            data.demonstrations.tasks,
            cfg.evaluate,
            cfg.rollout,
            simulator=cfg.simulator,
        )
        eval_metrics, checks = evaluation_view(evaluation)
        metrics.update(eval_metrics)
        plots.append(plot_success(evaluation, out / "success_rates.png"))
    result = TrainResult(
        checkpoint=str(handle.path),
        checkpoint_sha256=handle.sha256,
        manifest_sha256=data.demonstrations.manifest_sha256,
        dataset=data.demonstrations.manifest,
        train=metrics_train,
        parameters=parameters,
        evaluation=evaluation,
    )
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
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
    final, auxiliary = metrics_train.final_loss, metrics_train.final_auxiliary_loss
    console.show(
        f"trained {parameters:,} parameters for {metrics_train.steps} steps in "
        f"{metrics_train.train_seconds:.1f} s: final loss "
        + (f"{final:.4f}" if final is not None else f"none (diverged at step {diverged})")
        + (f", auxiliary loss {auxiliary:.4f}" if auxiliary is not None else "")
    )
    if evaluation is not None:
        print_evaluation(evaluation)
    console.show(f"checkpoint: {handle.path} (sha256 {handle.sha256[:16]}...)")
    return JobResult(result, published)


def fill_builtin_slot(cfg: TrainJobConfig, data: PolicyData, handle: PolicyHandle) -> None:
    """The run's checkpoint also fills the built-in cache slot for this config (store.put), when the
    slot's key describes it: uniform anchor sampling (a residual proposal depends on the estimator
    and audit settings too) and a training that did not diverge."""
    spec = PolicySpec.of(cfg)
    put(
        cfg.paths.cache_dir,
        "checkpoints",
        checkpoint_key(spec, data),
        [handle.path, sidecar_path(handle.path)],
        read=lambda folder: load_policy(spec, data, folder / handle.path.name),
    )


def training_view(metrics_train: TrainingRun) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """What MLflow shows of a training run: its headline metrics and its curves (the loss, the held-out
    loss against steps, the adaptive sampler's bin probabilities)."""
    metrics: Dict[str, Any] = {
        "train.final_loss": metrics_train.final_loss,
        "timing.train_seconds": metrics_train.train_seconds,
    }
    history: Dict[str, Any] = {"train.loss": list(metrics_train.loss_curve)}
    if metrics_train.auxiliary_curve is not None:  # the policy's own auxiliary loss (model.locate), beside it
        history["train.auxiliary_loss"] = list(metrics_train.auxiliary_curve)
        metrics["train.final_auxiliary_loss"] = metrics_train.final_auxiliary_loss
    if metrics_train.heldout_curve is not None:  # against steps; the clock (scoring included) is in result.json
        history["train.heldout_loss"] = [(step, loss) for step, _, loss in metrics_train.heldout_curve]
        metrics["train.heldout_loss_final"] = metrics_train.heldout_final
        metrics["timing.clock_seconds"] = metrics_train.clock_seconds
    validation, moments, per_step = (
        metrics_train.validation_curve,
        metrics_train.second_moment_curve,
        metrics_train.step_gflop,
    )
    if validation is not None:  # what a learning-rate grid chooses on
        history.update({"train.validation_loss": [(step, loss) for step, _, loss in validation]})
        metrics.update({"train.validation_loss_final": validation[-1][2]})
    if moments is not None:  # below 1: the sampler buys a larger effective batch
        history.update({"train.second_moment_ratio": list(moments)})
    if per_step is not None:  # the work done by step s: gflop_before + s * step_gflop
        work = (metrics_train.gflop_before or 0.0) + metrics_train.steps * per_step
        metrics.update({"train.step_gflop": per_step, "train.gflop": work})
    if metrics_train.time_sampling is not None:  # the adaptive sampler's bin probabilities, as curves in the UI
        sampling = metrics_train.time_sampling
        metrics["train.time_max_weight"] = sampling["max_weight"]
        for k in range(sampling["bins"]):
            history[f"train.time_bin_probability.{k:02d}"] = [(step, p[k]) for step, p in sampling["history"]]
    return metrics, history
