"""The test for each `gauntlet.test_mode` (its own module so that the modes, which build on the
exact test's machinery in `sequential.py`, do not import each other in a cycle)."""

from __future__ import annotations

from typing import Any

from vlaeval.seqtest.group_sequential import GroupSequentialTest
from vlaeval.seqtest.sequential import (
    MODE_ASYMPTOTIC,
    MODE_EXACT,
    MODE_GROUP_SEQUENTIAL,
    MODES,
    AsymptoticSequentialTest,
    PairedSequentialTest,
    SequentialTest,
)


def make_sequential_test(mode: str, delta: float, alpha: float, **kwargs: Any) -> SequentialTest:
    """The test for `mode`; keywords that belong to another mode are dropped (bet_rule/bet_cap:
    exact; burn_in_clusters: the approximate modes; tuning_clusters: asymptotic; planned_looks:
    group_sequential)."""
    own = {
        MODE_EXACT: (PairedSequentialTest, ("bet_rule", "bet_cap")),
        MODE_ASYMPTOTIC: (AsymptoticSequentialTest, ("burn_in_clusters", "tuning_clusters")),
        MODE_GROUP_SEQUENTIAL: (GroupSequentialTest, ("planned_looks", "burn_in_clusters")),
    }
    if mode not in own:
        raise ValueError(f"unknown test mode {mode!r}; use one of {MODES}")
    cls, keys = own[mode]
    foreign = {k for _, other in own.values() for k in other} - set(keys)
    return cls(delta, alpha, **{k: v for k, v in kwargs.items() if k not in foreign})
