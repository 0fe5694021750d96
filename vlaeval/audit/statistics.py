"""Statistics of the residual audit: pure functions on arrays, no I/O.

With r = gradient RMS per anchor and q an importance-sampling proposal over the N anchors, the
second moment of the importance-weighted gradient estimator relative to uniform sampling is

    information_to_baseline_ratio = (1/N) sum_i r_i^2 / q_i  /  sum_i r_i^2

(1 = no better than uniform; the oracle q proportional to r gives (sum r)^2 / (N sum r^2)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from scipy.stats import kendalltau, rankdata, spearmanr


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


def _proposal_summary(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
) -> Dict[str, Any]:
    q = proposal_distribution(scores, alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    ratio = float(information_to_baseline_ratio(gradient_rms, q))
    oracle = oracle_ratio(gradient_rms)
    return {
        "information_to_baseline_ratio": ratio,
        "oracle_ratio": oracle,
        "fraction_of_oracle_gain": float((1.0 - ratio) / (1.0 - oracle)) if oracle < 1.0 else float("nan"),
        "alpha": float(alpha),
        "percentile_epsilon": float(percentile_epsilon),
        "proposal_power": float(proposal_power),
        "max_to_min_probability": float(q.max() / q.min()),
    }


def permutation_control(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
    permutation_count: int,
    permutation_seed: int,
    keep_null_distributions: bool = False,
) -> Dict[str, Any]:
    """Permute the scores (seeded), all permutations at once: one-sided p-values
    (1 + #{rho_perm >= rho_obs}) / (P + 1) and (1 + #{ratio_perm <= ratio_obs}) / (P + 1).
    With keep_null_distributions, the permuted statistics are returned too (for plots) under
    "null_spearman" and "null_second_moment"."""
    scores = np.asarray(scores, dtype=np.float64)
    rng = np.random.default_rng(permutation_seed)
    perms = rng.permuted(np.tile(np.arange(scores.size), (permutation_count, 1)), axis=1)
    score_ranks = rankdata(scores)
    grad_ranks = rankdata(gradient_rms)
    centered_grad = (grad_ranks - grad_ranks.mean()) / np.linalg.norm(grad_ranks - grad_ranks.mean())
    permuted_ranks = score_ranks[perms]
    centered = permuted_ranks - permuted_ranks.mean(axis=1, keepdims=True)
    rho_perm = centered @ centered_grad / np.linalg.norm(centered, axis=1)
    q_obs = proposal_distribution(
        scores, alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power
    )
    ratio_obs = float(information_to_baseline_ratio(gradient_rms, q_obs))
    ratio_perm = information_to_baseline_ratio(gradient_rms, q_obs[perms])  # q is elementwise in the score
    rho_obs = float(spearmanr(scores, gradient_rms).statistic)
    out = {
        "permutation_count": int(permutation_count),
        "permutation_seed": int(permutation_seed),
        "observed_spearman": rho_obs,
        "observed_second_moment_ratio": ratio_obs,
        "one_sided_pvalue_rho_at_least_observed": float(
            (1 + np.sum(rho_perm >= rho_obs - 1e-12)) / (permutation_count + 1)
        ),
        "one_sided_pvalue_second_moment_at_most_observed": float(
            (1 + np.sum(ratio_perm <= ratio_obs + 1e-12)) / (permutation_count + 1)
        ),
        "null_spearman_quantiles": np.quantile(rho_perm, [0.01, 0.5, 0.99]).tolist(),
        "null_second_moment_quantiles": np.quantile(ratio_perm, [0.01, 0.5, 0.99]).tolist(),
    }
    if keep_null_distributions:
        out.update(null_spearman=rho_perm, null_second_moment=ratio_perm)
    return out


def alignment_audit(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    mean_losses: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    permutation_count: int,
    permutation_seed: int,
    proposal_power: float = 1.0,
    score_reliability: Optional[float] = None,
    gradient_reliability: Optional[float] = None,
    per_seed_gradient_rms: Optional[np.ndarray] = None,
    per_seed_losses: Optional[np.ndarray] = None,
    bootstrap_seed: int = 0,
    keep_null_distributions: bool = False,
) -> Dict[str, Any]:
    """How well the scores (shape (N,), finite and >= 0) rank anchors by gradient RMS (N,), and how
    good a proposal they make; beside the training loss as the baseline any score must beat.

    mean_losses (N,) are the training losses of the gradient artifact: they come from the same
    (t, eps) draws as the gradient RMS, which inflates their alignment, so they are reported as
    `training_loss_shared_draws` only. With the artifact's per-seed values (S, N), S >= 4, the fair
    comparison is `baseline_comparison` (see cross_fitted_baseline)."""
    scores = require_proposal_scores(scores)
    gradient_rms = np.asarray(gradient_rms, dtype=np.float64)
    mean_losses = np.asarray(mean_losses, dtype=np.float64)
    kwargs: Dict[str, Any] = dict(alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    rho = spearmanr(scores, gradient_rms)
    tau = kendalltau(scores, gradient_rms)
    out: Dict[str, Any] = {
        "spearman_residual_vs_gradient_rms": float(rho.statistic),
        "spearman_residual_vs_gradient_rms_pvalue_asymptotic": float(rho.pvalue),
        "kendall_residual_vs_gradient_rms": float(tau.statistic),
        "kendall_residual_vs_gradient_rms_pvalue_asymptotic": float(tau.pvalue),
        "top25_overlap": top_overlap(scores, gradient_rms),
        "proposal": _proposal_summary(scores, gradient_rms, **kwargs),
        "raw_score_proposal": _proposal_summary(
            scores, gradient_rms, alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=1.0
        ),
        "training_loss_shared_draws": {
            "note": "the artifact's training loss shares its (t, eps) draws with the gradient RMS: inflated; "
            "see baseline_comparison for the fair comparison",
            "spearman_vs_gradient_rms": float(spearmanr(mean_losses, gradient_rms).statistic),
            "top25_overlap": top_overlap(mean_losses, gradient_rms),
            "second_moment_ratio": _proposal_summary(mean_losses, gradient_rms, **kwargs)[
                "information_to_baseline_ratio"
            ],
        },
        "random_permutation_control": permutation_control(
            scores,
            gradient_rms,
            permutation_count=permutation_count,
            permutation_seed=permutation_seed,
            keep_null_distributions=keep_null_distributions,
            **kwargs,
        ),
    }
    if per_seed_gradient_rms is not None and per_seed_losses is not None and np.shape(per_seed_gradient_rms)[0] >= 4:
        out["baseline_comparison"] = cross_fitted_baseline(
            scores,
            per_seed_gradient_rms,
            per_seed_losses,
            alpha=alpha,
            percentile_epsilon=percentile_epsilon,
            proposal_power=proposal_power,
            bootstrap_seed=bootstrap_seed,
        )
        attainable = out["baseline_comparison"]["attainable_oracle_ratio"]
        residual = out["baseline_comparison"]["residual"]["second_moment_ratio"]
        out["proposal"]["attainable_oracle_ratio"] = attainable
        out["proposal"]["fraction_of_attainable_oracle_gain"] = (
            float((1.0 - residual) / (1.0 - attainable)) if attainable < 1.0 else float("nan")
        )
    else:
        out["baseline_comparison"] = {
            "available": False,
            "reason": "the gradient artifact has no per-seed gradient RMS and losses (>= 4 "
            "seeds), so the training loss cannot be scored on independent draws",
        }
    out["reliability"] = {"score_reliability": score_reliability, "gradient_rms_reliability": gradient_reliability}
    if score_reliability and gradient_reliability and score_reliability > 0 and gradient_reliability > 0:
        # The observed correlation is bounded by the two measures' reliabilities (Spearman 1904).
        out["reliability"]["attenuation_corrected_spearman"] = float(
            np.clip(
                out["spearman_residual_vs_gradient_rms"] / np.sqrt(score_reliability * gradient_reliability), -1.0, 1.0
            )
        )
        out["reliability"]["spearman_ceiling"] = float(np.sqrt(score_reliability * gradient_reliability))
        out["reliability"]["attenuation_correction"] = (
            "APPROXIMATE: Spearman's (1904) disattenuation formula, exact for Pearson correlations of measures "
            "with classical errors, applied here to rank correlations and split-half (Spearman-Brown) reliabilities"
        )
    return out


def _half_rms(per_seed_rms: np.ndarray, rows: slice) -> np.ndarray:
    """Gradient RMS of each anchor from a subset of the gradient seeds (root mean square over them)."""
    return np.sqrt(np.mean(per_seed_rms[rows] ** 2, axis=0))


def row_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman of matching rows of a and b (R, N), vectorised (average ranks for ties)."""
    ra = rankdata(a, axis=-1)
    rb = rankdata(b, axis=-1)
    ra = ra - ra.mean(axis=-1, keepdims=True)
    rb = rb - rb.mean(axis=-1, keepdims=True)
    return (ra * rb).sum(axis=-1) / np.sqrt((ra * ra).sum(axis=-1) * (rb * rb).sum(axis=-1))


def cross_fitted_baseline(
    scores: np.ndarray,
    per_seed_gradient_rms: np.ndarray,
    per_seed_losses: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
    bootstrap: int = 2000,
    bootstrap_seed: int = 0,
) -> Dict[str, Any]:
    """The residual and the training loss compared on equal footing, each on draws independent of
    the gradient RMS it is judged against.

    The gradient seeds (rows of per_seed_*, shape (S, N), S >= 4) are split into halves A and B.
    Fold 1 judges against the gradient RMS of A: the residual (independent of every gradient seed)
    and the training loss of B; fold 2 swaps the halves. Reported: each score's Spearman and
    second-moment ratio averaged over the two folds, the same for the loss on shared draws (the
    inflated figure), the attainable oracle (q proportional to one half's gradient RMS, judged on
    the other), and a paired bootstrap over anchors (seeded) of the residual-minus-loss differences.
    verdict: "beats" when the 95% intervals of both differences lie on the score's side of zero
    (higher Spearman, lower ratio), "loses" when either lies on the loss's side, else "tie";
    `score_beats_training_loss` is verdict == "beats"."""
    scores = require_proposal_scores(scores)
    rms = np.asarray(per_seed_gradient_rms, dtype=np.float64)
    loss = np.asarray(per_seed_losses, dtype=np.float64)
    if rms.shape != loss.shape or rms.ndim != 2 or rms.shape[0] < 4 or rms.shape[1] != scores.size:
        raise ValueError("per-seed gradient RMS and losses must both have shape (seeds >= 4, anchors)")
    half = rms.shape[0] // 2
    a, b = slice(0, half), slice(half, 2 * half)
    kwargs: Dict[str, Any] = dict(alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    folds = [
        (_half_rms(rms, a), loss[b].mean(axis=0), loss[a].mean(axis=0), _half_rms(rms, b)),
        (_half_rms(rms, b), loss[a].mean(axis=0), loss[b].mean(axis=0), _half_rms(rms, a)),
    ]
    n = scores.size

    def ratio(weights: np.ndarray, target: np.ndarray) -> np.ndarray:
        return information_to_baseline_ratio(target, proposal_distribution(weights, **kwargs))

    rows: Dict[str, List[Tuple[float, float]]] = {
        "residual": [],
        "training_loss": [],
        "training_loss_shared_draws": [],
        "oracle": [],
    }
    rng = np.random.default_rng(bootstrap_seed)
    resample = rng.integers(0, n, size=(bootstrap, n))
    boot_rho, boot_ratio = [], []
    for target, independent_loss, shared_loss, other_half in folds:
        for name, weights in (
            ("residual", scores),
            ("training_loss", independent_loss),
            ("training_loss_shared_draws", shared_loss),
        ):
            rows[name].append((float(spearmanr(weights, target).statistic), float(ratio(weights, target))))
        oracle_q = other_half / other_half.sum()
        rows["oracle"].append((float("nan"), float(information_to_baseline_ratio(target, oracle_q))))
        t, s_, l_ = target[resample], scores[resample], independent_loss[resample]
        boot_rho.append(row_spearman(s_, t) - row_spearman(l_, t))
        boot_ratio.append(ratio(s_, t) - ratio(l_, t))
    summary = {
        name: {"spearman": float(np.mean([r for r, _ in v])), "second_moment_ratio": float(np.mean([q for _, q in v]))}
        for name, v in rows.items()
    }
    rho_diff = summary["residual"]["spearman"] - summary["training_loss"]["spearman"]
    ratio_diff = summary["residual"]["second_moment_ratio"] - summary["training_loss"]["second_moment_ratio"]
    rho_ci = np.quantile(np.mean(boot_rho, axis=0), [0.025, 0.975])
    ratio_ci = np.quantile(np.mean(boot_ratio, axis=0), [0.025, 0.975])
    # "beats" only when both differences are clear of zero in the score's favour; "loses" when
    # either is clear of zero against it; otherwise the two are indistinguishable here.
    if rho_ci[0] > 0 and ratio_ci[1] < 0:
        verdict = "beats"
    elif rho_ci[1] < 0 or ratio_ci[0] > 0:
        verdict = "loses"
    else:
        verdict = "tie"
    return {
        "method": "gradient seeds split in halves; each score judged on the half its draws are independent of; "
        "two folds averaged",
        "seeds_per_half": half,
        "residual": summary["residual"],
        "training_loss": summary["training_loss"],
        "training_loss_shared_draws": summary["training_loss_shared_draws"],
        "attainable_oracle_ratio": summary["oracle"]["second_moment_ratio"],
        "spearman_difference": rho_diff,
        "spearman_difference_ci95": rho_ci.tolist(),
        "second_moment_ratio_difference": ratio_diff,
        "second_moment_ratio_difference_ci95": ratio_ci.tolist(),
        "bootstrap": {"resamples": bootstrap, "seed": bootstrap_seed, "over": "anchors (paired)"},
        "verdict": verdict,
        "score_beats_training_loss": verdict == "beats",
    }


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
