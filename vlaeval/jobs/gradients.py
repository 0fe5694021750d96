"""job=gradients: the per-anchor gradient artifact the residual audit checks its scores against.

Draw the audit's anchors (the sampler's first `num_anchors` of epoch `gradients.epoch`); for each
anchor and gradient seed, draw flow time and noise from the training distribution and take the
exact per-sample gradient norm of the flow-matching loss over the trainable parameters (one
batched backward pass, no per-sample loop); write gradient RMS, mean loss, per-seed values,
sampling traces and the split-half reliability of the gradient RMS itself; log to MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import numpy as np

from vlaeval import console
from vlaeval.config import GradientsConfig, PolicyJobSettings
from vlaeval.errors import require, require_at_least
from vlaeval.policy.checkpoint import validate_checkpoint_config
from vlaeval.policy.flow import FlowConvention
from vlaeval.residual.artifact import build_gradient_artifact
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

JOB = "gradients"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()
ARTIFACT_FILE = "gradient_artifact.json"


def validate_gradients(cfg: GradientsJobConfig) -> None:
    g = cfg.gradients
    seeds = list(g.seeds)
    require(
        len(seeds) >= 2,
        f"gradients.seeds has {len(seeds)} seed(s); give at least 2 (the default is 512), "
        "e.g. gradients.seeds=[5000,5001,5002,5003]",
    )
    duplicated = sorted({s for s in seeds if seeds.count(s) > 1})
    require(not duplicated, f"gradients.seeds repeats {duplicated}; each gradient seed must be unique")
    require(g.num_anchors >= 4, f"gradients.num_anchors={g.num_anchors} must be >= 4 (the audit needs at least four)")
    require_at_least("gradients.batch_size", g.batch_size, 1)
    require(g.verify_pairs >= 0, f"gradients.verify_pairs={g.verify_pairs} must be >= 0")
    FlowConvention.of(cfg.flow).validate()
    validate_checkpoint_config(cfg.checkpoint)  # device=: checked for every job (vlaeval.devices)


@dataclass(frozen=True, kw_only=True)
class GradientsJobConfig(PolicyJobSettings):
    """The sections job=gradients reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    gradients: GradientsConfig


@dataclass(frozen=True)
class GradientsResult(SavedAsJson):
    """job=gradients' result: the gradient artifact (vlaeval/residual/artifact.py; also written on its
    own as gradient_artifact.json, which audit.gradient_artifact reads)."""

    artifact: Dict[str, Any]


def run(cfg: GradientsJobConfig) -> JobResult[GradientsResult]:
    started_ms = now_ms()
    validate_gradients(cfg)
    data, handle = load_data_and_policy(cfg)
    artifact = build_gradient_artifact(cfg.gradients, cfg.flow, str(cfg.device), data, handle)
    reliability, runtime = artifact["reliability"], artifact["gradient_runtime"]
    rms = np.array([a["gradient_rms"] for a in artifact["anchors"]])
    metrics = {
        "gradients.split_half_spearman": reliability["split_half_spearman"],
        "gradients.spearman_brown": reliability["spearman_brown"],
        "gradients.mean_gradient_rms": float(rms.mean()),
        "gradients.anchors": float(rms.size),
        "gradients.seeds": float(len(cfg.gradients.seeds)),
        "timing.gradient_seconds": runtime["elapsed_seconds"],
    }
    result = GradientsResult(artifact)
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"gradients-{handle.sha256[:12]}",
            metrics=metrics,
            checks={},
            tags=lineage_tags(handle, data),
            artifact_file=ARTIFACT_FILE,
        ),
    )
    console.show(
        f"gradient artifact: {rms.size} anchors x {len(cfg.gradients.seeds)} seeds over "
        f"{artifact['parameter_count']:,} parameters ({cfg.gradients.selection()}, {len(artifact['trainable_parameters'])} tensors) in {runtime['elapsed_seconds']:.2f} s; "
        f"split-half reliability of gradient RMS {reliability['split_half_spearman']:.3f} "
        f"(Spearman-Brown {reliability['spearman_brown']:.3f})"
    )
    console.show(f"artifact: {output_dir(cfg) / ARTIFACT_FILE}")
    return JobResult(result, published)
