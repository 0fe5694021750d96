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
