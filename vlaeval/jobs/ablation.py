"""job=ablation: does a gate pass predict a training gain? The 500-step importance-sampling ablation.

Check the settings (and a given audit result) before work; load the data, its held-out scenes and
the audited checkpoint; score every training anchor with the configured estimator; measure every
anchor's per-sample gradients on build draws (what the training-loss, gradient-oracle and
flow-time proposals are made from); build the proposals and the audit's prediction; for each
training seed and proposal, fine-tune with importance weights 1/(N q), measuring along the way the
gradient's second moment (every anchor on fresh judge draws, and real minibatches against uniform
sampling at the same parameters) and the held-out flow-matching loss; run every fine-tuned policy
closed-loop on the same episodes; summarise realized against predicted ratios with intervals
across seeds; save, plot, log to MLflow (a child run per proposal and seed), print the table.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from vlaeval import console
from vlaeval.audit.ablation import minibatch_variance_ratio, summarise_proposals
from vlaeval.audit.alignment import ratio_bootstrap
from vlaeval.audit.proposals import (
    Proposal,
    build_proposals,
    minibatch_moments,
    per_sample_second_moment,
    uniform_proposal,
    variance_ratio_interval,
)
from vlaeval.audit.result import (
    AblationResult,
    AblationRun,
    AuditPrediction,
    AuditResult,
    EpisodeSuccesses,
    Measurement,
    MinibatchCheck,
)
from vlaeval.audit.statistics import information_to_baseline_ratio, proposal_distribution
from vlaeval.choices import AblationProposal, Optimizer
from vlaeval.config import (
    AblationConfig,
    AuditConfig,
    EstimatorConfig,
    GateConfig,
    GradientsConfig,
    PolicyJobSettings,
    TrainConfig,
    to_plain,
)
from vlaeval.errors import UserInputError, first_line, require, require_at_least
from vlaeval.memory import PeakMemory
from vlaeval.policy.builtin import PolicyData, PolicyHandle
from vlaeval.policy.flow import FlowConvention
from vlaeval.policy.time_sampling import AdaptiveTimeSampler, adaptive_time_sampler, validate_sampler_settings
from vlaeval.residual.ablation import (
    AnchorGradients,
    FineTuneSettings,
    anchor_gradients,
    fine_tune,
    mean_loss,
    minibatch_gradients,
)
from vlaeval.residual.estimators import estimator_arguments, score_anchors, validate_estimator_config
from vlaeval.residual.scores import read_scores, scoring_settings
from vlaeval.runs import (
    ChildRun,
    JobResult,
    RunRecord,
    RunReport,
    lineage_tags,
    load_data,
    load_heldout_data,
    load_policy,
    now_ms,
    output_dir,
    publish,
)

JOB = "ablation"
COMPONENTS = ("data", "model")
RESULT_SCHEMA_VERSION = 1


def validate_ablation(cfg: AblationJobConfig) -> None:
    a = cfg.ablation
    proposals = [str(p) for p in a.proposals]
    require(len(proposals) > 0, "ablation.proposals is empty; list some of: " + ", ".join(AblationProposal.values()))
    repeated = sorted({p for p in proposals if proposals.count(p) > 1})
    require(not repeated, f"ablation.proposals repeats {repeated}; list each proposal once")
    seeds = [int(s) for s in a.seeds]
    require(len(seeds) >= 2, f"ablation.seeds has {len(seeds)} seed(s); give >= 2 (intervals are across seeds)")
    require(len(set(seeds)) == len(seeds), f"ablation.seeds repeats a seed: {seeds}")
    require_at_least("ablation.steps", a.steps, 1)
    require_at_least("ablation.batch_size", a.batch_size, 1)
    require(a.learning_rate > 0, f"ablation.learning_rate={a.learning_rate} must be > 0")
    require(1 <= a.measure_every <= a.steps, f"ablation.measure_every={a.measure_every} must be in [1, ablation.steps]")
    require(a.judge_draws >= 2, f"ablation.judge_draws={a.judge_draws} must be >= 2")
    require(a.build_draws >= 2, f"ablation.build_draws={a.build_draws} must be >= 2")
    require(a.minibatches == 0 or a.minibatches >= 2, f"ablation.minibatches={a.minibatches} must be 0 (off) or >= 2")
    require(a.time_bins >= 2, f"ablation.time_bins={a.time_bins} must be >= 2")
    if any(p in ADAPTIVE for p in proposals):
        validate_sampler_settings(cfg.train)
    require(0.0 < a.time_alpha <= 1.0, f"ablation.time_alpha={a.time_alpha} must be in (0, 1]")
    require_at_least("ablation.heldout_every", a.heldout_every, 1)
    require_at_least("ablation.heldout_draws", a.heldout_draws, 1)
    require(
        a.heldout_episodes_per_task >= 0,
        f"ablation.heldout_episodes_per_task={a.heldout_episodes_per_task} must be >= 0 (0: no held-out loss)",
    )
    if a.heldout_episodes_per_task > 0:
        require(
            "scenes" in cfg.data,
            f"the data component {cfg.data.get('_target_')} has no held-out scenes (a `scenes` argument); "
            "set ablation.heldout_episodes_per_task=0 to fine-tune without a held-out loss",
        )
    au = cfg.audit
    require(0.0 <= au.alpha <= 1.0, f"audit.alpha={au.alpha} must be in [0, 1]")
    require(0.0 <= au.percentile_epsilon < 0.5, f"audit.percentile_epsilon={au.percentile_epsilon} must be in [0, 0.5)")
    require(au.proposal_power > 0, f"audit.proposal_power={au.proposal_power} must be > 0")
    validate_estimator_config(cfg.estimator)
    FlowConvention.of(cfg.flow).validate()
    if a.audit_result is not None:
        check_audit_result(read_audit_result(str(a.audit_result)), cfg)


def check_audit_result(result: AuditResult, cfg: AblationJobConfig) -> None:
    """Refuse, before any work, an audit whose gate failed (unless ablation.allow_failed_gate) or whose
    prediction was made under other settings than this run's: the proposal's alpha, epsilon and gamma,
    the estimator that made the scores, and the gradient subset the second moment is over. The
    checkpoint and the dataset are checked once they are loaded (audit_prediction)."""
    source = f"ablation.audit_result={cfg.ablation.audit_result}"
    gate = result.gate
    if not gate.passed and not cfg.ablation.allow_failed_gate:
        failed = sorted(name for name, ok in gate.checks.items() if not ok)
        raise UserInputError(
            f"{source}: the audit's gate failed ({', '.join(failed) or gate.status}), so its proposal is not "
            "licensed for training; fix what failed, or set ablation.allow_failed_gate=true to measure it anyway"
        )
    proposal, score = result.alignment.proposal, result.score_definition
    audited: Dict[str, Tuple[Any, Any]] = {
        "audit.alpha": (proposal.alpha, cfg.audit.alpha),
        "audit.percentile_epsilon": (proposal.percentile_epsilon, cfg.audit.percentile_epsilon),
        "audit.proposal_power": (proposal.proposal_power, cfg.audit.proposal_power),
        "estimator.kind": (score.estimator, str(cfg.estimator.kind)),
        "estimator.seeds": (list(score.estimator_seeds), [int(x) for x in cfg.estimator.seeds]),
        "estimator.samples_per_estimator": (score.samples_per_estimator, cfg.estimator.samples_per_estimator),
        "gradients.trainable": (result.gradient_artifact["trainable"], cfg.gradients.selection()),
    }
    differ = [
        (key, then, now)
        for key, (then, now) in audited.items()
        if (then != now if isinstance(then, (str, list)) else not np.isclose(float(then), float(now), rtol=1e-12))
    ]
    if differ:
        raise UserInputError(
            f"{source} predicted its ratio under other settings ("
            + ", ".join(f"{key}={then} there, {now} here" for key, then, now in differ)
            + "); set them as the audit did, or audit with these"
        )


def check_audited_data(cfg: AblationJobConfig, data: PolicyData) -> None:
    """The audit's dataset is this run's (checked once the data is loaded, before the policy)."""
    if cfg.ablation.audit_result is None:
        return
    audited = str(read_audit_result(str(cfg.ablation.audit_result)).gradient_artifact["dataset_sha256"])
    require(
        audited == data.demonstrations.manifest_sha256,
        f"ablation.audit_result audited dataset {audited[:12]}..., not this run's "
        f"({data.demonstrations.manifest_sha256[:12]}...); give the audit's data settings or audit this data",
    )


def check_audited_checkpoint(cfg: AblationJobConfig, handle: PolicyHandle) -> None:
    """The audit's checkpoint is this run's (checked once it is loaded, before any scoring)."""
    if cfg.ablation.audit_result is None:
        return
    audited = read_audit_result(str(cfg.ablation.audit_result)).checkpoint_sha256
    require(
        audited == handle.sha256,
        f"ablation.audit_result audited checkpoint {audited[:12]}..., not this one ({handle.sha256[:12]}...); "
        "audit this checkpoint or give its checkpoint",
    )


def read_audit_result(path: str) -> AuditResult:
    """The audit's result.json, read and typed (the checks above read it as an AuditResult)."""
    file = Path(path)
    require(file.is_file(), f"ablation.audit_result={path} is not a file; give a job=residual_audit result.json")
    try:
        result = json.loads(file.read_text())
    except ValueError as error:
        raise UserInputError(f"ablation.audit_result={path} is not JSON ({error}); give a result.json") from None
    require(
        isinstance(result, dict) and result.get("job") == "residual_audit",
        f"ablation.audit_result={path} is not a job=residual_audit result; give the audit's result.json",
    )
    try:
        return AuditResult.from_json(result)
    except (KeyError, TypeError, ValueError) as error:
        raise UserInputError(
            f"ablation.audit_result={path} lacks {first_line(error, 60)} of a job=residual_audit result; "
            "give the result.json of a current audit"
        ) from None


def measure_steps(a: AblationConfig) -> List[int]:
    return sorted(set(range(0, int(a.steps) + 1, int(a.measure_every))) | {int(a.steps)})


def heldout_steps(a: AblationConfig) -> List[int]:
    return sorted(set(range(0, int(a.steps) + 1, int(a.heldout_every))) | {int(a.steps)})


def proposals_of(
    cfg: AblationJobConfig, names: List[str], residual: np.ndarray, build: AnchorGradients
) -> Dict[str, Proposal]:
    """The proposals compared, under the audit's transform of its score and the ablation's time bins."""
    au, a = cfg.audit, cfg.ablation
    return build_proposals(
        names,
        residual,
        build,
        alpha=float(au.alpha),
        percentile_epsilon=float(au.percentile_epsilon),
        proposal_power=float(au.proposal_power),
        time_bins=int(a.time_bins),
        time_alpha=float(a.time_alpha),
    )


ADAPTIVE = (AblationProposal.adaptive_flow_time, AblationProposal.residual_adaptive_flow_time)


def adaptive_sampler(name: str, train: TrainConfig) -> Optional[AdaptiveTimeSampler]:
    """A fresh online flow-time sampler (train.time_* settings) for an adaptive proposal, else None."""
    return adaptive_time_sampler(train) if name in ADAPTIVE else None


def ratio_to_uniform(judge: Any, proposal: Proposal) -> float:
    """M_q / M_uniform on the draws of `judge` (AnchorGradients)."""
    uniform = uniform_proposal(proposal.size)
    return per_sample_second_moment(judge.sq_norms, judge.u, proposal) / per_sample_second_moment(
        judge.sq_norms, judge.u, uniform
    )


def audit_prediction(
    cfg: AblationJobConfig, data: PolicyData, handle: PolicyHandle, residual: np.ndarray
) -> AuditPrediction:
    """The audit's predicted second-moment ratio for the residual proposal: from the given audit
    result, or computed the audit's way (its gradient artifact's anchors, RMS over its gradient
    seeds, the same transform of the residual) on the cached artifact for this checkpoint."""
    if cfg.ablation.audit_result is not None:
        result = read_audit_result(str(cfg.ablation.audit_result))
        proposal = result.alignment.proposal
        interval = proposal.ratio_interval  # None in results before it existed (and its SD too)
        return AuditPrediction(
            source=str(cfg.ablation.audit_result),
            predicted_ratio=float(proposal.information_to_baseline_ratio),
            predicted_ratio_sd=proposal.ratio_bootstrap_sd,
            predicted_ratio_interval=None if interval is None else (float(interval[0]), float(interval[1])),
            anchors=result.sample_count,
            gate_status=result.gate.status,
            eligible_for_500_step_ablation=result.gate.eligible_for_500_step_ablation,
        )
    from vlaeval.residual.artifact import cached_gradient_artifact, recover_anchors

    metadata, artifact_anchors = cached_gradient_artifact(
        cfg.gradients, cfg.flow, str(cfg.device), str(cfg.paths.cache_dir), data, handle
    )
    index = recover_anchors(
        data.demonstrations, data.anchors, artifact_anchors, metadata["dataset_sha256"], metadata["path"]
    )
    rms = np.array([x["gradient_rms"] for x in artifact_anchors])
    alpha, epsilon, power = float(cfg.audit.alpha), float(cfg.audit.percentile_epsilon), float(cfg.audit.proposal_power)
    q = proposal_distribution(residual[index], alpha=alpha, percentile_epsilon=epsilon, proposal_power=power)
    sd, interval = ratio_bootstrap(
        residual[index],
        rms,
        alpha=alpha,
        percentile_epsilon=epsilon,
        proposal_power=power,
        seed=int(cfg.audit.permutation_seed),
    )
    return AuditPrediction(
        source="computed the audit's way on its gradient artifact " + str(metadata["path"]),
        predicted_ratio=float(information_to_baseline_ratio(rms, q)),
        predicted_ratio_sd=sd,
        predicted_ratio_interval=(float(interval[0]), float(interval[1])),
        anchors=int(index.size),
        gradient_seeds=len(metadata["gradient_seeds"]),
    )


def residual_scores(cfg: AblationJobConfig, data: PolicyData, handle: PolicyHandle) -> tuple:
    """The residual of every training anchor: job=score's merged scores (checked against this
    checkpoint, data and estimator) or scored here, batched as the audit scores."""
    n = len(data.anchors)
    if cfg.ablation.scores is not None:
        metadata, arrays = read_scores(Path(str(cfg.ablation.scores)))
        wanted = scoring_settings(
            handle.sha256, data.demonstrations.manifest_sha256, n, to_plain(cfg.estimator), to_plain(cfg.flow)
        )
        recorded = metadata["settings"]
        differ = sorted(k for k, v in wanted.items() if v != recorded.get(k))
        require(
            not differ,
            f"ablation.scores={cfg.ablation.scores} were scored with other {', '.join(differ)} than this run; "
            "score with this checkpoint, data and estimator (job=score) or set ablation.scores=null",
        )
        return arrays["mean_residual"], {"source": str(cfg.ablation.scores), "shards": len(metadata["shards"])}
    started = time.perf_counter()
    with (
        PeakMemory(str(cfg.device)) as peak,
        console.unit_progress(f"scoring every anchor ({cfg.estimator.kind})", n) as update,
    ):
        scores = score_anchors(
            data.bind(handle.model, cfg.flow, str(cfg.device)),
            data.anchors,
            np.arange(n),
            **estimator_arguments(cfg.estimator),
            progress=lambda done, total: update(completed=done),
        )
    seconds = time.perf_counter() - started
    runtime = {
        "source": "scored here",
        "estimator": str(cfg.estimator.kind),
        "seconds": seconds,
        "anchors_per_second": n / seconds,
        **peak.report(),
    }
    return scores.estimator_residuals.mean(axis=0), runtime


def heldout_data(cfg: AblationJobConfig) -> Optional[Any]:
    if int(cfg.ablation.heldout_episodes_per_task) == 0:
        return None
    return load_heldout_data(cfg, int(cfg.ablation.heldout_episodes_per_task))


def every_anchor_gradients(cfg: AblationJobConfig, policy: Any, anchors: Any, model: Any, keys: List[tuple]) -> Any:
    """Per-sample gradients of every anchor of `model` (policy's inputs and flow), one draw per key."""
    return anchor_gradients(
        policy.with_model(model),
        anchors,
        trainable=cfg.gradients.selection(),
        draw_keys=keys,
        batch_size=int(cfg.gradients.batch_size),
        method=str(cfg.gradients.method),
    )


class ProposalJudge:
    """What the ablation measures on a model while it is fine-tuned: per-sample gradients of every
    anchor under the judge's draws (one set per seed at step 0, shared by every proposal), each
    proposal's second moment against uniform's, importance-weighted minibatch gradients, and the
    held-out flow-matching loss."""

    def __init__(
        self,
        cfg: AblationJobConfig,
        policy: Any,
        anchors: Any,
        proposals: Dict[str, Proposal],
        heldout: Optional[Tuple[Any, Any]] = None,
    ) -> None:
        self.cfg, self.a, self.policy, self.anchors = cfg, cfg.ablation, policy, anchors
        self.trainable = cfg.gradients.selection()
        self.proposals, self.uniform = proposals, uniform_proposal(len(anchors))
        self.heldout = heldout  # (held-out policy, held-out anchors)
        self.step0: Dict[int, Any] = {}  # the judge at step 0 is the same for every proposal of a seed

    def gradients(self, model: Any, keys: List[tuple]) -> Any:
        return every_anchor_gradients(self.cfg, self.policy, self.anchors, model, keys)

    def heldout_loss(self, model: Any, heldout: Tuple[Any, Any]) -> float:
        """The flow-matching loss over every held-out anchor, the same draws for every model."""
        held_policy, held_anchors = heldout
        return mean_loss(
            held_policy.with_model(model), held_anchors, draws_per_anchor=int(self.a.heldout_draws), key=("heldout",)
        )

    def measure(self, model: Any, proposal: Proposal, seed: int, step: int) -> Measurement:
        keys = [("judge", seed, step, j) for j in range(int(self.a.judge_draws))]
        if step != 0:
            judge = self.gradients(model, keys)
        elif seed in self.step0:
            judge = self.step0[seed]
        else:
            judge = self.step0[seed] = self.gradients(model, keys)
        moments = {k: per_sample_second_moment(judge.sq_norms, judge.u, p) for k, p in self.proposals.items()}
        m_uniform = per_sample_second_moment(judge.sq_norms, judge.u, self.uniform)
        return Measurement(
            step=step,
            second_moment=moments[proposal.name],
            uniform_second_moment=m_uniform,
            ratio=moments[proposal.name] / m_uniform,
            ratios_of_every_proposal={k: v / m_uniform for k, v in moments.items()},
            mean_loss=float(judge.losses.mean()),
            minibatch=self.minibatch(model, proposal, seed, step) if int(self.a.minibatches) > 0 else None,
        )

    def minibatch(self, model: Any, proposal: Proposal, seed: int, step: int) -> MinibatchCheck:
        """The proposal's importance-weighted minibatch gradients against uniform's at the same parameters."""
        mine, base = (
            minibatch_gradients(
                self.policy.with_model(model),
                self.anchors,
                sampler,
                key=(label, seed, step, proposal.name),
                trainable=self.trainable,
                count=int(self.a.minibatches),
                batch_size=int(self.a.batch_size),
            )
            for label, sampler in (("mine", proposal), ("uniform", self.uniform))
        )
        mm, mb = minibatch_moments(mine), minibatch_moments(base)
        return MinibatchCheck(
            proposal=mm,
            uniform=mb,
            second_moment_ratio=mm["second_moment"] / mb["second_moment"],
            variance_ratio=variance_ratio_interval(
                np.sum((mine - mine.mean(axis=0)) ** 2, axis=1),
                np.sum((base - base.mean(axis=0)) ** 2, axis=1),
            ),
        )


def fine_tuning_settings(cfg: AblationJobConfig) -> FineTuneSettings:
    a = cfg.ablation
    return FineTuneSettings(
        steps=int(a.steps),
        batch_size=int(a.batch_size),
        learning_rate=float(a.learning_rate),
        optimizer=str(Optimizer.parse(a.optimizer, "ablation.optimizer")),
        trainable=cfg.gradients.selection(),
        seed=0,  # replaced per run
        log_every=int(a.heldout_every),
    )


def fine_tune_every_proposal(
    policy: Any,
    anchors: Any,
    proposals: Dict[str, Proposal],
    seeds: List[int],
    settings: FineTuneSettings,
    judge: ProposalJudge,
    measured: List[int],
    held_at: List[int],
    train: TrainConfig,
) -> Tuple[List[AblationRun], List[Any]]:
    """Each proposal fine-tuned from the checkpoint under each seed (the same draws for every
    proposal of a seed), judged at the measured steps and its held-out loss taken at held_at:
    one record per run and the fine-tuned models, in (seed, proposal) order."""
    runs: List[AblationRun] = []
    models: List[Any] = []
    with console.unit_progress("fine-tuning", len(seeds) * len(proposals)) as update:
        for seed in seeds:
            for name, proposal in proposals.items():
                measurements: List[Measurement] = []
                heldout_loss: List[Tuple[int, float]] = []

                def on_step(
                    step: int,
                    model: Any,
                    current: Proposal,
                    measurements: List[Measurement] = measurements,
                    heldout_loss: List[Tuple[int, float]] = heldout_loss,
                    seed: int = seed,
                ) -> None:
                    if step in held_at and judge.heldout is not None:
                        heldout_loss.append((step, judge.heldout_loss(model, judge.heldout)))
                    if step in measured:  # an adaptive proposal is judged as it stands at this step
                        measurements.append(judge.measure(model, current, seed, step))

                run_started = time.perf_counter()
                tuned = fine_tune(
                    policy,
                    anchors,
                    proposal,
                    dataclasses.replace(settings, seed=seed),
                    at_steps=sorted(set(measured) | set(held_at)),
                    on_step=on_step,
                    time_sampler=adaptive_sampler(name, train),
                )
                runs.append(
                    AblationRun(
                        proposal=name,
                        seed=seed,
                        measurements=tuple(measurements),
                        heldout_loss=tuple(heldout_loss),
                        train_loss_curve=tuned.train_loss_curve,
                        train_seconds=tuned.train_seconds,
                        wall_seconds=time.perf_counter() - run_started,
                    )
                )
                models.append(tuned.model.cpu())
                update(completed=len(runs), description=f"fine-tuned {name} seed {seed}")
    return runs, models


@dataclass(frozen=True, kw_only=True)
class AblationJobConfig(PolicyJobSettings):
    """The sections job=ablation reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    ablation: AblationConfig
    audit: AuditConfig
    gate: GateConfig
    estimator: EstimatorConfig
    gradients: GradientsConfig


def run(cfg: AblationJobConfig) -> JobResult[AblationResult]:
    started_ms = now_ms()
    validate_ablation(cfg)
    a = cfg.ablation
    names = [str(p) for p in a.proposals]
    seeds = [int(s) for s in a.seeds]
    data = load_data(cfg)
    check_audited_data(cfg, data)
    heldout = heldout_data(cfg)
    handle = load_policy(cfg, data)
    check_audited_checkpoint(cfg, handle)
    n = len(data.anchors)
    policy = data.bind(handle.model, cfg.flow, str(cfg.device))
    trainable = cfg.gradients.selection()

    residual, score_runtime = residual_scores(cfg, data, handle)
    console.show(f"per-sample gradients of {n} anchors x {a.build_draws} build draws")
    build = every_anchor_gradients(
        cfg, policy, data.anchors, handle.model, [("build", k) for k in range(int(a.build_draws))]
    )
    proposals = proposals_of(cfg, names, residual, build)
    held = (policy.for_instructions(heldout.demonstrations.instructions), heldout.anchors) if heldout else None
    judge = ProposalJudge(cfg, policy, data.anchors, proposals, held)
    prediction = audit_prediction(cfg, data, handle, residual)
    built_from = {name: ratio_to_uniform(build, p) for name, p in proposals.items()}

    settings = fine_tuning_settings(cfg)
    measured, held_at = measure_steps(a), heldout_steps(a) if heldout is not None else []
    runs, models = fine_tune_every_proposal(
        policy,
        data.anchors,
        {name: proposals[name] for name in names},
        seeds,
        settings,
        judge,
        measured,
        held_at,
        cfg.train,
    )

    success = closed_loop_success(cfg, data, handle, models) if a.evaluate else None
    if success is not None:  # the base checkpoint first, then each run in its order
        runs = [dataclasses.replace(record, success=row) for record, row in zip(runs, success[1:])]
    result = AblationResult(
        schema_version=RESULT_SCHEMA_VERSION,
        checkpoint=str(handle.path),
        checkpoint_sha256=handle.sha256,
        dataset_manifest_sha256=data.demonstrations.manifest_sha256,
        anchors=n,
        heldout_anchors=len(heldout.anchors) if heldout is not None else 0,
        trainable=trainable,
        score=score_runtime,
        prediction=prediction,
        proposals={name: {**p.describe(), "ratio_on_build_draws": built_from[name]} for name, p in proposals.items()},
        settings={
            **{k: v for k, v in dataclasses.asdict(settings).items() if k != "seed"},
            "measure_steps": measured,
            "judge_draws": int(a.judge_draws),
        },
        summary=summarise_proposals(runs, names, prediction, measured),
        runs=tuple(runs),
        base_success=None if success is None else success[0],
    )
    plots = []
    if a.plot:
        from vlaeval.audit.plots import plot_ablation

        plots.append(plot_ablation(result, output_dir(cfg) / "ablation.png"))
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"ablation {handle.sha256[:8]} {len(names)}x{len(seeds)}",
            metrics=result.metrics(),
            checks=result.checks(),
            tags={**lineage_tags(handle, data), "ablation.proposals": ",".join(names)},
            plots=plots,
            children=[child_run(record) for record in runs],
        ),
    )
    print_summary(result, published)
    return JobResult(result, published)


def closed_loop_success(
    cfg: AblationJobConfig, data: PolicyData, handle: PolicyHandle, models: List[Any]
) -> List[EpisodeSuccesses]:
    """The checkpoint and then every fine-tuned policy on the same held-out episodes (paired)."""
    from vlaeval.envs import simulator
    from vlaeval.envs.episodes import Episode
    from vlaeval.rollouts.engine import RolloutJob, run_rollout_jobs

    e = cfg.evaluate
    sim = simulator(cfg.simulator)
    plan = sim.episode_plan(data.demonstrations.tasks, int(e.episodes_per_task), int(e.seed), sim.held_out_variants)
    episodes = [Episode(p["task"], p["task_index"], p["variant"], p["seed"]) for p in plan]
    jobs = [RolloutJob(data.bind(m, cfg.flow), episodes, cfg.simulator) for m in [handle.model.cpu(), *models]]
    with console.unit_progress("closed-loop episodes", len(jobs) * len(episodes)) as update:
        outs = run_rollout_jobs(jobs, e, cfg.rollout, progress=lambda done, total: update(completed=done))
    return [EpisodeSuccesses(float(np.mean(o.success)), tuple(bool(x) for x in o.success)) for o in outs]


def child_run(record: AblationRun) -> ChildRun:
    name, seed, measured = record.proposal, record.seed, record.measurements
    history: Dict[str, Sequence[Tuple[int, Optional[float]]]] = {
        "ratio.realized": [(m.step, m.ratio) for m in measured],
        "gradient.second_moment": [(m.step, m.second_moment) for m in measured],
        "gradient.uniform_second_moment": [(m.step, m.uniform_second_moment) for m in measured],
        "loss.heldout": list(record.heldout_loss),
        "loss.train_weighted": list(record.train_loss_curve),
    }
    if measured and all(m.minibatch is not None for m in measured):
        history["minibatch.variance_ratio"] = [(m.step, minibatch_variance_ratio(m)) for m in measured]
    metrics = {"ratio.final": measured[-1].ratio, "timing.wall_seconds": record.wall_seconds}
    if record.heldout_loss:
        metrics["loss.heldout_final"] = record.heldout_loss[-1][1]
    if record.success is not None:
        metrics["success_rate"] = record.success.success_rate
    return ChildRun(
        name=f"{name} seed {seed}",
        params={"ablation.proposal": name, "ablation.seed": seed},
        metrics=metrics,
        history=history,
        tags={"ablation.proposal": name, "ablation.seed": seed},
        result=record.to_json(),
    )


def print_summary(result: AblationResult, run: RunRecord) -> None:
    measured = result.measure_steps
    first, last = str(measured[0]), str(measured[-1])
    p = result.prediction
    console.show(
        f"audit's predicted ratio (residual, {p.anchors} anchors): {p.predicted_ratio:.3f}"
        + (f"  gate {p.gate_status}" if p.gate_status else "")
    )
    rows = []
    for name, row in result.summary.items():
        r0, r1 = row.realized_ratio[first], row.realized_ratio[last]
        h, s = row.final_heldout_loss, row.success_rate
        rows.append(
            [
                name,
                f"{r0['mean']:.3f} [{r0['low']:.3f}, {r0['high']:.3f}]",
                f"{r1['mean']:.3f} [{r1['low']:.3f}, {r1['high']:.3f}]",
                "yes" if row.gain_is_real else "no",
                f"{h['mean']:.4f} ± {(h['high'] - h['mean']):.4f}" if h else "-",
                f"{s['mean']:.3f}" if s else "-",
                f"{row.wall_seconds:.1f}",
            ]
        )
    seeds = len(next(iter(result.summary.values())).realized_ratio[last]["values"])
    console.show(
        console.table(
            f"Importance-sampling ablation ({result.anchors} anchors, {result.settings['steps']} steps, "
            f"{seeds} seeds; 95% intervals across seeds)",
            [
                "proposal",
                f"ratio at step {first}",
                f"ratio at step {last}",
                "gain real",
                "held-out loss",
                "success",
                "s/run",
            ],
            rows,
        )
    )
    console.show(run.where())
