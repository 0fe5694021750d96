"""The embedded default: demonstrations -> anchors -> tiny VLA, trained on first use and cached by
config hash, or loaded from a given checkpoint (`checkpoint=path checkpoint.path=...`)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from vlaeval.artifacts import sha256_json
from vlaeval.choices import CheckpointKind
from vlaeval.config import PolicyJobSettings, to_plain
from vlaeval.data.anchors import AnchorSet, build_anchors
from vlaeval.data.demonstrations import Demonstrations
from vlaeval.errors import UserInputError, require
from vlaeval.policy.bound import BoundPolicy, anchor_frames, bind_policy
from vlaeval.policy.checkpoint import TrainingRecord, load_state_dict, save_checkpoint, state_dict_mismatch
from vlaeval.policy.protocol import check_policy
from vlaeval.policy.tiny_vla import vocabulary
from vlaeval.policy.training import TrainingExtras, TrainingRun, train_policy
from vlaeval.store import get_or_build

log = logging.getLogger(__name__)

# Training settings that do not change the trained weights (left out of the cache key).
NON_WEIGHT_TRAIN_KEYS = (
    "log_every",
    "evaluate_after",
    "heldout_every",
    "heldout_episodes_per_task",
    "heldout_draws",
    "threads",  # the speed only (up to rounding in a reduction's order)
    "save_every",  # snapshots along the way, not the final weights
    "resume_every_s",  # how often a killed run's state is kept: it continues to the same weights
    "heldout_scenes",  # what is measured along the way, not what is trained
    "validation_scenes",
    "second_moment_anchors",
)
# Settings added after checkpoints were first cached, left out of the key while they train exactly as
# before they existed (AdamW; flow time from the training distribution), so those checkpoints keep their
# keys: {the setting that switches them on: (its value before, the settings it alone uses)}.
LATER_TRAIN_KEYS = {
    "optimizer": ("adamw", ("momentum",)),
    "time_sampling": ("uniform", ("time_signal", "time_bins", "time_decay", "time_floor", "time_warmup_steps")),
    "anchor_sampling": ("uniform", ()),
    "init_from": ("None", ()),
    "warmup_steps": ("0", ()),
    "grad_clip_norm": ("None", ()),
    "ema_decay": ("None", ()),
    "draws_per_anchor": ("1", ()),
    "budget_samples": ("None", ()),
}
# Likewise the model's: tiny_vla_vision's auxiliary loss (`locate`), off unless named.
LATER_MODEL_KEYS = {
    "locate": ("None", ("locate_weight",)),
    "state_dims": ("None", ()),  # smolvlm_vla's: null (all of the state) keeps the key it had before
    "hidden_state": ("[]", ()),  # tiny_vla's: nothing hidden keeps the key it had before
}

KEYPOINT_STATISTICS_IMAGES = 512  # training frames a vision policy's fixed keypoint standardisation reads
CHECKPOINT_FILE = "model.pt"  # a built-in checkpoint in its store entry
RESUME_FILE = "training_state.pt"  # what a first-use training keeps as it goes, until it ends


@dataclass
class PolicyData:
    demonstrations: Demonstrations
    anchors: AnchorSet
    built_now: bool

    @property
    def vocabulary(self) -> List[str]:
        """The words of the data's instructions: what a built-in policy is built to read."""
        return vocabulary(self.demonstrations.instructions)

    @property
    def image_size(self) -> Optional[int]:
        """The height of the data's camera frames (None without cameras): what rollouts render at."""
        cameras = self.demonstrations.cameras or {}
        return next(iter(cameras.values())).height if cameras else None

    def bind(self, model: torch.nn.Module, flow: Any, device: str = "cpu") -> BoundPolicy:
        """`model` bound to this data's tasks (task k reads instruction k), `flow` and `device`."""
        return bind_policy(
            model,
            self.demonstrations.instructions,
            flow,
            device=device,
            vocab=self.vocabulary,
            image_size=self.image_size,
        )


@dataclass
class PolicyHandle:
    model: torch.nn.Module
    path: Path
    sha256: str
    sidecar: Mapping[str, Any]  # policy.checkpoint.CheckpointSidecar, as written or read (None read: {})
    trained_now: bool

    @property
    def training(self) -> Optional[TrainingRun]:
        """How its weights were trained, as its sidecar records it (None: a checkpoint without one)."""
        recorded = self.sidecar.get("metrics")
        return TrainingRun.from_json(recorded) if recorded else None


@dataclass(frozen=True)
class PolicySpec:
    """The config sections that decide a built-in policy's weights: what it is (model), what it
    learns from (data), how (flow, train). Library functions take this, not the whole config."""

    model: Any
    data: Any
    flow: Any
    train: Any

    @classmethod
    def of(cls, cfg: PolicyJobSettings | DictConfig) -> "PolicySpec":
        """From a job's typed config, or a composed config (a test's, a notebook's)."""
        return cls(cfg.model, cfg.data, cfg.flow, cfg.train)


def prepare_data(
    data_cfg: Any, cache_dir: str, progress: Optional[Callable[[int, int, str], None]] = None
) -> PolicyData:
    """The data component (`data._target_`) loaded -- recorded or read from its cache -- with its anchors."""
    source = instantiate(data_cfg)
    demos, built = source.load(cache_dir, progress)
    anchors = build_anchors(demos, int(source.horizon))
    return PolicyData(demos, anchors, built)


def build_model(spec: PolicySpec, data: PolicyData) -> torch.nn.Module:
    torch.manual_seed(int(spec.train.seed))  # initial weights are part of the config
    demos = data.demonstrations
    try:
        model = instantiate(
            spec.model,
            vocab=data.vocabulary,
            obs_dim=int(demos.observations.shape[1]),  # from the data: the built-in recorder's or a LeRobot dataset's
            action_dim=int(demos.actions.shape[1]),
            horizon=int(data.anchors.horizon),
        )
    except InstantiationException as error:
        if isinstance(error.__cause__, UserInputError):  # the model's own one-line input error, as it is
            raise error.__cause__ from None
        raise
    check_policy(model, str(spec.model.get("_target_", type(model).__name__)))
    check_cameras(model, data)
    if hasattr(model, "set_observation_statistics"):
        obs = torch.from_numpy(data.demonstrations.observations)
        model.set_observation_statistics(obs.mean(0), obs.std(0))
    if hasattr(model, "set_keypoint_statistics") and data.demonstrations.cameras:
        # Evenly spaced training anchors' frames, in eval mode (no augmentation): the same images for a config.
        index = np.unique(np.linspace(0, len(data.anchors) - 1, KEYPOINT_STATISTICS_IMAGES).astype(np.int64))
        images = anchor_frames(data.anchors, index, int(getattr(model, "history", 1) or 1))
        was_training = model.training
        model.eval()
        model.set_keypoint_statistics({k: torch.from_numpy(v) for k, v in images.items()})
        model.train(was_training)
    return model


def check_cameras(model: torch.nn.Module, data: PolicyData) -> None:
    """Refuse, in one line, a policy that reads a camera the data does not have."""
    have = sorted(data.demonstrations.cameras or {})
    for camera in getattr(model, "cameras", None) or ():
        require(
            camera in have,
            f"model.cameras names {camera}, which the data does not have (its cameras: {', '.join(have) or 'none'}); "
            "record it (data=metaworld data.cameras=[corner]), read it (data=lerobot data.camera_features=[...]) "
            "or set model.cameras to one of the data's",
        )


def weight_train_settings(train: Any) -> Dict[str, Any]:
    """The train settings the trained weights depend on, as the checkpoint key sees them."""
    return _without_later_keys(
        {k: v for k, v in to_plain(train).items() if k not in NON_WEIGHT_TRAIN_KEYS}, LATER_TRAIN_KEYS
    )


def weight_model_settings(model: Any) -> Dict[str, Any]:
    """The model section as the checkpoint key sees it."""
    return _without_later_keys(dict(to_plain(model)), LATER_MODEL_KEYS)


def _without_later_keys(out: Dict[str, Any], later: Dict[str, Any]) -> Dict[str, Any]:
    for switch, (before, uses) in later.items():
        if str(out.get(switch, before)) in (before, "[]"):
            for key in (switch, *uses):
                out.pop(key, None)
    return out


def checkpoint_key(spec: PolicySpec, data: PolicyData) -> str:
    train = weight_train_settings(spec.train)
    return sha256_json(
        {
            "data_manifest": data.demonstrations.manifest_sha256,
            "horizon": int(data.anchors.horizon),
            "model": weight_model_settings(spec.model),
            "flow": to_plain(spec.flow),
            "train": train,
            "torch": torch.__version__.split("+")[0],
        }
    )


def sidecar_for(spec: PolicySpec, data: PolicyData, metrics: TrainingRun) -> TrainingRecord:
    return {
        "config": {name: to_plain(getattr(spec, name)) for name in ("data", "model", "flow", "train")},
        "manifest_sha256": data.demonstrations.manifest_sha256,
        "seed": int(spec.train.seed),
        "vocab": data.vocabulary,
        "metrics": metrics.to_json(),
    }


def train_and_save(
    spec: PolicySpec,
    data: PolicyData,
    path: Path,
    progress: Optional[Callable[[int, float], None]] = None,
    extras: Optional[Callable[[torch.nn.Module], TrainingExtras]] = None,
    resume_file: Optional[Path] = None,
) -> PolicyHandle:
    """Build the model (from train.init_from's weights when given), train it and save it. `extras`
    makes a comparison's additions from the model training starts from (job=train); `resume_file`:
    where the run keeps its state as it goes, and continues from when a killed run left one."""
    model = build_model(spec, data)
    init_from = spec.train.init_from
    if init_from is not None:
        model.load_state_dict(load_policy(spec, data, Path(str(init_from))).model.state_dict(), strict=True)
    made = extras(model) if extras is not None else None
    if resume_file is not None:
        made = dataclasses.replace(
            made or TrainingExtras(), resume_file=resume_file, resume_every_seconds=float(spec.train.resume_every_s)
        )
    metrics = train_policy(data.bind(model, spec.flow), data.anchors, spec.train, progress, made)
    sidecar = save_checkpoint(model, path, sidecar_for(spec, data, metrics))
    return PolicyHandle(model, path, sidecar["sha256"], sidecar, True)


def load_policy(spec: PolicySpec, data: PolicyData, path: Path) -> PolicyHandle:
    state, sidecar, digest = load_state_dict(path)
    model = build_model(spec, data)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError:
        recorded = (sidecar or {}).get("config", {}).get("model")
        was = f"it was trained as model={recorded}" if recorded else "it records no model config"
        raise UserInputError(
            f"checkpoint {path} does not fit model={to_plain(spec.model)} on this data "
            f"({state_dict_mismatch(model.state_dict(), state)}; {was}); use the model and data config it was trained with"
        ) from None
    model.eval()
    return PolicyHandle(model, path, digest, sidecar or {}, False)


def obtain_policy(
    spec: PolicySpec,
    checkpoint: Any,
    cache_dir: str,
    data: PolicyData,
    progress: Optional[Callable[[int, float], None]] = None,
    announce: Optional[Callable[[str], None]] = None,
) -> PolicyHandle:
    """The policy the checkpoint section names: a given file (checkpoint=path), or the built-in one
    for this spec, trained on first use and cached by its key (checkpoint=builtin); `announce` is
    told, before a first-use training starts, what it costs and how to shorten it."""
    if checkpoint.kind == CheckpointKind.path:
        require(checkpoint.path not in (None, "", "???"), "checkpoint=path needs checkpoint.path=<file.pt>")
        return load_policy(spec, data, Path(str(checkpoint.path)))

    def build(folder: Path) -> PolicyHandle:
        if announce is not None:
            announce(first_use_notice(spec, Path(cache_dir)))
        # A killed first-use training continues where it was (the entry folder outlives the process).
        return train_and_save(spec, data, folder / CHECKPOINT_FILE, progress, resume_file=folder / RESUME_FILE)

    handle, _ = get_or_build(
        cache_dir,
        "checkpoints",
        checkpoint_key(spec, data),
        [CHECKPOINT_FILE],
        read=lambda folder: load_policy(spec, data, folder / CHECKPOINT_FILE),
        build=build,
    )
    return handle


def first_use_notice(spec: PolicySpec, cache_root: Path) -> str:
    """The line a first run prints before it trains: what, how long (steps), where it is kept, and
    how to make it shorter."""
    model = str(spec.model.get("_target_", "the model")).rsplit(".", 1)[-1]
    return (
        f"training the built-in {model} for {int(spec.train.steps):,} steps on first use (once: the checkpoint "
        f"is cached under {cache_root}/checkpoints/ and reused by every later run with this data, model, flow and "
        "train config); for a quick try, shorten it with train.steps=500, or use a small preset such as "
        "model=tiny_vla_small"
    )
