"""job=residual_audit: is the frozen flow-matching residual a good importance-sampling proposal?

Check every input before work (a given gradient artifact's schema, seeds and checkpoint digest,
then its anchors -- named by (episode, frame) -- in the dataset present, before any training);
or build and cache an artifact for the builtin checkpoint; score every
anchor with the configured estimator (batched across anchors, one encode per anchor); measure
repeatability across estimator seeds, alignment with gradient RMS (beside the training loss),
the proposal's second-moment ratio with its permutation control, and leave-one-out robustness;
decide the gate; save the result, plot, log to MLflow, print the gate table.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Mapping

import numpy as np
from omegaconf import DictConfig

from vlaeval import console
from vlaeval.artifacts import sha256_file
from vlaeval.audit import alignment_audit, gate_decision, leave_one_out_robustness, repeatability
from vlaeval.audit.plots import plot_audit
from vlaeval.audit.result import AnchorScore, AuditResult, ScoreDefinition
from vlaeval.choices import CheckpointKind
from vlaeval.config import POLICY_SECTIONS
from vlaeval.errors import UserInputError, require, require_at_least
from vlaeval.memory import PeakMemory
from vlaeval.policy.checkpoint import validate_checkpoint_config
from vlaeval.policy.flow import FlowConvention
from vlaeval.residual.artifact import (
    cached_gradient_artifact,
    load_gradient_artifact,
    per_seed_values,
    recover_anchors,
)
from vlaeval.residual.estimators import (
    DESCRIPTIONS,
    UNBIASED,
    estimator_arguments,
    score_anchors,
    validate_estimator_config,
)
from vlaeval.runs import RunReport, lineage_tags, load_data, load_policy, now_ms, output_dir, publish

JOB = "residual_audit"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
READS = ("audit", "gate", "estimator", "gradients", *POLICY_SECTIONS)
RESULT_SCHEMA_VERSION = 2  # 2: fair training-loss baseline (cross-fitted), attainable oracle


def validate_audit(cfg: DictConfig) -> None:
    a, g = cfg.audit, cfg.gate
    validate_estimator_config(cfg.estimator)
    require(0.0 <= a.alpha <= 1.0, f"audit.alpha={a.alpha} must be in [0, 1]")
    require(0.0 <= a.percentile_epsilon < 0.5, f"audit.percentile_epsilon={a.percentile_epsilon} must be in [0, 0.5)")
    require(a.proposal_power > 0, f"audit.proposal_power={a.proposal_power} must be > 0")
    require_at_least("audit.permutations", a.permutations, 1)
    require(g.min_anchors >= 4, f"gate.min_anchors={g.min_anchors} must be >= 4")
    FlowConvention.of(cfg.flow).validate()
    validate_checkpoint_config(cfg.checkpoint)


def check_seed_separation(estimator_seeds: List[int], gradient_seeds: List[int]) -> None:
    overlap = sorted(set(estimator_seeds) & set(int(s) for s in gradient_seeds))
    require(
        not overlap,
        f"estimator.seeds overlap the gradient artifact's gradient seeds {overlap[:5]}; "
        "choose disjoint seeds so scores and gradients use independent draws",
    )


def check_checkpoint(metadata: Dict[str, Any], path: Path, sha256: str | None) -> None:
    recorded = metadata.get("checkpoint_sha256")
    if recorded is not None and sha256 is not None and recorded != sha256:
        raise UserInputError(
            f"checkpoint {path} (sha256 {sha256[:12]}...) differs from the gradient "
            f"artifact's ({str(recorded)[:12]}...); use the checkpoint it was made with"
        )


def sha256_file_or_none(path: Path) -> str | None:
    return sha256_file(path) if path.is_file() else None  # a missing file is reported when it is loaded


def run(cfg: DictConfig) -> Dict[str, Any]:
    started_ms = now_ms()
    validate_audit(cfg)
    estimator_seeds = [int(s) for s in cfg.estimator.seeds]
    given = cfg.audit.gradient_artifact
    if given is not None:  # an explicit artifact is checked before any work: schema, seeds, checkpoint
        metadata, artifact_anchors = load_gradient_artifact(Path(str(given)))
        check_seed_separation(estimator_seeds, metadata["gradient_seeds"])
        if cfg.checkpoint.kind == CheckpointKind.path and cfg.checkpoint.path not in (None, "", "???"):
            check_checkpoint(
                metadata, Path(str(cfg.checkpoint.path)), sha256_file_or_none(Path(str(cfg.checkpoint.path)))
            )
    else:
        check_seed_separation(estimator_seeds, list(cfg.gradients.seeds))
    data = load_data(cfg)
    if given is not None:  # ... and its anchors in the data present, before a policy is trained or loaded
        anchor_index = recover_anchors(
            data.demonstrations, data.anchors, artifact_anchors, metadata["dataset_sha256"], str(given)
        )
    handle = load_policy(cfg, data)
    if given is None:
        metadata, artifact_anchors = cached_gradient_artifact(
            cfg.gradients, cfg.flow, str(cfg.device), str(cfg.paths.cache_dir), data, handle
        )
        anchor_index = recover_anchors(
            data.demonstrations, data.anchors, artifact_anchors, metadata["dataset_sha256"], metadata["path"]
        )
    check_checkpoint(metadata, handle.path, handle.sha256)
    traces = [a.get("sampling_trace") for a in artifact_anchors]

    started = time.perf_counter()
    with (
        PeakMemory(str(cfg.device)) as peak,
        console.unit_progress(f"scoring ({cfg.estimator.kind})", anchor_index.size) as update,
    ):
        scores = score_anchors(
            data.bind(handle.model, cfg.flow, str(cfg.device)),
            data.anchors,
            anchor_index,
            **estimator_arguments(cfg.estimator),
            progress=lambda done, total: update(completed=done),
        )
    elapsed = time.perf_counter() - started

    matrix = scores.estimator_residuals
    score = matrix.mean(axis=0)
    require(
        bool(np.all(np.isfinite(score)) and np.all(score >= 0)),
        "the policy's residuals are not all finite and >= 0; a flow-matching loss cannot be negative: check "
        "the policy's velocity and target convention",
    )
    gradient_rms = np.array([a["gradient_rms"] for a in artifact_anchors])
    mean_losses = np.array([a["mean_gradient_loss"] for a in artifact_anchors])
    per_seed_rms, per_seed_losses = per_seed_values(artifact_anchors)
    a = cfg.audit
    rep = repeatability(matrix)
    gradient_reliability = (metadata.get("reliability") or {}).get("spearman_brown")
    alignment = alignment_audit(
        score,
        gradient_rms,
        mean_losses,
        alpha=a.alpha,
        percentile_epsilon=a.percentile_epsilon,
        permutation_count=int(a.permutations),
        permutation_seed=int(a.permutation_seed),
        proposal_power=a.proposal_power,
        score_reliability=rep.spearman_brown_reliability,
        gradient_reliability=gradient_reliability,
        per_seed_gradient_rms=per_seed_rms,
        per_seed_losses=per_seed_losses,
        bootstrap_seed=int(a.permutation_seed),
        keep_null_distributions=True,
    )
    robustness = leave_one_out_robustness(
        score, gradient_rms, alpha=a.alpha, percentile_epsilon=a.percentile_epsilon, proposal_power=a.proposal_power
    )
    gate = gate_decision(
        sample_count=anchor_index.size, repeatability=rep, alignment=alignment, robustness=robustness, gate=cfg.gate
    )

    plots = []
    if a.plot:
        plots.append(
            plot_audit(
                score,
                gradient_rms,
                matrix,
                alignment,
                robustness,
                output_dir(cfg) / "residual_audit.png",
            )
        )
    audit = AuditResult(
        schema_version=RESULT_SCHEMA_VERSION,
        checkpoint=str(handle.path),
        checkpoint_sha256=handle.sha256,
        gradient_artifact=metadata,
        score_definition=ScoreDefinition(
            name="frozen_flow_matching_residual",
            estimator=str(cfg.estimator.kind),
            unbiased=UNBIASED[str(cfg.estimator.kind)],
            variance_reduction=(
                *DESCRIPTIONS[str(cfg.estimator.kind)],
                "one shared conditioning encode per anchor",
                "action head batched across anchors",
            ),
            model_mode="eval",
            estimator_seeds=tuple(estimator_seeds),
            samples_per_estimator=int(cfg.estimator.samples_per_estimator),
            head_evaluations_per_anchor=int(cfg.estimator.samples_per_estimator) * len(estimator_seeds),
            proposal_power=float(a.proposal_power),
        ),
        score_runtime={
            "elapsed_seconds": elapsed,
            "seconds_per_anchor": elapsed / anchor_index.size,
            "anchors_per_second": anchor_index.size / elapsed,
            "device": str(cfg.device),
            **peak.report(),
        },
        repeatability=rep,
        alignment=alignment,
        leave_one_out_robustness=robustness,
        gate=gate,
        anchors=tuple(
            AnchorScore(
                anchor_position=i,
                episode=int(artifact_anchors[i]["episode"]),
                frame=int(artifact_anchors[i]["frame"]),
                mean_residual=float(score[i]),
                estimator_residuals=tuple(matrix[:, i].tolist()),
                gradient_rms=float(gradient_rms[i]),
                mean_gradient_loss=float(mean_losses[i]),
                sample_losses=tuple(scores.sample_losses[:, i].tolist()),
                time_values=tuple(scores.time_values[:, i].tolist()),
                sampling_trace=traces[i],
            )
            for i in range(anchor_index.size)
        ),
    )
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=audit.to_json(),
            started_ms=started_ms,
            run_name=f"audit {cfg.estimator.kind} {handle.sha256[:8]}",
            metrics=audit.metrics(),
            checks=gate.checks,
            tags={**audit.tags(), **lineage_tags(handle, data)},
            plots=plots,
            gate_pass=gate.eligible_for_500_step_ablation,
        ),
    )
    print_summary(audit, published)
    if a.exit_code_from_gate:
        published["exit_code"] = gate.exit_code
    return published


def print_summary(audit: AuditResult, run: Mapping[str, Any]) -> None:
    """The gate's checks, the headline figures, the baseline comparison and where the result is."""
    gate, definition = audit.gate, audit.score_definition
    console.print_checks(
        f"Residual audit gate ({gate.preset}, {audit.sample_count} anchors, estimator {definition.estimator}"
        f"{'' if definition.unbiased else ', BIASED'})",
        gate.checks,
    )
    m = audit.metrics()
    attainable = m.get("proposal.attainable_oracle_ratio")
    console.show(
        f"repeatability rho {m['repeatability.spearman']:.3f} | residual vs gradient RMS rho "
        f"{m['alignment.spearman_residual_vs_gradient_rms']:.3f} | second-moment ratio "
        f"{m['proposal.information_to_baseline_ratio']:.3f} (in-sample oracle {m['proposal.oracle_ratio']:.3f}"
        + (f", attainable oracle {attainable:.3f}" if attainable else "")
        + ")"
    )
    baseline = audit.alignment.baseline_comparison
    if baseline is not None:
        console.show(
            f"baseline on independent draws (cross-fitted seed halves): residual rho {baseline.residual.spearman:.3f} "
            f"ratio {baseline.residual.second_moment_ratio:.3f} vs training loss rho "
            f"{baseline.training_loss.spearman:.3f} ratio {baseline.training_loss.second_moment_ratio:.3f} "
            f"(shared draws, inflated: rho {baseline.training_loss_shared_draws.spearman:.3f}): "
            f"{baseline.verdict.upper()} (95% bootstrap intervals of the differences)"
        )
    else:
        console.show(f"baseline: {audit.alignment.baseline_unavailable_reason}")
    for name, value in gate.informational.items():  # reported, not required by this preset
        console.show(
            f"  informational (not a gate check here): {name} = {'unknown' if value is None else str(value).lower()}"
        )
    console.show(
        f"status: {gate.status}   eligible for the 500-step ablation: "
        f"{console.styled('PASS' if gate.eligible_for_500_step_ablation else 'FAIL')}"
    )
    if run.get("result_path"):
        console.show(
            f"result: {run['result_path']}"
            + (f"   mlflow run: {run['mlflow_run_id']}" if run.get("mlflow_run_id") else "")
        )
