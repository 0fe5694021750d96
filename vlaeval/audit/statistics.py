"""Statistics of the residual audit: pure functions on arrays, no I/O.

With r = gradient RMS per anchor and q an importance-sampling proposal over the N anchors, the
second moment of the importance-weighted gradient estimator relative to uniform sampling is

    information_to_baseline_ratio = (1/N) sum_i r_i^2 / q_i  /  sum_i r_i^2

(1 = no better than uniform; the oracle q proportional to r gives (sum r)^2 / (N sum r^2)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Tuple

import numpy as np
from scipy.stats import kendalltau, spearmanr


def spearman_brown(split_half: float) -> float:
    """Reliability of the full-length measure from the correlation of its two halves."""
    return float(2 * split_half / (1 + split_half)) if split_half > -1 else float("nan")


def top_overlap(a: np.ndarray, b: np.ndarray, fraction: float = 0.25) -> float:
    count = max(1, int(len(a) * fraction))
    return len(set(np.argsort(a)[-count:]) & set(np.argsort(b)[-count:])) / count


@dataclass(frozen=True)
class Repeatability:
    """How well the score repeats across estimator seeds: Spearman and Kendall of the two halves'
    means (with asymptotic p-values), the Spearman-Brown reliability of the full-length score, the
    halves' absolute differences and top-25% overlap, and the per-anchor coefficient of variation."""

    spearman: float
    spearman_pvalue_asymptotic: float
    kendall: float
    kendall_pvalue_asymptotic: float
    spearman_brown_reliability: float
    mean_absolute_difference: float
    max_absolute_difference: float
    top25_overlap: float
    mean_anchor_cv: float
    median_anchor_cv: float

    def as_dict(self) -> Dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Repeatability":
        """A saved report; a figure an older version did not save reads as nan."""
        return cls(**{f.name: float(data.get(f.name, float("nan"))) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class LeaveOneOut:
    """The alignment with each anchor left out in turn: one Spearman and one second-moment ratio
    per left-out anchor (shape (N,)), their extremes, and whether every one keeps its side."""

    spearman: Tuple[float, ...]
    second_moment_ratios: Tuple[float, ...]
    min_spearman: float
    max_second_moment_ratio: float
    all_spearman_positive: bool
    all_second_moment_ratios_below_one: bool

    def as_dict(self) -> Dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LeaveOneOut":
        return cls(
            spearman=tuple(data["spearman"]),
            second_moment_ratios=tuple(data["second_moment_ratios"]),
            min_spearman=float(data["min_spearman"]),
            max_second_moment_ratio=float(data["max_second_moment_ratio"]),
            all_spearman_positive=bool(data["all_spearman_positive"]),
            all_second_moment_ratios_below_one=bool(data["all_second_moment_ratios_below_one"]),
        )


def repeatability(estimator_matrix: np.ndarray) -> Repeatability:
    """Split the estimator seeds (rows, an even number >= 4; columns are anchors) into halves and
    compare the half means per anchor."""
    matrix = np.asarray(estimator_matrix, dtype=np.float64)
    seeds, anchors = matrix.shape
    if seeds < 4 or seeds % 2:
        raise ValueError("estimator matrix must have an even number >= 4 of rows (estimator seeds)")
    half = seeds // 2
    first, second = matrix[:half].mean(axis=0), matrix[half:].mean(axis=0)
    rho = spearmanr(first, second)
    tau = kendalltau(first, second)
    cv = matrix.std(axis=0, ddof=1) / matrix.mean(axis=0)
    return Repeatability(
        spearman=float(rho.statistic),
        spearman_pvalue_asymptotic=float(rho.pvalue),
        kendall=float(tau.statistic),
        kendall_pvalue_asymptotic=float(tau.pvalue),
        spearman_brown_reliability=spearman_brown(float(rho.statistic)),
        mean_absolute_difference=float(np.mean(np.abs(first - second))),
        max_absolute_difference=float(np.max(np.abs(first - second))),
        top25_overlap=top_overlap(first, second),
        mean_anchor_cv=float(np.mean(cv)),
        median_anchor_cv=float(np.median(cv)),
    )


def require_proposal_scores(scores: np.ndarray) -> np.ndarray:
    """Scores as float64, refusing what cannot weight a proposal: a negative score would make a
    negative probability (NaN ratios, and the smallest possible permutation p-value)."""
    scores = np.asarray(scores, dtype=np.float64)
    bad = ~np.isfinite(scores) | (scores < 0)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"importance-sampling scores must be finite and >= 0; score {scores[where]!r} at index "
            f"{where if len(where) > 1 else where[0]} is not (use a non-negative score, e.g. a loss)"
        )
    return scores


def proposal_weights(scores: np.ndarray, *, percentile_epsilon: float, proposal_power: float = 1.0) -> np.ndarray:
    """Scores (finite, >= 0) winsorised at the epsilon and 1 - epsilon quantiles, raised to gamma."""
    scores = require_proposal_scores(scores)
    low, high = (
        np.quantile(scores, [percentile_epsilon, 1.0 - percentile_epsilon], axis=-1, keepdims=True)
        if scores.ndim > 1
        else np.quantile(scores, [percentile_epsilon, 1.0 - percentile_epsilon])
    )
    return np.clip(scores, low, high) ** proposal_power


def proposal_distribution(
    scores: np.ndarray, *, alpha: float, percentile_epsilon: float, proposal_power: float = 1.0
) -> np.ndarray:
    """q = (1 - alpha) w / sum(w) + alpha / N along the last axis (rows are separate proposals)."""
    w = proposal_weights(scores, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    n = w.shape[-1]
    return (1.0 - alpha) * w / w.sum(axis=-1, keepdims=True) + alpha / n


def information_to_baseline_ratio(gradient_rms: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Second moment of the importance-weighted estimator over uniform's, along the last axis
    (rows of q, and of gradient_rms, are separate cases)."""
    r2 = np.asarray(gradient_rms, dtype=np.float64) ** 2
    n = r2.shape[-1]
    return (r2 / q).sum(axis=-1) / n / r2.sum(axis=-1)


def oracle_ratio(gradient_rms: np.ndarray) -> float:
    r = np.asarray(gradient_rms, dtype=np.float64)
    return float(r.sum() ** 2 / (r.size * np.sum(r**2)))


def leave_one_out_robustness(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float = 1.0,
) -> LeaveOneOut:
    """scores and gradient_rms: shape (N,), N >= 3; the proposal's settings as proposal_distribution."""
    scores = np.asarray(scores, dtype=np.float64)
    gradient_rms = np.asarray(gradient_rms, dtype=np.float64)
    n = scores.size
    keep = ~np.eye(n, dtype=bool)
    s = np.stack([scores[k] for k in keep])
    r = np.stack([gradient_rms[k] for k in keep])
    rhos = np.array([spearmanr(s[i], r[i]).statistic for i in range(n)])
    q = proposal_distribution(s, alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    r2 = r**2
    ratios = (r2 / q).sum(axis=1) / (n - 1) / r2.sum(axis=1)
    return LeaveOneOut(
        spearman=tuple(rhos.tolist()),
        second_moment_ratios=tuple(ratios.tolist()),
        min_spearman=float(rhos.min()),
        max_second_moment_ratio=float(ratios.max()),
        all_spearman_positive=bool(np.all(rhos > 0)),
        all_second_moment_ratios_below_one=bool(np.all(ratios < 1.0)),
    )
