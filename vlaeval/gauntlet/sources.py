"""The outcome-source protocol: what the gauntlet asks of a source, named, and checked once.

A source is whatever `outcomes._target_` builds. It implements `OutcomeSource` (describe, validate,
available_strata, cluster_sizes) and one way to give outcomes: `produce(request, clusters, cache)`
(just the clusters the test asks for, batch by batch) or `load(request, cache)` (the whole stratum,
sliced by the scheduler). Everything else is an optional capability, all of its hooks or none:

  PreparesPolicies  prepare(progress) -> (baseline version, candidate version), before any unit
  RecordsEpisodes   paired_outcomes_table(), failures(), stats(), registry: the episodes it ran
  FilmsEpisodes     film(folder, count[, failures]): videos of the episodes the candidate failed and
                    the baseline passed (gauntlet.videos; job=regressions: registry entries)
  Closable          close(): release what it holds (a Ray instance), after the gauntlet
  HasNotices        notices(): lines the report shows before the strata
  LabelsStrata      stratum_data_labels(): where each stratum's evidence came from
  NamesVersions     versions() -> (baseline, candidate), either None: the versions its outcomes name

and a few declared traits (class attributes with defaults, `SourceTraits`). `checked_source` runs
when the source is built, before any work: a missing hook, a capability half implemented or a
trait of the wrong type is a one-line error then, not an AttributeError after every rollout ran.
The gauntlet then talks only to the `CheckedSource`, whose typed fields replace probing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Tuple, runtime_checkable

import numpy as np

from vlaeval.config import Component, FlowConfig, RolloutConfig, TrackingConfig, TrainConfig
from vlaeval.errors import UserInputError
from vlaeval.gauntlet.result import RolloutCost
from vlaeval.rollouts.outcomes import FailureEntry, OutcomeRow

REQUIRED_HOOKS = ("describe", "validate", "available_strata", "cluster_sizes")
OUTCOME_HOOKS = ("produce", "load")  # at least one
# Capability -> its hooks (all or none); `registry` is an attribute with .record(entries) and .path.
CAPABILITIES: Dict[str, Tuple[str, ...]] = {
    "PreparesPolicies": ("prepare",),
    "RecordsEpisodes": ("paired_outcomes_table", "failures", "stats", "registry"),
    "FilmsEpisodes": ("film",),
    "Closable": ("close",),
    "HasNotices": ("notices",),
    "LabelsStrata": ("stratum_data_labels",),
    "NamesVersions": ("versions",),
}
STRATA_FROM_CONFIG = "config"  # strata_from: the configured strata are the source's (rollouts)


@runtime_checkable
class OutcomeSource(Protocol):
    """The hooks every source implements (plus `produce` or `load`)."""

    def describe(self) -> Dict[str, Any]:
        """What the source is (kind, path, sha256 of held outcomes, ...): logged as data_source."""

    def validate(self, strata: Mapping[str, Any], effects: Mapping[str, Any]) -> None:
        """One-line UserInputError for settings it cannot serve, before any unit."""

    def available_strata(self) -> Optional[List[str]]:
        """The strata it has (None: whatever is configured)."""

    def cluster_sizes(self, request: Any) -> np.ndarray:
        """The stratum's plan: its clusters' sizes, known before any outcome."""


class PreparesPolicies(Protocol):
    def prepare(self, progress: Optional[Callable[[str, int, int], None]] = None) -> Tuple[str, str]: ...


class RecordsEpisodes(Protocol):
    registry: Any

    def paired_outcomes_table(self) -> List[OutcomeRow]: ...

    def failures(self) -> List[FailureEntry]: ...

    def stats(self) -> RolloutCost: ...


@dataclass(frozen=True)
class SourceTraits:
    """What a source declares about itself (class attributes; these defaults when absent).

    holds_outcomes: its outcomes exist before the gauntlet (a file): the planner may read them, and
        the cluster order comes from their digest. produces_on_demand: each unit is made when asked
        (rollouts): a fresh cluster order per run. data_label: the label of every unit it makes
        (GENERATED, SIMULATED), over the strata's configured labels. batch_units: the batch size it
        asks for (expensive units), over gauntlet.batch_units. strata_from: "config" when its strata
        are the configured ones."""

    holds_outcomes: bool = False
    produces_on_demand: bool = False
    data_label: Optional[str] = None
    batch_units: Optional[int] = None
    strata_from: Optional[str] = None


@dataclass(frozen=True)
class RunContext:
    """The run's config sections a source that runs policies needs (its constructor's `context`)."""

    model: Component
    data: Component
    flow: FlowConfig
    train: TrainConfig
    tracking: TrackingConfig
    rollout: RolloutConfig  # where and how fast episodes run
    simulator: str  # where they run: a registered simulator's name (vlaeval/envs)
    cache_dir: str


class CheckedSource:
    """A source that passed `checked_source`: its hooks, its capabilities as booleans, its traits typed."""

    def __init__(self, source: Any, traits: SourceTraits, capabilities: Mapping[str, bool]) -> None:
        self.source = source
        self.traits = traits
        self.produces = callable(getattr(source, "produce", None))
        self.prepares_policies = capabilities["PreparesPolicies"]
        self.records_episodes = capabilities["RecordsEpisodes"]
        self.films_episodes = capabilities["FilmsEpisodes"]
        self.closable = capabilities["Closable"]
        self.has_notices = capabilities["HasNotices"]
        self.labels_strata = capabilities["LabelsStrata"]
        self.names_versions = capabilities["NamesVersions"]

    @property
    def name(self) -> str:
        return type(self.source).__name__

    # The protocol, passed through.
    def describe(self) -> Dict[str, Any]:
        return dict(self.source.describe())

    def validate(self, strata: Mapping[str, Any], effects: Mapping[str, Any]) -> None:
        self.source.validate(strata, effects)

    def available_strata(self) -> Optional[List[str]]:
        strata = self.source.available_strata()
        return None if strata is None else [str(s) for s in strata]

    def cluster_sizes(self, request: Any) -> np.ndarray:
        return np.asarray(self.source.cluster_sizes(request), dtype=np.int64)

    def produce(self, request: Any, clusters: np.ndarray, cache: Any) -> Tuple[Any, str]:
        return self.source.produce(request, clusters, cache)

    def load(self, request: Any, cache: Any) -> Tuple[Any, str]:
        return self.source.load(request, cache)

    # The optional capabilities: a no-op where the source lacks them.
    def prepare(self, progress: Optional[Callable[[str, int, int], None]] = None) -> Optional[Tuple[str, str]]:
        return tuple(self.source.prepare(progress)) if self.prepares_policies else None

    def film(self, folder: Path, count: int, failures: Optional[List[Dict[str, Any]]] = None) -> List[Path]:
        if not self.films_episodes or count <= 0:
            return []
        return [Path(p) for p in self.source.film(folder, count, *([] if failures is None else [failures]))]

    def close(self) -> None:
        if self.closable:
            self.source.close()

    def notices(self) -> List[str]:
        return [str(n) for n in self.source.notices()] if self.has_notices else []

    def stratum_data_labels(self) -> Dict[str, str]:
        return {str(k): str(v) for k, v in self.source.stratum_data_labels().items()} if self.labels_strata else {}

    def versions(self) -> Optional[Tuple[Optional[str], Optional[str]]]:
        """(baseline, candidate) as the source names them (either None), or None: it names neither."""
        if not self.names_versions:
            return None
        baseline, candidate = self.source.versions()
        return (None if baseline is None else str(baseline), None if candidate is None else str(candidate))

    def episodes(self) -> RecordsEpisodes:
        """The source as RecordsEpisodes (only when records_episodes)."""
        if not self.records_episodes:
            raise TypeError(f"{self.name} does not record episodes")
        return self.source


def _has(source: Any, hook: str) -> bool:
    value = getattr(source, hook, None)
    return value is not None if hook == "registry" else callable(value)


def checked_source(source: Any) -> CheckedSource:
    """Check `source` against the protocol once, before any work (one-line errors); a CheckedSource
    is returned as it is."""
    if isinstance(source, CheckedSource):
        return source
    name = type(source).__name__
    where = "the OutcomeSource protocol (vlaeval/gauntlet/sources.py)"
    missing = [hook for hook in REQUIRED_HOOKS if not _has(source, hook)]
    if missing:
        raise UserInputError(f"outcome source {name} lacks {', '.join(missing)} of {where}; implement them")
    if not any(_has(source, hook) for hook in OUTCOME_HOOKS):
        raise UserInputError(
            f"outcome source {name} has neither produce(request, clusters, cache) nor load(request, cache) "
            f"of {where}; implement one"
        )
    capabilities: Dict[str, bool] = {}
    for capability, hooks in CAPABILITIES.items():
        present = [hook for hook in hooks if _has(source, hook)]
        if present and len(present) < len(hooks):
            absent = [hook for hook in hooks if hook not in present]
            raise UserInputError(
                f"outcome source {name} implements {', '.join(present)} but not {', '.join(absent)}: "
                f"{capability} ({where}) is all of {', '.join(hooks)} or none"
            )
        capabilities[capability] = bool(present)
    return CheckedSource(source, source_traits(source), capabilities)


def source_traits(source: Any) -> SourceTraits:
    """The traits `source` declares, type-checked (one-line errors)."""
    name = type(source).__name__
    values: Dict[str, Any] = {}
    for field_name, kinds in (
        ("holds_outcomes", (bool,)),
        ("produces_on_demand", (bool,)),
        ("data_label", (str, type(None))),
        ("batch_units", (int, type(None))),
        ("strata_from", (str, type(None))),
    ):
        if not hasattr(source, field_name):
            continue
        value = getattr(source, field_name)
        if not isinstance(value, kinds) or (field_name == "batch_units" and isinstance(value, bool)):
            raise UserInputError(
                f"outcome source {name} declares {field_name}={value!r}; SourceTraits "
                f"(vlaeval/gauntlet/sources.py) wants {' or '.join(k.__name__ for k in kinds)}"
            )
        values[field_name] = value
    traits = SourceTraits(**values)
    if traits.batch_units is not None and traits.batch_units < 1:
        raise UserInputError(f"outcome source {name} declares batch_units={traits.batch_units}; it must be >= 1")
    return traits
