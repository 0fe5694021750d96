"""Where the minibatch gradient's noise comes from: the per-sample squared gradient norm s over
anchors i, flow times and noise draws, split into what the anchor, the flow time, their interaction
and the rest (the noise draw, and flow time within a bin) explain, and what an importance-sampling
proposal over each axis could at best remove. Pure functions on arrays: no I/O, no torch.

Flow time enters through its quantile level u under the training distribution
(FlowConvention.time_level), cut into K equal-probability bins, so uniform sampling of u is the
training distribution and each bin carries probability 1/K.

Variance shares (a two-way layout with replicates, cells = (anchor, bin)): with m the grand mean,
A_i the anchor means, B_k the bin means and C_ik the cell means,

    SS_anchor = sum_ij (A_i - m)^2,   SS_time = sum_ij (B_k(ij) - m)^2,   SS_rest = sum_ij (s_ij - C_ik(ij))^2,
    SS_interaction = SS_total - SS_anchor - SS_time - SS_rest,

each over SS_total. With u drawn independently of the anchor the layout is balanced in expectation,
so the parts add up; with few draws per cell the interaction absorbs some of the rest.

Oracle ratios: the smallest second moment a proposal over one axis can reach, over uniform's. For
the anchor axis (mean_i sqrt(A_i))^2 / mean_i A_i; for flow time (sum_k sqrt(B_k) / K)^2 / (sum_k B_k / K);
for both, the same over the cells. Each is a square root of a noisy mean, so with few draws per
cell it is optimistic (Jensen); the audit's draws per cell (seeds / K) are reported beside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from vlaeval.audit.proposals import time_bin

PARTS = ("anchor", "flow_time", "interaction", "rest")


@dataclass(frozen=True)
class NoiseDecomposition:
    """What explains the per-sample squared gradient norm, and what each axis's proposal could gain.

    variance_shares: PARTS -> share of Var(s) (summing to 1). oracle_ratios: anchor, flow_time,
    anchor_and_flow_time -> second moment under the best proposal over that axis / uniform's
    (anchor_and_flow_time is None when a cell holds no draw). second_moment_by_time_bin: the share of
    the uniform second moment in each bin, noise rising with the bin. draws_per_cell: draws / bins.
    """

    bins: int
    anchors: int
    draws: int
    variance_shares: Mapping[str, float]
    oracle_ratios: Mapping[str, Optional[float]]
    second_moment_by_time_bin: Tuple[float, ...]
    draws_per_cell: float

    def as_dict(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["second_moment_by_time_bin"] = list(self.second_moment_by_time_bin)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "NoiseDecomposition":
        return cls(
            bins=int(data["bins"]),
            anchors=int(data["anchors"]),
            draws=int(data["draws"]),
            variance_shares={str(k): float(v) for k, v in data["variance_shares"].items()},
            oracle_ratios={str(k): None if v is None else float(v) for k, v in data["oracle_ratios"].items()},
            second_moment_by_time_bin=tuple(float(x) for x in data["second_moment_by_time_bin"]),
            draws_per_cell=float(data["draws_per_cell"]),
        )


def _oracle(means: np.ndarray, weights: np.ndarray) -> float:
    """(sum_c w_c sqrt(M_c))^2 / sum_c w_c M_c for cell means M and cell probabilities w."""
    return float(np.sum(weights * np.sqrt(np.maximum(means, 0.0))) ** 2 / np.sum(weights * means))


def noise_decomposition(sq_norms: np.ndarray, u: np.ndarray, bins: int = 10) -> NoiseDecomposition:
    """sq_norms, u: shape (draws >= 2, anchors >= 2): each draw's squared per-sample gradient norm
    (finite, >= 0, not all 0) and the quantile level in [0, 1] of its flow time. bins: K >= 2."""
    s = np.asarray(sq_norms, dtype=np.float64)
    levels = np.asarray(u, dtype=np.float64)
    if s.ndim != 2 or s.shape != levels.shape or min(s.shape) < 2:
        raise ValueError(f"sq_norms {s.shape} and u {levels.shape} must both be (draws >= 2, anchors >= 2)")
    if not np.all(np.isfinite(s)) or np.any(s < 0) or not np.any(s > 0):
        raise ValueError("sq_norms must be finite, >= 0 and not all 0")
    if np.any((levels < 0) | (levels > 1)) or int(bins) < 2:
        raise ValueError(f"u must lie in [0, 1] and bins={bins} must be >= 2")
    draws, n = s.shape
    k = time_bin(levels, int(bins))
    m = s.mean()
    anchor_means = s.mean(axis=0)
    bin_counts = np.bincount(k.ravel(), minlength=bins)
    bin_means = np.bincount(k.ravel(), weights=s.ravel(), minlength=bins) / np.maximum(bin_counts, 1)
    cell = k * n + np.arange(n)[None, :]  # cell (bin, anchor) of each draw
    cell_counts = np.bincount(cell.ravel(), minlength=bins * n)
    cell_means = np.bincount(cell.ravel(), weights=s.ravel(), minlength=bins * n) / np.maximum(cell_counts, 1)
    total = float(np.sum((s - m) ** 2))
    anchor_ss = float(draws * np.sum((anchor_means - m) ** 2))
    time_ss = float(np.sum(bin_counts * (bin_means - m) ** 2))
    rest_ss = float(np.sum((s - cell_means[cell]) ** 2))
    shares = {
        "anchor": anchor_ss / total,
        "flow_time": time_ss / total,
        "interaction": (total - anchor_ss - time_ss - rest_ss) / total,
        "rest": rest_ss / total,
    }
    seen = bin_counts > 0
    oracles: Dict[str, Optional[float]] = {
        "anchor": _oracle(anchor_means, np.full(n, 1.0 / n)),
        "flow_time": _oracle(bin_means[seen], np.full(int(seen.sum()), 1.0 / bins)) if seen.all() else None,
        "anchor_and_flow_time": (
            _oracle(cell_means, np.full(bins * n, 1.0 / (bins * n))) if np.all(cell_counts > 0) else None
        ),
    }
    by_bin = np.bincount(k.ravel(), weights=s.ravel(), minlength=bins) / s.sum()
    return NoiseDecomposition(
        bins=int(bins),
        anchors=int(n),
        draws=int(draws),
        variance_shares=shares,
        oracle_ratios=oracles,
        second_moment_by_time_bin=tuple(by_bin.tolist()),
        draws_per_cell=draws / bins,
    )
