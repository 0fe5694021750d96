"""A LeRobot policy as a vlaeval policy: one adapter, named by `_target_`, for any policy with
LeRobot's API (PreTrainedPolicy: SmolVLA, pi0, ACT, diffusion, your own).

    model:
      _target_: vlaeval.policy.lerobot_adapter.LeRobotPolicyAdapter
      policy:                               # built first by Hydra: any callable returning the policy
        _target_: lerobot.policies.smolvla.modeling_smolvla.SmolVLAPolicy.from_pretrained
        pretrained_name_or_path: /ckpt/smolvla_metaworld     # a local folder: nothing is downloaded
      observation_convention: metaworld     # observations as LeRobot's Meta-World env presents them

What it maps (vlaeval's side: vlaeval/policy/protocol.py; LeRobot's: its policies' batches):

    vlaeval batch                        LeRobot batch
    "observation" (B, obs_dim)           "observation.state": all of it, or under
                                         observation_convention=metaworld LeRobot's agent_pos (the
                                         first 4 entries: hand position and gripper)
    camera "observation.images.<cam>"    `cameras[<feature>]`, float32 in [0, 1], (B, 3, H, W); under
      uint8 (B, 3, H, W)                 observation_convention=metaworld the corner2 camera is
                                         "observation.image", mirrored left-right as LeRobot's
                                         MetaworldEnv flips it
    "instruction" (this adapter's        "task": the instruction text itself (LeRobot's processors
      tokens: the text's UTF-8 bytes)    tokenize it)
    "target_actions", "target_mask"      "action" (B, H, action_dim), "action_is_pad" (B, H)

and calls: `loss` -> `policy.forward(batch, noise=, time=, reduction="none")` (the per-sample losses);
`predict_action_chunk` -> `policy.predict_action_chunk(batch, noise=)`; `reset` -> `policy.reset()`
(the rollout engine calls it before each group of episodes). `preprocessor` / `postprocessor` are the
policy's own processors (LeRobot's `make_pre_post_processors`: normalisation, tokenisation, device),
applied around every call, as LeRobot's own evaluation does. Noise wider than the data's actions
(SmolVLA pads actions to `max_action_dim`) is padded with zeros in the dimensions the data lacks,
and the chunk comes back cut to the data's horizon and action dimension.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, cast

import numpy as np
import torch
from torch import nn

from vlaeval.choices import ObservationConvention
from vlaeval.errors import UserInputError, require

STATE_KEY, ACTION_KEY, PAD_KEY, TASK_KEY = "observation.state", "action", "action_is_pad", "task"
METAWORLD_CAMERA, METAWORLD_IMAGE_KEY = "observation.images.corner2", "observation.image"
METAWORLD_STATE = 4  # LeRobot's MetaworldEnv: agent_pos = the raw observation's first 4 entries
# A batch as LeRobot's policies and processors read it: feature key -> tensor, "task" -> the texts.
LeRobotBatch = Dict[str, Any]


class LeRobotPolicy(Protocol):
    """What the adapter calls of a LeRobot policy (PreTrainedPolicy's API)."""

    def forward(
        self,
        batch: LeRobotBatch,
        noise: Optional[torch.Tensor] = None,
        time: Optional[torch.Tensor] = None,
        reduction: str = "mean",
    ) -> Any: ...

    def predict_action_chunk(self, batch: LeRobotBatch, noise: Optional[torch.Tensor] = None) -> torch.Tensor: ...

    def reset(self) -> None: ...


class LeRobotPolicyAdapter(nn.Module):
    """Any policy with LeRobot's API as a loss-level vlaeval policy (see the module docstring)."""

    policy: LeRobotPolicy  # an nn.Module (registered as the submodule `policy`) with LeRobot's API

    def __init__(
        self,
        vocab: Sequence[str],
        obs_dim: int,
        action_dim: int,
        horizon: int,
        *,
        policy: nn.Module,
        preprocessor: Optional[Callable[[LeRobotBatch], LeRobotBatch]] = None,
        postprocessor: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        cameras: Optional[Dict[str, str]] = None,
        observation_convention: str = "vlaeval",
        action_head: Optional[List[str]] = None,
        instruction_bytes: int = 256,
    ) -> None:
        super().__init__()
        missing = [m for m in ("forward", "predict_action_chunk", "reset") if not callable(getattr(policy, m, None))]
        require(
            isinstance(policy, nn.Module) and not missing,
            f"model.policy built a {type(policy).__name__}, which is not a LeRobot policy (an nn.Module with "
            f"forward, predict_action_chunk and reset; it lacks {', '.join(missing) or 'the nn.Module base'}); "
            "name a PreTrainedPolicy subclass or its from_pretrained",
        )
        require(
            str(observation_convention) in ObservationConvention.values(),
            f"model.observation_convention={observation_convention} is not a convention; use "
            + " or ".join(ObservationConvention.values()),
        )
        self.convention = ObservationConvention(str(observation_convention))
        self.policy = cast(LeRobotPolicy, policy)  # still the nn.Module: registered as a submodule
        self.preprocessor, self.postprocessor = preprocessor, postprocessor
        self.horizon, self.action_dim, self.obs_dim = int(horizon), int(action_dim), int(obs_dim)
        default = {METAWORLD_CAMERA: METAWORLD_IMAGE_KEY} if self.convention == ObservationConvention.metaworld else {}
        self.camera_keys: Dict[str, str] = {str(k): str(v) for k, v in (cameras or default).items()}
        self.cameras = list(self.camera_keys)  # the vlaeval camera features the adapter is given
        self.action_head = [str(p) for p in (action_head or [])]
        self.instruction_bytes = int(instruction_bytes)
        config = getattr(policy, "config", None)
        chunk = getattr(config, "chunk_size", None)
        require(
            chunk is None or int(chunk) >= self.horizon,
            f"model.policy's chunk_size={chunk} is shorter than the data's horizon={self.horizon}; "
            f"set data.horizon<={chunk}",
        )
        self.noise_width = max(int(getattr(config, "max_action_dim", 0) or 0), self.action_dim)
        self.noise_length = max(int(getattr(config, "chunk_size", 0) or 0), self.horizon)
        if self.convention == ObservationConvention.metaworld:
            require(
                self.obs_dim >= METAWORLD_STATE,
                f"model.observation_convention=metaworld reads the first {METAWORLD_STATE} observation entries "
                f"(LeRobot's agent_pos); the data's observations have {self.obs_dim}",
            )

    # ------------------------------------------------------------------ instructions
    def tokenize(self, instructions: Sequence[str]) -> torch.Tensor:
        """Each instruction's UTF-8 bytes (n, instruction_bytes), zero-padded: the text travels
        through vlaeval's batches unchanged and LeRobot's processors tokenize it."""
        out = torch.zeros(len(instructions), self.instruction_bytes, dtype=torch.int64)
        for row, text in enumerate(instructions):
            data = str(text).encode("utf-8")
            if len(data) > self.instruction_bytes:
                raise UserInputError(
                    f"instruction {str(text)[:40]!r}... is {len(data)} bytes, longer than "
                    f"model.instruction_bytes={self.instruction_bytes}; raise it"
                )
            out[row, : len(data)] = torch.tensor(list(data), dtype=torch.int64)
        return out

    @staticmethod
    def texts(tokens: torch.Tensor) -> List[str]:
        rows = tokens.detach().cpu().numpy().astype(np.uint8)
        return [bytes(row[row != 0]).decode("utf-8") for row in rows]

    # ------------------------------------------------------------------ vlaeval batch -> LeRobot batch
    def observations(self, batch: Mapping[str, torch.Tensor]) -> LeRobotBatch:
        """The observation part of LeRobot's batch (what a rollout step and a training row share)."""
        state = batch["observation"].float()
        if self.convention == ObservationConvention.metaworld:
            state = state[:, :METAWORLD_STATE]
        out: LeRobotBatch = {STATE_KEY: state, TASK_KEY: self.texts(batch["instruction"])}
        for feature, key in self.camera_keys.items():
            if feature not in batch:
                raise KeyError(f"the batch lacks camera {feature} that model.cameras names; present: {sorted(batch)}")
            image = batch[feature].float() / 255.0
            if self.convention == ObservationConvention.metaworld and feature == METAWORLD_CAMERA:
                image = image.flip(-1)  # LeRobot's MetaworldEnv turns corner2 by 180 degrees; vlaeval flips rows only
            out[key] = image
        return out

    def _preprocess(self, batch: LeRobotBatch) -> LeRobotBatch:
        return self.preprocessor(batch) if self.preprocessor is not None else batch

    def _noise(self, noise: torch.Tensor) -> torch.Tensor:
        """vlaeval's noise (B, H, action_dim), zero-padded to the policy's chunk and action width."""
        b, h, a = noise.shape
        if (h, a) == (self.noise_length, self.noise_width):
            return noise
        out = noise.new_zeros(b, self.noise_length, self.noise_width)
        out[:, :h, :a] = noise
        return out

    # ------------------------------------------------------------------ the loss level
    def loss(self, batch: Dict[str, torch.Tensor], noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        lerobot = self.observations(batch)
        actions, mask = batch["target_actions"], batch["target_mask"].bool()
        pad_h = self.noise_length - actions.shape[1]
        lerobot[ACTION_KEY] = nn.functional.pad(actions.float(), (0, 0, 0, pad_h))
        lerobot[PAD_KEY] = nn.functional.pad(~mask, (0, pad_h), value=True)
        out = self.policy.forward(self._preprocess(lerobot), noise=self._noise(noise), time=t, reduction="none")
        losses = out[0] if isinstance(out, tuple) else out
        if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (noise.shape[0],):
            raise UserInputError(
                f"{type(self.policy).__name__}.forward(batch, reduction='none') returned "
                f"{tuple(getattr(losses, 'shape', ()))}, not per-sample losses ({noise.shape[0]},): vlaeval "
                "weighs and audits each sample; use a LeRobot version whose forward takes reduction='none'"
            )
        return losses

    def predict_action_chunk(self, batch: Dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        chunk = self.policy.predict_action_chunk(self._preprocess(self.observations(batch)), noise=self._noise(noise))
        if self.postprocessor is not None:
            chunk = self.postprocessor(chunk)
        return chunk[:, : self.horizon, : self.action_dim].to(noise.dtype)

    def reset(self) -> None:
        """LeRobot's: called whenever the environment is reset (its action queues are cleared)."""
        self.policy.reset()

    def trainable_parameters(self, which: str) -> List[nn.Parameter]:
        """ "action_head": the parameters `model.action_head`'s patterns name (e.g. SmolVLA's expert,
        [policy.model.vlm_with_expert.lm_expert.*, policy.model.action_*]); every trainable one
        without patterns. "all": every parameter that trains."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        if which == "action_head" and self.action_head:
            return [p for n, p in named if any(fnmatch.fnmatchcase(n, g) for g in self.action_head)]
        return [p for _, p in named]
