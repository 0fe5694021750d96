"""Flow-matching conventions (openpi / LeRobot pi0 / SmolVLA): t ~ Beta(a, b) * scale + offset,
t = 1 is pure noise; x_t = t * eps + (1 - t) * a; target velocity u = eps - a; per-sample loss =
mean squared error over the unpadded action chunk."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def sample_flow_time(rng: np.random.Generator, size: int, flow: Any) -> np.ndarray:
    return rng.beta(float(flow.beta_a), float(flow.beta_b), size=size) * float(flow.time_scale) + float(
        flow.time_offset
    )


def noisy_actions(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, *([1] * (actions.dim() - 1)))
    return t * noise + (1.0 - t) * actions


def per_sample_loss(
    velocity: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean squared velocity error over each sample's unpadded chunk entries: shape (B,)."""
    error = (velocity - (noise - actions)) ** 2  # (B, H, A)
    weights = mask.to(error.dtype).unsqueeze(-1).expand_as(error)
    return (error * weights).sum(dim=(1, 2)) / weights.sum(dim=(1, 2)).clamp_min(1.0)


@torch.no_grad()
def sample_actions(policy: Any, conditioning: torch.Tensor, steps: int, generator: torch.Generator) -> torch.Tensor:
    """Euler integration of the learned velocity from t = 1 (noise) to t = 0 (actions)."""
    batch = conditioning.shape[0]
    x = torch.randn(batch, policy.horizon, policy.action_dim, generator=generator, dtype=conditioning.dtype)
    dt = 1.0 / steps
    for k in range(steps):
        t = torch.full((batch,), 1.0 - k * dt, dtype=conditioning.dtype)
        x = x - dt * policy.velocity(conditioning, x, t)
    return x
