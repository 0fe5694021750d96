"""Anytime-valid sequential tests for paired, clustered non-inferiority comparisons."""

from vlaeval.seqtest.eprocess import BET_RULES, log_wealth_paths, size_adaptive_cap
from vlaeval.seqtest.group_sequential import GroupSequentialTest, obf_spending, one_sided_boundaries
from vlaeval.seqtest.modes import make_sequential_test
from vlaeval.seqtest.order_free import OrderFreeTest
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
    MODE_GROUP_SEQUENTIAL,
    MODES,
    NOT_CATASTROPHIC,
    AsymptoticSequentialTest,
    PairedSequentialTest,
    catastrophic_message,
    on_grid,
    planned_looks_of,
)
from vlaeval.seqtest.units import cluster_means, cluster_offsets, drift_diagnostic, plan_batches

__all__ = [
    "AsymptoticSequentialTest",
    "BET_RULES",
    "DEFAULT_BET_CAP",
    "DEFAULT_BET_RULE",
    "ESTIMANDS",
    "GroupSequentialTest",
    "MODES",
    "MODE_ASYMPTOTIC",
    "MODE_EXACT",
    "MODE_GROUP_SEQUENTIAL",
    "CATASTROPHIC",
    "CATASTROPHIC_UNDECIDED",
    "DECISION_INSUFFICIENT",
    "DECISION_PASS",
    "DECISION_REGRESSION",
    "NOT_CATASTROPHIC",
    "OrderFreeTest",
    "PairedSequentialTest",
    "catastrophic_message",
    "cluster_means",
    "cluster_offsets",
    "drift_diagnostic",
    "log_wealth_paths",
    "make_sequential_test",
    "obf_spending",
    "on_grid",
    "one_sided_boundaries",
    "plan_batches",
    "planned_looks_of",
    "size_adaptive_cap",
]
