"""Betting e-processes for the mean of bounded observations in [-1, 1] (pure array functions).

For a margin m, two one-sided capital processes (Waudby-Smith & Ramdas 2024, "Estimating means
of bounded random variables by betting"):

    upper side, H0: mean <= m   K_t = prod_i (1 + lam_i * (x_i - m))   bets that mean > m
    lower side, H0: mean >= m   K_t = prod_i (1 - lam_i * (x_i - m))   bets that mean < m

Each bet lam_i >= 0 is predictable (a function of x_1..x_{i-1} only) and capped at
c / (1 + m) (upper side) or c / (1 - m) (lower side), c in (0, 1], so every factor stays
non-negative for any x in [-1, 1]. Under H0 the process is a non-negative supermartingale, so by
Ville's inequality P(sup_t K_t >= 1/alpha) <= alpha: a decision may be taken at any stopping
time, including after every observation.

Everything here is vectorised over observations (prefix sums give every predictable bet at once)
and over margins (leading axis), so a whole grid of margins -- a confidence sequence -- costs one
array expression per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

import numpy as np

UPPER = "upper"  # bets that the mean exceeds the margin (PASS side at m = -delta)
LOWER = "lower"  # bets that the mean falls below the margin (REGRESSION side at m = -delta)

# Plug-in moments are shrunk towards a prior of one pseudo-observation with mean 0 (no
# difference between the policies) and this variance, so the first bets are small.
PRIOR_VARIANCE = 0.25

BET_RULES = ("agrapa", "prpl")


@dataclass
class MomentState:
    """Sufficient statistics of the observations seen so far (shared by every margin)."""

    count: float = 0.0
    total: float = 0.0
    total_sq: float = 0.0

    def advanced(self, x: np.ndarray) -> "MomentState":
        return MomentState(
            self.count + x.size, self.total + float(x.sum()), self.total_sq + float(np.dot(x, x))
        )


Moments = Tuple[np.ndarray, np.ndarray, np.ndarray]


def predictable_moments(x: np.ndarray, state: MomentState) -> Moments:
    """Shrunk mean, variance and count available *before* each element of x, along the last axis
    (x may carry leading replication axes; `state` describes what came before x)."""
    before = np.arange(x.shape[-1], dtype=np.float64) + state.count
    total = state.total + (np.cumsum(x, axis=-1) - x)  # exclusive prefix sums
    squares = x * x
    total_sq = state.total_sq + (np.cumsum(squares, axis=-1) - squares)
    mean = total / (before + 1.0)
    sum_sq_dev = np.maximum(total_sq - total**2 / np.maximum(before, 1.0), 0.0)
    variance = (PRIOR_VARIANCE + sum_sq_dev) / (before + 1.0)
    return mean, variance, before


def bet_caps(margins: np.ndarray, side: str, cap_fraction: float) -> np.ndarray:
    """Largest bet keeping every factor >= 1 - cap_fraction for x anywhere in [-1, 1]."""
    margins = np.asarray(margins, dtype=np.float64)
    return cap_fraction / (1.0 + margins) if side == UPPER else cap_fraction / (1.0 - margins)


def bets_from_moments(
    moments: Moments,
    margins: np.ndarray,
    side: str,
    *,
    rule: str,
    cap_fraction: float,
    alpha: float,
) -> np.ndarray:
    """Bets lam from the predictable moments; `margins` broadcasts against them (shape (G, 1)
    against (B,) gives one row of bets per margin).

    agrapa: the approximate growth-rate-optimal plug-in bet (mean - m) / (var + (mean - m)^2),
            zero when the past points the other way.
    prpl:   the predictable plug-in empirical-Bernstein bet sqrt(2 log(1/alpha) / (var t log(1+t))),
            always placed on the alternative's side.
    """
    mean, variance, before = moments
    margins = np.asarray(margins, dtype=np.float64)
    if rule == "agrapa":
        edge = (mean - margins) if side == UPPER else (margins - mean)
        raw = edge / (variance + edge * edge)
    elif rule == "prpl":
        t = before + 1.0
        raw = np.sqrt(2.0 * np.log(1.0 / alpha) / (variance * t * np.log1p(t))) + 0.0 * margins
    else:
        raise ValueError(f"unknown bet rule {rule!r}; use one of {BET_RULES}")
    return np.clip(raw, 0.0, bet_caps(margins, side, cap_fraction))


def predictable_bets(x: np.ndarray, state: MomentState, margins: np.ndarray, side: str, **rule: Any) -> np.ndarray:
    """Bets for observations x, each computed from the past only (see bets_from_moments)."""
    return bets_from_moments(predictable_moments(x, state), margins, side, **rule)


def log_wealth_increments(x: np.ndarray, margins: np.ndarray, side: str, bets: np.ndarray) -> np.ndarray:
    """log(1 +/- lam (x - m)); margins broadcast against x as in predictable_bets."""
    sign = 1.0 if side == UPPER else -1.0
    factor = 1.0 + sign * bets * (x - np.asarray(margins, dtype=np.float64))
    # Caps keep factor >= 1 - c > 0 for c < 1; with c = 1 a factor can reach exactly 0 (wealth 0).
    with np.errstate(divide="ignore"):
        return np.log(np.maximum(factor, 0.0))


@dataclass
class WealthFamily:
    """Running log-wealth of one side's e-processes over a fixed set of margins."""

    margins: np.ndarray
    side: str
    log_wealth: np.ndarray
    log_max_wealth: np.ndarray

    @classmethod
    def start(cls, margins: np.ndarray, side: str) -> "WealthFamily":
        margins = np.asarray(margins, dtype=np.float64)
        zeros = np.zeros(margins.shape, dtype=np.float64)
        return cls(margins, side, zeros, zeros.copy())

    def update(
        self,
        x: np.ndarray,
        moments: Moments,
        *,
        rule: str,
        cap_fraction: float,
        alpha: float,
        threshold_log: np.ndarray | float,
        active: np.ndarray | None = None,
    ) -> np.ndarray:
        """Advance by observations x (with their predictable moments); return, per margin, the
        index into x of the first crossing of its threshold (-1 where none). Only `active`
        margins are computed (the others keep their values): a margin already rejected stays
        rejected, so it needs no further work."""
        first_cross = np.full(self.margins.shape, -1, dtype=np.int64)
        index = np.arange(self.margins.size) if active is None else np.flatnonzero(active)
        if index.size == 0 or x.size == 0:
            return first_cross
        margins = self.margins[index, None]
        bets = bets_from_moments(moments, margins, self.side, rule=rule, cap_fraction=cap_fraction, alpha=alpha)
        path = np.cumsum(log_wealth_increments(x, margins, self.side, bets), axis=1)
        path += self.log_wealth[index, None]
        threshold = np.broadcast_to(np.asarray(threshold_log, dtype=np.float64), self.margins.shape)[index, None]
        crossed = path >= threshold
        any_cross = crossed.any(axis=1)
        first_cross[index[any_cross]] = crossed[any_cross].argmax(axis=1)
        self.log_max_wealth[index] = np.maximum(self.log_max_wealth[index], path.max(axis=1))
        self.log_wealth[index] = path[:, -1]
        return first_cross


def log_wealth_paths(
    x: np.ndarray,
    margin: float,
    side: str,
    *,
    rule: str = "agrapa",
    cap_fraction: float = 0.95,
    alpha: float = 0.05,
) -> np.ndarray:
    """Log-wealth after each observation for many independent sequences at once.

    x has shape (R, T) (R replications of T observations); returns shape (R, T). The same bets
    as WealthFamily, vectorised over replications, for the validity simulations.
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    bets = predictable_bets(x, MomentState(), np.float64(margin), side, rule=rule,
                            cap_fraction=cap_fraction, alpha=alpha)
    return np.cumsum(log_wealth_increments(x, margin, side, bets), axis=-1)
