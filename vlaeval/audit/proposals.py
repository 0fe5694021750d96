"""Importance-sampling proposals over training anchors and flow time, and the second moment they
give the minibatch gradient: pure functions on arrays, no I/O, no torch.

A proposal draws anchor i with probability q_i and, optionally, the flow time's quantile level
u in bin k (K equal-probability bins of the training time distribution) with probability p_k,
u uniform within the bin. The importance weight

    w(i, k) = 1 / (N q_i) * (1 / K) / p_k

makes the weighted per-sample gradient w * grad l(i, t(u), noise) unbiased for the uniform
(training) gradient: sum_i sum_k q_i p_k w(i, k) E[grad l | i, k] = (1 / N) sum_i E_u[grad l(i, u)].

Its second moment, per sample, is M_q = (1 / N^2) sum_i (1 / q_i) E_u[||g_i(u)||^2 rho(u)] with
rho = (1 / K) / p_k(u); uniform sampling gives M_u = (1 / N) sum_i E_u ||g_i(u)||^2 / N. For a
minibatch of B independent draws, E||g_B||^2 = ||g||^2 + (M_q - ||g||^2) / B: the variance the
audit's second-moment ratio predicts is (M_q - ||g||^2) / B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

import numpy as np
from scipy import stats

from vlaeval.audit.statistics import proposal_distribution, require_proposal_scores
from vlaeval.records import JsonRecord


@dataclass(frozen=True)
class Proposal:
    """A distribution over (anchor, flow-time bin).

    anchor_probabilities: shape (N,), positive, summing to 1.
    time_bin_probabilities: shape (K,), positive, summing to 1, over K equal-probability bins of
        the training time distribution's quantile level u; None samples u uniformly (the training
        distribution).
    """

    name: str
    anchor_probabilities: np.ndarray
    time_bin_probabilities: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        for label, p in (("anchor", self.anchor_probabilities), ("time-bin", self.time_bin_probabilities)):
            if p is None:
                continue
            p = np.asarray(p, dtype=np.float64)
            if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p <= 0):
                raise ValueError(
                    f"proposal {self.name!r}: {label} probabilities must be a non-empty vector of finite values > 0"
                )
            if abs(p.sum() - 1.0) > 1e-9:
                raise ValueError(f"proposal {self.name!r}: {label} probabilities sum to {p.sum():.12f}, not 1")

    @property
    def size(self) -> int:
        return int(np.asarray(self.anchor_probabilities).size)

    def weights(self, anchors: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Importance weights w(i, k(u)) for anchors `anchors` drawn with quantile levels `u`."""
        q = np.asarray(self.anchor_probabilities, dtype=np.float64)
        w = 1.0 / (q.size * q[np.asarray(anchors)])
        return w * time_ratio(self.time_bin_probabilities, u)

    def sample(self, rng: np.random.Generator, size: int) -> Dict[str, np.ndarray]:
        """`size` independent draws: anchor indices, quantile levels u in [0, 1) and weights."""
        q = np.asarray(self.anchor_probabilities, dtype=np.float64)
        anchors = rng.choice(q.size, size=size, p=q)
        p = self.time_bin_probabilities
        if p is None:
            u = rng.random(size)
        else:
            k = len(p)
            bins = rng.choice(k, size=size, p=np.asarray(p, dtype=np.float64))
            u = (bins + rng.random(size)) / k
        return {"anchors": anchors, "u": u, "weights": self.weights(anchors, u)}

    def describe(self) -> Dict[str, Any]:
        q = np.asarray(self.anchor_probabilities, dtype=np.float64)
        out: Dict[str, Any] = {
            "name": self.name,
            "anchors": int(q.size),
            "anchor_max_to_min_probability": float(q.max() / q.min()),
            "anchor_max_weight": float(1.0 / (q.size * q.min())),
        }
        if self.time_bin_probabilities is not None:
            p = np.asarray(self.time_bin_probabilities, dtype=np.float64)
            out["time_bin_probabilities"] = p.tolist()
            out["time_max_weight"] = float((1.0 / p.size) / p.min())
        return out


def time_bin(u: np.ndarray, bins: int) -> np.ndarray:
    """The equal-probability bin (0 .. bins-1) of each quantile level u in [0, 1]."""
    return np.minimum((np.asarray(u, dtype=np.float64) * bins).astype(np.int64), bins - 1)


def time_ratio(time_bin_probabilities: Optional[np.ndarray], u: np.ndarray) -> np.ndarray:
    """rho(u) = (1 / K) / p_k(u): the flow-time part of the importance weight (1 without a time proposal)."""
    if time_bin_probabilities is None:
        return np.ones(np.shape(u))
    p = np.asarray(time_bin_probabilities, dtype=np.float64)
    return (1.0 / p.size) / p[time_bin(u, p.size)]


def uniform_proposal(n: int) -> Proposal:
    return Proposal("uniform", np.full(n, 1.0 / n))


def score_proposal(
    name: str, scores: np.ndarray, *, alpha: float, percentile_epsilon: float, proposal_power: float
) -> Proposal:
    """The audit's proposal from per-anchor scores: winsorised at epsilon, raised to gamma,
    mixed with alpha of uniform (vlaeval.audit.statistics.proposal_distribution)."""
    q = proposal_distribution(
        require_proposal_scores(scores),
        alpha=alpha,
        percentile_epsilon=percentile_epsilon,
        proposal_power=proposal_power,
    )
    return Proposal(name, q / q.sum())


def time_bin_probabilities(
    sq_norms: np.ndarray, u: np.ndarray, anchor_probabilities: np.ndarray, *, bins: int, alpha: float
) -> np.ndarray:
    """The flow-time proposal that minimises the second moment given the anchor proposal:
    p_k proportional to sqrt(A_k), A_k = the mean over draws in bin k of ||g||^2 / (N q_i),
    mixed with alpha of uniform.

    sq_norms, u: shape (draws, N) -- squared per-sample gradient norms and the quantile levels of
        their flow times (draws independent of those the proposal will be judged on).
    """
    s = np.asarray(sq_norms, dtype=np.float64)
    q = np.asarray(anchor_probabilities, dtype=np.float64)
    if s.shape != np.shape(u) or s.ndim != 2 or s.shape[1] != q.size:
        raise ValueError(f"sq_norms {s.shape} and u {np.shape(u)} must both be (draws, {q.size})")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} must be in [0, 1]")
    k = time_bin(u, bins)
    weighted = s / (q.size * q)[None, :]
    counts = np.bincount(k.ravel(), minlength=bins)
    if np.any(counts == 0):
        raise ValueError(
            f"{int(np.sum(counts == 0))} of {bins} flow-time bins hold no draw; use fewer bins or more draws"
        )
    a = np.bincount(k.ravel(), weights=weighted.ravel(), minlength=bins) / counts
    root = np.sqrt(np.maximum(a, 0.0))
    p = (1.0 - alpha) * root / root.sum() + alpha / bins
    return p / p.sum()


def per_sample_second_moment(sq_norms: np.ndarray, u: np.ndarray, proposal: Proposal) -> float:
    """M_q = (1 / N^2) sum_i (1 / q_i) mean_j ||g_ji||^2 rho(u_ji): every anchor, `draws` flow
    draws each from the training distribution (stratified over anchors, unbiased for M_q).

    sq_norms, u: shape (draws, N).
    """
    s = np.asarray(sq_norms, dtype=np.float64)
    q = np.asarray(proposal.anchor_probabilities, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] != q.size or s.shape != np.shape(u):
        raise ValueError(f"sq_norms {s.shape} and u {np.shape(u)} must both be (draws, {q.size})")
    per_anchor = (s * time_ratio(proposal.time_bin_probabilities, u)).mean(axis=0)
    return float(np.sum(per_anchor / q) / q.size**2)


@dataclass(frozen=True)
class Interval:
    """Mean of per-seed values with a two-sided Student-t interval across seeds."""

    mean: float
    low: float
    high: float
    values: tuple
    level: float = 0.95

    def as_dict(self) -> Dict[str, Any]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "values": list(self.values), "level": self.level}


def seed_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and t-interval of per-seed values (at least 2 values; the seeds are the replicates)."""
    x = np.asarray([float(v) for v in values], dtype=np.float64)
    if x.size < 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"need at least 2 finite per-seed values for an interval, got {x.tolist()}")
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    mean = float(x.mean())
    return Interval(mean, mean - half, mean + half, tuple(x.tolist()), level)


@dataclass(frozen=True)
class PredictionAgreement(JsonRecord):
    """The realized ratio against the audit's prediction: their difference, its standard error, t,
    the degrees of freedom, the prediction's SD (None: taken as exact), the level, the verdict."""

    WRITTEN_WHEN_NONE = ("prediction_sd",)

    realized_minus_predicted: float
    standard_error: float
    t: float
    degrees_of_freedom: float
    prediction_sd: Optional[float]
    level: float
    consistent: bool


def prediction_agreement(
    realized: Sequence[float], predicted: float, predicted_sd: Optional[float], level: float = 0.95
) -> PredictionAgreement:
    """The realized ratio and the audit's prediction as two estimates with errors, not one of them
    as an exact number.

    realized: the n >= 2 per-seed realized ratios (finite); predicted: the audit's ratio;
    predicted_sd: its bootstrap SD (None: treated as exact, 0). Returns their difference, its
    standard error se = sqrt(s^2 / n + sd^2) (s the spread of the per-seed values), t = difference / se,
    the Welch-Satterthwaite degrees of freedom se^4 / ((s^2 / n)^2 / (n - 1)) (the bootstrap SD counted
    as known: it comes from thousands of resamples), and whether |t| is within the level's t quantile.
    With 3 seeds and an exact prediction a normal quantile would call a correct prediction
    inconsistent about 3 times too often."""
    x = np.asarray([float(v) for v in realized], dtype=np.float64)
    if x.size < 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"need at least 2 finite per-seed realized ratios, got {x.tolist()}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level} must be in (0, 1)")
    sd = 0.0 if predicted_sd is None else float(predicted_sd)
    seed_part = float(x.var(ddof=1) / x.size)
    difference = float(x.mean() - float(predicted))
    se = float(np.sqrt(seed_part + sd**2))
    df = float("inf") if seed_part == 0 else float((seed_part + sd**2) ** 2 / (seed_part**2 / (x.size - 1)))
    t = difference / se if se > 0 else (0.0 if difference == 0 else float("inf"))
    critical = float(stats.t.ppf(0.5 + level / 2, df)) if np.isfinite(df) else float(stats.norm.ppf(0.5 + level / 2))
    return PredictionAgreement(
        realized_minus_predicted=difference,
        standard_error=se,
        t=float(t),
        degrees_of_freedom=df,
        prediction_sd=None if predicted_sd is None else sd,
        level=level,
        consistent=bool(abs(t) <= critical),
    )


def minibatch_moments(gradients: np.ndarray) -> Dict[str, float]:
    """From K minibatch gradients (K, P) at the same parameters: the mean squared norm
    E||g_B||^2, the total variance tr Cov(g_B) (unbiased), and the squared norm of their mean."""
    g = np.asarray(gradients, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] < 2:
        raise ValueError(f"gradients must be (K >= 2, parameters), got {g.shape}")
    mean = g.mean(axis=0)
    return {
        "second_moment": float(np.mean(np.sum(g**2, axis=1))),
        "variance": float(np.sum((g - mean) ** 2) / (g.shape[0] - 1)),
        "mean_sq_norm": float(np.sum(mean**2)),
        "minibatches": int(g.shape[0]),
    }


def variance_ratio_interval(variances_a: np.ndarray, variances_b: np.ndarray, level: float = 0.95) -> Dict[str, float]:
    """Ratio of two total variances from per-minibatch squared deviations (delta method on the
    log ratio): variances_*: shape (K,) squared distances of each minibatch gradient from its mean."""
    a, b = np.asarray(variances_a, dtype=np.float64), np.asarray(variances_b, dtype=np.float64)
    ratio = float(a.mean() / b.mean())
    se = float(np.sqrt(a.var(ddof=1) / a.size / a.mean() ** 2 + b.var(ddof=1) / b.size / b.mean() ** 2))
    z = float(stats.norm.ppf(0.5 + level / 2))
    return {"ratio": ratio, "low": ratio * float(np.exp(-z * se)), "high": ratio * float(np.exp(z * se))}


def build_proposals(
    names: Sequence[str],
    residual: np.ndarray,
    build: Any,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
    time_bins: int,
    time_alpha: float,
) -> Dict[str, Proposal]:
    """Each named proposal (an AblationProposal) over the anchors of `residual`; the score ones
    transformed exactly as the audit transforms its score (alpha, epsilon, gamma), the flow-time
    ones over `time_bins` bins from the gradient draws of `build` (sq_norms, losses, u: seeds x
    anchors)."""
    from vlaeval.choices import AblationProposal

    n = residual.size
    transform = dict(alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    residual_q = score_proposal("residual", residual, **transform)
    made: Dict[str, Proposal] = {}
    for name in names:
        if name == AblationProposal.uniform:
            made[name] = uniform_proposal(n)
        elif name == AblationProposal.residual:
            made[name] = residual_q
        elif name == AblationProposal.training_loss:
            made[name] = score_proposal(name, build.losses.mean(axis=0), **transform)
        elif name == AblationProposal.gradient_oracle:
            # The mean squared gradient norm is on the scale of a loss (squared), so the audit's
            # transform gives q proportional to gradient RMS at gamma = 1/2. Untransformed (q
            # proportional to the RMS of 16 draws) it measured 1.05 on independent draws: the
            # anchors whose few draws came out small get weights their true norms punish.
            made[name] = score_proposal(name, build.sq_norms.mean(axis=0), **transform)
        elif name == AblationProposal.adaptive_flow_time:  # its flow time: the sampler (adaptive_sampler)
            made[name] = uniform_proposal(n)
        elif name == AblationProposal.residual_adaptive_flow_time:
            made[name] = residual_q
        else:
            anchors = uniform_proposal(n) if name == AblationProposal.flow_time else residual_q
            p = time_bin_probabilities(
                build.sq_norms,
                build.u,
                anchors.anchor_probabilities,
                bins=time_bins,
                alpha=time_alpha,
            )
            made[name] = Proposal(name, anchors.anchor_probabilities, p)
    return made
