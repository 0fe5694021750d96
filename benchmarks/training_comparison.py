"""Does the audit make training faster? The compute-matched training comparison, measured.

    python benchmarks/training_comparison.py [--optimizers adamw sgd] [--starts init early] [--quick]

Per start (from initialisation; from an early checkpoint: the default recipe trained 300 steps) and
optimizer (AdamW; SGD with momentum 0.9), `python main.py +sweep=training_comparison` runs the arms
(uniform; uniform with 1.5x batch, the compute control; adaptive flow time; adaptive flow time x the
residual anchor proposal, its scoring charged to the clock) x learning rates x seeds as one Hydra
multirun of job=train, each with its held-out loss against its clock and closed-loop success on the
same held-out episodes. From the runs' result.json files:

- per arm, the learning rate with the lowest mean final held-out loss (its "best");
- the target: the uniform arm's mean final held-out loss at its best learning rate;
- steps and clock seconds (scoring included) until each seed's held-out curve reaches the target
  (linear between evaluations; "not reached" counts as not), with t-intervals across seeds;
- held-out loss at the uniform arm's mean final clock;
- success, pooled over seeds, with a paired comparison against uniform on the same episodes.

Results in benchmarks/results/training_comparison.json and docs/figures/training_comparison.md
(--quick runs a tiny preset that checks the pipeline: docs/figures/training_comparison_quick.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import yaml

from benchlib import FIGURES, REPO, default_policy, main_py, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.audit.proposals import seed_interval

ARMS = ["uniform", "uniform_large_batch", "adaptive_time", "adaptive_time_residual"]
# Placed so that each arm's best lies inside the grid, not at its edge: the first grid (AdamW 3e-4..3e-3,
# SGD 0.03..0.3) had every arm's best at its top from initialisation, so it moved up (the runs at the
# old bottom rate are kept and shown where they exist); AdamW's best then sat at 1e-2 for several arms,
# so 3e-2 was added. SGD at 1.0 diverges in every arm.
LEARNING_RATES = {"adamw": [1e-3, 3e-3, 1e-2, 3e-2], "sgd": [0.1, 0.3, 1.0]}
QUICK = ["data=tiny", "model=tiny_vla_small", "train.heldout_every=20", "train.heldout_episodes_per_task=1"]


def sweep(
    out: Path, cache: Path, overrides: Sequence[str], learning_rates: Sequence[float], seeds: str, jobs: int
) -> float:
    """The arms x learning rates x seeds of one start and optimizer, as one Hydra multirun of job=train
    on the joblib launcher: `jobs` runs at a time, the cores split between them. Training only: the
    closed-loop evaluation waits for the learning rates to be chosen (`evaluate_best`)."""
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    env = {**os.environ, "VLAEVAL_CACHE_DIR": str(cache), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": threads}
    return main_py(
        [
            "+sweep=training_comparison",
            "tracking=disabled",
            "train.evaluate_after=false",
            "hydra/launcher=local_processes",
            f"hydra.launcher.n_jobs={jobs}",
            *overrides,
            # on the command line of a multirun, a comma list sweeps and replaces the preset's list
            "train.learning_rate=" + ",".join(str(x) for x in learning_rates),
            f"train.seed={seeds}",
            f"hydra.sweep.dir={out}",
        ],
        env,
    )


def once(out: Path, run: Callable[[], float]) -> float:
    """run() unless it already finished into `out` (an interrupted benchmark resumes where it stopped):
    its wall seconds, kept in out/wall_seconds.json."""
    marker = out / "wall_seconds.json"
    if marker.exists():
        return float(json.loads(marker.read_text()))
    wall = run()
    atomic_write_json(marker, wall)
    return wall


def evaluate_best(
    out: Path,
    cache: Path,
    runs: List[Dict[str, Any]],
    best: Dict[str, float],
    episodes_per_task: int,
    overrides: Sequence[str] = (),
) -> float:
    """Closed-loop success of every seed's checkpoint at its arm's best learning rate: a multirun of
    job=evaluate over the checkpoints not yet evaluated, the same held-out episodes for every checkpoint
    (so arms pair episode by episode). Sequential: each evaluation's rollout workers already use the
    cores. Returns the wall seconds of every evaluation in `out`."""
    chosen = [r for r in runs if r["learning_rate"] == best[r["arm"]] and r["diverged_at_step"] is None]
    env = {**os.environ, "VLAEVAL_CACHE_DIR": str(cache), "MPLBACKEND": "Agg"}
    done = evaluated(out, episodes_per_task)
    missing = [r for r in chosen if r["checkpoint"] not in done]
    if missing:
        batch = out / f"batch-{len(list(out.glob('batch-*')))}"
        once(batch, functools.partial(run_evaluations, batch, env, missing, episodes_per_task, overrides))
        done = evaluated(out, episodes_per_task)
    for r in chosen:
        r["successes"] = done[r["checkpoint"]]
    return wall_seconds(out)


def evaluated(out: Path, episodes_per_task: int) -> Dict[str, List[bool]]:
    """checkpoint path -> its successes, task by task, from every finished evaluation under `out`
    with `episodes_per_task` episodes per task."""
    successes = {}
    for result_file in sorted(out.rglob("result.json")):
        result = json.loads(result_file.read_text())
        per_task = result["evaluation"]["per_task"]
        if all(len(per_task[task]["policy_successes"]) == episodes_per_task for task in per_task):
            successes[result["checkpoint"]] = [
                s for task in sorted(per_task) for s in per_task[task]["policy_successes"]
            ]
    return successes


def wall_seconds(out: Path) -> float:
    """The wall seconds of every sweep `once` ran under `out`."""
    return float(sum(json.loads(marker.read_text()) for marker in out.rglob("wall_seconds.json")))


def train_grid(
    out: Path, cache: Path, overrides: Sequence[str], learning_rates: Sequence[float], seeds: str, jobs: int
) -> float:
    """The arms x seeds at each learning rate of the grid that `out` does not hold yet, one multirun
    per learning rate (so a grid widened later reuses the rates already run). Returns the wall seconds
    of every sweep in `out`."""
    per_rate = len(ARMS) * len(seeds.split(","))
    done = Counter(r["learning_rate"] for r in read_runs(out)) if out.exists() else Counter()
    for lr in learning_rates:
        if done[float(lr)] < per_rate:
            unit = out / f"lr-{lr:g}"
            once(unit, functools.partial(sweep, unit, cache, overrides, [lr], seeds, jobs))
    return wall_seconds(out)


def run_evaluations(
    out: Path, env: Dict[str, str], chosen: List[Dict[str, Any]], episodes_per_task: int, overrides: Sequence[str]
) -> float:
    return main_py(
        [
            "-m",
            "job=evaluate",
            "tracking=disabled",
            "checkpoint=path",
            "checkpoint.path=" + ",".join(r["checkpoint"] for r in chosen),
            f"evaluate.episodes_per_task={episodes_per_task}",
            *overrides,
            f"hydra.sweep.dir={out}",
        ],
        env,
    )


def read_runs(folder: Path) -> List[Dict[str, Any]]:
    runs = []
    for result_file in sorted(folder.rglob("result.json")):
        overrides = yaml.safe_load((result_file.parent / ".hydra" / "overrides.yaml").read_text())
        setting = dict(o.lstrip("+").split("=", 1) for o in overrides)
        result = json.loads(result_file.read_text())
        train = result["train"]
        diverged = train.get("diverged_at_step") is not None
        runs.append(
            {
                "arm": setting["arm"],
                "learning_rate": float(setting["train.learning_rate"]),
                "seed": int(setting["train.seed"]),
                "heldout_curve": train["heldout_curve"],
                "clock_seconds": train["clock_seconds"],
                # a diverged run ranks last in its learning-rate grid
                "final_heldout_loss": float("inf") if diverged else train["heldout_curve"][-1][2],
                "diverged_at_step": train.get("diverged_at_step"),
                "checkpoint": result.get("checkpoint"),
                "successes": [],  # filled by evaluate_best for the chosen learning rates
            }
        )
    return runs


def reach(curve: Sequence[Sequence[float]], target: float) -> Optional[Dict[str, float]]:
    """The first (step, clock) at which the held-out curve reaches target, linear between points."""
    for (s0, c0, l0), (s1, c1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            f = 0.0 if l0 <= target else (l0 - target) / (l0 - l1)
            return {"step": s0 + f * (s1 - s0), "clock": c0 + f * (c1 - c0)}
    return None


def loss_at_clock(curve: Sequence[Sequence[float]], clock: float) -> float:
    clocks, losses = [c for _, c, _ in curve], [x for _, _, x in curve]
    return float(np.interp(clock, clocks, losses))


def interval(values: Sequence[float]) -> Dict[str, Any]:
    """The seeds' mean with its 95% t-interval (`seed_interval`); fewer than 2 values: the mean alone."""
    x = [float(v) for v in values]
    if len(x) < 2:
        return {"mean": x[0] if x else None, "low": None, "high": None, "n": len(x)}
    return {**seed_interval(x).as_dict(), "n": len(x)}


def wilson(successes: int, n: int) -> Dict[str, Any]:
    if n == 0:
        return {"rate": None, "low": None, "high": None, "n": 0}
    z, p = 1.959964, successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return {"rate": p, "low": float(centre - half), "high": float(centre + half), "n": n}


def best_learning_rates(runs: List[Dict[str, Any]]) -> Dict[str, float]:
    """Per arm, the learning rate with the lowest mean final held-out loss over seeds (chosen on the
    held-out loss, never on success, so the success comparison is not selected on)."""
    best: Dict[str, float] = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        rates = sorted({r["learning_rate"] for r in mine})
        best[arm] = min(
            rates, key=lambda lr: np.mean([r["final_heldout_loss"] for r in mine if r["learning_rate"] == lr])
        )
    return best


def summarise(runs: List[Dict[str, Any]], best: Dict[str, float]) -> Dict[str, Any]:
    """The target, steps/clock to it, loss at equal clock and success, at each arm's best learning rate."""
    at_best = {
        arm: sorted((r for r in runs if r["arm"] == arm and r["learning_rate"] == best[arm]), key=lambda r: r["seed"])
        for arm in ARMS
    }
    target = float(np.mean([r["final_heldout_loss"] for r in at_best["uniform"]]))
    uniform_clock = float(np.mean([r["clock_seconds"] for r in at_best["uniform"]]))
    uniform_successes = [s for r in at_best["uniform"] for s in r["successes"]]
    rows: Dict[str, Dict[str, Any]] = {}
    for arm in ARMS:
        reached = [reach(r["heldout_curve"], target) for r in at_best[arm]]
        hit = [x for x in reached if x is not None]
        successes = [s for r in at_best[arm] for s in r["successes"]]
        paired = None
        if successes and len(successes) == len(uniform_successes):
            diff = np.asarray(successes, float) - np.asarray(uniform_successes, float)
            se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("nan")
            paired = {
                "difference": float(diff.mean()),
                "low": float(diff.mean() - 1.96 * se),
                "high": float(diff.mean() + 1.96 * se),
                "pairs": int(diff.size),
            }
        finite = [r for r in at_best[arm] if r["diverged_at_step"] is None]
        rows[arm] = {
            "best_learning_rate": best[arm],
            "seeds": len(at_best[arm]),
            "diverged": len(at_best[arm]) - len(finite),
            "final_heldout_loss": interval([r["final_heldout_loss"] for r in finite]),
            "reached_target": f"{len(hit)} of {len(reached)}",
            "steps_to_target": interval([x["step"] for x in hit]),
            "clock_to_target": interval([x["clock"] for x in hit]),
            "heldout_loss_at_uniform_clock": interval(
                [loss_at_clock(r["heldout_curve"], uniform_clock) for r in finite]
            ),
            "success": wilson(int(np.sum(successes)), len(successes)),
            "success_minus_uniform": paired,
            # the episodes' pairing holds the episodes fixed, not the training: across the seeds'
            # checkpoints the difference varies too, which this interval (t, seeds - 1 df) includes
            "success_minus_uniform_across_seeds": interval(
                [np.mean(r["successes"]) - np.mean(u["successes"]) for r, u in zip(at_best[arm], at_best["uniform"])]
            )
            if paired is not None
            else None,
        }
    # the smallest success difference these paired episodes detect with 80% power at two-sided 5%:
    # (z_0.975 + z_0.8) x the largest standard error of the arms' paired differences
    errors = [
        (r["success_minus_uniform"]["high"] - r["success_minus_uniform"]["low"]) / (2 * 1.959964)
        for arm, r in rows.items()
        if arm != "uniform" and r["success_minus_uniform"] is not None
    ]
    detectable = float((1.959964 + 0.841621) * max(errors)) if errors else None
    return {
        "target_heldout_loss": target,
        "uniform_clock_seconds": uniform_clock,
        "paired_episodes": len(uniform_successes),
        "detectable_success_difference": detectable,
        "arms": rows,
    }


def fmt(x: Optional[Dict[str, Any]], spec: str = ".4f", floor: Optional[float] = None) -> str:
    """mean [low, high] in `spec`; the interval's low end clipped at `floor` (steps and seconds are >= 0)."""
    if x is None or x.get("mean") is None:
        return "n/a"
    if x.get("low") is None:
        return f"{x['mean']:{spec}}"
    low = x["low"] if floor is None else max(floor, x["low"])
    return f"{x['mean']:{spec}} [{low:{spec}}, {x['high']:{spec}}]"


def speedup(uniform: Optional[Dict[str, Any]], arm: Optional[Dict[str, Any]]) -> str:
    """The uniform arm's mean time to the target over the arm's (both first crossings, over the seeds
    that reached it): how many times sooner the arm gets there."""
    if uniform is None or arm is None or uniform.get("mean") is None or arm.get("mean") is None:
        return "n/a"
    return f"{uniform['mean'] / arm['mean']:.2f}x"


def detectable_line(summary: Dict[str, Any]) -> str:
    if summary.get("detectable_success_difference") is None:
        return ""
    return (
        f"{summary['paired_episodes']} paired episodes per arm: they detect a success difference of "
        f"{summary['detectable_success_difference']:.3f} with 80% power (two-sided 5%, from the largest paired "
        "standard error below)."
    )


def grid_table(runs: List[Dict[str, Any]]) -> str:
    """Mean final held-out loss per arm and learning rate (the grid the best rate is chosen from)."""
    rates = sorted({r["learning_rate"] for r in runs})
    rows = []
    for arm in ARMS:
        cells = []
        for lr in rates:
            mine = [r for r in runs if r["arm"] == arm and r["learning_rate"] == lr]
            diverged = sum(r["diverged_at_step"] is not None for r in mine)
            finite = [r["final_heldout_loss"] for r in mine if r["diverged_at_step"] is None]
            cell = f"{np.mean(finite):.4f}" if finite else "-"
            cells.append(cell + (f" ({diverged} of {len(mine)} diverged)" if diverged else ""))
        rows.append((arm, *cells))
    return markdown_table(["arm", *(f"lr {lr:g}" for lr in rates)], rows)


def page(results: Dict[str, Any], image: str) -> str:
    blocks = []
    for label, block in results["comparisons"].items():
        rows = []
        summary = block["summary"]
        for arm, r in summary["arms"].items():
            success = r["success"]
            paired = r["success_minus_uniform"]
            rows.append(
                (
                    arm,
                    f"{r['best_learning_rate']:g}"
                    + (f" ({r['diverged']} of {r['seeds']} diverged)" if r["diverged"] else ""),
                    fmt(r["final_heldout_loss"]),
                    r["reached_target"],
                    fmt(r["steps_to_target"], ".0f", floor=0.0),
                    fmt(r["clock_to_target"], ".1f", floor=0.0),
                    speedup(summary["arms"]["uniform"]["steps_to_target"], r["steps_to_target"]),
                    speedup(summary["arms"]["uniform"]["clock_to_target"], r["clock_to_target"]),
                    fmt(r["heldout_loss_at_uniform_clock"]),
                    "n/a"
                    if success["rate"] is None
                    else f"{success['rate']:.3f} [{success['low']:.3f}, {success['high']:.3f}] of {success['n']}",
                    "-"
                    if paired is None or arm == "uniform"
                    else f"{paired['difference']:+.3f} [{paired['low']:+.3f}, {paired['high']:+.3f}]",
                    "-" if arm == "uniform" else fmt(r.get("success_minus_uniform_across_seeds"), "+.3f"),
                )
            )
        blocks.append(
            f"### {label}\n\nTarget: the uniform arm's final held-out loss, {block['summary']['target_heldout_loss']:.4f}; "
            f"its clock {block['summary']['uniform_clock_seconds']:.0f} s. Sweep wall time {block['wall_seconds']:.0f} s "
            f"(training), {block.get('evaluation_wall_seconds', 0):.0f} s (closed-loop evaluation). "
            + detectable_line(summary)
            + "\n\n"
            + markdown_table(
                [
                    "arm",
                    "best LR",
                    "final held-out loss",
                    "reached target",
                    "steps to target",
                    "clock to target (s)",
                    "speed-up, steps",
                    "speed-up, clock",
                    "held-out loss at uniform's clock",
                    "success",
                    "success - uniform (paired episodes)",
                    "success - uniform (across seeds)",
                ],
                rows,
            )
            + "\n\nMean final held-out loss over seeds, per learning rate:\n\n"
            + grid_table(block["runs"])
        )
    return (
        "Each arm x learning rate x seed is a `job=train` run of `+sweep=training_comparison` "
        f"({results['settings']}), {results.get('jobs', 2)} runs at a time with the cores split between them (every "
        "arm under the same load, so clocks compare); intervals are 95% t-intervals across seeds at each arm's best "
        "learning rate, "
        "success pooled over seeds with a Wilson interval, and its difference from the uniform arm paired episode "
        "by episode (the same held-out episodes for every checkpoint; normal interval) — which holds the training "
        "fixed — and across seeds (each seed's checkpoint against uniform's of the same seed; a t-interval with "
        "seeds - 1 degrees of freedom, which counts how much a retrained checkpoint moves). The learning rate is chosen "
        "on the mean final held-out loss, never on success. The target is the uniform arm's mean final held-out "
        "loss; a run reaches it at the first evaluation at or below it (linear between evaluations), which the "
        "uniform arm's own seeds may do before their end, since held-out loss is not monotone in training; seeds "
        "that never reach it are counted in 'reached target' and left out of the means. A speed-up is the uniform "
        "arm's mean steps (clock) to the target over the arm's, a ratio of the two columns' means. Curves: the "
        "mean over seeds, the band from the lowest "
        f"to the highest seed.\n\n![held-out loss curves]({image})\n\n" + "\n\n".join(blocks)
    )


def plot_curves(results: Dict[str, Any], path: Path) -> Path:
    """Held-out loss against step and against clock (scoring included), per comparison and arm at its
    best learning rate: the mean over seeds with a band from the lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlaeval.artifacts import atomic_write_bytes

    blocks = results["comparisons"]
    fig, axes = plt.subplots(len(blocks), 2, figsize=(11, 3.2 * len(blocks)), squeeze=False)
    for row, (label, block) in enumerate(blocks.items()):
        best = {arm: r["best_learning_rate"] for arm, r in block["summary"]["arms"].items()}
        for arm in ARMS:
            curves = [
                np.asarray(r["heldout_curve"], dtype=np.float64)
                for r in block["runs"]
                if r["arm"] == arm and r["learning_rate"] == best[arm] and r["diverged_at_step"] is None
            ]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            stack = np.stack([c[:n] for c in curves])  # seeds x evaluations x (step, clock, loss)
            for col, axis in enumerate(["step", "clock (s, scoring included)"]):
                x = stack[:, :, col].mean(axis=0)
                ax = axes[row, col]
                (line,) = ax.plot(x, stack[:, :, 2].mean(axis=0), label=f"{arm} (lr {best[arm]:g})")
                ax.fill_between(
                    x, stack[:, :, 2].min(axis=0), stack[:, :, 2].max(axis=0), color=line.get_color(), alpha=0.2
                )
                ax.set_yscale("log")
                ax.set_xlabel(axis)
                ax.set_ylabel("held-out loss")
                ax.set_title(label, fontsize=9)
        target = block["summary"]["target_heldout_loss"]
        for ax in axes[row]:
            ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        axes[row, 0].legend(fontsize=7)
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "vlaeval")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/vlaeval-training-comparison"))
    parser.add_argument("--optimizers", nargs="*", default=["adamw", "sgd"])
    parser.add_argument("--starts", nargs="*", default=["init", "early"])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--learning-rates", nargs="*", type=float, default=None, help="one grid for every optimizer")
    parser.add_argument("--quick", action="store_true", help="a tiny preset that checks the pipeline")
    parser.add_argument("--jobs", type=int, default=2, help="training runs at a time (the cores are split)")
    parser.add_argument(
        "--episodes-per-task",
        type=int,
        default=None,
        help="(default 35, 2 with --quick) "
        "closed-loop episodes per task and checkpoint at the best learning rates (35 x 6 tasks x 3 seeds "
        "= 630 paired episodes per arm)",
    )
    parser.add_argument("--extra", nargs="*", default=[])
    args = parser.parse_args()
    extra = [*(QUICK + ["train.steps=60"] if args.quick else []), *args.extra]
    episodes_per_task = args.episodes_per_task or (2 if args.quick else 35)
    comparisons = {}
    for start in args.starts:
        start_overrides: List[str] = []
        if start == "early":
            overrides = ["train.steps=300", *(QUICK[:2] if args.quick else []), f"paths.cache_dir={args.cache_dir}"]
            _, _, handle = default_policy(overrides)
            start_overrides = [f"train.init_from={handle.path}"]
        for optimizer in args.optimizers:
            label = f"from {'initialisation' if start == 'init' else 'an early checkpoint (300 steps)'}, {optimizer}"
            out = args.runs_dir / f"{start}-{optimizer}"
            rates = args.learning_rates or (LEARNING_RATES[optimizer][1:2] if args.quick else LEARNING_RATES[optimizer])
            wall = train_grid(
                out,
                args.cache_dir,
                [f"train.optimizer={optimizer}", *start_overrides, *extra],
                rates,
                args.seeds,
                args.jobs,
            )
            runs = read_runs(out)
            best = best_learning_rates(runs)
            evaluation_wall = evaluate_best(
                args.runs_dir / f"{start}-{optimizer}-evaluation",
                args.cache_dir,
                runs,
                best,
                episodes_per_task,
                # the model and data the checkpoints were trained with; the train.* settings do not apply
                [o for o in extra if not o.startswith("train.")],
            )
            comparisons[label] = {
                "wall_seconds": wall,
                "evaluation_wall_seconds": evaluation_wall,
                "runs": runs,
                "summary": summarise(runs, best),
            }
            print(json.dumps({label: comparisons[label]["summary"]}, indent=1), flush=True)
    grid = f"learning rates {args.learning_rates}, " if args.learning_rates else ""
    results = {
        "settings": grid + f"seeds {args.seeds}, " + (" ".join(extra) or "the defaults"),
        "jobs": args.jobs,
        "episodes_per_task": episodes_per_task,
        "comparisons": comparisons,
    }
    name = "training_comparison_quick" if args.quick else "training_comparison"
    atomic_write_json(REPO / "benchmarks" / "results" / f"{name}.json", results)
    plot_curves(results, FIGURES / f"{name}.png")
    if args.quick:
        write_figures(
            name,
            "The training comparison, quick preset (checks the pipeline)",
            "python benchmarks/training_comparison.py --quick",
            page(results, f"{name}.png"),
        )
    else:
        write_figures(
            name,
            "Does the audit make training faster?",
            "python benchmarks/training_comparison.py",
            page(results, f"{name}.png"),
        )


if __name__ == "__main__":
    main()
