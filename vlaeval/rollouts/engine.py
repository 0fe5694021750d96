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

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np
import torch

from vlaeval.artifacts import stable_seed
from vlaeval.config import EvaluateConfig, RolloutConfig
from vlaeval.data.cameras import channel_first
from vlaeval.envs import DEFAULT_SIMULATOR
from vlaeval.envs import simulator as registered_simulator
from vlaeval.envs.episodes import Episode, EpisodeDisturbances, held_out_split
from vlaeval.envs.protocol import Environments, Simulator
from vlaeval.policy.bound import BoundPolicy
from vlaeval.policy.flow import sample_chunks
from vlaeval.policy.threads import intra_op_threads
from vlaeval.rollouts.evaluation import Evaluation, evaluation_conditions
from vlaeval.rollouts.language import episode_instruction
from vlaeval.rollouts.outcomes import EpisodeOutcomes

DEFAULT_LOCKSTEP_GROUP = RolloutConfig.lockstep_group  # one default: the rollout section's
MIN_POLICY_BATCH = 8  # rows of every batched policy call (padded): see the module docstring
ROLLOUT_ENGINE_VERSION = 2  # bump when what an episode's seed and spec produce changes (cache keys)


def policy_chunks(
    policy: BoundPolicy,
    observations: np.ndarray,
    tokens: torch.Tensor,
    generators: Sequence[torch.Generator],
    images: Optional[Dict[str, np.ndarray]] = None,
) -> np.ndarray:
    """(B, H, action_dim) action chunks for B episodes in one batched call; each episode's
    initial noise comes from its own generator; `tokens` are what each is told (BoundPolicy.episode_tokens),
    `images` the cameras' uint8 (B, 3, H, W). The
    call is padded to MIN_POLICY_BATCH rows (copies of the first), so a row's numbers do not depend
    on how many episodes share the call."""
    model = cast(Any, policy.model)
    n = len(generators)
    pad = max(MIN_POLICY_BATCH - n, 0)
    obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32)
    noise = torch.stack([torch.randn(int(model.horizon), int(model.action_dim), generator=g) for g in generators])
    pixels = {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in (images or {}).items()}
    if pad:
        obs = torch.cat([obs, obs[:1].expand(pad, -1)])
        tokens = torch.cat([tokens, tokens[:1].expand(pad, *tokens.shape[1:])])
        noise = torch.cat([noise, noise[:1].expand(pad, -1, -1)])
        pixels = {key: torch.cat([value, value[:1].expand(pad, -1, -1, -1)]) for key, value in pixels.items()}
    with torch.no_grad():
        batch = policy.observation_batch(obs, tokens, pixels)
        chunks = sample_chunks(model, batch, noise, policy.sampling_steps, policy.flow)  # from each episode's noise
    return chunks[:n].float().numpy()


def reset_policy(model: torch.nn.Module) -> None:
    """New episodes begin: a policy with state across calls (LeRobot's action queues) clears it."""
    reset = getattr(model, "reset", None)
    if callable(reset):
        reset()


def single_threaded_torch() -> ContextManager[None]:
    """A lockstep batch is small (tens of rows): one intra-op thread is faster than several, and
    leaves the other cores to the simulator (and to the other rollout workers)."""
    return intra_op_threads(1)


@dataclass
class RolloutJob:
    """One policy's episodes (the policy bound to the tasks the episodes' task_index counts)."""

    policy: BoundPolicy
    episodes: Sequence[Episode]
    simulator: str = DEFAULT_SIMULATOR  # where they run: a registered simulator's name (vlaeval/envs)


def rollout_jobs(
    jobs: Sequence[RolloutJob],
    executor: Any,
    *,
    execute_actions: int,
    max_steps: int,
    group_size: int = DEFAULT_LOCKSTEP_GROUP,
    progress: Optional[Callable[[int, int], None]] = None,
    to_horizon: bool = False,
) -> List[EpisodeOutcomes]:
    """Every job's episodes in lockstep groups of `group_size`, all groups of all jobs handed to the
    executor at once (so one policy's stragglers overlap another's work); per job its episodes'
    outcomes in their order. An episode's outcome depends on the episode alone, so
    neither the groups nor the executor change the numbers."""
    size = max(int(group_size), 1)
    calls, owner = [], []
    for k, job in enumerate(jobs):
        for i in range(0, len(job.episodes), size):
            calls.append(
                (job.policy, list(job.episodes[i : i + size]), execute_actions, max_steps, job.simulator, to_horizon)
            )
            owner.append(k)
    parts: List[List[EpisodeOutcomes]] = [[] for _ in jobs]
    total, done = sum(len(job.episodes) for job in jobs), 0
    for k, part in zip(owner, executor.map_groups(rollout_group, calls)):
        parts[k].append(part)
        done += len(part)
        if progress is not None:
            progress(done, total)
    return [EpisodeOutcomes.concatenate(job_parts) for job_parts in parts]


def rollout_episodes(
    policy: BoundPolicy,
    episodes: Sequence[Episode],
    *,
    execute_actions: int,
    max_steps: int,
    group_size: int = DEFAULT_LOCKSTEP_GROUP,
    workers: int = 1,
    executor: Any = None,
    progress: Optional[Callable[[int, int], None]] = None,
    simulator: str = DEFAULT_SIMULATOR,
) -> EpisodeOutcomes:
    """One policy's episodes (rollout_jobs with one job) in the simulator named `simulator`, run by
    `executor` (None: a local pool of `workers` processes, closed on return)."""
    from vlaeval.rollouts.executors import LocalExecutor

    runner = executor if executor is not None else LocalExecutor(workers)
    try:
        [out] = rollout_jobs(
            [RolloutJob(policy, episodes, simulator)],
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


def rollout_group(
    policy: BoundPolicy,
    group: Sequence[Episode],
    execute_actions: int,
    max_steps: int,
    simulator: str = DEFAULT_SIMULATOR,
    to_horizon: bool = False,
) -> EpisodeOutcomes:
    """A lockstep group where an executor runs it (the simulator by name: each process makes its own)."""
    with single_threaded_torch():
        return rollout_lockstep(
            policy,
            group,
            execute_actions=execute_actions,
            max_steps=max_steps,
            simulator=registered_simulator(simulator),
            to_horizon=to_horizon,
        )


def rollout_lockstep(
    policy: BoundPolicy,
    episodes: Sequence[Episode],
    *,
    execute_actions: int,
    max_steps: int,
    progress: Optional[Callable[[int, int], None]] = None,
    watch: Optional[Callable[[int, Environments], None]] = None,
    simulator: Optional[Simulator] = None,
    to_horizon: bool = False,
) -> EpisodeOutcomes:
    """Run every episode to success, an unsafe event, termination or `max_steps`, all in lockstep:
    at each control step the episodes whose action queue is empty get new chunks from one batched
    policy call. Returns each episode's outcome (success: reached the goal with no unsafe event).
    `to_horizon`: an episode that reaches the goal runs on to `max_steps` (or an unsafe event or
    termination), and its outcome also says whether the goal held at its last step (final_success,
    the criterion of benchmarks that judge the end state); any-step success is the same either way,
    because everything before the goal is reached is.
    `watch(k, envs)` is called with the environments when episode k opens and after each of its steps
    (vlaeval/rollouts/videos.py films episode k with envs.frame); it must not change them. `simulator`: where the episodes run (None: the registry's
    default, vlaeval/envs/__init__.py); the engine talks to it and to the bound policy only."""
    policy.model.eval()
    reset_policy(policy.model)
    n = len(episodes)
    envs = (simulator or registered_simulator()).environments(policy.cameras, policy.image_size)
    tally = EpisodeTally(n, max_steps, to_horizon)
    try:
        action_dim = int(cast(Any, policy.model).action_dim)
        disturbances = [EpisodeDisturbances(e, action_dim) for e in episodes]
        observations = [disturbances[k].observe(envs.open(e)) for k, e in enumerate(episodes)]
        seen = FrameHistory(policy.frames, n)  # a policy reading several frames: what it saw at each step
        for k in range(n):
            if watch is not None:
                watch(k, envs)
            if seen.kept:
                seen.start(k, disturbances[k].observe_images(envs.images(k)))
        generators = [torch.Generator().manual_seed(stable_seed("rollout", e.seed) % (2**63)) for e in episodes]
        tokens = policy.episode_tokens([e.task_index for e in episodes], [e.instruction for e in episodes])
        queues: List[List[np.ndarray]] = [[] for _ in range(n)]
        active = list(range(n))
        finished = 0
        while active:
            need = [i for i in active if not queues[i]]
            if need:
                chunks = policy_chunks(
                    policy,
                    np.stack([observations[i] for i in need]),
                    tokens[need],
                    [generators[i] for i in need],
                    camera_images(
                        [seen.frames(i) if seen.kept else disturbances[i].observe_images(envs.images(i)) for i in need]
                    ),
                )
                for i, chunk in zip(need, chunks):
                    queues[i] = list(chunk[:execute_actions])
            still = []
            for i in active:
                action = disturbances[i].execute(np.clip(queues[i].pop(0), -1.0, 1.0))
                obs, reached, ended = envs.step(i, action)
                observations[i] = disturbances[i].observe(obs)
                if watch is not None:
                    watch(i, envs)
                if seen.kept:  # every step's frame, whether or not the policy is called then
                    seen.add(i, disturbances[i].observe_images(envs.images(i)))
                if tally.runs_on(i, reached, ended, envs.unsafe(i)):
                    still.append(i)
                    continue
                finished += 1
                if progress is not None:
                    progress(finished, n)
            active = still
    finally:
        envs.close()
    return tally.outcomes()


class EpisodeTally:
    """What each episode of a lockstep group has done so far: its steps, whether it met the goal at
    some step (success), whether the goal holds now (final), an unsafe event; and whether it runs on."""

    def __init__(self, episodes: int, max_steps: int, to_horizon: bool) -> None:
        self.max_steps, self.to_horizon = int(max_steps), bool(to_horizon)
        self.success = np.zeros(episodes, dtype=bool)
        self.final = np.zeros(episodes, dtype=bool)
        self.unsafe = np.zeros(episodes, dtype=bool)
        self.steps = np.zeros(episodes, dtype=np.int64)

    def runs_on(self, i: int, reached: bool, ended: bool, unsafe: bool) -> bool:
        """Record episode i's step; False when the episode ends with it."""
        self.steps[i] += 1
        if unsafe:  # the episode ends here, a failure whatever else happened
            self.unsafe[i], self.success[i], self.final[i] = True, False, False
            return False
        self.success[i] |= reached
        self.final[i] = reached
        stop_at_goal = reached and not self.to_horizon
        return not (ended or stop_at_goal or self.steps[i] >= self.max_steps)

    def outcomes(self) -> EpisodeOutcomes:
        final = self.final if self.to_horizon else None
        return EpisodeOutcomes(success=self.success, unsafe=self.unsafe, steps=self.steps, final_success=final)


class FrameHistory:
    """The last `frames` camera images of each episode, for a policy that reads several (its
    `history`): rendered after every step, the first repeated before the episode starts (as its
    anchors are in training, vlaeval/policy/bound.py: anchor_frames). With one frame nothing is kept:
    the cameras are rendered at the policy's calls only."""

    def __init__(self, frames: int, episodes: int) -> None:
        self.count = int(frames)
        self.kept = self.count > 1
        self.history: List[List[Dict[str, np.ndarray]]] = [[] for _ in range(episodes)]

    def start(self, k: int, images: Dict[str, np.ndarray]) -> None:
        self.history[k] = [images] * self.count

    def add(self, k: int, images: Dict[str, np.ndarray]) -> None:
        self.history[k] = [*self.history[k][1:], images]

    def frames(self, k: int) -> Dict[str, np.ndarray]:
        """Each camera's last frames, (H, W, 3 * frames), oldest first (channel_first makes them (3 * frames, H, W))."""
        return {key: np.concatenate([f[key] for f in self.history[k]], axis=-1) for key in self.history[k][0]}


def camera_images(per_episode: Sequence[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """Each camera's images of the episodes, stacked in the policy's layout uint8 (B, 3, H, W)."""
    if not per_episode or not per_episode[0]:
        return {}
    return {key: channel_first(np.stack([images[key] for images in per_episode])) for key in per_episode[0]}


def expert_successes(episodes: Sequence[Episode], max_steps: int, simulator: str = DEFAULT_SIMULATOR) -> np.ndarray:
    """The simulator's scripted expert on the same scenes (it needs no network)."""
    return registered_simulator(simulator).expert_successes(episodes, max_steps)


def condition_episode(
    condition: Any, episode: Episode, tasks: Sequence[str], simulator: str = DEFAULT_SIMULATOR
) -> Episode:
    """The episode under an evaluation condition: its perturbation, and what its policy is told."""
    told = episode_instruction(condition.instructions, episode.task, tasks, episode.seed, {}, simulator)
    return dataclasses.replace(episode, perturbation=condition.perturbation, instruction=told)


def held_out_episodes(
    tasks: List[str], evaluate: EvaluateConfig, simulator: str = DEFAULT_SIMULATOR
) -> Tuple[List[Episode], range]:
    """The evaluation's episodes (evaluate.episodes_per_task per task on the simulator's held-out scene
    variants, or the half evaluate.scenes names, seeded by evaluate.seed) and those variants: the same
    episodes for every policy."""
    sim = registered_simulator(simulator)
    held_out = held_out_split(sim.held_out_variants, str(getattr(evaluate, "scenes", "held_out")))
    plan = sim.episode_plan(tasks, int(evaluate.episodes_per_task), int(evaluate.seed), held_out)
    return [Episode(ep["task"], ep["task_index"], ep["variant"], ep["seed"]) for ep in plan], held_out


def run_rollout_jobs(
    jobs: Sequence[RolloutJob],
    evaluate: EvaluateConfig,
    rollout: RolloutConfig,
    progress: Optional[Callable[[int, int], None]] = None,
) -> List[EpisodeOutcomes]:
    """`jobs` on the executor rollout.* names (made here and closed however the rollouts end), each
    episode run as evaluate.* says (its steps, the actions executed per chunk)."""
    from vlaeval.rollouts.executors import make_executor

    executor = make_executor(str(rollout.executor), int(rollout.workers), rollout.ray_address)
    try:
        return rollout_jobs(
            jobs,
            executor,
            execute_actions=int(evaluate.execute_actions),
            max_steps=int(evaluate.max_steps),
            group_size=int(rollout.lockstep_group),
            progress=progress,
            to_horizon=bool(evaluate.run_to_horizon),
        )
    finally:
        executor.close()


def evaluate_closed_loop(
    policy: BoundPolicy,
    tasks: List[str],
    evaluate: Any,
    rollout: Any,
    progress: Optional[Callable[[int, int, str], None]] = None,
    simulator: str = DEFAULT_SIMULATOR,
) -> Evaluation:
    """The held-out evaluation (evaluate.*: episodes per task, their seed, steps, actions per chunk) of
    `policy` (bound to `tasks`: task k reads instruction k) in the simulator named `simulator`, run
    where rollout.* says (local processes or Ray), beside the scripted expert on the same episodes."""
    episodes, held_out = held_out_episodes(tasks, evaluate, simulator)
    conditions = evaluation_conditions(evaluate)
    jobs = [RolloutJob(policy, episodes, simulator)] + [
        RolloutJob(policy, [condition_episode(c, e, tasks, simulator) for e in episodes], simulator) for c in conditions
    ]
    outcomes = run_rollout_jobs(
        jobs,
        evaluate,
        rollout,
        None if progress is None else (lambda done, total: progress(done, total, "policy episodes")),
    )
    expert = expert_successes(episodes, int(evaluate.max_steps), simulator)
    return Evaluation.of(tasks, episodes, outcomes[0], expert, list(zip(conditions, outcomes[1:])), held_out)
