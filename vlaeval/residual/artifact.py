"""The per-anchor gradient artifact: building it, caching it, and reading it back as untrusted input."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from vlaeval.artifacts import atomic_write_json, sha256_file, sha256_json
from vlaeval.config import FlowConfig, GradientsConfig, to_plain
from vlaeval.data.anchors import draw
from vlaeval.errors import UserInputError, first_line, require, require_file
from vlaeval.policy.builtin import PolicyData, PolicyHandle
from vlaeval.residual.gradients import gradient_measurements, split_half_reliability
from vlaeval.store import get_or_build

log = logging.getLogger(__name__)

ARTIFACT_SCHEMA_VERSION = 2  # 2: anchors named by (episode, frame) and the dataset's content digest
ARTIFACT_FILE = "gradient_artifact.json"  # a cached artifact in its store entry
REQUIRED_ANCHOR_FIELDS = ("episode", "frame", "gradient_rms", "mean_gradient_loss")
SCHEMA_DOC = "docs/gradient_artifact.schema.json"

# The artifact's JSON Schema (written to docs/gradient_artifact.schema.json; a test keeps the two
# equal). What vlaeval requires is what a user's trainer must write (docs/gradient_artifact.md).
ARTIFACT_JSON_SCHEMA: Dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://github.com/vlaeval/vlaeval/docs/gradient_artifact.schema.json",
    "title": "vlaeval gradient artifact",
    "description": "Per-anchor gradient RMS of a flow-matching policy's per-sample training loss, for the residual "
    "audit (python main.py job=residual_audit audit.gradient_artifact=<file>).",
    "type": "object",
    "required": ["schema_version", "dataset_sha256", "anchors"],
    "properties": {
        "schema_version": {"const": ARTIFACT_SCHEMA_VERSION},
        "dataset_sha256": {
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "vlaeval's content digest of the dataset the anchors index (data=lerobot: "
            "vlaeval.data.lerobot.dataset_sha256(root)); the audit refuses another dataset.",
        },
        "checkpoint_sha256": {
            "type": ["string", "null"],
            "pattern": "^[0-9a-f]{64}$",
            "description": "sha256 of the checkpoint file the gradients were taken on; checked when given.",
        },
        "gradient_seeds": {
            "type": "array",
            "items": {"type": "integer"},
            "uniqueItems": True,
            "description": "Seeds of the (flow time, noise) draws; the audit's estimator seeds must differ.",
        },
        "trainable": {
            "type": "string",
            "description": "Which parameters the norms cover: the policy's subset (action_head, all), then ':' and "
            "the name patterns that narrowed it, if any (e.g. all:expert.*).",
        },
        "trainable_parameters": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The names (named_parameters) of every parameter the norms cover (optional).",
        },
        "parameter_count": {"type": "integer", "minimum": 1},
        "reliability": {
            "type": "object",
            "properties": {"spearman_brown": {"type": ["number", "null"]}},
            "description": "Split-half reliability of gradient RMS over the seeds (optional).",
        },
        "content_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "anchors": {
            "type": "array",
            "minItems": 4,
            "items": {
                "type": "object",
                "required": list(REQUIRED_ANCHOR_FIELDS),
                "properties": {
                    "episode": {"type": "integer", "minimum": 0, "description": "The dataset's episode_index."},
                    "frame": {"type": "integer", "minimum": 0, "description": "frame_index within the episode."},
                    "gradient_rms": {
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "description": "sqrt(mean over seeds and trainable parameter entries of the squared "
                        "per-sample gradient of the flow-matching loss).",
                    },
                    "mean_gradient_loss": {"type": "number", "description": "The loss on the same draws."},
                    "task": {"type": "string", "description": "The frame's task instruction; checked when given."},
                    "per_seed": {
                        "type": "object",
                        "properties": {
                            "gradient_rms": {"type": "array", "items": {"type": "number"}},
                            "loss": {"type": "array", "items": {"type": "number"}},
                            "flow_time": {
                                "type": "array",
                                "items": {"type": "number", "minimum": 0, "maximum": 1},
                                "description": "Each draw's flow time t: enables the audit's decomposition of "
                                "the gradient's second moment over anchor, flow time and noise.",
                            },
                        },
                    },
                    "sampling_trace": {"type": "object"},
                },
            },
        },
    },
}


def build_gradient_artifact(
    gradients: GradientsConfig, flow: FlowConfig, device: str, data: PolicyData, handle: PolicyHandle
) -> Dict[str, Any]:
    """The artifact for the `gradients` and `flow` config sections, on `device`."""
    anchor_index, traces = draw(data.anchors, int(gradients.num_anchors), int(gradients.epoch))
    demos, anchors = data.demonstrations, data.anchors
    require(
        anchor_index.size == int(gradients.num_anchors),
        f"gradients.num_anchors={gradients.num_anchors} exceeds the dataset's {len(data.anchors)} anchors",
    )
    seeds = [int(s) for s in gradients.seeds]
    started = time.perf_counter()
    measured = gradient_measurements(
        data.bind(handle.model, flow, str(device)),
        data.anchors,
        anchor_index,
        seeds,
        trainable=gradients.selection(),
        batch_size=int(gradients.batch_size),
        method=str(gradients.method),
        verify_pairs=int(gradients.verify_pairs),
    )
    elapsed = time.perf_counter() - started
    p = measured.parameter_count
    per_seed_rms = np.sqrt(measured.sq_norms / p)
    gradient_rms = measured.rms()
    mean_loss = measured.losses.mean(axis=0)
    assert measured.flow_times is not None  # gradient_measurements always records them
    flow_times = measured.flow_times
    artifact = {
        "schema_version": ARTIFACT_SCHEMA_VERSION,
        "dataset_sha256": demos.manifest_sha256,
        "dataset_name": demos.name,
        "checkpoint_sha256": handle.sha256,
        "trainable": gradients.selection(),
        "trainable_parameters": list(measured.parameter_names),
        "parameter_count": p,
        "gradient_rms_definition": "sqrt(mean over seeds and trainable parameter entries of the squared per-sample "
        "gradient of the flow-matching loss)",
        "gradient_seeds": seeds,
        "gradient_runtime": {
            "elapsed_seconds": elapsed,
            "pairs": int(measured.sq_norms.size),
            "method": str(gradients.method),
            "device": str(device),
        },
        "layer_methods": measured.layer_methods,
        "verification_against_loop": measured.verification.to_json() if measured.verification else {},
        "reliability": split_half_reliability(measured.sq_norms, p).as_dict(),
        "anchors": [
            {
                "episode": int(demos.episode_ids()[anchors.trajectory_index[a]]),
                "frame": int(anchors.anchor_index[a]),
                "task": demos.instructions[int(anchors.task_index[a])],
                "gradient_rms": float(gradient_rms[i]),
                "mean_gradient_loss": float(mean_loss[i]),
                "sampling_trace": traces[i],
                "per_seed": {
                    "gradient_rms": per_seed_rms[:, i].tolist(),
                    "loss": measured.losses[:, i].tolist(),
                    "flow_time": flow_times[:, i].tolist(),
                },
            }
            for i, a in enumerate(anchor_index.tolist())
        ],
    }
    return {**artifact, "content_sha256": content_digest(artifact)}


def content_digest(artifact: Dict[str, Any]) -> str:
    """sha256 of the artifact's canonical JSON without its own digest field."""
    return sha256_json({k: v for k, v in artifact.items() if k != "content_sha256"})


def gradient_artifact_key(
    checkpoint_sha256: str, dataset_sha256: str, gradients: GradientsConfig, flow: FlowConfig
) -> str:
    """The content-store key of a built artifact: every digest its reader compares (the checkpoint's,
    check_checkpoint; the dataset's, recover_anchors) and the settings that decide its numbers. Two
    datasets can train a policy to the same weights (a state policy ignores a camera): the dataset's
    digest keeps their artifacts apart."""
    return sha256_json(
        {
            "checkpoint": checkpoint_sha256,
            "dataset": dataset_sha256,
            "gradients": to_plain(gradients),
            "flow": to_plain(flow),
            "schema": ARTIFACT_SCHEMA_VERSION,
            "per_seed_flow_time": True,  # artifacts cached before it lack per_seed.flow_time: built anew
        }
    )


def cached_gradient_artifact(
    gradients: GradientsConfig, flow: FlowConfig, device: str, cache_dir: str, data: PolicyData, handle: PolicyHandle
) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(metadata, anchors) of the artifact for this checkpoint, data and gradients config, as
    load_gradient_artifact reads them; built and cached on first use."""
    key = gradient_artifact_key(handle.sha256, data.demonstrations.manifest_sha256, gradients, flow)

    def build(folder: Path) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
        atomic_write_json(folder / ARTIFACT_FILE, build_gradient_artifact(gradients, flow, device, data, handle))
        return load_gradient_artifact(folder / ARTIFACT_FILE)

    artifact, _ = get_or_build(
        cache_dir,
        "gradients",
        key,
        [ARTIFACT_FILE],
        read=lambda folder: load_gradient_artifact(folder / ARTIFACT_FILE),
        build=build,
    )
    return artifact


def load_gradient_artifact(path: Path) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """(metadata, anchors) of a gradient artifact, each check a one-line error."""
    require_file(path, f"gradient artifact {path}", "run job=gradients or leave audit.gradient_artifact=null")
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
    # One source for the structure: the JSON Schema (docs/gradient_artifact.schema.json). JSON
    # Schema cannot say "finite" (Python's JSON reads NaN and Infinity), so that is checked after it.
    check_schema(payload, path)
    for index, anchor in enumerate(payload["anchors"]):
        for name in ("gradient_rms", "mean_gradient_loss"):
            require(
                math.isfinite(anchor[name]),
                f"gradient artifact {path}: anchor {index} has {name}={anchor[name]!r}; it must be finite"
                + (" and > 0" if name == "gradient_rms" else ""),
            )
    anchors = payload["anchors"]
    metadata = {
        "path": str(path.resolve()),
        "sha256": sha256_file(path),
        "checkpoint_sha256": payload.get("checkpoint_sha256"),
        "dataset_sha256": payload["dataset_sha256"],
        "gradient_runtime": payload.get("gradient_runtime"),
        "layer_methods": payload.get("layer_methods"),
        "gradient_seeds": payload.get("gradient_seeds") or [],
        "reliability": payload.get("reliability"),
        "trainable": payload.get("trainable"),
        "trainable_parameters": payload.get("trainable_parameters"),
    }
    return metadata, anchors


def check_schema(payload: Dict[str, Any], path: Path) -> None:
    """The artifact against its JSON Schema: the first violation, in one line saying where and what
    to do (the common ones in words: the version, too few anchors, a missing or out-of-range field)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(ARTIFACT_JSON_SCHEMA)
    error = next(iter(sorted(validator.iter_errors(payload), key=lambda e: list(e.absolute_path))), None)
    if error is not None:
        raise UserInputError(schema_message(error, path))


def schema_message(error: Any, path: Path) -> str:
    where = list(error.absolute_path)
    kind = error.validator
    if where == ["schema_version"]:
        return (
            f"gradient artifact {path} has schema_version {error.instance!r}; this vlaeval reads version "
            f"{ARTIFACT_SCHEMA_VERSION} ({SCHEMA_DOC}): rebuild it with job=gradients or update your writer"
        )
    if where == ["anchors"] and kind == "minItems":
        return f"gradient artifact {path} must contain at least four anchors (found {len(error.instance)})"
    if len(where) == 2 and where[0] == "anchors" and kind == "required":
        missing = [f for f in error.validator_value if f not in error.instance]
        return f"gradient artifact {path}: anchor {where[1]} lacks {', '.join(missing)}"
    if len(where) == 3 and where[0] == "anchors" and where[2] == "gradient_rms":
        return (
            f"gradient artifact {path}: anchor {where[1]} has gradient_rms={error.instance!r}; "
            "it must be finite and > 0"
        )
    located = "/".join(str(p) for p in where) or "(top level)"
    return f"gradient artifact {path} does not follow {SCHEMA_DOC} at {located}: {first_line(error.message, 160)}"


def recover_anchors(
    demos: Any, anchors: Any, artifact_anchors: List[Dict[str, Any]], dataset_sha256: str, path: str
) -> np.ndarray:
    """The dataset positions of the artifact's anchors, named by (episode, frame): the dataset must
    be the one the artifact names, and every anchor must exist there and agree with what the
    artifact says about it (task, sampling trace); the first mismatch is one line."""
    require(
        dataset_sha256 == demos.manifest_sha256,
        f"gradient artifact {path} indexes dataset {dataset_sha256[:12]}..., but the data here is "
        f"{demos.manifest_sha256[:12]}... ({demos.name}); audit it with the data it was made from",
    )
    position = {int(e): i for i, e in enumerate(demos.episode_ids())}
    out = np.empty(len(artifact_anchors), dtype=np.int64)
    for i, anchor in enumerate(artifact_anchors):
        episode, frame = int(anchor["episode"]), int(anchor["frame"])
        e = position.get(episode)
        where = f"gradient artifact {path}: anchor {i} (episode {episode}, frame {frame})"
        require(e is not None, f"{where}: the dataset has no episode {episode}")
        length = int(demos.episode_length[e])
        require(frame < length, f"{where}: episode {episode} has {length} frames")
        a = int(demos.episode_start[e]) + frame  # every frame is an anchor, in dataset order
        task = demos.instructions[int(anchors.task_index[a])]
        require(
            anchor.get("task") in (None, task), f"{where}: the artifact says task {anchor.get('task')!r}, here {task!r}"
        )
        trace = anchor.get("sampling_trace") or {}
        for key, value in (("trajectory_id", demos.trajectory_id(e)), ("base_index", int(anchors.base_index[a]))):
            require(
                trace.get(key, value) == value,
                f"{where}: sampling_trace {key} is {trace.get(key)!r} in the artifact but {value!r} here",
            )
        out[i] = a
    duplicated = len(out) - np.unique(out).size
    require(
        duplicated == 0, f"gradient artifact {path} lists {duplicated} anchor(s) twice; list each (episode, frame) once"
    )
    return out


def per_seed_flow_times(anchors: List[Dict[str, Any]]) -> np.ndarray | None:
    """Each draw's flow time, shape (seeds, anchors), when every anchor carries them alongside its
    per-seed gradient RMS (vlaeval's own artifacts do); else None."""
    try:
        t = np.array([a["per_seed"]["flow_time"] for a in anchors], dtype=np.float64).T
        rms = np.array([a["per_seed"]["gradient_rms"] for a in anchors], dtype=np.float64).T
    except (KeyError, TypeError, ValueError):
        return None
    ok = t.ndim == 2 and t.shape == rms.shape and bool(np.all((t >= 0) & (t <= 1)))
    return t if ok else None


def per_seed_values(anchors: List[Dict[str, Any]]) -> Tuple[np.ndarray | None, np.ndarray | None]:
    """(gradient RMS, loss) per gradient seed and anchor, shape (seeds, anchors), when every anchor
    of the artifact carries them (vlaeval's own artifacts do); else (None, None)."""
    try:
        rms = np.array([a["per_seed"]["gradient_rms"] for a in anchors], dtype=np.float64).T
        loss = np.array([a["per_seed"]["loss"] for a in anchors], dtype=np.float64).T
    except (KeyError, TypeError, ValueError):
        return None, None
    ok = rms.ndim == 2 and rms.shape == loss.shape and np.all(np.isfinite(rms)) and np.all(np.isfinite(loss))
    return (rms, loss) if ok else (None, None)
