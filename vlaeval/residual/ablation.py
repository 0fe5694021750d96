"""The importance-sampling ablation's torch side: per-sample gradient norms over every anchor,
minibatch gradients drawn from a proposal, and fine-tuning with importance weights.

Flow time is drawn through its quantile level u (t = FlowConvention.time_quantile(u)), so a
proposal over flow-time bins and the training distribution share one parametrisation; every draw
comes from a generator seeded by a stable digest of what it is for.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from vlaeval.artifacts import stable_seed
from vlaeval.audit.proposals import Proposal, time_ratio
from vlaeval.data.anchors import AnchorSet
from vlaeval.policy.bound import BoundPolicy
from vlaeval.policy.time_sampling import AdaptiveTimeSampler
from vlaeval.residual.gradients import PerSampleGradNorms, only_trainable


def quantile_draws(
    key: Sequence[Any], count: int, chunk: Tuple[int, int], stream: str = "ablation-draws"
) -> Tuple[np.ndarray, np.ndarray]:
    """Quantile levels u (count,) and noise (count, H, A) from the generator of `key` on `stream`
    (each caller its own stream: the ablation's, the offline metrics')."""
    rng = np.random.default_rng(stable_seed(stream, *key))
    u = rng.random(count)
    noise = rng.standard_normal((count, *chunk)).astype(np.float32)
    return u, noise


@dataclass(frozen=True)
class AnchorGradients:
    """Per (draw, anchor): squared per-sample gradient norm, loss and quantile level u; (draws, N)."""

    sq_norms: np.ndarray
    losses: np.ndarray
    u: np.ndarray


def anchor_gradients(
    policy: BoundPolicy,
    anchors: AnchorSet,
    *,
    trainable: str,
    draw_keys: Sequence[Sequence[Any]],
    batch_size: int,
    method: str = "auto",
    index: Optional[np.ndarray] = None,
    stream: str = "ablation-draws",
) -> AnchorGradients:
    """Every anchor (or those in `index`) under each draw key (one flow draw per anchor per key, on
    `stream`), exact per-sample norms over the `trainable` subset (vlaeval.residual.gradients), in
    eval mode."""
    model, convention, device = policy.model.eval(), policy.flow, policy.device
    rows = np.arange(len(anchors)) if index is None else np.asarray(index, dtype=np.int64)
    n = rows.size
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    sq = np.empty((len(draw_keys), n))
    losses = np.empty((len(draw_keys), n))
    us = np.empty((len(draw_keys), n))
    with only_trainable(model, trainable) as parameters:
        norms = PerSampleGradNorms(model, parameters, convention, method)
        for row, key in enumerate(draw_keys):
            u, noise = quantile_draws(key, n, chunk, stream)
            us[row] = u
            t = torch.from_numpy(convention.time_quantile(u).astype(np.float32))
            for start in range(0, n, int(batch_size)):
                stop = min(start + int(batch_size), n)
                batch = policy.anchor_batch(anchors, rows[start:stop])
                s, loss = norms(batch, t[start:stop].to(device), torch.from_numpy(noise[start:stop]).to(device))
                sq[row, start:stop] = s.double().cpu().numpy()
                losses[row, start:stop] = loss.double().cpu().numpy()
    return AnchorGradients(sq, losses, us)


def realised_second_moment_ratio(
    policy: BoundPolicy,
    anchors: AnchorSet,
    index: np.ndarray,
    *,
    anchor_probabilities: Optional[np.ndarray],
    time_bin_probabilities: Optional[np.ndarray],
    key: Sequence[Any],
    batch_size: int = 256,
) -> float:
    """M_p / M_uniform at the model's current weights: the per-sample second moment of the minibatch
    gradient (every trainable parameter) when (anchor, flow time) is drawn from p -- anchors from
    `anchor_probabilities` over all N anchors (None: uniform), flow time from K equal bins with
    `time_bin_probabilities` (None: the training distribution) -- against uniform draws. Estimated on
    the anchors in `index` (drawn uniformly) with one fixed draw each: E_p[w^2 ||g||^2] = E_u[w ||g||^2]
    with w = rho(u) / (N q_i), so the ratio is sum_j w_j s_j / sum_j s_j. The same anchors and draws
    for every call with the same key, so a run's curve moves with the model and the sampler alone."""
    rows = np.asarray(index, dtype=np.int64)
    grads = anchor_gradients(
        policy, anchors, trainable="all", draw_keys=[key], batch_size=batch_size, index=rows, stream="second-moment"
    )
    s, u = grads.sq_norms[0], grads.u[0]
    w = time_ratio(time_bin_probabilities, u)
    if anchor_probabilities is not None:
        w = w / (len(anchors) * np.asarray(anchor_probabilities, dtype=np.float64)[rows])
    return float(np.sum(w * s) / np.sum(s))


def weighted_losses(
    policy: BoundPolicy, anchors: AnchorSet, draws: Dict[str, np.ndarray], noise: np.ndarray
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(1 / B) sum_b w_b l(i_b, t(u_b), noise_b) -- unbiased for the uniform training loss -- and the
    per-sample losses l_b it weights, shape (B,)."""
    device = policy.device
    batch = policy.anchor_batch(anchors, draws["anchors"])
    t = torch.from_numpy(policy.flow.time_quantile(draws["u"]).astype(np.float32)).to(device)
    losses = policy.losses(batch, t, torch.from_numpy(noise).to(device))
    weights = torch.from_numpy(draws["weights"].astype(np.float32)).to(device)
    return (weights * losses).mean(), losses


def weighted_loss(
    policy: BoundPolicy, anchors: AnchorSet, draws: Dict[str, np.ndarray], noise: np.ndarray
) -> torch.Tensor:
    """(1 / B) sum_b w_b l(i_b, t(u_b), noise_b): unbiased for the uniform training loss."""
    return weighted_losses(policy, anchors, draws, noise)[0]


def minibatch_gradients(
    policy: BoundPolicy,
    anchors: AnchorSet,
    proposal: Proposal,
    *,
    trainable: str,
    count: int,
    batch_size: int,
    key: Sequence[Any],
) -> np.ndarray:
    """`count` importance-weighted minibatch gradients (count, P) at the model's current
    parameters, each from `batch_size` fresh draws of `proposal` (eval mode)."""
    rng = np.random.default_rng(stable_seed("ablation-minibatches", *key))
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    model = policy.model.eval()
    rows = []
    with only_trainable(model, trainable) as parameters:
        for _ in range(int(count)):
            draws = proposal.sample(rng, int(batch_size))
            noise = rng.standard_normal((int(batch_size), *chunk)).astype(np.float32)
            loss = weighted_loss(policy, anchors, draws, noise)
            grads = torch.autograd.grad(loss, parameters)
            rows.append(torch.cat([g.reshape(-1) for g in grads]).double().cpu().numpy())
    return np.stack(rows)


@dataclass(frozen=True)
class FineTuneSettings:
    steps: int
    batch_size: int
    learning_rate: float
    optimizer: str  # adamw or sgd
    trainable: str
    seed: int
    log_every: int


@dataclass(frozen=True)
class FineTuned:
    """A fine-tuned copy of the policy's module (in eval mode), its weighted training loss curve
    (step, the mean over the log window) and the seconds its steps took."""

    model: torch.nn.Module
    train_loss_curve: Tuple[Tuple[int, float], ...]
    train_seconds: float


def fine_tune(
    policy: BoundPolicy,
    anchors: AnchorSet,
    proposal: Proposal,
    settings: FineTuneSettings,
    *,
    at_steps: Sequence[int] = (),
    on_step: Optional[Callable[[int, torch.nn.Module, Proposal], None]] = None,
    time_sampler: Optional[AdaptiveTimeSampler] = None,
) -> FineTuned:
    """Fine-tune a copy of the policy's module for `settings.steps` steps on importance-weighted minibatches of
    `proposal`. The draws come from one generator per training seed, the same for every proposal
    (common random numbers). With `time_sampler`, flow time comes from it instead (refreshed after
    each step from the per-sample losses; the anchors still from `proposal`). `on_step(step, model,
    proposal)` runs at each step in `at_steps` (0 = before the first update), in eval mode, with the
    proposal the next step draws from, and must leave the parameters unchanged."""
    torch.use_deterministic_algorithms(True)
    model = copy.deepcopy(policy.model).to(policy.device)
    tuned = policy.with_model(model)
    rng = np.random.default_rng(stable_seed("ablation-train", settings.seed))
    torch.manual_seed(stable_seed("ablation-torch", settings.seed))
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    wanted = set(int(s) for s in at_steps)
    curve: List[Tuple[int, float]] = []
    window: List[float] = []
    train_seconds = 0.0
    with only_trainable(model, settings.trainable) as parameters:
        if settings.optimizer == "sgd":
            optimizer: torch.optim.Optimizer = torch.optim.SGD(parameters, lr=settings.learning_rate)
        else:
            optimizer = torch.optim.AdamW(parameters, lr=settings.learning_rate, weight_decay=0.0)
        for step in range(0, settings.steps + 1):
            if step in wanted and on_step is not None:
                on_step(step, model.eval(), current_proposal(proposal, time_sampler))
            if step == settings.steps:
                break
            started = time.perf_counter()
            model.train()
            draws = proposal.sample(rng, settings.batch_size)
            if time_sampler is not None:
                anchor_weights = draws["weights"]
                draws["u"], time_weights = time_sampler.draw(rng, settings.batch_size)
                draws["weights"] = anchor_weights * time_weights
            noise = rng.standard_normal((settings.batch_size, *chunk)).astype(np.float32)
            loss, losses = weighted_losses(tuned, anchors, draws, noise)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if time_sampler is not None:
                time_sampler.update(draws["u"], losses.detach().double().cpu().numpy(), anchor_weights)
            train_seconds += time.perf_counter() - started
            window.append(loss.item())
            if (step + 1) % settings.log_every == 0 or step + 1 == settings.steps:
                curve.append((step + 1, float(np.mean(window))))
                window.clear()
    return FineTuned(model.eval(), tuple(curve), train_seconds)


def current_proposal(proposal: Proposal, time_sampler: Optional[AdaptiveTimeSampler]) -> Proposal:
    """What the next step draws from: `proposal`, its flow-time part replaced by the sampler's state."""
    if time_sampler is None:
        return proposal
    return Proposal(proposal.name, proposal.anchor_probabilities, time_sampler.probabilities())


def batch_losses(
    policy: BoundPolicy, anchors: AnchorSet, t: np.ndarray, noise: np.ndarray, batch_size: int
) -> Iterator[Tuple[int, int, torch.Tensor]]:
    """(start, stop, per-sample flow-matching losses) of anchors[start:stop] at flow times t[start:stop]
    and noise[start:stop], batch by batch (call it under torch.no_grad)."""
    t32 = torch.from_numpy(np.asarray(t, dtype=np.float32))
    n = len(anchors)
    for start in range(0, n, int(batch_size)):
        stop = min(start + int(batch_size), n)
        batch = policy.anchor_batch(anchors, np.arange(start, stop))
        yield (
            start,
            stop,
            policy.losses(
                batch, t32[start:stop].to(policy.device), torch.from_numpy(noise[start:stop]).to(policy.device)
            ),
        )


def mean_loss(
    policy: BoundPolicy,
    anchors: AnchorSet,
    *,
    draws_per_anchor: int,
    key: Sequence[Any],
    batch_size: int = 4096,
) -> float:
    """The flow-matching loss over every anchor of `anchors`, `draws_per_anchor` fixed draws each
    (the same draws for every model evaluated with the same key)."""
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    total, count = 0.0, 0
    policy.model.eval()
    with torch.no_grad():
        for draw in range(int(draws_per_anchor)):
            u, noise = quantile_draws((*key, draw), len(anchors), chunk)
            for start, stop, loss in batch_losses(policy, anchors, policy.flow.time_quantile(u), noise, batch_size):
                total += float(loss.double().sum())
                count += stop - start
    return total / count
