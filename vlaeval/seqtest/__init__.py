"""Anytime-valid sequential tests for paired, clustered non-inferiority comparisons."""

from vlaeval.seqtest.eprocess import BET_RULES, log_wealth_paths, size_adaptive_cap
from vlaeval.seqtest.sequential import (
    CATASTROPHIC,
    CATASTROPHIC_UNDECIDED,
    DECISION_INSUFFICIENT,
    DECISION_PASS,
    DECISION_REGRESSION,
    DEFAULT_BET_CAP,
    DEFAULT_BET_RULE,
    ESTIMANDS,
    MODE_ASYMPTOTIC,
    MODE_EXACT,
    MODES,
    NOT_CATASTROPHIC,
    AsymptoticSequentialTest,
    PairedSequentialTest,
    make_sequential_test,
)
from vlaeval.seqtest.units import cluster_means, cluster_offsets, plan_batches

__all__ = [
    "AsymptoticSequentialTest",
    "BET_RULES",
    "DEFAULT_BET_CAP",
    "DEFAULT_BET_RULE",
    "ESTIMANDS",
    "MODES",
    "MODE_ASYMPTOTIC",
    "MODE_EXACT",
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
    "make_sequential_test",
    "plan_batches",
    "size_adaptive_cap",
]
