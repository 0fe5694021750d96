"""Can the vision policy's encoder find the goal in what the camera shows? The gate before any policy
is trained on pixels: the encoder (tiny_vla_vision's ImageEncoder, keypoints and all) trained to
regress the goal's x, y, z from one frame, directly supervised, and scored on scenes it never saw.
If it cannot find the goal with the goal as its only target, no behaviour-cloning recipe will.

    python benchmarks/goal_visibility.py [--steps 1500] [--only NAME ...]

Frames: the first frame of each scene variant 0-49 of variant families 0, 2, 3 (training) and 4
(held out) for the six tasks whose goal moves and is marked by Meta-World's `goal` site (reach, push,
pick-place, with and without the wall): 900 training frames, 300 held-out. Each arm renders them its
own way (the renderer's goal marker, the frame size, the cameras). Score: R^2 of the held-out goal
x, y, z, within each task (each task's own mean is the baseline: what the image says beyond which
task it is), averaged over the tasks and the coordinates that move.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from benchlib import REPO, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.envs.metaworld import VARIANTS_PER_TASK, EpisodeRunner
from vlaeval.envs.rendering import GOAL_MARKER_RADIUS, SceneCameras, camera_key
from vlaeval.policy.tiny_vla_vision import ImageEncoder, random_shift

TASKS = ("reach-v3", "push-v3", "pick-place-v3", "reach-wall-v3", "push-wall-v3", "pick-place-wall-v3")
TRAIN_FAMILIES, HELD_OUT_FAMILY = (0, 2, 3), 4
GOAL = slice(36, 39)  # Meta-World's observation: the goal's x, y, z
# name: (what it shows, goal marker radius (None: Meta-World's own site), frame size, cameras,
# training scenes per task (None: all 150))
ARMS: Dict[str, Tuple[str, Optional[float], int, Sequence[str], Optional[int]]] = {
    "site": ("Meta-World's goal site, 64x64 corner", None, 64, ("corner",), None),
    "site_128": ("Meta-World's goal site, 128x128 corner", None, 128, ("corner",), None),
    "marker": (
        f"the renderer's goal marker ({GOAL_MARKER_RADIUS * 100:.0f} cm), 64x64 corner",
        GOAL_MARKER_RADIUS,
        64,
        ("corner",),
        None,
    ),
    "marker_two_cameras": ("the marker, 64x64 corner + corner4", GOAL_MARKER_RADIUS, 64, ("corner", "corner4"), None),
    # As many goals per task as data=metaworld_vision's 72 demonstrations hold (12 scenes a task):
    "marker_12_scenes": (
        "the marker, 64x64 corner, 12 training scenes a task",
        GOAL_MARKER_RADIUS,
        64,
        ("corner",),
        12,
    ),
}


def frames(
    marker: Optional[float], size: int, cameras: Sequence[str]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(images uint8 (N, 3 * cameras, size, size), goals (N, 3), task index (N,), family (N,))."""
    runner = EpisodeRunner()
    renderers: Dict[int, SceneCameras] = {}
    images, goals, tasks, families = [], [], [], []
    try:
        for k, task in enumerate(TASKS):
            for family in (*TRAIN_FAMILIES, HELD_OUT_FAMILY):
                for variant in range(VARIANTS_PER_TASK):
                    env, obs = runner.env(task, family * VARIANTS_PER_TASK + variant)
                    if id(env) not in renderers:
                        renderers[id(env)] = SceneCameras(env.unwrapped.model, cameras, size, goal_marker=marker)
                    shown = renderers[id(env)].render(env.unwrapped.data)
                    images.append(np.concatenate([shown[camera_key(c)] for c in cameras], axis=-1).transpose(2, 0, 1))
                    goals.append(np.asarray(obs[GOAL], dtype=np.float32))
                    tasks.append(k)
                    families.append(family)
    finally:
        for renderer in renderers.values():
            renderer.close()
        runner.close()
    return np.stack(images), np.stack(goals), np.array(tasks), np.array(families)


def within_task_r2(predicted: np.ndarray, goals: np.ndarray, tasks: np.ndarray) -> float:
    scores: List[float] = []
    for k in np.unique(tasks):
        y, p = goals[tasks == k], predicted[tasks == k]
        moving = y.std(0) > 1e-4
        residual = ((p - y) ** 2)[:, moving].sum(0)
        scores.extend(1.0 - residual / ((y - y.mean(0)) ** 2)[:, moving].sum(0))
    return float(np.mean(scores))


def run_arm(name: str, steps: int) -> Dict[str, Any]:
    what, marker, size, cameras, scenes = ARMS[name]
    started = time.perf_counter()
    images, goals, tasks, families = frames(marker, size, cameras)
    render_s = time.perf_counter() - started
    train = families != HELD_OUT_FAMILY
    if scenes is not None:  # the first `scenes` of each task's training scenes, in a seeded order
        order = np.random.default_rng(0).permutation(len(train))
        kept = np.zeros_like(train)
        for k in range(len(TASKS)):
            kept[[i for i in order if train[i] and tasks[i] == k][:scenes]] = True
        train = kept
    mean, sd = goals[train].mean(0), goals[train].std(0) + 1e-6
    x = torch.from_numpy(images).float() / 255.0
    y = torch.from_numpy((goals - mean) / sd)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    # The vision policy's own encoder (its keypoints layer-normed: no statistics to measure first).
    encoder = ImageEncoder(32, keypoint_norm="layernorm", in_channels=x.shape[1])
    head = nn.Linear(64, 3)
    optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=1e-3)
    rows = torch.from_numpy(np.flatnonzero(train))
    started = time.perf_counter()
    for _ in range(steps):
        batch = rows[torch.randint(0, len(rows), (64,), generator=generator)]
        loss = ((head(encoder(random_shift(x[batch], 4))) - y[batch]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    train_s = time.perf_counter() - started
    encoder.eval()
    with torch.no_grad():
        predicted = head(encoder(x)).numpy() * sd + mean
    held_out = families == HELD_OUT_FAMILY
    out = {
        "what": what,
        "marker_radius": marker,
        "size": size,
        "cameras": list(cameras),
        "frames": {"train": int(train.sum()), "held_out": int(held_out.sum())},
        "training_scenes_per_task": int(train.sum()) // len(TASKS),
        "r2_held_out": within_task_r2(predicted[held_out], goals[held_out], tasks[held_out]),
        "r2_train": within_task_r2(predicted[train], goals[train], tasks[train]),
        "r2_held_out_per_task": {
            t: within_task_r2(
                predicted[held_out & (tasks == k)], goals[held_out & (tasks == k)], tasks[held_out & (tasks == k)]
            )
            for k, t in enumerate(TASKS)
        },
        "render_seconds": render_s,
        "train_seconds": train_s,
    }
    print(
        f"{name}: held-out within-task R^2 {out['r2_held_out']:.2f} (training scenes {out['r2_train']:.2f})", flush=True
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--only", nargs="*", default=None, choices=list(ARMS), help="arms to measure; keep the others")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "goal_visibility.json")
    args = parser.parse_args()
    saved = json.loads(args.out.read_text()) if args.only is not None and args.out.exists() else {}
    results: Dict[str, Any] = saved.get("arms", {})
    for name in list(ARMS) if args.only is None else args.only:
        results[name] = run_arm(name, args.steps)
        atomic_write_json(args.out, {"steps": args.steps, "arms": results})
    rows = [
        (
            name,
            r["what"],
            f"{r['r2_held_out']:.2f}",
            " / ".join(f"{v:.2f}" for v in r["r2_held_out_per_task"].values()),
            str(r.get("training_scenes_per_task", 150)),
            f"{r['r2_train']:.2f}",
            f"{r['render_seconds']:.0f} / {r['train_seconds']:.0f}",
        )
        for name, r in ((n, results[n]) for n in ARMS if n in results)
    ]
    body = (
        f"The vision policy's image encoder trained {args.steps:,} steps (batch 64, AdamW 1e-3, random shift 4 px) "
        "to regress the goal's x, y, z from the first frame of 150 training scenes per task (fewer where the row "
        "says), and scored on 50 scenes of another variant family. R^2 within each task, averaged over the tasks and the coordinates that "
        "move: 0 is knowing only which task it is.\n\n"
        + markdown_table(
            (
                "arm",
                "what the camera shows",
                "held-out R^2",
                "per task: " + " / ".join(t.removesuffix("-v3") for t in TASKS),
                "training scenes a task",
                "R^2 on them",
                "render / train s",
            ),
            rows,
        )
    )
    write_figures("goal_visibility", "Can the encoder find the goal?", "python benchmarks/goal_visibility.py", body)


if __name__ == "__main__":
    main()
