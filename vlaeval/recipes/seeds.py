"""One seed pair of a recipe comparison: each recipe's checkpoint at that training seed -- the
built-in cache slot job=train fills (so seeds trained beforehand by any launcher are found, and a
killed comparison restarts where it was) or trained here on a miss -- and its success on the
comparison's episodes, itself cached by the checkpoint's digest and the episodes. And the same seed
pairs as an outcome file: the paired-outcome columns plus `seed`, which recipes.file reads back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from vlaeval.artifacts import atomic_write_json, sha256_json
from vlaeval.config import EvaluateConfig, RolloutConfig, to_plain
from vlaeval.envs import simulator as registered_simulator
from vlaeval.errors import UserInputError, require
from vlaeval.policy.builtin import PolicyData, PolicyHandle, PolicySpec
from vlaeval.records import JsonRecord
from vlaeval.rollouts.engine import ROLLOUT_ENGINE_VERSION, RolloutJob, held_out_episodes, run_rollout_jobs
from vlaeval.rollouts.evaluation import write_paired_outcomes
from vlaeval.store import get_or_build

EVALUATION_FILE = "evaluation.json"
SEED_COLUMN = "seed"
STRATUM = "recipe_comparison"  # the stratum column of a comparison's outcome file


@dataclass(frozen=True)
class SeedEvaluation(JsonRecord):
    """One checkpoint's success on the comparison's episodes, episode by episode in their order
    (`episodes`: task/variant-v/seed-s, the same for every checkpoint of a comparison); with
    evaluate.run_to_horizon also whether the goal held at each episode's last step."""

    checkpoint_sha256: str
    episodes: Tuple[str, ...]
    tasks: Tuple[str, ...]
    success: Tuple[bool, ...]
    final_success: Optional[Tuple[bool, ...]] = None

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.success))

    @property
    def final_step_success_rate(self) -> Optional[float]:
        return None if self.final_success is None else float(np.mean(self.final_success))

    def per_task(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for task in dict.fromkeys(self.tasks):
            out[task] = float(np.mean([s for s, t in zip(self.success, self.tasks) if t == task]))
        return out


@dataclass(frozen=True)
class SeedPair(JsonRecord):
    """Both recipes at one training seed, on the same episodes; `difference` is the test's draw."""

    seed: int
    baseline: SeedEvaluation
    candidate: SeedEvaluation

    @property
    def difference(self) -> float:
        return self.candidate.success_rate - self.baseline.success_rate


def evaluate_checkpoint(
    handle: PolicyHandle,
    spec: PolicySpec,
    data: PolicyData,
    evaluate: EvaluateConfig,
    rollout: RolloutConfig,
    simulator: str,
    cache_dir: str,
    progress: Optional[Callable[[int, int], None]] = None,
) -> SeedEvaluation:
    """The checkpoint's success on evaluate.*'s episodes, read from the store when this checkpoint
    already ran them (its digest, the flow it samples with, the episodes, the simulator's version)."""
    tasks = list(data.demonstrations.tasks)
    key = sha256_json(
        {
            "engine": ROLLOUT_ENGINE_VERSION,
            **registered_simulator(simulator).cache_identity(),
            "checkpoint": handle.sha256,
            "flow": to_plain(spec.flow),
            # run_to_horizon only when set: evaluations cached before it existed keep their key
            "evaluate": {k: v for k, v in to_plain(evaluate).items() if k != "run_to_horizon" or v},
            "tasks": tasks,
        }
    )

    def build(folder: Path) -> SeedEvaluation:
        episodes, _ = held_out_episodes(tasks, evaluate, simulator)
        [outcomes] = run_rollout_jobs(
            [RolloutJob(data.bind(handle.model, spec.flow), episodes, simulator)], evaluate, rollout, progress
        )
        result = SeedEvaluation(
            checkpoint_sha256=handle.sha256,
            episodes=tuple(f"{e.task}/variant-{e.variant}/seed-{e.seed}" for e in episodes),
            tasks=tuple(e.task for e in episodes),
            success=tuple(bool(s) for s in outcomes.success),
            final_success=None if outcomes.final_success is None else tuple(bool(s) for s in outcomes.final_success),
        )
        atomic_write_json(folder / EVALUATION_FILE, result.to_json())
        return result

    value, _ = get_or_build(
        cache_dir,
        "seed_evaluations",
        key,
        [EVALUATION_FILE],
        read=lambda folder: SeedEvaluation.from_json(json.loads((folder / EVALUATION_FILE).read_text())),
        build=build,
    )
    return value


def outcome_rows(pairs: Sequence[SeedPair]) -> List[Dict[str, Any]]:
    """The seed pairs as outcome-file rows: baseline = the baseline recipe's checkpoint at that seed,
    candidate = the candidate recipe's, on the same episode; a scene is a cluster within its seed."""
    rows = []
    for pair in pairs:
        for episode, b, c in zip(pair.baseline.episodes, pair.baseline.success, pair.candidate.success):
            scene = episode.rsplit("/seed-", 1)[0]
            rows.append(
                {
                    SEED_COLUMN: pair.seed,
                    "stratum": STRATUM,
                    "scenario_id": episode,
                    "cluster_id": f"{scene}/train-seed-{pair.seed}",
                    "baseline": b,
                    "candidate": c,
                }
            )
    return rows


def write_seed_outcomes(pairs: Sequence[SeedPair], path: Path) -> Path:
    """The comparison's outcome file (atomically): what recipes.file decides from."""
    return write_paired_outcomes(outcome_rows(pairs), path, extra_columns=(SEED_COLUMN,))


def read_seed_outcomes(path: str) -> Tuple[SeedPair, ...]:
    """Seed pairs from an outcome file with a seed column (CSV or Parquet): per seed, the baseline's and
    the candidate's outcomes on its rows, in the file's order; seeds in ascending order (the order a
    comparison adds them). One-line errors for a missing file or column, or a non-0/1 outcome."""
    import pandas as pd

    file = Path(path)
    require(file.is_file(), f"recipes.file={path} does not exist; give an outcome file with a seed column")
    try:
        table = pd.read_parquet(file) if file.suffix == ".parquet" else pd.read_csv(file)
    except Exception as error:  # pandas' own message names the parse problem
        raise UserInputError(
            f"recipes.file={path} could not be read ({type(error).__name__}); give a CSV or Parquet file"
        ) from None
    needed = (SEED_COLUMN, "scenario_id", "baseline", "candidate")
    missing = [c for c in needed if c not in table.columns]
    require(
        not missing,
        f"recipes.file={path} lacks column(s) {', '.join(missing)}; a recipe comparison's file has "
        f"{', '.join(needed)} (one row per episode and training seed)",
    )
    for column in ("baseline", "candidate"):
        values = set(pd.unique(table[column]))
        require(
            values <= {0, 1},
            f"recipes.file={path}: column {column} holds {sorted(map(str, values))[:3]}; outcomes are 0 or 1",
        )
    pairs = []
    for seed, rows in table.groupby(SEED_COLUMN, sort=True):
        episodes, baseline, candidate = zip(*rows[["scenario_id", "baseline", "candidate"]].itertuples(index=False))
        tasks = tuple(str(e).split("/", 1)[0] for e in episodes)
        names = tuple(str(e) for e in episodes)
        pairs.append(
            SeedPair(
                int(seed),
                SeedEvaluation("", names, tasks, tuple(bool(x) for x in baseline)),
                SeedEvaluation("", names, tasks, tuple(bool(x) for x in candidate)),
            )
        )
    require(len(pairs) >= 1, f"recipes.file={path} has no rows")
    task_sets = {p.seed: sorted(set(p.baseline.tasks)) for p in pairs}
    first = task_sets[pairs[0].seed]
    odd = [seed for seed, mine in task_sets.items() if mine != first] or [pairs[0].seed]
    require(
        task_sets[odd[0]] == first,
        f"recipes.file={path}: seed {odd[0]} has episodes of tasks {task_sets[odd[0]]}, seed {pairs[0].seed} of "
        f"{first}; every seed pair runs the same tasks (scenario_id starts with the task)",
    )
    return tuple(pairs)
