"""Per-sample gradient norms: the batched ghost-norm method vs a per-anchor autograd loop, on the
default trained policy, 64 anchors x the default gradient seeds, same process.

    python benchmarks/per_sample_gradients.py [--seeds N] [--loop-seeds N]

The loop is timed on a subset of seeds (it is slow) and scaled per pair; both methods are also
checked to agree on that subset. Also reports the split-half reliability of gradient RMS against
the number of seeds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Dict

import numpy as np

from benchlib import REPO, default_policy
from vlaeval.artifacts import atomic_write_json
from vlaeval.data.anchors import draw
from vlaeval.residual.gradients import gradient_measurements, split_half_reliability


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--loop-seeds", type=int, default=32)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "per_sample_gradients.json")
    args = parser.parse_args()
    cfg, data, handle = default_policy()
    index, _ = draw(data.anchors, args.anchors, 0)
    seeds = [int(s) for s in cfg.gradients.seeds]
    kwargs: Dict[str, Any] = dict(trainable="action_head", batch_size=int(cfg.gradients.batch_size))

    started = time.perf_counter()
    batched = gradient_measurements(
        handle.model, data.anchors, index, data.instruction_table, seeds, cfg.flow, **kwargs
    )
    batched_s = time.perf_counter() - started
    subset = seeds[: args.loop_seeds]
    started = time.perf_counter()
    loop = gradient_measurements(
        handle.model, data.anchors, index, data.instruction_table, subset, cfg.flow, method="loop", **kwargs
    )
    loop_s = time.perf_counter() - started
    pairs, loop_pairs = len(seeds) * index.size, len(subset) * index.size
    loop_full_s = loop_s * pairs / loop_pairs
    rel_error = float(np.max(np.abs(batched.sq_norms[: len(subset)] - loop.sq_norms) / loop.sq_norms))
    reliability = {}
    for n in (4, 16, 64, 128, 256, 384, 512):
        if n <= len(seeds):
            reliability[n] = split_half_reliability(batched.sq_norms[:n], batched.parameter_count)[
                "split_half_spearman"
            ]
    summary = {
        "anchors": int(index.size),
        "seeds": len(seeds),
        "pairs": pairs,
        "batched_seconds": batched_s,
        "loop_seconds_measured": loop_s,
        "loop_pairs_measured": loop_pairs,
        "loop_seconds_scaled_to_all_pairs": loop_full_s,
        "speedup": loop_full_s / batched_s,
        "max_relative_difference_sq_norm": rel_error,
        "parameters": batched.parameter_count,
        "split_half_reliability_by_seed_count": reliability,
    }
    print(f"{index.size} anchors x {len(seeds)} seeds = {pairs} pairs over {batched.parameter_count:,} parameters")
    print(f"  batched ghost norms: {batched_s:.2f} s ({pairs / batched_s:,.0f} pairs/s)")
    print(
        f"  per-sample autograd loop: {loop_s:.2f} s for {loop_pairs} pairs -> {loop_full_s:.1f} s for all "
        f"({loop_pairs / loop_s:,.0f} pairs/s)"
    )
    print(f"  speed-up {summary['speedup']:.1f}x; max relative difference {rel_error:.2e}")
    print(
        "  split-half reliability of gradient RMS by seed count: "
        + ", ".join(f"{n}: {r:.3f}" for n, r in reliability.items())
    )
    atomic_write_json(args.out, summary)


if __name__ == "__main__":
    main()
