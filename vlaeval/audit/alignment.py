"""How well a score lines up with the gradient it should predict: rank agreement with gradient RMS,
the importance-sampling proposal it makes, a permutation control, and the training loss as the
baseline any score must beat, compared on independent draws. Pure functions on arrays, each
returning a frozen result (scipy.stats style) whose `as_dict` is the result.json layout.

Shapes: scores, gradient_rms and mean_losses are (N,) over anchors; per-seed values are (S, N)
over gradient seeds and anchors. The proposal's settings (alpha, percentile_epsilon,
proposal_power) are those of vlaeval.audit.statistics.proposal_distribution.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
from scipy.stats import kendalltau, rankdata, spearmanr

from vlaeval.audit.statistics import (
    information_to_baseline_ratio,
    oracle_ratio,
    proposal_distribution,
    require_proposal_scores,
    top_overlap,
)
from vlaeval.audit.verdict import two_level_ratios

SHARED_DRAWS_NOTE = (
    "the artifact's training loss shares its (t, eps) draws with the gradient RMS: inflated; "
    "see baseline_comparison for the fair comparison"
)
NO_PER_SEED_VALUES = (
    "the gradient artifact has no per-seed gradient RMS and losses (>= 4 seeds), so the training loss "
    "cannot be scored on independent draws"
)
ATTENUATION_NOTE = (
    "APPROXIMATE: Spearman's (1904) disattenuation formula, exact for Pearson correlations of measures "
    "with classical errors, applied here to rank correlations and split-half (Spearman-Brown) reliabilities"
)
CROSS_FIT_METHOD = (
    "gradient seeds split in halves; each score judged on the half its draws are independent of; two folds averaged"
)


def _finite_or_nan(value: Any) -> float:
    return float("nan") if value is None else float(value)


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class ProposalStatistics:
    """A proposal q built from a score: its second moment relative to uniform sampling (1 = no
    better), the in-sample oracle's (q proportional to the gradient RMS it is judged on), the share
    of the oracle's gain it reaches, its settings and its spread; with per-seed values, also the
    attainable (cross-fitted) oracle and the share of its gain."""

    information_to_baseline_ratio: float
    oracle_ratio: float
    fraction_of_oracle_gain: float
    alpha: float
    percentile_epsilon: float
    proposal_power: float
    max_to_min_probability: float
    attainable_oracle_ratio: Optional[float] = None
    fraction_of_attainable_oracle_gain: Optional[float] = None
    # The ratio's sampling error from auditing these N anchors: the SD and 95% percentile interval of
    # the ratio over anchors resampled with replacement, the proposal rebuilt on each (ratio_bootstrap).
    ratio_bootstrap_sd: Optional[float] = None
    ratio_interval: Optional[Tuple[float, float]] = None

    OPTIONAL = (
        "attainable_oracle_ratio",
        "fraction_of_attainable_oracle_gain",
        "ratio_bootstrap_sd",
        "ratio_interval",
    )

    def as_dict(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in self.OPTIONAL:
            if out[name] is None:
                del out[name]  # absent, as in results written without per-seed values or a bootstrap
        if "ratio_interval" in out:
            out["ratio_interval"] = list(out["ratio_interval"])
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ProposalStatistics":
        attainable, attainable_gain = (
            data.get("attainable_oracle_ratio"),
            data.get("fraction_of_attainable_oracle_gain"),
        )
        return cls(
            information_to_baseline_ratio=float(data["information_to_baseline_ratio"]),
            oracle_ratio=_finite_or_nan(data.get("oracle_ratio")),
            fraction_of_oracle_gain=_finite_or_nan(data.get("fraction_of_oracle_gain")),
            alpha=_finite_or_nan(data.get("alpha")),
            percentile_epsilon=_finite_or_nan(data.get("percentile_epsilon")),
            proposal_power=_finite_or_nan(data.get("proposal_power")),
            max_to_min_probability=_finite_or_nan(data.get("max_to_min_probability")),
            attainable_oracle_ratio=None if attainable is None else float(attainable),
            fraction_of_attainable_oracle_gain=None if attainable_gain is None else float(attainable_gain),
            ratio_bootstrap_sd=None if data.get("ratio_bootstrap_sd") is None else float(data["ratio_bootstrap_sd"]),
            ratio_interval=None if data.get("ratio_interval") is None else tuple(data["ratio_interval"]),
        )


@dataclass(frozen=True)
class PermutationControl:
    """The scores permuted (seeded): one-sided p-values (1 + #{null at least as good}) / (P + 1) for
    the Spearman and the second-moment ratio, and the null distributions' 1%, 50%, 99% quantiles.
    `null_spearman` and `null_second_moment` (P,) are kept only when asked for (plots); never saved."""

    permutation_count: int
    permutation_seed: int
    observed_spearman: float
    observed_second_moment_ratio: float
    one_sided_pvalue_rho_at_least_observed: float
    one_sided_pvalue_second_moment_at_most_observed: float
    null_spearman_quantiles: Tuple[float, ...]
    null_second_moment_quantiles: Tuple[float, ...]
    null_spearman: Optional[np.ndarray] = field(default=None, compare=False, repr=False)
    null_second_moment: Optional[np.ndarray] = field(default=None, compare=False, repr=False)

    def as_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("null_")}
        out["null_spearman_quantiles"] = list(self.null_spearman_quantiles)
        out["null_second_moment_quantiles"] = list(self.null_second_moment_quantiles)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PermutationControl":
        return cls(
            permutation_count=int(data["permutation_count"]),
            permutation_seed=int(data["permutation_seed"]),
            observed_spearman=float(data["observed_spearman"]),
            observed_second_moment_ratio=float(data["observed_second_moment_ratio"]),
            one_sided_pvalue_rho_at_least_observed=float(data["one_sided_pvalue_rho_at_least_observed"]),
            one_sided_pvalue_second_moment_at_most_observed=float(
                data["one_sided_pvalue_second_moment_at_most_observed"]
            ),
            null_spearman_quantiles=tuple(data.get("null_spearman_quantiles", ())),
            null_second_moment_quantiles=tuple(data.get("null_second_moment_quantiles", ())),
        )


@dataclass(frozen=True)
class ScoreAlignment:
    """One score judged against gradient RMS: Spearman, and the second-moment ratio of its proposal."""

    spearman: float
    second_moment_ratio: float

    def as_dict(self) -> Dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ScoreAlignment":
        return cls(_finite_or_nan(data.get("spearman")), _finite_or_nan(data.get("second_moment_ratio")))


@dataclass(frozen=True)
class BaselineComparison:
    """The residual and the training loss on equal footing (cross_fitted_baseline): each averaged
    over two folds, the loss on shared draws (inflated), the attainable oracle, and paired-bootstrap
    95% intervals of the residual-minus-loss differences. verdict: beats, tie or loses."""

    seeds_per_half: int
    residual: ScoreAlignment
    training_loss: ScoreAlignment
    training_loss_shared_draws: ScoreAlignment
    attainable_oracle_ratio: float
    spearman_difference: float
    spearman_difference_ci95: Tuple[float, float]
    second_moment_ratio_difference: float
    second_moment_ratio_difference_ci95: Tuple[float, float]
    bootstrap_resamples: int
    bootstrap_seed: int
    verdict: str

    @property
    def score_beats_training_loss(self) -> bool:
        return self.verdict == "beats"

    def as_dict(self) -> Dict[str, Any]:
        return {
            "method": CROSS_FIT_METHOD,
            "seeds_per_half": self.seeds_per_half,
            "residual": self.residual.as_dict(),
            "training_loss": self.training_loss.as_dict(),
            "training_loss_shared_draws": self.training_loss_shared_draws.as_dict(),
            "attainable_oracle_ratio": self.attainable_oracle_ratio,
            "spearman_difference": self.spearman_difference,
            "spearman_difference_ci95": list(self.spearman_difference_ci95),
            "second_moment_ratio_difference": self.second_moment_ratio_difference,
            "second_moment_ratio_difference_ci95": list(self.second_moment_ratio_difference_ci95),
            "bootstrap": {
                "resamples": self.bootstrap_resamples,
                "seed": self.bootstrap_seed,
                "over": "anchors (paired)",
            },
            "verdict": self.verdict,
            "score_beats_training_loss": self.score_beats_training_loss,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "BaselineComparison":
        bootstrap = data.get("bootstrap", {})
        low_high = lambda key: tuple(float(x) for x in data[key])  # noqa: E731
        return cls(
            seeds_per_half=int(data["seeds_per_half"]),
            residual=ScoreAlignment.from_json(data["residual"]),
            training_loss=ScoreAlignment.from_json(data["training_loss"]),
            training_loss_shared_draws=ScoreAlignment.from_json(data["training_loss_shared_draws"]),
            attainable_oracle_ratio=float(data["attainable_oracle_ratio"]),
            spearman_difference=float(data["spearman_difference"]),
            spearman_difference_ci95=low_high("spearman_difference_ci95"),  # type: ignore[arg-type]
            second_moment_ratio_difference=float(data["second_moment_ratio_difference"]),
            second_moment_ratio_difference_ci95=low_high("second_moment_ratio_difference_ci95"),  # type: ignore[arg-type]
            bootstrap_resamples=int(bootstrap.get("resamples", 0)),
            bootstrap_seed=int(bootstrap.get("seed", 0)),
            verdict=str(data["verdict"]),
        )


@dataclass(frozen=True)
class SharedDrawsLoss:
    """The artifact's training loss judged on the very draws its gradient RMS came from (inflated)."""

    spearman_vs_gradient_rms: float
    top25_overlap: float
    second_moment_ratio: float

    def as_dict(self) -> Dict[str, Any]:
        return {"note": SHARED_DRAWS_NOTE, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SharedDrawsLoss":
        return cls(*(_finite_or_nan(data.get(f.name)) for f in dataclasses.fields(cls)))


@dataclass(frozen=True)
class AlignmentReliability:
    """The two measures' split-half reliabilities and, when both are positive, the ceiling they put
    on the observed correlation and the (APPROXIMATE) attenuation-corrected Spearman."""

    score_reliability: Optional[float]
    gradient_rms_reliability: Optional[float]
    attenuation_corrected_spearman: Optional[float] = None
    spearman_ceiling: Optional[float] = None

    def as_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "score_reliability": self.score_reliability,
            "gradient_rms_reliability": self.gradient_rms_reliability,
        }
        if self.attenuation_corrected_spearman is not None:
            out.update(
                attenuation_corrected_spearman=self.attenuation_corrected_spearman,
                spearman_ceiling=self.spearman_ceiling,
                attenuation_correction=ATTENUATION_NOTE,
            )
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AlignmentReliability":
        return cls(*(data.get(f.name) for f in dataclasses.fields(cls)))


@dataclass(frozen=True)
class Alignment:
    """What alignment_audit measures. `baseline_comparison` is None when the artifact has no
    per-seed values (`baseline_unavailable_reason` says so)."""

    spearman_residual_vs_gradient_rms: float
    spearman_residual_vs_gradient_rms_pvalue_asymptotic: float
    kendall_residual_vs_gradient_rms: float
    kendall_residual_vs_gradient_rms_pvalue_asymptotic: float
    top25_overlap: float
    proposal: ProposalStatistics
    raw_score_proposal: ProposalStatistics
    training_loss_shared_draws: SharedDrawsLoss
    random_permutation_control: PermutationControl
    baseline_comparison: Optional[BaselineComparison]
    reliability: AlignmentReliability
    baseline_unavailable_reason: str = NO_PER_SEED_VALUES

    def as_dict(self) -> Dict[str, Any]:
        baseline = (
            self.baseline_comparison.as_dict()
            if self.baseline_comparison is not None
            else {"available": False, "reason": self.baseline_unavailable_reason}
        )
        return {
            "spearman_residual_vs_gradient_rms": self.spearman_residual_vs_gradient_rms,
            "spearman_residual_vs_gradient_rms_pvalue_asymptotic": self.spearman_residual_vs_gradient_rms_pvalue_asymptotic,
            "kendall_residual_vs_gradient_rms": self.kendall_residual_vs_gradient_rms,
            "kendall_residual_vs_gradient_rms_pvalue_asymptotic": self.kendall_residual_vs_gradient_rms_pvalue_asymptotic,
            "top25_overlap": self.top25_overlap,
            "proposal": self.proposal.as_dict(),
            "raw_score_proposal": self.raw_score_proposal.as_dict(),
            "training_loss_shared_draws": self.training_loss_shared_draws.as_dict(),
            "random_permutation_control": self.random_permutation_control.as_dict(),
            "baseline_comparison": baseline,
            "reliability": self.reliability.as_dict(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Alignment":
        baseline = data.get("baseline_comparison") or {"available": False}
        available = baseline.get("available", True)
        return cls(
            spearman_residual_vs_gradient_rms=float(data["spearman_residual_vs_gradient_rms"]),
            spearman_residual_vs_gradient_rms_pvalue_asymptotic=_finite_or_nan(
                data.get("spearman_residual_vs_gradient_rms_pvalue_asymptotic")
            ),
            kendall_residual_vs_gradient_rms=_finite_or_nan(data.get("kendall_residual_vs_gradient_rms")),
            kendall_residual_vs_gradient_rms_pvalue_asymptotic=_finite_or_nan(
                data.get("kendall_residual_vs_gradient_rms_pvalue_asymptotic")
            ),
            top25_overlap=float(data["top25_overlap"]),
            proposal=ProposalStatistics.from_json(data["proposal"]),
            raw_score_proposal=ProposalStatistics.from_json(data.get("raw_score_proposal", data["proposal"])),
            training_loss_shared_draws=SharedDrawsLoss.from_json(data.get("training_loss_shared_draws", {})),
            random_permutation_control=PermutationControl.from_json(data["random_permutation_control"]),
            baseline_comparison=BaselineComparison.from_json(baseline) if available else None,
            reliability=AlignmentReliability.from_json(data.get("reliability", {})),
            baseline_unavailable_reason=str(baseline.get("reason", NO_PER_SEED_VALUES)),
        )


# ----------------------------------------------------------------------------- the statistics
def proposal_statistics(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
) -> ProposalStatistics:
    """The proposal `scores` make, judged against `gradient_rms` (both (N,))."""
    q = proposal_distribution(scores, alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power)
    ratio = float(information_to_baseline_ratio(gradient_rms, q))
    oracle = oracle_ratio(gradient_rms)
    return ProposalStatistics(
        information_to_baseline_ratio=ratio,
        oracle_ratio=oracle,
        fraction_of_oracle_gain=float((1.0 - ratio) / (1.0 - oracle)) if oracle < 1.0 else float("nan"),
        alpha=float(alpha),
        percentile_epsilon=float(percentile_epsilon),
        proposal_power=float(proposal_power),
        max_to_min_probability=float(q.max() / q.min()),
    )


def ratio_bootstrap(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
    resamples: int = 2000,
    seed: int = 0,
) -> Tuple[float, Tuple[float, float]]:
    """The SD and 95% percentile interval of the proposal's second-moment ratio over `resamples`
    resamples of the N anchors with replacement (seeded), the proposal rebuilt from each resample's
    scores as the audit builds it. This is the prediction's error from auditing N anchors of the
    dataset; the noise of each anchor's gradient RMS over its seeds is not in it.

    scores, gradient_rms: shape (N,), N >= 2."""
    ratios = two_level_ratios(  # the anchor level alone (no per-seed values), on this prediction's own stream
        scores,
        gradient_rms,
        None,
        alpha=alpha,
        percentile_epsilon=percentile_epsilon,
        proposal_power=proposal_power,
        resamples=resamples,
        seed=seed,
        stream="prediction-bootstrap",
    )
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(ratios.std(ddof=1)), (float(low), float(high))


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
) -> PermutationControl:
    """Permute the scores (seeded), all permutations at once: one-sided p-values
    (1 + #{rho_perm >= rho_obs}) / (P + 1) and (1 + #{ratio_perm <= ratio_obs}) / (P + 1).
    With keep_null_distributions, the permuted statistics are kept too (for plots)."""
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
    return PermutationControl(
        permutation_count=int(permutation_count),
        permutation_seed=int(permutation_seed),
        observed_spearman=rho_obs,
        observed_second_moment_ratio=ratio_obs,
        one_sided_pvalue_rho_at_least_observed=float(
            (1 + np.sum(rho_perm >= rho_obs - 1e-12)) / (permutation_count + 1)
        ),
        one_sided_pvalue_second_moment_at_most_observed=float(
            (1 + np.sum(ratio_perm <= ratio_obs + 1e-12)) / (permutation_count + 1)
        ),
        null_spearman_quantiles=tuple(np.quantile(rho_perm, [0.01, 0.5, 0.99]).tolist()),
        null_second_moment_quantiles=tuple(np.quantile(ratio_perm, [0.01, 0.5, 0.99]).tolist()),
        null_spearman=rho_perm if keep_null_distributions else None,
        null_second_moment=ratio_perm if keep_null_distributions else None,
    )


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
) -> Alignment:
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
    sd, interval = ratio_bootstrap(scores, gradient_rms, **kwargs, seed=bootstrap_seed)
    proposal = dataclasses.replace(
        proposal_statistics(scores, gradient_rms, **kwargs), ratio_bootstrap_sd=sd, ratio_interval=interval
    )
    baseline: Optional[BaselineComparison] = None
    if per_seed_gradient_rms is not None and per_seed_losses is not None and np.shape(per_seed_gradient_rms)[0] >= 4:
        baseline = cross_fitted_baseline(
            scores, per_seed_gradient_rms, per_seed_losses, **kwargs, bootstrap_seed=bootstrap_seed
        )
        attainable, residual = baseline.attainable_oracle_ratio, baseline.residual.second_moment_ratio
        proposal = dataclasses.replace(
            proposal,
            attainable_oracle_ratio=attainable,
            fraction_of_attainable_oracle_gain=(
                float((1.0 - residual) / (1.0 - attainable)) if attainable < 1.0 else float("nan")
            ),
        )
    return Alignment(
        spearman_residual_vs_gradient_rms=float(rho.statistic),
        spearman_residual_vs_gradient_rms_pvalue_asymptotic=float(rho.pvalue),
        kendall_residual_vs_gradient_rms=float(tau.statistic),
        kendall_residual_vs_gradient_rms_pvalue_asymptotic=float(tau.pvalue),
        top25_overlap=top_overlap(scores, gradient_rms),
        proposal=proposal,
        raw_score_proposal=proposal_statistics(
            scores, gradient_rms, alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=1.0
        ),
        training_loss_shared_draws=SharedDrawsLoss(
            spearman_vs_gradient_rms=float(spearmanr(mean_losses, gradient_rms).statistic),
            top25_overlap=top_overlap(mean_losses, gradient_rms),
            second_moment_ratio=proposal_statistics(mean_losses, gradient_rms, **kwargs).information_to_baseline_ratio,
        ),
        random_permutation_control=permutation_control(
            scores,
            gradient_rms,
            permutation_count=permutation_count,
            permutation_seed=permutation_seed,
            keep_null_distributions=keep_null_distributions,
            **kwargs,
        ),
        baseline_comparison=baseline,
        reliability=alignment_reliability(float(rho.statistic), score_reliability, gradient_reliability),
    )


def alignment_reliability(
    spearman: float, score_reliability: Optional[float], gradient_reliability: Optional[float]
) -> AlignmentReliability:
    """The observed correlation is bounded by the two measures' reliabilities (Spearman 1904)."""
    if not (score_reliability and gradient_reliability and score_reliability > 0 and gradient_reliability > 0):
        return AlignmentReliability(score_reliability, gradient_reliability)
    ceiling = float(np.sqrt(score_reliability * gradient_reliability))
    return AlignmentReliability(
        score_reliability,
        gradient_reliability,
        attenuation_corrected_spearman=float(np.clip(spearman / ceiling, -1.0, 1.0)),
        spearman_ceiling=ceiling,
    )


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
) -> BaselineComparison:
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

    resample = np.random.default_rng(bootstrap_seed).integers(0, n, size=(bootstrap, n))
    rows, boot_rho, boot_ratio = _fold_figures(scores, folds, ratio, resample)
    summary = {
        name: {"spearman": float(np.mean([r for r, _ in v])), "second_moment_ratio": float(np.mean([q for _, q in v]))}
        for name, v in rows.items()
    }
    rho_diff = summary["residual"]["spearman"] - summary["training_loss"]["spearman"]
    ratio_diff = summary["residual"]["second_moment_ratio"] - summary["training_loss"]["second_moment_ratio"]
    rho_ci = np.quantile(np.mean(boot_rho, axis=0), [0.025, 0.975])
    ratio_ci = np.quantile(np.mean(boot_ratio, axis=0), [0.025, 0.975])
    return BaselineComparison(
        seeds_per_half=half,
        residual=ScoreAlignment(**summary["residual"]),
        training_loss=ScoreAlignment(**summary["training_loss"]),
        training_loss_shared_draws=ScoreAlignment(**summary["training_loss_shared_draws"]),
        attainable_oracle_ratio=summary["oracle"]["second_moment_ratio"],
        spearman_difference=rho_diff,
        spearman_difference_ci95=(float(rho_ci[0]), float(rho_ci[1])),
        second_moment_ratio_difference=ratio_diff,
        second_moment_ratio_difference_ci95=(float(ratio_ci[0]), float(ratio_ci[1])),
        bootstrap_resamples=int(bootstrap),
        bootstrap_seed=int(bootstrap_seed),
        verdict=baseline_verdict(rho_ci, ratio_ci),
    )


def _fold_figures(
    scores: np.ndarray,
    folds: List[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    ratio: Callable[[np.ndarray, np.ndarray], np.ndarray],
    resample: np.ndarray,
) -> Tuple[Dict[str, List[Tuple[float, float]]], List[np.ndarray], List[np.ndarray]]:
    """Per fold (target gradient RMS, independent loss, shared-draws loss, the other half's RMS): each
    score's (Spearman, ratio), the oracle's ratio, and the bootstrap's residual-minus-loss differences
    on the same resamples of anchors (paired)."""
    rows: Dict[str, List[Tuple[float, float]]] = {
        "residual": [],
        "training_loss": [],
        "training_loss_shared_draws": [],
        "oracle": [],
    }
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
    return rows, boot_rho, boot_ratio


def baseline_verdict(rho_ci: np.ndarray, ratio_ci: np.ndarray) -> str:
    """ "beats" only when both differences (residual minus loss) are clear of zero in the score's
    favour -- higher Spearman, lower ratio; "loses" when either is clear of zero against it;
    otherwise "tie": the two are indistinguishable here."""
    if rho_ci[0] > 0 and ratio_ci[1] < 0:
        return "beats"
    if rho_ci[1] < 0 or ratio_ci[0] > 0:
        return "loses"
    return "tie"
