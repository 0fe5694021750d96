"""Statistics of the residual audit: pure functions on arrays, no I/O.

With r = gradient RMS per anchor and q an importance-sampling proposal over the N anchors, the
second moment of the importance-weighted gradient estimator relative to uniform sampling is

    information_to_baseline_ratio = (1/N) sum_i r_i^2 / q_i  /  sum_i r_i^2

(1 = no better than uniform; the oracle q proportional to r gives (sum r)^2 / (N sum r^2)).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
from scipy.stats import kendalltau, rankdata, spearmanr


def spearman_brown(split_half: float) -> float:
    """Reliability of the full-length measure from the correlation of its two halves."""
    return float(2 * split_half / (1 + split_half)) if split_half > -1 else float("nan")


def top_overlap(a: np.ndarray, b: np.ndarray, fraction: float = 0.25) -> float:
    count = max(1, int(len(a) * fraction))
    return len(set(np.argsort(a)[-count:]) & set(np.argsort(b)[-count:])) / count


def repeatability(estimator_matrix: np.ndarray) -> Dict[str, Any]:
    """Split the estimator seeds (rows) into halves and compare the half means per anchor."""
    matrix = np.asarray(estimator_matrix, dtype=np.float64)
    seeds, anchors = matrix.shape
    if seeds < 4 or seeds % 2:
        raise ValueError("estimator matrix must have an even number >= 4 of rows (estimator seeds)")
    half = seeds // 2
    first, second = matrix[:half].mean(axis=0), matrix[half:].mean(axis=0)
    rho = spearmanr(first, second)
    tau = kendalltau(first, second)
    cv = matrix.std(axis=0, ddof=1) / matrix.mean(axis=0)
    return {
        "spearman": float(rho.statistic),
        "spearman_pvalue_asymptotic": float(rho.pvalue),
        "kendall": float(tau.statistic),
        "kendall_pvalue_asymptotic": float(tau.pvalue),
        "spearman_brown_reliability": spearman_brown(float(rho.statistic)),
        "mean_absolute_difference": float(np.mean(np.abs(first - second))),
        "max_absolute_difference": float(np.max(np.abs(first - second))),
        "top25_overlap": top_overlap(first, second),
        "mean_anchor_cv": float(np.mean(cv)),
        "median_anchor_cv": float(np.median(cv)),
    }


def proposal_weights(scores: np.ndarray, *, percentile_epsilon: float, proposal_power: float = 1.0) -> np.ndarray:
    """Scores winsorised at the epsilon and 1 - epsilon quantiles, raised to the power gamma."""
    scores = np.asarray(scores, dtype=np.float64)
    low, high = np.quantile(scores, [percentile_epsilon, 1.0 - percentile_epsilon], axis=-1, keepdims=True) \
        if scores.ndim > 1 else np.quantile(scores, [percentile_epsilon, 1.0 - percentile_epsilon])
    return np.clip(scores, low, high) ** proposal_power


def proposal_distribution(scores: np.ndarray, *, alpha: float, percentile_epsilon: float,
                          proposal_power: float = 1.0) -> np.ndarray:
    """q = (1 - alpha) w / sum(w) + alpha / N along the last axis (rows are separate proposals)."""
    w = proposal_weights(scores, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    n = w.shape[-1]
    return (1.0 - alpha) * w / w.sum(axis=-1, keepdims=True) + alpha / n


def information_to_baseline_ratio(gradient_rms: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Second moment of the importance-weighted estimator over uniform's (rows of q allowed)."""
    r2 = np.asarray(gradient_rms, dtype=np.float64) ** 2
    n = r2.shape[-1]
    return (r2 / q).sum(axis=-1) / n / r2.sum()


def oracle_ratio(gradient_rms: np.ndarray) -> float:
    r = np.asarray(gradient_rms, dtype=np.float64)
    return float(r.sum() ** 2 / (r.size * np.sum(r**2)))


def _proposal_summary(scores, gradient_rms, *, alpha, percentile_epsilon, proposal_power) -> Dict[str, Any]:
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


def _spearman_kendall(label: str, scores: np.ndarray, gradient_rms: np.ndarray) -> Dict[str, float]:
    rho = spearmanr(scores, gradient_rms)
    tau = kendalltau(scores, gradient_rms)
    return {f"spearman_{label}_vs_gradient_rms": float(rho.statistic),
            f"spearman_{label}_vs_gradient_rms_pvalue_asymptotic": float(rho.pvalue),
            f"kendall_{label}_vs_gradient_rms": float(tau.statistic),
            f"kendall_{label}_vs_gradient_rms_pvalue_asymptotic": float(tau.pvalue)}


def permutation_control(scores: np.ndarray, gradient_rms: np.ndarray, *, alpha: float, percentile_epsilon: float,
                        proposal_power: float, permutation_count: int, permutation_seed: int,
                        keep_null_distributions: bool = False) -> Dict[str, Any]:
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
    q_obs = proposal_distribution(scores, alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    ratio_obs = float(information_to_baseline_ratio(gradient_rms, q_obs))
    ratio_perm = information_to_baseline_ratio(gradient_rms, q_obs[perms])  # q is elementwise in the score
    rho_obs = float(spearmanr(scores, gradient_rms).statistic)
    out = {
        "permutation_count": int(permutation_count),
        "permutation_seed": int(permutation_seed),
        "observed_spearman": rho_obs,
        "observed_second_moment_ratio": ratio_obs,
        "one_sided_pvalue_rho_at_least_observed": float((1 + np.sum(rho_perm >= rho_obs - 1e-12)) / (permutation_count + 1)),
        "one_sided_pvalue_second_moment_at_most_observed": float((1 + np.sum(ratio_perm <= ratio_obs + 1e-12)) / (permutation_count + 1)),
        "null_spearman_quantiles": np.quantile(rho_perm, [0.01, 0.5, 0.99]).tolist(),
        "null_second_moment_quantiles": np.quantile(ratio_perm, [0.01, 0.5, 0.99]).tolist(),
    }
    if keep_null_distributions:
        out.update(null_spearman=rho_perm, null_second_moment=ratio_perm)
    return out


def alignment_audit(scores: np.ndarray, gradient_rms: np.ndarray, mean_losses: np.ndarray, *, alpha: float,
                    percentile_epsilon: float, permutation_count: int, permutation_seed: int, score_label: str,
                    proposal_power: float = 1.0, score_reliability: Optional[float] = None,
                    gradient_reliability: Optional[float] = None, keep_null_distributions: bool = False) -> Dict[str, Any]:
    """How well the scores rank anchors by gradient RMS, and how good a proposal they make,
    beside the training loss scored the same way (the baseline any score must beat)."""
    scores = np.asarray(scores, dtype=np.float64)
    gradient_rms = np.asarray(gradient_rms, dtype=np.float64)
    mean_losses = np.asarray(mean_losses, dtype=np.float64)
    kwargs = dict(alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    out: Dict[str, Any] = {
        **_spearman_kendall(score_label, scores, gradient_rms),
        **_spearman_kendall("training_loss", mean_losses, gradient_rms),
        "top25_overlap": top_overlap(scores, gradient_rms),
        "training_loss_top25_overlap": top_overlap(mean_losses, gradient_rms),
        "proposal": _proposal_summary(scores, gradient_rms, **kwargs),
        "training_loss_proposal": _proposal_summary(mean_losses, gradient_rms, **kwargs),
        "raw_score_proposal": _proposal_summary(scores, gradient_rms, alpha=alpha,
                                                percentile_epsilon=percentile_epsilon, proposal_power=1.0),
        "random_permutation_control": permutation_control(scores, gradient_rms, permutation_count=permutation_count,
                                                          permutation_seed=permutation_seed,
                                                          keep_null_distributions=keep_null_distributions, **kwargs),
    }
    rho = out[f"spearman_{score_label}_vs_gradient_rms"]
    out["reliability"] = {"score_reliability": score_reliability, "gradient_rms_reliability": gradient_reliability}
    if score_reliability and gradient_reliability and score_reliability > 0 and gradient_reliability > 0:
        # The observed correlation is bounded by the two measures' reliabilities (Spearman 1904).
        out["reliability"]["attenuation_corrected_spearman"] = float(
            np.clip(rho / np.sqrt(score_reliability * gradient_reliability), -1.0, 1.0))
        out["reliability"]["spearman_ceiling"] = float(np.sqrt(score_reliability * gradient_reliability))
    return out


def leave_one_out_robustness(scores: np.ndarray, gradient_rms: np.ndarray, *, alpha: float, percentile_epsilon: float,
                             proposal_power: float = 1.0) -> Dict[str, Any]:
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
    return {
        "spearman": rhos.tolist(),
        "second_moment_ratios": ratios.tolist(),
        "min_spearman": float(rhos.min()),
        "max_second_moment_ratio": float(ratios.max()),
        "all_spearman_positive": bool(np.all(rhos > 0)),
        "all_second_moment_ratios_below_one": bool(np.all(ratios < 1.0)),
    }
