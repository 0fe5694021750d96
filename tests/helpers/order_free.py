"""The order-free test's shared pieces for its tests: the level, the margin, the bound a valid error
rate may show, heterogeneous files at the margin, and one file's decision."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vlaeval.seqtest.order_free import OrderFreeTest
from vlaeval.seqtest.state import DEFAULT_ORDERS, OrderFreeSettings, TestSettings

ALPHA, DELTA = 0.05, 0.02


def allowed(reps: int, level: float = ALPHA) -> float:
    """The most a valid test's error rate may show over `reps` runs: level + 2.33 standard errors."""
    return level + 2.33 * math.sqrt(level * (1 - level) / reps)


def heterogeneous_means(rng: np.random.Generator, reps: int, scenes: int, delta: float, size: int = 8) -> np.ndarray:
    """(reps, scenes) cluster means: scene base rates U(0.35, 0.85), the candidate's effect delta +- 0.10
    per scene (so any one file is off by chance), paired units (10% of candidate units drawn afresh)."""
    p = rng.uniform(0.35, 0.85, (reps, scenes, 1))
    effect = delta + 0.10 * rng.choice([-1.0, 1.0], (reps, scenes, 1))
    u = rng.random((reps, scenes, size))
    fresh = np.where(rng.random(u.shape) < 0.1, rng.random(u.shape), u)
    return ((fresh < p + effect).astype(float) - (u < p)).mean(axis=2)


def decide(
    x: np.ndarray, sizes: np.ndarray, delta: float = DELTA, *, orders: int = DEFAULT_ORDERS, **common: Any
) -> str:
    """The order-free test's decision on one file; `common`: TestSettings' fields."""
    return (
        OrderFreeTest(TestSettings(delta, ALPHA, **common), OrderFreeSettings(orders=orders)).update(x, sizes).decision
    )
