"""The lockstep rollout engine: one batched policy call per control step for every episode that
needs a chunk, groups of episodes over worker processes; the numbers depend on the groups only."""

from __future__ import annotations

import torch

from vlaeval.config import FlowConfig
from vlaeval.envs.episodes import Episode
from vlaeval.policy.bound import bind_policy
from vlaeval.policy.tiny_vla import TinyVLA
from vlaeval.rollouts.engine import rollout_episodes

EPISODES = [Episode(task, i, 25 + k, 1000 * i + k) for i, task in enumerate(("reach-v3", "push-v3")) for k in range(3)]


def policy():
    torch.manual_seed(0)
    return TinyVLA(["reach", "push"], 39, 4, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2)


def test_workers_change_the_speed_not_the_outcomes():
    bound = bind_policy(policy(), ["reach", "push"], FlowConfig(sampling_steps=3))
    kwargs = dict(execute_actions=2, max_steps=12, group_size=2)
    done = []
    one = rollout_episodes(bound, EPISODES, workers=1, progress=lambda d, n: done.append((d, n)), **kwargs)
    two = rollout_episodes(bound, EPISODES, workers=2, **kwargs)
    again = rollout_episodes(bound, EPISODES, workers=1, **kwargs)
    assert list(one) == list(two) == list(again)  # every episode's outcome (success, unsafe, steps)
    assert one.steps.shape == (6,) and int(one.steps.max()) <= 12 and int(one.steps.min()) >= 1
    assert done == [(2, 6), (4, 6), (6, 6)]  # progress after each group
    assert torch.get_num_threads() >= 1  # the single-threaded section restored the setting


def test_an_evaluation_is_written_as_paired_outcomes_the_gauntlet_reads(tmp_path):
    import json

    import pandas as pd

    from helpers.processes import run_main

    env = {"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")}
    small = ["data=tiny", "model=tiny_vla_small", "train.steps=20", "train.batch_size=32", "tracking=disabled"]
    proc = run_main(
        [
            "job=evaluate",
            *small,
            "evaluate.episodes_per_task=3",
            "evaluate.max_steps=25",
            f"hydra.run.dir={tmp_path / 'e'}",
        ],
        tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "e" / "result.json").read_text())
    table = pd.read_csv(tmp_path / "e" / "paired_outcomes.csv")
    assert list(table.columns) == ["stratum", "scenario_id", "cluster_id", "baseline", "candidate"]
    assert len(table) == 6 and set(table["stratum"]) == {"distribution_shift"}
    episodes = result["evaluation"]["episodes"]
    assert table["candidate"].tolist() == [int(e["policy"]) for e in episodes]
    assert table["baseline"].tolist() == [int(e["expert"]) for e in episodes]
    assert table["cluster_id"].tolist() == [f"{e['task']}/variant-{e['variant']}" for e in episodes]
    gauntlet = run_main(
        [
            "job=gauntlet",
            "outcomes=file",
            f"outcomes.path={tmp_path / 'e' / 'paired_outcomes.csv'}",
            "gauntlet.plot=false",
            "tracking=disabled",
            f"hydra.run.dir={tmp_path / 'g'}",
        ],
        tmp_path,
        env=env,
    )
    assert gauntlet.returncode == 0, gauntlet.stderr[-3000:]
    report = json.loads((tmp_path / "g" / "result.json").read_text())
    [stratum] = report["strata"]
    assert stratum["stratum"] == "distribution_shift" and stratum["units_available"] == 6
