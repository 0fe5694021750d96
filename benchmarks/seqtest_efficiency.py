"""Sequential-test efficiency and validity, by simulation on the gauntlet's generator.

1. Efficiency: median clusters (and units) to a decision over planted effects x cluster sizes for
   every bet rule and cap, beside (i) the information floor log(1/alpha) / KL_inf and the closed-
   form cap-limited time, (ii) the clusters a fixed-n one-sided z-test needs for 80% power. The
   default rule is the one with the smallest worst-cell ratio to the floor among caps < 1 (c = 1
   lets one worst-case cluster zero the wealth for good, so it is measured but never chosen).
2. The cost of a predictable cap: strata of unequal cluster sizes, median clusters to a decision
   with one cap per stratum (from its smallest cluster; valid) against the cap of each arriving
   cluster (what shipped before; invalid).
3. Validity before and after: false-decision rates on the size-dependent designs (per-cluster cap
   vs stratum cap) and on files grouped worse half first (file order vs seeded shuffle).
4. The three test modes and a one-look fixed-n z-test on the same designs (realistic, skewed,
   rare-event and unequal-size nulls; alternatives): Type-I under the looks each is allowed and
   clusters to a decision within the stratum's clusters.

    python benchmarks/seqtest_efficiency.py                 # everything, 500 replications a cell
    python benchmarks/seqtest_efficiency.py --quick         # 100 replications, fewer caps
    python benchmarks/seqtest_efficiency.py --margin 0.005  # the issue's background figures
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any, Dict, List, Sequence, Union

import numpy as np

from benchlib import FIGURES, REPO
from vlaeval.artifacts import atomic_write_json, atomic_write_text
from vlaeval.gauntlet.outcomes import cluster_permutation
from vlaeval.seqtest import BET_RULES, DEFAULT_BET_CAP, DEFAULT_BET_RULE
from vlaeval.seqtest.eprocess import size_adaptive_cap
from vlaeval.seqtest.simulation import (
    NEVER,
    asymptotic_decision_times,
    cap_limited_clusters,
    decision_time,
    exact_decision_times,
    fixed_n_clusters,
    fixed_n_decision_times,
    group_sequential_decision_times,
    information_floor,
    realistic_cluster_means,
    size_dependent_designs,
    skewed_null_cluster_means,
)

EFFECTS = (-0.06, -0.03, -0.01, 0.0, 0.01)
CLUSTER_SIZES = (1, 5, 20, 40)
ALPHA = 0.05
BURN_IN, TUNING = 30, 500
DEFAULT_KEY = f"{DEFAULT_BET_RULE}@{'auto' if DEFAULT_BET_CAP is None else DEFAULT_BET_CAP}"


def default_cap(size: int) -> float:
    return float(size_adaptive_cap(size)) if DEFAULT_BET_CAP is None else DEFAULT_BET_CAP


def median_or_inf(times: np.ndarray) -> float:
    value = float(np.median(times))
    return math.inf if value >= NEVER else value


def median_interval(times: np.ndarray) -> tuple:
    """Distribution-free 95% interval for the median from order statistics (binomial)."""
    ordered = np.sort(times)
    n = ordered.size
    lo = int(max(math.floor(n / 2 - 1.96 * math.sqrt(n) / 2), 0))
    hi = int(min(math.ceil(n / 2 + 1.96 * math.sqrt(n) / 2), n - 1))
    return tuple(math.inf if v >= NEVER else float(v) for v in (ordered[lo], ordered[hi]))


def efficiency_grid(reps: int, caps: Sequence[Union[float, str]], delta: float, seed: int) -> List[Dict[str, Any]]:
    rows = []
    for size in CLUSTER_SIZES:
        for effect in EFFECTS:
            rng = np.random.default_rng([seed, size, int(round(effect * 1000)) + 1000])
            reference = realistic_cluster_means(rng, 1, 400_000 // size, size, effect)[0]
            floor = information_floor(reference, delta, ALPHA)
            horizon = int(min(max(4 * floor, 300), 20_000))
            x = realistic_cluster_means(rng, reps, horizon, size, effect)
            row: Dict[str, Any] = {
                "effect": effect,
                "cluster_size": size,
                "horizon_clusters": horizon,
                "floor_clusters": floor,
                "cap_limited_clusters_c1": cap_limited_clusters(effect, delta, ALPHA, 1.0),
                "fixed_n_z_clusters": fixed_n_clusters(reference, delta, ALPHA),
                "rules": {},
            }
            expected = "PASS" if effect > -delta else "REGRESSION"
            for rule in BET_RULES:
                for cap in caps:
                    c = float(size_adaptive_cap(size)) if cap == "auto" else float(cap)
                    first, passed = decision_time(
                        exact_decision_times(x, delta, ALPHA, rule=rule, cap=c, min_cluster_size=size)
                    )
                    median = median_or_inf(first)
                    decided = first < NEVER
                    right = (passed if expected == "PASS" else ~passed) & decided
                    low, high = median_interval(first)
                    row["rules"][f"{rule}@{cap}"] = {
                        "median_clusters": median,
                        "ratio_to_floor": median / floor,
                        "ratio_interval": [low / floor, high / floor],
                        "decided": float(decided.mean()),
                        "correct": float(right.mean()),
                    }
            first, passed = decision_time(
                asymptotic_decision_times(x, delta, ALPHA, burn_in_clusters=BURN_IN, tuning_clusters=TUNING)
            )
            row["asymptotic_median_clusters"] = median_or_inf(first)
            rows.append(row)
            print(
                f"  size {size:>2} effect {effect:+.2f}: floor {floor:7.0f} clusters  "
                f"default {row['rules'][DEFAULT_KEY]['ratio_to_floor']:.2f}x",
                flush=True,
            )
    return rows


def worst_and_mean_ratios(rows: List[Dict[str, Any]]) -> Dict[str, tuple]:
    """(worst-cell, mean) ratio to the floor of every rule; the default is chosen by the worst
    cell, ties broken by the mean, among caps < 1."""
    keys = rows[0]["rules"].keys()
    return {
        k: (
            max(r["rules"][k]["ratio_to_floor"] for r in rows),
            float(np.mean([min(r["rules"][k]["ratio_to_floor"], 10.0) for r in rows])),
        )
        for k in keys
    }


# ----------------------------------------------------------------------------- 2. cost of the fix
UNEQUAL_SIZES = {"1 or 40 (half each)": np.array([1, 40]), "5 to 40": np.arange(5, 41), "1 to 40": np.arange(1, 41)}


def cap_cost(reps: int, delta: float, seed: int) -> List[Dict[str, Any]]:
    """Median clusters to a decision in unequal-size strata (sizes drawn uniformly from the set, the
    realistic generator per cluster): one cap from the smallest size vs each cluster's own cap."""
    rows = []
    for label, sizes in UNEQUAL_SIZES.items():
        for effect in (-0.06, 0.0):
            rng = np.random.default_rng([seed, 5, len(sizes), int(round(effect * 1000)) + 1000])
            n = rng.choice(sizes, size=(reps, 2000))
            x = realistic_cluster_means(rng, reps, 2000, n, effect)
            stratum = decision_time(
                exact_decision_times(
                    x,
                    delta,
                    ALPHA,
                    rule=DEFAULT_BET_RULE,
                    cap=float(size_adaptive_cap(sizes.min())),
                    min_cluster_size=int(sizes.min()),
                )
            )[0]
            per_cluster = decision_time(
                exact_decision_times(x, delta, ALPHA, rule=DEFAULT_BET_RULE, cap=size_adaptive_cap(n))
            )[0]
            rows.append(
                {
                    "sizes": label,
                    "effect": effect,
                    "stratum_cap": median_or_inf(stratum),
                    "per_cluster_cap": median_or_inf(per_cluster),
                    "cost": median_or_inf(stratum) / median_or_inf(per_cluster),
                }
            )
            print(f"  cap cost {label:>20s} effect {effect:+.2f}: {rows[-1]['cost']:.2f}x", flush=True)
    return rows


# ----------------------------------------------------------------------------- 3. before / after
def grouped_file_means(rng: np.random.Generator, reps: int, scenes: int = 200, size: int = 8) -> np.ndarray:
    """Scenes half 16 points worse, half 12 better for the candidate (Delta = -0.02), worse first."""
    worse = rng.random((reps, scenes)) < 0.5
    effect = np.where(worse, -0.16, 0.12)
    u = rng.random((reps, scenes, size))
    x = ((u < 0.8 + effect[..., None]).astype(np.int8) - (u < 0.8).astype(np.int8)).mean(axis=2)
    return np.take_along_axis(x, np.argsort(~worse, axis=1, kind="stable"), axis=1)


def before_after(reps: int, delta: float, seed: int) -> List[Dict[str, Any]]:
    rows = []
    for index, design in enumerate(size_dependent_designs()):
        x, n = design.draw(np.random.default_rng([seed, 11, index]), reps, 10_000)
        common: Dict[str, Any] = dict(rule=DEFAULT_BET_RULE, weights=design.weights(n))
        before = exact_decision_times(x, design.margin_delta(), ALPHA, cap=size_adaptive_cap(n), **common)
        after = exact_decision_times(x, design.margin_delta(), ALPHA, cap=float(size_adaptive_cap(1)), **common)
        rows.append(
            {
                "design": design.name,
                "clusters": 10_000,
                "decision": design.side.upper(),
                "before": float((before[design.side] < NEVER).mean()),
                "after": float((after[design.side] < NEVER).mean()),
                "after_other_side": float(
                    (after["pass" if design.side == "regression" else "regression"] < NEVER).mean()
                ),
                "before_label": "cap of each arriving cluster",
                "after_label": "one cap per stratum",
            }
        )
        print(f"  {design.name[:40]}: {rows[-1]['before']:.3f} -> {rows[-1]['after']:.3f}", flush=True)
    x = grouped_file_means(np.random.default_rng([seed, 12]), reps)
    cap = float(size_adaptive_cap(8))
    shuffled = np.stack([row[cluster_permutation(row.size, r, "safety_critical")] for r, row in enumerate(x)])
    for label, alarm, margin in (
        ("REGRESSION (alarm at alpha/7)", ALPHA / 7, delta),
        ("CATASTROPHIC_HALT (at alpha/7)", ALPHA / 7, 0.05),
    ):
        in_file_order = exact_decision_times(x, margin, ALPHA, rule=DEFAULT_BET_RULE, cap=cap, alarm_alpha=alarm)[
            "regression"
        ]
        in_seeded_order = exact_decision_times(
            shuffled, margin, ALPHA, rule=DEFAULT_BET_RULE, cap=cap, alarm_alpha=alarm
        )["regression"]
        rows.append(
            {
                "design": "file of 200 scenes x 8 listed worse half first (-0.16 / +0.12, Delta = -0.02)",
                "clusters": 200,
                "decision": label,
                "before": float((in_file_order < NEVER).mean()),
                "after": float((in_seeded_order < NEVER).mean()),
                "after_other_side": None,
                "before_label": "file order",
                "after_label": "seeded shuffle",
            }
        )
    return rows


# ----------------------------------------------------------------------------- 4. modes
def mode_designs(delta: float):
    """(name, generator(rng, reps, clusters, effect) -> (x, cluster sizes), clusters the stratum holds)."""
    sizes = np.arange(1, 41)

    def sized(size: int, base_rate: float = 0.90):
        return lambda rng, reps, clusters, effect: (
            realistic_cluster_means(rng, reps, clusters, size, effect, base_rate=base_rate),
            size,
        )

    def unequal(rng, reps, clusters, effect):
        n = rng.choice(sizes, size=(reps, clusters))
        return realistic_cluster_means(rng, reps, clusters, n, effect), n

    def skewed(rng, reps, clusters, effect):
        # the skewed family (-3 points / a rare +1), as cluster means of 20, shifted to the effect asked for
        return skewed_null_cluster_means(rng, reps, clusters, effect, low=min(-0.03, effect - 0.01)), 20

    return (
        ("realistic (clusters of 20, base 0.90)", sized(20), 600),
        ("Meta-World-like (48 scenes of 8, base 0.85)", sized(8, 0.85), 48),
        ("skewed (-3 points / rare +1)", skewed, 600),
        ("rare events (clusters of 5, base 0.995)", sized(5, 0.995), 600),
        ("unequal sizes 1-40", unequal, 600),
    )


def mode_comparison(reps: int, delta: float, seed: int) -> List[Dict[str, Any]]:
    """Type-I at Delta = -delta for each mode under the looks it is allowed (exact and asymptotic:
    every cluster, after a burn-in for the asymptotic one; group-sequential: 10 planned looks, none
    before the burn-in; fixed-n: one look at the stratum's end), and
    power / mean clusters to a decision at alternatives, within the stratum's clusters."""
    rows = []
    for name, generate, clusters in mode_designs(delta):
        looks = np.unique(np.linspace(clusters / 10, clusters, 10).round().astype(np.int64))
        cap = float(size_adaptive_cap(1 if "unequal" in name else 20))
        for effect, truth in ((-delta, "null"), (0.0, "PASS"), (-0.06, "REGRESSION"), (-0.14, "REGRESSION")):
            if truth == "REGRESSION" and effect == -0.14 and clusters != 48:
                continue
            x, n = generate(
                np.random.default_rng([seed, 21, clusters, int(round(effect * 1000)) + 1000]), reps, clusters, effect
            )
            burn_in = min(BURN_IN, clusters // 2)
            modes = {
                "exact": exact_decision_times(x, delta, ALPHA, rule=DEFAULT_BET_RULE, cap=cap),
                "asymptotic": asymptotic_decision_times(
                    x, delta, ALPHA, burn_in_clusters=burn_in, tuning_clusters=clusters
                ),
                "group_sequential": group_sequential_decision_times(
                    x, delta, ALPHA, looks=looks, cluster_sizes=n, burn_in_clusters=burn_in
                ),
                "fixed_n": fixed_n_decision_times(x, delta, ALPHA, clusters=clusters, cluster_sizes=n),
            }
            row: Dict[str, Any] = {"design": name, "clusters": clusters, "effect": effect, "truth": truth}
            for mode, times in modes.items():
                if truth == "null":
                    row[mode] = {
                        "false_pass": float((times["pass"] < NEVER).mean()),
                        "false_regression": float((times["regression"] < NEVER).mean()),
                    }
                else:
                    first, passed = decision_time(times)
                    decided = first < NEVER
                    right = decided & (passed if truth == "PASS" else ~passed)
                    row[mode] = {
                        "power": float(right.mean()),
                        "mean_clusters": float(np.where(decided, first, clusters).mean()),
                    }
            rows.append(row)
            print(f"  modes {name[:30]:30s} effect {effect:+.2f} done", flush=True)
    return rows


def fmt(value: float, digits: int = 0) -> str:
    return "never" if not math.isfinite(value) else f"{value:,.{digits}f}"


def markdown(rows, worst, cost, validity, modes, delta, reps) -> str:
    lines = [
        f"# Sequential test efficiency (delta = {delta}, alpha = {ALPHA}, {reps} replications a cell)",
        "",
        "Median clusters to a decision / information floor log(1/alpha)/KL_inf; units = clusters x size.",
        "",
    ]
    keys = list(rows[0]["rules"])
    lines.append(
        "| size | effect | floor clusters (units) | cap-limited c=1 | fixed-n z 80% | asymptotic | "
        f"default {DEFAULT_KEY}: clusters (units), ratio [95% CI] | " + " | ".join(keys) + " |"
    )
    lines.append("|" + "---|" * (7 + len(keys)))
    for r in rows:
        size = r["cluster_size"]
        cells = [f"{r['rules'][k]['ratio_to_floor']:.2f}" for k in keys]
        d = r["rules"][DEFAULT_KEY]
        default = (
            f"{fmt(d['median_clusters'])} ({fmt(d['median_clusters'] * size)}), {d['ratio_to_floor']:.2f} "
            f"[{d['ratio_interval'][0]:.2f}, {d['ratio_interval'][1]:.2f}]"
        )
        lines.append(
            f"| {size} | {r['effect']:+.2f} | {fmt(r['floor_clusters'])} ({fmt(r['floor_clusters'] * size)}) | "
            f"{fmt(r['cap_limited_clusters_c1'])} | {fmt(r['fixed_n_z_clusters'])} | "
            f"{fmt(r['asymptotic_median_clusters'])} | {default} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "Worst-cell / mean ratio per rule: " + ", ".join(f"{k} {w:.2f}/{m:.2f}" for k, (w, m) in worst.items()),
        "",
        "Cells where the default exceeds 1.15x the floor: "
        + (
            ", ".join(
                f"size {r['cluster_size']} effect {r['effect']:+.2f} ({r['rules'][DEFAULT_KEY]['ratio_to_floor']:.2f})"
                for r in rows
                if r["rules"][DEFAULT_KEY]["ratio_to_floor"] > 1.15
            )
            or "none"
        ),
        "",
        f"Default: {DEFAULT_KEY}; smallest worst cell among caps < 1: "
        f"{min((k for k in worst if not k.endswith('@1.0')), key=worst.get)}",
        "",
        "## What a predictable cap costs (unequal cluster sizes)",
        "",
        "Median clusters to a decision with one cap per stratum (from its smallest cluster: valid) over the "
        f"cap of each arriving cluster (invalid, shipped before), rule {DEFAULT_BET_RULE}:",
        "",
        "| sizes | effect | one cap per stratum | cap per arriving cluster | cost |",
        "|---|---|---|---|---|",
    ]
    for r in cost:
        lines.append(
            f"| {r['sizes']} | {r['effect']:+.2f} | {fmt(r['stratum_cap'])} | {fmt(r['per_cluster_cap'])} | "
            f"{r['cost']:.2f}x |"
        )
    lines += [
        "",
        "Equal-size strata (every cell of the table above) pay nothing: their one cap is the old cap.",
        "",
        "## False decisions before and after (at the boundary, a look after every cluster)",
        "",
        "| design | decision | clusters | before | after |",
        "|---|---|---|---|---|",
    ]
    for r in validity:
        lines.append(
            f"| {r['design']} | {r['decision']} | {r['clusters']:,} | {r['before']:.3f} ({r['before_label']}) | "
            f"{r['after']:.3f} ({r['after_label']}) |"
        )
    lines += [
        "",
        "## The test modes side by side",
        "",
        "Type-I at Delta = -delta under the looks each mode is allowed (exact, asymptotic: every cluster; "
        "group-sequential: 10 planned looks; fixed-n: one look at the end), then power and mean clusters used "
        "(undecided = all) within the stratum's clusters.",
        "",
        "| design | clusters | effect | exact | asymptotic | group-sequential | fixed-n (one look) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in modes:
        cells = []
        for mode in ("exact", "asymptotic", "group_sequential", "fixed_n"):
            v = r[mode]
            cells.append(
                f"PASS {v['false_pass']:.3f} / REG {v['false_regression']:.3f}"
                if r["truth"] == "null"
                else f"{v['power']:.2f} in {v['mean_clusters']:.0f}"
            )
        label = "Type-I" if r["truth"] == "null" else f"power ({r['truth']})"
        lines.append(f"| {r['design']} | {r['clusters']} | {r['effect']:+.2f} {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--margin", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    reps = args.reps or (100 if args.quick else 500)
    caps: List[Union[float, str]] = [0.8, 0.95, 0.99, "auto"] if args.quick else [0.5, 0.8, 0.95, 0.99, 1.0, "auto"]
    started = time.perf_counter()
    rows = efficiency_grid(reps, caps, args.margin, args.seed)
    worst = worst_and_mean_ratios(rows)
    cost = cap_cost(reps, args.margin, args.seed)
    validity = before_after(max(reps, 1000) if not args.quick else reps, args.margin, args.seed)
    modes = mode_comparison(2000 if not args.quick else 400, args.margin, args.seed)
    report = markdown(rows, worst, cost, validity, modes, args.margin, reps)
    print(report)
    out = REPO / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    tag = f"seqtest_efficiency_margin{args.margin}"
    atomic_write_json(
        out / f"{tag}.json",
        {
            "rows": rows,
            "worst_ratio": worst,
            "cap_cost": cost,
            "before_after": validity,
            "modes": modes,
            "reps": reps,
            "wall_s": time.perf_counter() - started,
        },
    )
    atomic_write_text(out / f"{tag}.md", report)
    if not args.quick and args.reps is None and args.seed == 2026 and args.margin == 0.02:
        # The default run is the README's table: keep the committed copy in step with the code.
        atomic_write_text(
            FIGURES / "seqtest_efficiency.md",
            report + "\nGenerated by `python benchmarks/seqtest_efficiency.py`.\n",
        )
    print(f"wrote {out / tag}.md ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
