"""Clusters as the unit of independence: cluster means of paired differences, batch plans whose
boundaries never split a cluster, and cluster-robust success-rate intervals."""

from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np
from scipy.stats import norm


def cluster_offsets(cluster_sizes: np.ndarray) -> np.ndarray:
    """Start offsets of contiguous clusters plus the end: shape (C + 1,)."""
    return np.concatenate(([0], np.cumsum(np.asarray(cluster_sizes, dtype=np.int64))))


def cluster_means(differences: np.ndarray, cluster_sizes: np.ndarray) -> np.ndarray:
    """Mean of each contiguous cluster of unit-level differences (sizes must sum to the length)."""
    sizes = np.asarray(cluster_sizes, dtype=np.int64)
    if sizes.sum() != differences.size:
        raise ValueError("cluster sizes must add up to the number of units")
    if sizes.size == 0:
        return np.zeros(0)
    sums = np.add.reduceat(np.asarray(differences, dtype=np.float64), cluster_offsets(sizes)[:-1])
    return sums / sizes


def plan_batches(cluster_sizes: np.ndarray, batch_units: int, limit_units: int) -> list[tuple[int, int]]:
    """Batches as (first cluster, end cluster) index pairs over whole clusters.

    Each batch takes whole clusters until it holds at least `batch_units` units; the plan stops
    before the first cluster that would take the total past `limit_units` (a partial cluster is
    never evaluated).
    """
    if batch_units < 1:
        raise ValueError("batch_units must be >= 1")
    offsets = cluster_offsets(cluster_sizes)
    last = int(np.searchsorted(offsets, limit_units, side="right")) - 1  # clusters fitting the limit
    batches: list[tuple[int, int]] = []
    start = 0
    while start < last:
        target = offsets[start] + batch_units
        end = min(int(np.searchsorted(offsets, target, side="left")), last)
        batches.append((start, end))
        start = end
    return batches


def success_rate_interval(successes: np.ndarray, sizes: np.ndarray, level: float = 0.95) -> Dict[str, Any]:
    """A policy's success rate over the units of some clusters, with a cluster-robust Wilson interval.

    successes, sizes: per cluster, shape (C,). The rate is p = sum(s) / sum(n). Scenarios of one
    cluster share a scene, so their outcomes are correlated: the variance of p is the cluster-robust
    (ratio-estimator) one, V = C/(C-1) * sum_c (s_c - p n_c)^2 / (sum n)^2, and the Wilson interval
    is taken at the effective sample size n / deff with design effect deff = V / (p(1-p)/n), never
    below 1 (so never narrower than the unit-level Wilson interval; Korn & Graubard 1998)."""
    s = np.asarray(successes, dtype=np.float64)
    n_c = np.asarray(sizes, dtype=np.float64)
    n, clusters = float(n_c.sum()), int(n_c.size)
    if n == 0:
        return {
            "rate": None,
            "lower": None,
            "upper": None,
            "level": level,
            "units": 0,
            "clusters": 0,
            "design_effect": None,
            "method": "cluster-robust Wilson",
        }
    p = float(s.sum() / n)
    deff = 1.0
    if clusters > 1 and 0.0 < p < 1.0:
        variance = clusters / (clusters - 1) * float(np.sum((s - p * n_c) ** 2)) / n**2
        deff = max(variance / (p * (1.0 - p) / n), 1.0)
    n_eff = n / deff
    z = float(norm.ppf(0.5 + level / 2.0))
    denominator = 1.0 + z * z / n_eff
    centre = (p + z * z / (2.0 * n_eff)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n_eff + z * z / (4.0 * n_eff * n_eff)) / denominator
    return {
        "rate": p,
        "lower": max(centre - half, 0.0),
        "upper": min(centre + half, 1.0),
        "level": level,
        "units": int(n),
        "clusters": clusters,
        "design_effect": deff,
        "method": "cluster-robust Wilson",
    }
