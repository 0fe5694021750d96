"""Flow-matching conventions, as configuration (the `flow` section), so each policy is trained,
scored and sampled under its own.

    noise_at            which end of the policy's time t is pure noise:
                          one  (openpi / LeRobot pi0 / SmolVLA): x_t = t * eps + (1 - t) * a
                          zero (GR00T-style):                    x_t = t * a + (1 - t) * eps
    velocity_target     what the velocity predicts: noise_minus_action (eps - a) or action_minus_noise
    time_distribution   the training distribution of t = x * time_scale + time_offset, x from
                        beta(beta_a, beta_b), uniform, or logit_normal(logit_mean, logit_std)

Per-sample loss = mean squared velocity error over the unpadded action chunk. Quantile-based draws
(the residual estimators) go through the *noise level* (0 = clean action, 1 = pure noise): the
same uniform number u gives the same noise level in either convention, so one network written in
two conventions gets the same scores, draw for draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from vlaeval.choices import NoiseEnd, TimeDistribution, VelocityTarget
from vlaeval.errors import require
from vlaeval.policy.protocol import map_tensors, uses_loss_level

FLOAT_FIELDS = ("beta_a", "beta_b", "logit_mean", "logit_std", "time_scale", "time_offset")


@dataclass(frozen=True)
class FlowConvention:
    """The `flow` section as a typed value (its defaults live in vlaeval.config.FlowConfig)."""

    noise_at: NoiseEnd
    velocity_target: VelocityTarget
    time_distribution: TimeDistribution
    beta_a: float
    beta_b: float
    logit_mean: float
    logit_std: float
    time_scale: float
    time_offset: float

    @classmethod
    def of(cls, flow: Any) -> "FlowConvention":
        """The convention of a `flow` config section (or an object with the same attributes)."""
        if isinstance(flow, FlowConvention):
            return flow
        return cls(
            noise_at=NoiseEnd.parse(flow.noise_at, "flow.noise_at"),
            velocity_target=VelocityTarget.parse(flow.velocity_target, "flow.velocity_target"),
            time_distribution=TimeDistribution.parse(flow.time_distribution, "flow.time_distribution"),
            **{name: float(getattr(flow, name)) for name in FLOAT_FIELDS},
        )

    def validate(self) -> None:
        require(
            self.beta_a > 0 and self.beta_b > 0, f"flow.beta_a={self.beta_a}, flow.beta_b={self.beta_b} must be > 0"
        )
        require(self.logit_std > 0, f"flow.logit_std={self.logit_std} must be > 0")
        require(
            self.time_scale > 0 and self.time_offset >= 0 and self.time_scale + self.time_offset <= 1.0 + 1e-9,
            f"flow.time_scale={self.time_scale}, flow.time_offset={self.time_offset}: t = x * scale + offset must "
            "stay in [0, 1] (scale > 0, offset >= 0, scale + offset <= 1)",
        )

    # ------------------------------------------------------------------ time
    def sample_time(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """t from the training distribution (the policy's own t), shape (size,)."""
        if self.time_distribution == TimeDistribution.beta:
            x = rng.beta(self.beta_a, self.beta_b, size=size)
        elif self.time_distribution == TimeDistribution.uniform:
            x = rng.random(size)
        else:
            x = 1.0 / (1.0 + np.exp(-rng.normal(self.logit_mean, self.logit_std, size=size)))
        return x * self.time_scale + self.time_offset

    def _x_quantile(self, v: np.ndarray) -> np.ndarray:
        if self.time_distribution == TimeDistribution.uniform:
            return v
        if self.time_distribution == TimeDistribution.logit_normal:
            from scipy.stats import norm

            z = self.logit_mean + self.logit_std * norm.ppf(np.clip(v, 1e-12, 1 - 1e-12))
            return 1.0 / (1.0 + np.exp(-z))
        if self.beta_b == 1.0:  # Beta(a, 1) has CDF x^a: its quantile is closed-form (openpi's a = 1.5)
            return v ** (1.0 / self.beta_a)
        if self.beta_a == 1.0:  # Beta(1, b): 1 - (1 - v)^(1/b), closed-form too
            return 1.0 - (1.0 - v) ** (1.0 / self.beta_b)
        from scipy.stats import beta as beta_dist

        return beta_dist.ppf(v, self.beta_a, self.beta_b)

    def time_quantile(self, u: np.ndarray) -> np.ndarray:
        """The policy's t at uniform u in [0, 1], ordered so that the noise level rises with u."""
        u = np.asarray(u, dtype=np.float64)
        v = u if self.noise_at == NoiseEnd.one else 1.0 - u
        return self._x_quantile(v) * self.time_scale + self.time_offset

    def _x_cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.clip(x, 0.0, 1.0)
        if self.time_distribution == TimeDistribution.uniform:
            return x
        if self.time_distribution == TimeDistribution.logit_normal:
            from scipy.stats import norm

            inner = np.clip(x, 1e-12, 1 - 1e-12)
            return norm.cdf((np.log(inner / (1.0 - inner)) - self.logit_mean) / self.logit_std)
        from scipy.stats import beta as beta_dist

        return beta_dist.cdf(x, self.beta_a, self.beta_b)

    def time_level(self, t: np.ndarray) -> np.ndarray:
        """The quantile level u of flow times t: the inverse of time_quantile (noise rising with u)."""
        v = self._x_cdf((np.asarray(t, dtype=np.float64) - self.time_offset) / self.time_scale)
        return v if self.noise_at == NoiseEnd.one else 1.0 - v

    def noise_level(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.noise_at == NoiseEnd.one else 1.0 - t

    # ------------------------------------------------------------------ paths and targets
    def noisy(self, actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        s = self.noise_level(t).reshape(-1, *([1] * (actions.dim() - 1)))
        return s * noise + (1.0 - s) * actions

    def target(self, actions: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return noise - actions if self.velocity_target == VelocityTarget.noise_minus_action else actions - noise

    @property
    def velocity_is_dxdt(self) -> bool:
        """Whether the velocity target equals d x_t / dt along the path (else it is its negative)."""
        if self.noise_at == NoiseEnd.one:
            return self.velocity_target == VelocityTarget.noise_minus_action
        return self.velocity_target == VelocityTarget.action_minus_noise

    def per_sample_loss(
        self, velocity: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Mean squared velocity error over each sample's unpadded chunk entries: shape (B,)."""
        error = (velocity - self.target(actions, noise)) ** 2  # (B, H, A)
        weights = mask.to(error.dtype).unsqueeze(-1).expand_as(error)
        return (error * weights).sum(dim=(1, 2)) / weights.sum(dim=(1, 2)).clamp_min(1.0)


def flow_matching_losses(
    model: Any, batch: Dict[str, torch.Tensor], t: torch.Tensor, noise: torch.Tensor, flow: Any, draws: int = 1
) -> torch.Tensor:
    """Per-sample flow-matching loss under the policy's convention (`flow`): shape (B * draws,), with
    `draws` consecutive (t, noise) draws per anchor of the batch. The anchor is encoded once and its
    conditioning repeated: an image policy's encoder, most of its step, runs on B anchors, not B * draws.
    A loss-level policy (protocol.py) computes it itself, on the batch's rows repeated per draw."""
    if uses_loss_level(model):
        return model.loss(repeat_rows(batch, draws), noise, t)
    return losses_given(model, model.encode(batch), batch, t, noise, flow, draws)


def repeat_rows(batch: Any, draws: int) -> Any:
    """Each row of a batch (or a conditioning: any nest of tensors leading with the batch) repeated
    `draws` times in place (row b's draws are rows b * draws ... b * draws + draws - 1)."""
    return batch if draws == 1 else map_tensors(lambda x: x.repeat_interleave(draws, dim=0), batch)


def training_losses(
    model: Any, batch: Dict[str, torch.Tensor], t: torch.Tensor, noise: torch.Tensor, flow: Any, draws: int = 1
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """What a training step minimises: the per-sample flow-matching losses (B * draws,) as
    flow_matching_losses gives them, and the policy's own per-anchor auxiliary loss (B,) where it
    defines one (`encode_for_training`, e.g. tiny_vla_vision's `locate`: the image features
    predict where things are), from the same encoder pass; None where it does not. Only training
    calls this: scoring, gradients and rollouts see the flow-matching loss alone."""
    if uses_loss_level(model):
        return model.loss(repeat_rows(batch, draws), noise, t), None
    own = getattr(model, "encode_for_training", None)
    conditioning, auxiliary = own(batch) if callable(own) else (model.encode(batch), None)
    return losses_given(model, conditioning, batch, t, noise, flow, draws), auxiliary


def losses_given(
    model: Any,
    conditioning: Any,
    batch: Dict[str, torch.Tensor],
    t: torch.Tensor,
    noise: torch.Tensor,
    flow: Any,
    draws: int,
) -> torch.Tensor:
    convention = FlowConvention.of(flow)
    actions, mask = batch["target_actions"], batch["target_mask"]
    conditioning, actions, mask = (repeat_rows(x, draws) for x in (conditioning, actions, mask))
    x_t = convention.noisy(actions, noise, t)
    velocity = model.velocity(conditioning, x_t, t)
    return convention.per_sample_loss(velocity, actions, noise, mask)


def sample_flow_time(rng: np.random.Generator, size: int, flow: Any) -> np.ndarray:
    return FlowConvention.of(flow).sample_time(rng, size)


def noisy_actions(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, flow: Any) -> torch.Tensor:
    return FlowConvention.of(flow).noisy(actions, noise, t)


def per_sample_loss(
    velocity: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor, mask: torch.Tensor, flow: Any
) -> torch.Tensor:
    return FlowConvention.of(flow).per_sample_loss(velocity, actions, noise, mask)


@torch.no_grad()
def sample_actions(
    policy: Any,
    conditioning: Any,
    steps: int,
    generator: Optional[torch.Generator],
    flow: Any,
    initial_noise: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Euler integration of the learned velocity from the noise end of t to the action end, from
    `initial_noise` (B, H, action_dim) or from noise drawn with `generator`. The conditioning (the
    prefix's keys and values, for a VLM) is computed once by the caller and reused at every step."""
    convention = FlowConvention.of(flow)
    leaf = first_tensor(conditioning)
    batch, dtype = leaf.shape[0], leaf.dtype
    if initial_noise is not None:
        x = initial_noise.to(dtype)
    else:
        x = torch.randn(batch, policy.horizon, policy.action_dim, generator=generator, dtype=dtype)
    start = 1.0 if convention.noise_at == NoiseEnd.one else 0.0
    direction = -1.0 if convention.noise_at == NoiseEnd.one else 1.0
    sign = 1.0 if convention.velocity_is_dxdt else -1.0
    dt = 1.0 / steps
    for k in range(steps):
        t = torch.full((batch,), start + direction * k * dt, dtype=dtype)
        x = x + direction * dt * sign * policy.velocity(conditioning, x, t)
    return x


@torch.no_grad()
def sample_chunks(
    model: torch.nn.Module,
    batch: Dict[str, torch.Tensor],
    initial_noise: torch.Tensor,
    steps: int,
    flow: FlowConvention,
) -> torch.Tensor:
    """(B, H, action_dim) action chunks, each row integrated from its own initial noise: a loss-level
    policy integrates its own flow (predict_action_chunk); otherwise the prefix is encoded once and
    reused at every Euler step (sample_actions). What rollouts act on and the offline action error reads."""
    policy: Any = model  # a FlowMatchingPolicy of either level (vlaeval/policy/protocol.py)
    if uses_loss_level(policy):
        return policy.predict_action_chunk(batch, initial_noise)
    return sample_actions(policy, policy.encode(batch), steps, None, flow, initial_noise=initial_noise)


def first_tensor(nest: Any) -> torch.Tensor:
    """The first tensor of a conditioning nest (its batch size and dtype)."""
    found: list = []

    def keep(x: torch.Tensor) -> torch.Tensor:
        found.append(x)
        return x

    map_tensors(keep, nest)
    if not found:
        raise TypeError("a conditioning holds no tensor: encode(batch) must return tensors that lead with the batch")
    return found[0]


def sinusoidal_embedding(t: torch.Tensor, dim: int, max_period: float = 1000.0) -> torch.Tensor:
    """(B,) flow times -> (B, dim) sin/cos features at geometric frequencies."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, dtype=t.dtype) * (-math.log(max_period) / max(half - 1, 1)))
    angles = t[:, None] * frequencies[None, :] * 2 * math.pi
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
