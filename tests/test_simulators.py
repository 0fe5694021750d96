"""The simulator door: Meta-World implements vlaeval/envs/protocol.py and is chosen by name; a
simulator of one's own, registered beside it, runs the very rollout engine (lockstep groups,
disturbances, the unsafe-contact monitor, the step limit) with no change to the engine."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest
import torch

from vlaeval.config import FlowConfig
from vlaeval.envs import SIMULATORS, simulator
from vlaeval.envs.episodes import Episode, Perturbation
from vlaeval.envs.protocol import Environments, Simulator, missing_members
from vlaeval.errors import UserInputError
from vlaeval.policy.bound import bind_policy
from vlaeval.policy.tiny_vla import TinyVLA
from vlaeval.rollouts.engine import rollout_lockstep


class PointEnvironments:
    """A point in the plane moved by its action (dx, dy); the goal is the episode's variant on a
    circle; a wall at x = 0.9 is the obstacle (pushing into it is unsafe)."""

    def __init__(self) -> None:
        self.points: List[np.ndarray] = []
        self.goals: List[np.ndarray] = []
        self.limits: List[Any] = []

    def open(self, episode: Episode) -> np.ndarray:
        angle = 2 * np.pi * episode.variant / 10
        self.points.append(np.zeros(2))
        self.goals.append(0.5 * np.array([np.cos(angle), np.sin(angle)]))
        self.limits.append(episode.unsafe_contact_force)
        return self._obs(len(self.points) - 1)

    def _obs(self, k: int) -> np.ndarray:
        return np.concatenate([self.points[k], self.goals[k]]).astype(np.float32)

    def images(self, k: int) -> Dict[str, np.ndarray]:
        return {}

    def step(self, k: int, action: np.ndarray) -> Tuple[np.ndarray, bool, bool]:
        self.points[k] = self.points[k] + 0.5 * np.asarray(action[:2], dtype=np.float64)
        return self._obs(k), bool(np.linalg.norm(self.points[k] - self.goals[k]) < 0.05), False

    def unsafe(self, k: int) -> bool:
        return self.limits[k] is not None and self.points[k][0] > 0.9

    def frame(self, k: int, size: int) -> np.ndarray:
        """The point (white) and its goal (green) seen from above."""
        image = np.zeros((size, size, 3), dtype=np.uint8)
        for where, color in ((self.goals[k], (0, 255, 0)), (self.points[k], (255, 255, 255))):
            x, y = np.clip(((np.asarray(where) + 1) / 2 * (size - 1)).round().astype(int), 0, size - 1)
            image[y, x] = color
        return image

    def close(self) -> None:
        self.points.clear()


class PointSimulator:
    name = "point"
    variants_per_task = 10
    renderer_version = 0
    held_out_variants = range(5, 10)

    def cache_identity(self) -> Dict[str, Any]:
        return {"point": 1}

    def tasks(self) -> List[str]:
        return ["reach-point"]

    def instruction(self, task: str) -> str:
        return "reach the point"

    def episode_plan(
        self, tasks: Sequence[str], episodes_per_task: int, seed: int, variants: range
    ) -> List[Dict[str, Any]]:
        return [{"task": t, "task_index": i, "variant": variants[k % len(variants)], "seed": seed + k}
                for i, t in enumerate(tasks) for k in range(episodes_per_task)]  # fmt: skip

    def environments(self, cameras: Sequence[str] = (), image_size: int = 64) -> PointEnvironments:
        return PointEnvironments()

    def expert_successes(self, episodes: Sequence[Episode], max_steps: int) -> np.ndarray:
        return np.ones(len(episodes), dtype=bool)

    def prepare(self, task: str, family: int) -> bool:
        return False

    def has_bodies(self, task: str, family: int, names: Sequence[str]) -> bool:
        return list(names) == ["wall"]


def test_metaworld_implements_the_protocol_and_an_unknown_name_is_one_line():
    sim = simulator("metaworld")
    assert isinstance(sim, Simulator) and missing_members(sim) == [] and sim is simulator()
    assert "reach-v3" in sim.tasks() and sim.instruction("reach-v3") == "reach the red goal position"
    assert isinstance(sim.environments(), Environments)
    assert missing_members(object()) == ["name", "variants_per_task", "held_out_variants", "renderer_version",
                                         "cache_identity", "tasks", "instruction", "episode_plan", "environments",
                                         "expert_successes", "prepare", "has_bodies"]  # fmt: skip
    with pytest.raises(
        UserInputError, match=r"^simulator=libero is not a registered simulator; choose one of metaworld "
    ):
        simulator("libero")


def test_a_simulator_of_ones_own_runs_the_rollout_engine(monkeypatch):
    import vlaeval.envs

    monkeypatch.setitem(SIMULATORS, "point", (__name__, "PointSimulator"))
    monkeypatch.setattr(vlaeval.envs, "_MADE", {})
    sim = simulator("point")
    torch.manual_seed(0)
    model = TinyVLA(["reach"], 4, 2, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2)
    bound = bind_policy(model, ["reach"], FlowConfig(sampling_steps=3))
    plan = sim.episode_plan(sim.tasks(), 6, 7, sim.held_out_variants)
    episodes = [Episode(p["task"], p["task_index"], p["variant"], p["seed"]) for p in plan]
    episodes[0] = Episode(
        "reach-point", 0, 5, 0, perturbation=Perturbation(action_noise=50.0), unsafe_contact_force=1.0
    )
    out = rollout_lockstep(bound, episodes, execute_actions=2, max_steps=15, simulator=sim)
    again = rollout_lockstep(bound, episodes, execute_actions=2, max_steps=15, simulator=sim)
    assert list(out) == list(again) and len(out) == 6  # the episode's seed decides it, wherever it runs
    assert out.steps.max() <= 15 and out.steps.min() >= 1
    assert not (out.success & out.unsafe).any()
    # The engine used the point simulator's own step and monitor: a wall it pushed through is unsafe.
    assert out.unsafe[0] and not out.unsafe[1:].any()  # only the monitored, shaken episode


def test_the_simulator_is_chosen_by_name_in_the_config_and_the_evaluation_runs_in_it(monkeypatch, tmp_path):
    """`simulator=<name>` is read by every job that runs a policy: an unknown name is one line before
    any work; a registered one is where the held-out evaluation (and its expert, and its episode
    plan) runs, in this process and in forked workers alike."""
    import vlaeval.envs
    from helpers.configs import compose_config
    from vlaeval.config import EvaluateConfig, RolloutConfig
    from vlaeval.jobs import typed_config
    from vlaeval.rollouts.engine import evaluate_closed_loop

    with pytest.raises(UserInputError, match=r"^simulator=libero is not a registered simulator"):
        typed_config(compose_config(["job=evaluate", "simulator=libero"], output_dir=tmp_path), ["simulator=libero"])
    assert typed_config(compose_config(["job=evaluate"], output_dir=tmp_path), []).simulator == "metaworld"
    gauntlet = typed_config(compose_config(["job=gauntlet"], output_dir=tmp_path), [])
    assert gauntlet.simulator is None  # a synthetic gauntlet runs no policy: it is not given the simulator

    monkeypatch.setitem(SIMULATORS, "point", (__name__, "PointSimulator"))
    monkeypatch.setattr(vlaeval.envs, "_MADE", {})
    torch.manual_seed(0)
    model = TinyVLA(["reach"], 4, 2, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2)
    bound = bind_policy(model, ["reach"], FlowConfig(sampling_steps=3))
    evaluate = EvaluateConfig(episodes_per_task=4, max_steps=10, execute_actions=2)
    runs = [
        evaluate_closed_loop(
            bound, ["reach-point"], evaluate, RolloutConfig(workers=w, lockstep_group=2), simulator="point"
        )
        for w in (1, 2)
    ]
    assert runs[0] == runs[1] and len(runs[0].episodes) == 4
    assert [e.variant for e in runs[0].episodes] == [5, 6, 7, 8]  # the point world's plan and variants
    assert runs[0].expert_success_rate == 1.0 and runs[0].held_out_variants == (5, 10)  # its expert and scenes


def test_a_simulator_of_ones_own_is_filmed_through_its_own_view(monkeypatch, tmp_path):
    """A regression video asks the simulator for its view of the scene (Environments.frame): the
    point world is filmed as it draws itself -- the point moves from frame to frame, the goal stays --
    and the side-by-side MP4 is written."""
    import vlaeval.envs
    from vlaeval.rollouts.videos import VIDEO_SIZE, film, regression_video

    monkeypatch.setitem(SIMULATORS, "point", (__name__, "PointSimulator"))
    monkeypatch.setattr(vlaeval.envs, "_MADE", {})
    torch.manual_seed(0)
    model = TinyVLA(["reach"], 4, 2, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2)
    bound = bind_policy(model, ["reach"], FlowConfig(sampling_steps=3))
    episode = Episode("reach-point", 0, 7, 3, perturbation=Perturbation(action_noise=1.0))
    filmed = film(bound, episode, execute_actions=2, max_steps=6, simulator="point")
    assert filmed.frames.shape == (filmed.steps + 1, VIDEO_SIZE, VIDEO_SIZE, 3) and filmed.steps == 6
    white = [tuple(np.argwhere(f.sum(axis=2) == 765)[0]) for f in filmed.frames]
    green = {
        tuple(np.argwhere((f[..., 1] == 255) & (f[..., 0] == 0))[0]) for f in filmed.frames if (f[..., 0] == 0).any()
    }
    assert len(set(white)) > 1 and len(green) == 1  # the point moved; the goal did not
    path = regression_video(
        bound, bound, {"baseline": episode, "candidate": episode}, tmp_path / "v.mp4",
        title="point", instruction="reach the point", execute_actions=2, max_steps=6, simulator="point",
    )  # fmt: skip
    assert path.is_file() and path.stat().st_size > 1000


class PassingEnvironments(PointEnvironments):
    """The point world where the goal is met at the third step only, or, for odd variants, from the
    third step on (a policy that reaches its goal and then leaves it, and one that keeps it); the
    wall is unsafe from the fifth step for variant 8 (an episode that reaches, then breaks something)."""

    def open(self, episode: Episode) -> np.ndarray:
        self.steps = getattr(self, "steps", []) + [0]
        self.variants = getattr(self, "variants", []) + [episode.variant]
        return super().open(episode)

    def step(self, k: int, action: np.ndarray) -> Tuple[np.ndarray, bool, bool]:
        obs, _, ended = super().step(k, action)
        self.steps[k] += 1
        reached = self.steps[k] == 3 or (self.variants[k] % 2 == 1 and self.steps[k] >= 3)
        return obs, reached, ended

    def unsafe(self, k: int) -> bool:
        return self.variants[k] == 8 and self.steps[k] >= 5


class PassingSimulator(PointSimulator):
    name = "passing"

    def environments(self, cameras: Sequence[str] = (), image_size: int = 64) -> PointEnvironments:
        return PassingEnvironments()


def test_run_to_horizon_keeps_any_step_success_and_says_whether_the_goal_held_at_the_end(monkeypatch):
    """Without run_to_horizon an episode ends when the goal is first met; with it every episode runs
    its steps, any-step success is the same, and final_success says whether the goal held at the last
    step -- true where it was kept, false where it was left, and false after an unsafe event."""
    import vlaeval.envs
    from vlaeval.config import EvaluateConfig, RolloutConfig
    from vlaeval.rollouts.engine import evaluate_closed_loop

    monkeypatch.setitem(SIMULATORS, "passing", (__name__, "PassingSimulator"))
    monkeypatch.setattr(vlaeval.envs, "_MADE", {})
    torch.manual_seed(0)
    model = TinyVLA(["reach"], 4, 2, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2)
    bound = bind_policy(model, ["reach"], FlowConfig(sampling_steps=3))
    sim = simulator("passing")
    episodes = [Episode("reach-point", 0, v, v) for v in (5, 6, 7, 8)]
    first = rollout_lockstep(bound, episodes, execute_actions=2, max_steps=8, simulator=sim)
    whole = rollout_lockstep(bound, episodes, execute_actions=2, max_steps=8, simulator=sim, to_horizon=True)
    assert first.final_success is None and list(first.steps) == [3, 3, 3, 3] and first.success.all()
    assert list(whole.success) == [True, True, True, False] and list(whole.unsafe) == [False] * 3 + [True]
    assert list(whole.final_success) == [True, False, True, False]
    assert list(whole.steps) == [8, 8, 8, 5]
    # Through the evaluation: both rates, per task and overall, and the metric.
    evaluate = EvaluateConfig(episodes_per_task=4, max_steps=8, execute_actions=2, run_to_horizon=True)
    run = evaluate_closed_loop(bound, ["reach-point"], evaluate, RolloutConfig(workers=1), simulator="passing")
    assert run.policy_success_rate == 0.75 and run.final_step_success_rate == 0.5
    assert run.per_task["reach-point"].final_step_success_rate == 0.5
    from vlaeval.rollouts.evaluation import evaluation_view

    assert evaluation_view(run)[0]["eval.final_step_success_rate"] == 0.5
    plain = evaluate_closed_loop(
        bound, ["reach-point"], EvaluateConfig(episodes_per_task=4, max_steps=8, execute_actions=2),
        RolloutConfig(workers=1), simulator="passing",
    )  # fmt: skip
    assert plain.policy_success_rate == 1.0 and plain.final_step_success_rate is None
