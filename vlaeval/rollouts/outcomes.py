"""An episode's outcome, typed once from the simulator to the per-episode cache, the paired rows of
a rollout gauntlet, its CSV and the failure registry.

`EpisodeOutcome` is one episode (success, an unsafe event, steps); `EpisodeOutcomes` the columns of
many, in their episodes' order (what the rollout engine returns); `PairedEpisode` one scenario run
by both policies, with the episode's spec (what replays it) -- its `row()` is a line of the outcome
file format and its `failure()` a failure-registry entry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, TypedDict

import numpy as np


class OutcomeRow(TypedDict):
    """One episode pair as a line of the outcome-file format, with each policy's unsafe flag and steps."""

    stratum: str
    scenario_id: str
    cluster_id: str
    baseline: bool
    candidate: bool
    baseline_unsafe: bool
    candidate_unsafe: bool
    baseline_steps: int
    candidate_steps: int


class CandidateFailed(TypedDict):
    version: str
    sha256: str
    unsafe: bool


class BaselinePassed(TypedDict):
    version: str
    sha256: str


class FailureEntry(TypedDict):
    """A failure-registry entry (vlaeval/gauntlet/registry.py adds its id): an episode the
    candidate failed and the baseline passed, replayable from its spec."""

    stratum: str
    scenario_id: str
    episode: Dict[str, Any]  # scenarios.episode_spec: what replays it
    candidate: CandidateFailed
    baseline: BaselinePassed
    recorded_at: str


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode: `success` (reached the goal with no unsafe event), `unsafe` (an unsafe contact
    ended it), and the control steps it ran."""

    success: bool
    unsafe: bool
    steps: int


@dataclass(frozen=True)
class EpisodeOutcomes:
    """Many episodes' outcomes as columns (bool, bool, int64), in their episodes' order; with
    `final_success` (bool) where the episodes ran to their horizon (rollout_lockstep's to_horizon):
    whether the goal held at each one's last step."""

    success: np.ndarray
    unsafe: np.ndarray
    steps: np.ndarray
    final_success: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        if not self.success.shape == self.unsafe.shape == self.steps.shape or self.success.ndim != 1:
            raise ValueError("success, unsafe and steps must be 1-D columns of the same length")
        if self.final_success is not None and self.final_success.shape != self.success.shape:
            raise ValueError("final_success must be a column as long as success")

    def __len__(self) -> int:
        return int(self.success.size)

    def __getitem__(self, k: int) -> EpisodeOutcome:
        return EpisodeOutcome(bool(self.success[k]), bool(self.unsafe[k]), int(self.steps[k]))

    def __iter__(self) -> Iterator[EpisodeOutcome]:
        return (self[k] for k in range(len(self)))

    @classmethod
    def of(cls, outcomes: Sequence[EpisodeOutcome]) -> "EpisodeOutcomes":
        return cls(
            np.array([o.success for o in outcomes], dtype=bool),
            np.array([o.unsafe for o in outcomes], dtype=bool),
            np.array([o.steps for o in outcomes], dtype=np.int64),
        )

    @classmethod
    def concatenate(cls, parts: Sequence["EpisodeOutcomes"]) -> "EpisodeOutcomes":
        if not parts:
            return cls.of([])
        success, unsafe, steps = (
            np.concatenate([getattr(p, n) for p in parts]) for n in ("success", "unsafe", "steps")
        )
        finals = [p.final_success for p in parts]
        if any(f is None for f in finals) != all(f is None for f in finals):
            raise ValueError("some parts ran to their horizon and some did not")
        final = None if finals[0] is None else np.concatenate([f for f in finals if f is not None])
        return cls(success, unsafe, steps, final_success=final)


@dataclass(frozen=True)
class PolicyIdentity:
    """Which policy ran an episode: its version label and its checkpoint's sha256."""

    version: str
    sha256: str


@dataclass(frozen=True)
class PairedEpisode:
    """One scenario run by both policies: where it belongs (stratum, scenario, cluster), the
    episode's spec (scene, seed, perturbation: what replays it exactly), and each policy's outcome."""

    stratum: str
    scenario_id: str
    cluster_id: str
    episode: Mapping[str, Any]
    baseline: EpisodeOutcome
    candidate: EpisodeOutcome

    @property
    def discordant(self) -> bool:
        """The candidate failed where the baseline succeeded (what the failure registry records)."""
        return self.baseline.success and not self.candidate.success

    def row(self) -> OutcomeRow:
        """A line of the outcome file format, with each policy's unsafe flag and steps."""
        return {
            "stratum": self.stratum,
            "scenario_id": self.scenario_id,
            "cluster_id": self.cluster_id,
            "baseline": self.baseline.success,
            "candidate": self.candidate.success,
            "baseline_unsafe": self.baseline.unsafe,
            "candidate_unsafe": self.candidate.unsafe,
            "baseline_steps": self.baseline.steps,
            "candidate_steps": self.candidate.steps,
        }

    def failure(self, baseline: PolicyIdentity, candidate: PolicyIdentity) -> FailureEntry:
        """The failure-registry entry of a discordant pair (vlaeval/gauntlet/registry.py)."""
        return {
            "stratum": self.stratum,
            "scenario_id": self.scenario_id,
            "episode": dict(self.episode),
            "candidate": {"version": candidate.version, "sha256": candidate.sha256, "unsafe": self.candidate.unsafe},
            "baseline": {"version": baseline.version, "sha256": baseline.sha256},
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
