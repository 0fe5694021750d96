"""Offline validity's intervals cover what they name (issue 50, finding 7), on the review's design: 48
checkpoints, 6 tasks, a metric correlating 0.9 with true success, success measured on 5 or 25
episodes a task. `pearson_true_success` is the correlation with true success (the Pearson interval
on measured success held it 0.17 of the time in the review, here at most 0.75: the negative control);
the MMRV interval holds the MMRV of success measured on this many episodes (the percentile interval
held it 0.835 at 25 episodes a task, 0.85 here; shifted by the replicates' excess, >= 0.90)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from vlaeval.validity.statistics import agreement, mmrv_rows, pearson_rows

CHECKPOINTS, TASKS, REPETITIONS = 48, 6, 200


def draw(rng: np.random.Generator, checkpoints: int):
    """(metric, true success per task): a latent skill drives both; task difficulty shifts success."""
    skill = rng.normal(size=checkpoints)
    metric = 0.9 * skill + np.sqrt(1 - 0.81) * rng.normal(size=checkpoints)
    return metric, norm.cdf(0.8 * skill[:, None] + rng.normal(0.0, 0.5, TASKS)[None])


@pytest.mark.parametrize("episodes", [5, 25])
def test_offline_validity_intervals_cover_the_quantities_they_name(episodes):
    rng = np.random.default_rng([50, 7, episodes])
    tasks = np.repeat(np.arange(TASKS), episodes)
    metric, success = draw(rng, 200_000)
    true_correlation = float(pearson_rows(metric, success.mean(axis=1)))
    measured_mmrv = []  # the MMRV of success measured on `episodes` a task, over fresh checkpoints
    for _ in range(2000):
        metric, success = draw(rng, CHECKPOINTS)
        measured_mmrv.append(mmrv_rows(metric, (rng.random((CHECKPOINTS, tasks.size)) < success[:, tasks]).mean(1))[0])
    mmrv_estimand = float(np.mean(measured_mmrv))
    held = {"true": 0, "plain": 0, "mmrv": 0}
    for repetition in range(REPETITIONS):
        metric, success = draw(rng, CHECKPOINTS)
        outcomes = (rng.random((CHECKPOINTS, tasks.size)) < success[:, tasks]).astype(float)
        a = agreement("m", "pooled", metric, outcomes, tasks, level=0.95, resamples=400, seed=repetition)
        assert a.pearson_true_success is not None and a.pearson_true_success_interval is not None
        low, high = a.pearson_true_success_interval
        held["true"] += low <= true_correlation <= high
        held["plain"] += a.pearson_interval[0] <= true_correlation <= a.pearson_interval[1]
        held["mmrv"] += a.mmrv_interval[0] <= mmrv_estimand <= a.mmrv_interval[1]
    coverage = {k: v / REPETITIONS for k, v in held.items()}
    assert coverage["true"] >= 0.90, coverage
    assert coverage["mmrv"] >= 0.90, coverage
    if episodes == 5:
        assert coverage["plain"] <= 0.75, coverage  # measured success is not true success
