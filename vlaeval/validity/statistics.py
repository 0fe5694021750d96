"""Does an offline number rank checkpoints the way closed-loop success does? Pure statistics.

Given C checkpoints of one policy family, an offline metric per checkpoint (oriented so that higher
predicts more success: a loss enters negated) and each checkpoint's success on the same E paired
episodes, three agreements:

    Pearson    the linear correlation of metric and success rate
    Spearman   the rank correlation (ties averaged)
    MMRV       SimplerEnv's mean maximum rank violation: for each checkpoint i, the largest success
               gap |R_i - R_j| over the checkpoints j the metric orders the other way round
               ((S_i < S_j) != (R_i < R_j)); averaged over i. 0 is a perfect ranking; it is in
               success-rate units, so it reads as "choosing by the metric costs up to this much".

Each with a two-level bootstrap interval: the checkpoints resampled with replacement (the question
is about checkpoints like these, not these 40), and the episodes resampled within each task, the
same draw for every checkpoint (they are paired: the same scenes and seeds), so an interval carries
the success rates' own episode noise. The offline metric is taken as measured: its draws are fixed
and shared by every checkpoint, so its noise is common to all and small beside the episodes'.

What each estimates. Pearson, Spearman and MMRV read *measured* success, on this many episodes a
checkpoint: episode noise attenuates a correlation (48 checkpoints, 6 tasks x 5 episodes, a metric
correlating 0.9 with true success: the Pearson interval held the true-success correlation 17% of the
time). The correlation with *true* success is `pearson_true_success`: Pearson over the square root of
the success rates' split-half reliability (Spearman's correction for attenuation; the metric taken as
exact), its interval a bootstrap over checkpoints of that same ratio, each replicate's reliability
from its own checkpoints' odd and even episodes (resampling episodes too would add their noise twice:
the correction already carries it). MMRV's replicates resample the episodes too, and more episode
noise means more rank violations: the percentile interval sat above the measured MMRV and held it
0.835 of the time in the review (25 episodes a task); it is shifted down by the replicates' excess over
the estimate, which holds it 0.945 (tests/test_offline_validity_coverage.py: 0.88 before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import rankdata

from vlaeval.artifacts import stable_seed
from vlaeval.errors import require
from vlaeval.records import JsonRecord

# Below this many checkpoints no metric is said to validate: a bootstrap over 4 checkpoints draws from
# 35 distinct sets, and its percentiles say more about ties than about the metric.
MIN_CHECKPOINTS = 10
RESAMPLE_CHUNK = 256  # bootstrap replicates computed at once (bounds the (chunk, C, C) MMRV arrays)


def pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r along the last axis, row by row (nan where a row of x or y is constant)."""
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (x * y).sum(axis=-1) / np.where(denominator > 0, denominator, 1.0), np.nan)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis (Pearson of the average ranks), row by row."""
    return pearson_rows(rankdata(x, axis=-1), rankdata(y, axis=-1))


def mmrv_rows(metric: np.ndarray, success: np.ndarray) -> np.ndarray:
    """Mean maximum rank violation along the last axis, row by row (SimplerEnv's definition)."""
    metric, success = np.atleast_2d(metric), np.atleast_2d(success)
    disagree = (metric[..., :, None] < metric[..., None, :]) != (success[..., :, None] < success[..., None, :])
    violation = np.abs(success[..., :, None] - success[..., None, :]) * disagree
    return violation.max(axis=-1).mean(axis=-1)


@dataclass(frozen=True)
class Agreement(JsonRecord):
    """One offline metric against closed-loop success over the checkpoints, on one scope (a task,
    or all tasks pooled): each agreement with its bootstrap interval at `level`; `validates` when
    Spearman's interval lies above 0 (the metric ranks checkpoints better than chance) over at least
    MIN_CHECKPOINTS checkpoints."""

    metric: str
    scope: str
    checkpoints: int
    pearson: float
    pearson_interval: Tuple[float, float]
    spearman: float
    spearman_interval: Tuple[float, float]
    mmrv: float
    mmrv_interval: Tuple[float, float]
    mmrv_unrelated: float
    # Pearson with true success (corrected for the episodes' attenuation, clipped to [-1, 1]); None
    # where the success rates' split-half reliability is not positive (nothing to correct by)
    pearson_true_success: Optional[float]
    pearson_true_success_interval: Optional[
        Tuple[float, float]
    ]  # the MMRV of the metric shuffled over the checkpoints (mean over permutations)
    level: float
    validates: bool


@dataclass(frozen=True)
class SuccessReliability(JsonRecord):
    """How well the success rates repeat across episodes: the split-half correlation of odd against
    even episodes over the checkpoints, Spearman-Brown corrected -- a correlation with success that
    this many episodes can show is at most about sqrt(reliability)."""

    scope: str
    episodes: int
    split_half: float
    reliability: float


def _check(metric: np.ndarray, successes: np.ndarray, episode_task: np.ndarray) -> None:
    require(metric.ndim == 1 and metric.size >= 3, f"an agreement needs >= 3 checkpoints, got {metric.size}")
    require(
        successes.shape[0] == metric.size and successes.ndim == 2,
        f"successes must be (checkpoints={metric.size}, episodes), got {successes.shape}",
    )
    require(episode_task.shape == (successes.shape[1],), "episode_task must give each episode's task")
    require(bool(np.isfinite(metric).all()), "an offline metric must be finite for every checkpoint")


def _interval(values: np.ndarray, level: float) -> Tuple[float, float]:
    """The percentile interval of the replicates. A correlation is undefined on a replicate whose
    success rates (or metric values) all tie: it counts as 0, no evidence of a ranking -- dropping it
    would keep only the replicates that drew the few checkpoints that ever succeed (a metric unrelated
    to success then validated 21% of the time where one checkpoint of 12 succeeds)."""
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(np.nan_to_num(values, nan=0.0), [tail, 100 - tail])
    return (float(low), float(high))


def resampled_episodes(rng: np.random.Generator, episode_task: np.ndarray, count: int) -> np.ndarray:
    """(count, E) episode indices drawn with replacement within each task (the task mix kept)."""
    out = np.empty((count, episode_task.size), dtype=np.int64)
    for task in np.unique(episode_task):
        members = np.flatnonzero(episode_task == task)
        out[:, members] = members[rng.integers(0, members.size, size=(count, members.size))]
    return out


def agreement(
    metric_name: str,
    scope: str,
    metric: ArrayLike,
    successes: ArrayLike,
    episode_task: ArrayLike,
    *,
    level: float,
    resamples: int,
    seed: int,
) -> Agreement:
    """`metric` (C,), oriented so that higher predicts success, against `successes` (C, E) of 0/1 on
    the same E episodes (`episode_task` (E,): each episode's task, for the stratified resampling)."""
    x = np.asarray(metric, dtype=np.float64)
    s = np.asarray(successes, dtype=np.float64)
    tasks = np.asarray(episode_task)
    _check(x, s, tasks)
    require(0.5 < level < 1.0, f"level={level} must be in (0.5, 1)")
    rates = s.mean(axis=1)
    rng = np.random.default_rng(stable_seed("offline-validity-bootstrap", metric_name, scope, int(seed)))
    c = x.size
    pearson_b, spearman_b, mmrv_b = (np.empty(int(resamples)) for _ in range(3))
    for start in range(0, int(resamples), RESAMPLE_CHUNK):
        b = min(RESAMPLE_CHUNK, int(resamples) - start)
        pick = rng.integers(0, c, size=(b, c))
        episodes = resampled_episodes(rng, tasks, b)
        rows = np.take_along_axis(s[pick], episodes[:, None, :], axis=2).mean(axis=2)  # (b, C)
        values = x[pick]
        pearson_b[start : start + b] = pearson_rows(values, rows)
        spearman_b[start : start + b] = spearman_rows(values, rows)
        mmrv_b[start : start + b] = mmrv_rows(values, rows)
    spearman = float(spearman_rows(x, rates))
    spearman_interval = _interval(spearman_b, level)
    shuffled = np.stack([x[rng.permutation(c)] for _ in range(200)])
    mmrv = float(mmrv_rows(x, rates)[0])
    excess = float(np.mean(mmrv_b)) - mmrv  # the resampled episodes' added noise adds rank violations
    mmrv_low, mmrv_high = _interval(mmrv_b, level)
    true_success, true_interval = _disattenuated(x, s, tasks, level=level, resamples=int(resamples), rng=rng)
    return Agreement(
        metric=metric_name,
        scope=scope,
        checkpoints=c,
        pearson=float(pearson_rows(x, rates)),
        pearson_interval=_interval(pearson_b, level),
        spearman=spearman,
        spearman_interval=spearman_interval,
        mmrv=mmrv,
        mmrv_interval=(max(mmrv_low - excess, 0.0), max(mmrv_high - excess, 0.0)),
        mmrv_unrelated=float(mmrv_rows(shuffled, np.broadcast_to(rates, shuffled.shape)).mean()),
        level=float(level),
        validates=bool(spearman_interval[0] > 0 and c >= MIN_CHECKPOINTS),
        pearson_true_success=true_success,
        pearson_true_success_interval=true_interval,
    )


def _odd_even(successes: np.ndarray, episode_task: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Each checkpoint's success rate on its odd and on its even episodes within each task, (C,) each."""
    halves = np.zeros(episode_task.size, dtype=bool)
    for task in np.unique(episode_task):
        halves[np.flatnonzero(episode_task == task)[1::2]] = True
    return successes[:, ~halves].mean(axis=1), successes[:, halves].mean(axis=1)


def _corrected(metric: np.ndarray, odd: np.ndarray, even: np.ndarray) -> np.ndarray:
    """Pearson with the success rate over sqrt(Spearman-Brown reliability), row by row; nan where the
    reliability is not positive. Clipped to [-1, 1] (the corrected estimate can pass it; the truth cannot)."""
    reliability = _spearman_brown(pearson_rows(odd, even))
    observed = pearson_rows(metric, (odd + even) / 2.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(reliability > 0, np.clip(observed / np.sqrt(reliability), -1.0, 1.0), np.nan)


def _spearman_brown(split: np.ndarray) -> np.ndarray:
    """The full-length reliability 2 r / (1 + r) from split-half correlations r (nan where r <= -1 or nan)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(split > -1, 2.0 * split / (1.0 + split), np.nan)


def _disattenuated(
    metric: np.ndarray,
    successes: np.ndarray,
    tasks: np.ndarray,
    *,
    level: float,
    resamples: int,
    rng: np.random.Generator,
) -> Tuple[Optional[float], Optional[Tuple[float, float]]]:
    """Pearson with true success and its bootstrap-over-checkpoints interval (see the module docstring)."""
    odd, even = _odd_even(successes, tasks)
    estimate = float(_corrected(metric, odd, even))
    if not np.isfinite(estimate):
        return None, None
    pick = rng.integers(0, metric.size, size=(resamples, metric.size))
    replicates = _corrected(metric[pick], odd[pick], even[pick])
    tail = 100 * (1 - level) / 2
    # A replicate without positive reliability says nothing of the correlation: it is left out (unlike
    # the plain correlations' ties, it is not evidence of no ranking).
    low, high = np.percentile(replicates[np.isfinite(replicates)], [tail, 100 - tail])
    return estimate, (float(low), float(high))


def success_reliability(scope: str, successes: ArrayLike, episode_task: ArrayLike) -> SuccessReliability:
    """Odd against even episodes within each task (C, E) -> their correlation over checkpoints."""
    tasks = np.asarray(episode_task)
    split = float(pearson_rows(*_odd_even(np.asarray(successes, dtype=np.float64), tasks)))
    reliability = float(_spearman_brown(np.asarray(split)))
    return SuccessReliability(scope=scope, episodes=int(tasks.size), split_half=split, reliability=reliability)


def oriented(values: ArrayLike, lower_is_better: bool) -> np.ndarray:
    """A metric as the agreements read it: higher predicts success (a loss negated)."""
    x = np.asarray(values, dtype=np.float64)
    return -x if lower_is_better else x
