"""How many checkpoints and episodes does job=offline_validity need to validate a metric that truly
ranks them? Its own test (Spearman's two-level bootstrap interval above 0, vlaeval/validity) run on
simulated checkpoints at the spread of success measured among the built-in state policy's checkpoints
trained equally long, a metric whose Spearman correlation with *true* success is 0.6, and each
checkpoint's success measured on a number of episodes (or averaged over training seeds: more episodes
of the same recipe).

    python benchmarks/validity_power.py [--replications 200]

Results in docs/figures/validity_power.md.
"""

from __future__ import annotations

import argparse
import math
from typing import List

import numpy as np
from scipy.stats import norm

from benchlib import markdown_table, rate, show, write_figures
from vlaeval.validity.statistics import agreement

TRUE_SPEARMAN = 0.6
# Success among the state policy's checkpoints of one training length (docs/figures/offline_validity.md:
# 12 checkpoints, learning rate x seed x arm x data, success about 0.35-0.65).
SUCCESS_MEAN, SUCCESS_SD = 0.5, 0.08
TASKS = 6
CHECKPOINTS = (12, 24, 48)
EPISODES_PER_TASK = (5, 20, 80)
# What a checkpoint costs on 2 cores: the state policy's 3,000-step training and one episode
# (docs/figures/builtin_policy_baseline.md, recipe_comparison.md's runs).
TRAIN_MINUTES, EPISODE_SECONDS = 0.5, 0.15


def power(checkpoints: int, episodes_per_task: int, replications: int, rng: np.random.Generator) -> dict:
    """The share of simulated studies in which the metric validates."""
    pearson = 2 * math.sin(math.pi * TRUE_SPEARMAN / 6)  # the Gaussian copula with that Spearman
    covariance = np.array([[1.0, pearson], [pearson, 1.0]])
    tasks = np.repeat(np.arange(TASKS), episodes_per_task)
    hits = 0
    for r in range(replications):
        latent = rng.multivariate_normal([0.0, 0.0], covariance, checkpoints)
        success = np.clip(SUCCESS_MEAN + SUCCESS_SD * latent[:, 0], 0.01, 0.99)
        metric = norm.cdf(latent[:, 1])
        outcomes = (rng.random((checkpoints, tasks.size)) < success[:, None]).astype(float)
        found = agreement("metric", "pooled", metric, outcomes, tasks, level=0.95, resamples=500, seed=r)
        hits += found.validates
    return rate(hits, replications)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replications", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows: List[List[str]] = []
    for checkpoints in CHECKPOINTS:
        for episodes in EPISODES_PER_TASK:
            found = power(checkpoints, episodes, args.replications, rng)
            minutes = checkpoints * (TRAIN_MINUTES + episodes * TASKS * EPISODE_SECONDS / 60)
            rows.append([str(checkpoints), str(episodes), show(found), f"{minutes:,.0f}"])
            print(rows[-1], flush=True)
    body = (
        f"Simulated studies: checkpoints whose true success is {SUCCESS_MEAN} + {SUCCESS_SD} x a standard normal (the "
        "spread among the built-in state policy's checkpoints of one training length), a metric whose Spearman "
        f"correlation with that true success is {TRUE_SPEARMAN} (a Gaussian copula), success measured on the episodes "
        f"per task given ({TASKS} tasks; averaging a recipe over training seeds is the same as more episodes of it, "
        "less the seeds' own spread). The test is job=offline_validity's: Spearman's two-level bootstrap interval "
        "(checkpoints, and episodes within each task) above 0 over at least 10 checkpoints. Power is the share of "
        f"{args.replications} studies that validate, with its 95% Clopper-Pearson interval. Cost: minutes on 2 cores "
        f"for the state policy ({TRAIN_MINUTES * 60:.0f} s to train a checkpoint, {EPISODE_SECONDS} s an episode)."
    )
    table = markdown_table(["checkpoints", "episodes per task", "power", "minutes (state policy)"], rows)
    write_figures(
        "validity_power",
        "Offline validity: checkpoints and episodes for 80% power",
        f"python benchmarks/validity_power.py --replications {args.replications}",
        f"{body}\n\n{table}",
    )


if __name__ == "__main__":
    main()
