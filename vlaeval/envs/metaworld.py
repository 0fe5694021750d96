"""The simulated world the rollouts run in: Meta-World scenes (a task variant of a variant family),
their MuJoCo environments, the disturbances an episode meets, and contact with obstacles.

Below the policies: nothing here knows what acts in a scene. An episode's seed alone decides its
perturbation streams (each its own stream, drawn the same way at every step whatever acts), so two
policies run on one episode meet identical disturbances (vlaeval/rollouts/engine.py runs them).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, List, Optional, Sequence, Tuple

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.data.metaworld import quiet_metaworld

DEFAULT_OBSTACLE = ("wall",)  # the bodies whose contact force makes an episode unsafe, unless a family names others


@dataclass(frozen=True)
class Perturbation:
    """Disturbances while an episode runs; all zero is the clean episode.

    observation_noise: std of Gaussian noise on every observation the policy sees.
    action_noise: std of Gaussian noise added to every executed action (before clipping to [-1, 1]).
    burst_rate: probability per control step that a burst of uniformly random actions starts.
    burst_steps: length of a burst, in control steps.
    control_delay: control steps between the policy choosing an action and its execution (the
        first `control_delay` executed actions are zero).
    """

    observation_noise: float = 0.0
    action_noise: float = 0.0
    burst_rate: float = 0.0
    burst_steps: int = 5
    control_delay: int = 0

    @classmethod
    def parse(cls, values: Any, where: str) -> "Perturbation":
        """From a mapping of the fields above; a one-line error names an unknown key or a bad value."""
        from vlaeval.errors import UserInputError, require

        values = dict(values or {})
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                raise UserInputError(f"{where}.{key} is not a perturbation; use {', '.join(known)}")
        out = cls(**{k: type(getattr(cls(), k))(v) for k, v in values.items()})
        for name in ("observation_noise", "action_noise"):
            require(getattr(out, name) >= 0, f"{where}.{name}={getattr(out, name)} must be >= 0 (a standard deviation)")
        require(0 <= out.burst_rate <= 1, f"{where}.burst_rate={out.burst_rate} must be a probability in [0, 1]")
        require(out.burst_steps >= 1, f"{where}.burst_steps={out.burst_steps} must be >= 1")
        require(out.control_delay >= 0, f"{where}.control_delay={out.control_delay} must be >= 0 steps")
        return out

    @property
    def active(self) -> bool:
        return self != Perturbation()


NO_PERTURBATION = Perturbation()


@dataclass(frozen=True)
class Episode:
    """One closed-loop episode. `family` is the Meta-World benchmark seed that draws the task's 50
    scene variants (0: the family the demonstrations come from). `perturbation` is the scenario's,
    drawn from the episode's perturbation stream; `degradation` is planted on one policy only
    (effects), drawn from a stream of its own so the scenario's draws stay identical. With
    `unsafe_contact_force` set, contact between anything and `obstacle` bodies pushing harder than
    that many newtons is an unsafe event: the episode stops there and counts as a failure."""

    task: str
    task_index: int
    variant: int
    seed: int
    family: int = 0
    perturbation: Perturbation = NO_PERTURBATION
    degradation: Perturbation = NO_PERTURBATION
    unsafe_contact_force: Optional[float] = None
    obstacle: Tuple[str, ...] = field(default=DEFAULT_OBSTACLE)


def task_benchmark(task: str, family: int = 0) -> Any:
    """Meta-World's MT1 benchmark of a task (its 50 scene variants of one family): ~1-2 s to build,
    so built once per process and shared by every group of episodes."""
    return built_benchmark(str(task), int(family))


@functools.lru_cache(maxsize=None)
def built_benchmark(task: str, family: int) -> Any:  # one cache key per (task, family), however called
    metaworld, _ = quiet_metaworld()
    return metaworld.MT1(task, seed=family)


def obstacle_bodies(env: Any, names: Sequence[str]) -> List[int]:
    """MuJoCo body ids of the named obstacle bodies in an environment (missing names are left out)."""
    import mujoco

    model = env.unwrapped.model
    ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, str(name)) for name in names]
    return [i for i in ids if i >= 0]


def obstacle_contact_force(env: Any, bodies: Sequence[int]) -> float:
    """The largest normal force (N) of any current contact touching one of `bodies`."""
    import mujoco

    model, data = env.unwrapped.model, env.unwrapped.data
    largest, wrench = 0.0, np.zeros(6)
    for c in range(int(data.ncon)):
        contact = data.contact[c]
        if model.geom_bodyid[contact.geom1] in bodies or model.geom_bodyid[contact.geom2] in bodies:
            mujoco.mj_contactForce(model, data, c, wrench)
            largest = max(largest, abs(float(wrench[0])))
    return largest


class EpisodeDisturbances:
    """An episode's perturbation and degradation streams. Every control step draws the same
    numbers in the same order whatever the policy does, so the k-th step of two policies' runs of
    one episode meets the same disturbance."""

    def __init__(self, episode: Episode, action_dim: int) -> None:
        self.scenario, self.degradation = episode.perturbation, episode.degradation
        self.action_dim = int(action_dim)
        self.streams = [
            np.random.default_rng(stable_seed("perturbation", episode.seed)),
            np.random.default_rng(stable_seed("degradation", episode.seed)),
        ]
        delay = self.scenario.control_delay + self.degradation.control_delay
        self.pending: Deque[np.ndarray] = deque(np.zeros(self.action_dim) for _ in range(delay))
        self.burst_left = [0, 0]
        self.observation_draws: List[np.ndarray] = []

    def observe(self, obs: np.ndarray) -> np.ndarray:
        """What the policy sees of this step's observation."""
        out = np.asarray(obs, dtype=np.float32)
        for spec, rng in zip((self.scenario, self.degradation), self.streams):
            if spec.observation_noise > 0:
                out = out + np.float32(spec.observation_noise) * rng.standard_normal(out.shape).astype(np.float32)
        return out

    def execute(self, chosen: np.ndarray) -> np.ndarray:
        """The action the robot executes this step, given the policy's choice."""
        self.pending.append(np.asarray(chosen, dtype=np.float64))
        action = self.pending.popleft()
        for k, (spec, rng) in enumerate(zip((self.scenario, self.degradation), self.streams)):
            if spec.burst_rate > 0:
                start, random_action = rng.random(), rng.uniform(-1.0, 1.0, self.action_dim)
                if self.burst_left[k] == 0 and start < spec.burst_rate:
                    self.burst_left[k] = spec.burst_steps
                if self.burst_left[k] > 0:
                    action, self.burst_left[k] = random_action, self.burst_left[k] - 1
            if spec.action_noise > 0:
                action = action + spec.action_noise * rng.standard_normal(self.action_dim)
        return np.clip(action, -1.0, 1.0)


class SceneEnvironments:
    """One MuJoCo environment per episode of a lockstep group (each its own scene)."""

    def __init__(self) -> None:
        self.envs: List[Any] = []

    def open(self, episode: Episode) -> Any:
        benchmark = task_benchmark(episode.task, int(episode.family))
        env = benchmark.train_classes[episode.task]()
        env.set_task(benchmark.train_tasks[episode.variant])
        self.envs.append(env)
        obs, _ = env.reset()
        return obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs.clear()
