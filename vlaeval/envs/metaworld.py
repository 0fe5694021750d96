"""Meta-World as vlaeval's simulator (vlaeval/envs/protocol.py): its scenes (a task variant of a
variant family), their MuJoCo environments and cameras, contact with obstacles, and the scripted
experts. The only module besides the demonstration recorder (vlaeval/data/metaworld.py) that
names Meta-World; everything else reaches it through the registry (vlaeval/envs/__init__.py).

Below the policies: nothing here knows what acts in a scene (vlaeval/rollouts/engine.py runs them).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.envs.episodes import HELD_OUT_SPLITS, Episode, camera_offset, goal_marker_offset, held_out_split
from vlaeval.envs.rendering import CAMERA_PREFIX, METAWORLD_CAMERAS, RENDERER_VERSION, SceneCameras, camera_key

VIDEO_CAMERA = "corner"  # what a video shows: the view a person reads best, the whole arm and table
VARIANTS_PER_TASK = 50
TRAIN_VARIANTS = range(0, 25)
HELD_OUT_VARIANTS = range(25, 50)
# data.scenes: the training variants, or the held-out ones whole or halved (validation 25-36, test 37-49)
SCENE_SPLITS = {"train": TRAIN_VARIANTS, **{s: held_out_split(HELD_OUT_VARIANTS, s) for s in HELD_OUT_SPLITS}}
OBS_DIM = 39
ACTION_DIM = 4

# A natural-language instruction per task (the stand-in for a VLA's language input).
INSTRUCTIONS: Dict[str, str] = {
    "reach-v3": "reach the red goal position",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "disassemble-v3": "pick the nut off the peg",
    "stick-pull-v3": "grasp the stick and pull the box with it",
    "box-close-v3": "grasp the lid and close the box",
    "drawer-open-v3": "open the drawer",
    "drawer-close-v3": "push the drawer closed",
    "button-press-v3": "press the button",
    "door-open-v3": "open the door",
    "window-open-v3": "slide the window open",
}


def quiet_metaworld() -> Any:
    warnings.filterwarnings("ignore", module=r"gymnasium\..*")
    warnings.filterwarnings("ignore", module=r"metaworld\..*")
    import metaworld
    from metaworld.policies import ENV_POLICY_MAP

    return metaworld, ENV_POLICY_MAP


def known_tasks() -> List[str]:
    _, policies = quiet_metaworld()
    return sorted(policies)


def instruction_for(task: str) -> str:
    return INSTRUCTIONS.get(task, task.rsplit("-v", 1)[0].replace("-", " "))


def scene_of(index: int) -> tuple[int, int]:
    """(variant family, variant) of a stored scene index 50 * family + variant."""
    family, variant = divmod(int(index), VARIANTS_PER_TASK)
    return family, variant


def episode_plan(
    tasks: Sequence[str], episodes_per_task: int, seed: int, variants: range, families: Sequence[int] = (0,)
) -> List[Dict[str, Any]]:
    """Which scene and noise seed each episode uses: a function of the config alone. The scenes are
    `variants` of each of `families`, as indices 50 * family + variant (family 0: the variant)."""
    plan = []
    for task_index, task in enumerate(tasks):
        rng = np.random.default_rng(stable_seed("episodes", task, seed))
        pool = np.array([VARIANTS_PER_TASK * int(f) + v for f in families for v in variants])
        if episodes_per_task <= len(pool):
            chosen = rng.choice(pool, size=episodes_per_task, replace=False)
        else:
            # More episodes than scenes: every scene equally often (whole shuffled rounds, the rest
            # without replacement), not draws with replacement that leave a fifth of them unseen.
            rounds, rest = divmod(episodes_per_task, len(pool))
            chosen = np.concatenate(
                [rng.permutation(pool) for _ in range(rounds)] + [rng.choice(pool, rest, replace=False)]
            )
        for k in range(episodes_per_task):
            plan.append(
                {
                    "task": task,
                    "task_index": task_index,
                    "variant": int(chosen[k]),
                    "seed": stable_seed("episode", task, seed, k),
                }
            )
    return plan


class EpisodeRunner:
    """One MuJoCo environment per task, reused across episodes; with `cameras`, a renderer of
    those cameras at `image_size` for each environment."""

    def __init__(self, cameras: Sequence[str] = (), image_size: int = 64) -> None:
        self._metaworld, self._policies = quiet_metaworld()
        self._envs: Dict[tuple[str, int], Any] = {}  # (task, variant family) -> (env, its variants)
        self.cameras, self.image_size = [str(c) for c in cameras], int(image_size)
        self._renderers: Dict[int, SceneCameras] = {}

    def env(self, task: str, scene: int) -> Any:
        family, variant = scene_of(scene)
        if (task, family) not in self._envs:
            benchmark = self._metaworld.MT1(task, seed=family)
            env = benchmark.train_classes[task]()
            self._envs[task, family] = (env, benchmark.train_tasks)
        env, variants = self._envs[task, family]
        env.set_task(variants[variant])
        obs, _ = env.reset()
        return env, obs

    def images(self, env: Any) -> Dict[str, np.ndarray]:
        """Each camera's image of the environment's current state ({} without cameras)."""
        if not self.cameras:
            return {}
        if id(env) not in self._renderers:
            self._renderers[id(env)] = SceneCameras(env.unwrapped.model, self.cameras, self.image_size)
        return self._renderers[id(env)].render(env.unwrapped.data)

    def expert(self, task: str) -> Any:
        return self._policies[task]()

    def close(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        for env, _ in self._envs.values():
            env.close()
        self._envs.clear()
        self._renderers.clear()


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


class SceneEnvironments:
    """One MuJoCo environment per episode of a lockstep group (each its own scene); with `cameras`
    (camera features observation.images.<Meta-World camera>), a renderer of them at `image_size`
    for each environment."""

    def __init__(self, cameras: Sequence[str] = (), image_size: int = 64) -> None:
        from vlaeval.errors import require

        self.envs: List[Any] = []
        self.renderers: List[Any] = []
        self.video_renderers: Dict[Tuple[int, int], Any] = {}  # (episode, size): a video's view
        self.goal_offsets: List[np.ndarray] = []  # where each episode's cameras draw its goal marker
        self.monitors: List[Tuple[List[int], Optional[float]]] = []
        self.cameras = [str(c)[len(CAMERA_PREFIX) :] if str(c).startswith(CAMERA_PREFIX) else str(c) for c in cameras]
        for feature, camera in zip(cameras, self.cameras):
            require(
                camera in METAWORLD_CAMERAS,
                f"the policy reads camera {feature}, which Meta-World does not have; its cameras are "
                f"{', '.join(CAMERA_PREFIX + c for c in METAWORLD_CAMERAS)}",
            )
        self.image_size = int(image_size)

    def open(self, episode: Episode) -> Any:
        benchmark = task_benchmark(episode.task, int(episode.family))
        env = benchmark.train_classes[episode.task]()
        env.set_task(benchmark.train_tasks[episode.variant])
        self.envs.append(env)
        # The unsafe-contact monitor: the obstacle's bodies, and the force that makes contact unsafe.
        limit = episode.unsafe_contact_force
        self.monitors.append((obstacle_bodies(env, episode.obstacle) if limit is not None else [], limit))
        self.goal_offsets.append(goal_marker_offset(episode))
        if self.cameras:
            model = env.unwrapped.model  # this episode's own environment: moving its cameras moves no other's
            offset = camera_offset(episode)
            for camera in self.cameras:
                model.cam_pos[model.camera(camera).id] += offset
            self.renderers.append(SceneCameras(model, self.cameras, self.image_size, goal_offset=self.goal_offsets[-1]))
        obs, _ = env.reset()
        return obs

    def images(self, k: int) -> Dict[str, np.ndarray]:
        """Episode k's cameras now: uint8 (image_size, image_size, 3) by camera feature ({} without cameras)."""
        return self.renderers[k].render(self.envs[k].unwrapped.data) if self.cameras else {}

    def step(self, k: int, action: np.ndarray) -> Tuple[np.ndarray, bool, bool]:
        obs, _, terminated, truncated, info = self.envs[k].step(action)
        return obs, bool(info.get("success")), bool(terminated or truncated)

    def unsafe(self, k: int) -> bool:
        bodies, limit = self.monitors[k]
        return bool(bodies) and obstacle_contact_force(self.envs[k], bodies) > float(limit or 0.0)

    def frame(self, k: int, size: int) -> np.ndarray:
        if (k, size) not in self.video_renderers:
            model = self.envs[k].unwrapped.model  # the video shows the marker where the policy was shown it
            self.video_renderers[k, size] = SceneCameras(model, [VIDEO_CAMERA], size, goal_offset=self.goal_offsets[k])
        return self.video_renderers[k, size].render(self.envs[k].unwrapped.data)[camera_key(VIDEO_CAMERA)]

    def close(self) -> None:
        for renderer in [*self.renderers, *self.video_renderers.values()]:
            renderer.close()
        self.video_renderers.clear()
        for env in self.envs:
            env.close()
        self.envs.clear()
        self.renderers.clear()
        self.monitors.clear()
        self.goal_offsets.clear()


class MetaWorldSimulator:
    """Meta-World 3.1 as vlaeval's simulator (vlaeval/envs/protocol.py): its MT1 tasks, 50 scene
    variants per task and variant family, the held-out half no demonstration comes from, its
    scripted experts, and MuJoCo environments rendered through OSMesa."""

    name = "metaworld"
    variants_per_task = VARIANTS_PER_TASK
    held_out_variants = HELD_OUT_VARIANTS
    renderer_version = RENDERER_VERSION

    def cache_identity(self) -> Dict[str, str]:
        import metaworld

        return {"metaworld": getattr(metaworld, "__version__", "unknown")}

    def tasks(self) -> List[str]:
        return known_tasks()

    def instruction(self, task: str) -> str:
        return instruction_for(task)

    def episode_plan(
        self, tasks: Sequence[str], episodes_per_task: int, seed: int, variants: range
    ) -> List[Dict[str, Any]]:
        return episode_plan(tasks, episodes_per_task, seed, variants)

    def environments(self, cameras: Sequence[str] = (), image_size: int = 64) -> SceneEnvironments:
        return SceneEnvironments(cameras, image_size)

    def expert_successes(self, episodes: Sequence[Episode], max_steps: int) -> np.ndarray:
        """The scripted expert on the same scenes, one episode at a time (it needs no network)."""
        runner = EpisodeRunner()
        out = np.zeros(len(episodes), dtype=bool)
        try:
            for k, e in enumerate(episodes):
                env, obs = runner.env(e.task, VARIANTS_PER_TASK * e.family + e.variant)
                expert = runner.expert(e.task)
                for _ in range(max_steps):
                    obs, _, terminated, truncated, info = env.step(np.clip(expert.get_action(obs), -1.0, 1.0))
                    if info.get("success"):
                        out[k] = True
                        break
                    if terminated or truncated:
                        break
        finally:
            runner.close()
        return out

    def prepare(self, task: str, family: int) -> bool:
        """Build the task's benchmark of that family (~1 s) in this process; True if it was built now."""
        before = built_benchmark.cache_info().currsize
        task_benchmark(task, family)
        return built_benchmark.cache_info().currsize > before

    def has_bodies(self, task: str, family: int, names: Sequence[str]) -> bool:
        benchmark = task_benchmark(task, family)
        env = benchmark.train_classes[task]()
        try:
            return len(obstacle_bodies(env, names)) == len(names)
        finally:
            env.close()
