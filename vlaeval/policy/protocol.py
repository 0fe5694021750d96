"""Everything vlaeval calls on a policy: anything that implements it can be trained, scored,
audited (gradients included) and rolled out. docs/extending.md "Your own policy" has complete adapters.

    a torch.nn.Module                             parameters, state_dict, train/eval, to(device)
    horizon, action_dim                           the shape (H, action_dim) of the action chunk
    trainable_parameters(which)                   "action_head" or "all": what the gradient artifact
                                                  measures and what fine-tuning may update

and one of two levels (a policy with both is driven by the first, the faster):

  the conditioning level (the fast path: an anchor is encoded once for all its flow draws)
    encode(batch) -> conditioning                 once per anchor (the VLM's work): a tensor, or any
                                                  nest (dict, list, tuple) of tensors that lead with
                                                  the batch -- a VLM's per-layer keys and values with
                                                  their pad mask, for instance
    velocity(conditioning, noisy_actions, t)      the flow-matching action expert: (B, H, action_dim)

  the loss level (a VLA as LeRobot packages it: SmolVLA's and pi0's own forward)
    loss(batch, noise, t) -> (B,)                 the per-sample flow-matching loss of each row, at
                                                  the flow time t (B,) and noise (B, H, action_dim)
                                                  vlaeval draws (flow.time_distribution); the policy
                                                  applies its own interpolation and target
    predict_action_chunk(batch, noise)            the action chunk (B, H, action_dim) integrated
        -> (B, H, action_dim)                     from this initial noise (each episode's own draw)

Optional members:
    reset()                                       called before each group of rollout episodes (a
                                                  LeRobot policy clears its action queues)
    set_observation_statistics(mean, std)         called once with the data's statistics
    tokenize(instructions) -> (tasks, ...)        your own tokenizer, called once per task list;
                                                  without it the policy reads the bag-of-words over
                                                  the `vocab` it was built with
    encode_for_training(batch)                    (conditioning, a per-anchor auxiliary loss or
        -> (conditioning, auxiliary (B,))         None) from one encoder pass; training adds the
                                                  auxiliary loss's mean to its objective (scoring and
                                                  gradients see the flow loss alone)

A batch is a dict of tensors: "observation" (B, obs_dim), "instruction" (B, ...) the policy's own
tokens of each row's task instruction, "task_index" (B,), camera images where the policy reads
them, and for training and scoring "target_actions" (B, H, action_dim) with "target_mask" (B, H).
The flow convention (which end of t is noise, the velocity target, the time distribution) is
configuration: the `flow` section (vlaeval/policy/flow.py); a loss-level policy applies its own.
Callers never build a batch themselves: they hold a BoundPolicy (vlaeval/policy/bound.py), the
module with its tokens, flow and device.

Callers: policy/bound.py (tokenize), policy/flow.py (the losses and sampling at either level: what
training, residual/estimators.py and residual/gradients.py call), residual/gradients.py
(trainable_parameters, named_modules, named_parameters), rollouts/engine.py (encode and velocity,
or predict_action_chunk; horizon, action_dim), policy/builtin.py (state_dict, load_state_dict).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Protocol, Sequence, Union, runtime_checkable

import torch

from vlaeval.errors import UserInputError

CONDITIONING_LEVEL = ("encode", "velocity")
# What `encode` returns: a tensor, or a nest (dict, list, tuple, named tuple) of tensors leading with the batch.
Conditioning = Union[torch.Tensor, Mapping[str, Any], Sequence[Any]]
LOSS_LEVEL = ("loss", "predict_action_chunk")


@runtime_checkable
class FlowMatchingPolicy(Protocol):
    horizon: int
    action_dim: int

    def encode(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor: ...

    def velocity(self, conditioning: torch.Tensor, noisy_actions: torch.Tensor, t: torch.Tensor) -> torch.Tensor: ...

    def trainable_parameters(self, which: str) -> Iterable[torch.nn.Parameter]: ...


@runtime_checkable
class LossLevelPolicy(Protocol):
    """The loss level: a VLA whose conditioning never leaves it (LeRobot's forward / predict_action_chunk)."""

    horizon: int
    action_dim: int

    def loss(self, batch: Dict[str, torch.Tensor], noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor: ...

    def predict_action_chunk(self, batch: Dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor: ...

    def trainable_parameters(self, which: str) -> Iterable[torch.nn.Parameter]: ...


def _has(policy: Any, names: Sequence[str]) -> List[str]:
    """Which of the methods `names` the policy lacks."""
    return [name for name in names if not callable(getattr(policy, name, None))]


def uses_loss_level(policy: Any) -> bool:
    """Whether vlaeval drives the policy through loss / predict_action_chunk (it lacks the
    conditioning level's encode / velocity and has the loss level)."""
    return bool(_has(policy, CONDITIONING_LEVEL)) and not _has(policy, LOSS_LEVEL)


def missing_members(policy: Any) -> List[str]:
    """What a policy lacks of the protocol (empty when it implements all of it); of the two levels,
    the one it is closer to (the conditioning level when it has neither)."""
    missing = [] if isinstance(policy, torch.nn.Module) else ["torch.nn.Module base class"]
    missing += [name for name in ("horizon", "action_dim") if getattr(policy, name, None) is None]
    conditioning, loss = _has(policy, CONDITIONING_LEVEL), _has(policy, LOSS_LEVEL)
    if conditioning and loss:
        missing += loss if len(loss) < len(conditioning) else conditioning
    return missing + _has(policy, ("trainable_parameters",))


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], conditioning: Any) -> Any:
    """`fn` applied to every tensor of a conditioning (a tensor, or a dict/list/tuple nest of them),
    the nest kept: how vlaeval repeats, indexes and moves a conditioning it does not know."""
    if isinstance(conditioning, torch.Tensor):
        return fn(conditioning)
    if isinstance(conditioning, dict):
        return type(conditioning)((k, map_tensors(fn, v)) for k, v in conditioning.items())
    if isinstance(conditioning, (list, tuple)):
        mapped = [map_tensors(fn, v) for v in conditioning]
        return type(conditioning)(*mapped) if hasattr(conditioning, "_fields") else type(conditioning)(mapped)
    return conditioning  # a constant (a flag, a size): shared by every row


def check_policy(policy: Any, target: str) -> None:
    """Refuse, in one line, a policy that lacks a member of the protocol."""
    missing = missing_members(policy)
    if missing:
        raise UserInputError(
            f"model._target_={target} lacks {', '.join(missing)} of the FlowMatchingPolicy protocol "
            "(vlaeval/policy/protocol.py): encode and velocity, or loss and predict_action_chunk; see "
            "docs/extending.md 'Your own policy'"
        )
