"""Does the audit make training faster? The compute-matched training comparison, measured where
sampling can matter.

    python benchmarks/training_comparison.py [--regimes 72 900] [--quick]

Per regime (today's 72 demonstrations, generalisation-limited: ~126 epochs; 900 demonstrations on 9
tasks, optimisation-limited: ~10 epochs), `python main.py +sweep=training_comparison` runs the arms
(uniform; uniform with 1.5x batch; adaptive flow time; adaptive flow time x the residual anchor
proposal) as Hydra multiruns of job=train with the built-in recipe (warmup, clipping, EMA), every run
ending at the same compute (train.budget_samples: the large batch gets 2/3 of the steps, the residual
arm loses its scoring's FLOPs; an arm whose scoring alone exceeds the budget is reported, not run):

1. the learning-rate grid (2x apart) on two seeds; each arm's rate is chosen on its mean final loss on
   the validation scenes (the first half of the held-out scenes), never on what is reported; a grid
   whose choice sits at an edge is widened by one rate on that side, at most twice;
2. every arm at the uniform arm's chosen rate (learning rates matched) on five seeds: everything
   reported comes from these runs, on the test scenes (the other half);
3. per arm: the final test loss; censoring-aware time to a target every arm's mean reaches (the worst
   arm's mean final test loss) in training pairs, GFLOP and seconds -- the restricted mean time to it
   over a horizon every run covers, a run that never reaches it counted at the horizon (not dropped);
   the realised second-moment ratio of what it drew from, along its run;
4. the ceiling: the second-moment ratio of the exact-gradient oracles (flow time, anchors, both) on
   the uniform arm's final checkpoint -- the most any sampler of that kind could buy;
5. closed-loop success on the test scenes; each arm against uniform across seeds (paired by seed and
   episode; t with seeds - 1 df), Holm-adjusted over every comparison of every regime.

Results in benchmarks/results/training_comparison.json and docs/figures/training_comparison.md
(--quick runs a tiny preset that checks the pipeline: docs/figures/training_comparison_quick.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import yaml

from benchlib import FIGURES, REPO, compose_default, main_py, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.audit.proposals import seed_interval

ARMS = ["uniform", "uniform_large_batch", "adaptive_time", "adaptive_time_residual"]
RESIDUAL = "adaptive_time_residual"
LEARNING_RATES = [
    2.5e-3,
    5e-3,
    1e-2,
    2e-2,
]  # AdamW, 2x apart (a first grid from 1.25e-3 chose 1e-2, its top, for every arm)
BUDGET = 768_000  # training pairs: 3,000 steps at batch 256 (the preset's)
NINE_TASKS = "[reach-v3,push-v3,pick-place-v3,peg-insert-side-v3,disassemble-v3,stick-pull-v3,reach-wall-v3,push-wall-v3,pick-place-wall-v3]"
REGIMES = {
    "72": ("72 demonstrations (6 tasks x 12): generalisation-limited", []),
    "900": (
        "900 demonstrations (9 tasks x 100): optimisation-limited",
        [f"data.tasks={NINE_TASKS}", "data.episodes_per_task=100", "data.train_families=[0,2,3,4,5]"],
    ),
}
GRID_SEEDS, SEEDS = "0,1", [0, 1, 2, 3, 4]
BUILD_DRAWS, JUDGE_DRAWS = 16, 4  # the ceiling's oracles: flow draws per anchor they are built and judged on
WIDENINGS = 2  # at most this many times the grid grows by a rate beyond an edge its choice sits on
QUICK = ["data=tiny", "model=tiny_vla_small", "train.heldout_every=20", "train.heldout_episodes_per_task=1"]
AXES = ("pairs", "gflop", "seconds")


def sweep(
    out: Path, cache: Path, overrides: Sequence[str], arms: Sequence[str], rates: str, seeds: str, jobs: int
) -> float:
    """Arms x learning rates x seeds as one Hydra multirun of job=train on the process launcher (`jobs`
    runs at a time, the cores split between them). Training only: success waits for the choice."""
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
            "+arm=" + ",".join(arms),
            f"train.learning_rate={rates}",
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


def wall_seconds(out: Path) -> float:
    return (
        float(sum(json.loads(marker.read_text()) for marker in out.rglob("wall_seconds.json"))) if out.exists() else 0.0
    )


def read_runs(folder: Path) -> List[Dict[str, Any]]:
    runs = []
    for result_file in sorted(folder.rglob("result.json")):
        config = yaml.safe_load((result_file.parent / ".hydra" / "config.yaml").read_text())
        overrides = yaml.safe_load((result_file.parent / ".hydra" / "overrides.yaml").read_text())
        setting = dict(o.lstrip("+").split("=", 1) for o in overrides)
        train = json.loads(result_file.read_text())["train"]
        diverged = train.get("diverged_at_step") is not None
        runs.append(
            {
                "arm": setting["arm"],
                "learning_rate": float(config["train"]["learning_rate"]),
                "seed": int(config["train"]["seed"]),
                "batch_size": int(config["train"]["batch_size"]),
                "steps": int(train["steps"]),
                "step_gflop": float(train["step_gflop"]),
                "gflop_before": float(train.get("gflop_before") or 0.0),
                "heldout_curve": train["heldout_curve"],
                "validation_curve": train["validation_curve"],
                "second_moment_curve": train.get("second_moment_curve") or [],
                "final_validation_loss": float("inf") if diverged else train["validation_curve"][-1][2],
                "final_test_loss": float("inf") if diverged else train["heldout_curve"][-1][2],
                "diverged_at_step": train.get("diverged_at_step"),
                "checkpoint": str(result_file.parent / "model.pt"),
            }
        )
    return runs


def axis(run: Dict[str, Any], name: str) -> np.ndarray:
    """The test curve's x values on one axis: training pairs seen, GFLOP spent (scoring included), or
    the run's clock in seconds (scoring included)."""
    curve = np.asarray(run["heldout_curve"], dtype=np.float64)
    if name == "pairs":
        return curve[:, 0] * run["batch_size"]
    if name == "gflop":
        return run["gflop_before"] + curve[:, 0] * run["step_gflop"]
    return curve[:, 1]


def first_reach(x: np.ndarray, loss: np.ndarray, target: float) -> Optional[float]:
    """The first x at which the loss reaches target, linear between points (None: never)."""
    for k in range(1, len(x)):
        if loss[k] <= target:
            if loss[k - 1] <= target:
                return float(x[k - 1])
            f = (loss[k - 1] - target) / (loss[k - 1] - loss[k])
            return float(x[k - 1] + f * (x[k] - x[k - 1]))
    return float(x[0]) if len(x) and loss[0] <= target else None


def restricted_mean_time(times: Sequence[Optional[float]], horizon: float) -> Dict[str, Any]:
    """Censoring-aware time to the target: the mean of min(T, horizon) over seeds, a run that never
    reaches it counted at the horizon (the restricted mean time to the event: every seed in, none
    dropped), with its t-interval; and how many reached it within the horizon."""
    capped = [horizon if t is None else min(t, horizon) for t in times]
    reached = sum(t is not None and t <= horizon for t in times)
    return {**interval(capped), "reached": reached, "of": len(times), "horizon": horizon}


def interval(values: Sequence[float]) -> Dict[str, Any]:
    x = [float(v) for v in values]
    if len(x) < 2:
        return {"mean": x[0] if x else None, "low": None, "high": None, "n": len(x)}
    return {**seed_interval(x).as_dict(), "n": len(x)}


def choose_rates(runs: List[Dict[str, Any]], arms: Sequence[str], grid: Sequence[float]) -> Dict[str, float]:
    """Per arm, the rate of `grid` with the lowest mean final validation loss over the grid seeds."""
    best = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm and r["seed"] in {int(s) for s in GRID_SEEDS.split(",")}]
        rates = sorted({r["learning_rate"] for r in mine} & {float(lr) for lr in grid})
        best[arm] = min(
            rates, key=lambda lr: np.mean([r["final_validation_loss"] for r in mine if r["learning_rate"] == lr])
        )
    return best


def widen(rates: List[float], best: Dict[str, float]) -> List[float]:
    """The grid with one more rate (2x) beyond each edge some arm's choice sits on."""
    low, high = min(rates), max(rates)
    out = list(rates)
    if any(b == low for b in best.values()):
        out.insert(0, low / 2)
    if any(b == high for b in best.values()):
        out.append(high * 2)
    return out


def residual_budget(overrides: Sequence[str], cache: Path, budget: int) -> Dict[str, Any]:
    """What scoring every anchor costs against the budget, counted as job=train counts it (on the
    initial model): its GFLOP, in training pairs, and the steps it leaves."""
    from vlaeval.jobs.train import scoring_gflop
    from vlaeval.policy.builtin import PolicySpec, build_model, prepare_data
    from vlaeval.policy.training import step_gflop

    cfg = compose_default([f"paths.cache_dir={cache}", *overrides])
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    model = build_model(PolicySpec.of(cfg), data)
    batch = int(cfg.train.batch_size)
    per_pair = step_gflop(data.bind(model, cfg.flow), data.anchors, batch) / batch
    pairs = scoring_gflop(cfg, data, model) / per_pair
    return {
        "anchors": len(data.anchors),
        "scoring_pairs": pairs,
        "share_of_budget": pairs / budget,
        "steps_left": int((budget - pairs) // batch),
    }


def ceiling(overrides: Sequence[str], cache: Path, checkpoint: str, anchors: int) -> Dict[str, float]:
    """The second-moment ratio (against uniform draws) of the exact-gradient oracles on a checkpoint:
    flow-time bins as the adaptive sampler has them (16 bins, its 0.2 floor) and unconstrained (no
    floor), anchors (q ~ sqrt of each anchor's mean squared norm), and both; built on BUILD_DRAWS
    draws per anchor and judged on JUDGE_DRAWS others, over `anchors` fixed training anchors (the
    population here)."""
    from vlaeval.audit.proposals import Proposal, per_sample_second_moment, time_bin_probabilities
    from vlaeval.policy.builtin import PolicySpec, load_policy, prepare_data
    from vlaeval.residual.ablation import anchor_gradients

    cfg = compose_default([f"paths.cache_dir={cache}", *overrides])
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    policy = data.bind(load_policy(PolicySpec.of(cfg), data, Path(checkpoint)).model, cfg.flow)
    rng = np.random.default_rng(20261206)
    index = np.sort(rng.choice(len(data.anchors), size=min(anchors, len(data.anchors)), replace=False))

    def grads(role: str, draws: int) -> Any:
        keys = [("training-comparison-ceiling", role, k) for k in range(draws)]
        return anchor_gradients(policy, data.anchors, trainable="all", draw_keys=keys, batch_size=512, index=index)

    # an anchor's expected norm needs many draws (its flow times and noises vary it more than the
    # anchors differ): built on fewer, the anchor "oracle" fits the draws' noise and loses to uniform
    build, judge = grads("build", BUILD_DRAWS), grads("judge", JUDGE_DRAWS)
    n = index.size
    uniform_q = np.full(n, 1.0 / n)
    root = np.sqrt(build.sq_norms.mean(axis=0))
    anchor_q = root / root.sum()
    base = per_sample_second_moment(judge.sq_norms, judge.u, Proposal("uniform", uniform_q))

    def ratio(q: np.ndarray, p: Optional[np.ndarray]) -> float:
        return per_sample_second_moment(judge.sq_norms, judge.u, Proposal("p", q, p)) / base

    def bins(q: np.ndarray, floor: float) -> np.ndarray:
        return time_bin_probabilities(build.sq_norms, build.u, q, bins=16, alpha=floor)

    return {
        "flow time, the sampler's floor": ratio(uniform_q, bins(uniform_q, 0.2)),
        "flow time, no floor": ratio(uniform_q, bins(uniform_q, 0.0)),
        "anchors": ratio(anchor_q, None),
        "anchors and flow time": ratio(anchor_q, bins(anchor_q, 0.0)),
    }


def evaluations(out: Path, cache: Path, runs: List[Dict[str, Any]], episodes: int, overrides: Sequence[str]) -> float:
    """Closed-loop success of `runs`' checkpoints on the test scenes, the same episodes for every one
    (job=evaluate multiruns; sequential: each evaluation's rollout workers use the cores)."""
    env = {**os.environ, "VLAEVAL_CACHE_DIR": str(cache), "MPLBACKEND": "Agg"}
    done = evaluated(out, episodes)
    missing = [r for r in runs if r["checkpoint"] not in done]
    if missing:
        batch = out / f"batch-{len(list(out.glob('batch-*')))}"
        arguments = [
            "-m",
            "job=evaluate",
            "tracking=disabled",
            "checkpoint=path",
            "checkpoint.path=" + ",".join(r["checkpoint"] for r in missing),
            f"evaluate.episodes_per_task={episodes}",
            "evaluate.scenes=test",
            *overrides,
            f"hydra.sweep.dir={batch}",
        ]
        once(batch, lambda: main_py(arguments, env))
        done = evaluated(out, episodes)
    for r in runs:
        r["successes"] = done[r["checkpoint"]]
    return wall_seconds(out)


def evaluated(out: Path, episodes: int) -> Dict[str, List[bool]]:
    successes = {}
    for result_file in sorted(out.rglob("result.json")) if out.exists() else []:
        result = json.loads(result_file.read_text())
        per_task = result["evaluation"]["per_task"]
        if all(len(per_task[task]["policy_successes"]) == episodes for task in per_task):
            successes[result["checkpoint"]] = [
                s for task in sorted(per_task) for s in per_task[task]["policy_successes"]
            ]
    return successes


def summarise(runs: List[Dict[str, Any]], arms: Sequence[str], rate: float) -> Dict[str, Any]:
    """Everything reported, from the runs at the matched rate (every seed), on the test scenes."""
    at = {
        arm: sorted((r for r in runs if r["arm"] == arm and r["learning_rate"] == rate), key=lambda r: r["seed"])
        for arm in arms
    }
    finite = {arm: [r for r in rs if r["diverged_at_step"] is None] for arm, rs in at.items()}
    target = max(float(np.mean([r["final_test_loss"] for r in rs])) for rs in finite.values() if rs)
    every = [r for rs in finite.values() for r in rs]
    # every run ends at the budget (the residual arm's pairs short of it by its scoring): a run that has
    # not reached the target by its end never does, so it counts at the horizon, the longest run's end
    horizons = {name: float(max(axis(r, name)[-1] for r in every)) for name in AXES}
    uniform_seconds = float(np.mean([axis(r, "seconds")[-1] for r in finite["uniform"]]))
    rows: Dict[str, Any] = {}
    for arm in arms:
        mine = finite[arm]
        times = {
            name: restricted_mean_time(
                [first_reach(axis(r, name), np.asarray(r["heldout_curve"])[:, 2], target) for r in mine], horizons[name]
            )
            for name in AXES
        }
        moments = [settled_mean(r["second_moment_curve"]) for r in mine if r["second_moment_curve"]]
        rows[arm] = {
            "seeds": len(at[arm]),
            "diverged": len(at[arm]) - len(mine),
            "steps": sorted({r["steps"] for r in mine}),
            "final_test_loss": interval([r["final_test_loss"] for r in mine]),
            "test_loss_at_uniform_seconds": interval(
                [
                    float(np.interp(uniform_seconds, axis(r, "seconds"), np.asarray(r["heldout_curve"])[:, 2]))
                    for r in mine
                ]
            ),
            "time_to_target": times,
            "second_moment_ratio": interval(moments) if moments else None,
        }
    return {
        "learning_rate": rate,
        "target_test_loss": target,
        "horizons": horizons,
        "uniform_seconds": uniform_seconds,
        "arms": rows,
    }


def settled_mean(curve: Sequence[Sequence[float]], warmup: int = 200) -> float:
    """The curve's mean after the recipe's learning-rate warmup (200 steps; the sampler's own warmup,
    train.time_warmup_steps, is over well before); a run no longer than that: after step 0."""
    after = [m for s, m in curve if s >= warmup] or [m for s, m in curve if s > 0]
    return float(np.mean(after))


def success_comparisons(regimes: Dict[str, Any]) -> None:
    """Each arm against uniform, per regime: success per seed (paired by seed and episode), the mean
    difference across seeds with its t p-value and interval; Holm over every comparison of every
    regime (the family), and Bonferroni intervals at the family's level."""
    from scipy import stats

    family = []
    for block in regimes.values():
        runs = block["matched_runs"]
        by = {(r["arm"], r["seed"]): r for r in runs}
        for arm in block["arms"]:
            if arm == "uniform":
                continue
            seeds = [s for s in SEEDS if (arm, s) in by and ("uniform", s) in by]
            diff = np.array([np.mean(by[arm, s]["successes"]) - np.mean(by["uniform", s]["successes"]) for s in seeds])
            episodes = np.concatenate(
                [
                    np.asarray(by[arm, s]["successes"], float) - np.asarray(by["uniform", s]["successes"], float)
                    for s in seeds
                ]
            )
            p = float(stats.ttest_1samp(diff, 0.0).pvalue) if np.ptp(diff) > 0 else float(diff.mean() == 0.0 or 0.0)
            entry = {
                "arm": arm,
                "seeds": len(seeds),
                "difference": float(diff.mean()),
                "p": p,
                "per_seed": diff.tolist(),
            }
            entry["paired_episodes_se"] = float(episodes.std(ddof=1) / np.sqrt(episodes.size))
            block["summary"]["arms"][arm]["success_vs_uniform"] = entry
            family.append((entry, diff))
    m = len(family)
    order = sorted(range(m), key=lambda k: family[k][0]["p"])
    running = 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (m - rank) * family[k][0]["p"]))
        family[k][0]["p_holm"] = running
    for entry, diff in family:
        half = stats.t.ppf(1 - 0.025 / m, diff.size - 1) * diff.std(ddof=1) / np.sqrt(diff.size)
        entry["bonferroni_interval"] = [float(diff.mean() - half), float(diff.mean() + half)]
        entry["family_size"] = m
    for block in regimes.values():
        for arm, row in block["summary"]["arms"].items():
            mine = [s for r in block["matched_runs"] if r["arm"] == arm for s in r["successes"]]
            row["success"] = {"rate": float(np.mean(mine)), "episodes": len(mine)}


def run_regime(key: str, args: argparse.Namespace, extra: List[str]) -> Dict[str, Any]:
    label, data_overrides = REGIMES[key]
    overrides = [*data_overrides, *extra, f"train.budget_samples={args.budget}"]
    out = args.runs_dir / key
    budget = residual_budget(overrides, args.cache_dir, args.budget)
    arms = ARMS if budget["steps_left"] >= 1 else [a for a in ARMS if a != RESIDUAL]
    rates = list(args.learning_rates)
    for widened in range(WIDENINGS + 1):  # the grid, widened where a choice sits at its edge
        for lr in rates:
            unit = out / f"grid-lr-{lr:g}"
            once(unit, functools.partial(sweep, unit, args.cache_dir, overrides, arms, f"{lr}", GRID_SEEDS, args.jobs))
        best = choose_rates(read_runs(out), arms, rates)
        wider = widen(rates, best)
        if wider == rates or args.quick or widened == WIDENINGS:
            break
        rates = wider
    matched = best["uniform"]
    rest = ",".join(str(s) for s in SEEDS if str(s) not in GRID_SEEDS.split(","))
    unit = out / "matched"
    once(unit, functools.partial(sweep, unit, args.cache_dir, overrides, arms, f"{matched}", rest, args.jobs))
    runs = read_runs(out)
    matched_runs = [r for r in runs if r["learning_rate"] == matched and r["diverged_at_step"] is None]
    evaluation_wall = evaluations(
        args.runs_dir / f"{key}-evaluation",
        args.cache_dir,
        matched_runs,
        args.episodes_per_task,
        [o for o in overrides if not o.startswith("train.")],
    )
    summary = summarise(runs, arms, matched)
    uniform_seed0 = next(r for r in matched_runs if r["arm"] == "uniform" and r["seed"] == 0)
    summary["ceiling"] = ceiling(overrides, args.cache_dir, uniform_seed0["checkpoint"], args.ceiling_anchors)
    return {
        "label": label,
        "arms": arms,
        "residual_budget": budget,
        "grid": rates,
        "chosen": best,
        "training_wall_seconds": wall_seconds(out),
        "evaluation_wall_seconds": evaluation_wall,
        "runs": runs,
        "matched_runs": matched_runs,
        "summary": summary,
    }


def fmt(x: Optional[Dict[str, Any]], spec: str = ".4f") -> str:
    if x is None or x.get("mean") is None:
        return "n/a"
    if x.get("low") is None:
        return f"{x['mean']:{spec}}"
    return f"{x['mean']:{spec}} [{x['low']:{spec}}, {x['high']:{spec}}]"


def p_value(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def time_cell(t: Dict[str, Any], uniform: Dict[str, Any], spec: str) -> str:
    """The restricted mean time [interval], how many reached the target, and uniform's over it."""
    speedup = uniform["mean"] / t["mean"] if t["mean"] else float("nan")
    return f"{fmt(t, spec)} ({t['reached']}/{t['of']}; {speedup:.2f}x)"


def regime_block(block: Dict[str, Any]) -> str:
    summary, budget = block["summary"], block["residual_budget"]
    arms = summary["arms"]
    rows = []
    for arm, r in arms.items():
        times = r["time_to_target"]
        uniform = arms["uniform"]["time_to_target"]
        versus = r.get("success_vs_uniform")
        rows.append(
            (
                arm,
                f"{block['chosen'][arm]:g}",
                "/".join(str(s) for s in r["steps"]),
                fmt(r["final_test_loss"]),
                time_cell(times["pairs"], uniform["pairs"], ",.0f"),
                time_cell(times["gflop"], uniform["gflop"], ",.0f"),
                time_cell(times["seconds"], uniform["seconds"], ".1f"),
                fmt(r["test_loss_at_uniform_seconds"]),
                fmt(r["second_moment_ratio"], ".3f"),
                f"{r['success']['rate']:.3f} of {r['success']['episodes']}",
                "-"
                if versus is None
                else f"{versus['difference']:+.3f} [{versus['bonferroni_interval'][0]:+.3f}, {versus['bonferroni_interval'][1]:+.3f}], "
                f"p {p_value(versus['p'])}, Holm {p_value(versus['p_holm'])}",
            )
        )
    residual = (
        f"Scoring every anchor ({budget['anchors']:,}) for the residual arm costs {budget['scoring_pairs']:,.0f} training "
        f"pairs' FLOPs, {budget['share_of_budget']:.0%} of the budget"
        + (
            f", leaving {budget['steps_left']:,} steps."
            if budget["steps_left"] >= 1
            else ": more than the whole budget, so the residual arm cannot run compute-matched here and is not run."
        )
    )
    ceiling = ", ".join(
        f"{name} {value:.3f} ({1 / value:.2f}x effective batch)" for name, value in summary["ceiling"].items()
    )
    grid = ", ".join(f"{lr:g}" for lr in block["grid"])
    edges = (min(block["grid"]), max(block["grid"]))
    chosen = ", ".join(
        f"{arm} {lr:g}" + (" (the grid's edge)" if lr in edges else "") for arm, lr in block["chosen"].items()
    )
    horizons = summary["horizons"]
    return (
        f"### {block['label']}\n\n"
        f"Learning-rate grid {grid} on seeds {GRID_SEEDS}; chosen on the validation scenes: {chosen}. Everything below is "
        f"at the uniform arm's rate ({summary['learning_rate']:g}) on seeds {', '.join(str(s) for s in SEEDS)}, on the test scenes. "
        f"Target: {summary['target_test_loss']:.4f}, the worst arm's mean final test loss; horizons "
        f"{horizons['pairs']:,.0f} pairs, {horizons['gflop']:,.0f} GFLOP, {horizons['seconds']:.1f} s. {residual} "
        f"Training {block['training_wall_seconds']:.0f} s, closed-loop evaluation {block['evaluation_wall_seconds']:.0f} s.\n\n"
        f"**The ceiling** (exact-gradient oracles' second-moment ratio on the uniform arm's final checkpoint, seed 0; built on "
        f"{BUILD_DRAWS} draws per anchor, judged on {JUDGE_DRAWS} others): {ceiling}.\n\n"
        + markdown_table(
            [
                "arm",
                "chosen LR (validation)",
                "steps",
                "final test loss",
                "time to target, pairs (reached; speed-up)",
                "time to target, GFLOP",
                "time to target, seconds",
                "test loss at uniform's seconds",
                "realised second-moment ratio",
                "success",
                "success - uniform (Bonferroni interval, p)",
            ],
            rows,
        )
        + "\n\nMean final validation loss over the grid seeds, per learning rate:\n\n"
        + grid_table(block)
    )


def grid_table(block: Dict[str, Any]) -> str:
    grid_seeds = {int(s) for s in GRID_SEEDS.split(",")}
    runs = [r for r in block["runs"] if r["seed"] in grid_seeds]
    rates = sorted({r["learning_rate"] for r in runs})
    rows = []
    for arm in block["arms"]:
        cells = []
        for lr in rates:
            mine = [r for r in runs if r["arm"] == arm and r["learning_rate"] == lr]
            finite = [r["final_validation_loss"] for r in mine if r["diverged_at_step"] is None]
            diverged = len(mine) - len(finite)
            cells.append(
                (f"{np.mean(finite):.4f}" if finite else "-") + (f" ({diverged} diverged)" if diverged else "")
            )
        rows.append((arm, *cells))
    return markdown_table(["arm", *(f"lr {lr:g}" for lr in rates)], rows)


def page(results: Dict[str, Any], image: str) -> str:
    return (
        f"Every run ends at the same compute: {results['budget']:,} training pairs (one (anchor, t, noise) forward and "
        "backward; the work of 3,000 steps at batch 256), so the 1.5x batch gets 2/3 of the steps and the residual arm "
        "loses its scoring's counted FLOPs; the recipe is the built-in one (200 warmup steps, gradient clipping at 1, "
        "EMA 0.999), AdamW. The learning rate is chosen per arm on the validation scenes (the first half of the held-out "
        "scenes) from a grid 2x apart on two seeds; every number reported is on the test scenes (the other half) at the "
        "uniform arm's rate on five seeds, so arms are compared at the same learning rate and nothing reported was chosen "
        "on. Intervals: 95% t across seeds. Time to target is censoring-aware: the restricted mean of min(T, horizon) over "
        "every seed, a run that ends without reaching it counted at the horizon, the longest run's end on that axis "
        "(GFLOP and seconds include the scoring), with how many seeds reached the target and uniform's restricted mean over the arm's (speed-up). The realised "
        "second-moment ratio is M_p / M_uniform of what the run drew from (its anchor proposal x the adaptive sampler's "
        "bins as they stood), exact per-sample gradient norms of 256 fixed training anchors at the online weights, "
        "averaged over the held-out steps after the warmup; 1 is uniform's, below 1 a larger effective batch. Success: "
        f"closed-loop on the test scenes, {results['episodes_per_task']} episodes per task per checkpoint, the same episodes "
        "for every checkpoint; each arm against uniform paired by seed, its mean difference across seeds with a t-test "
        "(seeds - 1 df), Holm-adjusted over every comparison on this page, with Bonferroni intervals at the family's level."
        f"\n\n![test loss against training pairs, GFLOP and seconds; the realised second-moment ratio]({image})\n\n"
        + "\n\n".join(regime_block(block) for block in results["regimes"].values())
    )


def plot_curves(results: Dict[str, Any], path: Path) -> Path:
    """Per regime: the test loss against training pairs, GFLOP and seconds, and the realised
    second-moment ratio against steps; per arm at the matched rate, the mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlaeval.artifacts import atomic_write_bytes

    blocks = results["regimes"]
    fig, axes = plt.subplots(len(blocks), 4, figsize=(16, 3.4 * len(blocks)), squeeze=False)
    for row, block in enumerate(blocks.values()):
        for arm in block["arms"]:
            mine = [r for r in block["matched_runs"] if r["arm"] == arm]
            n = min(len(r["heldout_curve"]) for r in mine)
            loss = np.mean([np.asarray(r["heldout_curve"])[:n, 2] for r in mine], axis=0)
            for col, name in enumerate(AXES):
                x = np.mean([axis(r, name)[:n] for r in mine], axis=0)
                axes[row, col].plot(x, loss, label=arm)
                axes[row, col].set_xlabel(
                    {
                        "pairs": "training pairs",
                        "gflop": "GFLOP (scoring included)",
                        "seconds": "seconds (scoring included)",
                    }[name]
                )
                axes[row, col].set_yscale("log")
                axes[row, col].set_ylabel("test loss")
            moments = [r["second_moment_curve"] for r in mine if r["second_moment_curve"]]
            if moments:
                k = min(len(m) for m in moments)
                steps = np.asarray(moments[0])[:k, 0]
                axes[row, 3].plot(steps, np.mean([np.asarray(m)[:k, 1] for m in moments], axis=0), label=arm)
        axes[row, 3].axhline(1.0, color="grey", linestyle=":", linewidth=1)
        axes[row, 3].set_xlabel("step")
        axes[row, 3].set_ylabel("realised second-moment ratio")
        axes[row, 0].set_title(block["label"], fontsize=9, loc="left")
        axes[row, 0].legend(fontsize=7)
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=90))
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "vlaeval")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/vlaeval-training-comparison"))
    parser.add_argument("--regimes", nargs="*", default=list(REGIMES))
    parser.add_argument("--learning-rates", nargs="*", type=float, default=LEARNING_RATES)
    parser.add_argument("--budget", type=int, default=None, help=f"training pairs per run (default {BUDGET:,})")
    parser.add_argument(
        "--episodes-per-task", type=int, default=None, help="closed-loop episodes (default 20; 1 quick)"
    )
    parser.add_argument("--ceiling-anchors", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="a tiny preset that checks the pipeline")
    parser.add_argument("--jobs", type=int, default=2, help="training runs at a time (the cores are split)")
    args = parser.parse_args()
    if args.quick:
        args.regimes, args.learning_rates = ["72"], args.learning_rates[1:3]
    args.budget = args.budget or (30_720 if args.quick else BUDGET)
    args.episodes_per_task = args.episodes_per_task or (1 if args.quick else 20)
    extra = QUICK if args.quick else []
    regimes = {}
    for key in args.regimes:
        regimes[key] = run_regime(key, args, extra)
        print(json.dumps({key: regimes[key]["summary"]}, indent=1), flush=True)
    success_comparisons(regimes)
    results = {
        "budget": args.budget,
        "episodes_per_task": args.episodes_per_task,
        "quick": args.quick,
        "regimes": regimes,
    }
    name = "training_comparison_quick" if args.quick else "training_comparison"
    atomic_write_json(REPO / "benchmarks" / "results" / f"{name}.json", results)
    plot_curves(results, FIGURES / f"{name}.png")
    write_figures(
        name,
        "The training comparison, quick preset (checks the pipeline)"
        if args.quick
        else "Does the audit make training faster?",
        "python benchmarks/training_comparison.py" + (" --quick" if args.quick else ""),
        page(results, f"{name}.png"),
    )


if __name__ == "__main__":
    main()
