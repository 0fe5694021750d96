"""The gate's three-way verdict on the proposal's second-moment ratio: PASS, FAIL or UNDECIDED.

The audit predicts the ratio from N anchors, each anchor's gradient RMS averaged over S gradient
seeds: both are samples, so the prediction has an error, and comparing it with the threshold as if it
were exact turns a prediction 0.001 above 0.98 into a FAIL. The verdict compares an interval:

    PASS       the interval's upper end is below the threshold
    FAIL       its lower end is above it
    UNDECIDED  otherwise -- with the anchors a re-audit needs to decide it with 80% probability at
               the same ratio and spread (the interval narrows as 1 / sqrt(N), the re-audit's ratio
               falls within about SE = half-width / z of this one): N * ((z + z_0.8) SE / gap)^2,
               gap = |ratio - threshold|. The interval merely touching the threshold
               (N * (half-width / gap)^2, the figure before) decides half the time: a re-audit at that
               size decided 10-80% of the time in the review's simulations.

The interval is a two-level bootstrap: resample the anchors with replacement and, within each drawn
anchor, its gradient seeds with replacement (its RMS recomputed from the resampled seeds' squared
norms); the proposal is rebuilt from each resample's scores as the audit builds it. Without per-seed
values (an artifact that does not record them) it is the anchors' level alone, and says so.

A bootstrap resamples only the anchors it drew. Where gradient second moments are heavy-tailed an
audit usually misses the heaviest anchors, reads the ratio high (LN(0, 2), 64 anchors: +0.4-0.7 SD)
and its bootstrap cannot know (coverage 0.64, a proposal below the threshold FAILed 0.18-0.23 of the
time at half an SD). So the interval's lower end is also the tail model's: the anchors' (second
moment, score) pairs fitted as bivariate log-normal, the ratio's deviation from the fitted
population's at this many anchors simulated (tail_deviations), and the lower of the two bounds kept.
Only FAIL gets harder (wrong PASS cannot rise); on LN(0, 2) the wrong FAIL falls to 0.02, on LN(0, 1)
it costs some right FAILs with few seeds, and a rare heavy tail that is not log-normal stays the
documented limit (tests/test_gate_verdict.py).

Beside it, what the ratio must beat to pay for the scoring. A proposal with ratio r reaches uniform
sampling's variance in r of its samples; each sample costs C_train and carries its share of scoring
the dataset, C_score (scoring every anchor once, spread over the run's samples). It pays when
r (C_train + C_score) < C_train: r < r* = 1 / (1 + C_score / C_train) -- the same ratio with the
totals, scoring the dataset once against the training run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.audit.statistics import information_to_baseline_ratio, proposal_distribution
from vlaeval.choices import Verdict
from vlaeval.records import JsonRecord

RESAMPLE_CHUNK = 64  # bootstrap resamples drawn at once (bounds the (chunk, N, S) seed draws)
TAIL_POPULATION = 50_000  # the fitted log-normal population's draw (its ratio, the model's truth)
ANCHORS_NEEDED_POWER = (
    0.8  # the probability that a re-audit at "anchors needed" decides, at the audit's ratio and spread
)


def two_level_ratios(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    per_seed_rms: Optional[np.ndarray],
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
    resamples: int,
    seed: int,
    stream: str = "gate-verdict-bootstrap",
) -> np.ndarray:
    """`resamples` bootstrap replicates of the second-moment ratio: anchors resampled, and the
    gradient seeds within each drawn anchor (per_seed_rms: (S, N); None: anchors only). `stream`
    names the random stream (with `seed`): each caller its own, the same draws in any process."""
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.size
    rng = np.random.default_rng(stable_seed(stream, int(seed)))
    squares = None if per_seed_rms is None else np.asarray(per_seed_rms, dtype=np.float64).T ** 2  # (N, S)
    out = np.empty(int(resamples))
    for start in range(0, int(resamples), RESAMPLE_CHUNK):
        b = min(RESAMPLE_CHUNK, int(resamples) - start)
        index = rng.integers(0, n, size=(b, n))
        if squares is None:
            rms = np.asarray(gradient_rms, dtype=np.float64)[index]
        else:
            s = squares.shape[1]
            seeds = rng.integers(0, s, size=(b, n, s))
            rms = np.sqrt(np.take_along_axis(squares[index], seeds, axis=2).mean(axis=2))
        q = proposal_distribution(
            scores[index], alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power
        )
        out[start : start + b] = information_to_baseline_ratio(rms, q)
    return out


def tail_deviations(
    scores: np.ndarray,
    gradient_rms: np.ndarray,
    *,
    alpha: float,
    percentile_epsilon: float,
    proposal_power: float,
    resamples: int,
    seed: int,
) -> Optional[np.ndarray]:
    """How far an audit of these many anchors reads the ratio from the truth when the anchors' (second
    moment, score) pairs are bivariate log-normal as fitted to this audit's: `resamples` parametric
    audits' ratios minus the fitted population's (a 50,000-anchor draw). The bootstrap only resamples
    anchors it drew, so where second moments are heavy-tailed (LN(0, 2): the review's +0.4-0.7 SD bias,
    wrong FAIL 0.18-0.23 at half an SD) it cannot see the heavier anchors a sample usually misses; the
    model can. None where fewer than 3 anchors have a positive second moment and score."""
    rms = np.asarray(gradient_rms, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    positive = (rms > 0) & (scores > 0)
    if np.count_nonzero(positive) < 3:
        return None
    logs = np.stack([np.log(rms[positive] ** 2), np.log(scores[positive])])
    mean, covariance = logs.mean(axis=1), np.cov(logs)
    rng = np.random.default_rng(stable_seed("gate-verdict-tail", int(seed)))

    def ratios(draws: np.ndarray) -> np.ndarray:
        q = proposal_distribution(
            np.exp(draws[..., 1]), alpha=alpha, percentile_epsilon=percentile_epsilon, proposal_power=proposal_power
        )
        return np.asarray(information_to_baseline_ratio(np.exp(0.5 * draws[..., 0]), q))

    population = float(ratios(rng.multivariate_normal(mean, covariance, TAIL_POPULATION)))
    audits = [
        ratios(rng.multivariate_normal(mean, covariance, (min(RESAMPLE_CHUNK, int(resamples) - start), scores.size)))
        for start in range(0, int(resamples), RESAMPLE_CHUNK)
    ]
    return np.concatenate(audits) - population


def break_even_ratio(scoring_cost: float, training_cost: float) -> float:
    """r* = 1 / (1 + C_score / C_train), from the totals (in one unit: counted GFLOP): scoring every
    anchor of the dataset once against the training run it would sample for."""
    return 1.0 / (1.0 + scoring_cost / training_cost)


@dataclass(frozen=True)
class RatioVerdict(JsonRecord):
    """The three-way verdict on the ratio (see the module docstring), and its cost-aware companion."""

    verdict: str  # PASS | FAIL | UNDECIDED
    threshold: float
    ratio: float
    low: float
    high: float
    level: float
    sd: float
    resamples: int
    anchors: int
    gradient_seeds: int  # seeds resampled within each anchor (0: anchors only)
    anchors_needed: Optional[int] = None  # UNDECIDED: anchors at which a re-audit decides with 80% probability
    # The log-normal tail model's lower bound (tail_deviations); `low` is the lower of it and the bootstrap's.
    tail_low: Optional[float] = None
    break_even_ratio: Optional[float] = None  # r*; None: a cost unknown
    # Counted work, not the clock (a clock measures the machine and what else it ran): every anchor of
    # the dataset scored once, and the training run the proposal would sample for (the train section).
    scoring_gflop: Optional[float] = None
    training_gflop: Optional[float] = None
    pays_for_its_scoring: Optional[bool] = None  # the interval's upper end below r*
    # The smallest training run (GFLOP) in which the interval's upper end would pay for the scoring:
    # r* > high <=> C_train > C_score * high / (1 - high); None where no run pays (high >= 1).
    training_gflop_to_pay: Optional[float] = None

    @property
    def exit_code_key(self) -> str:
        return {Verdict.PASS.value: "pass", Verdict.FAIL.value: "fail"}.get(self.verdict, "undecided")


def ratio_verdict(
    ratio: float,
    replicates: np.ndarray,
    *,
    threshold: float,
    level: float,
    anchors: int,
    gradient_seeds: int,
    scoring_gflop: Optional[float] = None,
    training_gflop: Optional[float] = None,
    deviations: Optional[np.ndarray] = None,
) -> RatioVerdict:
    """The verdict on `ratio` from its bootstrap `replicates` (percentile interval at `level`), its
    lower end also the tail model's, ratio minus the upper quantile of `deviations` (tail_deviations)
    where given: a FAIL needs both to clear the threshold."""
    tail = (1.0 - float(level)) / 2.0
    low, high = (float(x) for x in np.quantile(replicates, [tail, 1.0 - tail]))
    tail_low = None if deviations is None else float(ratio) - float(np.quantile(deviations, 1.0 - tail))
    if tail_low is not None:
        low = min(low, tail_low)
    if high < threshold:
        verdict = Verdict.PASS
    elif low > threshold:
        verdict = Verdict.FAIL
    else:
        verdict = Verdict.UNDECIDED
    needed = None
    gap = abs(float(ratio) - float(threshold))
    if verdict == Verdict.UNDECIDED and gap > 0:
        z = float(NormalDist().inv_cdf(1.0 - tail))
        se = (high - low) / 2.0 / z
        needed = int(math.ceil(anchors * ((z + NormalDist().inv_cdf(ANCHORS_NEEDED_POWER)) * se / gap) ** 2))
    r_star = None
    if scoring_gflop is not None and training_gflop:
        r_star = break_even_ratio(float(scoring_gflop), float(training_gflop))
    return RatioVerdict(
        verdict=verdict.value,
        threshold=float(threshold),
        ratio=float(ratio),
        low=low,
        high=high,
        level=float(level),
        sd=float(np.std(replicates, ddof=1)),
        resamples=int(np.size(replicates)),
        anchors=int(anchors),
        gradient_seeds=int(gradient_seeds),
        anchors_needed=needed,
        tail_low=tail_low,
        break_even_ratio=r_star,
        scoring_gflop=scoring_gflop,
        training_gflop=training_gflop,
        pays_for_its_scoring=None if r_star is None else bool(high < r_star),
        training_gflop_to_pay=None
        if scoring_gflop is None or high >= 1.0
        else float(scoring_gflop) * high / (1.0 - high),
    )
