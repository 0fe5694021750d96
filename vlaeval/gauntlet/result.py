"""The gauntlet's result as typed objects: what `run_gauntlet` returns and what the report, the plots,
the recommendation, MLflow and job=gauntlet_history read.

`GauntletResult` holds the run; `StratumResult` one stratum's test, `GauntletEvent` what the
scheduler did, `Recommendation` the launch decision. Each is frozen, and `to_json()` writes the
result.json layout (unchanged: readers of earlier results keep working); `from_json()` reads it
back, from this version or an earlier one (a field an older result lacks takes its default).
The fields a reader uses are typed; the rest of what a stratum's sequential test reports (its bet
settings, peak wealth, cluster-order seed, ...) is carried in `details`, written back as it came.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Type

from vlaeval.records import JsonRecord
from vlaeval.seqtest import DECISION_PASS, DECISION_REGRESSION
from vlaeval.seqtest.state import CatastrophicBound, ConfidenceSequence, TestState
from vlaeval.seqtest.units import Drift, SuccessRateInterval

LAUNCH = "LAUNCH"
DO_NOT_LAUNCH = "DO_NOT_LAUNCH"
NEEDS_REVIEW = "NEEDS_REVIEW"
HISTORY_SERIES = ("e_value_regression", "e_value_pass", "delta_estimate", "cs_lower", "cs_upper")


class TrackingView(NamedTuple):
    """What MLflow shows of a result: metrics, gate checks, tags, and metric history (step, value)."""

    metrics: Dict[str, Any]
    checks: Dict[str, bool]
    tags: Dict[str, Any]
    history: Dict[str, List[Tuple[int, Any]]]


def _split(
    cls: Type[Any], data: Mapping[str, Any], exclude: Sequence[str] = ()
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the typed fields of `cls` present in `data`, everything else)."""
    names = {f.name for f in dataclasses.fields(cls)} - set(exclude)
    return {k: v for k, v in data.items() if k in names}, {k: v for k, v in data.items() if k not in names}


@dataclass(frozen=True)
class ObservedNeeds(JsonRecord):
    """For a stratum whose outcomes exist (a file): what it would need at its own observed effect."""

    observed_effect: float
    clusters_needed_at_observed_effect: float  # inf: no resampled run decided within the simulated horizon
    units_needed_at_observed_effect: float
    # What a file like this one (its clusters resampled, as many as it holds) most likely decides:
    # plans before it was planned read "" and nan.
    likely_outcome_at_observed_effect: str = ""
    decision_probability_at_observed_effect: float = float("nan")


@dataclass(frozen=True)
class RecordedOrder(JsonRecord):
    """Where the anytime test, reading an outcome file's clusters as a stream in the order the file
    records them, would have decided: a description of that order, never the file's certificate."""

    WRITTEN_WHEN_NONE = ("decided_at_cluster", "decided_at_unit")

    decision: str
    decided_at_cluster: Optional[int]
    decided_at_unit: Optional[int]
    clusters: int
    what: str = "the anytime test on the clusters in the file's recorded order: not the certificate"


@dataclass(frozen=True, kw_only=True)
class StratumPlanRow(JsonRecord):
    """One stratum's plan: the simulated test's clusters and units to a decision (inf: never within
    the simulated horizon), the chance of deciding within the stratum's units, the floors."""

    stratum: str
    margin_delta: float
    assumed_effect: float
    expected_decision: str
    cluster_size: int | str  # one size, or "min-max" for a plan of unequal clusters
    clusters_available: int
    unit_limit: int
    median_clusters: float
    median_units: float
    p90_units: float
    decision_probability_within_limit: float
    likely_outcome: str = ""  # plans before it was planned: read as ""
    pass_share: float
    floor_clusters: float
    fixed_n_z_clusters: float
    replications: int
    observed: Optional[ObservedNeeds] = None

    def to_json(self) -> Dict[str, Any]:
        out = super().to_json()  # the observed needs sit beside the row's own figures, as they always have
        observed = out.pop("observed", None)
        return out | (observed or {})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StratumPlanRow":
        row = super().from_json(data)
        if "observed_effect" not in data:
            return row
        return dataclasses.replace(row, observed=ObservedNeeds.from_json(data))


@dataclass(frozen=True)
class GauntletPlan(JsonRecord):
    """The plan of every stratum in priority order, the budget check and the warnings; `ok` when
    there are none."""

    assumed_effect: float
    test_mode: str
    alpha: float
    alarm_alpha: float
    expected_units: float
    budget_units: int
    strata: Tuple[StratumPlanRow, ...]
    warnings: Tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.warnings

    @property
    def from_outcomes(self) -> bool:
        """A plan of outcomes that exist (a file's): its rows carry the needs at the observed effect."""
        return any(r.observed is not None for r in self.strata)

    def to_json(self) -> Dict[str, Any]:
        return super().to_json() | {"ok": self.ok}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GauntletPlan":
        rows = tuple(StratumPlanRow.from_json(r) for r in data.get("strata", ()))
        return super().from_json({"warnings": (), **data, "strata": rows})


@dataclass(frozen=True)
class StratumResult:
    """One stratum's evaluation: its plan and budget, what was evaluated, the test's decision and
    figures, each policy's success rate, and the per-cluster trajectory (columns)."""

    stratum: str
    priority: int
    data_label: str
    kind: str
    planted_effect: Any  # a success-rate difference, or a rollout degradation (a mapping)
    units_available: int
    unit_limit: int
    units_evaluated: int
    clusters_evaluated: int
    units_produced: int
    decision: str
    test_mode: str
    alpha: float
    alarm_alpha: float
    margin_delta: float
    confidence_sequence: ConfidenceSequence
    delta_estimate: Optional[float] = None
    decided_at_cluster: Optional[int] = None
    decided_at_unit: Optional[int] = None
    decision_wealth: Optional[float] = None
    e_value_regression: Optional[float] = None
    e_value_pass: Optional[float] = None
    success_rates: Mapping[str, SuccessRateInterval] = field(default_factory=dict)  # baseline, candidate
    catastrophic: Optional[str] = None  # CATASTROPHIC / NOT_CATASTROPHIC / UNDECIDED (halting strata)
    catastrophic_delta: Optional[float] = None
    catastrophic_alpha: Optional[float] = None
    catastrophic_bound: Optional[CatastrophicBound] = None
    trajectory: Mapping[str, List[Any]] = field(default_factory=dict)
    drift: Optional[Drift] = None  # the estimand early vs late in the evaluation order (None: not recorded)
    details: Mapping[str, Any] = field(default_factory=dict)  # the rest of the test's report, as it came

    @property
    def halting(self) -> bool:
        return self.catastrophic_delta is not None

    @property
    def answer(self) -> str:
        """The decision in the run's question's words (BETTER, WORSE, ...; a launch's: the decision)."""
        return str(self.details.get("answer", self.decision))

    @property
    def recorded_order(self) -> Optional[RecordedOrder]:
        """An outcome file's stratum: where a stream in the file's recorded order would have decided."""
        found = self.details.get("recorded_order_stream")
        return None if not found else RecordedOrder.from_json(found)

    @property
    def certifies(self) -> str:
        """What the decision certifies, in one phrase (empty in results before it was recorded)."""
        return str(self.details.get("certifies", ""))

    @property
    def continuation(self) -> Mapping[str, Any]:
        """What an outcome file's test continued from the evidence ledger (status, run, earlier looks,
        note); empty for a stratum that records no evidence (a stream)."""
        return (self.details.get("evidence") or {}).get("continuation") or {}

    def look_ends(self) -> List[int]:
        """The trajectory's index at the end of each look: its columns hold one record per cluster, or
        (an order-free test of a file, which has no order within a look) one per look."""
        looks = [int(c) for c in self.trajectory.get("looks", [])]
        if len(self.trajectory.get("clusters", [])) == len(looks):
            return list(range(len(looks)))
        return [clusters - 1 for clusters in looks]

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "details":
                continue
            value = getattr(self, f.name)
            if f.name in ("catastrophic", "catastrophic_delta", "catastrophic_alpha") and not self.halting:
                continue  # a non-halting stratum's report has no catastrophic keys
            if f.name == "catastrophic_bound":
                if value is None:
                    continue
                value = value.to_json()
            if f.name == "drift":
                if value is None:
                    continue
                value = value.as_dict()
            if f.name == "success_rates":
                value = {who: interval.as_dict() for who, interval in value.items()}
            out[f.name] = value.to_json() if isinstance(value, ConfidenceSequence) else value
        out.update(self.details)
        return out

    @classmethod
    def of_test(cls, state: TestState, **fields: Any) -> "StratumResult":
        """A stratum's record from its test's state and the scheduler's figures (`fields`: the
        rest of this class's fields; `details` holds what the report carries untyped)."""
        c = state.catastrophic
        return cls(
            decision=state.decision,
            test_mode=state.test_mode,
            alpha=state.alpha,
            alarm_alpha=state.alarm_alpha,
            margin_delta=state.margin_delta,
            confidence_sequence=state.confidence_sequence,
            delta_estimate=state.delta_estimate,
            decided_at_cluster=state.decided_at_cluster,
            decided_at_unit=state.decided_at_unit,
            decision_wealth=state.decision_wealth,
            e_value_regression=state.e_values.regression,
            e_value_pass=state.e_values.pass_,
            catastrophic=None if c is None else c.status,
            catastrophic_delta=None if c is None else c.delta,
            catastrophic_alpha=None if c is None else c.alpha,
            catastrophic_bound=None if c is None else c.bound,
            **fields,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StratumResult":
        """A saved stratum (a result.json), from this version or an earlier one."""
        known, rest = _split(cls, data, exclude=("details",))
        known["confidence_sequence"] = ConfidenceSequence.from_json(data["confidence_sequence"])
        bound = data.get("catastrophic_bound")
        known["catastrophic_bound"] = CatastrophicBound.from_json(bound) if bound else None
        known["success_rates"] = {
            who: SuccessRateInterval.from_json(interval) for who, interval in (data.get("success_rates") or {}).items()
        }
        known["drift"] = Drift.from_json(data["drift"]) if data.get("drift") else None
        for name in ("units_produced", "clusters_evaluated", "units_available", "unit_limit"):
            known.setdefault(name, int(data.get("units_evaluated", 0)) if name != "clusters_evaluated" else 0)
        known.setdefault("data_label", "UNLABELLED")
        known.setdefault("kind", "")
        known.setdefault("planted_effect", 0.0)
        known.setdefault("test_mode", "exact")
        known.setdefault("alarm_alpha", known.get("alpha", 0.05))
        known.setdefault("margin_delta", 0.0)
        return cls(**known, details=rest)


@dataclass(frozen=True)
class GauntletEvent:
    """What the scheduler did after a stratum (CATASTROPHIC_HALT, APPROXIMATE_HALT_SIGNAL,
    REGRESSION_PRIORITIZE_RELATED, CRITICAL_PASS_EXPAND, BUDGET_EXHAUSTED), its words and figures."""

    event: str
    detail: str
    stratum: Optional[str] = None
    figures: Mapping[str, Any] = field(default_factory=dict)  # event-specific: delta_estimate, promoted, ...

    def to_json(self) -> Dict[str, Any]:
        head = {"event": self.event, **({"stratum": self.stratum} if self.stratum is not None else {})}
        return {**head, **self.figures, "detail": self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GauntletEvent":
        figures = {k: v for k, v in data.items() if k not in ("event", "detail", "stratum")}
        return cls(str(data["event"]), str(data.get("detail", "")), data.get("stratum"), figures)


@dataclass(frozen=True)
class Recommendation:
    """LAUNCH, DO_NOT_LAUNCH or NEEDS_REVIEW, with what blocks it and what needs a human."""

    recommendation: str
    blockers: Tuple[str, ...] = ()
    review_reasons: Tuple[str, ...] = ()
    passed_strata: Tuple[str, ...] = ()
    data_labels: Tuple[str, ...] = ()
    demonstration: bool = False
    rule: str = ""
    kind: str = "launch"  # "comparison": a BETTER / NOT_BETTER / WORSE / MIXED / UNDECIDED answer, notes, no blockers

    @property
    def launch(self) -> bool:
        return self.kind == "launch"

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Recommendation":
        return cls(
            recommendation=str(data["recommendation"]),
            blockers=tuple(data.get("blockers", [])),
            review_reasons=tuple(data.get("review_reasons", [])),
            passed_strata=tuple(data.get("passed_strata", [])),
            data_labels=tuple(data.get("data_labels", [])),
            demonstration=bool(data.get("demonstration", False)),
            rule=str(data.get("rule", "")),
            kind=str(data.get("kind", "launch")),
        )


@dataclass(frozen=True)
class Scale:
    """How many units the strata define, how many were evaluated and made, and the budget."""

    total_units_defined: int
    units_evaluated: int
    units_saved: int
    units_produced: int
    produced_on_demand: bool
    budget_units: int
    budget_remaining: int
    nominal_allowance_final: int

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Scale":
        evaluated = int(data["units_evaluated"])
        return cls(
            int(data["total_units_defined"]),
            evaluated,
            int(data.get("units_saved", int(data["total_units_defined"]) - evaluated)),
            int(data.get("units_produced", evaluated)),
            bool(data.get("produced_on_demand", False)),
            int(data.get("budget_units", 0)),
            int(data.get("budget_remaining", 0)),
            int(data.get("nominal_allowance_final", 0)),
        )


@dataclass(frozen=True)
class Lineage(JsonRecord):
    """What was compared, on which data, with which code and config, and what is wrong with it: a run
    whose lineage is not `valid` is never valid for launch, whatever its statistics say."""

    candidate_version: str = ""
    baseline_version: str = ""
    data_source: Mapping[str, Any] = field(default_factory=dict)  # the outcome source's describe()
    seeds: Mapping[str, Any] = field(default_factory=dict)
    cluster_order: str = ""
    code: Mapping[str, Any] = field(default_factory=dict)  # provenance.CodeVersion, as result.json holds it
    config_sha256: str = ""
    created_at: str = ""
    problems: Tuple[str, ...] = ()
    valid: bool = False  # no problems when it was built (an early result.json holds only this)


@dataclass(frozen=True)
class CacheUse(JsonRecord):
    """What one run did to the outcome cache: hits, misses, corrupt entries recomputed, its hit rate."""

    WRITTEN_WHEN_NONE = ("hit_rate",)

    hits: int = 0
    misses: int = 0
    corrupt_recomputed: int = 0
    hit_rate: Optional[float] = None  # None: nothing looked up
    corrupt_entries: Tuple[str, ...] = ()


@dataclass(frozen=True)
class MultiplicityStatement(JsonRecord):
    """How the launch rule and the alarms control their errors, in words, and the alarms' level."""

    launch: str = ""
    alarms: str = ""
    alarm_alpha: float = float("nan")


@dataclass(frozen=True)
class RolloutCost(JsonRecord):
    """What a rollout source's episodes cost: seconds in the engine, episodes run and taken from the
    cache, simulator steps, episode pairs produced, and the rates (None: nothing ran)."""

    WRITTEN_WHEN_NONE = ("env_steps_per_s", "rollouts_per_s")

    rollout_s: float
    episodes_run: int
    episodes_from_cache: int
    env_steps: int
    episode_pairs_produced: int
    env_steps_per_s: Optional[float]
    rollouts_per_s: Optional[float]


@dataclass(frozen=True)
class RolloutsRecord(JsonRecord):
    """After a rollout gauntlet: what the rollouts cost, the paired-outcome file every episode pair
    went into, the failure registry and what it gained, what early stopping saved, the videos."""

    cost: RolloutCost
    paired_outcomes: str
    registry: str
    registry_entries_added: int
    episode_pairs_evaluated: int
    episode_pairs_full_evaluation: int
    rollouts_saved_by_early_stop: int
    videos: Tuple[str, ...] = ()

    def to_json(self) -> Dict[str, Any]:
        rest = super().to_json()
        return self.cost.to_json() | {k: v for k, v in rest.items() if k != "cost"}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RolloutsRecord":
        return super().from_json({**data, "cost": RolloutCost.from_json(data)})


@dataclass(frozen=True)
class GauntletResult:
    """A whole gauntlet: the strata in the order evaluated, the events, the recommendation, the scale
    and the lineage, and what the job adds (pre-flight plan, notices, the rollouts' record)."""

    candidate_version: str
    baseline_version: str
    planted_effects: Mapping[str, Any]
    scale: Scale
    strata: Tuple[StratumResult, ...]
    events: Tuple[GauntletEvent, ...]
    recommendation: Recommendation
    halted: bool
    test_mode: str
    not_evaluated: Tuple[str, ...] = ()
    absent_strata: Tuple[str, ...] = ()
    required_absent: Tuple[str, ...] = ()  # absent strata that hold a launch's recommendation
    priority_order: Tuple[str, ...] = ()
    processed_order: Tuple[str, ...] = ()
    lineage: Lineage = field(default_factory=Lineage)
    timing: Mapping[str, Any] = field(default_factory=dict)
    cache: CacheUse = field(default_factory=CacheUse)
    multiplicity: MultiplicityStatement = field(default_factory=MultiplicityStatement)
    statistical_validity: str = ""
    cluster_order: Mapping[str, Any] = field(default_factory=dict)
    question: str = "non_inferiority"  # vlaeval.choices.Question (results before it: a launch)
    superiority_gain: float = 0.0
    # Added by job=gauntlet after the run.
    preflight: Optional[GauntletPlan] = None
    notices: Tuple[str, ...] = ()
    rollouts: Optional[RolloutsRecord] = None

    @property
    def status(self) -> str:
        return "halted" if self.halted else "completed"

    @property
    def lineage_valid(self) -> bool:
        return self.lineage.valid

    @property
    def valid_for_launch(self) -> bool:
        return self.lineage_valid and not self.halted and self.recommendation.launch

    def stratum(self, name: str) -> StratumResult:
        for s in self.strata:
            if s.stratum == name:
                return s
        raise KeyError(f"no stratum {name!r} was evaluated")

    def tracking_view(self) -> TrackingView:
        """Metrics, gate checks, tags and per-batch history (step = batch; result.json keeps every cluster)."""
        scale, rec = self.scale, self.recommendation
        metrics: Dict[str, Any] = {
            "scale.units_evaluated": scale.units_evaluated,
            "scale.units_saved": scale.units_saved,
            "scale.budget_remaining": scale.budget_remaining,
            "cache.hits": self.cache.hits,
            "cache.misses": self.cache.misses,
            "cache.corrupt_recomputed": self.cache.corrupt_recomputed,
            "timing.wall_s": self.timing["wall_s"],
            "timing.units_per_second": self.timing["units_per_second"],
            "halted": float(self.halted),
            # A launch's recommendation, or a comparison's answer, as a 0/1 the runs table can sort by.
            **(
                {"launch": float(rec.recommendation == LAUNCH)}
                if rec.launch
                else {"better": float(rec.recommendation == "BETTER")}
            ),
        }
        tags: Dict[str, Any] = {
            "recommendation": rec.recommendation,
            "gauntlet.question": self.question,
            "halted": str(self.halted).lower(),
            "gauntlet.processed_order": ",".join(self.processed_order),
            "gauntlet.test_mode": self.test_mode,
            "gauntlet.alarm_alpha": f"{self.multiplicity.alarm_alpha:.6g}",
        }
        if "order_seed" in self.cluster_order:  # job=reproduce replays a freshly drawn one
            tags["gauntlet.order_seed"] = str(self.cluster_order["order_seed"])
            tags["gauntlet.order_seed_basis"] = self.cluster_order["basis"]
        if self.rollouts is not None:  # what the rollouts cost, and what early stopping saved
            r = self.rollouts
            metrics["rollouts.episodes_run"] = r.cost.episodes_run
            metrics["rollouts.episodes_from_cache"] = r.cost.episodes_from_cache
            metrics["rollouts.rollouts_saved_by_early_stop"] = r.rollouts_saved_by_early_stop
            metrics["rollouts.env_steps_per_s"] = r.cost.env_steps_per_s
            metrics["rollouts.registry_entries_added"] = r.registry_entries_added
        if self.preflight is not None:
            metrics["preflight.ok"] = float(self.preflight.ok)
            metrics["preflight.expected_units"] = self.preflight.expected_units
        history: Dict[str, List[Tuple[int, Any]]] = {}
        for s in self.strata:
            key = f"stratum.{s.stratum}"
            metrics.update(
                {
                    f"{key}.units_evaluated": s.units_evaluated,
                    f"{key}.delta_estimate": s.delta_estimate,
                    f"{key}.cs_lower": s.confidence_sequence.lower,
                    f"{key}.cs_upper": s.confidence_sequence.upper,
                    f"{key}.decision_pass": float(s.decision == DECISION_PASS),
                    f"{key}.decision_regression": float(s.decision == DECISION_REGRESSION),
                    f"{key}.baseline_success_rate": s.success_rates["baseline"].rate,
                    f"{key}.candidate_success_rate": s.success_rates["candidate"].rate,
                }
            )
            if s.catastrophic_bound is not None:
                metrics[f"{key}.catastrophic_upper_bound"] = s.catastrophic_bound.upper
            tags[f"{key}.decision"] = s.decision
            if not rec.launch:
                tags[f"{key}.answer"] = s.answer
            drift_z = s.drift.z if s.drift is not None else None
            if drift_z is not None:
                metrics[f"{key}.drift_z"] = drift_z
            ends = s.look_ends()
            for series in HISTORY_SERIES:
                if series in s.trajectory:  # the approximate modes have no e-values
                    history[f"{key}.{series}"] = [(b, s.trajectory[series][i]) for b, i in enumerate(ends, start=1)]
        for name in self.absent_strata:
            tags[f"stratum.{name}.decision"] = "ABSENT"
        return TrackingView(metrics, self.checks(), tags, history)

    def checks(self) -> Dict[str, bool]:
        """The gate checks MLflow records: a launch's, or a comparison's (did it answer, is it BETTER)."""
        evaluated = {s.stratum for s in self.strata}
        all_evaluated = not self.not_evaluated and evaluated == set(self.priority_order)
        if not self.recommendation.launch:
            return {
                "lineage_valid": self.lineage_valid,
                "all_strata_evaluated": all_evaluated,
                "all_strata_better": bool(self.strata) and all(s.answer == "BETTER" for s in self.strata),
                "all_strata_decided": all(s.decision != "INSUFFICIENT" for s in self.strata),
            }
        return {
            "no_catastrophic_halt": not self.halted,
            "lineage_valid": self.lineage_valid,
            "no_stratum_regression": all(s.decision != DECISION_REGRESSION for s in self.strata),
            "all_strata_evaluated": all_evaluated,
            "all_strata_pass": all(s.decision == DECISION_PASS for s in self.strata),
            "replayed_data_evaluated": "REPLAYED" in self.recommendation.data_labels,
        }

    def with_job_record(
        self, *, preflight: Optional[GauntletPlan], notices: Sequence[str], rollouts: Optional[RolloutsRecord]
    ) -> "GauntletResult":
        return dataclasses.replace(self, preflight=preflight, notices=tuple(notices), rollouts=rollouts)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "candidate_version": self.candidate_version,
            "baseline_version": self.baseline_version,
            "planted_effects": dict(self.planted_effects),
            "scale": self.scale.to_json(),
            "timing": dict(self.timing),
            "cache": self.cache.to_json(),
            "priority_order": list(self.priority_order),
            "processed_order": list(self.processed_order),
            "not_evaluated": list(self.not_evaluated),
            "absent_strata": list(self.absent_strata),
            "required_absent": list(self.required_absent),
            "halted": self.halted,
            "status": self.status,
            "events": [e.to_json() for e in self.events],
            "strata": [s.to_json() for s in self.strata],
            "lineage": self.lineage.to_json(),
            "lineage_valid": self.lineage_valid,
            "valid_for_launch": self.valid_for_launch,
            "recommendation": self.recommendation.to_json(),
            "question": self.question,
            "superiority_gain": self.superiority_gain,
            "test_mode": self.test_mode,
            "multiplicity": self.multiplicity.to_json(),
            "statistical_validity": self.statistical_validity,
            "cluster_order": dict(self.cluster_order),
        }
        if self.preflight is not None:
            out["preflight"] = self.preflight.to_json()
        if self.notices or self.preflight is not None:
            out["notices"] = list(self.notices)
        if self.rollouts is not None:
            out["rollouts"] = self.rollouts.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GauntletResult":
        """A saved result.json (this version's or an earlier one's); run keys (run_id, metrics, ...) are ignored."""
        return cls(
            candidate_version=str(data.get("candidate_version", "")),
            baseline_version=str(data.get("baseline_version", "")),
            planted_effects=dict(data.get("planted_effects", {})),
            scale=Scale.from_json(data["scale"]),
            strata=tuple(StratumResult.from_json(s) for s in data.get("strata", [])),
            events=tuple(GauntletEvent.from_json(e) for e in data.get("events", [])),
            recommendation=Recommendation.from_json(data["recommendation"]),
            halted=bool(data.get("halted", False)),
            test_mode=str(data.get("test_mode", "exact")),
            not_evaluated=tuple(data.get("not_evaluated", [])),
            absent_strata=tuple(data.get("absent_strata", [])),
            required_absent=tuple(data.get("required_absent", [])),
            priority_order=tuple(data.get("priority_order", [])),
            processed_order=tuple(data.get("processed_order", [])),
            lineage=Lineage.from_json(data.get("lineage", {"valid": data.get("lineage_valid", False)})),
            timing=dict(data.get("timing", {})),
            cache=CacheUse.from_json(data.get("cache", {})),
            multiplicity=MultiplicityStatement.from_json(data.get("multiplicity", {})),
            statistical_validity=str(data.get("statistical_validity", "")),
            cluster_order=dict(data.get("cluster_order", {})),
            question=str(data.get("question", "non_inferiority")),
            superiority_gain=float(data.get("superiority_gain", 0.0)),
            preflight=GauntletPlan.from_json(data["preflight"]) if "preflight" in data else None,
            notices=tuple(data.get("notices", [])),
            rollouts=RolloutsRecord.from_json(data["rollouts"]) if data.get("rollouts") else None,
        )
