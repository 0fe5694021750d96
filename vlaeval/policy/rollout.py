"""Closed-loop rollouts in Meta-World: many episodes in lockstep, one batched policy call per control
step, and the scripted expert on the same episodes.

An episode is a scene (task variant) and a seed; the seed alone decides the policy's sampling
noise (a generator per episode), so an episode's outcome does not depend on which other episodes
share its lockstep batch beyond float rounding of the batched network call. The held-out
evaluation uses scene variants the demonstrations never used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from vlaeval.artifacts import stable_seed
from vlaeval.data.metaworld import HELD_OUT_VARIANTS, EpisodeRunner, _quiet_metaworld, episode_plan
from vlaeval.policy.flow import FlowConvention, sample_actions


@dataclass(frozen=True)
class Episode:
    task: str
    task_index: int
    variant: int
    seed: int


@functools.lru_cache(maxsize=None)
def _task_benchmark(task: str) -> Any:
    """Meta-World's MT1 benchmark of a task (its 50 scene variants): ~2 s to build, so built once
    per process and shared by every group of episodes."""
    metaworld, _ = _quiet_metaworld()
    return metaworld.MT1(task, seed=0)


class SceneEnvironments:
    """One MuJoCo environment per episode of a lockstep group (each its own scene)."""

    def __init__(self) -> None:
        self.envs: List[Any] = []

    def open(self, episode: Episode) -> Any:
        benchmark = _task_benchmark(episode.task)
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
    initial noise comes from its own generator."""
    batch = {"observation": torch.as_tensor(observations, dtype=torch.float32), "instruction": instructions}
    noise = torch.stack([torch.randn(int(model.horizon), int(model.action_dim), generator=g) for g in generators])
    with torch.no_grad():
        conditioning = model.encode(batch)
        return sample_actions(
            model, conditioning, int(flow.sampling_steps), generators[0], flow, initial_noise=noise
        ).numpy()


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
    progress: Optional[Callable[[int, int], None]] = None,
) -> Dict[str, np.ndarray]:
    """rollout_lockstep over groups of `group_size` consecutive episodes, the groups spread over
    `workers` processes. The groups depend only on `group_size`, so the outcomes do not depend on
    the number of workers (a batched call's rounding depends on what shares its batch)."""
    # A plain copy of the flow section: a composed config node does not pickle into worker processes.
    flow = SimpleNamespace(**dataclasses.asdict(FlowConvention.of(flow)), sampling_steps=int(flow.sampling_steps))
    size = max(int(group_size), 1)
    groups = [list(episodes[i : i + size]) for i in range(0, len(episodes), size)]
    parts: List[Dict[str, np.ndarray]] = []
    done = 0

    def finished(part: Dict[str, np.ndarray]) -> None:
        nonlocal done
        parts.append(part)
        done += int(part["success"].size)
        if progress is not None:
            progress(done, len(episodes))

    if workers <= 1 or len(groups) <= 1:
        for group in groups:
            finished(_rollout_group(model, group, instruction_table, flow, execute_actions, max_steps))
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(int(workers), len(groups)), mp_context=context) as pool:
            futures = [
                pool.submit(_rollout_group, model, g, instruction_table, flow, execute_actions, max_steps)
                for g in groups
            ]
            for future in futures:  # in submission order: the result keeps the episodes' order
                finished(future.result())
    if not parts:
        return {"success": np.zeros(0, dtype=bool), "steps": np.zeros(0, dtype=np.int64)}
    return {key: np.concatenate([p[key] for p in parts]) for key in ("success", "steps")}


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
    """Run every episode to success, termination or `max_steps`, all in lockstep: at each control
    step the episodes whose action queue is empty get new chunks from one batched policy call.
    Returns per episode `success` (bool) and `steps` (int)."""
    model.eval()
    n = len(episodes)
    envs = SceneEnvironments()
    success = np.zeros(n, dtype=bool)
    steps = np.zeros(n, dtype=np.int64)
    try:
        observations = [np.asarray(envs.open(e), dtype=np.float32) for e in episodes]
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
                obs, _, terminated, truncated, info = envs.envs[i].step(np.clip(queues[i].pop(0), -1.0, 1.0))
                observations[i] = np.asarray(obs, dtype=np.float32)
                steps[i] += 1
                if info.get("success"):
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
    return {"success": success, "steps": steps}


def expert_successes(episodes: Sequence[Episode], max_steps: int) -> np.ndarray:
    """The scripted expert on the same scenes, one episode at a time (it needs no network)."""
    runner = EpisodeRunner()
    out = np.zeros(len(episodes), dtype=bool)
    try:
        for k, e in enumerate(episodes):
            env, obs = runner.env(e.task, e.variant)
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
    model: torch.nn.Module, tasks: List[str], instruction_table: torch.Tensor, evaluate: Any, flow: Any, progress=None
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
