"""The embedded default: demonstrations -> anchors -> tiny VLA, trained on first use and cached by
config hash, or loaded from a given checkpoint (`checkpoint=path checkpoint.path=...`)."""

from __future__ import annotations

import fcntl
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from vlaeval.artifacts import sha256_json
from vlaeval.config import UserInputError, require, to_plain
from vlaeval.data.anchors import AnchorSet, build_anchors
from vlaeval.data.metaworld import ACTION_DIM, OBS_DIM, Demonstrations, load_or_build_demonstrations
from vlaeval.policy.checkpoint import load_state_dict, save_checkpoint
from vlaeval.policy.tiny_vla import bag_of_words, vocabulary
from vlaeval.policy.training import train_policy

# Training settings that do not change the trained weights (left out of the cache key).
log = logging.getLogger(__name__)

NON_WEIGHT_TRAIN_KEYS = ("log_every", "evaluate_after")


@dataclass
class PolicyData:
    demonstrations: Demonstrations
    anchors: AnchorSet
    instruction_table: torch.Tensor  # (tasks, vocab) bag-of-words per task
    built_now: bool


@dataclass
class PolicyHandle:
    model: torch.nn.Module
    path: Path
    sha256: str
    sidecar: Dict[str, Any]
    trained_now: bool


def prepare_data(cfg: DictConfig, progress: Optional[Callable[[int, int, str], None]] = None) -> PolicyData:
    demos, built = load_or_build_demonstrations(cfg.data, cfg.paths.cache_dir, progress)
    anchors = build_anchors(demos, int(cfg.data.horizon))
    table = bag_of_words(demos.instructions, vocabulary(demos.instructions))
    return PolicyData(demos, anchors, table, built)


def build_model(cfg: DictConfig, data: PolicyData) -> torch.nn.Module:
    torch.manual_seed(int(cfg.train.seed))  # initial weights are part of the config
    model = instantiate(cfg.model, vocab=vocabulary(data.demonstrations.instructions), obs_dim=OBS_DIM,
                        action_dim=ACTION_DIM, horizon=int(cfg.data.horizon))
    if hasattr(model, "set_observation_statistics"):
        obs = torch.from_numpy(data.demonstrations.observations)
        model.set_observation_statistics(obs.mean(0), obs.std(0))
    return model


def checkpoint_key(cfg: DictConfig, data: PolicyData) -> str:
    plain = to_plain(cfg)
    train = {k: v for k, v in plain["train"].items() if k not in NON_WEIGHT_TRAIN_KEYS}
    return sha256_json({"data_manifest": data.demonstrations.manifest_sha256, "horizon": plain["data"]["horizon"],
                        "model": plain["model"], "flow": plain["flow"], "train": train,
                        "torch": torch.__version__.split("+")[0]})


def sidecar_for(cfg: DictConfig, data: PolicyData, metrics: Dict[str, Any]) -> Dict[str, Any]:
    plain = to_plain(cfg)
    return {"config": {k: plain[k] for k in ("data", "model", "flow", "train")},
            "manifest_sha256": data.demonstrations.manifest_sha256, "seed": int(cfg.train.seed),
            "vocab": vocabulary(data.demonstrations.instructions), "metrics": metrics}


def train_and_save(cfg: DictConfig, data: PolicyData, path: Path,
                   progress: Optional[Callable[[int, float], None]] = None) -> PolicyHandle:
    model = build_model(cfg, data)
    metrics = train_policy(model, data.anchors, data.instruction_table, cfg.train, cfg.flow, progress)
    sidecar = save_checkpoint(model, path, sidecar_for(cfg, data, metrics))
    return PolicyHandle(model, path, sidecar["sha256"], sidecar, True)


def load_policy(cfg: DictConfig, data: PolicyData, path: Path) -> PolicyHandle:
    state, sidecar, digest = load_state_dict(path)
    model = build_model(cfg, data)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise UserInputError(f"checkpoint {path} does not fit model={cfg.model._target_} on this data "
                             f"({str(error).splitlines()[0][:160]}); use the model/data config it was trained with") from None
    model.eval()
    return PolicyHandle(model, path, digest, sidecar or {}, False)


def obtain_policy(cfg: DictConfig, data: PolicyData,
                  progress: Optional[Callable[[int, float], None]] = None) -> PolicyHandle:
    kind = str(cfg.checkpoint.kind)
    require(kind in ("builtin", "path"), f"checkpoint.kind={kind!r} must be 'builtin' or 'path'")
    if kind == "path":
        require(cfg.checkpoint.path not in (None, "", "???"), "checkpoint=path needs checkpoint.path=<file.pt>")
        return load_policy(cfg, data, Path(str(cfg.checkpoint.path)))
    folder = Path(cfg.paths.cache_dir) / "checkpoints" / checkpoint_key(cfg, data)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.pt"
    with open(folder / ".lock", "w") as lock:  # parallel jobs: one trains, the others wait and load
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            try:
                return load_policy(cfg, data, path)
            except UserInputError as error:  # a corrupt cached checkpoint is reported and retrained
                log.warning("cached checkpoint rejected, retraining it: %s", error)
        return train_and_save(cfg, data, path, progress)
