"""Clusters as the unit of independence: cluster means of paired differences and batch plans
whose boundaries never split a cluster."""

from __future__ import annotations

import numpy as np


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
