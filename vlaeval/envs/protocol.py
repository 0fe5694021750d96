"""What vlaeval asks of a simulator: the rollout engine, the held-out evaluation, the scenario
families and the rollout gauntlet talk to this and to the bound policy only. Meta-World implements
it (vlaeval/envs/metaworld.py: MetaWorldSimulator); a LIBERO or a LeRobot gym environment would too,
registered by name in vlaeval/envs/__init__.py (SIMULATORS).

    name, cache_identity()                     what the per-episode outcome cache keys hold of it
    tasks() / instruction(task)                the tasks it has; each task's instruction
    variants_per_task, held_out_variants       its scenes per task (a variant of a family), and the
                                               ones no training data comes from
    episode_plan(tasks, per_task, seed, variants)
                                               the seeded episodes of an evaluation
    environments(cameras, image_size)          one environment per episode of a lockstep group
                                               (Environments below)
    expert_successes(episodes, max_steps)      its scripted expert on the same episodes
    prepare(task, family) -> bool              build what a scene needs, once per process (True:
                                               something was built now: forked workers re-fork)
    has_bodies(task, family, names) -> bool    the scene has the named obstacle bodies to monitor

An episode (vlaeval/envs/episodes.py: its scene, seed, perturbation and unsafe-contact monitor) is
the same object for every simulator.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

from vlaeval.envs.episodes import Episode


@runtime_checkable
class Environments(Protocol):
    """One environment per episode of a lockstep group, indexed k in the order they were opened."""

    def open(self, episode: Episode) -> np.ndarray:
        """Open episode's scene and return its first observation."""
        ...

    def images(self, k: int) -> Dict[str, np.ndarray]:
        """Episode k's cameras now: uint8 (size, size, 3) by camera feature ({} without cameras)."""
        ...

    def step(self, k: int, action: np.ndarray) -> Tuple[np.ndarray, bool, bool]:
        """Execute one action in episode k: (observation, reached its goal, the scene ended it)."""
        ...

    def unsafe(self, k: int) -> bool:
        """Whether episode k's monitored obstacle is now pushed harder than its unsafe_contact_force."""
        ...

    def frame(self, k: int, size: int) -> np.ndarray:
        """A person's view of episode k's scene now, uint8 (size, size, 3): what a regression video
        shows (vlaeval/rollouts/videos.py); it only reads the scene."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Simulator(Protocol):
    name: str
    variants_per_task: int
    held_out_variants: range
    renderer_version: int  # what its camera images depend on besides the scene (a camera policy's episode keys)

    def cache_identity(self) -> Mapping[str, Any]: ...

    def tasks(self) -> List[str]: ...

    def instruction(self, task: str) -> str: ...

    def episode_plan(
        self, tasks: Sequence[str], episodes_per_task: int, seed: int, variants: range
    ) -> List[Dict[str, Any]]: ...

    def environments(self, cameras: Sequence[str] = (), image_size: int = 64) -> Environments: ...

    def expert_successes(self, episodes: Sequence[Episode], max_steps: int) -> np.ndarray: ...

    def prepare(self, task: str, family: int) -> bool: ...

    def has_bodies(self, task: str, family: int, names: Sequence[str]) -> bool: ...


def missing_members(simulator: object) -> List[str]:
    """What an object lacks of the Simulator protocol (empty when it implements all of it)."""
    members = ["name", "variants_per_task", "held_out_variants", "renderer_version"]
    methods = [
        "cache_identity",
        "tasks",
        "instruction",
        "episode_plan",
        "environments",
        "expert_successes",
        "prepare",
        "has_bodies",
    ]
    missing = [m for m in members if getattr(simulator, m, None) is None]
    return missing + [m for m in methods if not callable(getattr(simulator, m, None))]


__all__ = ["Environments", "Simulator", "missing_members"]
