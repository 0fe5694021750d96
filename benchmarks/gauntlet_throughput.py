"""Gauntlet throughput: units per second, MLflow excluded, as ratios against a baseline run in the
same process (these machines are noisy; only same-process ratios mean much).

The baseline is the prototype's data path: outcome vectors kept as Python lists (`.tolist()`),
cached as JSON lists, converted back with np.asarray per stratum, fed in batches of a fixed unit
count (which can split a cluster) with cluster means grouped in Python -- the same e-process
engine underneath, so the ratio measures the data path and batching, not the statistics.

    python benchmarks/gauntlet_throughput.py            # default (100k) and 10M-unit gauntlets
    python benchmarks/gauntlet_throughput.py --quick    # default gauntlet only
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
from omegaconf import OmegaConf

from benchlib import REPO, compose_default, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json, atomic_write_text, sha256_json
from vlaeval.gauntlet import ArrayCache, SyntheticOutcomes, run_gauntlet, validate_gauntlet
from vlaeval.gauntlet.outcomes import synthetic_paired_outcomes
from vlaeval.gauntlet.result import Lineage
from vlaeval.gauntlet.scheduler import priority_order
from vlaeval.seqtest import DECISION_INSUFFICIENT, PairedSequentialTest
from vlaeval.seqtest.state import ExactSettings, TestSettings

LINEAGE = Lineage(valid=True)


def load(overrides):
    cfg = compose_default(overrides)
    settings = OmegaConf.to_object(cfg.gauntlet)
    strata = {k: OmegaConf.to_object(v) for k, v in cfg.strata.items()}
    effects = {str(k): float(v) for k, v in cfg.effects.items()}
    validate_gauntlet(settings, strata, effects)
    return settings, strata, effects


# ----------------------------------------------------------------------------- baseline
def prototype_style_gauntlet(settings, strata, effects, cache_dir: Path) -> Dict[str, Any]:
    """The prototype's loop with list outcomes, a JSON cache and fixed-count batches."""
    started = time.perf_counter()
    queue = priority_order(strata)
    budget_left, nominal_allowance, units_evaluated = settings.budget_units, settings.nominal_base_allowance, 0
    while queue and budget_left > 0:
        name = queue.pop(0)
        spec = strata[name]
        effect = effects.get(name, 0.0)
        key = sha256_json([name, spec.units, spec.base_rate, spec.cluster_size, effect, settings.seed])
        path = cache_dir / f"{key}.json"
        if path.exists():
            vectors = json.loads(path.read_text())
        else:
            o = synthetic_paired_outcomes(name, spec, effect, settings.seed)
            clusters = np.repeat(np.arange(o.cluster_sizes.size), o.cluster_sizes)
            vectors = {
                "baseline": o.baseline.astype(int).tolist(),
                "candidate": o.candidate.astype(int).tolist(),
                "clusters": clusters.astype(int).tolist(),
            }
            atomic_write_text(path, json.dumps(vectors))
        b = np.asarray(vectors["baseline"], dtype=np.float64)
        c = np.asarray(vectors["candidate"], dtype=np.float64)
        cluster_ids = vectors["clusters"]
        limit = min(len(vectors["baseline"]), budget_left)
        if name == settings.nominal_stratum:
            limit = min(limit, nominal_allowance)
        test = PairedSequentialTest(
            TestSettings(settings.margin_delta, settings.alpha, cs_grid_step=settings.cs_grid_step),
            ExactSettings(bet_rule=str(settings.bet_rule), bet_cap=settings.bet_cap),
        )
        used = 0
        while used < limit:
            end = min(used + settings.batch_units, limit)
            diffs = (c[used:end] - b[used:end]).tolist()
            sums: Dict[int, float] = {}
            counts: Dict[int, int] = {}
            for d, cid in zip(diffs, cluster_ids[used:end]):  # the prototype's per-unit grouping
                sums[cid] = sums.get(cid, 0.0) + d
                counts[cid] = counts.get(cid, 0) + 1
            test.update(np.array([sums[k] / counts[k] for k in sums]))
            _ = (b[used:end].astype(bool).tolist(), c[used:end].astype(bool).tolist())  # record_objects
            used = end
            if test.state.decision != DECISION_INSUFFICIENT:
                break
        if name == settings.critical_stratum and test.state.decision == "PASS":
            nominal_allowance = int(nominal_allowance * settings.nominal_expand_factor)
        budget_left -= used
        units_evaluated += used
    elapsed = time.perf_counter() - started
    return {"units_evaluated": units_evaluated, "wall_s": elapsed}


def vectorised_gauntlet(settings, strata, effects, cache_dir: Path, use_cache: bool) -> Dict[str, Any]:
    cache = ArrayCache(cache_dir, enabled=use_cache, namespace="gauntlet-units")
    started = time.perf_counter()
    result = run_gauntlet(settings, strata, effects, SyntheticOutcomes(), cache, LINEAGE).to_json()
    elapsed = time.perf_counter() - started
    return {
        "units_evaluated": result["scale"]["units_evaluated"],
        "wall_s": elapsed,
        "cache": result["cache"],
        "recommendation": result["recommendation"]["recommendation"],
    }


def measure(label, overrides, repeats):
    settings, strata, effects = load(overrides)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # cold = cache empty (outcomes generated and written); warm = every stratum a cache hit
        base_cold = prototype_style_gauntlet(
            settings, strata, effects, (tmp / "json-cache").mkdir() or tmp / "json-cache"
        )
        base_warm = min(
            (prototype_style_gauntlet(settings, strata, effects, tmp / "json-cache") for _ in range(repeats)),
            key=lambda r: r["wall_s"],
        )
        new_cold = vectorised_gauntlet(settings, strata, effects, tmp / "npz-cache", True)
        new_warm = min(
            (vectorised_gauntlet(settings, strata, effects, tmp / "npz-cache", True) for _ in range(repeats)),
            key=lambda r: r["wall_s"],
        )
        nocache = min(
            (vectorised_gauntlet(settings, strata, effects, tmp / "unused", False) for _ in range(repeats)),
            key=lambda r: r["wall_s"],
        )
    for name, r in (
        ("baseline_cold", base_cold),
        ("baseline_warm", base_warm),
        ("vectorised_cold", new_cold),
        ("vectorised_warm", new_warm),
        ("vectorised_no_cache", nocache),
    ):
        rows[name] = {
            "units_evaluated": r["units_evaluated"],
            "wall_s": r["wall_s"],
            "units_per_second": r["units_evaluated"] / r["wall_s"],
        }
    total = sum(s.units for s in strata.values())
    summary = {
        "gauntlet": label,
        "total_units_defined": total,
        "overrides": list(overrides),
        "runs": rows,
        "speedup_vs_baseline_cold": base_cold["wall_s"] / new_cold["wall_s"],
        "speedup_vs_baseline_warm": base_warm["wall_s"] / new_warm["wall_s"],
        "cache_hit_rerun_speedup": new_cold["wall_s"] / new_warm["wall_s"],
        "warm_cache": new_warm["cache"],
        "recommendation": new_warm["recommendation"],
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="default gauntlet only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gauntlet_throughput.json")
    args = parser.parse_args()
    cases: List[Tuple[str, List[str]]] = [("default (100k units)", [])]
    if not args.quick:
        # Every stratum planted exactly at the margin (Delta = -0.002): no test can decide, so the
        # whole 10M-unit budget is evaluated -- the worst case for throughput.
        at_margin = [f"+effects.{name}=-0.002" for name in compose_default(["strata=large"]).strata]
        cases.append(
            (
                "large (10M units, all evaluated)",
                ["strata=large", "gauntlet=large", "gauntlet.nominal_base_allowance=4000000", *at_margin],
            )
        )
    results = []
    for label, overrides in cases:
        summary = measure(label, overrides, args.repeats if not overrides else 1)
        results.append(summary)
        print(
            f"\n{label}: {summary['total_units_defined']:,} units defined, recommendation {summary['recommendation']}"
        )
        print(f"  {'run':22s} {'units evaluated':>16s} {'wall s':>9s} {'units/s':>12s}")
        for name, r in summary["runs"].items():
            print(f"  {name:22s} {r['units_evaluated']:16,d} {r['wall_s']:9.3f} {r['units_per_second']:12,.0f}")
        print(
            f"  speed-up vs prototype-style baseline: cold {summary['speedup_vs_baseline_cold']:.1f}x, "
            f"warm {summary['speedup_vs_baseline_warm']:.1f}x; cache-hit re-run {summary['cache_hit_rerun_speedup']:.2f}x"
        )
    atomic_write_json(args.out, results)
    if not args.quick:
        write_figures(
            "gauntlet_throughput",
            "Gauntlet throughput",
            "python benchmarks/gauntlet_throughput.py",
            "Units (paired outcomes) per second of `job=gauntlet` on generated outcomes, against the "
            "prototype-style path (one e-value update per unit, no per-cluster records) run in the same "
            "process; cold: the outcome cache empty, warm: served from it.\n\n"
            + markdown_table(
                ["gauntlet", "run", "units evaluated", "wall", "units/s"],
                [
                    (
                        s["gauntlet"],
                        name,
                        f"{r['units_evaluated']:,}",
                        f"{r['wall_s']:.2f} s",
                        f"{r['units_per_second']:,.0f}",
                    )
                    for s in results
                    for name, r in s["runs"].items()
                ],
            )
            + "\n\n"
            + markdown_table(
                ["gauntlet", "x baseline, cold", "x baseline, warm", "cache-hit re-run"],
                [
                    (
                        s["gauntlet"],
                        f"{s['speedup_vs_baseline_cold']:.1f}",
                        f"{s['speedup_vs_baseline_warm']:.1f}",
                        f"{s['cache_hit_rerun_speedup']:.2f}",
                    )
                    for s in results
                ],
            ),
        )
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
