"""The per-anchor gradient artifact: building it, caching it, and reading it back as untrusted input."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
from omegaconf import DictConfig

from vlaeval.artifacts import atomic_write_json, sha256_file, sha256_json
from vlaeval.config import to_plain
from vlaeval.data.anchors import TRACE_FIELDS, draw
from vlaeval.errors import UserInputError, require
from vlaeval.residual.gradients import gradient_measurements, split_half_reliability

log = logging.getLogger(__name__)

ARTIFACT_SCHEMA_VERSION = 1
REQUIRED_ANCHOR_FIELDS = ("gradient_rms", "mean_gradient_loss", "sampling_trace")


def build_gradient_artifact(
    gradients: DictConfig, flow: DictConfig, device: str, data: Any, handle: Any
) -> Dict[str, Any]:
    """The artifact for the `gradients` and `flow` config sections, on `device`."""
    anchor_index, traces = draw(data.anchors, int(gradients.num_anchors), int(gradients.epoch))
    require(
        anchor_index.size == int(gradients.num_anchors),
        f"gradients.num_anchors={gradients.num_anchors} exceeds the dataset's {len(data.anchors)} anchors",
    )
    seeds = [int(s) for s in gradients.seeds]
    started = time.perf_counter()
    measured = gradient_measurements(
        handle.model,
        data.anchors,
        anchor_index,
        data.instruction_table,
        seeds,
        flow,
        trainable=str(gradients.trainable),
        batch_size=int(gradients.batch_size),
        device=str(device),
    )
    elapsed = time.perf_counter() - started
    p = measured.parameter_count
    per_seed_rms = np.sqrt(measured.sq_norms / p)
    gradient_rms = measured.rms()
    mean_loss = measured.losses.mean(axis=0)
    artifact = {
        "schema_version": ARTIFACT_SCHEMA_VERSION,
        "checkpoint_sha256": handle.sha256,
        "manifest_sha256": data.demonstrations.manifest_sha256,
        "dataset_name": data.demonstrations.name,
        "trainable": str(gradients.trainable),
        "parameter_count": p,
        "gradient_rms_definition": "sqrt(mean over seeds and trainable parameter entries of the squared per-sample "
        "gradient of the flow-matching loss)",
        "seed_separation": {"gradient_seeds": seeds},
        "gradient_runtime": {
            "elapsed_seconds": elapsed,
            "pairs": int(measured.sq_norms.size),
            "method": "batched per-layer ghost norms (exact)",
            "device": str(device),
        },
        "reliability": split_half_reliability(measured.sq_norms, p),
        "anchors": [
            {
                "gradient_rms": float(gradient_rms[i]),
                "mean_gradient_loss": float(mean_loss[i]),
                "sampling_trace": traces[i],
                "per_seed": {"gradient_rms": per_seed_rms[:, i].tolist(), "loss": measured.losses[:, i].tolist()},
            }
            for i in range(anchor_index.size)
        ],
    }
    return {**artifact, "content_sha256": content_digest(artifact)}


def content_digest(artifact: Dict[str, Any]) -> str:
    """sha256 of the artifact's canonical JSON without its own digest field."""
    return sha256_json({k: v for k, v in artifact.items() if k != "content_sha256"})


def cached_gradient_artifact(
    gradients: DictConfig, flow: DictConfig, device: str, cache_dir: str, data: Any, handle: Any
) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(metadata, anchors) of the artifact for this checkpoint and gradients config, as
    load_gradient_artifact reads them; built and cached on first use."""
    key = sha256_json(
        {
            "checkpoint": handle.sha256,
            "gradients": to_plain(gradients),
            "flow": to_plain(flow),
            "schema": ARTIFACT_SCHEMA_VERSION,
        }
    )
    path = Path(cache_dir) / "gradients" / f"{key}.json"
    if path.is_file():
        try:
            return load_gradient_artifact(path)
        except UserInputError as error:  # a damaged cache entry is reported and rebuilt, never trusted
            log.warning("cached gradient artifact rejected, rebuilding it: %s", error)
    atomic_write_json(path, build_gradient_artifact(gradients, flow, device, data, handle))
    return load_gradient_artifact(path)


def load_gradient_artifact(path: Path) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(metadata, anchors) of a gradient artifact, each check a one-line error."""
    require(
        path.is_file(),
        f"gradient artifact {path} does not exist; run job=gradients or leave audit.gradient_artifact=null",
    )
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserInputError(
            f"gradient artifact {path} is not valid JSON ({error.__class__.__name__}: {error}); "
            "it is truncated or corrupt: rebuild it with job=gradients"
        ) from None
    require(isinstance(payload, dict), f"gradient artifact {path} is not a JSON object")
    # Written by vlaeval, an artifact carries its own digest: any edit or bit flip is refused.
    require(
        "content_sha256" not in payload or payload["content_sha256"] == content_digest(payload),
        f"gradient artifact {path} does not match its content_sha256 (modified or corrupted after it was "
        "written); rebuild it with job=gradients",
    )
    anchors = payload.get("anchors")
    require(
        isinstance(anchors, list) and len(anchors) >= 4,
        f"gradient artifact {path} must contain at least four anchors (found "
        f"{len(anchors) if isinstance(anchors, list) else 'none'})",
    )
    for index, anchor in enumerate(anchors):
        missing = [f for f in REQUIRED_ANCHOR_FIELDS if not isinstance(anchor, dict) or f not in anchor]
        require(not missing, f"gradient artifact {path}: anchor {index} lacks {', '.join(missing)}")
        rms, loss = anchor["gradient_rms"], anchor["mean_gradient_loss"]
        ok = isinstance(rms, (int, float)) and math.isfinite(rms) and rms > 0
        require(ok, f"gradient artifact {path}: anchor {index} has gradient_rms={rms!r}; it must be finite and > 0")
        require(
            isinstance(loss, (int, float)) and math.isfinite(loss),
            f"gradient artifact {path}: anchor {index} has mean_gradient_loss={loss!r}; it must be finite",
        )
        trace_missing = [f for f in TRACE_FIELDS if f not in (anchor["sampling_trace"] or {})]
        require(
            not trace_missing,
            f"gradient artifact {path}: anchor {index}'s sampling_trace lacks {', '.join(trace_missing)}",
        )
    metadata = {
        "path": str(path.resolve()),
        "sha256": sha256_file(path),
        "checkpoint_sha256": payload.get("checkpoint_sha256"),
        "manifest_sha256": payload.get("manifest_sha256"),
        "gradient_runtime": payload.get("gradient_runtime"),
        "gradient_seeds": (payload.get("seed_separation") or {}).get("gradient_seeds") or [],
        "reliability": payload.get("reliability"),
        "trainable": payload.get("trainable"),
    }
    return metadata, anchors
