"""Does any offline number predict closed-loop success? job=offline_validity on >= 40 checkpoints
per policy family, measured.

    python benchmarks/offline_validity.py [--families state vision] [--episodes 5] [--quick]

Per family, the checkpoints differ the ways users vary them: the learning rate (a 2x-spaced grid),
the seed, the sampling arm (uniform; adaptive flow time), the data size (the state family: the
default 108 demonstrations and the 900-demonstration data) and the steps (each run keeps a snapshot
every quarter of its steps: train.save_every). Each family's runs are Hydra multiruns of job=train on
the joblib launcher; then one job=offline_validity over every checkpoint: the offline metrics (held-out
flow loss overall and per noise-level bin, sampled-action error, the residual's mean, the audit's
ratio) and closed-loop success on the same held-out episodes, with Pearson, Spearman and MMRV and
their two-level bootstrap intervals, pooled and per task.

Results in benchmarks/results/offline_validity.json and docs/figures/offline_validity.md (--quick: a
tiny preset that checks the pipeline, offline_validity_quick.md).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict, Sequence

import numpy as np

from benchlib import FIGURES, REPO, main_py, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.residual.offline import lower_is_better
from vlaeval.validity.statistics import oriented

LEARNING_RATES = "5e-4,1e-3,2e-3"  # 2x apart: the grid the issue asks of a learning-rate choice
FAMILIES: Dict[str, Dict[str, Any]] = {
    "state": {
        "base": ["data=metaworld", "model=tiny_vla", "train.steps=3000", "train.save_every=750"],
        "sweeps": {
            "uniform": [f"train.learning_rate={LEARNING_RATES}", "train.seed=0,1"],
            "adaptive_time": [f"train.learning_rate={LEARNING_RATES}", "train.seed=0", "train.time_sampling=adaptive"],
            "900_demonstrations": [
                f"train.learning_rate={LEARNING_RATES}",
                "train.seed=0",
                "data.episodes_per_task=100",
            ],
        },
        "validity": ["data=metaworld", "validity.within=trained_steps"],
    },
    "vision": {
        # The vision recipe of outcomes=rollout_vision (draws_per_anchor 4, the located object and goal),
        # one camera, 2,000 steps: ten runs fit the machine; success still spreads over the snapshots.
        "base": [
            "data=metaworld_vision",
            "model=tiny_vla_vision",
            "train.steps=2000",
            "train.save_every=500",
            "train.draws_per_anchor=4",
            "model.locate=[4,5,6,36,37,38]",
        ],
        "sweeps": {
            "uniform": [f"train.learning_rate={LEARNING_RATES}", "train.seed=0,1"],
            "adaptive_time": [f"train.learning_rate={LEARNING_RATES}", "train.seed=0", "train.time_sampling=adaptive"],
            "uniform_seed_2": ["train.learning_rate=1e-3", "train.seed=2"],
        },
        "validity": ["data=metaworld_vision", "validity.within=trained_steps"],
    },
}
QUICK = {
    "base": ["data=tiny", "model=tiny_vla_small", "train.steps=60", "train.save_every=20"],
    "sweeps": {"uniform": ["train.learning_rate=1e-3,2e-3", "train.seed=0,1"]},
    "validity": ["data=tiny", "validity.resamples=300", "validity.within=trained_steps"],
}


def train_family(family: Dict[str, Any], out: Path, env: Dict[str, str], jobs: int) -> float:
    """Every sweep of the family (skipped where it already finished: a rerun resumes)."""
    wall = 0.0
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    for name, overrides in family["sweeps"].items():
        folder = out / "runs" / name
        if (folder / "done.json").exists():
            wall += float(json.loads((folder / "done.json").read_text()))
            continue
        seconds = main_py(
            [
                "-m",
                "job=train",
                "tracking=disabled",
                "train.evaluate_after=false",
                "hydra/launcher=local_processes",
                f"hydra.launcher.n_jobs={jobs}",
                *family["base"],
                *overrides,
                f"hydra.sweep.dir={folder}",
            ],
            {**env, "OMP_NUM_THREADS": threads},
        )
        atomic_write_json(folder / "done.json", seconds)
        wall += seconds
    return wall


def validate_family(family: Dict[str, Any], out: Path, env: Dict[str, str], episodes: int) -> Dict[str, Any]:
    run_dir = out / "validity"
    if not (run_dir / "result.json").exists():
        seconds = main_py(
            [
                "job=offline_validity",
                "tracking=disabled",
                *family["validity"],
                f"validity.checkpoints=[{out / 'runs'}]",
                f"evaluate.episodes_per_task={episodes}",
                f"hydra.run.dir={run_dir}",
            ],
            env,
        )
        atomic_write_json(run_dir / "wall_seconds.json", seconds)
    result = json.loads((run_dir / "result.json").read_text())
    result["wall_seconds"] = float(json.loads((run_dir / "wall_seconds.json").read_text()))
    return result


def interval(value: float, bounds: Sequence[float], digits: int = 2) -> str:
    if value is None or bounds[0] is None or not np.isfinite(value):
        return "undefined"
    return f"{value:+.{digits}f} [{bounds[0]:+.{digits}f}, {bounds[1]:+.{digits}f}]"


def regret(result: Dict[str, Any], metric: str, k: int) -> float:
    """Success of the best checkpoint minus the best among the k the metric ranks first (rolling
    out only those k)."""
    rows = result["checkpoints"]
    values = oriented([r["metrics"][metric] for r in rows], lower_is_better(metric))
    success = np.array([r["success_rate"] for r in rows])
    return float(success.max() - success[np.argsort(-values, kind="stable")[:k]].max())


def random_regret(result: Dict[str, Any], k: int, draws: int = 4000) -> float:
    """The same for k checkpoints picked at random (the mean over seeded draws): what no metric gives."""
    success = np.array([r["success_rate"] for r in result["checkpoints"]])
    rng = np.random.default_rng(k)
    picks = np.array([rng.choice(success.size, size=k, replace=False) for _ in range(draws)])
    return float((success.max() - success[picks].max(axis=1)).mean())


def within_steps_body(result: Dict[str, Any]) -> str:
    """The job's agreements among the checkpoints trained equally long (validity.within=trained_steps):
    is a metric telling apart the learning rates, seeds, arms and data sizes, or only early checkpoints
    from late ones?"""
    scopes = sorted(
        {a["scope"] for a in result["agreements"] if a["scope"].startswith("trained_steps=")},
        key=lambda scope: int(scope.split("=")[1]),
    )
    if not scopes:
        return ""
    metrics = [a["metric"] for a in result["agreements"] if a["scope"] == "pooled"]
    found = {(a["metric"], a["scope"]): a for a in result["agreements"]}
    table = [
        (
            metric,
            *(
                interval(found[metric, scope]["spearman"], found[metric, scope]["spearman_interval"])
                + ("*" if found[metric, scope]["validates"] else "")
                for scope in scopes
            ),
        )
        for metric in metrics
    ]
    counts = {scope: found[metrics[0], scope]["checkpoints"] for scope in scopes}
    header = ["metric", *(f"{scope.split('=')[1]} steps ({counts[scope]} checkpoints)" for scope in scopes)]
    return (
        "Among the checkpoints trained equally long (`validity.within=trained_steps`; Spearman, 95% interval; "
        "* : validates): what is left once training progress, which every metric tracks, is held fixed:\n\n"
        + markdown_table(header, table)
        + "\n\n"
    )


def shortlist_body(result: Dict[str, Any]) -> str:
    """Rolling out only a metric's top k: the success given up against rolling out every checkpoint."""
    pooled = [a["metric"] for a in result["agreements"] if a["scope"] == "pooled"]
    count = len(result["checkpoints"])
    ks = [k for k in (1, 3, 5, 10) if k < count]
    rows = [(m, *(f"{regret(result, m, k):.3f}" for k in ks)) for m in pooled]
    rows.append(("k at random (mean)", *(f"{random_regret(result, k):.3f}" for k in ks)))
    header = ["shortlist by", *(f"top {k} ({100 * (1 - k / count):.0f}% fewer rollouts)" for k in ks)]
    return (
        "Rolling out only the metric's top k checkpoints instead of all of them: the best success among them, "
        "short of the best of all (0: the shortlist holds the best checkpoint):\n\n" + markdown_table(header, rows)
    )


def family_body(name: str, result: Dict[str, Any], train_seconds: float) -> str:
    rows = result["checkpoints"]
    success = np.array([r["success_rate"] for r in rows])
    pooled = [a for a in result["agreements"] if a["scope"] == "pooled"]
    reliability = next(r for r in result["reliability"] if r["scope"] == "pooled")["reliability"]
    if reliability is None:  # every rate tied (JSON's null for NaN)
        ceiling = "undefined: every checkpoint's success rate is the same"
    else:
        ceiling = f"{reliability:.2f}: no metric can correlate above about {np.sqrt(max(reliability, 0)):.2f} with them"
    varies = sorted(rows[0]["varies"])
    table = markdown_table(
        ["metric", "Pearson", "Spearman", "MMRV (an unrelated metric's)", "validates"],
        [
            (
                a["metric"],
                interval(a["pearson"], a["pearson_interval"]),
                interval(a["spearman"], a["spearman_interval"]),
                f"{a['mmrv']:.3f} [{a['mmrv_interval'][0]:.3f}, {a['mmrv_interval'][1]:.3f}] ({a['mmrv_unrelated']:.3f})"
                if a["mmrv_interval"][0] is not None
                else f"{a['mmrv']:.3f}",
                "yes" if a["validates"] else "no",
            )
            for a in pooled
        ],
    )
    tasks = result["tasks"]
    per_task = markdown_table(
        ["metric", *tasks],
        [
            (
                a["metric"],
                *(
                    next(
                        (
                            f"{b['spearman']:+.2f}" + ("*" if b["validates"] else "")
                            if b["spearman"] is not None and np.isfinite(b["spearman"])
                            else "tied"
                        )
                        for b in result["agreements"]
                        if b["metric"] == a["metric"] and b["scope"] == task
                    )
                    if any(b["metric"] == a["metric"] and b["scope"] == task for b in result["agreements"])
                    else "-"
                    for task in tasks
                ),
            )
            for a in pooled
        ],
    )
    return (
        f"## {name}\n\n"
        f"{len(rows)} checkpoints varying {', '.join(varies)}; closed-loop success on "
        f"{result['episodes_per_task']} held-out episodes per task ({len(tasks)} tasks), the same for every "
        f"checkpoint: from {success.min():.2f} to {success.max():.2f} (median {np.median(success):.2f}). "
        f"The success rates' split-half reliability is {ceiling}. Training "
        f"{train_seconds:.0f} s, job=offline_validity {result['wall_seconds']:.0f} s.\n\n"
        "Pooled over tasks (95% two-level bootstrap intervals: checkpoints, and episodes within each task; each "
        "metric oriented so that a positive correlation means it predicts success -- a loss or error negated, "
        "the audit's ratio as it is):\n\n"
        f"{table}\n\n"
        "Per task, Spearman (* : its interval excludes 0):\n\n"
        f"{per_task}\n\n"
        f"{within_steps_body(result)}"
        f"{shortlist_body(result)}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--episodes", type=int, default=5, help="held-out episodes per task and checkpoint")
    parser.add_argument("--jobs", type=int, default=2, help="training runs at a time")
    parser.add_argument("--cache-dir", default=str(REPO / ".cache" / "vlaeval"))
    parser.add_argument("--runs-dir", default="/tmp/vlaeval-offline-validity")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, "VLAEVAL_CACHE_DIR": args.cache_dir, "MPLBACKEND": "Agg"}
    families = {"quick": QUICK} if args.quick else {name: FAMILIES[name] for name in args.families}
    results, bodies = {}, []
    for name, family in families.items():
        out = Path(args.runs_dir) / name
        train_seconds = train_family(family, out, env, args.jobs)
        result = validate_family(family, out, env, 2 if args.quick else args.episodes)
        results[name] = {"train_seconds": train_seconds, "result": result}
        bodies.append(family_body(name, result, train_seconds))
        print(bodies[-1], flush=True)
    suffix = "_quick" if args.quick else ""
    atomic_write_json(REPO / "benchmarks" / "results" / f"offline_validity{suffix}.json", results)
    command = "python benchmarks/offline_validity.py" + (" --quick" if args.quick else f" --episodes {args.episodes}")
    intro = (
        "Each family's checkpoints through `job=offline_validity` (docs/offline_validity.md): does an offline "
        "number rank them the way closed-loop success does? MMRV is SimplerEnv's mean maximum rank violation (0: "
        "a perfect ranking; in success-rate units); a metric validates when Spearman's interval lies above 0. The "
        "best checkpoint's success is measured on the same episodes it is chosen on, so the shortlists' shortfalls "
        "are, if anything, too small.\n\n"
    )
    write_figures(
        f"offline_validity{suffix}",
        "Does an offline number predict closed-loop success?",
        command,
        intro + "\n".join(bodies),
    )
    print(f"written {FIGURES / f'offline_validity{suffix}.md'}")


if __name__ == "__main__":
    main()
