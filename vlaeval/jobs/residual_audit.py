"""job=residual_audit: is the frozen flow-matching residual a good importance-sampling proposal?

Check every input before work (a given gradient artifact's schema, seeds and checkpoint digest,
then its anchors -- named by (episode, frame) -- in the dataset present, before any training);
or build and cache an artifact for the builtin checkpoint; score every
anchor with the configured estimator (batched across anchors, one encode per anchor); measure
repeatability across estimator seeds, alignment with gradient RMS (beside the training loss),
the proposal's second-moment ratio with its permutation control and its bootstrap interval over
anchors, and leave-one-out robustness; decide the gate; split the gradient's second moment over
anchor, flow time and the rest (when the artifact records flow times); save the result, plot, log
to MLflow, print the gate table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from vlaeval import console
from vlaeval.artifacts import sha256_file
from vlaeval.audit import Alignment, alignment_audit, gate_decision, leave_one_out_robustness, repeatability
from vlaeval.audit.decomposition import NoiseDecomposition, noise_decomposition
from vlaeval.audit.plots import plot_audit, plot_noise_decomposition
from vlaeval.audit.result import AnchorScore, AuditResult, GateDecision, ScoreDefinition
from vlaeval.audit.statistics import LeaveOneOut, Repeatability
from vlaeval.audit.verdict import RatioVerdict, ratio_verdict, tail_deviations, two_level_ratios
from vlaeval.choices import CheckpointKind
from vlaeval.config import AuditConfig, EstimatorConfig, GateConfig, GradientsConfig, PolicyJobSettings
from vlaeval.errors import UserInputError, require, require_at_least
from vlaeval.memory import PeakMemory
from vlaeval.policy.builtin import PolicyData, PolicyHandle
from vlaeval.policy.checkpoint import validate_checkpoint_config
from vlaeval.policy.flow import FlowConvention
from vlaeval.policy.training import step_gflop
from vlaeval.residual.artifact import (
    cached_gradient_artifact,
    load_gradient_artifact,
    per_seed_flow_times,
    per_seed_values,
    recover_anchors,
)
from vlaeval.residual.estimators import (
    DESCRIPTIONS,
    UNBIASED,
    estimator_arguments,
    score_anchors,
    scoring_gflop,
    validate_estimator_config,
)
from vlaeval.runs import (
    JobResult,
    RunRecord,
    RunReport,
    lineage_tags,
    load_data,
    load_policy,
    now_ms,
    output_dir,
    publish,
)

JOB = "residual_audit"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()
RESULT_SCHEMA_VERSION = 2  # 2: fair training-loss baseline (cross-fitted), attainable oracle


def validate_audit(cfg: AuditJobConfig) -> None:
    a, g = cfg.audit, cfg.gate
    validate_estimator_config(cfg.estimator)
    require(0.0 <= a.alpha <= 1.0, f"audit.alpha={a.alpha} must be in [0, 1]")
    require(0.0 <= a.percentile_epsilon < 0.5, f"audit.percentile_epsilon={a.percentile_epsilon} must be in [0, 0.5)")
    require(a.proposal_power > 0, f"audit.proposal_power={a.proposal_power} must be > 0")
    require_at_least("audit.permutations", a.permutations, 1)
    require_at_least("audit.decomposition_bins", a.decomposition_bins, 2)
    require(g.min_anchors >= 4, f"gate.min_anchors={g.min_anchors} must be >= 4")
    require(0.0 < g.verdict_level < 1.0, f"gate.verdict_level={g.verdict_level} must be in (0, 1), e.g. 0.95")
    require_at_least("gate.verdict_resamples", g.verdict_resamples, 100)
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


def given_artifact(cfg: AuditJobConfig, estimator_seeds: List[int]) -> Optional[Tuple[Dict[str, Any], List[Any]]]:
    """The artifact audit.gradient_artifact names, checked before any work (schema, seed separation,
    the checkpoint it was measured on); None when the audit builds its own."""
    given = cfg.audit.gradient_artifact
    if given is None:
        check_seed_separation(estimator_seeds, list(cfg.gradients.seeds))
        return None
    metadata, artifact_anchors = load_gradient_artifact(Path(str(given)))
    check_seed_separation(estimator_seeds, metadata["gradient_seeds"])
    if cfg.checkpoint.kind == CheckpointKind.path and cfg.checkpoint.path not in (None, "", "???"):
        checkpoint = Path(str(cfg.checkpoint.path))
        check_checkpoint(metadata, checkpoint, sha256_file_or_none(checkpoint))
    return metadata, artifact_anchors


def score_the_anchors(
    cfg: AuditJobConfig, data: Any, handle: Any, anchor_index: np.ndarray
) -> Tuple[Any, Dict[str, Any]]:
    """Every audited anchor's residual under each estimator seed, and what it cost (time, peak memory)."""
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
    score = scores.estimator_residuals.mean(axis=0)
    require(
        bool(np.all(np.isfinite(score)) and np.all(score >= 0)),
        "the policy's residuals are not all finite and >= 0; a flow-matching loss cannot be negative: check "
        "the policy's velocity and target convention",
    )
    runtime = {
        "elapsed_seconds": elapsed,
        "seconds_per_anchor": elapsed / anchor_index.size,
        "anchors_per_second": anchor_index.size / elapsed,
        "device": str(cfg.device),
        **peak.report(),
    }
    return scores, runtime


def break_even_costs(cfg: AuditJobConfig, data: PolicyData, handle: PolicyHandle) -> Tuple[float, float]:
    """(C_score, C_train) in counted GFLOP: scoring every anchor of the dataset once with this
    estimator, and the training run the proposal would sample for -- the train section's steps of its
    batch (and flow draws per anchor), a step's forward counted and its backward taken as twice it."""
    policy = data.bind(handle.model, cfg.flow, str(cfg.device))
    scoring = scoring_gflop(policy, data.anchors, estimator_arguments(cfg.estimator))
    t = cfg.train
    training = step_gflop(policy, data.anchors, int(t.batch_size), int(t.draws_per_anchor)) * int(t.steps)
    return scoring, training


def ratio_verdict_of(
    cfg: AuditJobConfig,
    score: np.ndarray,
    gradient_rms: np.ndarray,
    per_seed_rms: Optional[np.ndarray],
    ratio: float,
    costs: Tuple[Optional[float], Optional[float]],
) -> RatioVerdict:
    """The three-way verdict on the ratio from its two-level bootstrap (vlaeval/audit/verdict.py)."""
    a, g = cfg.audit, cfg.gate
    replicates = two_level_ratios(
        score,
        gradient_rms,
        per_seed_rms,
        alpha=a.alpha,
        percentile_epsilon=a.percentile_epsilon,
        proposal_power=a.proposal_power,
        resamples=int(g.verdict_resamples),
        seed=int(a.permutation_seed),
    )
    deviations = tail_deviations(
        score,
        gradient_rms,
        alpha=a.alpha,
        percentile_epsilon=a.percentile_epsilon,
        proposal_power=a.proposal_power,
        resamples=int(g.verdict_resamples),
        seed=int(a.permutation_seed),
    )
    return ratio_verdict(
        ratio,
        replicates,
        threshold=float(g.second_moment_ratio),
        level=float(g.verdict_level),
        anchors=int(score.size),
        gradient_seeds=0 if per_seed_rms is None else int(per_seed_rms.shape[0]),
        scoring_gflop=costs[0],
        training_gflop=costs[1],
        deviations=deviations,
    )


def audit_statistics(
    cfg: AuditJobConfig,
    matrix: np.ndarray,
    artifact_anchors: List[Any],
    metadata: Mapping[str, Any],
    costs: Tuple[Optional[float], Optional[float]] = (None, None),
) -> Tuple[Repeatability, Alignment, LeaveOneOut, GateDecision]:
    """Repeatability of the score over estimator seeds, its alignment with the artifact's gradient
    RMS (and the training-loss baseline), leave-one-out robustness, the ratio's three-way verdict
    (`costs`: GFLOP to score the dataset once and to train, for its break-even ratio), and the gate
    on all of them."""
    a = cfg.audit
    score = matrix.mean(axis=0)
    gradient_rms = np.array([anchor["gradient_rms"] for anchor in artifact_anchors])
    per_seed_rms, per_seed_losses = per_seed_values(artifact_anchors)
    rep = repeatability(matrix)
    alignment = alignment_audit(
        score,
        gradient_rms,
        np.array([anchor["mean_gradient_loss"] for anchor in artifact_anchors]),
        alpha=a.alpha,
        percentile_epsilon=a.percentile_epsilon,
        permutation_count=int(a.permutations),
        permutation_seed=int(a.permutation_seed),
        proposal_power=a.proposal_power,
        score_reliability=rep.spearman_brown_reliability,
        gradient_reliability=(metadata.get("reliability") or {}).get("spearman_brown"),
        per_seed_gradient_rms=per_seed_rms,
        per_seed_losses=per_seed_losses,
        bootstrap_seed=int(a.permutation_seed),
        keep_null_distributions=True,
    )
    robustness = leave_one_out_robustness(
        score, gradient_rms, alpha=a.alpha, percentile_epsilon=a.percentile_epsilon, proposal_power=a.proposal_power
    )
    verdict = ratio_verdict_of(
        cfg, score, gradient_rms, per_seed_rms, alignment.proposal.information_to_baseline_ratio, costs
    )
    gate = gate_decision(
        sample_count=score.size,
        repeatability=rep,
        alignment=alignment,
        robustness=robustness,
        gate=cfg.gate,
        verdict=verdict,
    )
    return rep, alignment, robustness, gate


def where_the_noise_is(cfg: AuditJobConfig, artifact_anchors: List[Any]) -> Optional[NoiseDecomposition]:
    """The artifact's per-draw squared gradient norms split over anchor, flow time, their interaction
    and the rest, when it records each draw's flow time (vlaeval's artifacts do); else None."""
    flow_times = per_seed_flow_times(artifact_anchors)
    per_seed_rms, _ = per_seed_values(artifact_anchors)
    if flow_times is None or per_seed_rms is None:
        return None
    levels = FlowConvention.of(cfg.flow).time_level(flow_times)
    return noise_decomposition(per_seed_rms**2, levels, bins=int(cfg.audit.decomposition_bins))


def score_definition(cfg: AuditJobConfig) -> ScoreDefinition:
    kind, seeds = str(cfg.estimator.kind), [int(s) for s in cfg.estimator.seeds]
    return ScoreDefinition(
        name="frozen_flow_matching_residual",
        estimator=kind,
        unbiased=UNBIASED[kind],
        variance_reduction=(
            *DESCRIPTIONS[kind],
            "one shared conditioning encode per anchor",
            "action head batched across anchors",
        ),
        model_mode="eval",
        estimator_seeds=tuple(seeds),
        samples_per_estimator=int(cfg.estimator.samples_per_estimator),
        head_evaluations_per_anchor=int(cfg.estimator.samples_per_estimator) * len(seeds),
        proposal_power=float(cfg.audit.proposal_power),
    )


def anchor_scores(scores: Any, score: np.ndarray, artifact_anchors: List[Any]) -> Tuple[AnchorScore, ...]:
    """Per audited anchor: where it is, its residuals (mean and per seed) beside its gradient RMS and
    loss, the draws that scored it, and how the artifact sampled it."""
    matrix = scores.estimator_residuals
    return tuple(
        AnchorScore(
            anchor_position=i,
            episode=int(anchor["episode"]),
            frame=int(anchor["frame"]),
            mean_residual=float(score[i]),
            estimator_residuals=tuple(matrix[:, i].tolist()),
            gradient_rms=float(anchor["gradient_rms"]),
            mean_gradient_loss=float(anchor["mean_gradient_loss"]),
            sample_losses=tuple(scores.sample_losses[:, i].tolist()),
            time_values=tuple(scores.time_values[:, i].tolist()),
            sampling_trace=anchor.get("sampling_trace"),
        )
        for i, anchor in enumerate(artifact_anchors)
    )


@dataclass(frozen=True, kw_only=True)
class AuditJobConfig(PolicyJobSettings):
    """The sections job=residual_audit reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    audit: AuditConfig
    gate: GateConfig
    estimator: EstimatorConfig
    gradients: GradientsConfig


def run(cfg: AuditJobConfig) -> JobResult[AuditResult]:
    started_ms = now_ms()
    validate_audit(cfg)
    given = given_artifact(cfg, [int(s) for s in cfg.estimator.seeds])
    data = load_data(cfg)
    if given is not None:  # ... and its anchors found in the data, before a policy is trained or loaded
        metadata, artifact_anchors = given
        anchor_index = recover_anchors(
            data.demonstrations,
            data.anchors,
            artifact_anchors,
            metadata["dataset_sha256"],
            str(cfg.audit.gradient_artifact),
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

    scores, runtime = score_the_anchors(cfg, data, handle, anchor_index)
    matrix = scores.estimator_residuals
    score = matrix.mean(axis=0)
    # C_score: every anchor of the dataset scored once; C_train: the training run (counted work, not the clock).
    costs = break_even_costs(cfg, data, handle)
    rep, alignment, robustness, gate = audit_statistics(cfg, matrix, artifact_anchors, metadata, costs)
    decomposition = where_the_noise_is(cfg, artifact_anchors)
    plots = []
    if cfg.audit.plot:
        gradient_rms = np.array([anchor["gradient_rms"] for anchor in artifact_anchors])
        out = output_dir(cfg)
        path = out / "residual_audit.png"
        plots.append(plot_audit(score, gradient_rms, matrix, alignment, robustness, path))
        if decomposition is not None:
            plots.append(plot_noise_decomposition(decomposition, out / "noise_decomposition.png"))
    audit = AuditResult(
        schema_version=RESULT_SCHEMA_VERSION,
        checkpoint=str(handle.path),
        checkpoint_sha256=handle.sha256,
        gradient_artifact=metadata,
        score_definition=score_definition(cfg),
        score_runtime=runtime,
        repeatability=rep,
        alignment=alignment,
        leave_one_out_robustness=robustness,
        gate=gate,
        anchors=anchor_scores(scores, score, artifact_anchors),
        noise_decomposition=decomposition,
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
    return JobResult(audit, published, gate.exit_code if cfg.audit.exit_code_from_gate else 0)


def print_summary(audit: AuditResult, run: RunRecord) -> None:
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
    interval = audit.alignment.proposal.ratio_interval
    if interval is not None:
        console.show(f"second-moment ratio 95% bootstrap interval over anchors: [{interval[0]:.3f}, {interval[1]:.3f}]")
    if audit.noise_decomposition is not None:
        shares, oracles = audit.noise_decomposition.variance_shares, audit.noise_decomposition.oracle_ratios
        console.show(
            "where the gradient's noise is (share of variance): "
            + ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in shares.items())
            + " | best proposal over anchors "
            + f"{oracles['anchor']:.3f}, over flow time "
            + ("n/a" if oracles["flow_time"] is None else f"{oracles['flow_time']:.3f}")
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
        f"status: {gate.status}   the score carries signal (the seed's screen, eligible for the 500-step "
        f"ablation): {console.styled('PASS' if gate.eligible_for_500_step_ablation else 'FAIL')}"
    )
    if gate.verdict is not None:
        print_verdict(gate.verdict)
    console.show(run.where())


def run_length_to_pay(v: RatioVerdict) -> str:
    """Where the proposal does not pay at the planned run: how much longer a run it would pay in."""
    if v.pays_for_its_scoring or not v.training_gflop:
        return ""
    if v.training_gflop_to_pay is None:
        return " in a run of any length (the interval reaches 1)"
    factor = v.training_gflop_to_pay / v.training_gflop
    return f"; it would in a run of at least {factor:.2f}x the planned one's work (train.steps x train.batch_size)"


def print_verdict(v: RatioVerdict) -> None:
    """The ratio's three-way verdict with its interval, and the break-even ratio beside it."""
    needed = (
        f"; a re-audit of about {v.anchors_needed:,} anchors decides it 80% of the time" if v.anchors_needed else ""
    )
    seeds = f", {v.gradient_seeds} gradient seeds within each" if v.gradient_seeds else ", anchors only"
    console.show(
        f"verdict on the ratio: {console.styled(v.verdict)} -- {v.ratio:.3f} with {v.level:.0%} interval "
        f"[{v.low:.3f}, {v.high:.3f}] (two-level bootstrap over {v.anchors} anchors{seeds}"
        f"{'; its lower end from the log-normal tail model' if v.tail_low is not None and v.tail_low <= v.low else ''}"
        f") against {v.threshold:.2f}{needed}"
    )
    if v.break_even_ratio is not None:
        console.show(
            f"break-even ratio r* = 1 / (1 + C_score / C_train) = {v.break_even_ratio:.3f} (scoring the dataset's "
            f"anchors once {v.scoring_gflop:,.0f} GFLOP, its training {v.training_gflop:,.0f} GFLOP): the proposal "
            f"{'pays' if v.pays_for_its_scoring else 'does not pay'} for its scoring{run_length_to_pay(v)}"
        )
