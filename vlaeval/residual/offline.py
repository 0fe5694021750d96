"""The offline numbers a checkpoint is judged by before any rollout: what job=offline_validity checks
against closed-loop success.

    heldout_loss          the flow-matching loss on held-out scenes' anchors, flow time from the
                          training distribution (`draws` fixed draws per anchor, the same for every
                          checkpoint)
    heldout_loss.bin_K    the same loss with the noise level drawn uniformly inside bin K of B
                          (bin 0: nearly clean actions; the last: nearly pure noise), whichever end
                          of t the policy calls noise
    action_error          the sampled chunk (the policy's own sampling, from fixed initial noise per
                          anchor) against the expert's actions: mean squared error over the chunk
    residual_mean         the audit's frozen residual (the `estimator` section's estimator), averaged
                          over a fixed set of training anchors
    audit_ratio           the audit's predicted second-moment ratio on those anchors: its residual
                          proposal against their gradient RMS (over `gradient_seeds`)

Each is returned per task (the anchors of that task) and pooled (all anchors; audit_ratio pooled only:
a ratio over a task's few anchors says little).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from vlaeval.audit.statistics import information_to_baseline_ratio, proposal_distribution
from vlaeval.choices import NoiseEnd
from vlaeval.data.anchors import AnchorSet
from vlaeval.policy.bound import BoundPolicy
from vlaeval.policy.flow import sample_chunks
from vlaeval.residual.ablation import batch_losses, quantile_draws
from vlaeval.residual.estimators import EstimatorArguments, score_anchors
from vlaeval.residual.gradients import gradient_measurements

BATCH = 512  # anchors per forward pass


@dataclass(frozen=True)
class MetricSpec:
    """An offline metric's name, its direction (whether lower should mean more success: fixed before
    looking at any success) and whether it is measured per task."""

    name: str
    lower_is_better: bool
    per_task: bool = True


def lower_is_better(metric: str) -> bool:
    """A metric's direction, fixed before any success is seen: every loss and error lower; the audit's
    ratio higher (a policy that fits every anchor alike leaves the residual nothing to point at: its
    ratio nears 1)."""
    return metric != "audit_ratio"


def metric_specs(metrics: Sequence[str], time_bins: int) -> Tuple[MetricSpec, ...]:
    """The metrics `metrics` names, each bin of heldout_loss_by_time its own."""
    out = []
    for name in metrics:
        if name == "heldout_loss_by_time":
            out += [MetricSpec(f"heldout_loss.bin_{k}", True) for k in range(int(time_bins))]
        else:  # the audit's ratio is measured on all its anchors at once: pooled only
            out.append(MetricSpec(name, lower_is_better(name), per_task=name != "audit_ratio"))
    return tuple(out)


@dataclass(frozen=True)
class OfflineSettings:
    """What the offline metrics are measured with: the draws per held-out anchor, the noise-level bins,
    the training anchors the residual and the audit's ratio read and their estimator / gradient seeds,
    the audit's proposal settings (alpha, percentile_epsilon, proposal_power)."""

    metrics: Tuple[str, ...]
    draws: int
    time_bins: int
    residual_anchors: np.ndarray
    estimator: EstimatorArguments
    gradient_seeds: Tuple[int, ...]
    gradient_batch_size: int
    alpha: float  # the audit's proposal: its uniform share, percentile floor and power
    percentile_epsilon: float
    proposal_power: float


def _per_task(values: np.ndarray, task_index: np.ndarray, tasks: int) -> Tuple[float, ...]:
    return tuple(
        float(values[task_index == k].mean()) if np.any(task_index == k) else float("nan") for k in range(tasks)
    )


def _fixed_draws(key: str, count: int, chunk: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
    """Uniform levels (count,) and noise (count, H, A): the same for every checkpoint of a run."""
    return quantile_draws((key,), count, chunk, stream="offline-metrics")


@torch.no_grad()
def _losses(policy: BoundPolicy, anchors: AnchorSet, t: np.ndarray, noise: np.ndarray) -> np.ndarray:
    out = np.empty(len(anchors))
    for start, stop, loss in batch_losses(policy, anchors, t, noise, BATCH):
        out[start:stop] = loss.double().cpu().numpy()
    return out


def heldout_losses(policy: BoundPolicy, anchors: AnchorSet, draws: int, time_bins: int) -> Dict[str, np.ndarray]:
    """Per held-out anchor: the loss at training-distribution flow times, and per noise-level bin."""
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    n, convention = len(anchors), policy.flow
    overall = np.zeros(n)
    bins = np.zeros((int(time_bins), n))
    for d in range(int(draws)):
        u, noise = _fixed_draws(f"heldout-{d}", n, chunk)
        overall += _losses(policy, anchors, convention.time_quantile(u), noise) / draws
        for k in range(int(time_bins)):
            level = (k + u) / time_bins  # the noise level, uniform inside bin k
            t = level if convention.noise_at == NoiseEnd.one else 1.0 - level
            bins[k] += _losses(policy, anchors, t, noise) / draws
    out = {"heldout_loss": overall}
    out.update({f"heldout_loss.bin_{k}": bins[k] for k in range(int(time_bins))})
    return out


def action_errors(policy: BoundPolicy, anchors: AnchorSet) -> np.ndarray:
    """Per held-out anchor: the mean squared error of the sampled chunk against the expert's, over
    the chunk's unpadded entries."""
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    _, noise = _fixed_draws("action-error", len(anchors), chunk)
    out = np.empty(len(anchors))
    with torch.no_grad():
        for start in range(0, len(anchors), BATCH):
            stop = min(start + BATCH, len(anchors))
            batch = policy.anchor_batch(anchors, np.arange(start, stop))
            initial = torch.from_numpy(noise[start:stop]).to(policy.device)
            sampled = sample_chunks(policy.model, batch, initial, policy.sampling_steps, policy.flow)
            target = torch.from_numpy(anchors.target_actions[start:stop]).double()
            error = (sampled.double().cpu() - target) ** 2
            mask = torch.from_numpy(anchors.target_mask[start:stop]).double().unsqueeze(-1).expand_as(error)
            out[start:stop] = ((error * mask).sum(dim=(1, 2)) / mask.sum(dim=(1, 2)).clamp_min(1.0)).numpy()
    return out


def residual_and_ratio(
    policy: BoundPolicy, anchors: AnchorSet, settings: OfflineSettings, want_ratio: bool
) -> Tuple[np.ndarray, Optional[float]]:
    """The residual per audited training anchor, and (want_ratio) the audit's predicted ratio on them."""
    index = settings.residual_anchors
    scores = score_anchors(policy, anchors, index, **settings.estimator).estimator_residuals.mean(axis=0)
    if not want_ratio:
        return scores, None
    measured = gradient_measurements(
        policy,
        anchors,
        index,
        settings.gradient_seeds,
        trainable="all",
        batch_size=int(settings.gradient_batch_size),
    )
    q = proposal_distribution(
        scores,
        alpha=settings.alpha,
        percentile_epsilon=settings.percentile_epsilon,
        proposal_power=settings.proposal_power,
    )
    return scores, float(information_to_baseline_ratio(measured.rms(), q))


@dataclass(frozen=True)
class CheckpointMetrics:
    """One checkpoint's offline metrics: pooled, and per task (in the data's task order)."""

    pooled: Mapping[str, float]
    per_task: Mapping[str, Tuple[float, ...]]


def offline_metrics(
    policy: BoundPolicy,
    heldout: AnchorSet,
    training: AnchorSet,
    settings: OfflineSettings,
    progress: Optional[Callable[[str], None]] = None,
) -> CheckpointMetrics:
    """Every metric `settings.metrics` names, for `policy` (bound to the data's tasks; `heldout`'s
    task k is the data's task k)."""
    policy.model.eval()
    tasks = int(policy.tokens.shape[0])
    pooled: Dict[str, float] = {}
    per_task: Dict[str, Tuple[float, ...]] = {}

    def keep(name: str, values: np.ndarray, task_index: np.ndarray) -> None:
        pooled[name] = float(values.mean())
        per_task[name] = _per_task(values, task_index, tasks)

    wanted = set(settings.metrics)
    if wanted & {"heldout_loss", "heldout_loss_by_time"}:
        if progress is not None:
            progress("held-out loss")
        for name, values in heldout_losses(policy, heldout, settings.draws, settings.time_bins).items():
            asked = "heldout_loss" if name == "heldout_loss" else "heldout_loss_by_time"
            if asked in wanted:
                keep(name, values, heldout.task_index)
    if "action_error" in wanted:
        if progress is not None:
            progress("sampled actions")
        keep("action_error", action_errors(policy, heldout), heldout.task_index)
    if wanted & {"residual_mean", "audit_ratio"}:
        if progress is not None:
            progress("residual" + (" and gradients" if "audit_ratio" in wanted else ""))
        scores, ratio = residual_and_ratio(policy, training, settings, "audit_ratio" in wanted)
        if "residual_mean" in wanted:
            keep("residual_mean", scores, training.task_index[settings.residual_anchors])
        if ratio is not None:
            pooled["audit_ratio"] = ratio
    return CheckpointMetrics(pooled=pooled, per_task=per_task)
