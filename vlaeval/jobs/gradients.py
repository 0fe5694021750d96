"""job=gradients: the per-anchor gradient artifact the residual audit checks its scores against.

Draw the audit's anchors (the sampler's first `num_anchors` of epoch `gradients.epoch`); for each
anchor and gradient seed, draw flow time and noise from the training distribution and take the
exact per-sample gradient norm of the flow-matching loss over the trainable parameters (one
batched backward pass, no per-sample loop); write gradient RMS, mean loss, per-seed values,
sampling traces and the split-half reliability of the gradient RMS itself; log to MLflow.
"""

from __future__ import annotations

import time
from typing import Any, Dict

import numpy as np
from omegaconf import DictConfig

from vlaeval import console
from vlaeval.config import require
from vlaeval.data.anchors import draw
from vlaeval.provenance import code_version
from vlaeval.jobs.common import load_data_and_policy, now_ms, publish
from vlaeval.residual.gradients import gradient_measurements, split_half_reliability

JOB = "gradients"
ARTIFACT_SCHEMA_VERSION = 1
ARTIFACT_FILE = "gradient_artifact.json"


def validate_gradients(cfg: DictConfig) -> None:
    g = cfg.gradients
    seeds = list(g.seeds)
    require(len(seeds) >= 2, f"gradients.seeds has {len(seeds)} seed(s); give at least 2 (the default is 512), "
                             "e.g. gradients.seeds=[5000,5001,5002,5003]")
    duplicated = sorted({s for s in seeds if seeds.count(s) > 1})
    require(not duplicated, f"gradients.seeds repeats {duplicated}; each gradient seed must be unique")
    require(g.num_anchors >= 4, f"gradients.num_anchors={g.num_anchors} must be >= 4 (the audit needs at least four)")
    require(g.trainable in ("action_head", "all"), f"gradients.trainable={g.trainable!r} must be 'action_head' or 'all'")
    require(g.batch_size >= 1, f"gradients.batch_size={g.batch_size} must be >= 1")
    require(str(cfg.device) == "cpu" or str(cfg.device).startswith("cuda"), f"device={cfg.device!r} must be cpu or cuda[:N]")


def run(cfg: DictConfig) -> Dict[str, Any]:
    started_ms = now_ms()
    validate_gradients(cfg)
    data, handle = load_data_and_policy(cfg)
    anchor_index, traces = draw(data.anchors, int(cfg.gradients.num_anchors), int(cfg.gradients.epoch))
    require(anchor_index.size == int(cfg.gradients.num_anchors),
            f"gradients.num_anchors={cfg.gradients.num_anchors} exceeds the dataset's {len(data.anchors)} anchors")
    seeds = [int(s) for s in cfg.gradients.seeds]
    started = time.perf_counter()
    measured = gradient_measurements(handle.model, data.anchors, anchor_index, data.instruction_table, seeds, cfg.flow,
                                     trainable=str(cfg.gradients.trainable), batch_size=int(cfg.gradients.batch_size),
                                     device=str(cfg.device))
    elapsed = time.perf_counter() - started
    p = measured["parameter_count"]
    per_seed_rms = np.sqrt(measured["sq_norms"] / p)
    gradient_rms = np.sqrt(measured["sq_norms"].mean(axis=0) / p)
    mean_loss = measured["losses"].mean(axis=0)
    reliability = split_half_reliability(measured["sq_norms"], p)
    artifact = {
        "schema_version": ARTIFACT_SCHEMA_VERSION,
        "checkpoint_sha256": handle.sha256,
        "manifest_sha256": data.demonstrations.manifest_sha256,
        "dataset_name": data.demonstrations.name,
        "trainable": str(cfg.gradients.trainable),
        "parameter_count": p,
        "gradient_rms_definition": "sqrt(mean over seeds and trainable parameter entries of the squared per-sample "
                                   "gradient of the flow-matching loss)",
        "seed_separation": {"gradient_seeds": seeds},
        "gradient_runtime": {"elapsed_seconds": elapsed, "pairs": int(measured["sq_norms"].size),
                             "method": "batched per-layer ghost norms (exact)", "device": str(cfg.device)},
        "reliability": reliability,
        "anchors": [
            {"gradient_rms": float(gradient_rms[i]), "mean_gradient_loss": float(mean_loss[i]),
             "sampling_trace": traces[i],
             "per_seed": {"gradient_rms": per_seed_rms[:, i].tolist(), "loss": measured["losses"][:, i].tolist()}}
            for i in range(anchor_index.size)],
    }
    metrics = {"gradients.split_half_spearman": reliability["split_half_spearman"],
               "gradients.spearman_brown": reliability["spearman_brown"],
               "gradients.mean_gradient_rms": float(gradient_rms.mean()),
               "gradients.anchors": float(anchor_index.size), "gradients.seeds": float(len(seeds)),
               "timing.gradient_seconds": elapsed}
    result = publish(cfg, JOB, {"artifact": artifact}, started_ms=started_ms, run_name=f"gradients-{handle.sha256[:12]}",
                     metrics=metrics, checks={}, tags={"checkpoint.sha256": handle.sha256}, code=code_version(),
                     artifact_file=ARTIFACT_FILE)
    console.show(f"gradient artifact: {anchor_index.size} anchors x {len(seeds)} seeds over {p:,} "
                 f"{cfg.gradients.trainable} parameters in {elapsed:.2f} s; split-half reliability of gradient RMS "
                 f"{reliability['split_half_spearman']:.3f} (Spearman-Brown {reliability['spearman_brown']:.3f})")
    console.show(f"artifact: {result['artifact_path']}")
    return result
