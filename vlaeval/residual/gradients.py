"""Exact per-sample gradient norms of the flow-matching loss in one batched backward pass.

For a linear layer y = W a + b applied once per sample, sample i's gradient is
dW_i = g_i a_i^T and db_i = g_i, with g_i = dloss_i/dy_i, so ||dW_i||^2 = ||g_i||^2 ||a_i||^2 and
||db_i||^2 = ||g_i||^2 (the "ghost norm" identity). Forward hooks keep each trainable layer's
input a and output y; one autograd.grad of sum_i loss_i with respect to the outputs gives every
g_i at once (sample i's output reaches only loss_i). No per-sample gradient is materialised.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch
from scipy.stats import spearmanr

from vlaeval.artifacts import stable_seed
from vlaeval.data.anchors import AnchorSet
from vlaeval.policy.flow import sample_flow_time
from vlaeval.policy.training import anchor_batch, flow_matching_losses


@contextlib.contextmanager
def recorded_linear_io(modules: Sequence[torch.nn.Linear]) -> Iterator[List[Tuple[torch.Tensor, torch.Tensor]]]:
    records: List[Tuple[torch.Tensor, torch.Tensor]] = []
    handles = [
        m.register_forward_hook(lambda module, inputs, output: records.append((inputs[0], output))) for m in modules
    ]
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def per_sample_sq_grad_norms(
    model: Any, modules: Sequence[torch.nn.Linear], batch: Dict[str, torch.Tensor], t: torch.Tensor, noise: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(squared gradient norm over the modules' parameters, loss) per sample, shape (B,) each."""
    with recorded_linear_io(modules) as records:
        losses = flow_matching_losses(model, batch, t, noise)
    outputs = [y for _, y in records]
    grads = torch.autograd.grad(losses.sum(), outputs)
    sq = torch.zeros_like(losses)
    for (a, _), g, module in zip(records, grads, modules):
        g_sq = g.pow(2).sum(dim=-1)
        sq = sq + g_sq * a.detach().pow(2).sum(dim=-1)
        if module.bias is not None:
            sq = sq + g_sq
    return sq.detach(), losses.detach()


def per_sample_sq_grad_norms_loop(
    model: Any,
    parameters: Sequence[torch.nn.Parameter],
    batch: Dict[str, torch.Tensor],
    t: torch.Tensor,
    noise: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The reference: one autograd pass per sample (what the batched method must equal)."""
    sq, losses = [], []
    for i in range(t.shape[0]):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        loss = flow_matching_losses(model, one, t[i : i + 1], noise[i : i + 1])[0]
        grads = torch.autograd.grad(loss, list(parameters))
        sq.append(torch.stack([g.pow(2).sum() for g in grads]).sum().detach())
        losses.append(loss.detach())
    return torch.stack(sq), torch.stack(losses)


def gradient_draws(
    seed: int, count: int, horizon: int, action_dim: int, flow: Any
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flow time and noise for the first `count` anchors under one gradient seed, drawn from the
    training distribution (a prefix of the same stream for any larger count)."""
    rng = np.random.default_rng(stable_seed("gradient-seed", int(seed)))
    t = sample_flow_time(rng, count, flow).astype(np.float32)
    noise = rng.standard_normal((count, horizon, action_dim)).astype(np.float32)
    return torch.from_numpy(t), torch.from_numpy(noise)


@dataclass(frozen=True)
class GradientMeasurements:
    """Per (seed, anchor) pair: squared per-sample gradient norm over the trainable parameters and
    the flow-matching loss, both shape (seeds, anchors); and how many parameter entries were trainable."""

    sq_norms: np.ndarray
    losses: np.ndarray
    parameter_count: int

    def rms(self) -> np.ndarray:
        """Gradient RMS per anchor: sqrt(mean over seeds and parameter entries of the squared gradient)."""
        return np.sqrt(self.sq_norms.mean(axis=0) / self.parameter_count)


def gradient_measurements(
    model: Any,
    anchors: AnchorSet,
    anchor_index: np.ndarray,
    instruction_table: torch.Tensor,
    seeds: Sequence[int],
    flow: Any,
    *,
    trainable: str,
    batch_size: int,
    device: str = "cpu",
    method: str = "batched",
) -> GradientMeasurements:
    """Squared gradient norms and losses for every (seed, anchor) pair (`method="loop"` is the
    one-backward-per-sample reference the batched method must equal)."""
    torch.use_deterministic_algorithms(True)
    model = model.to(device).eval()
    trainable_params = {id(p) for p in model.trainable_parameters(trainable)}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable_params)
    modules = model.trainable_modules(trainable)
    parameters = list(model.trainable_parameters(trainable))
    k = anchor_index.size
    draws = [gradient_draws(s, k, anchors.horizon, anchors.target_actions.shape[-1], flow) for s in seeds]
    t_all = torch.cat([d[0] for d in draws]).to(device)  # seed-major: pair p = (seed p // k, anchor p % k)
    noise_all = torch.cat([d[1] for d in draws]).to(device)
    pair_anchor = np.tile(anchor_index, len(seeds))
    sq_out, loss_out = [], []
    for start in range(0, pair_anchor.size, int(batch_size)):
        stop = min(start + int(batch_size), pair_anchor.size)
        batch = anchor_batch(anchors, pair_anchor[start:stop], instruction_table, device)
        if method == "batched":
            sq, loss = per_sample_sq_grad_norms(model, modules, batch, t_all[start:stop], noise_all[start:stop])
        else:
            sq, loss = per_sample_sq_grad_norms_loop(model, parameters, batch, t_all[start:stop], noise_all[start:stop])
        sq_out.append(sq.cpu())
        loss_out.append(loss.cpu())
    for p in model.parameters():
        p.requires_grad_(True)
    shape = (len(seeds), k)
    return GradientMeasurements(
        sq_norms=torch.cat(sq_out).double().numpy().reshape(shape),
        losses=torch.cat(loss_out).double().numpy().reshape(shape),
        parameter_count=sum(p.numel() for p in parameters),
    )


def split_half_reliability(sq_norms: np.ndarray, parameter_count: int) -> Dict[str, Any]:
    """Spearman between the gradient RMS from the first and the second half of the seeds, and the
    Spearman-Brown step-up to the full seed count."""
    half = sq_norms.shape[0] // 2
    first = np.sqrt(sq_norms[:half].mean(axis=0) / parameter_count)
    second = np.sqrt(sq_norms[half : 2 * half].mean(axis=0) / parameter_count)
    rho = float(spearmanr(first, second).statistic)
    return {
        "split_half_spearman": rho,
        "spearman_brown": 2 * rho / (1 + rho) if rho > -1 else None,
        "seeds_per_half": half,
        "method": "seeds split in order into halves; Spearman of per-anchor gradient RMS",
    }
