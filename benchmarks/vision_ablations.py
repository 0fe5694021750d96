"""What makes the built-in vision policy see: each change to its encoder, its inputs and its training
recipe, one at a time, on the benchmark's data, with held-out success and its interval, how far its
keypoints move across images and how well a linear probe reads the object's position from the image
features that reach the policy; and the same recipe on the state policy, which must not get worse.

    python benchmarks/vision_ablations.py [--episodes 10] [--steps 3000] [--cache-dir DIR] [--only ARM ...]

Every arm trains on data=metaworld_vision (72 demonstrations of the six default tasks, the corner
camera) for --steps steps and is evaluated on the same held-out episodes (10 per task) beside the
scripted expert. `--only` re-measures some arms and keeps the others' last figures (the page shows
them all); a cache folder keeps the checkpoints between runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from benchlib import REPO, compose_default, markdown_table, rate, show, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.envs.rendering import RENDERER_VERSION
from vlaeval.policy.builtin import PolicySpec, checkpoint_key, obtain_policy, prepare_data
from vlaeval.rollouts.engine import evaluate_closed_loop

E = "2.718281828459045"  # the sharpness the encoder started from before (exp(1))
BEFORE = ["model.keypoint_norm=none", f"model.sharpness={E}"]  # the encoder as it was
RECIPE = ["train.warmup_steps=200", "train.grad_clip_norm=1.0", "train.ema_decay=0.999"]
NO_RECIPE = ["train.warmup_steps=0", "train.grad_clip_norm=null", "train.ema_decay=null"]
NORMALISED = ["model.keypoint_norm=standardise", f"model.sharpness={E}"]
CROP = ["data.image_size=96", "model.crop=[0.25,0.15,0.65,0.8]"]
SECOND_CAMERA = [
    "data.cameras=[corner,corner4]",
    "model.cameras=[observation.images.corner,observation.images.corner4]",
]
DRAWS = ["train.draws_per_anchor=4"]
LOCATE = "model.locate=[4,5,6,36,37,38]"  # the object's and the goal's x, y, z
VISION = "tiny_vla_vision"
# name: (what it changes, model, overrides, whether to probe the blanked camera)
ARMS: Dict[str, Any] = {
    "before": ("the encoder and recipe as they were", VISION, [*BEFORE, *NO_RECIPE], True),
    "layernorm": (
        "+ LayerNorm of the keypoints",
        VISION,
        ["model.keypoint_norm=layernorm", f"model.sharpness={E}", *NO_RECIPE],
        False,
    ),
    "standardise": ("+ fixed standardisation of the keypoints", VISION, [*NORMALISED, *NO_RECIPE], True),
    "sharpness": (
        "+ standardisation, initial sharpness 20",
        VISION,
        ["model.keypoint_norm=standardise", "model.sharpness=20", *NO_RECIPE],
        False,
    ),
    "recipe": ("+ standardisation, warmup, clipping, EMA", VISION, [*NORMALISED, *RECIPE], True),
    "draws": (
        "+ recipe, 4 flow draws per anchor (64 images a step)",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS],
        True,
    ),
    "draws_long": (
        "+ recipe, 4 draws, 8x the steps",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, "+steps_factor=8"],
        True,
    ),
    # Measured against `draws` (the recipe at 4 draws per anchor, which trains them 6-8x faster):
    "crop": ("+ draws, workspace crop of a 96x96 render", VISION, [*NORMALISED, *RECIPE, *DRAWS, *CROP], False),
    "film": ("+ draws, FiLM on the instruction", VISION, [*NORMALISED, *RECIPE, *DRAWS, "model.film=true"], False),
    "second_camera": (
        "+ draws, a second camera (corner4)",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, *SECOND_CAMERA],
        False,
    ),
    "two_frames": (
        "+ draws, the previous frame too (history 2)",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, "model.history=2"],
        False,
    ),
    # Measured with the goal drawn visibly (renderer 3; the rows above drew Meta-World's own goal site):
    "marker": ("+ draws, the goal drawn as a 4 cm marker", VISION, [*NORMALISED, *RECIPE, *DRAWS], True),
    "locate": (
        "+ marker, the image features taught where the object and goal are",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, LOCATE],
        True,
    ),
    "locate_two_cameras": (
        "+ locate, a second camera (corner4)",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, LOCATE, *SECOND_CAMERA],
        True,
    ),
    # Measured against `locate_two_cameras` (the best arm at 3k steps):
    "two_cameras_long": (
        "+ locate_two_cameras, 8x the steps",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, LOCATE, *SECOND_CAMERA, "+steps_factor=8"],
        True,
    ),
    "two_cameras_film": (
        "+ locate_two_cameras, FiLM on the instruction",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, LOCATE, *SECOND_CAMERA, "model.film=true"],
        False,
    ),
    "two_cameras_two_frames": (
        "+ locate_two_cameras, the previous frame too (history 2)",
        VISION,
        [*NORMALISED, *RECIPE, *DRAWS, LOCATE, *SECOND_CAMERA, "model.history=2"],
        False,
    ),
    "state_before": ("state policy, recipe off", "tiny_vla", NO_RECIPE, False),
    "state_recipe": ("state policy, recipe on", "tiny_vla", RECIPE, False),
}
OBJECT_XY = slice(4, 6)  # Meta-World's observation: the first object's x, y
OBJECT_XYZ, GOAL_XYZ = slice(4, 7), slice(36, 39)  # ... the first object's and the goal's position


def image_features(model: Any, batch: Dict[str, torch.Tensor]) -> Dict[str, np.ndarray]:
    """The raw keypoints (B, 2C per camera) and the features that reach the fusion MLP (image, text, state)."""
    with torch.no_grad():
        read = model.text(batch["instruction"])
        raw: List[torch.Tensor] = []
        seen = []
        for encoder, camera in zip(model.images, model.cameras):
            # The spatial softmax's output (before the keypoints' norm) as the encoder computes it.
            hook = encoder.layers[-1].register_forward_hook(lambda module, args, output: raw.append(output))
            try:
                seen.append(encoder(model.pixels(batch[camera]), read))
            finally:
                hook.remove()
        state = model.normalise(batch["observation"])[:, : model.state_dims]
    return {
        "keypoints": torch.cat(raw, -1).numpy(),
        "image": torch.cat(seen, -1).numpy(),
        "text": read.numpy(),
        "state": state.numpy(),
    }


def ridge_r2(x: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray, alpha: float = 1e-2) -> float:
    """Held-out R^2 (averaged over y's columns) of a ridge regression of y on standardised x."""
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-8
    z = (x - mu) / sd
    z = np.concatenate([z, np.ones((len(z), 1))], 1)
    a = z[train]
    w = np.linalg.solve(a.T @ a + alpha * len(train) * np.eye(a.shape[1]), a.T @ y[train])
    residual = y[test] - z[test] @ w
    return float(np.mean(1.0 - residual.var(0) / y[test].var(0)))


def diagnostics(data: Any, policy: Any) -> Dict[str, float]:
    """Keypoint spread (SD across images, in pixels of the model's image), the image features' scale
    against the text and state features at the concatenation, and the probe's held-out R^2 for the
    object's x, y (episodes split in halves, alternately)."""
    anchors = data.anchors
    index = np.arange(0, len(anchors), 3)
    feats = image_features(policy.model, policy.anchor_batch(anchors, index))
    episode = anchors.trajectory_index[index]
    test = np.flatnonzero(episode % 2 == 1)
    train = np.flatnonzero(episode % 2 == 0)
    target = anchors.observations[index][:, OBJECT_XY]
    size = int(policy.model.image_size)
    return {
        "keypoint_sd_pixels": float(feats["keypoints"].std(0).mean() * size / 2),
        "image_feature_sd": float(feats["image"].std(0).mean()),
        "text_feature_sd": float(feats["text"].std(0).mean()),
        "state_feature_sd": float(feats["state"].std(0).mean()),
        "probe_r2_object_xy": ridge_r2(feats["image"], target, train, test),
        "probe_r2_object_xy_keypoints": ridge_r2(feats["keypoints"], target, train, test),
        "probe_r2_object_within_task": within_task_r2(
            feats["image"], anchors.observations[index][:, OBJECT_XYZ], anchors.task_index[index], train, test
        ),
        "probe_r2_goal_within_task": within_task_r2(
            feats["image"], anchors.observations[index][:, GOAL_XYZ], anchors.task_index[index], train, test
        ),
        "sharpness": float(np.mean([e.layers[-1].log_sharpness.exp().item() for e in policy.model.images])),
    }


def within_task_r2(x: np.ndarray, y: np.ndarray, task: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    """The probe's held-out R^2 within each task (what the image tells beyond which task it is: the
    goal's position differs between tasks more than within one), averaged over the tasks where the
    target varies; coordinates that never vary within a task are left out."""
    scores = []
    for t in np.unique(task):
        tr, te = train[task[train] == t], test[task[test] == t]
        moving = y[te].std(0) > 1e-6
        if len(tr) > x.shape[1] // 4 and moving.any():
            scores.append(ridge_r2(x, y[:, moving], tr, te))
    return float(np.mean(scores))


# The arm that paid (docs/figures/vision_ablations.md): what benchmarks/vision_policy.py trains.
BEST_VISION_ARM = "two_cameras_long"


def arm_overrides(name: str, steps: int) -> List[str]:
    """An arm's config overrides at `steps` base steps (its "+steps_factor=K" multiplies them)."""
    _, model, overrides, _ = ARMS[name]
    # "+steps_factor=K": the arm trains K times --steps (a benchmark setting, not the config's).
    factor = next((int(o.split("=")[1]) for o in overrides if o.startswith("+steps_factor=")), 1)
    return [
        f"model={model}",
        f"train.steps={steps * factor}",
        *[o for o in overrides if not o.startswith("+steps_factor=")],
    ]


def arm_config(name: str, args: Any, cache: str) -> Any:
    _, model, overrides, blanked = ARMS[name]
    conditions = ["+evaluate.conditions={blanked:{perturbation:{blank_camera:true}}}"] if blanked else []
    return compose_default(
        [
            f"paths.cache_dir={cache}",
            "data=metaworld_vision",
            f"evaluate.episodes_per_task={args.episodes}",
            *conditions,
            *arm_overrides(name, args.steps),
        ]
    )


def rediagnose(name: str, args: Any, cache: str, saved: Dict[str, Any]) -> None:
    """The diagnostics of an arm measured before, from its cached checkpoint (no training, no rollouts)."""
    cfg = arm_config(name, args, cache)
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    if not (Path(cache) / "checkpoints" / checkpoint_key(PolicySpec.of(cfg), data)).is_dir():
        # Trained under settings the code has since grown (its key moved): kept as measured.
        print(f"{name}: no checkpoint under today's key in {cache}; its diagnostics stay as measured")
        return
    handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
    saved["diagnostics"] = diagnostics(data, data.bind(handle.model, cfg.flow))
    print(f"{name}: diagnostics {saved['diagnostics']}")


def run_arm(name: str, args: Any, cache: str) -> Dict[str, Any]:
    what, model, overrides, blanked = ARMS[name]
    cfg = arm_config(name, args, cache)
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    started = time.perf_counter()
    handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
    train_s = time.perf_counter() - started
    policy = data.bind(handle.model, cfg.flow)
    evaluation = evaluate_closed_loop(
        policy, data.demonstrations.tasks, cfg.evaluate, cfg.rollout
    ).to_json()  # the result.json layout
    n = sum(t["episodes"] for t in evaluation["per_task"].values())
    k = int(round(evaluation["policy_success_rate"] * n))
    out: Dict[str, Any] = {
        "what": what,
        "model": model,
        "overrides": overrides,
        "steps": int(cfg.train.steps),
        "success": rate(k, n),
        "expert_success_rate": evaluation["expert_success_rate"],
        "per_task": {t: r["policy_success_rate"] for t, r in evaluation["per_task"].items()},
        "final_loss": handle.sidecar["metrics"]["final_loss"],
        "train_seconds": handle.sidecar["metrics"]["train_seconds"],
        "trained_now_seconds": train_s if handle.trained_now else None,
        "renderer": RENDERER_VERSION if model == VISION else None,
    }
    if blanked:
        c = next(iter(evaluation["conditions"].values()))
        out["blanked"] = rate(int(round(c["policy_success_rate"] * n)), n)
    if model == "tiny_vla_vision":
        out["diagnostics"] = diagnostics(data, policy)
    print(f"{name}: {what}: success {show(out['success'])}" + (f", diagnostics {out.get('diagnostics')}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=10, help="held-out episodes per task")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--cache-dir", default=None, help="an existing cache folder (default: a fresh one)")
    parser.add_argument("--only", nargs="*", default=None, choices=list(ARMS), help="arms to measure, in this order")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vision_ablations.json")
    parser.add_argument(
        "--rediagnose",
        action="store_true",
        help="recompute the saved vision arms' diagnostics from the checkpoints in --cache-dir, running nothing else",
    )
    args = parser.parse_args()
    if args.rediagnose:
        saved_all = json.loads(args.out.read_text())
        for name, row in saved_all["arms"].items():
            if row["model"] == VISION:
                rediagnose(name, args, args.cache_dir, row)
                atomic_write_json(args.out, saved_all)
        args.only = []  # rewrite the page from what is saved
    saved: Dict[str, Any] = json.loads(args.out.read_text()) if args.only is not None and args.out.exists() else {}
    results: Dict[str, Any] = saved.get("arms", {})
    with tempfile.TemporaryDirectory() as fresh:
        for name in list(ARMS) if args.only is None else args.only:  # --only: in the order given
            results[name] = run_arm(name, args, args.cache_dir or fresh)
            atomic_write_json(args.out, {"steps": args.steps, "episodes": args.episodes, "arms": results})
    write_figures(
        "vision_ablations",
        "What makes the vision policy see",
        f"python benchmarks/vision_ablations.py --episodes {args.episodes} --steps {args.steps}",
        body(results, args),
        one_seed=True,
    )


def body(results: Dict[str, Any], args: Any) -> str:
    rows: List[Sequence[Any]] = []
    for name in ARMS:
        if name not in results:
            continue
        r = results[name]
        d = r.get("diagnostics", {})
        rows.append(
            (
                name,
                r["what"],
                show(r["success"]),
                show(r["blanked"]) if "blanked" in r else "",
                f"{d['keypoint_sd_pixels']:.2f}" if d else "",
                f"{d['image_feature_sd']:.3f} / {d['text_feature_sd']:.3f} / {d['state_feature_sd']:.3f}" if d else "",
                f"{d['probe_r2_object_xy']:.2f}" if d else "",
                f"{d['probe_r2_object_within_task']:.2f} / {d['probe_r2_goal_within_task']:.2f}"
                if "probe_r2_goal_within_task" in d
                else "",
                f"{r['final_loss']:.4f}",
                str(r.get("renderer", 2)) if r["model"] == VISION else "",
                f"{r.get('steps', args.steps):,}",
                f"{r['train_seconds']:.0f}",
            )
        )
    missing = [name for name in ARMS if name not in results]
    return (
        f"Each arm trains {args.steps:,} steps (unless its row says otherwise) on data=metaworld_vision (72 demonstrations, six tasks) and runs "
        f"{args.episodes} held-out episodes per task; success with its 95% Clopper-Pearson interval, the same "
        "episodes with the camera blanked where probed. Keypoint spread: the SD across training images of each "
        "keypoint, in pixels of the model's image. Feature SD: the mean SD of the image / text / state features "
        "where they are concatenated. Probe R^2: a ridge probe from those image features to the object's x, y, "
        "trained on even episodes, scored on odd ones; within a task: the same probe "
        "fitted and scored per task (what the image tells beyond which task it is), for the object's and the goal's "
        "x, y, z, averaged over the tasks where they move. Training s: the arm's own training clock, under whatever "
        "else the machine ran then (speed is compared in the same process in vision_speed.md). Final loss: the "
        "flow-matching loss (an arm with `model.locate` also minimised its auxiliary loss). Renderer: the "
        "RENDERER_VERSION its frames were drawn with (3 draws the goal as a 4 cm marker; 2 and before, Meta-World's "
        "own 1-2 cm site). Overrides of each arm: "
        "`benchmarks/vision_ablations.py: ARMS`.\n\n"
        + markdown_table(
            [
                "arm",
                "change",
                "held-out success",
                "camera blanked",
                "keypoint spread (px)",
                "feature SD image / text / state",
                "probe R^2",
                "within a task: object / goal",
                "final loss",
                "renderer",
                "steps",
                "training s",
            ],
            rows,
        )
        + (
            f"\n\nArms defined but not measured in this record (`--only {' '.join(missing)}` measures them): "
            + ", ".join(f"{name} ({ARMS[name][0]})" for name in missing)
            + "."
            if missing
            else ""
        )
    )


if __name__ == "__main__":
    main()
