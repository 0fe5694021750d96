"""model=tiny_vla_vision: a small vision-language-action policy that sees and reads.

    camera(s), uint8 (B, 3, H, W) -- or the last `history` frames, (B, 3 * history, H, W) -- --> /255, cropped to the workspace (`crop`, fractions of the
        frame), resized to image_size (and, while training, shifted by up to augment_shift pixels)
        --> per camera:
        Conv2d 5x5/2 -> GroupNorm [-> FiLM] -> SiLU -> Conv2d 3x3/2 -> GroupNorm [-> FiLM] -> SiLU
        -> Conv2d 3x3/1 -> spatial softmax at a learned sharpness (each channel's expected image
           x, y: where it sees its feature) -> LayerNorm of the keypoints (`keypoint_norm`)
    instruction text --> its own tokenizer (word ids over the vocabulary it was built with, unknown
        words -> <unk>) --> Embedding + learned positions -> one pre-norm self-attention block
        -> mean over the words that are there (with `film`, it also scales and shifts each image
        feature map: FiLM, as RT-1 conditions its image encoder on the instruction)
    proprioception: the first `state_dims` of the state (Meta-World: hand position and gripper;
        the object and goal positions are left out, so where things are must come from the camera)
    while training, with `locate` (observation dims, e.g. Meta-World's object and goal x, y, z):
        a linear read-out of the image features predicts those dims of the (standardised) state,
        its squared error times `locate_weight` added to the loss -- the simulator knows where
        things are, so the encoder is taught to find them (Levine et al. 2016 trained their
        spatial-softmax keypoints on object positions); the policy never reads those dims
    --> MLP -> conditioning --> the flow-matching action head of the tiny VLA (an MLP over the
        noisy chunk, the conditioning and the flow time)

The policy owns its preprocessing as LeRobot's policies do: it is handed raw uint8 images and
raw instruction strings (through `tokenize`), and converts, resizes and tokenizes them itself.
Every trainable layer is a Conv2d, GroupNorm, Embedding, learned position table, LayerNorm or
Linear: vlaeval.residual.gradients measures exact per-sample norms for all of them.

Why the keypoints are normalised: a keypoint is an expected position in [-1, 1], and with an
unnormalised softmax it barely moves from image to image (SD ~0.007, a fifth of a pixel of 64, in
benchmarks/vision_policy.py), about 100x weaker than the text and state features it is
concatenated with; a linear probe still reads the objects from it. The LayerNorm puts the 2C
keypoints on the scale of the other features (Diffusion Policy's and DP3's encoders normalise
likewise), and the sharpness starts where a feature map's peak dominates its softmax.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from vlaeval.errors import require
from vlaeval.policy.tiny_dit import Attention, TokenPositions
from vlaeval.policy.tiny_vla import MLPFlowPolicy, mlp

PAD, UNKNOWN = 0, 1  # token ids before the vocabulary's words
KEYPOINT_NORMS = ("none", "layernorm", "standardise")


class SpatialSoftmax(nn.Module):
    """(B, C, H, W) feature maps -> (B, 2C): each channel's softmax-weighted mean image position,
    at a learned sharpness (a flat softmax, as at initialisation, points nowhere)."""

    def __init__(self, sharpness: float = 2.718281828459045) -> None:
        super().__init__()
        self.log_sharpness = nn.Parameter(torch.tensor(float(sharpness)).log())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        b, c, h, w = features.shape
        logits = features.reshape(b, c, h * w) * self.log_sharpness.exp()
        weights = torch.softmax(logits, dim=-1).reshape(b, c, h, w)
        ys = torch.linspace(-1.0, 1.0, h, device=features.device, dtype=features.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=features.device, dtype=features.dtype)
        x = (weights.sum(dim=2) * xs).sum(dim=-1)
        y = (weights.sum(dim=3) * ys).sum(dim=-1)
        return torch.cat([x, y], dim=-1)


def random_shift(images: torch.Tensor, pixels: int) -> torch.Tensor:
    """Each image translated by up to `pixels` in x and y (edges repeated), drawn per image from
    torch's generator: the augmentation image policies train with (DrQ, Diffusion Policy)."""
    b, _, h, w = images.shape
    shift = torch.randint(-pixels, pixels + 1, (b, 2), device=images.device).to(images.dtype)
    theta = torch.zeros(b, 2, 3, dtype=images.dtype, device=images.device)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    theta[:, 0, 2], theta[:, 1, 2] = 2.0 * shift[:, 0] / w, 2.0 * shift[:, 1] / h
    grid = nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return nn.functional.grid_sample(images, grid, padding_mode="border", align_corners=False)


class FiLM(nn.Module):
    """x * (1 + scale(c)) + shift(c) per channel, from a conditioning vector c; zero-initialised, so
    training starts from the unconditioned encoder."""

    def __init__(self, conditioning: int, channels: int) -> None:
        super().__init__()
        self.project = nn.Linear(conditioning, 2 * channels)
        nn.init.zeros_(self.project.weight)
        nn.init.zeros_(self.project.bias)

    def forward(self, x: torch.Tensor, conditioning: torch.Tensor) -> torch.Tensor:
        scale, shift = self.project(conditioning)[:, :, None, None].chunk(2, dim=1)
        return x * (1.0 + scale) + shift


class KeypointStandardisation(nn.Module):
    """(keypoints - mean) / sd per keypoint, with the mean and SD measured once on training images
    when the model is built (set_keypoint_statistics) and saved with the weights: fixed, so a
    sample's features never depend on what else is in its batch (per-sample gradients stay exact)."""

    mean: torch.Tensor
    sd: torch.Tensor

    def __init__(self, features: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("sd", torch.ones(features))

    def forward(self, keypoints: torch.Tensor) -> torch.Tensor:
        return (keypoints - self.mean) / self.sd


class ImageEncoder(nn.Module):
    def __init__(
        self,
        channels: int,
        groups: int = 4,
        *,
        sharpness: float = 2.718281828459045,
        keypoint_norm: str = "none",
        film_from: int = 0,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        # One Sequential, as before FiLM and the keypoints' norm existed: checkpoints saved then load.
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, channels, 5, stride=2, padding=2),
            nn.GroupNorm(groups, channels),
            nn.SiLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1),
            nn.GroupNorm(groups, channels),
            nn.SiLU(),
            nn.Conv2d(channels, channels, 3, stride=1, padding=1),
            SpatialSoftmax(sharpness),
        )
        norms = {"layernorm": nn.LayerNorm, "standardise": KeypointStandardisation}
        self.keypoint_norm = norms[keypoint_norm](2 * channels) if keypoint_norm in norms else nn.Identity()
        self.film = nn.ModuleList([FiLM(film_from, channels) for _ in range(2)]) if film_from else None

    def forward(self, images: torch.Tensor, conditioning: Optional[torch.Tensor] = None) -> torch.Tensor:
        x, film = images, 0
        for layer in self.layers:
            x = layer(x)
            if isinstance(layer, nn.GroupNorm) and self.film is not None and conditioning is not None:
                x, film = self.film[film](x, conditioning), film + 1
        return self.keypoint_norm(x)


class TextEncoder(nn.Module):
    def __init__(self, words: int, width: int, heads: int, max_words: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(words, width, padding_idx=PAD)
        self.positions = TokenPositions(max_words, width)
        self.norm = nn.LayerNorm(width)
        self.attention = Attention(width, heads)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        present = (tokens != PAD).to(self.embedding.weight.dtype).unsqueeze(-1)
        x = self.positions(self.embedding(tokens))
        h = self.norm(x)
        x = x + self.attention(h, h)
        return (x * present).sum(dim=1) / present.sum(dim=1).clamp_min(1.0)


class TinyVLAVision(MLPFlowPolicy):
    def __init__(
        self,
        vocab: Sequence[str],
        obs_dim: int,
        action_dim: int,
        horizon: int,
        *,
        cameras: Sequence[str] = ("observation.images.corner",),
        image_size: int = 64,
        augment_shift: int = 4,
        state_dims: Optional[int] = 4,
        image_channels: int = 32,
        text_width: int = 32,
        text_heads: int = 2,
        max_words: int = 16,
        conditioning_dim: int = 128,
        head_hidden: int = 256,
        head_layers: int = 3,
        time_embedding_dim: int = 32,
        keypoint_norm: str = "standardise",
        sharpness: float = 2.718281828459045,
        crop: Optional[Sequence[float]] = None,
        film: bool = False,
        history: int = 1,
        locate: Optional[Sequence[int]] = None,
        locate_weight: float = 1.0,
    ) -> None:
        super().__init__(vocab, obs_dim, action_dim, horizon, time_embedding_dim)
        require(
            bool(cameras), "model.cameras is empty: a vision policy reads at least one camera; name one the data has"
        )
        require(
            keypoint_norm in KEYPOINT_NORMS,
            f"model.keypoint_norm={keypoint_norm} is not one of {', '.join(KEYPOINT_NORMS)}; pick one of them",
        )
        require(float(sharpness) > 0, f"model.sharpness={sharpness} must be positive (the softmax's initial scale)")
        self.crop = checked_crop(crop)
        require(int(history) in (1, 2, 3, 4), f"model.history={history} must be 1 to 4 (camera frames per observation)")
        self.history = int(history)  # frames per camera, stacked on the channels, oldest first
        self.cameras = [str(c) for c in cameras]
        self.image_size = int(image_size)
        self.augment_shift = int(augment_shift)  # pixels of random shift while training (0: none)
        self.state_dims = int(obs_dim if state_dims is None else min(int(state_dims), obs_dim))
        self.max_words = int(max_words)
        self.word_id = {word: i + 2 for i, word in enumerate(self.vocab)}
        self.film = bool(film)
        self.images = nn.ModuleList(
            [
                ImageEncoder(
                    image_channels,
                    sharpness=float(sharpness),
                    keypoint_norm=str(keypoint_norm),
                    film_from=text_width if self.film else 0,
                    in_channels=3 * self.history,
                )
                for _ in self.cameras
            ]
        )
        self.text = TextEncoder(len(self.vocab) + 2, text_width, text_heads, self.max_words)
        features = 2 * image_channels * len(self.cameras) + text_width + self.state_dims
        self.encoder = mlp([features, conditioning_dim, conditioning_dim])
        self.build_action_head(conditioning_dim, head_hidden, head_layers)
        self.locate = checked_locate(locate, obs_dim, locate_weight)
        self.locate_weight = float(locate_weight)
        if self.locate:  # only then: checkpoints without it keep their state_dict
            self.locate_head = nn.Linear(2 * image_channels * len(self.cameras), len(self.locate))

    # ------------------------------------------------------------------ preprocessing (the policy's own)
    def tokenize(self, instructions: Sequence[str]) -> torch.Tensor:
        """(len(instructions), max_words) word ids: PAD after the last word, UNKNOWN for a word
        outside the vocabulary (so a paraphrase's new words are visibly unknown, not dropped)."""
        out = torch.full((len(instructions), self.max_words), PAD, dtype=torch.int64)
        for row, text in enumerate(instructions):
            words = re.findall(r"[a-z]+", str(text).lower())[: self.max_words]
            out[row, : len(words)] = torch.tensor([self.word_id.get(w, UNKNOWN) for w in words], dtype=torch.int64)
        return out

    def pixels(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, 3 * history, H, W) -> (B, 3 * history, image_size, image_size) in [0, 1], in the
        weights' dtype, cropped to `crop` first (a sample's frames shifted alike)."""
        if self.crop is not None:
            top, left, height, width = self.crop
            h, w = images.shape[-2:]
            images = images[
                ..., round(top * h) : round((top + height) * h), round(left * w) : round((left + width) * w)
            ]
        x = images.to(next(self.action_head.parameters()).dtype) / 255.0
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = nn.functional.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True)
        if self.training and self.augment_shift > 0:
            x = random_shift(x, self.augment_shift)
        return x

    @torch.no_grad()
    def set_keypoint_statistics(self, images: Dict[str, torch.Tensor]) -> None:
        """With keypoint_norm=standardise: each keypoint's mean and SD over these training images
        (uint8, by camera feature), as the freshly initialised encoder sees them."""
        for encoder, camera in zip(self.images, self.cameras):
            assert isinstance(encoder, ImageEncoder)
            if isinstance(encoder.keypoint_norm, KeypointStandardisation):
                keypoints = encoder.layers(self.pixels(images[camera]))
                encoder.keypoint_norm.mean.copy_(keypoints.mean(0))
                encoder.keypoint_norm.sd.copy_(keypoints.std(0).clamp_min(1e-4))

    # ------------------------------------------------------------------ the protocol
    def encode(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        return self._encode(batch)[0]

    def encode_for_training(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The conditioning and, with `locate`, each anchor's auxiliary loss: locate_weight times the
        mean squared error of the image features' read-out of those standardised state dims."""
        conditioning, seen, state = self._encode(batch)
        if not self.locate:
            return conditioning, None
        predicted = self.locate_head(seen)
        return conditioning, self.locate_weight * ((predicted - state[:, self.locate]) ** 2).mean(dim=-1)

    def _encode(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(conditioning, the image features, the whole standardised state)."""
        missing = [c for c in self.cameras if c not in batch]
        if missing:
            raise KeyError(f"the batch lacks camera {missing[0]} that model.cameras names; present: {sorted(batch)}")
        read = self.text(batch["instruction"])
        seen = torch.cat([encoder(self.pixels(batch[c]), read) for encoder, c in zip(self.images, self.cameras)], -1)
        state = self.normalise(batch["observation"])
        return self.encoder(torch.cat([seen, read, state[:, : self.state_dims]], dim=-1)), seen, state

    def encoder_modules(self) -> List[nn.Module]:
        return [self.images, self.text, self.encoder]


def checked_crop(crop: Optional[Sequence[float]]) -> Optional[Tuple[float, float, float, float]]:
    """model.crop: (top, left, height, width) as fractions of the frame, inside it, or None."""
    if crop is None:
        return None
    values = tuple(float(v) for v in crop)
    require(
        len(values) == 4
        and all(v >= 0 for v in values)
        and values[2] > 0
        and values[3] > 0
        and values[0] + values[2] <= 1 + 1e-9
        and values[1] + values[3] <= 1 + 1e-9,
        f"model.crop={list(crop)} is not (top, left, height, width) fractions of the frame inside it; "
        "e.g. model.crop=[0.25,0.1,0.7,0.8], or null for the whole frame",
    )
    return (values[0], values[1], values[2], values[3])


def checked_locate(locate: Optional[Sequence[int]], obs_dim: int, weight: float) -> List[int]:
    """model.locate: distinct observation dims in [0, obs_dim), or None/empty (no auxiliary loss)."""
    dims = [int(d) for d in (locate or ())]
    require(
        all(0 <= d < obs_dim for d in dims) and len(set(dims)) == len(dims),
        f"model.locate={list(locate or ())} must list distinct observation dims in [0, {obs_dim}); e.g. "
        "model.locate=[4,5,6,36,37,38] (Meta-World: the object's and the goal's x, y, z), or null for none",
    )
    require(float(weight) > 0, f"model.locate_weight={weight} must be > 0 (the auxiliary loss's weight)")
    return dims
