"""A recipe, not a run: job=recipe_comparison on the built-in recipes, and the test over seeds checked
on simulated seed-level designs at the seed SD those runs measured.

    python benchmarks/recipe_comparison.py [--families state vision] [--seeds 5] [--episodes 20]

Per family: an A/A (the family's recipe against itself at other training seeds, --seeds pairs, the
margin at 0 so every pair runs: the seed-to-seed spread, per task and as the seed-spread matrix, with
each pair of seeds' exact episode-level p); the same seed pairs re-decided from their outcome file
at margins 0.05 and 0.10 (what an A/A may conclude: EQUIVALENT, never BETTER or WORSE); then a recipe
known to be worse (a tenth of the steps) until the test decides, beside the seeds the planner
predicted from the A/A's seed-pair SD. Every checkpoint runs --episodes episodes per task on the test
half of the held-out scenes. Checkpoints and evaluations are cached: a killed run restarts where it
was. Then the planner's seed pairs per effect size at the measured SD, and the test's error on
simulated seed pairs at that SD (normal, and the A/A's own differences resampled), both sides and at
both edges of the margin, with the naive t-interval re-read after every seed as the control that must
fail.

Results in benchmarks/results/recipe_comparison.json and docs/figures/recipe_comparison.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np

from benchlib import REPO, main_py, markdown_table, rate, saved_results, show, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.seqtest.seeds import BETTER, EQUIVALENT, WORSE, plan_seeds, seed_test

ALPHA = 0.05
PRIOR = 2.0
FAMILIES: Dict[str, Dict[str, Any]] = {
    "state": {
        "what": "the built-in state policy (model=tiny_vla, data=metaworld, 3,000 steps)",
        "base": ["data=metaworld", "model=tiny_vla"],
        "worse": ["train.steps=300"],
    },
    "vision": {
        "what": (
            "the vision policy's recipe at 3,000 steps (model=tiny_vla_vision, data=metaworld_vision: the corner "
            "camera with the goal marker, 4 flow draws per anchor, the located object and goal)"
        ),
        "base": [
            "data=metaworld_vision",
            "model=tiny_vla_vision",
            "train.draws_per_anchor=4",
            "model.locate=[4,5,6,36,37,38]",
        ],
        "worse": ["train.steps=300"],
    },
}
SIMULATIONS = 2000


def run_job(arguments: Sequence[str], out: Path, env: Dict[str, str]) -> Dict[str, Any]:
    """job=recipe_comparison in its own process (resumed from the cache); its result.json."""
    if not (out / "result.json").is_file():
        main_py(["job=recipe_comparison", f"paths.output_dir={out}", "tracking=disabled", *arguments], env)
    return json.loads((out / "result.json").read_text())


def quoted(overrides: Sequence[str]) -> str:
    return "[" + ",".join(f'"{o}"' for o in overrides) + "]"


def family_runs(
    name: str, seeds: int, episodes: int, out: Path, env: Dict[str, str], with_worse: bool = True
) -> Dict[str, Any]:
    family = FAMILIES[name]
    common = [*family["base"], f"evaluate.episodes_per_task={episodes}", "evaluate.scenes=test"]
    aa = run_job([*common, "recipes=aa", f"recipes.max_seeds={seeds}", "recipes.margin=0"], out / name / "aa", env)
    redecided = {
        margin: run_job(
            [*common, f"recipes.file={aa['seed_outcomes']}", f"recipes.margin={margin}"],
            out / name / f"aa_margin_{margin}",
            env,
        )
        for margin in (0.05, 0.10)
    }
    worse = (
        run_job(
            [
                *common,
                "recipes.candidate.name=tenth_steps",
                f"recipes.candidate.overrides={quoted(family['worse'])}",
                "recipes.max_seeds=10",
                "recipes.margin=0",
            ],
            out / name / "worse",
            env,
        )
        if with_worse
        else None
    )
    return {"aa": aa, "redecided": redecided, "worse": worse}


def differences(result: Dict[str, Any]) -> np.ndarray:
    return np.array(result["candidate"]["success"]) - np.array(result["baseline"]["success"])


def error_rates(sd: float, residuals: np.ndarray, floor: float, seeds: int = 20) -> List[List[str]]:
    """False decisions of the seed test (run to `seeds` pairs, stopping where it decides) and the naive
    control, on normal differences at `sd` and on the A/A's own differences resampled."""
    from scipy.stats import t as student_t

    rng = np.random.default_rng(0)
    rows = []
    for shape in ("normal", "resampled A/A", "one seed in five collapses"):
        for truth, wrong, label in (
            (0.0, {BETTER, WORSE}, "0: BETTER or WORSE"),
            (0.05, {EQUIVALENT}, "+0.05: EQUIVALENT"),
            (-0.05, {EQUIVALENT}, "-0.05: EQUIVALENT"),
        ):
            if shape == "normal":
                draws = rng.normal(truth, sd, (SIMULATIONS, seeds))
            elif shape == "resampled A/A":
                draws = truth + rng.choice(residuals - residuals.mean(), (SIMULATIONS, seeds))
            else:  # the candidate's training collapses one time in five: -0.4 then, +0.1 otherwise (mean 0)
                collapsed = rng.random((SIMULATIONS, seeds)) < 0.2
                draws = truth + np.where(collapsed, -0.4, 0.1) + rng.normal(0.0, sd, (SIMULATIONS, seeds))
            ours = naive = 0
            for d in draws:
                decision = seed_test(d, alpha=ALPHA, margin=0.05, prior_scale=PRIOR, resolution=floor).decision
                ours += decision in wrong
                naive += naive_decision(d, truth, wrong, floor, student_t)
            rows.append([shape, label, show(rate(ours, SIMULATIONS)), show(rate(naive, SIMULATIONS))])
    return rows


def naive_decision(d: np.ndarray, truth: float, wrong: set, floor: float, student_t: Any) -> bool:
    """The control: a 95% t-interval read after every seed pair, stopping at its first decision."""
    for n in range(2, len(d) + 1):
        mean, sd = d[:n].mean(), max(d[:n].std(ddof=1), floor)
        half = student_t.ppf(1 - ALPHA / 2, n - 1) * sd / math.sqrt(n)
        low, high = mean - half, mean + half
        decision = BETTER if low > 0 else WORSE if high < 0 else EQUIVALENT if -0.05 < low and high < 0.05 else None
        if decision is not None:
            return decision in wrong
    return False


def page(results: Dict[str, Any], seeds: int, episodes: int) -> str:
    parts: List[str] = [
        "job=recipe_comparison: each seed pair trains both recipes (train.seed = k for the baseline, k + 1000 "
        "for the A/A's other side) and runs both checkpoints on the same episodes "
        f"({episodes} per task, the test half of the held-out scenes, which chose nothing); the test is the "
        "confidence sequence over seed pairs (vlaeval/seqtest/seeds.py, prior scale g = 2, alpha = 0.05), read "
        "after every pair. Success rates with their seeds' SD; intervals are the sequence's at the last pair."
    ]
    for name, runs in results["families"].items():
        aa, worse = runs["aa"], runs["worse"]
        b, c = aa["baseline"], aa["candidate"]
        d = differences(aa)
        parts.append(f"## {name}: {FAMILIES[name]['what']}")
        parts.append(f"### A/A: the same recipe, {seeds} seeds a side")
        parts.append(
            markdown_table(
                ["side", "success per seed", "mean", "seed SD"],
                [
                    [
                        side["name"],
                        ", ".join(f"{x:.3f}" for x in side["success"]),
                        f"{side['mean']:.3f}",
                        f"{side['sd']:.3f}",
                    ]
                    for side in (b, c)
                ],
            )
        )
        last = aa["looks"][-1]
        bounds = f"[{last['low']:+.3f}, {last['high']:+.3f}]" if "low" in last else "unbounded"
        parts.append(
            f"Seed-pair differences {', '.join(f'{x:+.3f}' for x in d)}: mean {d.mean():+.3f}, SD {d.std(ddof=1):.3f}; "
            f"the sequence after {len(d)} pairs {bounds}: {aa['decision']} (margin 0: EQUIVALENT is never asked). "
            + " ".join(
                f"Re-decided from its outcome file at margin {m}: {r['decision']}"
                + (f" at pair {r['decided_at']}." if r.get("decided_at") else ".")
                for m, r in runs["redecided"].items()
            )
        )
        tasks = list(b["per_task_sd"])
        parts.append(f"Each task's success across seeds ({seeds} checkpoints a side):")
        parts.append(
            markdown_table(
                ["task", "baseline mean", "baseline seed SD", "other seeds mean", "other seeds SD"],
                [
                    [
                        t,
                        f"{b['per_task_mean'][t]:.3f}",
                        f"{b['per_task_sd'][t]:.3f}",
                        f"{c['per_task_mean'][t]:.3f}",
                        f"{c['per_task_sd'][t]:.3f}",
                    ]
                    for t in tasks
                ],
            )
        )
        parts.append(
            "The seed-spread matrix of the baseline side: seed i's success minus seed j's, with the exact "
            "episode-level (McNemar) p of the two checkpoints on the same episodes -- what a one-run comparison "
            "would call a difference between two runs of one recipe:"
        )
        spread, p = b["spread"], b["spread_p"]
        parts.append(
            markdown_table(
                ["seed", *[str(s["seed"]) for s in aa["pairs"]]],
                [
                    [
                        str(aa["pairs"][i]["seed"]),
                        *[f"{spread[i][j]:+.3f} (p {p[i][j]:.2g})" for j in range(len(spread))],
                    ]
                    for i in range(len(spread))
                ],
            )
        )
        pair_sd = float(d.std(ddof=1))
        parts.append(f"### A recipe known to be worse: {', '.join(FAMILIES[name]['worse'])}")
        if worse is None:
            parts.append("Not run yet for this family (`--families " + name + "` without `--aa-only` runs it).")
        else:
            observed = float(np.mean(differences(worse)))
            predicted = plan_seeds([observed], pair_sd, alpha=ALPHA, margin=0.0, prior_scale=PRIOR, max_seeds=10)[0]
            wl = worse["looks"][-1]
            wbounds = f"[{wl['low']:+.3f}, {wl['high']:+.3f}]" if "low" in wl else "unbounded"
            parts.append(
                markdown_table(
                    ["side", "success per seed", "mean", "seed SD"],
                    [
                        [s["name"], ", ".join(f"{x:.3f}" for x in s["success"]), f"{s['mean']:.3f}", f"{s['sd']:.3f}"]
                        for s in (worse["baseline"], worse["candidate"])
                    ],
                )
            )
            need = f"{predicted.seeds} pairs" if predicted.seeds is not None else "more than 10 pairs"
            parts.append(
                f"{worse['decision']} at seed pair {worse.get('decided_at')}, the sequence {wbounds} (these pairs' own "
                f"SD {float(np.std(differences(worse), ddof=1)):.3f}). The planner, at the A/A's seed-pair SD "
                f"{pair_sd:.3f} and this difference ({observed:+.3f}), predicted {need} for 80% power (power "
                f"{predicted.power_at_max:.2f} within 10, {predicted.expected:.1f} pairs on average)."
            )
        effects = [0.05, 0.10, 0.15, 0.20, 0.30]
        rows = plan_seeds([*effects, 0.0], pair_sd, alpha=ALPHA, margin=0.10, prior_scale=PRIOR, max_seeds=20)
        parts.append(
            f"### Seed pairs a difference needs at this family's seed-pair SD ({pair_sd:.3f})\n\n"
            "The planner (recipes.plan_effects): normal seed-pair differences at that SD, the test run to 20 pairs; "
            "EQUIVALENT (difference 0) at margin 0.10."
        )
        parts.append(
            markdown_table(
                ["difference", "pairs for 80% power", "power at 20 pairs", "pairs on average"],
                [
                    [
                        f"{r.effect:+.2f}" + (" (EQUIVALENT)" if r.effect == 0 else ""),
                        r.seeds or "> 20",
                        f"{r.power_at_max:.2f}",
                        f"{r.expected:.1f}",
                    ]
                    for r in rows
                ],
            )
        )
        floor = 1.0 / len(aa["pairs"][0]["baseline"]["success"])
        parts.append(
            f"### The test's error at this SD\n\nFalse decisions in {SIMULATIONS:,} simulated comparisons of 20 "
            "seed pairs each (stopping where the test decides), margin 0.05: normal differences at the measured "
            "seed-pair SD, the A/A's own differences centred and resampled (their real shape), and a candidate whose "
            "training collapses one time in five (-0.4 then, +0.1 otherwise: mean 0, the rare-event null no few-seed "
            "test survives; the limit, stated in docs/recipes.md). The control reads a fixed 95% t-interval after "
            "every pair; it must fail."
        )
        parts.append(
            markdown_table(
                ["differences", "truth: wrong answer", "seed test", "naive t re-read"],
                error_rates(pair_sd, d, floor),
            )
        )
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["state"], choices=sorted(FAMILIES))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--aa-only", action="store_true", help="the A/A and its figures, not the worse recipe")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "recipe_comparison")
    args = parser.parse_args()
    env = {**os.environ, "VLAEVAL_CACHE_DIR": os.environ.get("VLAEVAL_CACHE_DIR", str(REPO / ".cache" / "vlaeval"))}
    # Families measured earlier stay on the page (each is hours of training on a small machine).
    saved, results = saved_results("recipe_comparison", {"families": {}})
    for name in args.families:
        results["families"][name] = family_runs(name, args.seeds, args.episodes, args.out, env, not args.aa_only)
    results["families"] = {k: results["families"][k] for k in FAMILIES if k in results["families"]}
    atomic_write_json(saved, results)
    families = " ".join(results["families"])
    write_figures(
        "recipe_comparison",
        "A recipe, not a run: recipe comparisons over training seeds",
        f"python benchmarks/recipe_comparison.py --families {families} --seeds {args.seeds} --episodes {args.episodes}",
        page(results, args.seeds, args.episodes),
    )


if __name__ == "__main__":
    main()
