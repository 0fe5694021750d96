"""job=regressions: which scenarios has a candidate failed where the baseline succeeded?

List the failure registry the rollout gauntlet records into and replays as historical_regressions
(outcomes.registry, else beside the tracking store): one row per scenario with the stratum it was
found in, the scene and seed, whether the failure was an unsafe event, and which candidate failed.
An empty or absent registry is reported, not an error. The listing is saved as result.json.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Tuple

from omegaconf import DictConfig

from vlaeval import console
from vlaeval.artifacts import atomic_write_json
from vlaeval.gauntlet.registry import FailureRegistry, registry_path
from vlaeval.runs import output_dir

JOB = "regressions"
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
COMPONENTS: Tuple[str, ...] = ()  # no `_target_` groups
READS = ("outcomes",)


def run(cfg: DictConfig) -> Dict[str, Any]:
    explicit = cfg.outcomes.get("registry") if "registry" in cfg.outcomes else None
    registry = FailureRegistry(registry_path(explicit, cfg.tracking, str(cfg.paths.cache_dir)))
    entries = registry.entries()
    result = {"registry": str(registry.path), "entries": entries, "count": len(entries)}
    atomic_write_json(output_dir(cfg) / "result.json", result)
    if not entries:
        console.show(
            f"the failure registry {registry.path} is empty: no rollout gauntlet has recorded a failure yet "
            "(python main.py job=gauntlet outcomes=rollout)"
        )
        return result
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
            f"Failure registry {registry.path}: {len(entries)} scenarios",
            ["found in", "task", "family/variant", "seed", "candidate", "candidate version", "recorded"],
            rows,
        )
    )
    by_task = Counter(e["episode"]["task"] for e in entries)
    console.show("per task: " + ", ".join(f"{task} {n}" for task, n in sorted(by_task.items())))
    return result
