# mypy: ignore-errors
# (LeRobot's own annotations, transcribed: its forward is annotated `-> dict` and returns a tuple)
"""A policy with LeRobot 0.4.4's policy API, signature for signature (PreTrainedPolicy and
SmolVLAPolicy), for testing vlaeval's LeRobot adapter: lerobot's own classes do not import beside
torch 2.13 here (they need torchvision, whose wheel for torch 2.13 on the index is a CUDA build
that cannot register its operators against the CPU torch).

What it copies from LeRobot is the interface, not the code: the batch keys (observation.image,
observation.state, observation.language.tokens / attention_mask from its preprocessor, action,
action_is_pad), padding of the state and actions to max_state_dim / max_action_dim, the flow
convention (x_t = t * noise + (1 - t) * actions, target noise - actions), forward(batch, noise,
time, reduction) -> (loss, dict), predict_action_chunk(batch, noise), select_action with its action
queue, reset, from_pretrained / save_pretrained on a local folder (config.json, model.safetensors).
The network is a small one of this file's own: image patches, state and words attended by the
noisy chunk."""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

T = TypeVar("T", bound="SignaturePolicy")
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
OBS_IMAGE, OBS_STATE, ACTION = "observation.image", "observation.state", "action"
TOKENS, ATTENTION = "observation.language.tokens", "observation.language.attention_mask"


@dataclass
class SmolVLAConfig:
    """The fields of LeRobot's SmolVLAConfig this policy reads (sizes shrunk)."""

    chunk_size: int = 8
    n_action_steps: int = 8
    max_state_dim: int = 8
    max_action_dim: int = 6
    num_steps: int = 10  # denoising steps
    width: int = 32
    image_size: int = 32
    patch: int = 8
    tokenizer_max_length: int = 16


PreTrainedConfig = SmolVLAConfig
ActionSelectKwargs = Dict[str, Any]
Unpack = Any


class SignaturePolicy(nn.Module):
    """A flow-matching VLA behind LeRobot's API (see the module docstring)."""

    config_class = SmolVLAConfig
    name = "smolvla_signature"

    def __init__(self, config: SmolVLAConfig, **kwargs) -> None:
        super().__init__()
        self.config = config
        self.model = FlowModel(config)  # SmolVLA's layout: model.vlm_with_expert.{vlm, lm_expert}, model.action_*
        self.reset()

    def reset(self) -> None:
        """This should be called whenever the environment is reset."""
        self._queues = {ACTION: deque(maxlen=self.config.n_action_steps)}
        self.resets = getattr(self, "resets", -1) + 1

    def get_optim_params(self) -> dict:
        return self.parameters()

    # ------------------------------------------------------------------ the network
    def _prefix(self, batch: Dict[str, Tensor]):
        c, m = self.config, self.model
        image = F.interpolate(batch[OBS_IMAGE] * 2 - 1, size=(c.image_size, c.image_size), mode="bilinear")
        seen = m.vlm_with_expert["vlm"]["patches"](image).flatten(2).transpose(1, 2)
        state = F.pad(batch[OBS_STATE], (0, c.max_state_dim - batch[OBS_STATE].shape[-1]))
        words = m.vlm_with_expert["vlm"]["words"](batch[TOKENS])
        prefix = torch.cat([seen, m.state_proj(state)[:, None], words], dim=1)
        present = torch.cat([torch.ones(prefix.shape[0], seen.shape[1] + 1, dtype=torch.bool), batch[ATTENTION]], 1)
        return prefix, present

    def _velocity(self, prefix, present, x_t: Tensor, time: Tensor) -> Tensor:
        m = self.model
        expert = m.vlm_with_expert["lm_expert"]
        x = m.action_in_proj(torch.cat([x_t, time[:, None, None].expand(-1, x_t.shape[1], 1)], dim=-1))
        scores = expert["query"](x) @ prefix.transpose(1, 2) / prefix.shape[-1] ** 0.5
        x = x + torch.softmax(scores.masked_fill(~present[:, None], float("-inf")), dim=-1) @ prefix
        return m.action_out_proj(x + expert["mlp"](x))

    def _actions(self, batch: Dict[str, Tensor]) -> Tensor:
        actions = batch[ACTION]
        return F.pad(actions, (0, self.config.max_action_dim - actions.shape[-1]))

    # ------------------------------------------------------------------ LeRobot's API
    def forward(self, batch: dict[str, Tensor], noise=None, time=None, reduction: str = "mean") -> dict[str, Tensor]:
        actions = self._actions(batch)
        if noise is None:
            noise = torch.randn_like(actions)
        if time is None:
            time = torch.distributions.Beta(1.5, 1.0).sample((actions.shape[0],)) * 0.999 + 0.001
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        losses = F.mse_loss(self._velocity(*self._prefix(batch), x_t, time), noise - actions, reduction="none")
        pad = batch.get("action_is_pad")
        if pad is not None:
            losses = losses * (~pad).unsqueeze(-1)
        if reduction == "none":
            per_sample = losses.mean(dim=(1, 2))
            return per_sample, {"loss": per_sample.mean().item()}
        loss = losses.mean()
        return loss, {"loss": loss.item()}

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, Tensor], noise: Tensor | None = None, **kwargs: Unpack[ActionSelectKwargs]
    ) -> Tensor:
        self.eval()
        c = self.config
        prefix, present = self._prefix(batch)
        x = noise if noise is not None else torch.randn(prefix.shape[0], c.chunk_size, c.max_action_dim)
        for k in range(c.num_steps):  # Euler from t = 1 (noise) to t = 0 (actions)
            time = torch.full((x.shape[0],), 1 - k / c.num_steps)
            x = x - self._velocity(prefix, present, x, time) / c.num_steps
        return x

    @torch.no_grad()
    def select_action(
        self, batch: dict[str, Tensor], noise: Tensor | None = None, **kwargs: Unpack[ActionSelectKwargs]
    ) -> Tensor:
        self.eval()
        if len(self._queues[ACTION]) == 0:
            actions = self.predict_action_chunk(batch, noise)
            self._queues[ACTION].extend(actions.transpose(0, 1)[: self.config.n_action_steps])
        return self._queues[ACTION].popleft()

    # ------------------------------------------------------------------ a local folder
    def save_pretrained(self, save_directory: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(self.config)))
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS_FILE))
        preprocessor = {"kind": "preprocessor", "max_length": self.config.tokenizer_max_length}
        (folder / "policy_preprocessor.json").write_text(json.dumps(preprocessor))
        (folder / "policy_postprocessor.json").write_text(json.dumps({"kind": "postprocessor"}))

    @classmethod
    def from_pretrained(
        cls: builtins.type[T],
        pretrained_name_or_path: str | Path,
        *,
        config: PreTrainedConfig | None = None,
        force_download: bool = False,
        resume_download: bool | None = None,
        proxies: dict | None = None,
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        revision: str | None = None,
        strict: bool = False,
        **kwargs,
    ) -> T:
        from safetensors.torch import load_file

        folder = Path(pretrained_name_or_path)
        if config is None:
            config = SmolVLAConfig(**json.loads((folder / CONFIG_FILE).read_text()))
        policy = cls(config, **kwargs)
        policy.load_state_dict(load_file(str(folder / WEIGHTS_FILE)), strict=strict)
        policy.eval()
        return policy


class FlowModel(nn.Module):
    """The network: image patches, the state and the words as a prefix; the noisy chunk attends to it."""

    def __init__(self, c: SmolVLAConfig) -> None:
        super().__init__()
        vlm = nn.ModuleDict(
            {
                "patches": nn.Conv2d(3, c.width, c.patch, stride=c.patch),
                "words": nn.Embedding(256, c.width, padding_idx=0),
            }
        )
        expert = nn.ModuleDict(
            {
                "query": nn.Linear(c.width, c.width),
                "mlp": nn.Sequential(nn.Linear(c.width, 2 * c.width), nn.GELU(), nn.Linear(2 * c.width, c.width)),
            }
        )
        self.vlm_with_expert = nn.ModuleDict({"vlm": vlm, "lm_expert": expert})
        self.state_proj = nn.Linear(c.max_state_dim, c.width)
        self.action_in_proj = nn.Linear(c.max_action_dim + 1, c.width)
        self.action_out_proj = nn.Linear(c.width, c.max_action_dim)


class PolicyProcessorPipeline:
    """LeRobot's processor pipelines as this policy saves them beside its weights: the preprocessor
    tokenizes "task" (TaskTokenizer), the postprocessor bounds the actions to the robot's [-1, 1]."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, config_filename: str, **kwargs: Any) -> Any:
        saved = json.loads((Path(pretrained_model_name_or_path) / config_filename).read_text())
        if saved["kind"] == "preprocessor":
            return TaskTokenizer(int(saved["max_length"]))
        return lambda action: action.clamp(-1.0, 1.0)


class TaskTokenizer:
    """The preprocessor's part this policy needs (LeRobot's tokenizer step): "task" strings to
    observation.language.tokens and its attention mask (bytes as ids, padded)."""

    def __init__(self, max_length: int = 16) -> None:
        self.max_length = max_length

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        rows = [list(text.encode("utf-8"))[: self.max_length] for text in batch["task"]]
        tokens = torch.zeros(len(rows), self.max_length, dtype=torch.int64)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row)
        return {**batch, TOKENS: tokens, ATTENTION: tokens != 0}
