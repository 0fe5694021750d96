"""job=export_lerobot: write the demonstrations as a LeRobotDataset (v3.0 layout).

Load the data component's demonstrations (data=metaworld records them on first use); write them
as LeRobot writes a dataset -- meta/info.json, meta/tasks.parquet, meta/episodes/, data/ --
into a temporary folder renamed into place at export.root; report the content digest that
data=lerobot gives the export (the same as the source's, so an audit of either scores the same).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from omegaconf import DictConfig

from vlaeval import console
from vlaeval.config import POLICY_SECTIONS
from vlaeval.data.lerobot import read_lerobot, write_lerobot
from vlaeval.errors import require, require_at_least
from vlaeval.runs import RunReport, load_data, now_ms, output_dir, publish

JOB = "export_lerobot"
COMPONENTS = ("data",)  # `_target_` groups checked against their signatures before run()
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
READS = ("export", *POLICY_SECTIONS)


def run(cfg: DictConfig) -> Dict[str, Any]:
    started_ms = now_ms()
    e = cfg.export
    require_at_least("export.fps", e.fps, 1)
    root = Path(str(e.root)) if e.root is not None else output_dir(cfg) / "lerobot"
    require(
        not root.exists() or not any(root.iterdir()),
        f"export.root={root} exists and is not empty; choose a new folder (an export never overwrites)",
    )
    data = load_data(cfg)
    demos = data.demonstrations
    write_lerobot(demos, root, fps=int(e.fps), robot_type=e.robot_type)
    reread = read_lerobot(root, "observation.state", "action", demos.name)
    result = {
        "root": str(root.resolve()),
        "source_manifest_sha256": demos.manifest_sha256,
        "dataset_sha256": reread.manifest_sha256,
        "round_trip_identical": reread.manifest_sha256 == demos.manifest_sha256,
        "episodes": int(demos.episode_length.size),
        "frames": int(demos.observations.shape[0]),
        "tasks": list(demos.instructions),
    }
    result = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result,
            started_ms=started_ms,
            run_name=f"export-lerobot-{demos.manifest_sha256[:12]}",
            metrics={"export.episodes": result["episodes"], "export.frames": result["frames"]},
            checks={"round_trip_identical": result["round_trip_identical"]},
            tags={"data.manifest_sha256": demos.manifest_sha256},
        ),
    )
    console.show(
        f"wrote {result['episodes']} episodes ({result['frames']} frames) as a LeRobotDataset v3.0 at {root}; "
        f"read back with data=lerobot data.root={root}: content digest {reread.manifest_sha256[:16]}... "
        f"({'identical to' if result['round_trip_identical'] else 'DIFFERENT from'} the source's)"
    )
    return result
