"""job=export_lerobot: write the demonstrations as a LeRobotDataset (v3.0 layout).

Load the data component's demonstrations (data=metaworld records them on first use); write them
as LeRobot writes a dataset -- meta/info.json, meta/tasks.parquet, meta/episodes/, data/, and each
camera as video under videos/ (AV1 by default, as LeRobot) -- into a temporary folder renamed into
place at export.root; read it back and report the content digest that data=lerobot gives it (the
same as the source's besides the cameras, so an audit of either scores the same) and each camera's
pixel error through the codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from vlaeval import console
from vlaeval.config import ExportConfig, PolicyJobSettings
from vlaeval.data.cameras import VIDEO_ENCODERS, VideoEncoding, pixel_error
from vlaeval.data.demonstrations import content_sha256
from vlaeval.data.lerobot import read_lerobot, write_lerobot
from vlaeval.errors import require, require_at_least
from vlaeval.runs import JobResult, RunReport, SavedAsJson, load_data, now_ms, output_dir, publish

JOB = "export_lerobot"
COMPONENTS = ("data",)  # `_target_` groups checked against their signatures before run()


@dataclass(frozen=True, kw_only=True)
class ExportJobConfig(PolicyJobSettings):
    """The sections job=export_lerobot reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    export: ExportConfig


@dataclass(frozen=True)
class ExportResult(SavedAsJson):
    """job=export_lerobot's result: where the dataset went, its digest read back against the source's,
    each camera's codec error."""

    root: str
    source_manifest_sha256: str
    dataset_sha256: str
    round_trip_identical: bool
    cameras: Dict[str, Dict[str, Any]]
    episodes: int
    frames: int
    tasks: List[str]


def run(cfg: ExportJobConfig) -> JobResult[ExportResult]:
    started_ms = now_ms()
    e = cfg.export
    require_at_least("export.fps", e.fps, 1)
    encoding = VideoEncoding(str(e.video_codec), gop=int(e.video_gop), crf=int(e.video_crf))
    require(
        encoding.codec in VIDEO_ENCODERS,
        f"export.video_codec={encoding.codec} is not one vlaeval writes; use one of {', '.join(VIDEO_ENCODERS)}",
    )
    require_at_least("export.video_gop", encoding.gop, 1)
    root = Path(str(e.root)) if e.root is not None else output_dir(cfg) / "lerobot"
    require(
        not root.exists() or not any(root.iterdir()),
        f"export.root={root} exists and is not empty; choose a new folder (an export never overwrites)",
    )
    data = load_data(cfg)
    demos = data.demonstrations
    write_lerobot(demos, root, fps=int(e.fps), robot_type=e.robot_type, video=encoding)
    cameras = sorted(demos.cameras or {})
    reread = read_lerobot(root, "observation.state", "action", demos.name, cameras)
    without_cameras = content_sha256(demos.arrays(), demos.tasks, demos.instructions)
    reread_without_cameras = content_sha256(reread.arrays(), reread.tasks, reread.instructions)
    camera_error = {key: pixel_error(demos.cameras[key], reread.cameras[key]) for key in cameras}  # type: ignore[index]
    result = ExportResult(
        root=str(root.resolve()),
        source_manifest_sha256=demos.manifest_sha256,
        dataset_sha256=reread.manifest_sha256,
        round_trip_identical=reread_without_cameras == without_cameras,
        cameras={key: {"codec": encoding.info_codec, **error.as_dict()} for key, error in camera_error.items()},
        episodes=int(demos.episode_length.size),
        frames=int(demos.observations.shape[0]),
        tasks=list(demos.instructions),
    )
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"export-lerobot-{demos.manifest_sha256[:12]}",
            metrics={
                "export.episodes": result.episodes,
                "export.frames": result.frames,
                **{f"export.{key}.psnr_db": error.psnr_db for key, error in camera_error.items()},
            },
            checks={
                "round_trip_identical": result.round_trip_identical,
                **{f"{key}.within_codec_error": error.within_codec_error for key, error in camera_error.items()},
            },
            tags={"data.manifest_sha256": demos.manifest_sha256},
        ),
    )
    console.show(
        f"wrote {result.episodes} episodes ({result.frames} frames) as a LeRobotDataset v3.0 at {root}; "
        f"read back with data=lerobot data.root={root}: content digest {reread.manifest_sha256[:16]}... "
        f"({'identical to' if result.round_trip_identical else 'DIFFERENT from'} the source's"
        f"{' besides the cameras' if cameras else ''})"
        + "".join(
            f"; {key} as {encoding.info_codec}: PSNR {error.psnr_db:.1f} dB" for key, error in camera_error.items()
        )
    )
    return JobResult(result, published)
