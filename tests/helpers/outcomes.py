"""Paired outcome tables as a user would export them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from vlaeval.gauntlet.outcomes import synthetic_paired_outcomes


def outcome_table(strata, seed=11, shuffle_clusters=False) -> pd.DataFrame:
    """Real paired outcomes for every stratum (the synthetic generator's), one row per scenario."""
    rows = []
    for name, spec in strata.items():
        o = synthetic_paired_outcomes(name, spec, 0.0, seed)
        cluster = np.repeat(np.arange(o.cluster_sizes.size), o.cluster_sizes)
        rows.append(
            pd.DataFrame(
                {
                    "stratum": name,
                    "scenario_id": [f"{name}-{i}" for i in range(o.units)],
                    "cluster_id": [f"scene-{c}" for c in cluster],
                    "baseline": o.baseline.astype(int),
                    "candidate": o.candidate.astype(int),
                }
            )
        )
    table = pd.concat(rows, ignore_index=True)
    if shuffle_clusters:
        table = table.sample(frac=1.0, random_state=0).reset_index(drop=True)
    return table


def rows_from_cluster_means(x, sizes, stratum="safety_critical", extra=None) -> pd.DataFrame:
    """One file's paired rows whose clusters have means x and sizes `sizes` (in file order): the net
    candidate-minus-baseline successes of a cluster as candidate-only or baseline-only successes,
    the other scenarios solved by both. `extra`: more columns, {name: function(cluster, row) -> value}."""
    sizes = np.asarray(sizes, dtype=np.int64)
    net = np.rint(np.asarray(x) * sizes).astype(np.int64)
    cluster = np.repeat(np.arange(sizes.size), sizes)
    position = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    k = net[cluster]
    baseline = np.where((k < 0) | (position >= np.abs(k)), 1, 0)
    candidate = np.where((k > 0) | (position >= np.abs(k)), 1, 0)
    table = pd.DataFrame(
        {
            "stratum": stratum,
            "scenario_id": [f"{stratum}-{i}" for i in range(cluster.size)],
            "cluster_id": [f"scene-{c}" for c in cluster],
            "baseline": baseline,
            "candidate": candidate,
        }
    )
    for name, value in (extra or {}).items():
        table[name] = [value(c, p) for c, p in zip(cluster, position)]
    return table


def trial_file(path, baseline, candidate, stratum="pick_place", **columns):
    """A lab's trial file: one row a trial, each trial its own cluster (a robot's paired trials)."""
    n = len(baseline)
    pd.DataFrame(
        {
            "stratum": stratum,
            "scenario_id": [f"s{i}" for i in range(n)],
            "cluster_id": [f"c{i}" for i in range(n)],
            "baseline": baseline,
            "candidate": candidate,
            **columns,
        }
    ).to_csv(path, index=False)
    return path
