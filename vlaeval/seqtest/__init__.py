"""Anytime-valid sequential tests for paired, clustered non-inferiority comparisons."""

from vlaeval.seqtest.eprocess import BET_RULES, log_wealth_paths
from vlaeval.seqtest.sequential import (
    CATASTROPHIC,
    CATASTROPHIC_UNDECIDED,
    DECISION_INSUFFICIENT,
    DECISION_PASS,
    DECISION_REGRESSION,
    NOT_CATASTROPHIC,
    PairedSequentialTest,
)
from vlaeval.seqtest.units import cluster_means, cluster_offsets, plan_batches

__all__ = [
    "BET_RULES",
    "CATASTROPHIC",
    "CATASTROPHIC_UNDECIDED",
    "DECISION_INSUFFICIENT",
    "DECISION_PASS",
    "DECISION_REGRESSION",
    "NOT_CATASTROPHIC",
    "PairedSequentialTest",
    "cluster_means",
    "cluster_offsets",
    "log_wealth_paths",
    "plan_batches",
]
