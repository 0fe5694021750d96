"""The test for each `gauntlet.test_mode` (its own module so that the modes, which build on the
exact test's machinery in `sequential.py`, do not import each other in a cycle): the type of the
mode's settings picks the test."""

from __future__ import annotations

from vlaeval.seqtest.group_sequential import GroupSequentialTest
from vlaeval.seqtest.horizon import HorizonTest
from vlaeval.seqtest.order_free import OrderFreeTest
from vlaeval.seqtest.sequential import AsymptoticSequentialTest, PairedSequentialTest, SequentialTest
from vlaeval.seqtest.state import (
    AsymptoticSettings,
    ExactSettings,
    GroupSequentialSettings,
    HorizonSettings,
    ModeSettings,
    OrderFreeSettings,
    TestSettings,
)


def make_sequential_test(settings: TestSettings, mode: ModeSettings) -> SequentialTest:
    """The test `mode`'s settings are for: exact (ExactSettings), order-free exact on clusters that
    all exist (OrderFreeSettings), horizon (HorizonSettings), asymptotic (AsymptoticSettings) or group-sequential
    (GroupSequentialSettings)."""
    if isinstance(mode, OrderFreeSettings):
        return OrderFreeTest(settings, mode)
    if isinstance(mode, HorizonSettings):
        return HorizonTest(settings, mode)
    if isinstance(mode, ExactSettings):
        return PairedSequentialTest(settings, mode)
    if isinstance(mode, AsymptoticSettings):
        return AsymptoticSequentialTest(settings, mode)
    if isinstance(mode, GroupSequentialSettings):
        return GroupSequentialTest(settings, mode)
    raise TypeError(
        f"no sequential test takes {type(mode).__name__}; pass one of the settings in vlaeval.seqtest.state"
    )
