"""job=evaluate: closed-loop success per task, beside the scripted expert on the same episodes.

Roll the policy out in Meta-World on held-out scene variants (checkpoint=builtin trains it on
first use) and the scripted expert on the very same episodes; report success per task for both;
write the episodes as paired outcomes (paired_outcomes.csv) that outcomes=file reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlaeval import console
from vlaeval.config import PolicyJobSettings
from vlaeval.policy.checkpoint import validate_checkpoint_config
from vlaeval.rollouts.engine import evaluate_closed_loop
from vlaeval.rollouts.evaluation import (
    Evaluation,
    evaluation_view,
    paired_outcomes_csv,
    plot_success,
    print_evaluation,
    validate_evaluate,
)
from vlaeval.runs import (
    JobResult,
    RunReport,
    SavedAsJson,
    lineage_tags,
    load_data_and_policy,
    now_ms,
    output_dir,
    publish,
)

JOB = "evaluate"
PAIRED_OUTCOMES_FILE = "paired_outcomes.csv"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()


@dataclass(frozen=True, kw_only=True)
class EvaluateJobConfig(PolicyJobSettings):
    """The sections job=evaluate reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    pass


@dataclass(frozen=True)
class EvaluateResult(SavedAsJson):
    """job=evaluate's result: which policy and data, the evaluation, where its paired outcomes are."""

    checkpoint: str
    checkpoint_sha256: str
    manifest_sha256: str
    evaluation: Evaluation
    paired_outcomes: str


def run(cfg: EvaluateJobConfig) -> JobResult[EvaluateResult]:
    started_ms = now_ms()
    validate_evaluate(cfg)
    validate_checkpoint_config(cfg.checkpoint)
    data, handle = load_data_and_policy(cfg)
    with console.unit_progress("episodes", 1) as update:
        evaluation = evaluate_closed_loop(
            data.bind(handle.model, cfg.flow),
            data.demonstrations.tasks,
            cfg.evaluate,
            cfg.rollout,
            lambda done, total, task: update(completed=done, total=total, description=task),
            simulator=cfg.simulator,
        )
    metrics, checks = evaluation_view(evaluation)
    plot = plot_success(evaluation, output_dir(cfg) / "success_rates.png")
    # The same episodes as paired outcomes (expert = baseline, policy = candidate) that
    # `job=gauntlet outcomes=file outcomes.path=...` reads: re-analysed without new rollouts.
    outcomes_path = paired_outcomes_csv(evaluation, output_dir(cfg) / PAIRED_OUTCOMES_FILE)
    result = EvaluateResult(
        checkpoint=str(handle.path),
        checkpoint_sha256=handle.sha256,
        manifest_sha256=data.demonstrations.manifest_sha256,
        evaluation=evaluation,
        paired_outcomes=str(outcomes_path),
    )
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"evaluate-{handle.sha256[:12]}",
            metrics=metrics,
            checks=checks,
            tags=lineage_tags(handle, data),
            plots=[plot],
            artifacts=[(outcomes_path, None)],
        ),
    )
    print_evaluation(evaluation)
    console.show(f"paired outcomes (expert vs policy): {outcomes_path}")
    return JobResult(result, published)
