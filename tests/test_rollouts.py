"""The lockstep rollout engine: one batched policy call per control step for every episode that
needs a chunk, groups of episodes over worker processes; the numbers depend on the groups only."""

from __future__ import annotations

import numpy as np
import torch

from vlaeval.config import FlowConfig
from vlaeval.policy.rollout import Episode, rollout_episodes
from vlaeval.policy.tiny_vla import TinyVLA

EPISODES = [Episode(task, i, 25 + k, 1000 * i + k) for i, task in enumerate(("reach-v3", "push-v3")) for k in range(3)]


def policy():
    torch.manual_seed(0)
    return TinyVLA(["reach", "push"], 39, 4, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2)


def test_workers_change_the_speed_not_the_outcomes():
    model, table, flow = policy(), torch.eye(2), FlowConfig(sampling_steps=3)
    kwargs = dict(execute_actions=2, max_steps=12, group_size=2)
    done = []
    one = rollout_episodes(model, EPISODES, table, flow, workers=1, progress=lambda d, n: done.append((d, n)), **kwargs)
    two = rollout_episodes(model, EPISODES, table, flow, workers=2, **kwargs)
    again = rollout_episodes(model, EPISODES, table, flow, workers=1, **kwargs)
    for key in ("success", "steps"):
        assert np.array_equal(one[key], two[key]) and np.array_equal(one[key], again[key])
    assert one["steps"].shape == (6,) and int(one["steps"].max()) <= 12 and int(one["steps"].min()) >= 1
    assert done == [(2, 6), (4, 6), (6, 6)]  # progress after each group
    assert torch.get_num_threads() >= 1  # the single-threaded section restored the setting
