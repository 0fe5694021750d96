"""Pixels and training, faster: what a camera frame costs to render (the full meshes against the
simplified ones the renderer now draws) beside the simulator step it accompanies, and training
steps/s of each built-in policy -- on one thread against two, OpenMP's threads spinning (its
default) against waiting passively (vlaeval's), one flow draw per anchor against four (the vision
recipe's: the encoder runs on a quarter of the images) -- idle and under a competing load.

    python benchmarks/vision_speed.py [--cache-dir DIR] [--frames 300] [--steps 30] [--models ...]

The competing load is two processes multiplying matrices on one thread each (what a test run or
a neighbour's job does to a 2-core machine). Each training measurement runs in a fresh process,
since OpenMP reads its wait policy once, when torch is imported; each is the best of three
repetitions, and every ratio is between measurements taken in the same conditions.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from benchlib import REPO, markdown_table, write_figures

TASKS = ("pick-place-v3", "reach-v3", "push-v3")
POLICIES = {"tiny_vla_vision": "metaworld_vision", "tiny_vla": "metaworld", "tiny_dit": "metaworld"}


def busy(stop: Any) -> None:
    """One core's worth of matrix products until told to stop (the competing load)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np

    a = np.random.default_rng(0).standard_normal((256, 256))
    while not stop.is_set():
        a = np.tanh(a @ a.T / 256.0)


class Load:
    def __init__(self, processes: int) -> None:
        self.stop = multiprocessing.Event()
        self.workers = [multiprocessing.Process(target=busy, args=(self.stop,)) for _ in range(processes)]

    def __enter__(self) -> "Load":
        for w in self.workers:
            w.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for w in self.workers:
            w.join()


def render_costs(frames: int) -> Dict[str, Any]:
    """ms per 64x64 corner frame, full and simplified meshes, and the simulator step, per task."""
    import numpy as np

    import vlaeval  # noqa: F401  (MUJOCO_GL before MuJoCo)
    from vlaeval.envs.metaworld import EpisodeRunner
    from vlaeval.envs.rendering import SceneCameras

    runner = EpisodeRunner()
    out: Dict[str, Any] = {}
    for task in TASKS:
        env, _ = runner.env(task, 0)
        model, data = env.unwrapped.model, env.unwrapped.data
        row: Dict[str, float] = {}
        for name, cell in (("full_meshes_ms", 0.0), ("simplified_ms", None)):
            cameras = SceneCameras(model, ["corner"], 64, mesh_cell=cell)
            for _ in range(20):
                cameras.render(data)
            best = []
            for _ in range(3):
                started = time.perf_counter()
                for _ in range(frames):
                    cameras.render(data)
                best.append((time.perf_counter() - started) / frames * 1000)
            row[name] = min(best)
            cameras.close()
        action = np.zeros(4)
        started = time.perf_counter()
        for _ in range(frames):
            env.step(action)
        row["simulator_step_ms"] = (time.perf_counter() - started) / frames * 1000
        out[task] = row
    runner.close()
    return out


def child(args: Any) -> None:
    """One training measurement in this fresh process: steps/s of `--model` on its data."""
    import numpy as np
    import torch

    from benchlib import compose_default
    from vlaeval.policy.builtin import PolicySpec, build_model, prepare_data
    from vlaeval.policy.training import minibatch_loss

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)  # as train_policy runs
    cfg = compose_default([f"paths.cache_dir={args.cache_dir}", f"data={POLICIES[args.model]}", f"model={args.model}"])
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    model = build_model(PolicySpec.of(cfg), data)
    policy = data.bind(model, cfg.flow)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)

    def step() -> None:
        model.train()
        loss, *_ = minibatch_loss(policy, data.anchors, rng, int(cfg.train.batch_size), None, None, args.draws)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    rates = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(args.steps):
            step()
        rates.append(args.steps / (time.perf_counter() - started))
    print(json.dumps({"steps_per_second": max(rates)}))


def train_rate(model: str, threads: int, wait: str, draws: int, args: Any) -> float:
    env = {**os.environ, "OMP_WAIT_POLICY": wait, "PYTHONPATH": str(REPO)}
    steps = args.steps if model == "tiny_vla_vision" else args.steps * 10
    command = [
        sys.executable,
        __file__,
        "--child",
        "--model",
        model,
        "--threads",
        str(threads),
        "--cache-dir",
        args.cache_dir,
        "--steps",
        str(steps),
        "--draws",
        str(draws),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO / "benchmarks", check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["steps_per_second"])


# (model, threads, OpenMP wait policy, flow draws per anchor); before: two threads spinning (torch's
# defaults here), one draw per anchor.
TRAINING_RUNS = [
    ("tiny_vla_vision", 2, "ACTIVE", 1),  # before
    ("tiny_vla_vision", 2, "PASSIVE", 1),  # vlaeval's threads (every core above 2 GFLOP a step)
    ("tiny_vla_vision", 1, "PASSIVE", 1),
    ("tiny_vla_vision", 2, "PASSIVE", 4),  # after: the vision recipe's 4 draws per anchor
    ("tiny_vla", 2, "ACTIVE", 1),  # before
    ("tiny_vla", 2, "PASSIVE", 1),
    ("tiny_vla", 1, "PASSIVE", 1),  # after: vlaeval's choice (one thread below 2 GFLOP a step)
    ("tiny_dit", 2, "ACTIVE", 1),  # before
    ("tiny_dit", 2, "PASSIVE", 1),
    ("tiny_dit", 1, "PASSIVE", 1),  # after
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "vlaeval-benchmarks"))
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument(
        "--steps", type=int, default=30, help="vision training steps per repetition (x10 for the others)"
    )
    parser.add_argument("--sections", nargs="+", default=["render", "training"], choices=["render", "training"])
    parser.add_argument("--conditions", nargs="+", default=["idle", "under load"], choices=["idle", "under load"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="tiny_vla_vision", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--draws", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vision_speed.json")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    # Sections re-measured keep the others' last figures (the page shows them all).
    out: Dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {"render": {}, "training": []}
    out["training"] = [
        r
        for r in out["training"]
        if not ("training" in args.sections and r["condition"] in args.conditions and r["model"] in args.models)
    ]
    for condition, processes in (("idle", 0), ("under load", 2)):
        if condition not in args.conditions:
            continue
        with Load(processes):
            if "render" in args.sections:
                out["render"][condition] = render_costs(args.frames)
                print(condition, json.dumps(out["render"][condition]))
            for model, threads, wait, draws in TRAINING_RUNS if "training" in args.sections else []:
                if model not in args.models:
                    continue
                rate = train_rate(model, threads, wait, draws, args)
                out["training"].append(
                    {
                        "condition": condition,
                        "model": model,
                        "threads": threads,
                        "wait": wait,
                        "draws": draws,
                        "steps_per_second": rate,
                    }
                )
                print(f"{condition}: {model} {threads} thread(s), {wait}, {draws} draw(s): {rate:.1f} steps/s")
    from vlaeval.artifacts import atomic_write_json

    atomic_write_json(args.out, out)
    write_figures("vision_speed", "Pixels and training, faster", "python benchmarks/vision_speed.py", body(out))


def body(out: Dict[str, Any]) -> str:
    render_rows: List[Any] = []
    for condition, tasks in out["render"].items():
        for task, r in tasks.items():
            render_rows.append(
                (
                    condition,
                    task,
                    f"{r['full_meshes_ms']:.2f}",
                    f"{r['simplified_ms']:.2f}",
                    f"{r['full_meshes_ms'] / r['simplified_ms']:.1f}x",
                    f"{r['simulator_step_ms']:.2f}",
                    f"{r['simulator_step_ms'] + r['simplified_ms']:.2f}",
                )
            )
    before = {
        (r["condition"], r["model"]): r["steps_per_second"]
        for r in out["training"]
        if r["wait"] == "ACTIVE" and r["threads"] == 2 and r.get("draws", 1) == 1
    }
    measured = {(r["condition"], r["model"]) for r in out["training"]}
    absent = [f"{m} ({c})" for c in ("idle", "under load") for m in POLICIES if (c, m) not in measured]
    train_rows = [
        (
            r["condition"],
            r["model"],
            r["threads"],
            r["wait"],
            r.get("draws", 1),
            f"{r['steps_per_second']:.1f}",
            f"{r['steps_per_second'] / before[r['condition'], r['model']]:.2f}x",
        )
        for r in out["training"]
    ]
    return (
        "Rendering one 64x64 corner frame (llvmpipe through OSMesa, one thread), best of three runs, beside the "
        "simulator's step (the work a rollout step cannot avoid: the bound is step + frame):\n\n"
        + markdown_table(
            [
                "condition",
                "task",
                "full meshes ms",
                "simplified ms",
                "speed-up",
                "simulator step ms",
                "step + frame ms",
            ],
            render_rows,
        )
        + "\n\nTraining steps/s at the default batch (256 (anchor, flow draw) pairs), best of three repetitions in a fresh process; the ratio is "
        "against the same policy's setting before this change (two threads, OpenMP spinning) in the same condition; "
        "deterministic algorithms on, as training runs them:\n\n"
        + markdown_table(
            ["condition", "policy", "threads", "OMP_WAIT_POLICY", "draws per anchor", "steps/s", "x before"], train_rows
        )
        + (f"\n\nNot measured in this record: {', '.join(absent)}." if absent else "")
    )


if __name__ == "__main__":
    main()
