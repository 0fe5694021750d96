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
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import yaml
from scipy import stats

from benchlib import REPO, default_policy, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json

ARMS = ["uniform", "uniform_large_batch", "adaptive_time", "adaptive_time_residual"]
LEARNING_RATES = {"adamw": [3e-4, 1e-3, 3e-3], "sgd": [0.03, 0.1, 0.3]}
QUICK = ["data=tiny", "model=tiny_vla_small", "train.heldout_every=20", "train.heldout_episodes_per_task=1"]


def sweep(out: Path, cache: Path, overrides: Sequence[str], learning_rates: Sequence[float], seeds: str) -> float:
    env = {**os.environ, "VLAEVAL_CACHE_DIR": str(cache), "MPLBACKEND": "Agg"}
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "main.py"),
            "+sweep=training_comparison",
            "tracking=disabled",
            *overrides,
            # on the command line of a multirun, a comma list sweeps and replaces the preset's list
            "train.learning_rate=" + ",".join(str(x) for x in learning_rates),
            f"train.seed={seeds}",
            f"hydra.sweep.dir={out}",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"sweep {overrides} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def read_runs(folder: Path) -> List[Dict[str, Any]]:
    runs = []
    for result_file in sorted(folder.glob("*/result.json")):
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
                "successes": [
                    s
                    for task in sorted(result["evaluation"]["per_task"])
                    for s in result["evaluation"]["per_task"][task]["policy_successes"]
                ]
                if "evaluation" in result
                else [],
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
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return {"mean": float(x.mean()) if x.size else None, "low": None, "high": None, "n": int(x.size)}
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return {"mean": float(x.mean()), "low": float(x.mean() - half), "high": float(x.mean() + half), "n": int(x.size)}


def wilson(successes: int, n: int) -> Dict[str, Any]:
    if n == 0:
        return {"rate": None, "low": None, "high": None, "n": 0}
    z, p = 1.959964, successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return {"rate": p, "low": float(centre - half), "high": float(centre + half), "n": n}


def summarise(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Best learning rate per arm, the target, steps/clock to it, loss at equal clock, success."""
    best: Dict[str, float] = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        rates = sorted({r["learning_rate"] for r in mine})
        best[arm] = min(
            rates, key=lambda lr: np.mean([r["final_heldout_loss"] for r in mine if r["learning_rate"] == lr])
        )
    at_best = {
        arm: sorted((r for r in runs if r["arm"] == arm and r["learning_rate"] == best[arm]), key=lambda r: r["seed"])
        for arm in ARMS
    }
    target = float(np.mean([r["final_heldout_loss"] for r in at_best["uniform"]]))
    uniform_clock = float(np.mean([r["clock_seconds"] for r in at_best["uniform"]]))
    uniform_successes = [s for r in at_best["uniform"] for s in r["successes"]]
    rows = {}
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
        }
    return {"target_heldout_loss": target, "uniform_clock_seconds": uniform_clock, "arms": rows}


def fmt(x: Optional[Dict[str, Any]], digits: int = 3) -> str:
    if x is None or x.get("mean") is None:
        return "n/a"
    if x.get("low") is None:
        return f"{x['mean']:.{digits}g}"
    return f"{x['mean']:.{digits}g} [{x['low']:.{digits}g}, {x['high']:.{digits}g}]"


def page(results: Dict[str, Any]) -> str:
    blocks = []
    for label, block in results["comparisons"].items():
        rows = []
        for arm, r in block["summary"]["arms"].items():
            success = r["success"]
            rows.append(
                (
                    arm,
                    f"{r['best_learning_rate']:g}"
                    + (f" ({r['diverged']} of {r['seeds']} diverged)" if r["diverged"] else ""),
                    fmt(r["final_heldout_loss"], 4),
                    r["reached_target"],
                    fmt(r["steps_to_target"]),
                    fmt(r["clock_to_target"]),
                    fmt(r["heldout_loss_at_uniform_clock"], 4),
                    "n/a"
                    if success["rate"] is None
                    else f"{success['rate']:.3f} [{success['low']:.3f}, {success['high']:.3f}] of {success['n']}",
                )
            )
        blocks.append(
            f"### {label}\n\nTarget: the uniform arm's final held-out loss, {block['summary']['target_heldout_loss']:.4f}; "
            f"its clock {block['summary']['uniform_clock_seconds']:.0f} s. Sweep wall time {block['wall_seconds']:.0f} s.\n\n"
            + markdown_table(
                [
                    "arm",
                    "best LR",
                    "final held-out loss",
                    "reached target",
                    "steps to target",
                    "clock to target (s)",
                    "held-out loss at uniform's clock",
                    "success",
                ],
                rows,
            )
        )
    return (
        "Each arm x learning rate x seed is a `job=train` run of `+sweep=training_comparison` "
        f"({results['settings']}); intervals are 95% t-intervals across seeds at each arm's best learning rate, "
        "success pooled over seeds with a Wilson interval.\n\n" + "\n\n".join(blocks)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "vlaeval")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/vlaeval-training-comparison"))
    parser.add_argument("--optimizers", nargs="*", default=["adamw", "sgd"])
    parser.add_argument("--starts", nargs="*", default=["init", "early"])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--learning-rates", nargs="*", type=float, default=None, help="one grid for every optimizer")
    parser.add_argument("--quick", action="store_true", help="a tiny preset that checks the pipeline")
    parser.add_argument("--extra", nargs="*", default=[])
    args = parser.parse_args()
    extra = [*(QUICK + ["train.steps=60"] if args.quick else []), *args.extra]
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
            wall = sweep(
                out, args.cache_dir, [f"train.optimizer={optimizer}", *start_overrides, *extra], rates, args.seeds
            )
            runs = read_runs(out)
            comparisons[label] = {"wall_seconds": wall, "runs": runs, "summary": summarise(runs)}
            print(json.dumps({label: comparisons[label]["summary"]}, indent=1), flush=True)
    grid = f"learning rates {args.learning_rates}, " if args.learning_rates else ""
    results = {
        "settings": grid + f"seeds {args.seeds}, " + (" ".join(extra) or "the defaults"),
        "comparisons": comparisons,
    }
    name = "training_comparison_quick" if args.quick else "training_comparison"
    atomic_write_json(REPO / "benchmarks" / "results" / f"{name}.json", results)
    if args.quick:
        write_figures(
            name,
            "The training comparison, quick preset (checks the pipeline)",
            "python benchmarks/training_comparison.py --quick",
            page(results),
        )
    else:
        write_figures(
            name, "Does the audit make training faster?", "python benchmarks/training_comparison.py", page(results)
        )


if __name__ == "__main__":
    main()
