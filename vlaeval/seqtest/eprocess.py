"""Betting e-processes for the mean of bounded observations in [-1, 1] (pure array functions).

For a margin m, two one-sided capital processes (Waudby-Smith & Ramdas 2024, "Estimating means
of bounded random variables by betting") on the payoffs y_i = s * w_i * (x_i - m):

    upper side (s = +1), H0: mean <= m   K_t = prod_i (1 + lam_i * y_i)   bets that mean > m
    lower side (s = -1), H0: mean >= m   K_t = prod_i (1 + lam_i * y_i)   bets that mean < m

w_i in (0, 1] is the observation's weight: 1 for the cluster-mean estimand; for the unit-weighted
estimand n_i / n_max, which arrives *with* cluster i (its size is part of the observation) and is
normalised by a constant n_max fixed before the stratum -- the largest cluster the scenario
distribution can produce, declared, never the largest cluster of the outcomes being tested. Then
w_i (x_i - m) lies in the range the cap assumes, and its conditional mean is <= 0 under the
unit-weighted H0 (E[n (x - m)] <= 0), which is all the supermartingale needs. A normaliser read off
the data is not a constant: a file lacking the rare large clusters gets every weight 1 and tests
the wrong mean. Each bet lam_i >= 0 is
predictable (a function of the past only) and capped at c / (1 + m) (upper side) or c / (1 - m)
(lower side), c in (0, 1], so every factor stays >= 1 - c for any x in [-1, 1]. Under H0 the
process is a non-negative supermartingale, so by Ville's inequality P(sup_t K_t >= 1/alpha) <=
alpha: a decision may be taken at any stopping time, including after every observation.

Bet rules (all predictable; validity never depends on which):
  agrapa  approximate growth-rate-optimal plug-in  edge / (var + edge^2)
  prpl    predictable plug-in empirical Bernstein  sqrt(2 log(1/alpha) / (var t log(1 + t)))
  blend   the mean of the agrapa and prpl bets: prpl's fast start where the cap binds (large
          clusters, small variance), agrapa's Kelly-like sizing where the variance limits
  ons     online Newton step on the log-loss (Cutkosky & Orabona 2018), sequential per margin
  mixture a weighted average of e-processes (an average of e-processes is one): with weight
          MIXTURE_PLUG_IN_WEIGHT, the blend bet scaled by 1, 2 and 3 (each clipped to the cap) --
          where the information floor binds (low-variance cluster means at a margin) the best bet
          is the largest safe one, which these reach; with the rest, 8 *constant* bets
          u_j * c / (1 +- m), u_j the quantile midpoints of a Beta(3, 2) prior over the fraction of
          the largest safe bet -- where it does not (paired single trials, small clusters), a
          constant bet near the Kelly bet beats a plug-in that must first learn the variance. The
          constants' c is MIXTURE_TOP unless a bet cap is set: one constant component may lose its
          stake on an adverse cluster, the mixture keeps the others' wealth
The plug-in rules are computed for every observation at once from prefix sums; ONS carries a
(bet, curvature) state per margin and runs as a loop over observations, vectorised over margins
or replications; the mixture carries each component's log-wealth per margin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence, Tuple, TypedDict

import numpy as np

from vlaeval.choices import BetRule

UPPER = "upper"  # bets that the mean exceeds the margin (PASS side at m = -delta)
LOWER = "lower"  # bets that the mean falls below the margin (REGRESSION side at m = -delta)

# Plug-in moments are shrunk towards a prior of one pseudo-observation x = 0 (no difference
# between the policies, weight 1) with this variance, so the first bets are small.
PRIOR_VARIANCE = 0.25

BET_RULES = BetRule.values()
# The fixed-horizon plug-in: prpl's bet with t log(1 + t) replaced by the number of observations the
# test will see, known before the first (a file's block of clusters). Not a choice a stream can make --
# a stream has no horizon -- so it is not a BetRule: the order-free test bets it on a file.
FIXED_HORIZON = "fixed_horizon"
PLUG_IN_RULES = tuple(rule for rule in BET_RULES if rule not in (BetRule.ons, BetRule.mixture)) + (FIXED_HORIZON,)

# The mixture (chosen on a design set of paired single-trial comparisons -- base rates .05-.95, gaps
# .03-.4, 200 trials -- and on clustered strata at the margin; docs/figures/peer_comparison.md and
# seqtest_efficiency.md report it elsewhere): a weight on the blend bet x {1, 2, 3}, the rest on 8
# constant bets at the quantile midpoints of Beta(3, 2) (8 decided as 16 and 64 did on the design set). The weight is fixed before the stratum from its
# smallest cluster known in advance. Single trials, whose paired differences are -1, 0 or +1, want an
# interior bet the constants hold: 0.35 on the plug-ins spent 0.94 of blend's expected trials on the
# design set (though ~18% more over thousands of single trials at small effects, where a constant bet
# must be small). Clusters of several trials on the gauntlet's realistic generator put the best bet near
# the largest safe one, which the scaled plug-ins reach: 0.8 on them decided in 0.95-1.03 of blend's
# median clusters on clusters of 2-40, where 0.35 took 1.02-1.17 (on heterogeneous scenes near 50%
# success 0.35 did better, 0.73-0.95 against 0.82-1.21: the weight is a compromise, measured both ways).
MIXTURE_PRIOR = (3.0, 2.0)
MIXTURE_CONSTANTS = 8
MIXTURE_SCALES = np.array([1.0, 2.0, 3.0])
MIXTURE_PLUG_IN_WEIGHT = 0.35  # single trials (or sizes not known in advance: a file's running minimum starts at 1)
MIXTURE_PLUG_IN_WEIGHT_LARGE = 0.8
MIXTURE_LARGE_CLUSTER = 2
MIXTURE_COMPONENTS = MIXTURE_SCALES.size + MIXTURE_CONSTANTS
MIXTURE_TOP = 0.999  # the largest constant bet's fraction c of the largest safe bet, without a bet cap


def _beta_3_2_quantiles(levels: np.ndarray) -> np.ndarray:
    """Quantiles of Beta(3, 2), whose CDF is 4u^3 - 3u^4 (bisection to machine precision; scipy.stats
    costs a second to import, and the statistics are imported by --help and every config test)."""
    lo, hi = np.zeros_like(levels), np.ones_like(levels)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = 4.0 * mid**3 - 3.0 * mid**4 < levels
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


MIXTURE_FRACTIONS = _beta_3_2_quantiles((np.arange(MIXTURE_CONSTANTS) + 0.5) / MIXTURE_CONSTANTS)


def mixture_plug_in_weight(min_cluster_size: Optional[int]) -> float:
    """The mixture's weight on its scaled plug-in bets, from the smallest cluster known before the
    stratum (None: not known -- a file's running minimum starts at one trial)."""
    return MIXTURE_PLUG_IN_WEIGHT_LARGE if (min_cluster_size or 1) >= MIXTURE_LARGE_CLUSTER else MIXTURE_PLUG_IN_WEIGHT


def mixture_weights(plug_in_weight: float) -> np.ndarray:
    """Each component's weight: the plug-in share over the scales, the rest over the constants."""
    return np.concatenate(
        (
            np.full(MIXTURE_SCALES.size, plug_in_weight / MIXTURE_SCALES.size),
            np.full(MIXTURE_CONSTANTS, (1.0 - plug_in_weight) / MIXTURE_CONSTANTS),
        )
    )


# (margins x observations) elements per block of a family's update: 32k float64 temporaries
# (256 KiB) stay in a core's L2 cache, where whole-family passes (8 MiB and more) do not.
BLOCK_ELEMENTS = 1 << 15

ONS_STEP = 2.0 / (2.0 - np.log(3.0))  # Cutkosky & Orabona's exp-concavity constant

# The size-adaptive cap: c(n) = 1 - CAP_SLACK / n for clusters of at least n paired outcomes. A
# cluster mean reaches the worst case -1 only if all its pairs go the adverse way, which for a
# single scenario is common and for forty is all but impossible; so strata of small clusters keep
# a wide safety margin (c(1) = 0.8) and strata of large ones may bet nearly all (c(40) = 0.995).
# The cap comes from a smallest cluster size known before the bet: one number per stratum from a
# size declared (or planned) before the first cluster, or the running minimum of the sizes already
# seen. A cap computed from the size of the cluster being bet on is not
# predictable (sizes arrive with the clusters), and when cluster means depend on cluster size it
# made the wealth grow under the null (about 25-36% false REGRESSION at alpha = 0.05 on the
# validity harness's size-dependent designs).
CAP_SLACK = 0.2


def size_adaptive_cap(cluster_sizes: np.ndarray | float) -> np.ndarray:
    """c(n) = 1 - 0.2 / n; give it a smallest cluster size known before the bet (declared, or the
    running minimum of earlier clusters), never the current cluster's size (see above)."""
    return 1.0 - CAP_SLACK / np.asarray(cluster_sizes, dtype=np.float64)


def side_sign(side: str) -> float:
    if side not in (UPPER, LOWER):
        raise ValueError(f"side must be {UPPER!r} or {LOWER!r}, got {side!r}")
    return 1.0 if side == UPPER else -1.0


class BetSettings(TypedDict):
    """What a WealthFamily.update bets with besides its observations (a test's, for every update)."""

    rule: str
    cap_fraction: float | np.ndarray
    alpha: float
    weights: Optional[np.ndarray]
    constant_cap: float
    plug_in_weight: float
    horizon: Optional[float]  # the fixed-horizon plug-in's n (None for every other rule)


@dataclass
class MomentState:
    """Weighted sufficient statistics of the observations seen so far (shared by every margin):
    count, sum w, sum w x, sum w^2, sum w^2 x, sum w^2 x^2; `weighted` once any weight was not 1."""

    count: float = 0.0
    sums: np.ndarray = field(default_factory=lambda: np.zeros(5))
    weighted: bool = False

    def advanced(self, x: np.ndarray, w: Optional[np.ndarray] = None) -> "MomentState":
        weighted = self.weighted or w is not None
        w = np.ones_like(x) if w is None else w
        w2 = w * w
        add = np.array([w.sum(), np.dot(w, x), w2.sum(), np.dot(w2, x), np.dot(w2, x * x)])
        return MomentState(self.count + x.size, self.sums + add, weighted)


class Moments(NamedTuple):
    """Predictable (exclusive prefix) statistics along the last axis, as in MomentState;
    `unit_weights` when every weight so far is 1 (the spread of the payoffs is then margin-free)."""

    before: np.ndarray
    sum_w: np.ndarray
    sum_wx: np.ndarray
    sum_w2: np.ndarray
    sum_w2x: np.ndarray
    sum_w2x2: np.ndarray
    unit_weights: bool = False


COLUMNS = ("before", "sum_w", "sum_wx", "sum_w2", "sum_w2x", "sum_w2x2")  # the per-observation fields of Moments


def predictable_moments(x: np.ndarray, state: MomentState, w: Optional[np.ndarray] = None) -> Moments:
    """Statistics available *before* each element of x, along the last axis (x may carry leading
    replication axes; `state` describes what came before x; w defaults to 1)."""
    unit_weights = w is None and not state.weighted
    w = np.ones_like(x) if w is None else np.broadcast_to(w, x.shape)
    w2 = w * w

    def exclusive(values: np.ndarray, start: float) -> np.ndarray:
        return start + (np.cumsum(values, axis=-1) - values)

    before = np.arange(x.shape[-1], dtype=np.float64) + state.count
    s = state.sums
    return Moments(
        before,
        exclusive(w, s[0]),
        exclusive(w * x, s[1]),
        exclusive(w2, s[2]),
        exclusive(w2 * x, s[3]),
        exclusive(w2 * x * x, s[4]),
        unit_weights,
    )


def payoff_moments(moments: Moments, margins: np.ndarray, side: str) -> Tuple[np.ndarray, np.ndarray]:
    """Shrunk mean and variance of the payoffs s * w * (x - m) seen before each observation;
    `margins` broadcasts against the moments ((G, 1) against (B,) gives one row per margin).

    The spread is expanded in powers of the margin, sum (w(x - m))^2 - (sum w(x - m))^2 / n =
    a - 2 m b + m^2 c with margin-free a, b, c, so a family of G margins costs a few passes over
    (G, B) instead of a dozen; with unit weights b = c = 0 and the variance is one (B,) row."""
    sign = side_sign(side)
    m = np.asarray(margins, dtype=np.float64)
    n = moments.before
    n_plus_one = n + 1.0
    per_count = 1.0 / np.maximum(n, 1.0)
    # The pseudo-observation x = 0, w = 1 pays -s m: the shrunk total is sum w (x - m) - m.
    a = moments.sum_w2x2 - moments.sum_wx * moments.sum_wx * per_count
    if moments.unit_weights:
        centre = moments.sum_wx / n_plus_one
        edge = centre - m if sign > 0 else m - centre
        sum_sq_dev = np.maximum(a, 0.0)
    else:
        edge = sign * (moments.sum_wx - m * (moments.sum_w + 1.0)) / n_plus_one
        b = moments.sum_w2x - moments.sum_wx * moments.sum_w * per_count
        c = moments.sum_w2 - moments.sum_w * moments.sum_w * per_count
        sum_sq_dev = np.maximum(a - m * (2.0 * b - m * c), 0.0)
    variance = (PRIOR_VARIANCE + sum_sq_dev) / n_plus_one
    return edge, variance


def bet_caps(margins: np.ndarray, side: str, cap_fraction: float | np.ndarray) -> np.ndarray:
    """Largest bet keeping every factor >= 1 - cap_fraction for x anywhere in [-1, 1];
    cap_fraction may be one number or one per observation (broadcast like the margins)."""
    margins = np.asarray(margins, dtype=np.float64)
    return cap_fraction / (1.0 + margins) if side == UPPER else cap_fraction / (1.0 - margins)


def plug_in_bets(
    moments: Moments,
    margins: np.ndarray,
    side: str,
    *,
    rule: str,
    cap_fraction: float | np.ndarray,
    alpha: float,
    horizon: Optional[float] = None,
) -> np.ndarray:
    """agrapa: (edge) / (var + edge^2), zero when the past points the other way.
    prpl:   sqrt(2 log(1/alpha) / (var t log(1+t))), always placed on the alternative's side.
    blend:  their mean (each clipped to the cap first, so the mean is within it too).
    fixed_horizon: sqrt(2 log(1/alpha) / (var n)), n = `horizon`, the observations still to come
            when the block began: the bet that makes the Bernstein bound tightest at n (the file's
            size is known before its first cluster, so the bet stays predictable)."""
    if rule not in PLUG_IN_RULES:
        raise ValueError(f"{rule!r} is not a plug-in bet rule; use one of {PLUG_IN_RULES}")
    edge, variance = payoff_moments(moments, margins, side)
    caps = bet_caps(margins, side, cap_fraction)
    if rule == FIXED_HORIZON:
        if horizon is None or horizon < 1:
            raise ValueError(f"the fixed-horizon bet needs the block's size (>= 1), got {horizon!r}")
        shape = np.broadcast_shapes(np.shape(variance), np.shape(caps))
        return np.broadcast_to(np.minimum(np.sqrt(2.0 * np.log(1.0 / alpha) / (variance * horizon)), caps), shape)
    t = moments.before + 1.0
    shape = np.broadcast_shapes(np.shape(edge), np.shape(variance), np.shape(caps))
    agrapa = None
    if rule != "prpl":  # in place: these (G, B) passes are most of a gauntlet's time
        agrapa = edge * edge
        agrapa += variance
        np.divide(edge, agrapa, out=agrapa)
        np.maximum(agrapa, 0.0, out=agrapa)  # max then min: np.clip's value checks cost more than both
        agrapa = np.minimum(agrapa, caps, out=agrapa if agrapa.shape == shape else None)
        if rule == "agrapa":
            return np.broadcast_to(agrapa, shape)
        if agrapa.shape != shape:
            agrapa = np.array(np.broadcast_to(agrapa, shape))
    prpl = np.minimum(np.sqrt(2.0 * np.log(1.0 / alpha) / (variance * t * np.log1p(t))), caps)
    if agrapa is None:
        return np.broadcast_to(prpl, shape)
    agrapa += prpl
    agrapa *= 0.5
    return agrapa


def payoffs(x: np.ndarray, margins: np.ndarray, side: str, w: Optional[np.ndarray] = None) -> np.ndarray:
    y = x - np.asarray(margins, dtype=np.float64) if side_sign(side) > 0 else np.asarray(margins, dtype=np.float64) - x
    if w is not None:
        y *= w
    return y


def log_factors(bets: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Caps keep a factor >= 1 - c > 0 for c < 1; with c = 1 it can reach exactly 0 (wealth 0).
    logs = bets * y
    np.maximum(logs, -1.0, out=logs)
    with np.errstate(divide="ignore"):
        return np.log1p(logs, out=logs)


def ons_log_factors(
    y: np.ndarray, bet: np.ndarray, curvature: np.ndarray, cap: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONS over the last axis of payoffs y (leading axes: margins or replications; cap broadcasts
    against y). Returns the log-factors and the (bet, curvature) state after the last one."""
    bet, curvature = bet.copy(), curvature.copy()
    cap = np.broadcast_to(cap, y.shape)
    out = np.empty(y.shape, dtype=np.float64)
    for t in range(y.shape[-1]):
        yt = y[..., t]
        # The bet for observation t is clipped to t's cap (known before t).
        bet = np.minimum(bet, cap[..., t])
        factor = 1.0 + bet * yt
        with np.errstate(divide="ignore"):
            out[..., t] = np.log(np.maximum(factor, 0.0))
        z = yt / np.maximum(factor, 1e-12)  # minus the log-loss gradient
        curvature += z * z
        bet = np.maximum(bet + ONS_STEP * z / curvature, 0.0)
    return out, bet, curvature


@dataclass
class WealthFamily:
    """Running log-wealth of one side's e-processes over a fixed set of margins."""

    margins: np.ndarray
    side: str
    log_wealth: np.ndarray
    log_peak_wealth: np.ndarray  # running maximum of the log-wealth (not itself an e-value)
    ons_bet: np.ndarray
    ons_curvature: np.ndarray
    # (margins, MIXTURE_COMPONENTS): each component's log-wealth, the scaled plug-ins then the constants
    mixture_log_wealth: np.ndarray

    @classmethod
    def start(cls, margins: np.ndarray, side: str) -> "WealthFamily":
        margins = np.asarray(margins, dtype=np.float64)
        zeros = np.zeros(margins.shape, dtype=np.float64)
        components = np.zeros(margins.shape + (MIXTURE_COMPONENTS,))
        return cls(margins, side, zeros, zeros.copy(), zeros.copy(), np.ones(margins.shape), components)

    def update(
        self,
        x: np.ndarray,
        moments: Moments,
        *,
        rule: str,
        cap_fraction: float | np.ndarray,
        alpha: float,
        threshold_log: np.ndarray | float,
        weights: Optional[np.ndarray] = None,
        active: np.ndarray | None = None,
        keep: Sequence[int] = (),
        constant_cap: float = MIXTURE_TOP,
        plug_in_weight: float = MIXTURE_PLUG_IN_WEIGHT,
        horizon: Optional[float] = None,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Advance by observations x (with their predictable moments and weights); `constant_cap`:
        the mixture's constant bets' fraction of the largest safe bet, `plug_in_weight` its weight on
        the scaled plug-ins (both fixed before the first observation); `horizon`: the fixed-horizon
        bet's n.

        Returns (first_cross, kept): per margin, the index into x of the first crossing of its
        threshold (-1 where none); and the log-wealth after each observation of the margins listed
        in `keep` (shape (len(keep), x.size); each must be active). Only `active` margins are
        computed (the others keep their values): a margin already rejected stays rejected, so it
        needs no further work."""
        first_cross = np.full(self.margins.shape, -1, dtype=np.int64)
        index = np.arange(self.margins.size) if active is None else np.flatnonzero(active)
        keep_rows = np.asarray(keep, dtype=np.int64)
        kept = np.zeros((keep_rows.size, x.size))
        if index.size == 0 or x.size == 0:
            return first_cross, kept
        if keep_rows.size and not np.array_equal(
            index[np.minimum(np.searchsorted(index, keep_rows), index.size - 1)], keep_rows
        ):
            raise ValueError("every margin in `keep` must be active")
        thresholds = np.broadcast_to(np.asarray(threshold_log, dtype=np.float64), self.margins.shape)
        # Observations down, margins across: the running sums (cumsum down axis 0) and the peaks are
        # then vectorised over margins, and a block of margins small enough that its (B, rows)
        # temporaries stay in cache gets the same arithmetic per element several times faster
        # than whole-family passes.
        before, sum_w, sum_wx, sum_w2, sum_w2x, sum_w2x2 = (np.asarray(getattr(moments, n))[:, None] for n in COLUMNS)
        column = Moments(before, sum_w, sum_wx, sum_w2, sum_w2x, sum_w2x2, moments.unit_weights)
        x_col = x[:, None]
        w_col = None if weights is None else np.asarray(weights)[:, None]
        cap_col = cap_fraction[:, None] if isinstance(cap_fraction, np.ndarray) and cap_fraction.ndim else cap_fraction
        per_row = x.size * (
            MIXTURE_COMPONENTS // 4 if rule == BetRule.mixture else 1
        )  # the mixture: fewer, larger blocks
        rows_per_block = max(1, BLOCK_ELEMENTS // per_row)
        for lo in range(0, index.size, rows_per_block):
            block = index[lo : lo + rows_per_block]
            path = self._block_path(
                block, x_col, column, w_col, cap_col, rule, alpha, (constant_cap, plug_in_weight), horizon
            )
            peak = path.max(axis=0)
            crossing = np.flatnonzero(peak >= thresholds[block])
            if crossing.size:
                first_cross[block[crossing]] = (path[:, crossing] >= thresholds[block[crossing]]).argmax(axis=0)
            self.log_peak_wealth[block] = np.maximum(self.log_peak_wealth[block], peak)
            self.log_wealth[block] = path[-1]
            if keep_rows.size:
                positions = np.minimum(np.searchsorted(block, keep_rows), block.size - 1)
                for slot in np.flatnonzero(block[positions] == keep_rows):
                    kept[slot] = path[:, positions[slot]]
        return first_cross, kept

    def _block_path(
        self,
        block: np.ndarray,
        x_col: np.ndarray,
        column: Moments,
        w_col: Optional[np.ndarray],
        cap_col: float | np.ndarray,
        rule: str,
        alpha: float,
        mixture: Tuple[float, float],
        horizon: Optional[float] = None,
    ) -> np.ndarray:
        """Log-wealth after each observation (observations, rows) of a block of margins, advancing
        the rule's state (ONS, the mixture's components) for those margins; `mixture`: the constant
        bets' cap and the plug-ins' weight; `horizon`: the fixed-horizon bet's n."""
        margins = self.margins[None, block]
        y = payoffs(x_col, margins, self.side, w_col)
        if rule == BetRule.mixture:
            plug_in = plug_in_bets(column, margins, self.side, rule="blend", cap_fraction=cap_col, alpha=alpha)
            constant_cap, plug_in_weight = mixture
            path, self.mixture_log_wealth[block] = mixture_paths(
                y,
                plug_in,
                bet_caps(margins, self.side, cap_col),
                bet_caps(margins, self.side, constant_cap),
                self.mixture_log_wealth[block],
                mixture_weights(plug_in_weight),
            )
            return path
        if rule == "ons":
            logs, self.ons_bet[block], self.ons_curvature[block] = ons_log_factors(
                y.T, self.ons_bet[block], self.ons_curvature[block], bet_caps(margins, self.side, cap_col).T
            )
            logs = logs.T
        else:
            bets = plug_in_bets(
                column, margins, self.side, rule=rule, cap_fraction=cap_col, alpha=alpha, horizon=horizon
            )
            logs = log_factors(bets, y)
        path = np.cumsum(logs, axis=0, out=logs)
        path += self.log_wealth[block]
        return path


# Observations multiplied in the linear domain between renormalisations: every factor is in [0, 2], so a
# product stays below 2^128 ~ 3e38; one that underflows to 0 (a component losing all but 1e-300 of its
# stake) is a component out of the mixture for good, which is what its log-wealth of -700 meant anyway.
MIXTURE_CHUNK = 128


def mixture_paths(
    y: np.ndarray,
    plug_in: np.ndarray,
    caps: np.ndarray,
    constant_caps: np.ndarray,
    start: np.ndarray,
    weights: np.ndarray,
) -> Tuple[np.ndarray, np.ndarray]:
    """The mixture's log-wealth along the first axis of payoffs y (observations, rows): its
    components bet the plug-in bet times each scale, clipped to `caps`, and the constant fractions
    of `constant_caps` (each broadcast like y), with `weights`, from each row's components'
    log-wealth `start` (rows, components). Returns (the mixture's log-wealth after each observation,
    (obs, rows); each component's log-wealth after the last, (rows, components)).

    Within chunks of MIXTURE_CHUNK observations the components' factors (each in [0, 2]) are
    multiplied in the linear domain and mixed by one weighted sum; the log is taken once per
    observation and row, not once per component."""
    plug_in, caps, constant_caps = (np.broadcast_to(a, y.shape) for a in (plug_in, caps, constant_caps))
    k = MIXTURE_SCALES.size
    mixed = np.empty(y.shape, dtype=np.float64)
    components = np.array(start, dtype=np.float64, copy=True)
    for lo in range(0, y.shape[0], MIXTURE_CHUNK):
        part = slice(lo, lo + MIXTURE_CHUNK)
        y_part = y[part, :, None]
        factors = np.empty(y_part.shape[:2] + (MIXTURE_COMPONENTS,))
        np.minimum(plug_in[part, :, None] * MIXTURE_SCALES, caps[part, :, None], out=factors[..., :k])
        factors[..., :k] *= y_part
        np.multiply(constant_caps[part, :, None] * y_part, MIXTURE_FRACTIONS, out=factors[..., k:])
        factors += 1.0
        np.maximum(factors, 0.0, out=factors)
        np.cumprod(factors, axis=0, out=factors)
        top = components.max(axis=-1)
        scale = np.exp(components - top[:, None]) * weights
        with np.errstate(divide="ignore", invalid="ignore"):
            mixed[part] = np.log(np.einsum("brj,rj->br", factors, scale)) + top
            components += np.log(factors[-1])
    return mixed, components


def log_wealth_paths(
    x: np.ndarray,
    margin: float,
    side: str,
    *,
    rule: str = "agrapa",
    cap_fraction: float | np.ndarray = 0.95,
    alpha: float = 0.05,
    weights: Optional[np.ndarray] = None,
    constant_cap: float = MIXTURE_TOP,
    plug_in_weight: float = MIXTURE_PLUG_IN_WEIGHT,
) -> np.ndarray:
    """Log-wealth after each observation for many independent sequences at once.

    x (and weights, if given) have shape (R, T): R replications of T observations; returns (R, T).
    The same bets as WealthFamily, vectorised over replications, for the validity simulations.
    """
    if rule not in BET_RULES:
        raise ValueError(f"unknown bet rule {rule!r}; use one of {BET_RULES}")
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    w = None if weights is None else np.broadcast_to(np.asarray(weights, dtype=np.float64), x.shape)
    m = np.asarray(margin, dtype=np.float64)
    y = payoffs(x, m, side, w)
    if rule == BetRule.mixture:
        moments = predictable_moments(x, MomentState(), w)
        plug_in = np.broadcast_to(
            plug_in_bets(moments, m, side, rule="blend", cap_fraction=cap_fraction, alpha=alpha), x.shape
        )
        caps = np.broadcast_to(bet_caps(m, side, cap_fraction), x.shape)
        constants = np.broadcast_to(bet_caps(m, side, constant_cap), x.shape)
        mixed, _ = mixture_paths(
            np.moveaxis(y, -1, 0),
            np.moveaxis(plug_in, -1, 0),
            np.moveaxis(caps, -1, 0),
            np.moveaxis(constants, -1, 0),
            np.zeros(x.shape[:-1] + (MIXTURE_COMPONENTS,)),
            mixture_weights(plug_in_weight),
        )
        return np.moveaxis(mixed, 0, -1)
    if rule == "ons":
        start = np.zeros(x.shape[:-1])
        logs, _, _ = ons_log_factors(y, start, np.ones_like(start), bet_caps(m, side, cap_fraction))
    else:
        bets = plug_in_bets(
            predictable_moments(x, MomentState(), w), m, side, rule=rule, cap_fraction=cap_fraction, alpha=alpha
        )
        logs = log_factors(bets, y)
    return np.cumsum(logs, axis=-1)
