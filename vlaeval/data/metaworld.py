"""Expert demonstrations recorded from Meta-World's bundled scripted policies (MuJoCo, CPU, offline).

Each episode is seeded: its scene is a task variant (`MT1(task).train_tasks[i]`; Meta-World 3.1
ignores the seed passed to reset) and the expert's actions are perturbed by seeded Gaussian noise
while the clean expert action is recorded as the label (so the data covers states off the
expert's own path). Training episodes use the first half of the 50 variants, held-out
evaluation episodes the second half. `train_families` adds the first half of other variant
families (`MT1(task, seed=family)`: 50 other goal and object placements each) to the training
scenes; a scene is then stored as its index 50 * family + variant. `scenes=held_out` records the
same plan on the held-out variants instead (the ablation's held-out loss). Arrays plus a manifest
whose sha256 covers their content are cached under <cache>/demonstrations/<config hash>/.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import AbstractSet, Any, Callable, Dict, List, Mapping, Optional, Sequence, cast

import numpy as np

from vlaeval.artifacts import atomic_write_json, atomic_write_npz, read_json, sha256_json, stable_seed
from vlaeval.data.cameras import CameraFrames, FrameArray
from vlaeval.data.demonstrations import Demonstrations, content_sha256
from vlaeval.envs.metaworld import (
    ACTION_DIM,
    SCENE_SPLITS,
    EpisodeRunner,
    episode_plan,
    instruction_for,
    known_tasks,
)
from vlaeval.envs.rendering import METAWORLD_CAMERAS, RENDERER_VERSION, camera_key
from vlaeval.errors import UserInputError, require, require_at_least
from vlaeval.store import get_or_build

log = logging.getLogger(__name__)

ARRAYS_FILE, MANIFEST_FILE = "arrays.npz", "manifest.json"  # a built dataset in its store entry
DATASET_SCHEMA_VERSION = 1
# Easy tasks mixed with ones whose scripted experts themselves fail now and then, so that
# evaluations can tell two policies apart (here: the data component's signature default is read statically).
DEFAULT_TASKS = ("reach-v3", "push-v3", "pick-place-v3", "peg-insert-side-v3", "disassemble-v3", "stick-pull-v3")


def validate_data_config(data: Any) -> None:
    require(len(data.tasks) > 0, "data.tasks is empty; list Meta-World tasks, e.g. data.tasks=[reach-v3,push-v3]")
    require(len(set(data.tasks)) == len(data.tasks), f"data.tasks lists a task twice: {list(data.tasks)}")
    known = set(known_tasks())
    for task in data.tasks:
        if task not in known:
            close = sorted(known, key=lambda k: (_distance(k, task), k))[:3]  # ties by name: same text in every process
            raise UserInputError(f"data.tasks: unknown Meta-World task {task!r}; did you mean {', '.join(close)}?")
    require_at_least("data.episodes_per_task", data.episodes_per_task, 1)
    require(data.max_steps >= 2, f"data.max_steps={data.max_steps} must be >= 2")
    require(data.action_noise >= 0.0, f"data.action_noise={data.action_noise} must be >= 0")
    require(data.horizon >= 1, f"data.horizon={data.horizon} must be >= 1 (the action chunk length H)")
    families = list(getattr(data, "train_families", [0]))
    require(
        len(families) > 0 and all(int(f) >= 0 for f in families) and len(set(families)) == len(families),
        f"data.train_families={families} must list distinct variant families (MT1 benchmark seeds) >= 0, e.g. [0, 2, 3]",
    )
    scenes = str(getattr(data, "scenes", "train"))
    require(scenes in SCENE_SPLITS, f"data.scenes={scenes!r} must be one of {', '.join(SCENE_SPLITS)}")
    cameras = [str(c) for c in getattr(data, "cameras", ())]
    for camera in cameras:
        require(
            camera in METAWORLD_CAMERAS,
            f"data.cameras: {camera!r} is not a Meta-World camera; choose from {', '.join(METAWORLD_CAMERAS)}",
        )
    require(len(set(cameras)) == len(cameras), f"data.cameras lists a camera twice: {cameras}")
    fraction = float(getattr(data, "noisy_label_fraction", 0.0))
    require(
        0.0 <= fraction <= 1.0,
        f"data.noisy_label_fraction={fraction} must be between 0 and 1 (the share of episodes with jittery labels)",
    )
    require(
        float(getattr(data, "label_noise", 0.0)) >= 0.0,
        f"data.label_noise={getattr(data, 'label_noise', 0.0)} must be >= 0 (the jitter's SD, in action units)",
    )
    size = int(getattr(data, "image_size", 64))
    require(8 <= size <= 512, f"data.image_size={size} must be between 8 and 512 pixels")


def _distance(a: str, b: str) -> int:
    """Levenshtein distance, for 'did you mean'."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def record_episode(
    runner: EpisodeRunner,
    task: str,
    variant: int,
    seed: int,
    max_steps: int,
    action_noise: float,
    label_noise: float = 0.0,
) -> Dict[str, Any]:
    """One expert episode. The label is the clean expert action, unless `label_noise` > 0: then the
    episode is a jittery operator's, whose recorded (and executed) command is the expert's plus
    Gaussian jitter of that SD -- noise no policy can learn, so its anchors keep a high loss and
    large gradients however long a policy trains."""
    env, obs = runner.env(task, variant)
    expert = runner.expert(task)
    rng = np.random.default_rng(seed)
    jitter = np.random.default_rng(stable_seed("label-noise", seed))  # its own stream: clean episodes keep theirs
    observations, actions, success = [], [], False
    images: Dict[str, List[np.ndarray]] = {camera_key(c): [] for c in runner.cameras}
    for _ in range(max_steps):
        clean = np.clip(expert.get_action(obs), -1.0, 1.0).astype(np.float32)
        if label_noise > 0.0:  # the operator's device reports the command unclipped; the robot clips it
            clean = (clean + label_noise * jitter.standard_normal(ACTION_DIM)).astype(np.float32)
        observations.append(np.asarray(obs, dtype=np.float32))
        actions.append(clean)
        for key, image in runner.images(env).items():  # what the cameras see at this observation
            images[key].append(image)
        executed = np.clip(clean + action_noise * rng.standard_normal(ACTION_DIM), -1.0, 1.0)
        obs, _, terminated, truncated, info = env.step(executed)
        if info.get("success"):
            success = True
            break
        if terminated or truncated:
            break
    return {
        "observations": np.stack(observations),
        "actions": np.stack(actions),
        "success": success,
        "images": {key: np.stack(frames) for key, frames in images.items()},
    }


def build_demonstrations(data: Any, progress: Optional[Callable[[int, int, str], None]] = None) -> Demonstrations:
    tasks = list(data.tasks)
    families = [int(f) for f in getattr(data, "train_families", (0,))]
    plan = episode_plan(
        tasks,
        int(data.episodes_per_task),
        int(data.seed),
        SCENE_SPLITS[str(getattr(data, "scenes", "train"))],
        families,
    )
    runner = EpisodeRunner(getattr(data, "cameras", ()), int(getattr(data, "image_size", 64)))
    jittery = jittery_episodes(len(plan), float(getattr(data, "noisy_label_fraction", 0.0)), int(data.seed))
    label_noise = float(getattr(data, "label_noise", 0.0))
    episodes = []
    try:
        for i, ep in enumerate(plan):
            episodes.append(
                record_episode(
                    runner,
                    ep["task"],
                    ep["variant"],
                    ep["seed"],
                    int(data.max_steps),
                    float(data.action_noise),
                    label_noise if i in jittery else 0.0,
                )
            )
            if progress is not None:
                progress(i + 1, len(plan), ep["task"])
    finally:
        runner.close()
    lengths = np.array([len(e["actions"]) for e in episodes], dtype=np.int64)
    arrays: Dict[str, np.ndarray] = {
        "observations": np.concatenate([e["observations"] for e in episodes]).astype(np.float32),
        "actions": np.concatenate([e["actions"] for e in episodes]).astype(np.float32),
        "episode_start": np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64),
        "episode_length": lengths,
        "episode_task": np.array([ep["task_index"] for ep in plan], dtype=np.int64),
        "episode_success": np.array([e["success"] for e in episodes], dtype=bool),
        "episode_variant": np.array([ep["variant"] for ep in plan], dtype=np.int64),
        "episode_seed": np.array([ep["seed"] for ep in plan], dtype=np.int64),
    }
    cameras: Dict[str, CameraFrames] = {
        camera_key(c): FrameArray(camera_key(c), np.concatenate([e["images"][camera_key(c)] for e in episodes]))
        for c in runner.cameras
    }
    instructions = [instruction_for(t) for t in tasks]
    manifest = {
        "schema_version": DATASET_SCHEMA_VERSION,
        "name": str(data.name),
        "tasks": tasks,
        "instructions": instructions,
        "episodes": len(plan),
        "steps": int(lengths.sum()),
        "expert_success_rate": float(arrays["episode_success"].mean()),
        **({"jittery_episodes": sorted(jittery)} if jittery else {}),  # positions, for checking what a score finds
        "config": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in _data_fields(data).items()},
        "cameras": sorted(cameras),
        "content_sha256": content_sha256(arrays | camera_arrays(cameras), tasks, instructions),
    }
    return Demonstrations(
        **cast(Dict[str, Any], arrays),
        tasks=tasks,
        instructions=instructions,
        manifest=manifest,
        cameras=cameras or None,
    )


def jittery_episodes(episodes: int, fraction: float, seed: int) -> AbstractSet[int]:
    """Which of the plan's episodes a jittery operator recorded: round(fraction x episodes) of them
    (at least one when the fraction is positive), drawn by a digest of the data seed."""
    if fraction <= 0.0:
        return frozenset()
    count = max(1, int(round(fraction * episodes)))
    rng = np.random.default_rng(stable_seed("jittery-episodes", seed))
    return frozenset(int(i) for i in rng.choice(episodes, size=count, replace=False))


CAMERA_ARRAY = "camera:"  # a camera's frames in the cached arrays: "camera:observation.images.<name>"


def camera_arrays(cameras: Mapping[str, CameraFrames]) -> Dict[str, np.ndarray]:
    """The recorder's raw frames as arrays of the cache (and of the content digest)."""
    return {CAMERA_ARRAY + key: cast(FrameArray, frames).pixels for key, frames in cameras.items()}


def _data_fields(data: Any) -> Dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    plain = (
        cast(Dict[str, Any], OmegaConf.to_container(data, resolve=True))
        if isinstance(data, DictConfig)
        else dict(vars(data))
    )
    # The horizon shapes anchors, not episodes: it does not change the recorded data. The default
    # train_families=[0] is left out so that data recorded before the setting existed stays cached.
    out = {k: v for k, v in plain.items() if k not in ("horizon",)}
    if list(out.get("train_families", [0])) == [0]:
        out.pop("train_families", None)
    if not out.get("noisy_label_fraction") or not out.get("label_noise"):  # and data with clean labels
        out.pop("noisy_label_fraction", None)
        out.pop("label_noise", None)
    if out.get("scenes", "train") == "train":  # likewise the default split
        out.pop("scenes", None)
    if not out.get("cameras"):  # and data without cameras
        out.pop("cameras", None)
        out.pop("image_size", None)
    else:  # what the renderer draws decides the frames (full meshes before version 2)
        out["renderer"] = RENDERER_VERSION
    return out


def dataset_key(data: Any) -> str:
    import metaworld

    return sha256_json(
        {
            "schema": DATASET_SCHEMA_VERSION,
            "config": _data_fields(data),
            "metaworld": getattr(metaworld, "__version__", "unknown"),
        }
    )


class MetaWorldDemonstrations:
    """data=metaworld: expert episodes recorded from Meta-World's scripted policies, cached by the
    settings that decide them (every setting but the horizon). `load` returns the demonstrations;
    horizon is the length H of the target action chunk the anchors carry."""

    def __init__(
        self,
        tasks: Sequence[str] = DEFAULT_TASKS,
        episodes_per_task: int = 12,
        max_steps: int = 150,
        action_noise: float = 0.1,
        seed: int = 0,
        horizon: int = 4,
        name: str = "metaworld",
        train_families: Sequence[int] = (0,),
        scenes: str = "train",
        cameras: Sequence[str] = (),
        image_size: int = 64,
        noisy_label_fraction: float = 0.0,
        label_noise: float = 0.0,
    ) -> None:
        self.name = str(name)
        self.tasks = [str(t) for t in tasks]
        self.episodes_per_task = int(episodes_per_task)
        self.max_steps = int(max_steps)
        self.action_noise = float(action_noise)
        self.seed = int(seed)
        self.horizon = int(horizon)
        self.train_families = [int(f) for f in train_families]
        self.scenes = str(scenes)  # train: the training variants; held_out: the evaluation ones
        # Meta-World cameras recorded at each step (METAWORLD_CAMERAS), square images of image_size
        # pixels; each becomes the feature observation.images.<camera>.
        self.cameras = [str(c) for c in cameras]
        self.image_size = int(image_size)
        # Mixed-quality demonstrations: this fraction of the episodes recorded by a jittery operator
        # whose commands carry Gaussian noise of SD label_noise (the gate's positive control,
        # data=metaworld_jittery; docs/audit.md).
        self.noisy_label_fraction = float(noisy_label_fraction)
        self.label_noise = float(label_noise)

    def validate(self) -> None:
        validate_data_config(self)

    def load(
        self, cache_dir: str | os.PathLike, progress: Optional[Callable[[int, int, str], None]] = None
    ) -> tuple[Demonstrations, bool]:
        return load_or_build_demonstrations(self, cache_dir, progress)


def load_or_build_demonstrations(
    data: Any, cache_dir: str | os.PathLike, progress: Optional[Callable[[int, int, str], None]] = None
) -> tuple[Demonstrations, bool]:
    """(demonstrations, built_now): read the cached build for this config, verified against its
    manifest digest, or build and cache it."""
    validate_data_config(data)

    def read(folder: Path) -> Demonstrations:
        manifest = read_json(folder / MANIFEST_FILE)
        with np.load(folder / ARRAYS_FILE, allow_pickle=False) as stored:
            arrays = {k: stored[k] for k in stored.files}
        if content_sha256(arrays, manifest["tasks"], manifest["instructions"]) != manifest["content_sha256"]:
            raise ValueError("the arrays do not match their manifest's content_sha256")
        cameras = {k[len(CAMERA_ARRAY) :]: arrays.pop(k) for k in list(arrays) if k.startswith(CAMERA_ARRAY)}
        return Demonstrations(
            **arrays,
            tasks=manifest["tasks"],
            instructions=manifest["instructions"],
            manifest=manifest,
            cameras={key: FrameArray(key, pixels) for key, pixels in cameras.items()} or None,
        )

    def build(folder: Path) -> Demonstrations:
        demos = build_demonstrations(data, progress)
        atomic_write_npz(folder / ARRAYS_FILE, demos.arrays() | camera_arrays(demos.cameras or {}))
        atomic_write_json(folder / MANIFEST_FILE, demos.manifest)
        return demos

    return get_or_build(cache_dir, "demonstrations", dataset_key(data), [ARRAYS_FILE, MANIFEST_FILE], read, build)
