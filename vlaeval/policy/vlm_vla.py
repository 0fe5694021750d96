"""model=smolvlm_vla: a VLM-backbone flow-matching VLA, SmolVLA's architecture at a size a CPU trains.

    camera(s), uint8 (B, 3, H, W) --> /255, resized to image_size, to [-1, 1]
        --> transformers' Idefics3 (SmolVLM) vision tower and its pixel-shuffle connector
        --> image tokens in the language model's width
    the state (its first `state_dims`: 4 is Meta-World's hand and gripper, as tiny_vla_vision reads;
        null: all of it) --> standardised --> one linear token
    the instruction --> a BPE tokenizer trained here on the data's words (an unseen word is split
        into pieces it knows, not dropped) --> the language model's own embeddings
    prefix = [image tokens, state token, instruction tokens] --> the language model (Llama, causal),
        run ONCE per policy call: its per-layer keys and values, with the instruction's pad mask,
        are the conditioning (`encode`) -- a dict of tensors, not one tensor
    the action expert (`velocity`, run at every denoising step): the noisy chunk and the flow time
        --> for each language-model layer l, a pre-norm block whose queries attend to layer l's
        prefix keys/values and to the chunk's own keys/values (grouped-query heads, as the VLM's),
        then an MLP --> the velocity (B, H, action_dim)

The prefix's keys and values are computed once per policy call and reused across the denoising
steps: the rollout engine and the estimators encode an anchor once and call `velocity` per step
(benchmarks/vlm_vla.py measures the reuse against recomputing the prefix at every step).

`vlm_path=<folder>` loads a pretrained VLM and its tokenizer from a local folder
(`save_pretrained` layout; nothing is downloaded) instead of the random tiny one; `freeze_vlm`
keeps its weights fixed while the expert and the state token train, as users fine-tune SmolVLA.
Every trainable layer is a Linear, Conv2d, LayerNorm, RMSNorm or Embedding: the gradient artifact
measures exact per-sample norms for all of them (Linear, Conv2d and LayerNorm in closed form).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from vlaeval.errors import require

PAD, UNKNOWN = "<pad>", "<unk>"
TOKENIZER_FILE = "tokenizer.json"
# model.autocast: the policy's own mixed precision, applied inside encode and velocity so every job
# (training, scoring, gradients, rollouts) runs it the same way; weights and outputs stay float32.
AUTOCAST_DTYPES: Dict[Optional[str], Optional[torch.dtype]] = {None: None, "bfloat16": torch.bfloat16}


def train_tokenizer(words: Sequence[str], vocab_size: int) -> Any:
    """A BPE tokenizer trained on `words` (the data's instruction words), lower-cased and split on
    whitespace and punctuation; deterministic for the same words (they are sorted first)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNKNOWN))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        special_tokens=[PAD, UNKNOWN],
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz0123456789"),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sorted(set(words)), trainer=trainer)
    return tokenizer


def tiny_vlm_config(
    vocab_size: int,
    image_size: int,
    patch_size: int,
    vision_width: int,
    vision_layers: int,
    vision_heads: int,
    text_width: int,
    text_layers: int,
    text_heads: int,
    text_kv_heads: int,
) -> Any:
    """An Idefics3 (SmolVLM) config at a tiny size: randomly initialised, it runs the same code."""
    from transformers import Idefics3Config
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.llama import LlamaConfig

    vision = Idefics3VisionConfig(
        hidden_size=vision_width,
        intermediate_size=2 * vision_width,
        num_hidden_layers=vision_layers,
        num_attention_heads=vision_heads,
        image_size=image_size,
        patch_size=patch_size,
    )
    text = LlamaConfig(
        hidden_size=text_width,
        intermediate_size=2 * text_width,
        num_hidden_layers=text_layers,
        num_attention_heads=text_heads,
        num_key_value_heads=text_kv_heads,
        vocab_size=vocab_size + 1,  # the last id is the image token, never produced by the tokenizer
        max_position_embeddings=512,
        pad_token_id=0,
    )
    return Idefics3Config(
        vision_config=vision.to_dict(), text_config=text.to_dict(), scale_factor=2, image_token_id=vocab_size
    )


class PrefixCache(NamedTuple):
    """The conditioning: the language model's keys and values of the prefix, per layer, each
    (B, kv_heads, T, head_dim), and the prefix's pad mask (B, T), True where a token is padding."""

    kv: List[Tuple[torch.Tensor, torch.Tensor]]
    pad: torch.Tensor


class ExpertLayer(nn.Module):
    """One block of the action expert: the chunk's queries attend to the prefix's keys/values of
    the matching language-model layer and to the chunk's own (no mask among the chunk's tokens),
    then an MLP; pre-norm, residual."""

    def __init__(self, width: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.query = nn.Linear(width, heads * head_dim)
        self.key = nn.Linear(width, kv_heads * head_dim)
        self.value = nn.Linear(width, kv_heads * head_dim)
        self.out = nn.Linear(heads * head_dim, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(
        self, x: torch.Tensor, prefix_keys: torch.Tensor, prefix_values: torch.Tensor, prefix_pad: torch.Tensor
    ) -> torch.Tensor:
        b, h, _ = x.shape
        y = self.norm1(x)
        q = self.query(y).reshape(b, h, self.heads, self.head_dim).transpose(1, 2)
        k = self.key(y).reshape(b, h, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.value(y).reshape(b, h, self.kv_heads, self.head_dim).transpose(1, 2)
        keys = torch.cat([prefix_keys.to(q.dtype), k], dim=2)  # (B, kv_heads, T + H, head_dim)
        values = torch.cat([prefix_values.to(q.dtype), v], dim=2)
        group = self.heads // self.kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, heads, H, T + H)
        hidden = torch.cat([prefix_pad, torch.zeros(b, h, dtype=torch.bool, device=x.device)], dim=1)
        scores = scores.masked_fill(hidden[:, None, None, :], float("-inf"))
        attended = (torch.softmax(scores, dim=-1) @ values).transpose(1, 2).reshape(b, h, -1)
        x = x + self.out(attended)
        return x + self.mlp(self.norm2(x))


class VLMFlowVLA(nn.Module):
    """A flow-matching action expert conditioned on a VLM's per-layer keys and values (SmolVLA's
    design): transformers' Idefics3 (SmolVLM) at a tiny size, or a pretrained one from
    `vlm_path`. Sizes: `vision_*` the image tower, `text_*` the language model (its layers are the
    expert's), `expert_width` the expert's width (its heads and head size are the language model's)."""

    vlm: Any  # transformers' Idefics3Model
    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(
        self,
        vocab: Sequence[str],
        obs_dim: int,
        action_dim: int,
        horizon: int,
        *,
        cameras: Sequence[str] = ("observation.images.corner",),
        image_size: int = 64,
        patch_size: int = 16,
        vision_width: int = 32,
        vision_layers: int = 1,
        vision_heads: int = 2,
        text_width: int = 64,
        text_layers: int = 2,
        text_heads: int = 4,
        text_kv_heads: int = 2,
        expert_width: int = 48,
        tokenizer_vocab: int = 128,
        max_tokens: int = 16,
        vlm_path: Optional[str] = None,
        freeze_vlm: bool = False,
        autocast: Optional[str] = None,
        state_dims: Optional[int] = None,
    ) -> None:
        super().__init__()
        require(
            state_dims is None or int(state_dims) >= 1, f"model.state_dims={state_dims} must be >= 1 (or null: all)"
        )
        require(bool(cameras), "model.cameras is empty: the VLM reads at least one camera; name one the data has")
        require(
            autocast in AUTOCAST_DTYPES,
            f"model.autocast={autocast} is not a precision this model runs in; use "
            + " or ".join(str(k) for k in AUTOCAST_DTYPES if k)
            + " (or null: float32)",
        )
        self.autocast = autocast
        self.horizon, self.action_dim = int(horizon), int(action_dim)
        self.cameras = [str(c) for c in cameras]
        self.max_tokens = int(max_tokens)
        self.vlm, self.tokenizer = self._vlm(
            vocab,
            vlm_path,
            tokenizer_vocab,
            (image_size, patch_size, vision_width, vision_layers, vision_heads),
            (text_width, text_layers, text_heads, text_kv_heads),
        )
        text = self.vlm.config.text_config
        self.image_size = int(self.vlm.config.vision_config.image_size)
        width, layers = int(text.hidden_size), int(text.num_hidden_layers)
        heads, kv_heads = int(text.num_attention_heads), int(text.num_key_value_heads)
        head_dim = int(getattr(text, "head_dim", None) or width // heads)
        self.freeze_vlm = bool(freeze_vlm)
        for p in self.vlm.parameters():
            p.requires_grad_(not self.freeze_vlm)
        # Only the first state_dims reach the state token: with 4, where the object and the goal are
        # must come from the camera, as for tiny_vla_vision (the whole state tells the policy).
        self.state_dims = int(obs_dim if state_dims is None else min(int(state_dims), obs_dim))
        self.state = nn.Linear(self.state_dims, width)
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        self.action_in = nn.Linear(action_dim, expert_width)
        self.time_in = nn.Sequential(
            nn.Linear(expert_width, expert_width), nn.SiLU(), nn.Linear(expert_width, expert_width)
        )
        self.expert = nn.ModuleList(ExpertLayer(expert_width, heads, kv_heads, head_dim) for _ in range(layers))
        self.final_norm = nn.LayerNorm(expert_width)
        self.action_out = nn.Linear(expert_width, action_dim)

    @staticmethod
    def _vlm(
        vocab: Sequence[str],
        vlm_path: Optional[str],
        tokenizer_vocab: int,
        vision: Tuple[int, int, int, int, int],
        text: Tuple[int, int, int, int],
    ) -> Tuple[nn.Module, Any]:
        from transformers import Idefics3Model

        if vlm_path is not None:
            folder = Path(str(vlm_path))
            require(
                (folder / "config.json").is_file() and (folder / TOKENIZER_FILE).is_file(),
                f"model.vlm_path={vlm_path} is not a saved VLM folder (config.json and {TOKENIZER_FILE}); "
                "pass a folder written by save_pretrained, or leave it null for the built-in tiny VLM",
            )
            from tokenizers import Tokenizer

            return Idefics3Model.from_pretrained(str(folder)), Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        tokenizer = train_tokenizer(vocab, tokenizer_vocab)
        config = tiny_vlm_config(tokenizer.get_vocab_size(), *vision, *text)
        return Idefics3Model(config), tokenizer

    def save_vlm(self, folder: str | Path) -> Path:
        """The VLM and its tokenizer as `model.vlm_path` reads them (save_pretrained's layout)."""
        folder = Path(folder)
        self.vlm.save_pretrained(str(folder))
        self.tokenizer.save(str(folder / TOKENIZER_FILE))
        return folder

    # ------------------------------------------------------------------ preprocessing (the policy's own)
    def set_observation_statistics(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.obs_mean.copy_(mean)
        self.obs_std.copy_(std.clamp_min(1e-6))

    def tokenize(self, instructions: Sequence[str]) -> torch.Tensor:
        """(len(instructions), max_tokens) token ids, padded with <pad> (id 0) after the last."""
        pad = self.tokenizer.token_to_id(PAD)
        out = torch.full((len(instructions), self.max_tokens), pad, dtype=torch.int64)
        for row, encoding in enumerate(self.tokenizer.encode_batch([str(t) for t in instructions])):
            ids = encoding.ids[: self.max_tokens]
            out[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return out

    def _pixels(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.obs_mean.dtype) / 255.0
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = nn.functional.interpolate(
                x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
            )
        return x * 2.0 - 1.0

    def precision(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """model.autocast on `device`'s kind (CPU autocast runs the same bfloat16 path a GPU does)."""
        dtype = AUTOCAST_DTYPES[self.autocast]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

    # ------------------------------------------------------------------ the conditioning level
    def encode(self, batch: Dict[str, torch.Tensor]) -> PrefixCache:
        """The prefix through the VLM, once: its per-layer keys and values and the pad mask (in
        bfloat16 under model.autocast)."""
        missing = [c for c in self.cameras if c not in batch]
        if missing:
            raise KeyError(f"the batch lacks camera {missing[0]} that model.cameras names; present: {sorted(batch)}")
        with self.precision(self.obs_mean.device):
            return self._encode(batch)

    def _encode(self, batch: Dict[str, torch.Tensor]) -> PrefixCache:
        observation, ids = batch["observation"], batch["instruction"]
        b = observation.shape[0]
        pixels = torch.stack([self._pixels(batch[c]) for c in self.cameras], dim=1).flatten(0, 1)
        seen = self.vlm.connector(self.vlm.vision_model(pixel_values=pixels).last_hidden_state)
        seen = seen.reshape(b, -1, seen.shape[-1])  # (B, cameras x image tokens, width)
        words = self.vlm.get_input_embeddings()(ids)
        state = self.state(((observation - self.obs_mean) / self.obs_std)[:, : self.state_dims])[:, None]
        prefix = torch.cat([seen, state, words.to(seen.dtype)], dim=1)
        present = torch.cat([torch.ones(b, seen.shape[1] + 1, dtype=torch.bool, device=ids.device), ids != 0], dim=1)
        out = self.vlm.text_model(inputs_embeds=prefix, attention_mask=present.long(), use_cache=True)
        cache = out.cache  # transformers 5: the per-layer keys and values (a DynamicCache)
        return PrefixCache([(layer.keys, layer.values) for layer in cache.layers], ~present)

    def velocity(self, conditioning: PrefixCache, noisy_actions: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The velocity (B, H, action_dim) in the noisy chunk's dtype (computed in bfloat16 under
        model.autocast)."""
        with self.precision(noisy_actions.device):
            x = self.action_in(noisy_actions)
            x = x + self.time_in(timestep_embedding(t, self.action_in.out_features))[:, None]
            for layer, (keys, values) in zip(self.expert, conditioning.kv):
                x = layer(x, keys, values, conditioning.pad)
            return self.action_out(self.final_norm(x)).to(noisy_actions.dtype)

    def trainable_parameters(self, which: str) -> List[nn.Parameter]:
        """ "action_head": the action expert (its input, time and output layers with it); "all": every
        parameter that trains (a frozen VLM's do not)."""
        if which == "action_head":
            parts: List[nn.Module] = [self.action_in, self.time_in, self.expert, self.final_norm, self.action_out]
            return [p for m in parts for p in m.parameters()]
        return [p for p in self.parameters() if p.requires_grad]


def timestep_embedding(t: torch.Tensor, width: int) -> torch.Tensor:
    """Sinusoidal features of the flow time t (B,) in [0, 1] -> (B, width)."""
    half = width // 2
    frequencies = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=t.dtype) / max(half, 1))
    angles = 1000.0 * t[:, None] * frequencies[None]
    features = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return nn.functional.pad(features, (0, width - features.shape[-1]))
