"""job=score: the residual score of every training anchor, as a shardable artifact.

Check the settings; load the data and the checkpoint; score this shard's contiguous range of
anchors (score.shard_index of score.shard_count; the draws of an anchor do not depend on the
shard, so the shards of a multirun equal one whole run) with the configured estimator; write the
shard (arrays, then the sidecar that names checkpoint, dataset and estimator). With score.merge,
instead: find the shards under that folder, check that they cover every anchor exactly once with
the same checkpoint, dataset and estimator settings, and write them joined as one scores file
(what `ablation.scores` reads).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from vlaeval import console
from vlaeval.config import EstimatorConfig, PolicyJobSettings, ScoreConfig, to_plain
from vlaeval.errors import require, require_at_least
from vlaeval.memory import PeakMemory
from vlaeval.residual.estimators import estimator_arguments, score_anchors, validate_estimator_config
from vlaeval.residual.scores import find_shards, merge_shards, scoring_settings, shard_range, write_shard
from vlaeval.runs import (
    JobResult,
    RunReport,
    SavedAsJson,
    lineage_tags,
    load_data,
    load_policy,
    now_ms,
    output_dir,
    publish,
)

JOB = "score"
COMPONENTS = ("data", "model")


@dataclass(frozen=True, kw_only=True)
class ScoreJobConfig(PolicyJobSettings):
    """The sections job=score reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    score: ScoreConfig
    estimator: EstimatorConfig


@dataclass(frozen=True)
class ScoreResult(SavedAsJson):
    """job=score's result: the scores file, what decided the scores, and either the shard of anchors
    scored with its runtime or the shards a merge joined (score.merge)."""

    scores: str
    settings: Mapping[str, object]  # residual.scores.ScoringSettings, as the sidecar records it
    shard: Optional[Dict[str, int]] = None
    runtime: Optional[Dict[str, Any]] = None
    merged_from: Optional[List[Dict[str, Any]]] = None


def run(cfg: ScoreJobConfig) -> JobResult[ScoreResult]:
    started_ms = now_ms()
    s = cfg.score
    if s.merge is not None:
        return merge(cfg, started_ms)
    validate_estimator_config(cfg.estimator)
    require_at_least("score.shard_count", s.shard_count, 1)
    require(
        0 <= s.shard_index < s.shard_count,
        f"score.shard_index={s.shard_index} must be in [0, score.shard_count={s.shard_count})",
    )
    data = load_data(cfg)
    handle = load_policy(cfg, data)
    total = len(data.anchors)
    start, stop = shard_range(total, int(s.shard_index), int(s.shard_count))
    positions = np.arange(start, stop)
    started = time.perf_counter()
    with PeakMemory(str(cfg.device)) as peak, console.unit_progress("scoring", positions.size) as update:
        scores = score_anchors(
            data.bind(handle.model, cfg.flow, str(cfg.device)),
            data.anchors,
            positions,
            **estimator_arguments(cfg.estimator),
            progress=lambda done, _: update(completed=done),
            first_row=start,
        )
    elapsed = time.perf_counter() - started
    settings = scoring_settings(
        handle.sha256,
        data.demonstrations.manifest_sha256,
        total,
        to_plain(cfg.estimator),
        to_plain(cfg.flow),
    )
    runtime = {
        "seconds": elapsed,
        "anchors_per_second": positions.size / elapsed if elapsed > 0 else None,
        "device": str(cfg.device),
        **peak.report(),
    }
    sidecar = write_shard(
        output_dir(cfg),
        settings,
        int(s.shard_index),
        int(s.shard_count),
        positions,
        scores.estimator_residuals,
        {"runtime": runtime},
    )
    result = ScoreResult(
        scores=str(sidecar),
        settings=settings,
        shard={"index": int(s.shard_index), "count": int(s.shard_count), "start": start, "stop": stop},
        runtime=runtime,
    )
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"score {s.shard_index}/{s.shard_count} {handle.sha256[:8]}",
            metrics={
                "score.anchors": float(positions.size),
                "timing.anchors_per_second": runtime["anchors_per_second"],
            },
            checks={},
            tags=lineage_tags(handle, data),
            artifacts=[(sidecar, "scores"), (sidecar.with_suffix(".npz"), "scores")],
        ),
    )
    console.show(f"scored anchors {start}..{stop - 1} of {total} ({positions.size / elapsed:.0f} anchors/s): {sidecar}")
    return JobResult(result, published)


def merge(cfg: ScoreJobConfig, started_ms: int) -> JobResult[ScoreResult]:
    folder = Path(str(cfg.score.merge))
    require(folder.is_dir(), f"score.merge={folder} is not a folder; give the folder holding the shards (the sweep's)")
    metadata, arrays = merge_shards(find_shards(folder))
    total = int(metadata["settings"]["total_anchors"])
    sidecar = write_shard(
        output_dir(cfg),
        metadata["settings"],
        0,
        1,
        arrays["anchor_positions"],
        arrays["estimator_residuals"],
        {"merged_from": metadata["shards"]},
    )
    result = ScoreResult(scores=str(sidecar), settings=metadata["settings"], merged_from=metadata["shards"])
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"score merge {len(metadata['shards'])} shards",
            metrics={"score.anchors": float(total), "score.shards": float(len(metadata["shards"]))},
            checks={"every_anchor_scored_once": True},
            tags={"checkpoint.sha256": metadata["settings"]["checkpoint_sha256"]},
            artifacts=[(sidecar, "scores"), (sidecar.with_suffix(".npz"), "scores")],
        ),
    )
    console.show(f"merged {len(metadata['shards'])} shards: every one of {total} anchors scored once: {sidecar}")
    return JobResult(result, published)
