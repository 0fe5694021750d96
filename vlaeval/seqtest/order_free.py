"""Order-free decisions on outcomes that all exist (an outcome file): the average, over B fixed
orders, of each order's e-value.

A betting e-process needs its clusters in random order, and a file has no order of its own: any order
a user can influence -- a seed, the file's bytes -- is a lottery ticket (keeping the first PASS of ten
meaning-preserving re-saves of a file at the margin raised false PASS from 0.02-0.04 to 0.14). All of a
file's outcomes exist, so stopping early saves nothing. This test therefore runs B *streams*: stream b
presents the clusters in its own fixed random order, seeded from a canonical digest of the clusters
themselves (the sorted multiset of (size, mean) pairs: invariant to ids, row order, format, encoding and
extra columns) and b. Each stream is an ordinary betting e-process (the predictable caps of
vlaeval.seqtest.sequential), stopped the first time its wealth reaches s = min(4, B) times the
threshold. A stopped test supermartingale is an e-value, and so is an average of e-values:

    E = (1/B) sum_b W_b(tau_b),    reject when E >= 1/level     (Markov: P(E >= 1/level) <= level).

A stream reaching s/level counts as exactly that; otherwise its final wealth counts. Nothing is left
to choose: the same clusters give the same decision, however the file is written.

The bet. A file's size is known before its first cluster, so each stream bets the fixed-horizon
plug-in sqrt(2 log(1/alpha) / (n var)), n the block's clusters and var the shrunk predictable
variance (vlaeval.seqtest.eprocess.FIXED_HORIZON): predictable, so every guarantee above holds, and
sized for the n it will see rather than learned along the way as a stream of unknown length must
(PASS power at 240 heterogeneous scenes 0.264 -> 0.362 with the stop at 4/alpha instead of B/alpha;
benchmarks/certified_decisions.py, section 7).

Looks are blocks: a later version of a file whose new clusters are *appended* (vlaeval.gauntlet.ledger
finds the earlier version's clusters in it) is one more `update` call, and every stream
continues with the new block in its own order after the old one. Given the blocks so far, each stream
is a supermartingale across blocks, so their average is too, and by Ville's inequality re-testing after
every new version keeps P(any false decision) <= level -- a restart on each version does not (0.097
false PASS re-running 100 -> 600 scenes until PASS, against 0.020 for one run).

The confidence sequence is the same construction on the grid of margins (each side at alpha/2), a
running intersection over looks; the catastrophic bound the same on the lower side at its own level.
The trajectory has one record per look (block end): within a block there is no order to plot.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.seqtest.eprocess import (
    FIXED_HORIZON,
    LOWER,
    UPPER,
    MomentState,
    WealthFamily,
    predictable_moments,
    size_adaptive_cap,
)
from vlaeval.seqtest.sequential import (
    CS_FIRST_CHUNK,
    CS_SMALL_GRID,
    MODE_EXACT,
    NEVER,
    PairedSequentialTest,
    hull_bounds,
    wealth,
)
from vlaeval.seqtest.state import (
    DEFAULT_ORDERS,
    ORDER_FREE_DEFAULTS,
    EValues,
    OrderFreeReport,
    OrderFreeSettings,
    TestSettings,
    TestState,
)

# Each stream stops at this many times the threshold (at most `orders`): B = 16 streams stopped at 16/alpha
# let one stream reject alone, but a stream that passes 4/alpha and then gives some back counts for less
# than one locked in there; at 4/alpha four streams must agree. With the fixed-horizon bet it added
# 0.042 PASS power at 240 scenes (0.320 -> 0.362) and kept every attack design valid
# (benchmarks/certified_decisions.py, section 7).
STOP_FACTOR = 4.0
# What a file's orders bet and where they stop, as the evidence ledger's test fingerprint records it:
# evidence tested under another bet (the mixture, stopped at orders/alpha, before issue 50) is another test.
ORDER_FREE_BET = f"fixed-horizon plug-in; stop at min({STOP_FACTOR:g}, orders)/alpha"


def block_digest(x: np.ndarray, sizes: np.ndarray, before: str = "") -> str:
    """A digest of a block of clusters as a multiset of (size, mean) pairs, chained to the blocks
    `before` it: the same clusters in any order give the same digest."""
    pairs = np.stack([np.asarray(sizes, dtype=np.float64), np.round(np.asarray(x, dtype=np.float64), 12)], axis=1)
    canonical = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    return hashlib.sha256(before.encode() + canonical.tobytes()).hexdigest()


class _Stream:
    """One order's e-processes: both sides' wealth over the margins, its moments and running minimum."""

    def __init__(self, upper_margins: np.ndarray, lower_margins: np.ndarray) -> None:
        self.upper = WealthFamily.start(upper_margins, UPPER)
        self.lower = WealthFamily.start(lower_margins, LOWER)
        self.moments = MomentState()
        self.smallest_seen = math.inf


class OrderFreeTest(PairedSequentialTest):
    """Exact test on clusters that all exist: the average over `orders` fixed orders of each order's
    stopped e-value (see the module docstring). Each `update` call is one look (a block)."""

    mode = MODE_EXACT
    cs_kind = "order-free betting CS: the average over fixed orders of each order's e-value, running intersection"
    records_looks_only = True

    def __init__(self, settings: TestSettings, mode: OrderFreeSettings = ORDER_FREE_DEFAULTS) -> None:
        super().__init__(settings, mode)
        orders = mode.orders
        if int(orders) < 1:
            raise ValueError(f"orders must be >= 1, got {orders}")
        self.orders = int(orders)
        stop_factor = float(min(STOP_FACTOR, self.orders) if mode.stop_factor is None else mode.stop_factor)
        if stop_factor < 1.0:
            raise ValueError(f"stop_factor must be >= 1 (a stream stops at or past the threshold), got {stop_factor}")
        self.fixed_horizon = bool(mode.fixed_horizon)
        self._log_stop_factor = log_b = math.log(stop_factor)
        halting = self.catastrophic_delta is not None
        upper_levels = [self.alpha] + ([self.catastrophic_alpha] if halting else [])
        # A stream stops (its margin is settled) at stop_factor times the threshold (B by default: one
        # such stream rejects alone; fewer means several must agree, and wealth won early is kept).
        self._upper_stop = np.log(1.0 / np.asarray(upper_levels)) + log_b
        self._lower_stop = math.log(1.0 / self.alarm_alpha) + log_b
        self._cs_log = math.log(2.0 / self.alpha)
        self._cat_log = math.log(1.0 / self.catastrophic_alpha)
        # Grid margins: the upper side serves the CS only; the lower side the CS and the halt's bound.
        self._up_grid_stop = self._cs_log + log_b
        self._low_grid_stop = (max(self._cs_log, self._cat_log) if halting else self._cs_log) + log_b
        self._settled_upper = np.zeros(self._grid.size, dtype=np.bool_)
        self._settled_lower = np.zeros(self._grid.size, dtype=np.bool_)
        self._cat_rejected = np.full(self._grid.size, NEVER, dtype=np.int64)
        # Each stream bets on the one-order test's margins: its decision margins, then the grid.
        self._streams = [_Stream(self._upper.margins, self._lower.margins) for _ in range(self.orders)]
        self._chain = ""
        self._blocks: List[Dict[str, Any]] = []
        self._e: Dict[str, Optional[float]] = {}

    def _report(self) -> OrderFreeReport:
        bet = super()._report()
        return OrderFreeReport(
            bet_rule=FIXED_HORIZON if self.fixed_horizon else bet.bet_rule,
            bet_cap=bet.bet_cap,
            bet_cap_rule=bet.bet_cap_rule,
            orders=self.orders,
            order_free="the average over fixed orders, seeded from the clusters' canonical digest, of each "
            f"order's e-value stopped at {math.exp(self._log_stop_factor):g} x the threshold"
            + ("; each order bets the fixed-horizon plug-in for its block's size" if self.fixed_horizon else ""),
            blocks=tuple(dict(b) for b in self._blocks),
        )

    def update(self, cluster_means: np.ndarray, cluster_sizes: Optional[np.ndarray] = None) -> TestState:
        """One look: the next block of clusters (their order here does not matter). Returns the
        test's state after it."""
        x, sizes, weights = self._checked(cluster_means, cluster_sizes)
        if x.size == 0:
            return self.state
        digest = block_digest(x, sizes, self._chain)
        canonical = np.lexsort((np.round(x, 12), sizes))  # the block in an order no file can choose
        x, sizes = x[canonical], sizes[canonical]
        weights = None if weights is None else weights[canonical]
        for b, stream in enumerate(self._streams):
            order = np.random.default_rng([stable_seed("order-free-stream", digest), b]).permutation(x.size)
            self._advance_stream(stream, x[order], None if weights is None else weights[order], sizes[order])
        self._chain = digest
        self._blocks.append({"clusters": int(x.size), "units": int(sizes.sum()), "digest": digest[:16]})
        self._record(x, sizes, *self._look(x.size))
        return self.state

    def _advance_stream(self, stream: _Stream, x: np.ndarray, w: Optional[np.ndarray], sizes: np.ndarray) -> None:
        """Run one stream over the block in growing chunks, settling grid margins as they pass the stop."""
        start, chunk = 0, CS_FIRST_CHUNK
        while start < x.size:
            # A margin settled on either side is rejected by the CS: neither side needs it any more
            # (the halt's bound reads only the lower side, and a margin the upper side settled lies
            # below the estimate, where that bound never looks).
            alive = ~(self._settled_upper | self._settled_lower)
            if np.count_nonzero(alive) <= CS_SMALL_GRID:
                chunk = x.size  # little left to settle: one pass costs less than many small ones
            part, size_part = x[start : start + chunk], sizes[start : start + chunk]
            part_w = None if w is None else w[start : start + chunk]
            moments = predictable_moments(part, stream.moments, part_w)
            if self.bet_cap is not None or self.min_cluster_size is not None:
                cap: float | np.ndarray = self.cap_fraction
            else:  # the running minimum of sizes seen before each bet, in this stream's order
                before = np.minimum.accumulate(np.concatenate(([stream.smallest_seen], size_part)))[:-1]
                cap = size_adaptive_cap(np.where(np.isfinite(before), before, 1.0))
            # The block's size is known before its first cluster: the fixed-horizon bet is sized for it.
            common = self.bet_settings(cap, part_w, horizon=float(x.size) if self.fixed_horizon else None)
            stream.upper.update(
                part,
                moments,
                threshold_log=np.concatenate((self._upper_stop, np.full(self._grid.size, self._up_grid_stop))),
                active=np.concatenate((np.ones(self._n_upper, bool), alive)),
                **common,
            )
            stream.lower.update(
                part,
                moments,
                threshold_log=np.concatenate(([self._lower_stop], np.full(self._grid.size, self._low_grid_stop))),
                active=np.concatenate(([True], alive)),
                **common,
            )
            self._settled_upper |= alive & (stream.upper.log_peak_wealth[self._n_upper :] >= self._up_grid_stop)
            self._settled_lower |= alive & (stream.lower.log_peak_wealth[1:] >= self._low_grid_stop)
            stream.moments = stream.moments.advanced(part, part_w)
            stream.smallest_seen = min(stream.smallest_seen, float(size_part.min()))
            start, chunk = start + part.size, chunk * 2

    def _average(self, family: str, rows: slice | int, stop: float | np.ndarray) -> np.ndarray:
        """log of the average over streams of each margin's stopped e-value: a stream past its stop
        counts as exactly the stop (a lower bound of its stopped wealth), the others their wealth now."""
        peaks = np.stack([getattr(s, family).log_peak_wealth[rows] for s in self._streams])
        finals = np.stack([getattr(s, family).log_wealth[rows] for s in self._streams])
        stopped = np.where(peaks >= stop, stop, np.minimum(finals, stop))
        top = stopped.max(axis=0)
        return np.asarray(top + np.log(np.mean(np.exp(stopped - top), axis=0)))

    def _look(self, block_size: int) -> Tuple[Dict[str, int], Dict[str, np.ndarray]]:
        """The decisions and bounds at the end of this block, in the shape `_record` takes."""
        seen_after = self._clusters + block_size
        last = block_size - 1
        halting = self.catastrophic_delta is not None
        log_pass = float(self._average("upper", 0, float(self._upper_stop[0])))
        log_regression = float(self._average("lower", 0, self._lower_stop))
        firsts = {
            "pass": last if log_pass >= self._upper_stop[0] - self._log_stop_factor else -1,
            "regression": last if log_regression >= self._lower_stop - self._log_stop_factor else -1,
            "catastrophic": -1,
            "not_catastrophic": -1,
        }
        self._e = {"e_value_pass": wealth(log_pass), "e_value_regression": wealth(log_regression)}
        grid_up = self._average("upper", slice(self._n_upper, None), self._up_grid_stop)
        grid_low = self._average("lower", slice(1, None), self._low_grid_stop)
        grid_low[self._settled_upper & ~self._settled_lower] = -np.inf  # not computed: never a halt's evidence
        newly = ((grid_up >= self._cs_log) | (grid_low >= self._cs_log)) & (self._grid_rejected_after == NEVER)
        self._grid_rejected_after[newly] = seen_after
        counts = np.array([seen_after])
        series: Dict[str, np.ndarray] = {
            "log_wealth_pass": np.array([log_pass]),
            "log_wealth_regression": np.array([log_regression]),
        }
        series["cs_lower"], series["cs_upper"] = hull_bounds(self._grid, self._grid_rejected_after, counts)
        if halting:
            newly = (grid_low >= self._cat_log) & (self._cat_rejected == NEVER)
            self._cat_rejected[newly] = seen_after
            _, upper = hull_bounds(self._grid, self._cat_rejected, counts)
            series["catastrophic_upper"] = upper
            log_not = float(self._average("upper", 1, float(self._upper_stop[1])))
            self._e["e_value_not_catastrophic"] = wealth(log_not)
            catastrophic_delta = float(self.catastrophic_delta or 0.0)  # set: the stratum halts
            cat_index = int(np.argmin(np.abs(self._grid + catastrophic_delta)))
            # None where the upper side settled that margin first (its halt e-value was never needed).
            self._e["e_value_catastrophic"] = (
                wealth(float(grid_low[cat_index])) if np.isfinite(grid_low[cat_index]) else None
            )
            series["log_wealth_not_catastrophic"] = np.array([log_not])
            series["log_wealth_catastrophic"] = np.array([float(grid_low[cat_index])])
            if upper[0] <= -catastrophic_delta + 1e-12:
                firsts["catastrophic"] = last
            elif log_not >= self._cat_log:
                firsts["not_catastrophic"] = last
        series = {k: np.full(block_size, v[-1]) for k, v in series.items()}  # `_record` keeps the look's end
        return firsts, series

    def _e_values(self) -> EValues:
        """The order-free e-values (averages over the orders) after the last look (1 before the first)."""
        halting = self.catastrophic_delta is not None
        e: Dict[str, Optional[float]] = {"e_value_regression": 1.0, "e_value_pass": 1.0}
        if halting:
            e.update(e_value_catastrophic=1.0, e_value_not_catastrophic=1.0)
        e.update(self._e)
        return EValues(
            regression=e["e_value_regression"],
            pass_=e["e_value_pass"],
            catastrophic=e.get("e_value_catastrophic"),
            not_catastrophic=e.get("e_value_not_catastrophic"),
            halting=halting,
        )


__all__ = ["DEFAULT_ORDERS", "ORDER_FREE_BET", "OrderFreeTest", "block_digest"]
