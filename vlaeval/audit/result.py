"""The residual audit's result as typed objects: the gate's decision, what the score is, each
anchor's scores, and the whole audit with the metrics, checks and tags it publishes.

Frozen; `to_json()` writes the result.json layout (unchanged, so readers of earlier results keep
working) and `from_json()` reads it back. The statistics' own reports (repeatability, alignment,
leave-one-out robustness) are carried as the mappings their pure functions return.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from vlaeval.audit.alignment import Alignment
from vlaeval.audit.decomposition import NoiseDecomposition
from vlaeval.audit.proposals import PredictionAgreement
from vlaeval.audit.statistics import LeaveOneOut, Repeatability
from vlaeval.audit.verdict import RatioVerdict
from vlaeval.choices import Verdict
from vlaeval.records import JsonRecord

GATE_EXIT_CODES = {"pass": 0, "fail": 12, "smoke": 13, "undecided": 14}  # audit.exit_code_from_gate


@dataclass(frozen=True)
class GateDecision:
    """checks: named after their thresholds; pass: all of them; eligible: pass on enough anchors for a
    certificate (formal); informational: reported, not required by this preset (None: unknown)."""

    checks: Mapping[str, bool]
    passed: bool
    eligible_for_500_step_ablation: bool
    status: str
    preset: str
    informational: Mapping[str, Any] = field(default_factory=dict)
    # The three-way verdict on the ratio, its interval and the break-even ratio (None: results saved
    # before it existed). `checks` stays the seed's screen: "the score carries signal".
    verdict: Optional[RatioVerdict] = None
    ratio_check: Optional[str] = None  # the name of the screen's point check the verdict decides instead

    @property
    def exit_code(self) -> int:
        """0: eligible (a formal pass); 12: a check failed, or the ratio's interval lies above the
        threshold; 13: every check passed on too few anchors for a certificate (a smoke run); 14: the
        other checks passed and the threshold lies inside the ratio's interval (UNDECIDED)."""
        return GATE_EXIT_CODES[self.outcome]

    @property
    def outcome(self) -> str:
        """pass, fail, smoke or undecided (GATE_EXIT_CODES' keys)."""
        if self.verdict is None:  # a result from before the verdict: the seed's screen alone
            if self.eligible_for_500_step_ablation:
                return "pass"
            return "fail" if not self.passed else "smoke"
        others = all(ok for name, ok in self.checks.items() if name != self.ratio_check)
        if not others or self.verdict.verdict == Verdict.FAIL.value:
            return "fail"
        if self.verdict.verdict == Verdict.UNDECIDED.value:
            return "undecided"
        return "pass" if self.status.startswith("formal") else "smoke"

    def to_json(self) -> Dict[str, Any]:
        return {
            "checks": dict(self.checks),
            "informational": dict(self.informational),
            "pass": self.passed,
            "eligible_for_500_step_ablation": self.eligible_for_500_step_ablation,
            "status": self.status,
            "preset": self.preset,
            **({"verdict": self.verdict.to_json(), "ratio_check": self.ratio_check} if self.verdict else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GateDecision":
        verdict = data.get("verdict")
        return cls(
            checks={str(k): bool(v) for k, v in data["checks"].items()},
            passed=bool(data["pass"]),
            eligible_for_500_step_ablation=bool(data["eligible_for_500_step_ablation"]),
            status=str(data["status"]),
            preset=str(data.get("preset", "formal")),
            informational=dict(data.get("informational", {})),
            verdict=RatioVerdict.from_json(verdict) if verdict else None,
            ratio_check=data.get("ratio_check"),
        )


@dataclass(frozen=True)
class ScoreDefinition:
    """What the score is: the estimator (and whether it is unbiased), its seeds and draws."""

    name: str
    estimator: str
    unbiased: bool
    variance_reduction: Tuple[str, ...]
    model_mode: str
    estimator_seeds: Tuple[int, ...]
    samples_per_estimator: int
    head_evaluations_per_anchor: int
    proposal_power: float
    forbidden_labels: Tuple[str, ...] = ("likelihood", "entropy", "surprisal")

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ScoreDefinition":
        return cls(
            name=str(data["name"]),
            estimator=str(data["estimator"]),
            unbiased=bool(data.get("unbiased", True)),
            variance_reduction=tuple(data.get("variance_reduction", [])),
            model_mode=str(data.get("model_mode", "eval")),
            estimator_seeds=tuple(int(s) for s in data.get("estimator_seeds", [])),
            samples_per_estimator=int(data.get("samples_per_estimator", 0)),
            head_evaluations_per_anchor=int(data.get("head_evaluations_per_anchor", 0)),
            proposal_power=float(data.get("proposal_power", 1.0)),
            forbidden_labels=tuple(data.get("forbidden_labels", ())),
        )


@dataclass(frozen=True)
class AnchorScore:
    """One anchor: its residual per estimator seed, the draws behind them, and its gradient figures."""

    anchor_position: int
    episode: int
    frame: int
    mean_residual: float
    estimator_residuals: Tuple[float, ...]
    gradient_rms: float
    mean_gradient_loss: float
    sample_losses: Tuple[Any, ...] = ()
    time_values: Tuple[Any, ...] = ()
    sampling_trace: Any = None

    def to_json(self) -> Dict[str, Any]:
        return {
            "anchor_position": self.anchor_position,
            "estimator_residuals": list(self.estimator_residuals),
            "sample_losses": list(self.sample_losses),
            "time_values": list(self.time_values),
            "mean_residual": self.mean_residual,
            "episode": self.episode,
            "frame": self.frame,
            "sampling_trace": self.sampling_trace,
            "gradient_rms": self.gradient_rms,
            "mean_gradient_loss": self.mean_gradient_loss,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AnchorScore":
        return cls(
            anchor_position=int(data["anchor_position"]),
            episode=int(data["episode"]),
            frame=int(data["frame"]),
            mean_residual=float(data["mean_residual"]),
            estimator_residuals=tuple(data["estimator_residuals"]),
            gradient_rms=float(data["gradient_rms"]),
            mean_gradient_loss=float(data.get("mean_gradient_loss", float("nan"))),
            sample_losses=tuple(data.get("sample_losses", ())),
            time_values=tuple(data.get("time_values", ())),
            sampling_trace=data.get("sampling_trace"),
        )


@dataclass(frozen=True)
class AuditResult:
    """A residual audit: the checkpoint and gradient artifact it judged, what the score is and what
    computing it cost, the statistics' reports, the gate, and every anchor."""

    schema_version: int
    checkpoint: str
    checkpoint_sha256: str
    gradient_artifact: Mapping[str, Any]
    score_definition: ScoreDefinition
    score_runtime: Mapping[str, Any]
    repeatability: Repeatability
    alignment: Alignment
    leave_one_out_robustness: LeaveOneOut
    gate: GateDecision
    anchors: Tuple[AnchorScore, ...]
    # Where the gradient's noise is (anchor, flow time, interaction, the rest), when the artifact
    # records each draw's flow time; None otherwise (and in results written before it).
    noise_decomposition: Optional[NoiseDecomposition] = None

    @property
    def sample_count(self) -> int:
        return len(self.anchors)

    @property
    def status(self) -> str:
        return self.gate.status

    def metrics(self) -> Dict[str, Optional[float]]:
        """The headline figures MLflow shows (literal keys: grep finds where each is made)."""
        al, rep, loo = self.alignment, self.repeatability, self.leave_one_out_robustness
        perm, prop = al.random_permutation_control, al.proposal
        metrics: Dict[str, Optional[float]] = {
            "repeatability.spearman": rep.spearman,
            "repeatability.kendall": rep.kendall,
            "repeatability.mean_anchor_cv": rep.mean_anchor_cv,
            "alignment.spearman_residual_vs_gradient_rms": al.spearman_residual_vs_gradient_rms,
            "alignment.kendall_residual_vs_gradient_rms": al.kendall_residual_vs_gradient_rms,
            "alignment.top25_overlap": al.top25_overlap,
            "alignment.attenuation_corrected_spearman": al.reliability.attenuation_corrected_spearman,
            "proposal.information_to_baseline_ratio": prop.information_to_baseline_ratio,
            "proposal.ratio_bootstrap_sd": prop.ratio_bootstrap_sd,
            "proposal.oracle_ratio": prop.oracle_ratio,
            "proposal.fraction_of_oracle_gain": prop.fraction_of_oracle_gain,
            "proposal.attainable_oracle_ratio": prop.attainable_oracle_ratio,
            "proposal.fraction_of_attainable_oracle_gain": prop.fraction_of_attainable_oracle_gain,
            "proposal.raw_score_ratio": al.raw_score_proposal.information_to_baseline_ratio,
            "permutation.p_spearman": perm.one_sided_pvalue_rho_at_least_observed,
            "permutation.p_second_moment": perm.one_sided_pvalue_second_moment_at_most_observed,
            "leave_one_out.min_spearman": loo.min_spearman,
            "leave_one_out.max_second_moment_ratio": loo.max_second_moment_ratio,
            "score.mean_residual": float(np.mean([a.mean_residual for a in self.anchors])),
            "eligible_for_500_step_ablation": float(self.gate.eligible_for_500_step_ablation),
            "timing.score_seconds": self.score_runtime["elapsed_seconds"],
            "timing.anchors_per_second": self.score_runtime["anchors_per_second"],
        }
        decomposition = self.noise_decomposition
        if decomposition is not None:
            shares, oracles = decomposition.variance_shares, decomposition.oracle_ratios
            metrics.update(
                {
                    "decomposition.share_anchor": shares["anchor"],
                    "decomposition.share_flow_time": shares["flow_time"],
                    "decomposition.share_interaction": shares["interaction"],
                    "decomposition.share_rest": shares["rest"],
                }
            )
            # An oracle a cell without draws leaves out is absent, not None (a rerun compares what is there)
            for key, name in (
                ("decomposition.oracle_ratio_anchor", "anchor"),
                ("decomposition.oracle_ratio_flow_time", "flow_time"),
                ("decomposition.oracle_ratio_anchor_and_flow_time", "anchor_and_flow_time"),
            ):
                if oracles[name] is not None:
                    metrics[key] = oracles[name]
        verdict = self.gate.verdict
        if verdict is not None:
            metrics.update({"verdict.ratio_low": verdict.low, "verdict.ratio_high": verdict.high})
            optional = {
                # from measured seconds: volatile, as timings are (job=reproduce does not compare them)
                "timing.break_even_ratio": verdict.break_even_ratio,
                "verdict.anchors_needed": None if verdict.anchors_needed is None else float(verdict.anchors_needed),
            }
            metrics.update({k: v for k, v in optional.items() if v is not None})
        baseline = al.baseline_comparison
        if baseline is not None:
            shared = baseline.training_loss_shared_draws
            metrics.update(
                {
                    "baseline.residual_spearman": baseline.residual.spearman,
                    "baseline.training_loss_spearman": baseline.training_loss.spearman,
                    "baseline.training_loss_spearman_shared_draws": shared.spearman,
                    "baseline.residual_ratio": baseline.residual.second_moment_ratio,
                    "baseline.training_loss_ratio": baseline.training_loss.second_moment_ratio,
                    "baseline.training_loss_ratio_shared_draws": shared.second_moment_ratio,
                    "baseline.score_beats_training_loss": float(baseline.score_beats_training_loss),
                }
            )
        return metrics

    def tags(self) -> Dict[str, str]:
        return {
            "gate.status": self.gate.status,
            "gate.eligible_for_500_step_ablation": str(self.gate.eligible_for_500_step_ablation).lower(),
            "estimator.kind": self.score_definition.estimator,
            "estimator.unbiased": str(self.score_definition.unbiased).lower(),
            **({"gate.verdict": self.gate.verdict.verdict} if self.gate.verdict else {}),
        }

    def to_json(self) -> Dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "status": self.status,
            "checkpoint": self.checkpoint,
            "checkpoint_sha256": self.checkpoint_sha256,
            "gradient_artifact": dict(self.gradient_artifact),
            "sample_count": self.sample_count,
            "score_definition": self.score_definition.to_json(),
            "score_runtime": dict(self.score_runtime),
            "repeatability": self.repeatability.as_dict(),
            "alignment": self.alignment.as_dict(),
            "leave_one_out_robustness": self.leave_one_out_robustness.as_dict(),
            "gate": self.gate.to_json(),
            "noise_decomposition": None if self.noise_decomposition is None else self.noise_decomposition.as_dict(),
            "anchors": [a.to_json() for a in self.anchors],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AuditResult":
        anchors: List[AnchorScore] = [AnchorScore.from_json(a) for a in data.get("anchors", [])]
        return cls(
            schema_version=int(data.get("schema_version", 1)),
            checkpoint=str(data.get("checkpoint", "")),
            checkpoint_sha256=str(data.get("checkpoint_sha256", "")),
            gradient_artifact=dict(data.get("gradient_artifact", {})),
            score_definition=ScoreDefinition.from_json(data["score_definition"]),
            score_runtime=dict(data.get("score_runtime", {})),
            repeatability=Repeatability.from_json(data["repeatability"]),
            alignment=Alignment.from_json(data["alignment"]),
            leave_one_out_robustness=LeaveOneOut.from_json(data["leave_one_out_robustness"]),
            gate=GateDecision.from_json(data["gate"]),
            anchors=tuple(anchors),
            noise_decomposition=(
                NoiseDecomposition.from_json(data["noise_decomposition"]) if data.get("noise_decomposition") else None
            ),
        )


@dataclass(frozen=True)
class ProposalSummary:
    """One proposal across training seeds (each figure a seed interval: mean, low, high, values):
    the realized second-moment ratio at each measured step, whether its gain is real, the held-out
    loss (and its paired difference from uniform), closed-loop success, and the time a run took."""

    realized_ratio: Mapping[str, Mapping[str, Any]]  # step -> seed interval
    gain_is_real: bool
    wall_seconds: float
    train_seconds: float
    minibatch_variance_ratio: Optional[Mapping[str, Mapping[str, Any]]] = None
    final_heldout_loss: Optional[Mapping[str, Any]] = None
    heldout_loss_minus_uniform: Optional[Mapping[str, Any]] = None
    success_rate: Optional[Mapping[str, Any]] = None
    predicted_ratio: Optional[float] = None  # the residual proposal: the audit's prediction
    # step -> the realized ratio and the prediction as two estimates with errors (prediction_agreement),
    # at the audited parameters (step 0) and at the end
    prediction_vs_realized: Optional[Mapping[str, PredictionAgreement]] = None
    prediction_within_interval: Optional[bool] = None  # results before prediction_vs_realized: read, not made

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ProposalSummary":
        names = {f.name for f in dataclasses.fields(cls)}
        read = {k: v for k, v in data.items() if k in names}
        if read.get("prediction_vs_realized") is not None:
            read["prediction_vs_realized"] = {
                step: v if isinstance(v, PredictionAgreement) else PredictionAgreement.from_json(v)
                for step, v in read["prediction_vs_realized"].items()
            }
        return cls(**read)


@dataclass(frozen=True)
class AuditPrediction(JsonRecord):
    """The audit's predicted second-moment ratio of the residual proposal, as the ablation tests it:
    read from an audit's result (its gate status with it), or computed the audit's way on the
    cached gradient artifact (over its gradient seeds)."""

    WRITTEN_WHEN_NONE = (
        "predicted_ratio_sd",
        "predicted_ratio_interval",
        "gate_status",
        "eligible_for_500_step_ablation",
    )

    source: str
    predicted_ratio: float
    predicted_ratio_sd: Optional[float]  # None in audit results before the bootstrap existed
    predicted_ratio_interval: Optional[Tuple[float, float]]
    anchors: int
    gradient_seeds: Optional[int] = None  # computed here: the artifact's seeds
    gate_status: Optional[str] = None  # read from an audit: its gate
    eligible_for_500_step_ablation: Optional[bool] = None


@dataclass(frozen=True)
class MinibatchCheck(JsonRecord):
    """A proposal's importance-weighted minibatch gradients against uniform's at the same parameters."""

    proposal: Mapping[str, float]  # minibatch_moments: mean norm, second moment, ...
    uniform: Mapping[str, float]
    second_moment_ratio: float
    variance_ratio: Mapping[str, Any]  # variance_ratio_interval: ratio and its interval


@dataclass(frozen=True)
class Measurement(JsonRecord):
    """What the judge measured of one fine-tuning run at one step: the proposal's per-sample
    gradient second moment against uniform's (and every proposal's ratio on the same draws), the
    judge's mean loss, and the minibatch check where asked for."""

    step: int
    second_moment: float
    uniform_second_moment: float
    ratio: float
    ratios_of_every_proposal: Mapping[str, float]
    mean_loss: float
    minibatch: Optional[MinibatchCheck] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Measurement":
        read = super().from_json(data)
        if "minibatch" not in data:
            return read
        return dataclasses.replace(read, minibatch=MinibatchCheck.from_json(data["minibatch"]))


@dataclass(frozen=True)
class EpisodeSuccesses(JsonRecord):
    """A policy's closed-loop outcomes on the ablation's held-out episodes (the same for every policy)."""

    success_rate: float
    successes: Tuple[bool, ...]


@dataclass(frozen=True)
class AblationRun(JsonRecord):
    """One proposal fine-tuned under one seed: the judge's measurements, the held-out loss (step,
    loss), the weighted training loss curve, its time, and its closed-loop success."""

    proposal: str
    seed: int
    measurements: Tuple[Measurement, ...]
    heldout_loss: Tuple[Tuple[int, float], ...]
    train_loss_curve: Tuple[Tuple[int, float], ...]
    train_seconds: float
    wall_seconds: float
    success: Optional[EpisodeSuccesses] = None

    @property
    def final_heldout_loss(self) -> Optional[float]:
        return self.heldout_loss[-1][1] if self.heldout_loss else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AblationRun":
        read = super().from_json(data)
        return dataclasses.replace(
            read,
            measurements=tuple(Measurement.from_json(m) for m in data.get("measurements", ())),
            success=EpisodeSuccesses.from_json(data["success"]) if data.get("success") else None,
        )


@dataclass(frozen=True)
class AblationResult:
    """job=ablation: the audit's predicted ratio, and per proposal what fine-tuning under it realized."""

    schema_version: int
    checkpoint: str
    checkpoint_sha256: str
    dataset_manifest_sha256: str
    anchors: int
    heldout_anchors: int
    trainable: str  # which parameters fine-tuning moves
    score: Mapping[str, Any]
    prediction: AuditPrediction
    proposals: Mapping[str, Mapping[str, Any]]
    settings: Mapping[str, Any]
    summary: Mapping[str, ProposalSummary]
    runs: Tuple[AblationRun, ...]
    base_success: Optional[EpisodeSuccesses] = None

    @property
    def measure_steps(self) -> List[int]:
        return [int(s) for s in self.settings["measure_steps"]]

    def metrics(self) -> Dict[str, Optional[float]]:
        last = str(self.measure_steps[-1])
        metrics: Dict[str, Optional[float]] = {
            "prediction.residual_ratio": self.prediction.predicted_ratio,
            "score.anchors_per_second": self.score.get("anchors_per_second"),
        }
        for name, row in self.summary.items():
            metrics[f"realized_ratio.{name}"] = row.realized_ratio[last]["mean"]
            metrics[f"realized_ratio_high.{name}"] = row.realized_ratio[last]["high"]
            if row.final_heldout_loss is not None:
                metrics[f"heldout_loss.{name}"] = row.final_heldout_loss["mean"]
            if row.success_rate is not None:
                metrics[f"success_rate.{name}"] = row.success_rate["mean"]
        return metrics

    def checks(self) -> Dict[str, bool]:
        residual = self.summary.get("residual")
        if residual is None:
            return {}
        checks = {"residual_gain_is_real": residual.gain_is_real}
        if residual.prediction_vs_realized is not None:
            at_audit = residual.prediction_vs_realized[str(self.measure_steps[0])]
            checks["prediction_consistent_with_realized"] = at_audit.consistent
        elif residual.prediction_within_interval is not None:
            checks["prediction_within_interval"] = bool(residual.prediction_within_interval)
        return checks

    def to_json(self) -> Dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "checkpoint": self.checkpoint,
            "checkpoint_sha256": self.checkpoint_sha256,
            "dataset_manifest_sha256": self.dataset_manifest_sha256,
            "anchors": self.anchors,
            "heldout_anchors": self.heldout_anchors,
            "trainable": self.trainable,
            "score": dict(self.score),
            "prediction": self.prediction.to_json(),
            "proposals": {k: dict(v) for k, v in self.proposals.items()},
            "settings": dict(self.settings),
            "base_success": None if self.base_success is None else self.base_success.to_json(),
            "summary": {k: v.to_json() for k, v in self.summary.items()},
            "runs": [r.to_json() for r in self.runs],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AblationResult":
        return cls(
            schema_version=int(data.get("schema_version", 1)),
            checkpoint=str(data.get("checkpoint", "")),
            checkpoint_sha256=str(data.get("checkpoint_sha256", "")),
            dataset_manifest_sha256=str(data.get("dataset_manifest_sha256", "")),
            anchors=int(data["anchors"]),
            heldout_anchors=int(data.get("heldout_anchors", 0)),
            trainable=str(data.get("trainable", "")),
            score=dict(data.get("score", {})),
            prediction=AuditPrediction.from_json(data["prediction"]),
            proposals=dict(data.get("proposals", {})),
            settings=dict(data["settings"]),
            summary={k: ProposalSummary.from_json(v) for k, v in data["summary"].items()},
            runs=tuple(AblationRun.from_json(r) for r in data.get("runs", [])),
            base_success=EpisodeSuccesses.from_json(data["base_success"]) if data.get("base_success") else None,
        )
