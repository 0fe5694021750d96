"""Everything vlaeval calls on a policy: anything that implements it can be trained, scored,
audited (gradients included) and rolled out. docs/extending.md "Your own policy" has a complete adapter.

    a torch.nn.Module                             parameters, state_dict, train/eval, to(device)
    horizon, action_dim                           the shape (H, action_dim) of the action chunk
    encode(batch) -> conditioning                 once per anchor (the VLM's work); any shape that
                                                  leads with the batch
    velocity(conditioning, noisy_actions, t)      the flow-matching action expert: (B, H, action_dim)
    trainable_parameters(which)                   "action_head" or "all": what the gradient artifact
                                                  measures and what fine-tuning may update
    set_observation_statistics(mean, std)         optional: called once with the data's statistics
    tokenize(instructions) -> (tasks, ...)        optional: your own tokenizer, called once per task
                                                  list; without it the policy reads the bag-of-words
                                                  over the `vocab` it was built with
    encode_for_training(batch)                    optional: (conditioning, a per-anchor auxiliary
        -> (conditioning, auxiliary (B,))         loss or None) from one encoder pass; training
                                                  adds the auxiliary loss's mean to its objective
                                                  (scoring and gradients see the flow loss alone)

A batch is a dict of tensors: "observation" (B, obs_dim), "instruction" (B, ...) the policy's own
tokens of each row's task instruction, "task_index" (B,), and for training and scoring
"target_actions" (B, H, action_dim) with "target_mask" (B, H). The flow convention (which end of t
is noise, the velocity target, the time distribution) is configuration: the `flow` section
(vlaeval/policy/flow.py). Callers never build a batch themselves: they hold a BoundPolicy
(vlaeval/policy/bound.py), the module with its tokens, flow and device.

Callers: policy/bound.py (tokenize), policy/training.py and residual/estimators.py (encode,
velocity, train/eval; training also encode_for_training), residual/gradients.py (trainable_parameters, named_modules,
named_parameters), rollouts/engine.py (encode, velocity, horizon, action_dim), policy/builtin.py
(state_dict, load_state_dict).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Protocol, runtime_checkable

import torch

from vlaeval.errors import UserInputError

REQUIRED_MEMBERS = ("horizon", "action_dim", "encode", "velocity", "trainable_parameters")


@runtime_checkable
class FlowMatchingPolicy(Protocol):
    horizon: int
    action_dim: int

    def encode(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor: ...

    def velocity(self, conditioning: torch.Tensor, noisy_actions: torch.Tensor, t: torch.Tensor) -> torch.Tensor: ...

    def trainable_parameters(self, which: str) -> Iterable[torch.nn.Parameter]: ...


def missing_members(policy: Any) -> List[str]:
    """What a policy lacks of the protocol (empty when it implements all of it)."""
    missing = [] if isinstance(policy, torch.nn.Module) else ["torch.nn.Module base class"]
    for name in REQUIRED_MEMBERS:
        value = getattr(policy, name, None)
        if value is None or (name in ("encode", "velocity", "trainable_parameters") and not callable(value)):
            missing.append(name)
    return missing


def check_policy(policy: Any, target: str) -> None:
    """Refuse, in one line, a policy that lacks a member of the protocol."""
    missing = missing_members(policy)
    if missing:
        raise UserInputError(
            f"model._target_={target} lacks {', '.join(missing)} of the FlowMatchingPolicy protocol "
            "(vlaeval/policy/protocol.py); add them, see README 'Your own policy'"
        )
