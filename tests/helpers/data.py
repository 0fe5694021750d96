"""Small hand-made data for tests that need anchors but not a recorded dataset."""

from __future__ import annotations

import numpy as np

from vlaeval.data.anchors import AnchorSet, build_anchors
from vlaeval.data.demonstrations import Demonstrations


def fake_anchors(seed: int = 0, horizon: int = 4) -> AnchorSet:
    """Four episodes of two tasks ("open the drawer", "close the drawer"), 6-D observations, 3-D actions."""
    rng = np.random.default_rng(seed)
    lengths = np.array([9, 7, 11, 5])
    steps = int(lengths.sum())
    demos = Demonstrations(
        observations=rng.standard_normal((steps, 6)).astype(np.float32),
        actions=rng.uniform(-1, 1, (steps, 3)).astype(np.float32),
        episode_start=np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64),
        episode_length=lengths.astype(np.int64),
        episode_task=np.array([0, 1, 0, 1]),
        episode_success=np.ones(4, dtype=bool),
        episode_variant=np.arange(4),
        episode_seed=np.arange(4),
        tasks=["open", "close"],
        instructions=["open the drawer", "close the drawer"],
        manifest={"content_sha256": "0" * 64, "name": "fake"},
    )
    return build_anchors(demos, horizon)
