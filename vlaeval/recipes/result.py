"""job=recipe_comparison's result: what each recipe did seed by seed, the test over seed pairs and
the planner, typed and frozen; `to_json` is its result.json layout."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from vlaeval.recipes.seeds import SeedEvaluation, SeedPair
from vlaeval.records import JsonRecord
from vlaeval.seqtest.seeds import SeedInterval, SeedsNeeded, SeedTestState, paired_exact_p, per_task_sd, seed_spread


def _finite(x: float) -> Optional[float]:
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class SeedLook(JsonRecord):
    """The sequence after `seeds` pairs (low / high None: nothing excluded yet)."""

    seeds: int
    mean: float
    sd: Optional[float]
    low: Optional[float]
    high: Optional[float]

    @classmethod
    def of(cls, interval: SeedInterval) -> "SeedLook":
        return cls(interval.seeds, interval.mean, _finite(interval.sd), _finite(interval.low), _finite(interval.high))


@dataclass(frozen=True)
class RecipeSummary(JsonRecord):
    """One recipe over the seeds run: its success per seed, their mean and SD, each task's mean and
    SD across seeds, and the seed-spread matrix (seed i's success minus seed j's) with the exact
    episode-level p of each pair -- how different two runs of one recipe look to a one-run test."""

    name: str
    overrides: Tuple[str, ...]
    success: Tuple[float, ...]
    mean: float
    sd: Optional[float]
    per_task_mean: Mapping[str, float]
    per_task_sd: Mapping[str, Optional[float]]
    spread: Tuple[Tuple[float, ...], ...]
    spread_p: Tuple[Tuple[float, ...], ...]

    @classmethod
    def of(cls, name: str, overrides: Sequence[str], runs: Sequence[SeedEvaluation]) -> "RecipeSummary":
        success = [r.success_rate for r in runs]
        tasks = [r.per_task() for r in runs]
        sd = float(np.std(success, ddof=1)) if len(success) >= 2 else math.nan
        return cls(
            name=name,
            overrides=tuple(overrides),
            success=tuple(success),
            mean=float(np.mean(success)),
            sd=_finite(sd),
            per_task_mean={t: float(np.mean([row[t] for row in tasks])) for t in tasks[0]},
            per_task_sd={t: _finite(v) for t, v in per_task_sd(tasks).items()},
            spread=tuple(tuple(float(x) for x in row) for row in seed_spread(success)),
            spread_p=tuple(tuple(paired_exact_p(a.success, b.success) for b in runs) for a in runs),
        )


@dataclass(frozen=True)
class RecipeComparisonResult(JsonRecord):
    """Both recipes seed by seed, the test's decision (BETTER / WORSE / EQUIVALENT / UNDECIDED: the
    candidate against the baseline), the seed pair it was reached at, the sequence at every look,
    the planner, and where the seed pairs' outcome file is."""

    source: str  # "trained" or the outcome file read
    baseline: RecipeSummary
    candidate: RecipeSummary
    pairs: Tuple[SeedPair, ...]
    decision: str
    decided_at: Optional[int]
    looks: Tuple[SeedLook, ...]
    alpha: float
    margin: float
    prior_scale: float
    method: str
    sd_floor: float  # one episode's worth of success: the least seed-pair SD the test uses
    plan_sd: Optional[float]
    plan: Tuple[SeedsNeeded, ...]
    seed_outcomes: str
    WRITTEN_WHEN_NONE = ("decided_at",)

    @property
    def differences(self) -> Tuple[float, ...]:
        return tuple(p.difference for p in self.pairs)

    @classmethod
    def of(
        cls,
        *,
        source: str,
        names: Tuple[str, str],
        overrides: Tuple[Sequence[str], Sequence[str]],
        pairs: Sequence[SeedPair],
        test: SeedTestState,
        method: str,
        sd_floor: float,
        plan_sd: Optional[float],
        plan: Sequence[SeedsNeeded],
        seed_outcomes: str,
    ) -> "RecipeComparisonResult":
        return cls(
            source=source,
            baseline=RecipeSummary.of(names[0], overrides[0], [p.baseline for p in pairs]),
            candidate=RecipeSummary.of(names[1], overrides[1], [p.candidate for p in pairs]),
            pairs=tuple(pairs),
            decision=test.decision,
            decided_at=test.decided_at,
            looks=tuple(SeedLook.of(i) for i in test.path),
            alpha=test.alpha,
            margin=test.margin,
            prior_scale=test.prior_scale,
            method=method,
            sd_floor=sd_floor,
            plan_sd=plan_sd,
            plan=tuple(plan),
            seed_outcomes=seed_outcomes,
        )

    def metrics(self) -> Dict[str, Optional[float]]:
        last = self.looks[-1]
        out: Dict[str, Optional[float]] = {
            "recipes.seeds": float(len(self.pairs)),
            "recipes.difference": last.mean,
            "recipes.difference_sd": last.sd,
            "recipes.baseline.success": self.baseline.mean,
            "recipes.candidate.success": self.candidate.mean,
            "recipes.baseline.seed_sd": self.baseline.sd,
            "recipes.candidate.seed_sd": self.candidate.sd,
        }
        if last.low is not None and last.high is not None:
            out.update({"recipes.difference_low": last.low, "recipes.difference_high": last.high})
        return out
