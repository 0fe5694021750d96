"""Rollout throughput: env steps per second of the lockstep engine (one batched policy call per
control step, groups of episodes spread over worker processes) against the simulator alone
stepping the same scenes on the same cores, and against one episode at a time with a policy call
per episode -- same process, same episodes, environment creation and reset included everywhere.

    python benchmarks/rollout_throughput.py [--episodes-per-task 5] [--max-steps 150] [--workers 2] [--no-ray]

With Ray installed, the same episodes also run as Ray tasks on a local instance with as many CPUs
as workers (rollout.executor=ray): local pool vs Ray on the same machine, same outcomes.

The simulator-alone figure opens the same scenes and steps each for as many steps as the lockstep
run took there, with zero actions, on the same number of processes: the physical bound of any
rollout engine on these cores. For the vision policy (tiny_vla_vision on the corner camera) the
bound also renders that camera at every step, as the engine does at every policy call.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from benchlib import REPO, default_policy, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.envs import simulator
from vlaeval.envs.episodes import Episode
from vlaeval.rollouts.engine import rollout_episodes


def simulate(episodes, steps, cameras=(), image_size=64) -> None:
    """Open each episode's scene and step it `steps` times with zero actions, rendering `cameras`
    at every step (as the engine does for a policy that reads them, one chunk action per call)."""
    envs = simulator().environments(cameras, image_size)
    try:
        zero = np.zeros(4)
        for k, (e, n) in enumerate(zip(episodes, steps)):
            envs.open(e)
            for _ in range(int(n)):
                envs.step(k, zero)
                envs.images(k)
    finally:
        envs.close()


def simulator_alone(episodes, steps, workers: int, cameras=(), image_size=64) -> float:
    started = time.perf_counter()
    if workers <= 1:
        simulate(episodes, steps, cameras, image_size)
    else:
        parts = [(episodes[i::workers], steps[i::workers], cameras, image_size) for i in range(workers)]
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            list(pool.map(simulate, *zip(*parts)))
    return time.perf_counter() - started


def measure(name, cfg, data, handle, episodes_per_task, max_steps, workers, ray_too) -> Dict[str, Any]:
    """Env steps/s of the lockstep engine on 1 process and on `workers`, one episode at a time, and
    on Ray, against the simulator (plus the renderer of the policy's cameras) alone."""
    tasks = data.demonstrations.tasks
    sim = simulator()
    for task in tasks:  # built once per process before any timing (and inherited by forked workers)
        sim.prepare(task, 0)
    plan = sim.episode_plan(tasks, episodes_per_task, int(cfg.evaluate.seed), sim.held_out_variants)
    episodes = [Episode(p["task"], p["task_index"], p["variant"], p["seed"]) for p in plan]
    common = dict(execute_actions=int(cfg.evaluate.execute_actions), max_steps=max_steps)
    group = -(-len(episodes) // (2 * workers))  # two groups per worker
    policy = data.bind(handle.model, cfg.flow)

    def timed(**kwargs):
        started = time.perf_counter()
        out = rollout_episodes(policy, episodes, **common, **kwargs)
        return out, time.perf_counter() - started

    lockstep_1, lockstep_1_s = timed(group_size=group, workers=1)
    lockstep_w, lockstep_w_s = timed(group_size=group, workers=workers)
    single, single_s = timed(group_size=1, workers=1)
    assert np.array_equal(lockstep_1.success, lockstep_w.success)  # workers change only the speed
    on_ray_s = None
    if ray_too:
        import ray

        from vlaeval.rollouts.executors import RayExecutor

        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        executor = RayExecutor()
        timed(group_size=group, executor=executor)  # warm: the workers start and build the scenes once
        on_ray, on_ray_s = timed(group_size=group, executor=executor)
        ray.shutdown()
        assert np.array_equal(on_ray.steps, lockstep_1.steps)  # the executor changes only the speed
    steps = lockstep_1.steps
    total = int(steps.sum())
    cameras, size = policy.cameras, policy.image_size
    bound_1 = total / simulator_alone(episodes, steps, 1, cameras, size)
    bound_w = total / simulator_alone(episodes, steps, workers, cameras, size)
    summary = {
        "policy": name,
        "cameras": list(cameras),
        "image_size": size if cameras else None,
        "tasks": list(tasks),
        "episodes": len(episodes),
        "env_steps": total,
        "lockstep_group": group,
        "workers": workers,
        "simulator_alone_steps_per_second_1_process": bound_1,
        "simulator_alone_steps_per_second_workers": bound_w,
        "lockstep_steps_per_second_1_process": total / lockstep_1_s,
        "lockstep_steps_per_second_workers": total / lockstep_w_s,
        "one_at_a_time_steps_per_second": int(single.steps.sum()) / single_s,
        "lockstep_fraction_of_bound_1_process": (total / lockstep_1_s) / bound_1,
        "lockstep_fraction_of_bound_workers": (total / lockstep_w_s) / bound_w,
        "lockstep_speedup_over_one_at_a_time": (total / lockstep_1_s) / (int(single.steps.sum()) / single_s),
        "success_rate": float(lockstep_1.success.mean()),
        "ray_steps_per_second_workers": None if on_ray_s is None else total / on_ray_s,
        "ray_fraction_of_local_pool": None if on_ray_s is None else lockstep_w_s / on_ray_s,
    }
    seen = f" rendering {', '.join(cameras)} at {size}x{size}" if cameras else ""
    print(f"{name}: {len(episodes)} episodes, {total} env steps{seen}, groups of {group}")
    print(
        f"  simulator{' + renderer' if cameras else ''} alone: {bound_1:,.0f} steps/s on 1 process, {bound_w:,.0f} on {workers}"
    )
    print(
        f"  lockstep engine: {total / lockstep_1_s:,.0f} steps/s on 1 process "
        f"({summary['lockstep_fraction_of_bound_1_process']:.0%} of the bound), {total / lockstep_w_s:,.0f} on "
        f"{workers} ({summary['lockstep_fraction_of_bound_workers']:.0%})"
    )
    print(
        f"  one episode at a time: {summary['one_at_a_time_steps_per_second']:,.0f} steps/s "
        f"(lockstep {summary['lockstep_speedup_over_one_at_a_time']:.1f}x faster)"
    )
    if on_ray_s is not None:
        print(
            f"  Ray tasks on a local instance ({workers} CPUs, warm workers): {total / on_ray_s:,.0f} steps/s "
            f"({summary['ray_fraction_of_local_pool']:.2f}x the local pool)"
        )
    return summary


def inside_the_gauntlet(workers: int) -> Dict[str, Any]:
    """The rollout gauntlet's own env steps/s (its rollouts' wall time, episodes produced batch by
    batch as the test asks) for the vision policy on the visual and language strata, against the
    simulator and renderer alone on the very episodes it ran (read back from its paired outcomes)."""
    import json
    import subprocess
    import sys
    import tempfile

    import pandas as pd

    with tempfile.TemporaryDirectory() as work:
        run = Path(work) / "run"
        overrides = [
            "job=gauntlet",
            "model=tiny_vla_vision_small",
            "strata=vision",
            "outcomes=rollout_vision_small",
            "outcomes.max_steps=150",
            "outcomes.batch_units=48",
            "tracking=disabled",
            "gauntlet.plot=false",
            "gauntlet.preflight=off",
            f"rollout.workers={workers}",
            f"paths.cache_dir={Path(work) / 'cache'}",
            f"hydra.run.dir={run}",
        ]
        subprocess.run([sys.executable, str(REPO / "main.py"), *overrides], check=True, capture_output=True)
        result = json.loads((run / "result.json").read_text())
        pairs = pd.read_csv(result["rollouts"]["paired_outcomes"])
    episodes, steps = [], []
    for row in pairs.itertuples():
        scene, seed = str(row.scenario_id).split(":", 1)[1].rsplit("/seed-", 1)
        task, family, variant = scene.split("/")
        episode = Episode(task, 0, int(variant.split("-")[1]), int(seed), family=int(family.split("-")[1]))
        episodes += [episode, episode]
        steps += [int(row.baseline_steps), int(row.candidate_steps)]
    total = int(sum(steps))
    bound = total / simulator_alone(episodes, np.array(steps), workers, ["observation.images.corner"], 64)
    rate = float(result["rollouts"]["env_steps_per_s"])
    print(
        f"inside the rollout gauntlet: {rate:,.0f} steps/s on {workers} workers, {rate / bound:.0%} of the bound ({bound:,.0f})"
    )
    return {
        "episodes": len(episodes),
        "env_steps": total,
        "gauntlet_steps_per_second": rate,
        "bound_steps_per_second": bound,
        "fraction_of_bound": rate / bound,
        "workers": workers,
    }


def table(summary: Dict[str, Any]) -> str:
    w = summary["workers"]
    bound = (
        "the simulator and renderer alone (no policy): the bound"
        if summary["cameras"]
        else ("the simulator alone (no policy): the bound")
    )
    rows = [
        (
            bound,
            f"{summary['simulator_alone_steps_per_second_1_process']:,.0f}",
            f"{summary['simulator_alone_steps_per_second_workers']:,.0f}",
        ),
        (
            "lockstep engine",
            f"{summary['lockstep_steps_per_second_1_process']:,.0f} ({summary['lockstep_fraction_of_bound_1_process']:.0%} of the bound)",
            f"{summary['lockstep_steps_per_second_workers']:,.0f} ({summary['lockstep_fraction_of_bound_workers']:.0%})",
        ),
        ("one episode at a time", f"{summary['one_at_a_time_steps_per_second']:,.0f}", "—"),
    ]
    if summary["ray_steps_per_second_workers"] is not None:
        rows.append(
            ("Ray tasks, a local instance (warm workers)", "—", f"{summary['ray_steps_per_second_workers']:,.0f}")
        )
    seen = (
        f"; the policy reads {', '.join(summary['cameras'])}, rendered at {summary['image_size']}x{summary['image_size']} "
        "at every policy call"
        if summary["cameras"]
        else ""
    )
    return (
        f"**{summary['policy']}**: {summary['episodes']} held-out episodes ({', '.join(summary['tasks'])}), "
        f"{summary['env_steps']:,} environment steps, lockstep groups of {summary['lockstep_group']}{seen}. "
        f"Lockstep is {summary['lockstep_speedup_over_one_at_a_time']:.1f}x faster than one episode at a time.\n\n"
        + markdown_table(["how", "steps/s, 1 process", f"steps/s, {w} workers"], rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes-per-task", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray executor")
    parser.add_argument("--no-vision", action="store_true", help="skip the vision policy (rendered cameras)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "rollout_throughput.json")
    args = parser.parse_args()
    policies: Dict[str, List[str]] = {"tiny_vla (state)": []}
    if not args.no_vision:
        policies["tiny_vla_vision (corner camera)"] = ["model=tiny_vla_vision", "data=metaworld_vision"]
    out = {}
    for name, overrides in policies.items():
        cfg, data, handle = default_policy(overrides)
        out[name] = measure(
            name, cfg, data, handle, args.episodes_per_task, args.max_steps, args.workers, not args.no_ray
        )
    gauntlet = None if args.no_vision else inside_the_gauntlet(args.workers)
    atomic_write_json(args.out, {**out, "inside_the_gauntlet": gauntlet})
    inside = (
        ""
        if gauntlet is None
        else f"\n\n**Inside the rollout gauntlet** (`model=tiny_vla_vision_small strata=vision "
        f"outcomes=rollout_vision_small`, 150 steps, 48 pairs a batch, {gauntlet['workers']} workers): "
        f"{gauntlet['gauntlet_steps_per_second']:,.0f} environment steps/s over {gauntlet['episodes']} episodes, "
        f"{gauntlet['fraction_of_bound']:.0%} of the simulator and renderer alone on the same episodes "
        f"({gauntlet['bound_steps_per_second']:,.0f} steps/s)."
    )
    write_figures(
        "rollout_throughput",
        "Closed-loop rollout throughput",
        "python benchmarks/rollout_throughput.py",
        "Environment steps per second of the lockstep engine against the simulator alone -- and, for a policy "
        "that reads a camera, the simulator plus the offscreen renderer (OSMesa on the CPU) rendering that "
        "camera as often -- on the same episodes and cores: the bound of any rollout engine here. The outcomes "
        "are identical whatever the workers and groups (tested).\n\n"
        + "\n\n".join(table(summary) for summary in out.values())
        + inside,
    )


if __name__ == "__main__":
    main()
