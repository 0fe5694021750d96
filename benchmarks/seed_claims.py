"""The repository's claims on five training seeds: each arm trained at seeds 0-4 and run on the test
half of the held-out scenes (the half nothing is chosen on), paired across arms (the same episodes for
every checkpoint), with seed-level means, t-intervals over seeds and paired contrasts, Holm-adjusted
over the page.

    python benchmarks/seed_claims.py [--arms ARM ...] [--seeds 5] [--episodes 20]

Arms (ARMS below): the vision chain of docs/builtin_policy.md (benchmarks/vision_ablations.py's
overrides, the long arms at 24k steps), the state policy and the goal-blind state policy (the goal's
position hidden: model.hidden_state=[36,37,38]), and each vision arm on the same episodes with its
camera blanked and with a counterfactual goal marker (drawn away from the true goal). Every episode
runs to its horizon, so any-step and final-step success come from the same episodes. Every checkpoint
is cached (the built-in checkpoint slot) and a training keeps its state every minute
(train.resume_every_s): a killed run restarts where it was, mid-training included. Each finished arm
is recorded at once, and `--arms` measures some arms and keeps the others' records. Arms not yet
measured are listed with what they cost.

Results in benchmarks/records/seed_claims.json -- tracked, so that arms measured on one machine and
in one session add up with those measured on another (an arm's record names its overrides, seeds and
episodes; a record made under other settings is measured again) -- and docs/figures/seed_claims.md.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
from vision_ablations import DRAWS, LOCATE, NORMALISED, RECIPE, SECOND_CAMERA

from benchlib import REPO, compose_default, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json

STEPS, LONG = 3000, 24000
VISION = ["data=metaworld_vision", "model=tiny_vla_vision"]
STATE = ["data=metaworld", "model=tiny_vla"]
MARKER_SHIFT = 0.15  # metres: the counterfactual marker's distance from the true goal (~7 pixels at 64x64)
# What a camera arm is also run under, on the same episodes: the camera blanked, and the goal marker
# drawn away from the true goal (a policy that finds the goal in its camera must do worse).
CONDITIONS = {
    "blank": {"perturbation": {"blank_camera": True}},
    "counterfactual_marker": {"perturbation": {"goal_marker_shift": MARKER_SHIFT}},
}
# name: (what it is, overrides, evaluated under CONDITIONS too)
ARMS: Dict[str, Tuple[str, List[str], bool]] = {
    "state": ("the state policy (told where the object and goal are), recipe on", [*STATE, *RECIPE], False),
    "state_goal_blind": (
        "the state policy with the goal's position hidden (model.hidden_state=[36,37,38])",
        [*STATE, *RECIPE, "model.hidden_state=[36,37,38]"],
        False,
    ),
    "before": (
        "the vision policy's encoder as it was (no keypoint standardisation, no recipe)",
        [
            *VISION,
            "model.keypoint_norm=none",
            "model.sharpness=2.718281828459045",
            "train.warmup_steps=0",
            "train.grad_clip_norm=null",
            "train.ema_decay=null",
        ],
        True,
    ),
    "marker": ("+ standardisation, recipe, 4 draws, the goal marker", [*VISION, *NORMALISED, *RECIPE, *DRAWS], True),
    "marker_locate": (
        "+ locate (the encoder taught where the object and goal are), 3k steps, one camera",
        [*VISION, *NORMALISED, *RECIPE, *DRAWS, LOCATE],
        True,
    ),
    "locate_two_cameras_24k": (
        "+ locate, a second camera, 24k steps",
        [*VISION, *NORMALISED, *RECIPE, *DRAWS, LOCATE, *SECOND_CAMERA, f"train.steps={LONG}"],
        True,
    ),
    "two_cameras_film_24k": (
        "+ locate_two_cameras, FiLM on the instruction, 24k steps",
        [*VISION, *NORMALISED, *RECIPE, *DRAWS, LOCATE, *SECOND_CAMERA, "model.film=true", f"train.steps={LONG}"],
        True,
    ),
    "two_cameras_two_frames_24k": (
        "+ locate_two_cameras, the previous frame too, 24k steps",
        [*VISION, *NORMALISED, *RECIPE, *DRAWS, LOCATE, *SECOND_CAMERA, "model.history=2", f"train.steps={LONG}"],
        True,
    ),
}
# The contrasts the docs' claims rest on: (arm, against, what a positive difference would show).
CONTRASTS = [
    ("state", "state_goal_blind", "the state policy uses the goal's position"),
    ("marker", "before", "the marker and recipe help the vision policy"),
    ("marker_locate", "marker", "locating helps (3k steps, one camera)"),
    ("locate_two_cameras_24k", "marker", "locating and a second camera (at 24k) help"),
    ("two_cameras_film_24k", "locate_two_cameras_24k", "FiLM helps"),
    ("two_cameras_two_frames_24k", "locate_two_cameras_24k", "a second frame helps"),
    ("locate_two_cameras_24k", "state_goal_blind", "the vision policy beats a goal-blind state policy"),
]
# Training minutes per seed on 2 cores (docs/figures/vision_ablations.md's clocks, x8 for 24k steps).
COST_MINUTES = {
    "state": 0.5,
    "state_goal_blind": 0.5,
    "before": 16,
    "marker": 1.5,
    "marker_locate": 4,
    "locate_two_cameras_24k": 24,
    "two_cameras_film_24k": 35,
    "two_cameras_two_frames_24k": 45,
}


def arm_seed(name: str, seed: int, episodes: int) -> Dict[str, Any]:
    """One arm at one seed: its checkpoint (cached) and its success on the test scenes, and, for a
    camera arm, the same episodes under CONDITIONS in the same evaluation (one run of the clean
    episodes serves both)."""
    from omegaconf import open_dict

    from vlaeval.policy.builtin import PolicySpec, obtain_policy, prepare_data
    from vlaeval.rollouts.engine import evaluate_closed_loop

    _, overrides, probed = ARMS[name]
    cfg = compose_default(
        [
            *overrides,
            f"train.seed={seed}",
            f"evaluate.episodes_per_task={episodes}",
            "evaluate.scenes=test",
            "evaluate.run_to_horizon=true",  # any-step and final-step success from the same episodes
        ]
    )
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    started = time.perf_counter()
    handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
    trained = time.perf_counter() - started
    evaluate = cfg.evaluate.copy()
    with open_dict(evaluate):
        evaluate.conditions = CONDITIONS if probed else {}
    tasks = list(data.demonstrations.tasks)
    run = evaluate_closed_loop(data.bind(handle.model, cfg.flow), tasks, evaluate, cfg.rollout, simulator=cfg.simulator)
    return {
        "seed": seed,
        "success": [e.policy for e in run.episodes],
        "tasks": [e.task for e in run.episodes],
        "rate": run.policy_success_rate,
        "final_rate": run.final_step_success_rate,
        "per_task": {task: row.policy_success_rate for task, row in run.per_task.items()},
        "final_per_task": {task: row.final_step_success_rate for task, row in run.per_task.items()},
        "conditions": {c: row.policy_success_rate for c, row in run.conditions.items()},
        "conditions_per_task": {c: dict(row.per_task) for c, row in run.conditions.items()},
        "seconds": trained,
    }


def t_interval(values: Sequence[float]) -> Tuple[float, float, float]:
    from scipy.stats import t as student_t

    x = np.asarray(values, dtype=float)
    half = student_t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size) if x.size >= 2 else math.inf
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def holm(p: Sequence[float]) -> List[float]:
    order = np.argsort(p)
    adjusted = np.empty(len(p))
    running = 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[k]))
        adjusted[k] = running
    return adjusted.tolist()


def paired(x: Sequence[float], y: Sequence[float]) -> Tuple[float, float, float, float]:
    """Mean x - y over seeds, its paired 95% t-interval and the paired t-test's p."""
    from scipy.stats import ttest_rel

    n = min(len(x), len(y))
    a, b = np.asarray(x[:n], dtype=float), np.asarray(y[:n], dtype=float)
    mean, low, high = t_interval(a - b)
    p = float(ttest_rel(a, b).pvalue) if np.std(a - b) > 0 else (0.0 if mean != 0 else 1.0)
    return mean, low, high, p


def seed_cell(values: Sequence[float]) -> str:
    mean, low, high = t_interval(values)
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def seed_task_table(measured: Dict[str, Any], names: Sequence[str], tasks: Sequence[str], key: str) -> str:
    """Each arm's per-task rate under `key` (per_task, final_per_task): mean / SD over its seeds."""
    rows = []
    for name in names:
        values = [[r[key][t] for r in measured[name]] for t in tasks]
        rows.append([name, *(f"{np.mean(v):.2f} / {np.std(v, ddof=1):.2f}" for v in values)])
    return markdown_table(["arm", *tasks], rows)


def page(results: Dict[str, Any], seeds: int, episodes: int) -> str:
    measured = results["arms"]
    parts = [
        f"Each arm trained at seeds 0-{seeds - 1}; each checkpoint runs {episodes} episodes per task on the test half "
        "of the held-out scenes (nothing is chosen on them), the same episodes for every checkpoint, each to its "
        "150-step horizon (`evaluate.run_to_horizon=true`): any-step success (the goal was met at some step) and "
        "final-step success (it held at the last step) come from the same episodes. Mean over seeds with its 95% "
        "t-interval (n - 1 df), the seeds' SD, each seed's rate; contrasts pair seed k of one arm with seed k of the "
        "other (or a checkpoint with itself under a condition), with a paired t-interval and p, Holm-adjusted over "
        "every contrast on this page. A camera arm also runs the same episodes with its camera blanked and with the "
        f"goal marker drawn {MARKER_SHIFT:.2f} m from the true goal (the counterfactual marker: a policy that finds "
        "the goal in its camera must do worse; the physics and the state keep the true goal)."
    ]
    rows = []
    for name, (what, _, _) in ARMS.items():
        if name not in measured:
            continue
        rates = [r["rate"] for r in measured[name]]
        finals = [r["final_rate"] for r in measured[name]]
        probes = [r.get("conditions", {}) for r in measured[name]]
        rows.append(
            [
                name,
                what,
                seed_cell(rates),
                f"{np.std(rates, ddof=1):.3f}",
                ", ".join(f"{x:.3f}" for x in rates),
                seed_cell(finals),
                *(
                    seed_cell([p[c] for p in probes]) if all(c in p for p in probes) else ""
                    for c in ("blank", "counterfactual_marker")
                ),
            ]
        )
    header = ["arm", "what", "any-step success (seed mean, 95% t)", "seed SD", "per seed", "final-step success"]
    parts.append(markdown_table([*header, "camera blanked", "counterfactual marker"], rows))
    tasks = sorted({t for arm in measured.values() for r in arm for t in r["per_task"]})
    parts.append("Each task's any-step success across seeds (mean / SD):")
    parts.append(seed_task_table(measured, [name for name in ARMS if name in measured], tasks, "per_task"))
    probed = [n for n in ARMS if n in measured and all(r.get("conditions_per_task") for r in measured[n])]
    if probed:
        parts.append(
            "Each camera arm's tasks, clean / camera blanked / counterfactual marker (seed means of any-step success; "
            "reach-v3 is the task whose goal only the camera shows a vision policy):"
        )
        parts.append(
            markdown_table(
                ["arm", *tasks],
                [
                    [
                        name,
                        *[
                            " / ".join(
                                f"{np.mean(values):.2f}"
                                for values in (
                                    [r["per_task"][t] for r in measured[name]],
                                    [r["conditions_per_task"]["blank"][t] for r in measured[name]],
                                    [r["conditions_per_task"]["counterfactual_marker"][t] for r in measured[name]],
                                )
                            )
                            for t in tasks
                        ],
                    ]
                    for name in probed
                ],
            )
        )
    finals = [n for n in ARMS if n in measured and all(r.get("final_per_task") for r in measured[n])]
    if finals:
        parts.append("Each task's final-step success across seeds (mean / SD):")
        parts.append(seed_task_table(measured, finals, tasks, "final_per_task"))
    lines, ps = [], []
    for a, b, why in CONTRASTS:
        if a in measured and b in measured:
            for key, which in (("rate", "any-step"), ("final_rate", "final-step")):
                mean, low, high, p = paired([r[key] for r in measured[a]], [r[key] for r in measured[b]])
                lines.append([f"{a} - {b} ({which})", why, f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]", f"{p:.3g}"])
                ps.append(p)
    for name in ARMS:
        runs = measured.get(name, [])
        for condition, why in (
            ("blank", "the policy uses its camera"),
            ("counterfactual_marker", "the policy finds the goal in its camera"),
        ):
            if runs and all(condition in r.get("conditions", {}) for r in runs):
                clean = [r["rate"] for r in runs]
                mean, low, high, p = paired(clean, [r["conditions"][condition] for r in runs])
                lines.append(
                    [f"{name}: clean - {condition}", why, f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]", f"{p:.3g}"]
                )
                ps.append(p)
    if lines:
        for line, adjusted in zip(lines, holm(ps)):
            line.append(f"{adjusted:.3g}")
        parts.append(
            markdown_table(
                ["contrast", "a positive difference would show", "difference (paired t)", "p", "Holm p"], lines
            )
        )
    missing = [name for name in ARMS if name not in measured]
    if missing:
        parts.append(
            "Not measured yet (`--arms "
            + " ".join(missing)
            + "` measures them; training minutes per seed on 2 cores: "
            + ", ".join(f"{n} ~{COST_MINUTES[n]:g}" for n in missing)
            + "). Contrasts that need them are left out."
        )
    return "\n\n".join(parts)


RECORD = REPO / "benchmarks" / "records" / "seed_claims.json"


def recorded(seeds: int, episodes: int) -> Dict[str, Any]:
    """The arms measured before (on any machine) under today's overrides, seeds and episodes."""
    import json

    arms = json.loads(RECORD.read_text())["arms"] if RECORD.is_file() else {}
    kept = {}
    for name, arm in arms.items():
        same = (
            name in ARMS and arm["overrides"] == ARMS[name][1] and (arm["seeds"], arm["episodes"]) == (seeds, episodes)
        )
        if same:
            kept[name] = arm
        else:
            print(f"{name}: recorded under other settings; measure it again with --arms {name}", flush=True)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--arms", nargs="*", default=list(ARMS), choices=list(ARMS), help="arms to measure (none: rewrite the page)"
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    arms = recorded(args.seeds, args.episodes)
    for name in args.arms:
        runs = [arm_seed(name, seed, args.episodes) for seed in range(args.seeds)]
        arms[name] = {"overrides": ARMS[name][1], "seeds": args.seeds, "episodes": args.episodes, "runs": runs}
        atomic_write_json(RECORD, {"arms": arms})  # each finished arm is kept, whatever happens to the next
        print(name, [round(r["rate"], 3) for r in runs], flush=True)
    results = {"arms": {name: arm["runs"] for name, arm in arms.items()}}
    write_figures(
        "seed_claims",
        "The repository's claims on five training seeds",
        f"python benchmarks/seed_claims.py --arms {' '.join(a for a in ARMS if a in results['arms'])} --seeds {args.seeds} --episodes {args.episodes}",
        page(results, args.seeds, args.episodes),
    )


if __name__ == "__main__":
    main()
