"""What closed-loop evaluation reports: its checks, metrics, table and plot (job=evaluate and
job=train share them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from vlaeval import console
from vlaeval.artifacts import atomic_write_bytes, atomic_write_text
from vlaeval.choices import InstructionMode
from vlaeval.config import PolicyJobSettings
from vlaeval.envs.episodes import NO_PERTURBATION, Perturbation, require_held_out_split
from vlaeval.errors import require, require_at_least
from vlaeval.rollouts.language import instruction_mode
from vlaeval.rollouts.outcomes import EpisodeOutcomes

CONDITION_KEYS = ("perturbation", "instructions")


@dataclass(frozen=True)
class EvaluationCondition:
    """A probe run on the evaluation's very episodes: what the policy sees (a perturbation, e.g.
    {blank_camera: true}) and what it is told (an instruction mode, e.g. other_task)."""

    name: str
    perturbation: Perturbation = NO_PERTURBATION
    instructions: InstructionMode = InstructionMode.task

    @classmethod
    def parse(cls, name: str, values: Any) -> "EvaluationCondition":
        where = f"evaluate.conditions.{name}"
        require(isinstance(values, Mapping), f"{where} must be a mapping of {', '.join(CONDITION_KEYS)}")
        for key in values:
            require(key in CONDITION_KEYS, f"{where}.{key} is not a condition setting; use {', '.join(CONDITION_KEYS)}")
        mode = instruction_mode(values.get("instructions", "task"), f"{where}.instructions")
        out = cls(str(name), Perturbation.parse(values.get("perturbation"), f"{where}.perturbation"), mode)
        require(
            out.perturbation.active or out.instructions != InstructionMode.task,
            f"{where} changes nothing; give it a perturbation or an instructions mode",
        )
        return out

    def describe(self) -> str:
        changed = [f"{k}={v}" for k, v in self.perturbation.spec().items() if getattr(NO_PERTURBATION, k) != v]
        if self.instructions != InstructionMode.task:
            changed.append(f"instructions={self.instructions.value}")
        return ", ".join(changed)


@dataclass(frozen=True)
class TaskSuccess:
    """One task's held-out episodes: the policy's and the scripted expert's success on each (any
    step), and, where the episodes ran to their horizon (evaluate.run_to_horizon), the policy's
    success at the last step."""

    policy_success_rate: float
    expert_success_rate: float
    episodes: int
    policy_successes: Tuple[bool, ...]
    expert_successes: Tuple[bool, ...]
    final_step_success_rate: Optional[float] = None


@dataclass(frozen=True)
class EvaluatedEpisode:
    task: str
    variant: int
    seed: int
    policy: bool
    expert: bool


@dataclass(frozen=True)
class ConditionSuccess:
    """The policy on the same episodes under a condition, and its drop from the clean run."""

    policy_success_rate: float
    drop: float
    per_task: Mapping[str, float]
    changed: str


LOCKSTEP = "lockstep: one batched policy call per control step for every episode that needs a chunk"


@dataclass(frozen=True)
class Evaluation:
    """A closed-loop evaluation on held-out episodes, beside the scripted expert on the same ones
    (vlaeval/rollouts/engine.py: evaluate_closed_loop); `to_json` is its result.json layout."""

    per_task: Mapping[str, TaskSuccess]
    episodes: Tuple[EvaluatedEpisode, ...]
    policy_success_rate: float
    expert_success_rate: float
    conditions: Mapping[str, ConditionSuccess]
    held_out_variants: Tuple[int, int]
    rollout: str = LOCKSTEP
    final_step_success_rate: Optional[float] = None  # evaluate.run_to_horizon: the goal held at the last step

    @classmethod
    def of(
        cls,
        tasks: Sequence[str],
        episodes: Sequence[Any],
        policy: EpisodeOutcomes,
        expert: np.ndarray,
        conditions: Sequence[Tuple[EvaluationCondition, Any]],
        held_out: range,
    ) -> "Evaluation":
        """From the episodes and their outcomes (policy, expert's successes, each condition's outcomes)."""
        successes, final = policy.success, policy.final_success
        per_task = {}
        for task in tasks:
            mine = [k for k, e in enumerate(episodes) if e.task == task]
            per_task[task] = TaskSuccess(
                float(np.mean(successes[mine])),
                float(np.mean(expert[mine])),
                len(mine),
                tuple(bool(x) for x in successes[mine]),
                tuple(bool(x) for x in expert[mine]),
                None if final is None else float(np.mean(final[mine])),
            )
        return cls(
            per_task=per_task,
            episodes=tuple(
                EvaluatedEpisode(e.task, e.variant, e.seed, bool(p), bool(x))
                for e, p, x in zip(episodes, successes, expert)
            ),
            policy_success_rate=float(np.mean(successes)),
            expert_success_rate=float(np.mean(expert)),
            conditions={
                c.name: ConditionSuccess(
                    float(np.mean(out.success)),
                    float(np.mean(successes) - np.mean(out.success)),
                    {t: float(np.mean(out.success[[e.task == t for e in episodes]])) for t in tasks},
                    c.describe(),
                )
                for c, out in conditions
            },
            held_out_variants=(held_out.start, held_out.stop),
            final_step_success_rate=None if final is None else float(np.mean(final)),
        )

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["held_out_variants"] = list(self.held_out_variants)
        return out


def evaluation_conditions(evaluate: Any) -> List[EvaluationCondition]:
    """evaluate.conditions, parsed and checked (one-line errors before any episode runs)."""
    return [EvaluationCondition.parse(str(k), v) for k, v in dict(evaluate.conditions or {}).items()]


def validate_evaluate(cfg: PolicyJobSettings) -> None:
    e = cfg.evaluate
    require_at_least("evaluate.episodes_per_task", e.episodes_per_task, 1)
    require(
        1 <= e.execute_actions <= cfg.data.horizon,
        f"evaluate.execute_actions={e.execute_actions} must be in [1, data.horizon={cfg.data.horizon}]",
    )
    require_at_least("evaluate.max_steps", e.max_steps, 1)
    require_held_out_split("evaluate.scenes", e.scenes)
    require_at_least("flow.sampling_steps", cfg.flow.sampling_steps, 1)
    conditions = evaluation_conditions(e)
    if any(c.instructions == InstructionMode.other_task for c in conditions):
        require(len(cfg.data.get("tasks") or []) >= 2, "evaluate.conditions: instructions=other_task needs two tasks")
    validate_rollout(cfg.rollout)


def validate_rollout(rollout: Any) -> None:
    """rollout.*: one-line errors before any episode runs."""
    require_at_least("rollout.lockstep_group", rollout.lockstep_group, 1)
    require_at_least("rollout.workers", rollout.workers, 1)


def evaluation_view(evaluation: Evaluation) -> Tuple[Dict[str, float], Dict[str, bool]]:
    metrics = {
        "eval.policy_success_rate": evaluation.policy_success_rate,
        "eval.expert_success_rate": evaluation.expert_success_rate,
    }
    if evaluation.final_step_success_rate is not None:
        metrics["eval.final_step_success_rate"] = evaluation.final_step_success_rate
    for task, row in evaluation.per_task.items():
        metrics[f"eval.{task}.policy_success_rate"] = row.policy_success_rate
        metrics[f"eval.{task}.expert_success_rate"] = row.expert_success_rate
        if row.final_step_success_rate is not None:
            metrics[f"eval.{task}.final_step_success_rate"] = row.final_step_success_rate
    for name, condition in evaluation.conditions.items():
        metrics[f"eval.condition.{name}.policy_success_rate"] = condition.policy_success_rate
        metrics[f"eval.condition.{name}.drop"] = condition.drop
    return metrics, {}


def print_evaluation(evaluation: Evaluation) -> None:
    final = evaluation.final_step_success_rate is not None  # a column only where the episodes ran to the horizon

    def row(name: str, policy: float, last: Optional[float], expert: float, episodes: int) -> Tuple[Any, ...]:
        return (name, f"{policy:.2f}", *([f"{last:.2f}"] if last is not None else []), f"{expert:.2f}", episodes)

    rows = [
        row(task, r.policy_success_rate, r.final_step_success_rate, r.expert_success_rate, r.episodes)
        for task, r in evaluation.per_task.items()
    ]
    rows.append(
        row(
            "all",
            evaluation.policy_success_rate,
            evaluation.final_step_success_rate,
            evaluation.expert_success_rate,
            sum(r.episodes for r in evaluation.per_task.values()),
        )
    )
    header = ["task", "policy", *(["policy, at the last step"] if final else []), "expert", "episodes"]
    console.show(console.table("Closed-loop success on held-out episodes", header, rows))
    conditions = evaluation.conditions
    if conditions:
        console.show(
            console.table(
                "The same episodes under each condition",
                ["condition", "policy", "drop from clean", "what changed"],
                [(name, f"{c.policy_success_rate:.2f}", f"{c.drop:+.2f}", c.changed) for name, c in conditions.items()],
            )
        )


# The paired outcomes of an evaluation, in the format outcomes=file reads: the scripted expert is the
# baseline and the policy the candidate on the very same episodes; a scene (task variant) is a
# cluster. Held-out variants are new scenes of the training tasks: the distribution_shift stratum.
EVALUATION_STRATUM = "distribution_shift"


PAIRED_OUTCOME_COLUMNS = ("stratum", "scenario_id", "cluster_id", "baseline", "candidate")


def write_paired_outcomes(rows: Sequence[Mapping[str, Any]], path: Path, extra_columns: Sequence[str] = ()) -> Path:
    """Rows in the outcome-file format outcomes=file reads (booleans as 0/1), plus `extra_columns`,
    written atomically: job=evaluate's episodes and every rollout gauntlet's."""
    import csv
    import io

    columns = [*PAIRED_OUTCOME_COLUMNS, *extra_columns]
    text = io.StringIO()
    # The csv module quotes a field that holds a comma, a quote or a newline (a scene id may).
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([int(row[c]) if isinstance(row[c], bool) else row[c] for c in columns] for row in rows)
    return atomic_write_text(path, text.getvalue())


def paired_outcomes_csv(evaluation: Evaluation, path: Path) -> Path:
    """Write the evaluation's episodes as stratum, scenario_id, cluster_id, baseline, candidate."""
    rows = []
    for e in evaluation.episodes:
        scene = f"{e.task}/variant-{e.variant}"
        rows.append(
            {
                "stratum": EVALUATION_STRATUM,
                "scenario_id": f"{scene}/seed-{e.seed}",
                "cluster_id": scene,
                "baseline": e.expert,
                "candidate": e.policy,
            }
        )
    return write_paired_outcomes(rows, path)


def plot_success(evaluation: Evaluation, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(evaluation.per_task)
    x = np.arange(len(tasks))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(tasks)), 4))
    ax.bar(x - 0.2, [evaluation.per_task[t].policy_success_rate for t in tasks], 0.4, label="policy")
    ax.bar(x + 0.2, [evaluation.per_task[t].expert_success_rate for t in tasks], 0.4, label="scripted expert")
    ax.set_xticks(x, tasks, rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (held-out episodes)")
    ax.legend()
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=110))
    plt.close(fig)
    return path
