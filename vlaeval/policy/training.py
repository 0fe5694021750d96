"""Training the policy with the flow-matching loss, deterministically on CPU."""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np
import torch

from vlaeval.artifacts import stable_seed
from vlaeval.choices import Optimizer
from vlaeval.data.anchors import AnchorSet
from vlaeval.errors import require
from vlaeval.policy.bound import BoundPolicy
from vlaeval.policy.flow import FlowConvention
from vlaeval.policy.threads import gflop_of, intra_op_threads, threads_for
from vlaeval.policy.time_sampling import AdaptiveTimeSampler, time_sampler
from vlaeval.records import JsonRecord


def flow_draws(
    rng: np.random.Generator, n: int, horizon: int, action_dim: int, flow: Any
) -> Tuple[torch.Tensor, torch.Tensor]:
    t = torch.from_numpy(FlowConvention.of(flow).sample_time(rng, n).astype(np.float32))
    noise = torch.from_numpy(rng.standard_normal((n, horizon, action_dim)).astype(np.float32))
    return t, noise


def make_optimizer(parameters: Any, train: Any) -> torch.optim.Optimizer:
    """AdamW (the built-in recipe) or SGD with heavy-ball momentum, at train.learning_rate."""
    lr, decay = float(train.learning_rate), float(train.weight_decay)
    if Optimizer.parse(train.optimizer, "train.optimizer") == Optimizer.sgd:
        return torch.optim.SGD(parameters, lr=lr, momentum=float(train.momentum), weight_decay=decay)
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=decay)


@dataclass
class TrainingExtras:
    """What a training comparison adds to a plain run (job=train builds it; the loop stays the same).

    anchor_probabilities: (N,) positive, summing to 1: draw anchors from this proposal, each loss
        weighted 1 / (N q_i) (None: uniformly, unweighted).
    seconds_before: time already spent for this run (e.g. scoring every anchor for the proposal),
        charged to the run's clock.
    heldout: the held-out loss of a model (called in eval mode every `heldout_every` steps and at
        steps 0 and the last; its time is not charged to the clock).
    validation: a second held-out loss at the same steps, on other scenes (what a grid chooses on).
    second_moment: the realised second-moment ratio of what the run draws from, given the online
        model and the adaptive sampler's flow-time bin probabilities (None: uniform flow time), at the
        same steps; its time is not charged either.
    steps: the steps a compute budget leaves (None: train.steps); the schedule ends there.
    gflop_before: work already spent for this run (the scoring), in GFLOP.
    """

    anchor_probabilities: Optional[np.ndarray] = None
    seconds_before: float = 0.0
    heldout: Optional[Callable[[torch.nn.Module], float]] = None
    heldout_every: int = 0
    validation: Optional[Callable[[torch.nn.Module], float]] = None
    second_moment: Optional[Callable[[torch.nn.Module, Optional[np.ndarray]], float]] = None
    steps: Optional[int] = None
    gflop_before: float = 0.0
    # Called every `snapshot_every` steps before the last with (step, the weights evaluation would read
    # -- the moving average where there is one --, the run so far): job=train's snapshots.
    snapshot: Optional[Callable[[int, torch.nn.Module, "TrainingRun"], None]] = None
    snapshot_every: int = 0
    # Where the run keeps what it needs to continue (weights, optimizer, schedule, moving average,
    # every generator's state, the curves so far), rewritten atomically every `resume_every_seconds`
    # of its clock: a killed run given the same file continues from the last save to the very weights
    # an uninterrupted run ends with. Removed when the run ends. None: nothing kept.
    resume_file: Optional[Path] = None
    resume_every_seconds: float = 60.0


class Minibatch(NamedTuple):
    """One training step's draws and loss. objective: what the step minimises (the weighted mean
    flow-matching loss, plus the model's auxiliary loss where it has one); losses: the batch_size
    per-sample flow-matching losses; u: the flow times' quantile levels and anchor_weights: the
    anchors' importance weights, repeated per draw (None where not drawn that way); auxiliary: the
    weighted mean auxiliary loss (None without one)."""

    objective: torch.Tensor
    losses: torch.Tensor
    u: Optional[np.ndarray]
    anchor_weights: Optional[np.ndarray]
    auxiliary: Optional[torch.Tensor]


def minibatch_loss(
    policy: BoundPolicy,
    anchors: AnchorSet,
    rng: np.random.Generator,
    batch_size: int,
    q: Optional[np.ndarray],
    sampler: Optional[AdaptiveTimeSampler],
    draws: int = 1,
) -> Minibatch:
    """batch_size / draws anchors uniformly or from q, each with `draws` flow times (from the
    training distribution or the sampler) and noises, each loss importance-weighted."""
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    count = batch_size // draws
    if q is None:
        index = rng.integers(0, len(anchors), size=count)
        anchor_weights = None
    else:
        index = rng.choice(len(anchors), size=count, p=q)
        anchor_weights = np.repeat(1.0 / (len(anchors) * q[index]), draws)
    batch = policy.anchor_batch(anchors, index)
    pairs = count * draws
    if sampler is None and anchor_weights is None:
        t, noise = flow_draws(rng, pairs, *chunk, policy.flow)
        losses, auxiliary = policy.training_losses(batch, t, noise, draws)
        return _with_auxiliary(losses.mean(), losses, None, None, auxiliary)
    # The same generator, in the same order of use, whatever the sampler's state: a run is
    # reproduced by its seed alone.
    if sampler is None:
        u, time_weights = rng.random(pairs), np.ones(pairs)
    else:
        u, time_weights = sampler.draw(rng, pairs)
    noise = torch.from_numpy(rng.standard_normal((pairs, *chunk)).astype(np.float32))
    t = torch.from_numpy(policy.flow.time_quantile(u).astype(np.float32))
    losses, auxiliary = policy.training_losses(batch, t, noise, draws)
    weights = time_weights if anchor_weights is None else time_weights * anchor_weights
    flow_loss = (torch.from_numpy(weights.astype(np.float32)) * losses).mean()
    return _with_auxiliary(flow_loss, losses, u, anchor_weights, auxiliary, draws)


def _with_auxiliary(
    flow_loss: torch.Tensor,
    losses: torch.Tensor,
    u: Optional[np.ndarray],
    anchor_weights: Optional[np.ndarray],
    auxiliary: Optional[torch.Tensor],
    draws: int = 1,
) -> Minibatch:
    """The step's objective: the flow-matching loss plus the per-anchor auxiliary loss's mean, each
    anchor weighted as it was drawn (so a proposal q leaves the auxiliary objective unbiased too)."""
    if auxiliary is None:
        return Minibatch(flow_loss, losses, u, anchor_weights, None)
    if anchor_weights is not None:
        auxiliary = torch.from_numpy(anchor_weights[::draws].astype(np.float32)) * auxiliary
    mean = auxiliary.mean()
    return Minibatch(flow_loss + mean, losses, u, anchor_weights, mean)


class WeightAverage:
    """An exponential moving average of a model's trainable weights (train.ema_decay), in a copy of
    the model that the held-out loss reads and that replaces the weights at the end. The decay ramps
    up as min(decay, (1 + step) / (10 + step)), so the first steps' weights do not linger."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = float(decay)
        self.model = copy.deepcopy(model).eval()
        self.online: List[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        self.average: List[torch.Tensor] = [
            p for p, q in zip(self.model.parameters(), model.parameters()) if q.requires_grad
        ]

    @torch.no_grad()
    def update(self, step: int) -> None:
        decay = min(self.decay, (1.0 + step) / (10.0 + step))
        torch._foreach_lerp_(self.average, [p.detach() for p in self.online], 1.0 - decay)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        for average, online in zip(self.average, self.online):
            online.copy_(average)


def learning_rate_schedule(
    optimizer: torch.optim.Optimizer, train: Any, steps: Optional[int] = None
) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup over train.warmup_steps (from lr / warmup_steps), then a cosine to zero at
    `steps` (None: train.steps); a run no longer than the warmup only rises."""
    steps, warmup = max(int(train.steps if steps is None else steps), 1), int(train.warmup_steps or 0)
    if warmup <= 0:
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(steps - warmup, 1), 1.0)
        return 0.5 * (1.0 + float(np.cos(np.pi * progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def step_gflop(policy: BoundPolicy, anchors: AnchorSet, batch_size: int, draws: int = 1) -> float:
    """A training step's work in GFLOP: a forward pass of one minibatch counted, the backward taken
    as twice the forward. Drawn from its own generator, in eval mode (no augmentation), without
    gradients: training's draws and weights are untouched."""
    rng = np.random.default_rng(0)
    was_training = policy.model.training
    policy.model.eval()
    try:
        with torch.no_grad():
            forward = gflop_of(lambda: minibatch_loss(policy, anchors, rng, batch_size, None, None, draws))
    finally:
        policy.model.train(was_training)
    return 3.0 * forward


@dataclass(frozen=True)
class TrainingRun(JsonRecord):
    """What a training run returns and a checkpoint's sidecar keeps (its `metrics`): which weights
    were kept, the loss curve (step, the mean of the log window's weighted flow-matching losses),
    the final loss (None: it diverged, at `diverged_at_step`), the policy's auxiliary loss's curve
    where it has one, the held-out curve (step, the run's clock in seconds, loss) when asked for, the
    adaptive time sampler's state and bin probabilities per log step, and the intra-op threads."""

    WRITTEN_WHEN_NONE = ("final_loss", "diverged_at_step")

    weights: str  # "ema" (the moving average) or "last"
    loss_curve: Tuple[Tuple[int, float], ...]
    final_loss: Optional[float]
    train_seconds: float
    steps: int
    diverged_at_step: Optional[int] = None
    auxiliary_curve: Optional[Tuple[Tuple[int, float], ...]] = None
    final_auxiliary_loss: Optional[float] = None
    heldout_curve: Optional[Tuple[Tuple[int, float, float], ...]] = None
    clock_seconds: Optional[float] = None
    time_sampling: Optional[Dict[str, Any]] = None  # the sampler's describe() and its "history"
    threads: Optional[int] = None
    # (step, the run's clock, loss) on the validation scenes, beside the held-out curve's
    validation_curve: Optional[Tuple[Tuple[int, float, float], ...]] = None
    # (step, M_p / M_uniform): the realised second-moment ratio of what the run drew from at that step
    second_moment_curve: Optional[Tuple[Tuple[int, float], ...]] = None
    # a step's counted work and the work spent before the first (scoring), in GFLOP: the work done by
    # step s is gflop_before + s * step_gflop, and the pairs seen s * train.batch_size
    step_gflop: Optional[float] = None
    gflop_before: Optional[float] = None

    def written_when_none(self) -> Tuple[str, ...]:
        # Beside its curve, the auxiliary loss's final value is written even when it diverged.
        return self.WRITTEN_WHEN_NONE + (("final_auxiliary_loss",) if self.auxiliary_curve is not None else ())

    @property
    def heldout_final(self) -> Optional[float]:
        return self.heldout_curve[-1][2] if self.heldout_curve else None


def train_policy(
    policy: BoundPolicy,
    anchors: AnchorSet,
    train: Any,
    progress: Optional[Callable[[int, float], None]] = None,
    extras: Optional[TrainingExtras] = None,
) -> TrainingRun:
    """Train `policy` in place for train.steps minibatches of train.batch_size anchors (uniformly, or
    from extras.anchor_probabilities), flow time from the training distribution or the adaptive
    sampler (train.time_sampling), every loss importance-weighted so that the objective stays the
    policy's own, with a cosine schedule from train.learning_rate to zero after train.warmup_steps,
    each gradient clipped to train.grad_clip_norm, and the weights' moving average (train.ema_decay)
    left in the model at the end, on train.threads intra-op threads (0: chosen by the step's work,
    vlaeval/policy/threads.py). Returns the loss curve (the mean of each log_every steps'
    minibatch flow-matching losses, weighted), the policy's auxiliary loss's curve where it has one
    (model.locate), the held-out curve (step, the run's clock in seconds, loss) when extras ask for
    it, and timings."""
    extras = extras or TrainingExtras()
    torch.use_deterministic_algorithms(True)
    draws = int(train.draws_per_anchor or 1)
    work = step_gflop(policy, anchors, int(train.batch_size), draws)
    threads = threads_for(work, int(train.threads or 0))
    with intra_op_threads(threads):
        run = _train(policy, anchors, train, progress, extras, draws)
    return dataclasses.replace(run, threads=threads, step_gflop=work, gflop_before=float(extras.gflop_before))


class Curves:
    """The loop's curves, each a mean over the steps since its last point: the flow-matching loss
    (comparable across runs with and without an auxiliary loss), the auxiliary loss where the
    policy has one, and the adaptive sampler's bin probabilities."""

    def __init__(self) -> None:
        self.loss: List[Tuple[int, float]] = []
        self.auxiliary: List[Tuple[int, float]] = []
        self.time_bins: List[Tuple[int, List[float]]] = []
        self._loss: List[float] = []
        self._auxiliary: List[float] = []

    def add(self, step: Minibatch) -> None:
        if step.auxiliary is None:
            self._loss.append(step.objective.item())
        else:
            auxiliary = step.auxiliary.item()
            self._loss.append(step.objective.item() - auxiliary)
            self._auxiliary.append(auxiliary)

    def point(self, step: int, sampler: Optional[AdaptiveTimeSampler]) -> float:
        """Close the window at `step`; returns its mean loss."""
        self.loss.append((step, float(np.mean(self._loss))))
        self._loss.clear()
        if self._auxiliary:
            self.auxiliary.append((step, float(np.mean(self._auxiliary))))
            self._auxiliary.clear()
        if sampler is not None:
            self.time_bins.append((step, sampler.probabilities().tolist()))
        return self.loss[-1][1]


def _train(
    policy: BoundPolicy,
    anchors: AnchorSet,
    train: Any,
    progress: Optional[Callable[[int, float], None]],
    extras: TrainingExtras,
    draws: int,
) -> TrainingRun:
    rng = np.random.default_rng(stable_seed("train", int(train.seed)))
    model = policy.model
    steps = int(train.steps) if extras.steps is None else int(extras.steps)
    optimizer = make_optimizer(model.parameters(), train)
    schedule = learning_rate_schedule(optimizer, train, steps)
    clip = train.grad_clip_norm
    ema_decay = train.ema_decay
    average = WeightAverage(model, float(ema_decay)) if ema_decay is not None else None
    evaluated = average.model if average is not None else model  # what the held-out loss reads
    kept = "ema" if average is not None else "last"  # which weights a checkpoint holds
    sampler = time_sampler(train)
    q = extras.anchor_probabilities
    curves = Curves()
    probes = Probes(extras, model, evaluated, sampler, steps)
    clock = float(extras.seconds_before)
    state = LoopState(model, optimizer, schedule, average, rng, sampler, curves, probes)
    first, clock = state.start(extras, steps, clock)  # step 1, or the one after a killed run's last save
    diverged_at: Optional[int] = None
    for step in range(first, steps + 1):
        started = time.perf_counter()
        model.train()
        drawn = minibatch_loss(policy, anchors, rng, int(train.batch_size), q, sampler, draws)
        if not torch.isfinite(drawn.objective):
            # A learning rate too high for this optimizer (a grid finds them): stop here and say so,
            # rather than train on NaN weights.
            diverged_at = step
            break
        optimizer.zero_grad(set_to_none=True)
        drawn.objective.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip), foreach=True)
        optimizer.step()
        schedule.step()
        if average is not None:
            average.update(step)
        if sampler is not None and drawn.u is not None:
            sampler.update(drawn.u, drawn.losses.detach().double().cpu().numpy(), drawn.anchor_weights)
        curves.add(drawn)
        clock += time.perf_counter() - started
        probes.at(step, clock)
        if step % int(train.log_every) == 0 or step == steps:
            mean = curves.point(step, sampler)
            if progress is not None:
                progress(step, mean)
        _snapshot(extras, step, steps, evaluated, kept, curves, clock - float(extras.seconds_before))
        state.keep(extras, step, steps, clock)
    state.finish(extras)
    if average is not None:
        average.copy_to(model)
    model.eval()
    return TrainingRun(
        weights=kept,
        loss_curve=tuple(curves.loss),
        final_loss=curves.loss[-1][1] if curves.loss and diverged_at is None else None,
        train_seconds=clock - float(extras.seconds_before),
        steps=steps,
        diverged_at_step=diverged_at,  # the step whose loss was not finite; None: trained to the end
        auxiliary_curve=tuple(curves.auxiliary) if curves.auxiliary else None,
        final_auxiliary_loss=curves.auxiliary[-1][1] if curves.auxiliary and diverged_at is None else None,
        heldout_curve=tuple(probes.heldout) if probes.heldout else None,
        clock_seconds=clock if probes.heldout else None,
        time_sampling={**sampler.describe(), "history": curves.time_bins} if sampler is not None else None,
        validation_curve=tuple(probes.validation) if probes.validation else None,
        second_moment_curve=tuple(probes.second_moment) if probes.second_moment else None,
    )


RESUME_SCHEMA = 1


@dataclass(frozen=True)
class ResumeState:
    """A resume file's content (LoopState.save): the step it was saved after, the run's clock then,
    the state dicts, the generators' states, the adaptive sampler's (bin averages, bins seen, steps),
    the curves' lists by name and the probes' (held-out, validation, second moment)."""

    schema: int
    step: int
    clock: float
    model: Dict[str, torch.Tensor]
    optimizer: Dict[str, Any]
    schedule: Dict[str, Any]
    average: Optional[Dict[str, torch.Tensor]]
    numpy: Mapping[str, Any]
    torch: torch.Tensor
    sampler: Optional[Tuple[List[float], List[bool], int]]
    curves: Dict[str, List[Any]]
    probes: Tuple[List[Any], List[Any], List[Any]]


class LoopState:
    """Everything the training loop carries from one step to the next, saved to and restored from a
    resume file (torch.save of tensors and plain values only: it loads with weights_only)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: torch.optim.lr_scheduler.LRScheduler,
        average: Optional[WeightAverage],
        rng: np.random.Generator,
        sampler: Optional[AdaptiveTimeSampler],
        curves: "Curves",
        probes: "Probes",
    ) -> None:
        self.model, self.optimizer, self.schedule, self.average = model, optimizer, schedule, average
        self.rng, self.sampler, self.curves, self.probes = rng, sampler, curves, probes
        self.saved_at = 0.0

    def start(self, extras: TrainingExtras, steps: int, clock: float) -> Tuple[int, float]:
        """(first step, clock): a fresh run's step 1 (its step-0 probes taken), or the step after a
        killed run's last save with the clock it had then."""
        first, clock = self.restore(extras.resume_file, steps, clock)
        if first == 1:
            self.probes.at(0, clock)
        self.saved_at = clock
        return first, clock

    def keep(self, extras: TrainingExtras, step: int, steps: int, clock: float) -> None:
        """Save after `step` when a resume file is asked for and resume_every_seconds have passed."""
        if extras.resume_file is not None and step < steps and clock - self.saved_at >= extras.resume_every_seconds:
            self.save(extras.resume_file, step, clock)
            self.saved_at = clock

    def finish(self, extras: TrainingExtras) -> None:
        if extras.resume_file is not None and extras.resume_file.exists():
            extras.resume_file.unlink()  # the run ended: nothing to continue

    def save(self, path: Path, step: int, clock: float) -> None:
        from vlaeval.artifacts import atomic_write_bytes

        sampler = self.sampler
        state = ResumeState(
            schema=RESUME_SCHEMA,
            step=int(step),
            clock=float(clock),
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            schedule=self.schedule.state_dict(),
            average=None if self.average is None else self.average.model.state_dict(),
            numpy=self.rng.bit_generator.state,
            torch=torch.get_rng_state(),
            sampler=None if sampler is None else (sampler.average.tolist(), sampler.seen.tolist(), sampler.steps),
            curves=dict(vars(self.curves)),
            probes=(self.probes.heldout, self.probes.validation, self.probes.second_moment),
        )
        atomic_write_bytes(path, lambda out: torch.save(dataclasses.asdict(state), out))

    def restore(self, path: Optional[Path], steps: int, clock: float) -> Tuple[int, float]:
        """(first step to run, the run's clock): (1, `clock`), or the step after a resume file's and
        the clock it was saved at (the file read back into the loop's objects)."""
        if path is None or not path.exists():
            return 1, clock
        try:
            state = ResumeState(**torch.load(path, map_location="cpu", weights_only=True))
            if state.schema != RESUME_SCHEMA or not 0 < state.step < steps:
                raise ValueError(f"schema {state.schema}, step {state.step} of {steps}")
        except Exception as error:  # a damaged or foreign file: start over, and say so
            import logging

            logging.getLogger(__name__).warning("resume file %s not used (%s): training from step 1", path, error)
            os.remove(path)
            return 1, clock
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(state.optimizer)
        self.schedule.load_state_dict(state.schedule)
        if self.average is not None and state.average is not None:
            self.average.model.load_state_dict(state.average)
        self.rng.bit_generator.state = state.numpy
        torch.set_rng_state(state.torch)
        if self.sampler is not None and state.sampler is not None:
            average, seen, taken = state.sampler
            self.sampler.average = np.asarray(average, dtype=np.float64)
            self.sampler.seen = np.asarray(seen, dtype=bool)
            self.sampler.steps = int(taken)
        for name, value in state.curves.items():
            setattr(self.curves, name, list(value))
        heldout, validation, second_moment = state.probes
        self.probes.heldout, self.probes.validation = list(heldout), list(validation)
        self.probes.second_moment = list(second_moment)
        return state.step + 1, state.clock


class Probes:
    """What a comparison measures along the run, every extras.heldout_every steps and at steps 0 and
    the last, off the clock: the held-out and validation losses of the weights evaluation would read,
    and the realised second-moment ratio at the online weights under the draws in use."""

    def __init__(
        self,
        extras: TrainingExtras,
        online: torch.nn.Module,
        evaluated: torch.nn.Module,
        sampler: Optional[AdaptiveTimeSampler],
        steps: int,
    ) -> None:
        self.extras, self.online, self.evaluated, self.sampler = extras, online, evaluated, sampler
        self.heldout: List[Tuple[int, float, float]] = []
        self.validation: List[Tuple[int, float, float]] = []
        self.second_moment: List[Tuple[int, float]] = []
        every = int(extras.heldout_every)
        wanted = any(x is not None for x in (extras.heldout, extras.validation, extras.second_moment))
        self.steps = {0, steps, *range(0, steps, every)} if wanted and every > 0 else set()

    def at(self, step: int, clock: float) -> None:
        if step not in self.steps:
            return
        extras = self.extras
        if extras.heldout is not None:
            self.heldout.append((step, clock, _heldout(extras.heldout, self.evaluated)))
        if extras.validation is not None:
            self.validation.append((step, clock, _heldout(extras.validation, self.evaluated)))
        if extras.second_moment is not None:
            bins = self.sampler.probabilities() if self.sampler is not None else None
            self.second_moment.append((step, float(extras.second_moment(self.online, bins))))


def _snapshot(
    extras: TrainingExtras,
    step: int,
    steps: int,
    evaluated: torch.nn.Module,
    weights: str,
    curves: Curves,
    seconds: float,
) -> None:
    """Hand the weights evaluation would read to extras.snapshot, every snapshot_every steps before the last."""
    if extras.snapshot is None or extras.snapshot_every <= 0 or step % extras.snapshot_every or step >= steps:
        return
    so_far = TrainingRun(
        weights=weights,
        loss_curve=tuple(curves.loss),
        final_loss=curves.loss[-1][1] if curves.loss else None,
        train_seconds=seconds,
        steps=step,
    )
    extras.snapshot(step, evaluated, so_far)


def _heldout(loss: Callable[[torch.nn.Module], float], model: torch.nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        return float(loss(model))


def validate_training_recipe(train: Any) -> None:
    """One-line errors for the recipe's settings (train.warmup_steps, grad_clip_norm, ema_decay,
    threads, resume_every_s, draws_per_anchor)."""
    warmup = int(train.warmup_steps or 0)
    require(warmup >= 0, f"train.warmup_steps={warmup} must be >= 0 (0: the cosine from the first step)")
    clip = train.grad_clip_norm
    require(clip is None or float(clip) > 0, f"train.grad_clip_norm={clip} must be > 0 (null: no clipping)")
    require(
        int(train.threads or 0) >= 0,
        f"train.threads={train.threads} must be >= 0 (0: by the model's size)",
    )
    decay = train.ema_decay
    require(
        decay is None or 0.0 < float(decay) < 1.0,
        f"train.ema_decay={decay} must be in (0, 1) (null: evaluate and save the last weights)",
    )
    require(
        float(train.resume_every_s) >= 0,
        f"train.resume_every_s={train.resume_every_s} must be >= 0 seconds (0: the state kept after every step)",
    )
    draws, batch = int(train.draws_per_anchor), int(train.batch_size)
    require(
        draws >= 1 and batch % draws == 0,
        f"train.draws_per_anchor={draws} must be >= 1 and divide train.batch_size={batch}"
        " (the batch is batch_size / draws_per_anchor anchors, each with that many flow draws)",
    )
