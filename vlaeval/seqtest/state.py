"""What a sequential test says after a look, as typed, frozen records: `SequentialTest.update`
returns a `TestState`, and the gauntlet's scheduler, its halt and its stratum record read its
attributes (a renamed field is an error where it is read, not a silent default).

`TestState.to_json()` writes the layout the test's report has always had in result.json (the
stratum's keys: decision, decided_at_cluster, ..., confidence_sequence, e_value_*, catastrophic_*);
`from_json` is for files only.

The settings a test is built from are typed too: `TestSettings` (what every mode shares) and one
dataclass per mode (`ExactSettings`, `AsymptoticSettings`, `GroupSequentialSettings`,
`OrderFreeSettings`); `vlaeval.seqtest.modes.make_sequential_test` picks the test from the type of
the mode's settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from vlaeval.choices import DEFAULT_BET_RULE as DEFAULT_BET_RULE_CHOICE
from vlaeval.choices import DEFAULT_ORDERS  # every order costs one pass over the margins still alive
from vlaeval.records import JsonRecord

DEFAULT_BET_RULE = DEFAULT_BET_RULE_CHOICE.value  # chosen by benchmarks/seqtest_efficiency.py (vlaeval.choices)
DEFAULT_BET_CAP: Optional[float] = None  # the size-adaptive cap 1 - 0.2 / (smallest planned cluster size)


# ---------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class TestSettings:
    """What every mode's test is built from, fixed before its first cluster.

    delta: the margin is -delta (a negative delta makes PASS a superiority certificate, Delta >
    |delta|); alpha: level of PASS and of the CS; alarm_alpha (<= alpha, None: alpha): level of the
    REGRESSION alarm; catastrophic_delta (>= delta, None: no halt question): the halting question's
    margin, decided at catastrophic_alpha = min(alpha / 2, alarm_alpha); max_cluster_size /
    min_cluster_size: the largest / smallest cluster the stratum's scenario distribution can
    produce, never read off the outcomes being tested (the unit estimand's weights' normaliser; the
    bet cap; None: a predictable running minimum); cs_grid_step: the confidence sequence's grid."""

    __test__ = False  # not a pytest class, whatever its name

    delta: float
    alpha: float
    catastrophic_delta: Optional[float] = None
    alarm_alpha: Optional[float] = None
    estimand: str = "cluster"
    max_cluster_size: Optional[int] = None
    min_cluster_size: Optional[int] = None
    cs_grid_step: float = 0.001


@dataclass(frozen=True)
class ExactSettings:
    """The exact (betting) test: its bet rule and cap (None: the size-adaptive cap 1 - 0.2 / n_min)."""

    bet_rule: str = DEFAULT_BET_RULE
    bet_cap: Optional[float] = DEFAULT_BET_CAP


@dataclass(frozen=True)
class OrderFreeSettings(ExactSettings):
    """The exact test on clusters that all exist (a file): `orders` fixed orders averaged, each
    betting the fixed-horizon plug-in over each block (`fixed_horizon`; False: `bet_rule`, as a
    stream bets), each stopped at `stop_factor` times the threshold (None: min(4, orders) times;
    vlaeval.seqtest.order_free.STOP_FACTOR)."""

    orders: int = DEFAULT_ORDERS
    fixed_horizon: bool = True
    stop_factor: Optional[float] = None


@dataclass(frozen=True)
class AsymptoticSettings:
    """ASYMPTOTIC: no decision before burn_in_clusters; the CS is tightest at tuning_clusters."""

    burn_in_clusters: int = 30
    tuning_clusters: int = 500


@dataclass(frozen=True)
class GroupSequentialSettings:
    """GROUP-SEQUENTIAL: the cluster counts of the planned looks (strictly increasing); looks
    with fewer than burn_in_clusters clusters decide nothing."""

    planned_looks: Tuple[int, ...]
    burn_in_clusters: int = 30


@dataclass(frozen=True)
class HorizonSettings(ExactSettings):
    """HORIZON: decisions from a boundary spending alpha over `horizon` clusters
    (vlaeval.seqtest.horizon), rounding drawn from `rounding_seed`'s streams where payoffs are not
    already steps; `design(horizon, level)` gives the certified boundary (the gauntlet passes a cached
    one; the default synthesises it). The bet settings are the anytime CS's and e-values' reported beside."""

    horizon: int = 0
    rounding_seed: int = 0
    design: Optional[Callable[[int, float], Any]] = None


ModeSettings = ExactSettings | AsymptoticSettings | GroupSequentialSettings
# Each mode's defaults (frozen: one shared instance is safe as a default argument).
EXACT_DEFAULTS = ExactSettings()
ORDER_FREE_DEFAULTS = OrderFreeSettings()
ASYMPTOTIC_DEFAULTS = AsymptoticSettings()


# ---------------------------------------------------------------------------------- state
@dataclass(frozen=True)
class ConfidenceSequence:
    """The running-intersection CS for Delta after the last cluster."""

    lower: float
    upper: float
    level: float
    kind: str

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ConfidenceSequence":
        return cls(float(data["lower"]), float(data["upper"]), float(data.get("level", 0.0)), str(data.get("kind", "")))


@dataclass(frozen=True)
class CatastrophicBound:
    """The one-sided upper confidence bound the halt is decided on, now; and, once the halting
    question is decided, the unit it was decided at, the bound then (a halt) and the wealth of the
    e-process at -catastrophic_delta on the deciding side (where the mode has one)."""

    upper: Optional[float]
    level: float
    kind: str = "one-sided upper confidence sequence the halt is decided on"
    decided_at_unit: Optional[int] = None
    upper_bound_at_decision: Optional[float] = None
    wealth_at_decision: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"upper": self.upper, "level": self.level, "kind": self.kind}
        for name in ("decided_at_unit", "upper_bound_at_decision", "wealth_at_decision"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CatastrophicBound":
        def opt(name: str, kind: type) -> Any:
            return None if data.get(name) is None else kind(data[name])

        return cls(
            upper=opt("upper", float),
            level=float(data.get("level", 0.0)),
            kind=str(data.get("kind", "")),
            decided_at_unit=opt("decided_at_unit", int),
            upper_bound_at_decision=opt("upper_bound_at_decision", float),
            wealth_at_decision=opt("wealth_at_decision", float),
        )


@dataclass(frozen=True)
class EValues:
    """The decision e-processes' wealth now (None where the mode has none): REGRESSION's and PASS's,
    their peaks (exact mode), and the halting question's two sides (halting strata)."""

    regression: Optional[float] = None
    pass_: Optional[float] = None
    peak_regression: Optional[float] = None
    peak_pass: Optional[float] = None
    catastrophic: Optional[float] = None
    not_catastrophic: Optional[float] = None
    halting: bool = False  # whether the halting question's keys are reported (a None included)

    def to_json(self) -> Dict[str, Optional[float]]:
        out: Dict[str, Optional[float]] = {"e_value_regression": self.regression, "e_value_pass": self.pass_}
        if self.peak_regression is not None or self.peak_pass is not None:
            out.update(peak_wealth_regression=self.peak_regression, peak_wealth_pass=self.peak_pass)
        if self.halting:
            out.update(e_value_catastrophic=self.catastrophic, e_value_not_catastrophic=self.not_catastrophic)
        return out


@dataclass(frozen=True)
class CatastrophicState:
    """A halting stratum's question "is Delta below -delta?": CATASTROPHIC, NOT_CATASTROPHIC or
    UNDECIDED, decided at a one-sided level alpha, after at_cluster clusters."""

    delta: float
    alpha: float
    status: str
    at_cluster: Optional[int]
    bound: CatastrophicBound


@dataclass(frozen=True)
class ModeReport(JsonRecord):
    """The mode's own figures as a stratum reports them, beside the figures every mode shares
    (the base: a mode with none of its own)."""


@dataclass(frozen=True)
class ExactReport(ModeReport):
    """The exact test's bet: its rule and cap, and how the cap was set (None: not yet known -- a
    running minimum before the first cluster)."""

    WRITTEN_WHEN_NONE = ("bet_cap",)

    bet_rule: str
    bet_cap: Optional[float]
    bet_cap_rule: str


@dataclass(frozen=True)
class OrderFreeReport(ExactReport):
    """The order-free test: its bet, the number of orders averaged, and the looks' blocks."""

    orders: int
    order_free: str  # what the test averages, in words
    blocks: Tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class HorizonReport(ExactReport):
    """The horizon test: the horizon, each side's certified size, how payoffs became steps."""

    horizon: int
    design_version: int
    certified_size: Mapping[str, float]  # side -> sup over discordance rates of P(reject within the horizon)
    rounding: str
    valid_within: str


@dataclass(frozen=True)
class AsymptoticReport(ModeReport):
    burn_in_clusters: int
    tuning_clusters: int


@dataclass(frozen=True)
class GroupSequentialReport(ModeReport):
    """The planned looks, the spending function and its boundaries per series (None: no bound yet)."""

    planned_looks: Tuple[int, ...]
    burn_in_clusters: int
    spending: str
    boundaries: Mapping[str, Tuple[Optional[float], ...]]


@dataclass(frozen=True)
class TestState:
    """A sequential test after its last look: the decision (sticky from its first rejection) and
    when it was taken, the estimate, the CS, the e-values, and, for a halting stratum, the halt's
    question. `settings` are the mode's own figures as reported (bet rule and cap, burn-in,
    planned looks and boundaries, the order-free blocks)."""

    __test__ = False

    decision: str
    decided_at_cluster: Optional[int]
    decided_at_unit: Optional[int]
    decision_wealth: Optional[float]
    test_mode: str
    alpha: float
    alarm_alpha: float
    margin_delta: float
    estimand: str
    min_cluster_size: Optional[int]
    clusters: int
    units: int
    looks: int
    delta_estimate: Optional[float]
    unit_weighted_delta_estimate: Optional[float]
    confidence_sequence: ConfidenceSequence
    e_values: EValues
    catastrophic: Optional[CatastrophicState] = None
    settings: ModeReport = field(default_factory=ModeReport)

    @property
    def halting(self) -> bool:
        return self.catastrophic is not None

    def to_json(self) -> Dict[str, Any]:
        """The test's report in result.json's layout (the keys a stratum has always had)."""
        out: Dict[str, Any] = {
            "decision": self.decision,
            "decided_at_cluster": self.decided_at_cluster,
            "decided_at_unit": self.decided_at_unit,
            "decision_wealth": self.decision_wealth,
            "test_mode": self.test_mode,
            "alpha": self.alpha,
            "alarm_alpha": self.alarm_alpha,
            "margin_delta": self.margin_delta,
            "estimand": self.estimand,
            "min_cluster_size": self.min_cluster_size,
            **self.settings.to_json(),
            "clusters": self.clusters,
            "units": self.units,
            "looks": self.looks,
            "delta_estimate": self.delta_estimate,
            "unit_weighted_delta_estimate": self.unit_weighted_delta_estimate,
            "confidence_sequence": self.confidence_sequence.to_json(),
            **self.e_values.to_json(),
        }
        if self.catastrophic is not None:
            c = self.catastrophic
            out.update(
                catastrophic_delta=c.delta,
                catastrophic_alpha=c.alpha,
                catastrophic=c.status,
                catastrophic_at_cluster=c.at_cluster,
                catastrophic_bound=c.bound.to_json(),
            )
        return out
