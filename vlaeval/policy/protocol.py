"""What the residual and gradient code needs from a policy -- anything implementing it can be scored.

    encode(batch) -> conditioning                 computed once per anchor (the VLM's work)
    velocity(conditioning, noisy_actions, t)      the flow-matching action head
    horizon, action_dim                           the shape of the action chunk
    trainable_parameters(which)                   "action_head" or "all"

A batch is a dict of tensors: "observation" (B, obs_dim), "instruction" (B, vocab) and, for
training and scoring, "target_actions" (B, H, action_dim) with "target_mask" (B, H).
"""

from __future__ import annotations

from typing import Dict, Iterable, Protocol, runtime_checkable

import torch


@runtime_checkable
class FlowMatchingPolicy(Protocol):
    horizon: int
    action_dim: int

    def encode(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor: ...

    def velocity(self, conditioning: torch.Tensor, noisy_actions: torch.Tensor, t: torch.Tensor) -> torch.Tensor: ...

    def trainable_parameters(self, which: str) -> Iterable[torch.nn.Parameter]: ...
