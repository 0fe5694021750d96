"""A policy bound to everything it takes to call it: the module, its own input processing (how a task's
instruction becomes the tokens it reads), its flow convention and the device it runs on.

Training, scoring, the gradient artifact, the ablation and rollouts take one `BoundPolicy` where they
used to take the group (model, instruction table, flow, device); so the policy, not the caller, owns
its tokenizer: a module with a `tokenize(instructions) -> Tensor` method is given the tokens it makes
(the built-in ones make their bag-of-words; a user's VLA its own), and a module without one is given
the bag-of-words over the vocabulary it was built with (vlaeval/policy/protocol.py).

A module with `cameras` (the camera features it reads, e.g. ["observation.images.corner"]) is given
those images, uint8 (B, 3, height, width) as the data stores them, in its anchor batches, and the
rollout engine renders them at `image_size` (the data's frame size) at every policy call. A module
with `history` = k > 1 is given each camera's last k frames stacked on the channels, oldest first:
uint8 (B, 3k, height, width).

A BoundPolicy pickles (the flow is a plain value), so a rollout worker process receives it whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from vlaeval.config import FlowConfig
from vlaeval.data.anchors import AnchorSet
from vlaeval.errors import UserInputError
from vlaeval.policy.flow import FlowConvention, flow_matching_losses, training_losses
from vlaeval.policy.tiny_vla import bag_of_words, vocabulary

Batch = Dict[str, torch.Tensor]


def instruction_tokens(model: Any, instructions: Sequence[str], vocab: Optional[Sequence[str]] = None) -> torch.Tensor:
    """(tasks, ...) tokens of each task's instruction, by the model's own `tokenize` when it has one,
    else the bag-of-words over `vocab` (default: the instructions' own vocabulary)."""
    texts = [str(text) for text in instructions]
    tokenize = getattr(model, "tokenize", None)
    if callable(tokenize):
        tokens = tokenize(texts)
        if not isinstance(tokens, torch.Tensor) or tokens.shape[0] != len(texts):
            raise UserInputError(
                f"{type(model).__name__}.tokenize returned {type(tokens).__name__} "
                f"{tuple(getattr(tokens, 'shape', ()))} for {len(texts)} instructions; return a tensor with one "
                "row per instruction (vlaeval/policy/protocol.py)"
            )
        return tokens.detach()
    return bag_of_words(texts, list(vocab) if vocab is not None else vocabulary(texts))


@dataclass(frozen=True)
class BoundPolicy:
    """`model` ready to call on this data's tasks: `tokens[k]` is task k's instruction as the model
    reads it; `flow` and `sampling_steps` are the policy's convention (the `flow` section); `vocab`
    is the vocabulary the model was built with, which tokenizes for a module without `tokenize`."""

    model: torch.nn.Module
    tokens: torch.Tensor
    flow: FlowConvention
    sampling_steps: int
    device: str = "cpu"
    vocab: Optional[Tuple[str, ...]] = None
    cameras: Tuple[str, ...] = ()  # the camera features the model reads (its `cameras`)
    image_size: int = 64  # the frame size rollouts render those cameras at: the data's
    frames: int = 1  # camera frames per observation (the model's `history`): the latest last, on the channels

    # ------------------------------------------------------------------ inputs
    def anchor_batch(self, anchors: AnchorSet, index: np.ndarray) -> Batch:
        """The tensors of anchors[index] on the policy's device: observation, instruction tokens,
        task index, target chunk and mask, and the camera features the data names (decoded here, for
        these anchors only)."""
        index = np.asarray(index)
        task_index = torch.from_numpy(anchors.task_index[index])
        device = self.device
        return {
            "observation": torch.from_numpy(anchors.observations[index]).to(device),
            "instruction": self.tokens[task_index].to(device),
            "task_index": task_index.to(device),
            "target_actions": torch.from_numpy(anchors.target_actions[index]).to(device),
            "target_mask": torch.from_numpy(anchors.target_mask[index]).to(device),
            **{
                name: torch.from_numpy(images).to(device) for name, images in self.anchor_images(anchors, index).items()
            },
        }

    def anchor_images(self, anchors: AnchorSet, index: np.ndarray) -> Dict[str, np.ndarray]:
        return anchor_frames(anchors, index, self.frames)

    def episode_tokens(self, task_index: Sequence[int], instructions: Sequence[Optional[str]]) -> torch.Tensor:
        """(B, ...) what each episode's policy is told: its task's tokens, or -- where an episode
        has an instruction of its own (a paraphrase, another task's) -- that text as the model
        tokenizes it."""
        rows = self.tokens[torch.as_tensor(list(task_index), dtype=torch.int64)].clone()
        told = [k for k, text in enumerate(instructions) if text is not None]
        if told:
            rows[told] = instruction_tokens(self.model, [str(instructions[k]) for k in told], self.vocab).to(rows.dtype)
        return rows

    def observation_batch(
        self, observations: torch.Tensor, tokens: torch.Tensor, images: Optional[Batch] = None
    ) -> Batch:
        """What the policy reads when acting: the observations, the instruction tokens it is given
        (rows of episode_tokens) and the cameras' images (uint8 (B, 3, height, width) by camera feature)."""
        return {"observation": observations, "instruction": tokens, **(images or {})}

    # ------------------------------------------------------------------ the loss
    def losses(self, batch: Batch, t: torch.Tensor, noise: torch.Tensor, draws: int = 1) -> torch.Tensor:
        """Per-sample flow-matching loss under the policy's convention: shape (B * draws,), `draws`
        consecutive (t, noise) draws per anchor of the batch, each anchor encoded once."""
        return flow_matching_losses(self.model, batch, t, noise, self.flow, draws)

    def training_losses(
        self, batch: Batch, t: torch.Tensor, noise: torch.Tensor, draws: int = 1
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """`losses` and the model's per-anchor auxiliary loss (None without one), from one encoder
        pass: what a training step minimises (vlaeval/policy/flow.py: training_losses)."""
        return training_losses(self.model, batch, t, noise, self.flow, draws)

    # ------------------------------------------------------------------ copies
    def with_model(self, model: torch.nn.Module) -> "BoundPolicy":
        """Another module (a fine-tuned copy) under the same inputs, flow and device."""
        return dataclasses.replace(self, model=model)

    def for_instructions(self, instructions: Sequence[str]) -> "BoundPolicy":
        """This policy on other tasks (held-out data, a scenario plan's tasks): task k is instructions[k]."""
        return dataclasses.replace(self, tokens=instruction_tokens(self.model, instructions, self.vocab))


def anchor_frames(anchors: AnchorSet, index: np.ndarray, frames: int) -> Dict[str, np.ndarray]:
    """Each camera's frames of anchors[index]: uint8 (B, 3 * frames, H, W), the `frames` steps up to
    the anchor's, oldest first (an episode's first frame repeated before it starts, as a rollout
    begins)."""
    if frames == 1:
        return anchors.demonstrations.decode_cameras(anchors.base_index[index])
    within = anchors.anchor_index[index]
    steps = [anchors.base_index[index] - np.minimum(back, within) for back in range(frames - 1, -1, -1)]
    decoded = [anchors.demonstrations.decode_cameras(s) for s in steps]
    return {name: np.concatenate([d[name] for d in decoded], axis=1) for name in decoded[0]}


def bind_policy(
    model: torch.nn.Module,
    instructions: Sequence[str],
    flow: Any,
    *,
    device: str = "cpu",
    vocab: Optional[Sequence[str]] = None,
    image_size: Optional[int] = None,
) -> BoundPolicy:
    """`model` bound to tasks whose instructions are `instructions` (task k = instructions[k]), the
    `flow` section's convention, and `device` (the module is moved there); its cameras are rendered
    at `image_size` in rollouts (default: the model's own `image_size`, else 64)."""
    size = image_size if image_size is not None else getattr(model, "image_size", 64)
    return BoundPolicy(
        model.to(device),
        instruction_tokens(model, instructions, vocab),
        FlowConvention.of(flow),
        int(getattr(flow, "sampling_steps", FlowConfig.sampling_steps)),
        str(device),
        None if vocab is None else tuple(str(word) for word in vocab),
        tuple(str(c) for c in (getattr(model, "cameras", None) or ())),
        int(size),
        int(getattr(model, "history", 1) or 1),
    )
