"""Anchors -- (task, trajectory, step) with the next H expert actions as the target chunk -- and a
seeded sampler whose order depends only on (manifest sha256, epoch, draw id).

Each drawn example carries its sampling trace, the identity the residual audit checks when it
recovers the anchors of a gradient artifact in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.data.demonstrations import Demonstrations

TRACE_FIELDS = (
    "manifest_sha256",
    "epoch",
    "global_draw_id",
    "dataset_index",
    "dataset_name",
    "trajectory_index",
    "trajectory_id",
    "anchor_index",
    "base_index",
)


@dataclass
class AnchorSet:
    observations: np.ndarray  # float32 (N, obs_dim)
    task_index: np.ndarray  # int64 (N,)
    target_actions: np.ndarray  # float32 (N, H, action_dim), padded past the episode end
    target_mask: np.ndarray  # bool (N, H): False where the chunk runs past the episode end
    trajectory_index: np.ndarray  # int64 (N,)
    anchor_index: np.ndarray  # int64 (N,) step within the trajectory
    base_index: np.ndarray  # int64 (N,) flat step index in the demonstrations
    demonstrations: Demonstrations
    horizon: int

    def __len__(self) -> int:
        return int(self.observations.shape[0])

    def trace(self, anchor: int, epoch: int, global_draw_id: int, dataset_index: int = 0) -> Dict[str, Any]:
        demos = self.demonstrations
        e = int(self.trajectory_index[anchor])
        return {
            "manifest_sha256": demos.manifest_sha256,
            "epoch": int(epoch),
            "global_draw_id": int(global_draw_id),
            "dataset_index": int(dataset_index),
            "dataset_name": demos.name,
            "trajectory_index": e,
            "trajectory_id": demos.trajectory_id(e),
            "anchor_index": int(self.anchor_index[anchor]),
            "base_index": int(self.base_index[anchor]),
        }


def build_anchors(demos: Demonstrations, horizon: int) -> AnchorSet:
    """Every recorded step is an anchor; its target is the next `horizon` expert actions, the
    tail past the episode end padded with the last action and masked out."""
    lengths, starts = demos.episode_length, demos.episode_start
    trajectory = np.repeat(np.arange(lengths.size), lengths)
    step = np.arange(lengths.sum()) - np.repeat(starts, lengths)
    ends = np.repeat(starts + lengths, lengths)  # one past each anchor's last step
    offsets = np.arange(horizon)
    raw = np.arange(lengths.sum())[:, None] + offsets[None, :]
    mask = raw < ends[:, None]
    index = np.minimum(raw, ends[:, None] - 1)
    return AnchorSet(
        observations=demos.observations,
        task_index=demos.frame_tasks(),
        target_actions=demos.actions[index],
        target_mask=mask,
        trajectory_index=trajectory,
        anchor_index=step,
        base_index=np.arange(lengths.sum()),
        demonstrations=demos,
        horizon=int(horizon),
    )


def sample_order(manifest_sha256: str, epoch: int, n: int) -> np.ndarray:
    """The anchor order of one epoch: a permutation seeded by a digest of (manifest, epoch)."""
    return np.random.default_rng(stable_seed("sampler", manifest_sha256, int(epoch))).permutation(n)


def draw(anchors: AnchorSet, count: int, epoch: int = 0) -> tuple[np.ndarray, List[Dict[str, Any]]]:
    """The first `count` anchors of an epoch's order, with their sampling traces."""
    n = len(anchors)
    count = min(int(count), n)
    order = sample_order(anchors.demonstrations.manifest_sha256, epoch, n)[:count]
    traces = [anchors.trace(int(a), epoch, epoch * n + position) for position, a in enumerate(order)]
    return order, traces
