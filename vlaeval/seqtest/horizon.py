"""A horizon-aware exact paired test: a boundary that spends alpha over a declared number of clusters,
synthesised exactly on the walk of discordant outcomes and certified for every within-pair dependence.

The walk. A cluster's paired difference x in [-1, 1] is tested against a margin m: on the upper side
(H0: Delta <= m) through z = (x - m) / (1 + |m|), on the lower side (H0: Delta >= m) through
z = (m - x) / (1 + |m|) -- both in [-1, 1], both with mean <= 0 under H0 -- times n_c / n_max for the
unit estimand. z is rounded to a step Y in {-1, 0, +1}: Y = sign(z) with probability |z|, else 0, so
E[Y] = E[z] <= 0 under H0. For clusters of one trial at margin 0 -- STEP's setting -- z is already a
step (a candidate-only success +1, a baseline-only success -1, a concordant pair 0) and nothing is
random; otherwise the rounding draws from a stream fixed before the stratum (the run's order seed).

Why the walk is one-dimensional. Clusters are i.i.d., so the steps are: a step is non-zero ("discordant")
with some rate r, and, given that it is, positive with probability p <= 1/2 under H0 -- whatever r is,
and whatever the dependence between the two policies' outcomes within a pair (it only moves r). A
boundary monotone in the number of positive steps is least favourable at p = 1/2, so H0 is the family
of lazy fair walks indexed by r in [0, 1].

The test. After t of the horizon's N clusters, with k discordant steps of which n positive, reject when
(t, k, n) lies in the region R (a least positive count per (t, k): `HorizonDesign.boundary`). Its size
is sup_r P_r(reject within N) = sup_r sum_D c_D Binomial(D; N, r), with c_D = P(reject | D discordant
steps in N), exact: given D, their positions are uniform among the N and the signs fair, so c_D is one
forward pass over (t, k, n) and a hypergeometric contraction, O(N^3). The polynomial's supremum is
bounded rigorously: its maximum on a grid of 4001 rates plus half the grid step times its largest
slope N max |c_{D+1} - c_D| (the Bernstein form's derivative). A design is kept only when that bound
is <= alpha: the guarantee is exact, computed, not simulated, for every r and so for every dependence
between the arms (STEP's policy sums each arm and assumes them independent).

The region. Among regions of that size, one that minimises expected clusters (and maximises power,
weight HORIZON_POWER_WEIGHT) averaged over DESIGN_ALTERNATIVES (independent arms, base rates 0..1,
gaps .05, .1, .2, .5 -- fixed here, not tuned on any benchmark's grid) is found by backward induction
on (t, k, n): reject where the alternatives' gain exceeds lambda times the null measure of the state,
the null measure a mixture over rates whose weights are moved towards the rates whose rejection
probability is above alpha (a few multiplicative rounds: the least favourable mixture), with lambda
bisected to the largest region whose certified size is <= alpha.

What it is not: valid past its horizon. The boundary spends all of alpha within N clusters; looking
further, or restarting on more clusters, is a new test whose errors add up (STEP's "switch to the
500-trial policy" reached .14 two-sided). The anytime test (PairedSequentialTest) is the one to keep
looking with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from vlaeval.choices import TestMode
from vlaeval.seqtest.sequential import PairedSequentialTest
from vlaeval.seqtest.state import HorizonReport, HorizonSettings, TestSettings

MODE_HORIZON = TestMode.horizon.value
HORIZON_DESIGN_VERSION = 1
HORIZON_MAX = 400  # clusters: O(N^3) per pass, several dozen passes per design
HORIZON_POWER_WEIGHT = 1.0  # kappa: a rejection's value is (N - t) / N + kappa
DESIGN_BASE_RATES = tuple(np.round(np.linspace(0.0, 1.0, 21), 3))
DESIGN_GAPS = (0.05, 0.1, 0.2, 0.5)
DESIGN_RELATIVE = 0.5
DESIGN_RATE_GRID = 48  # rates in the least favourable mixture
DESIGN_ROUNDS = 10  # multiplicative rounds on that mixture
CERTIFY_RATES = 4001  # the grid the size's supremum is bounded on
NEVER_REJECTS = np.iinfo(np.int16).max
DESIGN_ARRAYS = ("boundary", "by_discordant", "meta")  # a design as arrays (the store's design.npz)


def independent_alternative(p_baseline: float, p_candidate: float) -> Tuple[float, float]:
    """(discordance rate r, P(candidate-only | discordant)) of independent arms."""
    r = p_baseline * (1.0 - p_candidate) + p_candidate * (1.0 - p_baseline)
    return r, (p_candidate * (1.0 - p_baseline) / r if r > 0 else 0.5)


DESIGN_ALTERNATIVES = tuple(
    independent_alternative(p0, round(p0 + gap, 3)) for p0 in DESIGN_BASE_RATES for gap in DESIGN_GAPS if p0 + gap <= 1
)


class _Tables:
    """Log-factorials and log-binomials for one horizon."""

    def __init__(self, horizon: int) -> None:
        self.n = horizon
        self.log_factorial = np.cumsum(np.log(np.arange(1, 2 * horizon + 3, dtype=np.float64)))
        self.log_factorial = np.concatenate(([0.0], self.log_factorial))

    def log_choose(self, n: np.ndarray | int, k: np.ndarray | int) -> np.ndarray:
        n, k = np.broadcast_arrays(np.asarray(n), np.asarray(k))
        bad = (k < 0) | (k > n) | (n < 0)
        lf = self.log_factorial
        value = lf[np.clip(n, 0, None)] - lf[np.clip(k, 0, None)] - lf[np.clip(n - k, 0, None)]
        return np.where(bad, -np.inf, value)

    def log_binomial_pmf(self, rates: np.ndarray) -> np.ndarray:
        """(rates, D) log Binomial(D; N, r)."""
        d = np.arange(self.n + 1)
        with np.errstate(divide="ignore"):
            lr, l1r = np.log(rates)[:, None], np.log1p(-rates)[:, None]
        terms = np.where(d == 0, 0.0, d * lr) + np.where(d == self.n, 0.0, (self.n - d) * l1r)
        return self.log_choose(np.full_like(d, self.n), d)[None, :] + terms

    def hypergeometric(self, t: int) -> np.ndarray:
        """(k, D): P(k of the first t clusters discordant | D of N), k <= t."""
        k = np.arange(t + 1)[:, None]
        d = np.arange(self.n + 1)[None, :]
        logp = self.log_choose(np.full_like(k, t), k) + self.log_choose(self.n - t, d - k) - self.log_choose(self.n, d)
        return np.exp(logp)


def _log_sum_exp(values: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(values, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(top, axis=axis) + np.log(np.sum(np.exp(values - top), axis=axis))


def region_from_boundary(boundary: np.ndarray, t: int) -> np.ndarray:
    """(k, n) rejection mask at t from the least positive count per k."""
    n = np.arange(t + 1)[None, :]
    k = np.arange(t + 1)[:, None]
    return (n >= boundary[t, : t + 1][:, None]) & (n <= k)


def rejection_given_discordant(boundary: np.ndarray, log_value: Optional[List[np.ndarray]] = None) -> np.ndarray:
    """c_D = P(reject within N | D of the N clusters discordant, fair signs), D = 0..N, exact: the
    discordant positions are uniform given D, so one forward pass over (t, k, n) in the counting
    measure, each absorbed mass weighted by the hypergeometric chance of its k given D. With
    `log_value` (per t, (k, n): log of what rejecting there is worth per path), the value of the
    region is appended as c[N + 1]."""
    horizon = boundary.shape[0] - 1
    tables = _Tables(horizon)
    mass = np.ones((1, 1))  # at t: mass[k, n] = P(surviving, n positive | k of t discordant, fair signs)
    c = np.zeros(horizon + 1)
    value = 0.0
    for t in range(horizon):
        k = np.arange(t + 2)[:, None]
        grown = np.zeros((t + 2, t + 2))
        grown[: t + 1, : t + 1] = mass * ((t + 1 - k[: t + 1]) / (t + 1))
        step = np.zeros((t + 2, t + 2))
        step[1:, : t + 1] += 0.5 * mass
        step[1:, 1:] += 0.5 * mass
        grown += step * (k / (t + 1))
        region = region_from_boundary(boundary, t + 1)
        taken = np.where(region, grown, 0.0)
        grown[region] = 0.0
        mass = grown
        c += taken.sum(axis=1) @ tables.hypergeometric(t + 1)
        if log_value is not None:
            # Paths absorbed at (t, k, n): mass x C(t, k) x 2^k, each worth exp(log_value).
            paths = tables.log_choose(np.full_like(k, t + 1), k) + k * math.log(2.0)
            with np.errstate(divide="ignore"):
                value += float(np.sum(np.exp(np.log(taken) + paths + log_value[t + 1])))
    return np.append(c, value) if log_value is not None else c


@dataclass(frozen=True)
class SizeCertificate:
    """The certified size: c_D for every D, the worst rate on the grid, and the rigorous bound on
    sup_r P_r(reject) (grid maximum + half a step times the largest slope)."""

    by_discordant: np.ndarray
    worst_rate: float
    bound: float


def certify(boundary: np.ndarray, log_value: Optional[List[np.ndarray]] = None) -> Tuple[SizeCertificate, float]:
    """The exact size of a boundary over every discordance rate (see the module docstring), and its
    value under `log_value` (0 without)."""
    c = rejection_given_discordant(boundary, log_value)
    value = float(c[-1]) if log_value is not None else 0.0
    c = c[:-1] if log_value is not None else c
    horizon = c.size - 1
    rates = np.linspace(0.0, 1.0, CERTIFY_RATES)
    tables = _Tables(horizon)
    inner = rates[1:-1]
    size = np.concatenate(([c[0]], np.exp(tables.log_binomial_pmf(inner)) @ c, [c[-1]]))
    slope = horizon * float(np.abs(np.diff(c)).max()) if horizon else 0.0
    worst = int(np.argmax(size))
    return SizeCertificate(c, float(rates[worst]), float(size[worst] + 0.5 * (rates[1] - rates[0]) * slope)), value


class _Synthesis:
    """The Lagrangian design's pieces for one horizon (see the module docstring)."""

    def __init__(self, horizon: int) -> None:
        self.n = horizon
        self.tables = _Tables(horizon)
        r = np.clip(np.array([a[0] for a in DESIGN_ALTERNATIVES]), 1e-12, 1 - 1e-12)
        p = np.clip(np.array([a[1] for a in DESIGN_ALTERNATIVES]), 1e-12, 1 - 1e-12)
        # Relative savings: an alternative's weight grows with how few clusters it should need
        # (log(1/alpha) / its KL per cluster, at most the horizon), to the power DESIGN_RELATIVE.
        kl = r * (p * np.log(2 * p) + (1 - p) * np.log(2 * (1 - p)))
        needs = np.minimum(horizon, math.log(20.0) / np.maximum(kl, 1e-12))
        weights = (horizon / needs) ** DESIGN_RELATIVE
        weights /= weights.sum()
        self.log_gain: List[np.ndarray] = [np.zeros((1, 1))]
        for t in range(1, horizon + 1):
            k = np.arange(t + 1)[:, None, None]
            n = np.arange(t + 1)[None, :, None]
            log_alt = np.log(weights) + k * np.log(r) + (t - k) * np.log1p(-r) + n * np.log(p) + (k - n) * np.log1p(-p)
            gain = _log_sum_exp(log_alt, axis=2) + math.log((horizon - t) / horizon + HORIZON_POWER_WEIGHT)
            self.log_gain.append(np.where(n[..., 0] <= k[..., 0], gain, -np.inf))
        self.rates = ((np.arange(DESIGN_RATE_GRID) + 0.5) / DESIGN_RATE_GRID) ** 1.5
        self.rate_pmf = np.exp(self.tables.log_binomial_pmf(self.rates))

    def null_pattern(self, log_mixture: np.ndarray) -> List[np.ndarray]:
        """log P(k of the first t discordant) under D ~ the mixture, for each t (a (t+1,) row)."""
        d = np.arange(self.n + 1)[None, :]
        base = log_mixture[None, :] - self.tables.log_choose(np.full_like(d, self.n), d)
        out = []
        for t in range(self.n + 1):
            k = np.arange(t + 1)[:, None]
            out.append(_log_sum_exp(self.tables.log_choose(self.n - t, d - k) + base, axis=1))
        return out

    def boundary(self, log_lambda: float, pattern: List[np.ndarray]) -> np.ndarray:
        """The optimal-stopping region at multiplier lambda, as least positive counts (t, k)."""
        n_max = self.n
        boundary = np.full((n_max + 1, n_max + 1), NEVER_REJECTS, dtype=np.int32)
        after = np.zeros((n_max + 2, n_max + 2))  # the value at t + 1, padded
        for t in range(n_max, 0, -1):
            k = np.arange(t + 1)[:, None]
            if t == n_max:
                carry = np.zeros((t + 1, t + 1))
            else:
                with np.errstate(invalid="ignore"):
                    step = np.exp(np.minimum(pattern[t + 1][1 : t + 2] - pattern[t][: t + 1], 0.0))[:, None]
                step = np.nan_to_num(step)
                carry = (1 - step) * after[: t + 1, : t + 1] + step * 0.5 * (
                    after[1 : t + 2, 1 : t + 2] + after[1 : t + 2, : t + 1]
                )
            reference = pattern[t][:, None] - k * math.log(2.0)
            stop = np.exp(np.minimum(self.log_gain[t] - reference - log_lambda, 700.0)) - 1.0
            valid = np.isfinite(self.log_gain[t])
            reject = (stop > carry) & valid
            # A region monotone in the positive count: from the least rejecting n upwards.
            least = np.where(reject.any(axis=1), reject.argmax(axis=1), NEVER_REJECTS)
            boundary[t, : t + 1] = least
            reject = (np.arange(t + 1)[None, :] >= least[:, None]) & valid
            after = np.zeros((t + 1 + 1, t + 1 + 1))
            after[: t + 1, : t + 1] = np.where(valid, np.where(reject, stop, carry), 0.0)
        return boundary

    def calibrated(
        self, alpha: float, pattern: List[np.ndarray], bracket: Tuple[float, float], steps: int
    ) -> Tuple[np.ndarray, SizeCertificate, float, float]:
        """The largest region (smallest lambda on the bisection grid) whose certified size is <= alpha,
        with its value (the design objective)."""
        lo, hi = bracket

        def attempt(log_lambda: float) -> Tuple[bool, Tuple[np.ndarray, SizeCertificate, float, float]]:
            boundary = self.boundary(log_lambda, pattern)
            cert, value = certify(boundary, self.log_gain)
            return cert.bound <= alpha, (boundary, cert, log_lambda, value)

        ok, found = attempt(hi)
        while not ok:
            lo, hi = hi, hi + 8.0
            ok, found = attempt(hi)
        ok_lo, at_lo = attempt(lo)
        while ok_lo:
            hi, found = lo, at_lo
            lo -= 8.0
            ok_lo, at_lo = attempt(lo)
        for _ in range(steps):
            mid = 0.5 * (lo + hi)
            ok, result = attempt(mid)
            if ok:
                hi, found = mid, result
            else:
                lo = mid
        return found


@dataclass(frozen=True)
class HorizonDesign:
    """A certified boundary for `horizon` clusters at level `alpha`: reject after t clusters with k
    discordant steps of which n positive when n >= boundary[t, k]; `size`: its certificate."""

    horizon: int
    alpha: float
    boundary: np.ndarray
    size: SizeCertificate
    version: int = HORIZON_DESIGN_VERSION

    def rejects(self, t: int, k: int, n: int) -> bool:
        return 0 < t <= self.horizon and k <= t and n >= int(self.boundary[t, k])

    def power(self, rate: float, positive: float) -> Tuple[float, float]:
        """(P(reject within the horizon), E[clusters used]) for i.i.d. steps discordant with `rate`
        and positive with `positive` given discordant, exact (a forward pass)."""
        mass = np.ones((1, 1))
        rejected, expected = 0.0, 0.0
        for t in range(1, self.horizon + 1):
            expected += 1.0 - rejected
            grown = np.zeros((t + 1, t + 1))
            grown[:t, :t] = (1 - rate) * mass
            grown[1:, 1:] += rate * positive * mass
            grown[1:, :t] += rate * (1 - positive) * mass
            region = region_from_boundary(self.boundary, t)
            rejected += float(grown[region].sum())
            grown[region] = 0.0
            mass = grown
        return rejected, expected

    def to_arrays(self) -> Dict[str, np.ndarray]:
        meta = np.array([self.horizon, self.alpha, self.size.worst_rate, self.size.bound, self.version])
        return dict(zip(DESIGN_ARRAYS, (self.boundary.astype(np.int32), self.size.by_discordant, meta)))

    @classmethod
    def from_arrays(cls, arrays: Dict[str, np.ndarray]) -> "HorizonDesign":
        boundary, by_discordant, meta = (np.asarray(arrays[name]) for name in DESIGN_ARRAYS)
        horizon, alpha, worst_rate, bound, version = (float(v) for v in meta)
        return cls(
            int(horizon),
            alpha,
            boundary.astype(np.int32),
            SizeCertificate(by_discordant.astype(np.float64), worst_rate, bound),
            int(version),
        )


def synthesise(horizon: int, alpha: float, *, rounds: int = DESIGN_ROUNDS) -> HorizonDesign:
    """The certified design for `horizon` clusters at level `alpha` (deterministic: no random draw)."""
    if not 1 <= horizon <= HORIZON_MAX:
        raise ValueError(f"a horizon design needs 1 <= horizon <= {HORIZON_MAX} clusters, got {horizon}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    synthesis = _Synthesis(horizon)
    mixture = np.full(DESIGN_RATE_GRID, 1.0 / DESIGN_RATE_GRID)
    bracket, steps = (-40.0, 40.0), 30
    best: Optional[Tuple[np.ndarray, SizeCertificate, float, float]] = None
    for _ in range(max(1, rounds)):
        with np.errstate(divide="ignore"):
            log_mixture = np.log(np.maximum(mixture @ synthesis.rate_pmf, 1e-300))
        pattern = synthesis.null_pattern(log_mixture)
        found = synthesis.calibrated(alpha, pattern, bracket, steps)
        boundary, cert, log_lambda, value = found
        if best is None or value > best[3]:  # every round's region is certified: keep the most valuable
            best = found
        bracket, steps = (log_lambda - 2.0, log_lambda + 2.0), 12
        at_rates = synthesis.rate_pmf @ cert.by_discordant
        mixture = mixture * np.exp(1.5 * np.clip((at_rates - alpha) / alpha, -1.0, 1.0))
        mixture /= mixture.sum()
    assert best is not None
    boundary, cert, _, _ = best
    return HorizonDesign(horizon, alpha, boundary, cert)


def round_steps(z: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Steps in {-1, 0, +1} with mean z (z in [-1, 1]): sign(z) when uniform < |z|."""
    return np.where(uniforms < np.abs(z), np.sign(z), 0.0).astype(np.int8)


def scaled_payoffs(x: np.ndarray, margin: float, upper: bool, weights: Optional[np.ndarray] = None) -> np.ndarray:
    """z in [-1, 1] with mean <= 0 under the side's H0: (x - m) / (1 + |m|) (upper) or its mirror."""
    z = (x - margin) if upper else (margin - x)
    z = z / (1.0 + abs(margin))
    return z if weights is None else z * weights


def needs_rounding(x: np.ndarray, margin: float, weights: Optional[np.ndarray]) -> bool:
    """Whether some payoff is not already a step (clusters of several trials, a margin, unit weights)."""
    z = scaled_payoffs(x, margin, True, weights)
    return bool(np.any((z != 0.0) & (np.abs(z) != 1.0)))


__all__ = [
    "DESIGN_ALTERNATIVES",
    "HORIZON_MAX",
    "MODE_HORIZON",
    "HorizonDesign",
    "HorizonTest",
    "SizeCertificate",
    "certify",
    "independent_alternative",
    "rejection_given_discordant",
    "round_steps",
    "scaled_payoffs",
    "synthesise",
]


# ------------------------------------------------------------------------------------ the test
class _Side:
    """One one-sided question of the horizon test: its margin, direction, level, design and walk."""

    def __init__(self, name: str, margin: float, upper: bool, level: float, design: HorizonDesign, seed: int) -> None:
        self.name, self.margin, self.upper, self.level, self.design = name, margin, upper, level, design
        self.rng = np.random.default_rng([seed, int(upper), int(round(margin * 1e6)) % (2**31)])
        self.t = self.k = self.n = 0
        self.rounded = False

    def advance(self, x: np.ndarray, weights: Optional[np.ndarray]) -> int:
        """Walk over the clusters x; the index of the first rejection (-1 none)."""
        z = scaled_payoffs(x, self.margin, self.upper, weights)
        uniforms = self.rng.random(z.size)  # drawn whether needed or not: the stream never depends on the data
        exact_steps = np.all((z == 0.0) | (np.abs(z) == 1.0))
        self.rounded = self.rounded or not exact_steps
        steps = np.sign(z).astype(np.int8) if exact_steps else round_steps(z, uniforms)
        t = self.t + np.arange(1, z.size + 1)
        k = self.k + np.cumsum(steps != 0)
        n = self.n + np.cumsum(steps > 0)
        inside = t <= self.design.horizon
        bound = np.full(z.size, NEVER_REJECTS, dtype=np.int64)
        bound[inside] = self.design.boundary[t[inside], k[inside]]
        hits = np.flatnonzero(n >= bound)
        self.t, self.k, self.n = int(t[-1]), int(k[-1]), int(n[-1])
        return int(hits[0]) if hits.size else -1


class HorizonTest(PairedSequentialTest):
    """HORIZON (opt-in): PASS and REGRESSION decided by certified boundaries that spend alpha (and the
    alarm level) over `horizon` clusters; the anytime betting CS, e-values and the halt's bound run
    beside it as in the exact mode (valid at any stopping time, so also at the horizon test's).
    Not valid past its horizon: a cluster beyond it is refused."""

    mode = MODE_HORIZON
    cs_kind = "betting CS, running intersection (anytime-valid; the decisions are the horizon test's)"

    def __init__(self, settings: TestSettings, mode: HorizonSettings) -> None:
        super().__init__(settings, mode)
        if not 1 <= mode.horizon <= HORIZON_MAX:
            raise ValueError(f"the horizon test needs 1 <= horizon <= {HORIZON_MAX} clusters, got {mode.horizon}")
        self.horizon = int(mode.horizon)
        design = mode.design or synthesise
        margin = -self.delta
        self._pass = _Side("pass", margin, True, self.alpha, design(self.horizon, self.alpha), mode.rounding_seed)
        self._regression = _Side(
            "regression", margin, False, self.alarm_alpha, design(self.horizon, self.alarm_alpha), mode.rounding_seed
        )

    def _report(self) -> HorizonReport:
        bet = super()._report()
        sides = (self._pass, self._regression)
        rounded = any(side.rounded for side in sides)
        return HorizonReport(
            bet_rule=bet.bet_rule,
            bet_cap=bet.bet_cap,
            bet_cap_rule=bet.bet_cap_rule,
            horizon=self.horizon,
            design_version=HORIZON_DESIGN_VERSION,
            certified_size={side.name: side.design.size.bound for side in sides},
            rounding=(
                "randomised: each cluster's scaled payoff rounded to a step from a stream seeded before the stratum"
                if rounded
                else "none: every payoff was already a step (single trials at margin 0)"
            ),
            valid_within=f"the first {self.horizon} clusters: not valid past its horizon (a continuation is a new test)",
        )

    def _advance(
        self, x: np.ndarray, weights: Optional[np.ndarray], sizes: np.ndarray
    ) -> Tuple[Dict[str, int], Dict[str, np.ndarray]]:
        if self._clusters + x.size > self.horizon:
            raise ValueError(
                f"the horizon test was designed for {self.horizon} clusters and is not valid past them "
                f"({self._clusters + x.size} given); a continuation is a new test (use the anytime test to keep looking)"
            )
        firsts, series = super()._advance(x, weights, sizes)
        firsts.update({"pass": self._pass.advance(x, weights), "regression": self._regression.advance(x, weights)})
        return firsts, series
