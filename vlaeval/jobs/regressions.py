"""job=regressions: which scenarios has a candidate failed where the baseline succeeded?

List the failure registry the rollout gauntlet records into and replays as historical_regressions
(outcomes.registry, else beside the tracking store): one row per scenario with the stratum it was
found in, the scene and seed, whether the failure was an unsafe event, and which candidate failed.
An empty or absent registry is reported, not an error. With regressions.videos=N and outcomes=rollout,
film up to N of the scenarios that source's baseline and candidate recorded, baseline | candidate
side by side, re-run from their seeds (vlaeval/rollouts/videos.py). The listing is saved as
result.json, then tracked with the videos as artifacts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

from vlaeval import console
from vlaeval.config import RegressionsConfig, SourceJobSettings
from vlaeval.errors import UserInputError, require
from vlaeval.gauntlet.inputs import accepts_context, build_source, run_context
from vlaeval.gauntlet.registry import FailureRegistry, registry_path
from vlaeval.runs import JobResult, RunReport, SavedAsJson, now_ms, output_dir, publish

JOB = "regressions"
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
COMPONENTS: Tuple[str, ...] = ()  # no `_target_` groups
VIDEO_FOLDER = "videos"


@dataclass(frozen=True, kw_only=True)
class RegressionsJobConfig(SourceJobSettings):
    """The sections job=regressions reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    regressions: RegressionsConfig


@dataclass(frozen=True)
class RegressionsResult(SavedAsJson):
    """job=regressions' result: the failure registry's scenarios and the videos filmed of them."""

    registry: str
    entries: List[Dict[str, Any]]
    count: int
    videos: List[str]


def run(cfg: RegressionsJobConfig) -> JobResult[RegressionsResult]:
    started_ms = now_ms()
    videos_asked = int(cfg.regressions.videos)
    require(videos_asked >= 0, f"regressions.videos={videos_asked} must be >= 0 (0: list only)")
    require(
        videos_asked == 0 or accepts_context(cfg.outcomes),
        "regressions.videos films with the baseline and candidate of a rollout source: add outcomes=rollout "
        "(with the gauntlet's outcomes.baseline and outcomes.candidate)",
    )
    explicit = cfg.outcomes.get("registry") if "registry" in cfg.outcomes else None
    registry = FailureRegistry(registry_path(explicit, cfg.tracking, str(cfg.paths.cache_dir)))
    entries = registry.entries()
    videos = film_entries(cfg, entries, videos_asked) if videos_asked and entries else []
    result = RegressionsResult(str(registry.path), entries, len(entries), [str(v) for v in videos])
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"regressions ({len(entries)} scenarios)",
            metrics={"regressions.count": float(len(entries)), "regressions.videos": float(len(videos))},
            checks={},
            artifacts=[(v, VIDEO_FOLDER) for v in videos],
        ),
    )
    show(registry.path, entries, videos)
    return JobResult(result, published)


def film_entries(cfg: RegressionsJobConfig, entries: List[Dict[str, Any]], count: int) -> List[Path]:
    """Videos of up to `count` registry entries recorded for outcomes=rollout's baseline and candidate
    (their versions: name @ the checkpoint's digest): the policies are loaded (or trained) as the
    gauntlet loads them."""
    source = build_source(cfg.outcomes, run_context(cfg))
    try:
        versions = source.prepare()
        if versions is None:  # accepts_context was checked: a rollout source prepares its policies
            raise UserInputError(f"outcomes {source.name} runs no policies: it cannot film (use outcomes=rollout)")
        baseline, candidate = versions
        mine = [e for e in entries if e["candidate"]["version"] == candidate and e["baseline"]["version"] == baseline]
        if not mine:
            console.show(
                f"no registry scenario was recorded for this baseline and candidate ({len(entries)} are other "
                "pairs'): nothing to film; set outcomes.baseline and outcomes.candidate to the pair that found them"
            )
            return []
        return source.film(output_dir(cfg) / VIDEO_FOLDER, count, mine)
    finally:
        source.close()


def show(path: Path, entries: List[Dict[str, Any]], videos: List[Path]) -> None:
    if not entries:
        console.show(
            f"the failure registry {path} is empty: no rollout gauntlet has recorded a failure yet "
            "(python main.py job=gauntlet outcomes=rollout)"
        )
        return
    rows = [
        (
            e["stratum"],
            e["episode"]["task"],
            f"{e['episode'].get('family', 0)}/{e['episode']['variant']}",
            str(e["episode"]["seed"]),
            "unsafe" if e["candidate"].get("unsafe") else "failed",
            e["candidate"]["version"],
            e["recorded_at"],
        )
        for e in entries
    ]
    console.show(
        console.table(
            f"Failure registry {path}: {len(entries)} scenarios",
            ["found in", "task", "family/variant", "seed", "candidate", "candidate version", "recorded"],
            rows,
        )
    )
    by_task = Counter(e["episode"]["task"] for e in entries)
    console.show("per task: " + ", ".join(f"{task} {n}" for task, n in sorted(by_task.items())))
    if videos:
        console.show(f"{len(videos)} video(s), baseline | candidate: {videos[0].parent}")
