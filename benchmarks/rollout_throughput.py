"""Rollout throughput: env steps per second of the lockstep engine (one batched policy call per
control step, groups of episodes spread over worker processes) against the simulator alone
stepping the same scenes on the same cores, and against one episode at a time with a policy call
per episode -- same process, same episodes, environment creation and reset included everywhere.

    python benchmarks/rollout_throughput.py [--episodes-per-task 5] [--max-steps 150] [--workers 2] [--no-ray]

With Ray installed, the same episodes also run as Ray tasks on a local instance with as many CPUs
as workers (rollout.executor=ray): local pool vs Ray on the same machine, same outcomes.

The simulator-alone figure opens the same scenes and steps each for as many steps as the lockstep
run took there, with zero actions, on the same number of processes: the physical bound of any
rollout engine on these cores.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from benchlib import REPO, default_policy, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.data.metaworld import HELD_OUT_VARIANTS, episode_plan
from vlaeval.envs.metaworld import Episode, SceneEnvironments, task_benchmark
from vlaeval.rollouts.engine import rollout_episodes


def simulate(episodes, steps) -> None:
    envs = SceneEnvironments()
    try:
        zero = np.zeros(4)
        for e, n in zip(episodes, steps):
            envs.open(e)
            for _ in range(int(n)):
                envs.envs[-1].step(zero)
    finally:
        envs.close()


def simulator_alone(episodes, steps, workers: int) -> float:
    started = time.perf_counter()
    if workers <= 1:
        simulate(episodes, steps)
    else:
        halves = [(episodes[i::workers], steps[i::workers]) for i in range(workers)]
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            list(pool.map(simulate, *zip(*halves)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes-per-task", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray executor")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "rollout_throughput.json")
    args = parser.parse_args()
    cfg, data, handle = default_policy()
    tasks = data.demonstrations.tasks
    for task in tasks:  # built once per process before any timing (and inherited by forked workers)
        task_benchmark(task)
    plan = episode_plan(tasks, args.episodes_per_task, int(cfg.evaluate.seed), HELD_OUT_VARIANTS)
    episodes = [Episode(p["task"], p["task_index"], p["variant"], p["seed"]) for p in plan]
    common = dict(execute_actions=int(cfg.evaluate.execute_actions), max_steps=args.max_steps)
    group = -(-len(episodes) // (2 * args.workers))  # two groups per worker

    def timed(**kwargs):
        started = time.perf_counter()
        out = rollout_episodes(data.bind(handle.model, cfg.flow), episodes, **common, **kwargs)
        return out, time.perf_counter() - started

    lockstep_1, lockstep_1_s = timed(group_size=group, workers=1)
    lockstep_w, lockstep_w_s = timed(group_size=group, workers=args.workers)
    single, single_s = timed(group_size=1, workers=1)
    assert np.array_equal(lockstep_1["success"], lockstep_w["success"])  # workers change only the speed
    on_ray_s = None
    if not args.no_ray:
        import ray

        from vlaeval.rollouts.executors import RayExecutor

        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        executor = RayExecutor()
        timed(group_size=group, executor=executor)  # warm: the workers start and build the scenes once
        on_ray, on_ray_s = timed(group_size=group, executor=executor)
        ray.shutdown()
        assert np.array_equal(on_ray["steps"], lockstep_1["steps"])  # the executor changes only the speed
    steps = lockstep_1["steps"]
    total = int(steps.sum())
    bound_1 = total / simulator_alone(episodes, steps, 1)
    bound_w = total / simulator_alone(episodes, steps, args.workers)
    summary = {
        "episodes": len(episodes),
        "env_steps": total,
        "lockstep_group": group,
        "workers": args.workers,
        "simulator_alone_steps_per_second_1_process": bound_1,
        "simulator_alone_steps_per_second_workers": bound_w,
        "lockstep_steps_per_second_1_process": total / lockstep_1_s,
        "lockstep_steps_per_second_workers": total / lockstep_w_s,
        "one_at_a_time_steps_per_second": int(single["steps"].sum()) / single_s,
        "lockstep_fraction_of_bound_1_process": (total / lockstep_1_s) / bound_1,
        "lockstep_fraction_of_bound_workers": (total / lockstep_w_s) / bound_w,
        "lockstep_speedup_over_one_at_a_time": (total / lockstep_1_s) / (int(single["steps"].sum()) / single_s),
        "success_rate": float(lockstep_1["success"].mean()),
        "ray_steps_per_second_workers": None if on_ray_s is None else total / on_ray_s,
        "ray_fraction_of_local_pool": None if on_ray_s is None else lockstep_w_s / on_ray_s,
    }
    print(f"{len(episodes)} episodes, {total} env steps ({', '.join(tasks)}), groups of {group}")
    print(f"  simulator alone: {bound_1:,.0f} steps/s on 1 process, {bound_w:,.0f} on {args.workers}")
    print(
        f"  lockstep engine: {total / lockstep_1_s:,.0f} steps/s on 1 process "
        f"({summary['lockstep_fraction_of_bound_1_process']:.0%} of the bound), {total / lockstep_w_s:,.0f} on "
        f"{args.workers} ({summary['lockstep_fraction_of_bound_workers']:.0%})"
    )
    print(
        f"  one episode at a time: {summary['one_at_a_time_steps_per_second']:,.0f} steps/s "
        f"(lockstep {summary['lockstep_speedup_over_one_at_a_time']:.1f}x faster)"
    )
    if on_ray_s is not None:
        print(
            f"  Ray tasks on a local instance ({args.workers} CPUs, warm workers): {total / on_ray_s:,.0f} steps/s "
            f"({summary['ray_fraction_of_local_pool']:.2f}x the local pool)"
        )
    atomic_write_json(args.out, summary)
    rows = [
        ("the simulator alone (no policy): the bound", f"{bound_1:,.0f}", f"{bound_w:,.0f}"),
        (
            "lockstep engine",
            f"{total / lockstep_1_s:,.0f} ({summary['lockstep_fraction_of_bound_1_process']:.0%} of the bound)",
            f"{total / lockstep_w_s:,.0f} ({summary['lockstep_fraction_of_bound_workers']:.0%})",
        ),
        ("one episode at a time", f"{summary['one_at_a_time_steps_per_second']:,.0f}", "—"),
    ]
    if on_ray_s is not None:
        rows.append(("Ray tasks, a local instance (warm workers)", "—", f"{total / on_ray_s:,.0f}"))
    write_figures(
        "rollout_throughput",
        "Closed-loop rollout throughput",
        "python benchmarks/rollout_throughput.py",
        f"{len(episodes)} held-out episodes of the built-in policy ({', '.join(tasks)}), {total:,} environment "
        f"steps, lockstep groups of {group}; environment steps per second. The lockstep engine is "
        f"{summary['lockstep_speedup_over_one_at_a_time']:.1f}x faster than one episode at a time; the outcomes "
        "are identical whatever the workers and groups (tested).\n\n"
        + markdown_table(["how", "steps/s, 1 process", f"steps/s, {args.workers} workers"], rows),
    )


if __name__ == "__main__":
    main()
