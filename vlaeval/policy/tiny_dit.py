"""model=tiny_dit: a small transformer action expert, built like the ones in pi0, GR00T and starVLA.

The observation and the instruction become two conditioning tokens (the stand-in for a VLM's
prefix). The action expert embeds each of the H actions of the noisy chunk as a token, adds a
learned position per token, and runs `depth` blocks of

    adaptive LayerNorm (shift, scale, gate from the flow-time embedding)
    -> self-attention over the action tokens
    -> cross-attention from the action tokens to the conditioning tokens
    -> MLP

then a final LayerNorm and a linear read-out of each token's velocity. Attention projections are
plain nn.Linear applied over the token axis (exact per-sample norms by their Gram form); the
learned positions and the final LayerNorm's affine parameters have no closed form and take the
exact torch.func path (vlaeval.residual.gradients).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Sequence

import torch
from torch import nn

from vlaeval.policy.flow import sinusoidal_embedding
from vlaeval.policy.tiny_vla import BuiltinPolicy


class TokenPositions(nn.Module):
    """A learned embedding added to each of `tokens` positions: (B, tokens, width) -> same shape."""

    def __init__(self, tokens: int, width: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(tokens, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table


class Attention(nn.Module):
    """Multi-head attention with separate query, key, value and output projections."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        m = context.shape[1]

        def split(y: torch.Tensor, length: int) -> torch.Tensor:
            return y.reshape(b, length, self.heads, w // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x), n), split(self.key(context), m), split(self.value(context), m)
        weights = torch.softmax(q @ k.transpose(-1, -2) / (w // self.heads) ** 0.5, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, n, w))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.modulation = nn.Linear(width, 6 * width)  # shift, scale, gate for self-attention and MLP
        self.self_attention = Attention(width, heads)
        self.cross_attention = Attention(width, heads)
        self.mlp_in, self.mlp_out = nn.Linear(width, mlp_ratio * width), nn.Linear(mlp_ratio * width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(time)[:, None].chunk(6, dim=-1)
        h = self.norm(x) * (1 + scale1) + shift1
        x = x + gate1 * self.self_attention(h, h)
        x = x + self.cross_attention(self.norm(x), context)
        h = self.norm(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp_out(nn.functional.silu(self.mlp_in(h)))


class TinyDiT(BuiltinPolicy):
    def __init__(
        self,
        vocab: Sequence[str],
        obs_dim: int,
        action_dim: int,
        horizon: int,
        *,
        width: int = 64,
        depth: int = 2,
        heads: int = 4,
        mlp_ratio: int = 2,
        time_embedding_dim: int = 32,
    ) -> None:
        if width % heads:
            raise ValueError(f"model.width={width} must be a multiple of model.heads={heads}")
        super().__init__(vocab, obs_dim, action_dim, horizon, time_embedding_dim)
        # The prefix: one token for the observation, one for the instruction.
        self.observation_token = nn.Linear(obs_dim, width)
        self.instruction_token = nn.Linear(len(self.vocab), width)
        # The action expert.
        self.action_in = nn.Linear(action_dim, width)
        self.positions = TokenPositions(self.horizon, width)
        self.time_in, self.time_out = nn.Linear(time_embedding_dim, width), nn.Linear(width, width)
        self.blocks = nn.ModuleList([Block(width, heads, mlp_ratio) for _ in range(depth)])
        self.final_norm = nn.LayerNorm(width)
        self.action_out = nn.Linear(width, action_dim)

    def encode(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, 2, width) conditioning tokens."""
        obs = self.normalise(batch["observation"])
        return torch.stack([self.observation_token(obs), self.instruction_token(batch["instruction"])], dim=1)

    def velocity(self, conditioning: torch.Tensor, noisy_actions: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        time = self.time_out(nn.functional.silu(self.time_in(sinusoidal_embedding(t, self.time_embedding_dim))))
        x = self.positions(self.action_in(noisy_actions))
        for block in self.blocks:
            x = block(x, conditioning, time)
        return self.action_out(self.final_norm(x))

    def expert_modules(self) -> List[nn.Module]:
        return [
            self.action_in,
            self.positions,
            self.time_in,
            self.time_out,
            self.blocks,
            self.final_norm,
            self.action_out,
        ]

    def trainable_parameters(self, which: str) -> Iterable[nn.Parameter]:
        expert = [p for module in self.expert_modules() for p in module.parameters()]
        if which == "action_head":
            return expert
        if which == "all":
            return list(self.observation_token.parameters()) + list(self.instruction_token.parameters()) + expert
        raise ValueError(f"unknown trainable subset {which!r}; use 'action_head' or 'all'")
