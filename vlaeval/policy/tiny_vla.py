"""The built-in tiny VLA: an instruction + observation encoder (the stand-in for the VLM) and a
flow-matching MLP action head over an H x action_dim chunk, conditioned on the encoding.

Every trainable layer is nn.Linear (the instruction enters as a bag-of-words vector), so exact
per-sample gradient norms come from one batched backward pass (vlaeval.residual.gradients).
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Sequence

import torch
from torch import nn

from vlaeval.errors import require
from vlaeval.policy.flow import sinusoidal_embedding


def vocabulary(instructions: Sequence[str]) -> List[str]:
    return sorted({w for text in instructions for w in re.findall(r"[a-z]+", text.lower())})


def bag_of_words(instructions: Sequence[str], vocab: Sequence[str]) -> torch.Tensor:
    """(len(instructions), len(vocab)) normalised word counts: the instruction tokens."""
    position = {w: i for i, w in enumerate(vocab)}
    out = torch.zeros(len(instructions), len(vocab))
    for row, text in enumerate(instructions):
        words = [position[w] for w in re.findall(r"[a-z]+", text.lower()) if w in position]
        for w in words:
            out[row, w] += 1.0 / max(len(words), 1)
    return out


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class ObservationStatistics(nn.Module):
    """Buffers for the data's observation mean and std, set once from the data (the job calls
    set_observation_statistics) and saved with the weights; `normalise` applies them in encode."""

    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(self, obs_dim: int) -> None:
        super().__init__()
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))

    def set_observation_statistics(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.obs_mean.copy_(mean)
        self.obs_std.copy_(std.clamp_min(1e-3))

    def normalise(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation - self.obs_mean) / self.obs_std


class BuiltinPolicy(ObservationStatistics):
    """What the built-in policies share: the data's shapes, the vocabulary they read and their
    tokenizer (the bag-of-words over it), beside the observation statistics."""

    def __init__(
        self, vocab: Sequence[str], obs_dim: int, action_dim: int, horizon: int, time_embedding_dim: int
    ) -> None:
        super().__init__(obs_dim)
        self.vocab = list(vocab)
        self.obs_dim, self.action_dim, self.horizon = int(obs_dim), int(action_dim), int(horizon)
        self.time_embedding_dim = int(time_embedding_dim)

    def tokenize(self, instructions: Sequence[str]) -> torch.Tensor:
        """The instructions as this model reads them: bag-of-words over its vocabulary."""
        return bag_of_words(instructions, self.vocab)


class MLPFlowPolicy(BuiltinPolicy):
    """The tiny VLA's flow-matching action head, shared by the built-in MLP policies: an MLP over the
    flattened noisy chunk, the conditioning and the flow time's sinusoidal embedding. A subclass
    builds its encoders, then the head (`build_action_head`), and names its encoders."""

    action_head: nn.Sequential

    def build_action_head(self, conditioning_dim: int, head_hidden: int, head_layers: int) -> None:
        chunk = self.horizon * self.action_dim
        self.action_head = mlp(
            [chunk + conditioning_dim + self.time_embedding_dim] + [head_hidden] * head_layers + [chunk]
        )

    def encoder_modules(self) -> List[nn.Module]:
        """The modules before the head ("all" trains them too)."""
        raise NotImplementedError

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        return sinusoidal_embedding(t, self.time_embedding_dim)

    def velocity(self, conditioning: torch.Tensor, noisy_actions: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        flat = noisy_actions.reshape(noisy_actions.shape[0], -1)
        out = self.action_head(torch.cat([flat, conditioning, self.time_embedding(t)], dim=-1))
        return out.reshape(-1, self.horizon, self.action_dim)

    def trainable_parameters(self, which: str) -> Iterable[nn.Parameter]:
        if which == "action_head":
            return list(self.action_head.parameters())
        if which == "all":
            return [p for module in [*self.encoder_modules(), self.action_head] for p in module.parameters()]
        raise ValueError(f"unknown trainable subset {which!r}; use 'action_head' or 'all'")


class TinyVLA(MLPFlowPolicy):
    state_kept: torch.Tensor  # 1 for each state dim the policy reads, 0 for model.hidden_state's

    def __init__(
        self,
        vocab: Sequence[str],
        obs_dim: int,
        action_dim: int,
        horizon: int,
        *,
        encoder_hidden: int = 256,
        conditioning_dim: int = 128,
        head_hidden: int = 256,
        head_layers: int = 3,
        time_embedding_dim: int = 32,
        hidden_state: Sequence[int] = (),
    ) -> None:
        super().__init__(vocab, obs_dim, action_dim, horizon, time_embedding_dim)
        # State dims the policy never reads (held at their training mean): [36, 37, 38] hides
        # Meta-World's goal position -- a goal-blind state policy, the control for "sees the goal".
        hidden = sorted({int(d) for d in hidden_state})
        require(
            all(0 <= d < obs_dim for d in hidden),
            f"model.hidden_state={list(hidden_state)} names dims outside the state's 0..{obs_dim - 1}",
        )
        keep = torch.ones(obs_dim)
        keep[hidden] = 0.0
        self.register_buffer("state_kept", keep, persistent=False)  # from the config, not the weights
        self.encoder = mlp([obs_dim + len(self.vocab), encoder_hidden, encoder_hidden, conditioning_dim])
        self.build_action_head(conditioning_dim, head_hidden, head_layers)

    def encode(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        obs = self.normalise(batch["observation"]) * self.state_kept
        return self.encoder(torch.cat([obs, batch["instruction"]], dim=-1))

    def encoder_modules(self) -> List[nn.Module]:
        return [self.encoder]
