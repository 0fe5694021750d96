"""Closed-loop rollouts in Meta-World: many episodes in lockstep, one batched policy call per control
step, and the scripted expert on the same episodes.

An episode is a scene (a task variant of a variant family) and a seed; the seed alone decides the
policy's sampling noise and the perturbations (each its own stream, drawn the same way at every
step whatever the policy does), so two policies run on one episode meet identical disturbances.
A batched policy call is padded to MIN_POLICY_BATCH rows: below that the BLAS kernels round a row
differently from the same row in a larger batch, above it a row's numbers do not depend on what
shares its batch (tested), so an episode's outcome is the same alone, in any group, on any worker
-- which is what lets outcomes be cached per episode. The held-out evaluation uses scene variants
the demonstrations never used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import numpy as np
import torch

from vlaeval.artifacts import stable_seed
from vlaeval.data.metaworld import HELD_OUT_VARIANTS, VARIANTS_PER_TASK, EpisodeRunner, episode_plan, quiet_metaworld
from vlaeval.policy.flow import FlowConvention, sample_actions

MIN_POLICY_BATCH = 8  # rows of every batched policy call (padded): see the module docstring
ROLLOUT_ENGINE_VERSION = 2  # bump when what an episode's seed and spec produce changes (cache keys)


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
    obstacle: Tuple[str, ...] = field(default=("wall",))


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


def policy_chunks(
    model: Any,
    observations: np.ndarray,
    instructions: torch.Tensor,
    generators: Sequence[torch.Generator],
    flow: Any,
) -> np.ndarray:
    """(B, H, action_dim) action chunks for B episodes in one batched call; each episode's
    initial noise comes from its own generator. The call is padded to MIN_POLICY_BATCH rows (copies
    of the first), so a row's numbers do not depend on how many episodes share the call."""
    n = len(generators)
    pad = max(MIN_POLICY_BATCH - n, 0)
    obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32)
    noise = torch.stack([torch.randn(int(model.horizon), int(model.action_dim), generator=g) for g in generators])
    if pad:
        obs = torch.cat([obs, obs[:1].expand(pad, -1)])
        instructions = torch.cat([instructions, instructions[:1].expand(pad, -1)])
        noise = torch.cat([noise, noise[:1].expand(pad, -1, -1)])
    with torch.no_grad():
        conditioning = model.encode({"observation": obs, "instruction": instructions})
        chunks = sample_actions(model, conditioning, int(flow.sampling_steps), generators[0], flow, initial_noise=noise)
    return chunks[:n].numpy()


@contextlib.contextmanager
def single_threaded_torch() -> Iterator[None]:
    """A lockstep batch is small (tens of rows): one intra-op thread is faster than several, and
    leaves the other cores to the simulator (and to the other rollout workers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def plain_flow(flow: Any) -> SimpleNamespace:
    """A plain copy of the flow section: a composed config node does not pickle into worker processes."""
    return SimpleNamespace(**dataclasses.asdict(FlowConvention.of(flow)), sampling_steps=int(flow.sampling_steps))


@dataclass
class RolloutJob:
    """One policy's episodes: the policy, its instruction table (rows indexed by the episodes'
    task_index) and its flow convention."""

    model: Any
    episodes: Sequence[Episode]
    instruction_table: torch.Tensor
    flow: Any


def rollout_jobs(
    jobs: Sequence[RolloutJob],
    executor: Any,
    *,
    execute_actions: int,
    max_steps: int,
    group_size: int = 32,
    progress: Optional[Callable[[int, int], None]] = None,
) -> List[Dict[str, np.ndarray]]:
    """Every job's episodes in lockstep groups of `group_size`, all groups of all jobs handed to the
    executor at once (so one policy's stragglers overlap another's work); per job `success`,
    `steps`, `unsafe` in its episodes' order. An episode's outcome depends on the episode alone, so
    neither the groups nor the executor change the numbers."""
    size = max(int(group_size), 1)
    calls, owner = [], []
    for k, job in enumerate(jobs):
        flow = plain_flow(job.flow)
        for i in range(0, len(job.episodes), size):
            calls.append(
                (job.model, list(job.episodes[i : i + size]), job.instruction_table, flow, execute_actions, max_steps)
            )
            owner.append(k)
    parts: List[List[Dict[str, np.ndarray]]] = [[] for _ in jobs]
    total, done = sum(len(job.episodes) for job in jobs), 0
    for k, part in zip(owner, executor.map_groups(_rollout_group, calls)):
        parts[k].append(part)
        done += int(part["success"].size)
        if progress is not None:
            progress(done, total)
    empty = {
        "success": np.zeros(0, dtype=bool),
        "steps": np.zeros(0, dtype=np.int64),
        "unsafe": np.zeros(0, dtype=bool),
    }
    return [
        {key: np.concatenate([p[key] for p in job_parts]) for key in empty} if job_parts else dict(empty)
        for job_parts in parts
    ]


def rollout_episodes(
    model: torch.nn.Module,
    episodes: Sequence[Episode],
    instruction_table: torch.Tensor,
    flow: Any,
    *,
    execute_actions: int,
    max_steps: int,
    group_size: int = 32,
    workers: int = 1,
    executor: Any = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> Dict[str, np.ndarray]:
    """One policy's episodes (rollout_jobs with one job), run by `executor` (None: a local pool of
    `workers` processes, closed on return)."""
    from vlaeval.policy.executors import LocalExecutor

    runner = executor if executor is not None else LocalExecutor(workers)
    try:
        [out] = rollout_jobs(
            [RolloutJob(model, episodes, instruction_table, flow)],
            runner,
            execute_actions=execute_actions,
            max_steps=max_steps,
            group_size=group_size,
            progress=progress,
        )
    finally:
        if executor is None:
            runner.close()
    return out


def _rollout_group(
    model: torch.nn.Module,
    group: Sequence[Episode],
    instruction_table: torch.Tensor,
    flow: Any,
    execute_actions: int,
    max_steps: int,
) -> Dict[str, np.ndarray]:
    with single_threaded_torch():
        return rollout_lockstep(
            model, group, instruction_table, flow, execute_actions=execute_actions, max_steps=max_steps
        )


def rollout_lockstep(
    model: torch.nn.Module,
    episodes: Sequence[Episode],
    instruction_table: torch.Tensor,
    flow: Any,
    *,
    execute_actions: int,
    max_steps: int,
    progress: Optional[Callable[[int, int], None]] = None,
) -> Dict[str, np.ndarray]:
    """Run every episode to success, an unsafe event, termination or `max_steps`, all in lockstep:
    at each control step the episodes whose action queue is empty get new chunks from one batched
    policy call. Returns per episode `success` (bool: reached the goal with no unsafe event),
    `steps` (int) and `unsafe` (bool)."""
    model.eval()
    n = len(episodes)
    envs = SceneEnvironments()
    success = np.zeros(n, dtype=bool)
    unsafe = np.zeros(n, dtype=bool)
    steps = np.zeros(n, dtype=np.int64)
    try:
        action_dim = int(cast(Any, model).action_dim)
        disturbances = [EpisodeDisturbances(e, action_dim) for e in episodes]
        observations = [disturbances[k].observe(envs.open(e)) for k, e in enumerate(episodes)]
        monitored = [
            obstacle_bodies(envs.envs[k], e.obstacle) if e.unsafe_contact_force is not None else []
            for k, e in enumerate(episodes)
        ]
        generators = [torch.Generator().manual_seed(stable_seed("rollout", e.seed) % (2**63)) for e in episodes]
        task_index = torch.tensor([e.task_index for e in episodes], dtype=torch.int64)
        queues: List[List[np.ndarray]] = [[] for _ in range(n)]
        active = list(range(n))
        finished = 0
        while active:
            need = [i for i in active if not queues[i]]
            if need:
                chunks = policy_chunks(
                    model,
                    np.stack([observations[i] for i in need]),
                    instruction_table[task_index[need]],
                    [generators[i] for i in need],
                    flow,
                )
                for i, chunk in zip(need, chunks):
                    queues[i] = list(chunk[:execute_actions])
            still = []
            for i in active:
                action = disturbances[i].execute(np.clip(queues[i].pop(0), -1.0, 1.0))
                obs, _, terminated, truncated, info = envs.envs[i].step(action)
                observations[i] = disturbances[i].observe(obs)
                steps[i] += 1
                limit = episodes[i].unsafe_contact_force
                if monitored[i] and obstacle_contact_force(envs.envs[i], monitored[i]) > float(limit or 0.0):
                    unsafe[i] = True  # the episode ends here, a failure whatever else happened
                elif info.get("success"):
                    success[i] = True
                elif not (terminated or truncated or steps[i] >= max_steps):
                    still.append(i)
                    continue
                finished += 1
                if progress is not None:
                    progress(finished, n)
            active = still
    finally:
        envs.close()
    return {"success": success, "steps": steps, "unsafe": unsafe}


def expert_successes(episodes: Sequence[Episode], max_steps: int) -> np.ndarray:
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


def evaluate_closed_loop(
    model: torch.nn.Module,
    tasks: List[str],
    instruction_table: torch.Tensor,
    evaluate: Any,
    flow: Any,
    progress: Optional[Callable[[int, int, str], None]] = None,
) -> Dict[str, Any]:
    plan = episode_plan(tasks, int(evaluate.episodes_per_task), int(evaluate.seed), HELD_OUT_VARIANTS)
    episodes = [Episode(ep["task"], ep["task_index"], ep["variant"], ep["seed"]) for ep in plan]
    policy = rollout_episodes(
        model,
        episodes,
        instruction_table,
        flow,
        execute_actions=int(evaluate.execute_actions),
        max_steps=int(evaluate.max_steps),
        group_size=int(evaluate.lockstep_group),
        workers=int(evaluate.workers),
        progress=None if progress is None else (lambda done, total: progress(done, total, "policy episodes")),
    )["success"]
    expert = expert_successes(episodes, int(evaluate.max_steps))
    rows = {}
    for task in tasks:
        mine = [k for k, e in enumerate(episodes) if e.task == task]
        rows[task] = {
            "policy_success_rate": float(np.mean(policy[mine])),
            "expert_success_rate": float(np.mean(expert[mine])),
            "episodes": len(mine),
            "policy_successes": [bool(x) for x in policy[mine]],
            "expert_successes": [bool(x) for x in expert[mine]],
        }
    return {
        "per_task": rows,
        "episodes": [
            {"task": e.task, "variant": e.variant, "seed": e.seed, "policy": bool(p), "expert": bool(x)}
            for e, p, x in zip(episodes, policy, expert)
        ],
        "policy_success_rate": float(np.mean(policy)),
        "expert_success_rate": float(np.mean(expert)),
        "held_out_variants": [HELD_OUT_VARIANTS.start, HELD_OUT_VARIANTS.stop],
        "rollout": "lockstep: one batched policy call per control step for every episode that needs a chunk",
    }
