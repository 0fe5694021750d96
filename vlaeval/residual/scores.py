"""Per-anchor residual scores as a shardable artifact (job=score), and the merge that checks the
shards before anything uses them.

A shard is two files: `scores-<index>-of-<count>.npz` (anchor positions, mean residual, the
estimator-seed residual matrix) and its sidecar `.json` (what was scored: checkpoint and dataset
digests, estimator and flow settings, the anchor range, the npz's sha256). The sidecar is written
last, so a shard without one is unfinished. Shards of one scoring share a `settings_sha256`; the
merge refuses shards that differ in it, anchors scored twice, and anchors never scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple, TypedDict

import numpy as np

from vlaeval.artifacts import atomic_write_json, atomic_write_npz, sha256_file, sha256_json
from vlaeval.errors import UserInputError, require, require_at_least

SCORES_SCHEMA_VERSION = 1


def shard_range(total: int, index: int, count: int) -> Tuple[int, int]:
    """Anchors [start, stop) of shard `index` of `count`: contiguous, sizes differing by at most one."""
    require_at_least("score.shard_count", count, 1)
    require(0 <= index < count, f"score.shard_index={index} must be in [0, score.shard_count={count})")
    return total * index // count, total * (index + 1) // count


class ScoredEstimator(TypedDict):
    kind: str
    seeds: List[int]
    samples_per_estimator: int


class ScoringSettings(TypedDict):
    """What a shard's scores were made with, as its sidecar records it: a shard merges only with
    shards of the same settings, and job=ablation reuses scores only when they match its own."""

    checkpoint_sha256: str
    dataset_manifest_sha256: str
    total_anchors: int
    estimator: ScoredEstimator
    flow: Dict[str, Any]


def scoring_settings(
    checkpoint_sha256: str, dataset_sha256: str, anchors: int, estimator: Mapping[str, Any], flow: Mapping[str, Any]
) -> ScoringSettings:
    """What decides the scores (the anchor batch size does not, beyond float rounding)."""
    return {
        "checkpoint_sha256": checkpoint_sha256,
        "dataset_manifest_sha256": dataset_sha256,
        "total_anchors": int(anchors),
        "estimator": {
            "kind": str(estimator["kind"]),
            "seeds": [int(s) for s in estimator["seeds"]],
            "samples_per_estimator": int(estimator["samples_per_estimator"]),
        },
        "flow": dict(flow),
    }


def shard_name(index: int, count: int) -> str:
    return f"scores-{index:05d}-of-{count:05d}"


def write_shard(
    folder: Path,
    settings: Mapping[str, Any],
    index: int,
    count: int,
    positions: np.ndarray,
    estimator_residuals: np.ndarray,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """The shard's npz, then its sidecar (the commit marker); returns the sidecar's path."""
    name = shard_name(index, count)
    arrays = {
        "anchor_positions": np.asarray(positions, dtype=np.int64),
        "estimator_residuals": np.asarray(estimator_residuals, dtype=np.float64),
        "mean_residual": np.asarray(estimator_residuals, dtype=np.float64).mean(axis=0),
    }
    npz = atomic_write_npz(Path(folder) / f"{name}.npz", arrays)
    sidecar = {
        "schema_version": SCORES_SCHEMA_VERSION,
        "settings": dict(settings),
        "settings_sha256": sha256_json(dict(settings)),
        "shard": {
            "index": int(index),
            "count": int(count),
            "start": int(positions.min()),
            "stop": int(positions.max()) + 1,
        },
        "anchors": int(positions.size),
        "npz": npz.name,
        "npz_sha256": sha256_file(npz),
        **dict(extra or {}),
    }
    return atomic_write_json(Path(folder) / f"{name}.json", sidecar)


def read_shard(sidecar_path: Path) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    sidecar_path = Path(sidecar_path)
    try:
        sidecar = json.loads(sidecar_path.read_text())
    except (OSError, ValueError) as error:
        raise UserInputError(f"score shard {sidecar_path} is unreadable ({error}); re-run that shard") from None
    require(
        isinstance(sidecar, dict) and sidecar.get("schema_version") == SCORES_SCHEMA_VERSION,
        f"{sidecar_path} is not a score shard of schema {SCORES_SCHEMA_VERSION}; re-score with this version",
    )
    npz = sidecar_path.parent / str(sidecar["npz"])
    require(npz.is_file(), f"score shard {sidecar_path.name} lacks its arrays {npz.name}; re-run that shard")
    require(
        sha256_file(npz) == sidecar["npz_sha256"],
        f"score shard {npz} does not match the digest in its sidecar (modified or truncated); re-run that shard",
    )
    with np.load(npz, allow_pickle=False) as stored:
        arrays = {k: stored[k] for k in stored.files}
    return sidecar, arrays


def find_shards(folder: Path) -> List[Path]:
    """Every shard sidecar under `folder` (a multirun sweep folder holds one per job folder)."""
    return sorted(p for p in Path(folder).rglob("scores-*-of-*.json") if p.is_file())


def _ranges(positions: Sequence[int]) -> str:
    """'a-b, c' for positions, at most three ranges."""
    items = sorted(int(p) for p in positions)
    spans: List[List[int]] = []
    for p in items:
        if spans and p == spans[-1][1] + 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    out = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans]
    return ", ".join(out[:3]) + (f" and {len(out) - 3} more ranges" if len(out) > 3 else "")


def merge_shards(sidecars: Sequence[Path]) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """Check the shards cover every anchor exactly once with the same settings, and join them in
    anchor order: (metadata, {anchor_positions, estimator_residuals, mean_residual})."""
    require(len(sidecars) > 0, "no score shards found (scores-*-of-*.json); run job=score first")
    shards = [(Path(p), *read_shard(Path(p))) for p in sidecars]
    first_path, first, _ = shards[0]
    for path, sidecar, _ in shards[1:]:
        if sidecar["settings_sha256"] != first["settings_sha256"]:
            differ = sorted(k for k in first["settings"] if first["settings"][k] != sidecar["settings"].get(k))
            raise UserInputError(
                f"score shard {path.name} was scored with other {', '.join(differ) or 'settings'} than "
                f"{first_path.name}; re-score it with the same checkpoint, data and estimator"
            )
    total = int(first["settings"]["total_anchors"])
    owner = np.full(total, -1, dtype=np.int64)
    for k, (path, _, arrays) in enumerate(shards):
        positions = arrays["anchor_positions"]
        require(
            positions.size == 0 or (positions.min() >= 0 and positions.max() < total),
            f"score shard {path.name} names anchors outside [0, {total}); re-run that shard",
        )
        twice = positions[owner[positions] >= 0]
        if twice.size:
            other = shards[int(owner[twice[0]])][0].name
            raise UserInputError(
                f"anchors {_ranges(twice.tolist())} are scored twice ({other} and {path.name}); "
                "merge the shards of one sweep (same score.shard_count)"
            )
        owner[positions] = k
    missing = np.flatnonzero(owner < 0)
    if missing.size:
        count = int(first["shard"]["count"])
        starts = np.array([shard_range(total, i, count)[0] for i in range(count)])
        wanted = sorted({int(i) for i in np.searchsorted(starts, missing, side="right") - 1})  # the shard holding each
        hint = ", ".join(f"score.shard_index={i}" for i in wanted[:5]) + (" ..." if len(wanted) > 5 else "")
        raise UserInputError(
            f"anchors {_ranges(missing.tolist())} have no score (of {total}); run the missing shard(s) "
            f"with score.shard_count={count}: {hint}"
        )
    order = np.concatenate([arrays["anchor_positions"] for _, _, arrays in shards])
    sort = np.argsort(order, kind="stable")
    merged = {
        "anchor_positions": order[sort],
        "estimator_residuals": np.concatenate([a["estimator_residuals"] for _, _, a in shards], axis=1)[:, sort],
    }
    merged["mean_residual"] = merged["estimator_residuals"].mean(axis=0)
    metadata = {
        "schema_version": SCORES_SCHEMA_VERSION,
        "settings": first["settings"],
        "settings_sha256": first["settings_sha256"],
        "shards": [
            {"file": path.name, **sidecar["shard"], "npz_sha256": sidecar["npz_sha256"]} for path, sidecar, _ in shards
        ],
    }
    return metadata, merged


def read_scores(path: Path) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """A merged scores file (its sidecar `.json`) or a folder of shards, checked and joined."""
    path = Path(path)
    if path.is_dir():
        return merge_shards(find_shards(path))
    require(path.is_file(), f"scores {path} do not exist; give job=score's scores.json or its shard folder")
    return merge_shards([path])
