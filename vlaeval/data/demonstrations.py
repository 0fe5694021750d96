"""The demonstrations container every data source fills and every job reads: flat step arrays, the
episodes' bounds, tasks and instructions, a manifest whose content digest names the data, and the
camera features kept encoded until a batch decodes them. Built-in (vlaeval/data/metaworld.py) or
read from a LeRobotDataset (vlaeval/data/lerobot.py), it is the same object: no simulator here."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from vlaeval.data.cameras import CameraFrames


@dataclass
class Demonstrations:
    """Flat step arrays; episode e covers steps episode_start[e] : episode_start[e] + episode_length[e]."""

    observations: np.ndarray  # float32 (steps, 39)
    actions: np.ndarray  # float32 (steps, 4), the clean expert action at each visited state
    episode_start: np.ndarray  # int64 (episodes,)
    episode_length: np.ndarray  # int64 (episodes,)
    episode_task: np.ndarray  # int64 (episodes,) index into tasks
    episode_success: np.ndarray  # bool (episodes,)
    episode_variant: np.ndarray  # int64 (episodes,)
    episode_seed: np.ndarray  # int64 (episodes,)
    tasks: List[str]
    instructions: List[str]
    manifest: Dict[str, Any]
    # Optional, for data from elsewhere (a LeRobotDataset): None when trivially derived (and then
    # left out of the content digest, so the built-in data's digest is unchanged).
    frame_task: Optional[np.ndarray] = None  # int64 (steps,) task per frame, when it changes within an episode
    episode_index: Optional[np.ndarray] = None  # int64 (episodes,) the dataset's own episode ids, when not 0..E-1
    # Camera features by name ("observation.images.<camera>"): kept encoded -- image bytes, video
    # files or the recorder's raw frames (vlaeval/data/cameras.py) -- and decoded only for the
    # steps a batch uses. Their digest is part of the content digest.
    cameras: Optional[Dict[str, CameraFrames]] = None

    def decode_cameras(self, steps: np.ndarray) -> Dict[str, np.ndarray]:
        """{feature: uint8 (len(steps), 3, height, width)} for the given flat steps (the policy's layout)."""
        return {name: frames.decode(np.asarray(steps)) for name, frames in (self.cameras or {}).items()}

    def episode_ids(self) -> np.ndarray:
        return np.arange(self.episode_length.size) if self.episode_index is None else self.episode_index

    def frame_tasks(self) -> np.ndarray:
        if self.frame_task is not None:
            return self.frame_task
        return np.repeat(self.episode_task, self.episode_length)

    def trajectory_id(self, e: int) -> str:
        """A readable name of episode position e: the built-in scene and seed, or the dataset's episode id."""
        task = self.tasks[int(self.episode_task[e])]
        if int(self.episode_variant[e]) >= 0:
            return f"{task}/variant-{int(self.episode_variant[e])}/seed-{int(self.episode_seed[e])}"
        return f"{task}/episode-{int(self.episode_ids()[e])}"

    @property
    def manifest_sha256(self) -> str:
        return self.manifest["content_sha256"]

    @property
    def name(self) -> str:
        return self.manifest["name"]

    def arrays(self) -> Dict[str, np.ndarray]:
        optional = {k: getattr(self, k) for k in ("frame_task", "episode_index") if getattr(self, k) is not None}
        return optional | {
            k: getattr(self, k)
            for k in (
                "observations",
                "actions",
                "episode_start",
                "episode_length",
                "episode_task",
                "episode_success",
                "episode_variant",
                "episode_seed",
            )
        }


def content_sha256(arrays: Mapping[str, np.ndarray], tasks: Sequence[str], instructions: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    digest.update(json.dumps({"tasks": list(tasks), "instructions": list(instructions)}).encode())
    return digest.hexdigest()
