"""Scaling of job=score with the number of shard processes on this machine: every anchor of the
default data scored by 1, 2, ... concurrent `main.py job=score` processes (what a Hydra multirun
with a parallel launcher runs), then merged.

    python benchmarks/score_shards.py [--processes 1 2] [--extra key=value ...]

The cores are split between the processes (OMP_NUM_THREADS = cores / processes). Per process
count: wall time from the first launch to the last exit (start-up, data and
checkpoint loading included), anchors/s over that wall, the scoring-only anchors/s summed over the
shards, and the speed-up against one process in the same run. Results in
benchmarks/results/score_shards.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from benchlib import REPO, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json


def score(count: int, runs: Path, cache: Path, extra: List[str]) -> Dict[str, Any]:
    # The cores split between the shard processes (torch's threads, and BLAS's): one process of N
    # threads against N of one, not N processes fighting over N cores with N threads each.
    threads = str(max(1, (os.cpu_count() or 1) // count))
    env = {
        **os.environ,
        "VLAEVAL_CACHE_DIR": str(cache),
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(REPO / "main.py"),
                "job=score",
                "tracking=disabled",
                f"score.shard_count={count}",
                f"score.shard_index={index}",
                *extra,
                f"hydra.run.dir={runs / f'{count}' / f'{index}'}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(count)
    ]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"job=score failed: {err[-2000:]}")
    wall = time.perf_counter() - started
    results = [json.loads((runs / f"{count}" / f"{i}" / "result.json").read_text()) for i in range(count)]
    anchors = sum(r["shard"]["stop"] - r["shard"]["start"] for r in results)
    return {
        "processes": count,
        "threads_per_process": int(threads),
        "anchors": anchors,
        "wall_seconds": wall,
        "anchors_per_second_wall": anchors / wall,
        "anchors_per_second_scoring": sum(r["runtime"]["anchors_per_second"] for r in results),
        "scoring_seconds_per_shard": [r["runtime"]["seconds"] for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cache-dir", default=str(REPO / ".cache" / "vlaeval"))
    parser.add_argument("--runs-dir", default="/tmp/vlaeval-score-bench")
    parser.add_argument("--extra", nargs="*", default=[])
    args = parser.parse_args()
    runs, cache = Path(args.runs_dir), Path(args.cache_dir)
    score(1, runs / "warm-up", cache, args.extra)  # data and checkpoint cached before timing
    rows = [score(k, runs, cache, args.extra) for k in args.processes]
    base = rows[0]["anchors_per_second_wall"]
    for row in rows:
        row["speedup_vs_first"] = row["anchors_per_second_wall"] / base
    out = {"cpu_count": os.cpu_count(), "rows": rows}
    atomic_write_json(REPO / "benchmarks" / "results" / "score_shards.json", out)
    write_figures(
        "score_shards",
        "Scoring throughput by shard processes",
        "python benchmarks/score_shards.py",
        f"Every anchor of the default data ({rows[0]['anchors']:,}) scored by concurrent `job=score` shard "
        f"processes on one {os.cpu_count()}-core machine, the cores split between them; wall time from the "
        "first launch to the last exit (start-up, data and checkpoint loading included).\n\n"
        + markdown_table(
            ["processes x threads", "anchors/s, scoring", "anchors/s, over the wall", "x one process (wall)"],
            [
                (
                    f"{r['processes']} x {r['threads_per_process']}",
                    f"{r['anchors_per_second_scoring']:,.0f}",
                    f"{r['anchors_per_second_wall']:,.0f}",
                    f"{r['speedup_vs_first']:.2f}",
                )
                for r in rows
            ],
        ),
    )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
