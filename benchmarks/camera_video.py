"""Cameras as LeRobot stores them: the built-in demonstrations with the corner camera exported as
AV1 and as H.264 video (LeRobot's settings), then decoded back with PyAV -- frames/s written and
read, every frame and in the audit's random order, the pixel error through each codec -- and the
audit's scoring in anchors/s with and without the camera.

    python benchmarks/camera_video.py [--anchors 256] [--cache-dir DIR]

Decoding is measured from a cold cache (every episode decoded once, as an audit does) and again
warm (the second pass of the same anchors). Scoring: the vision policy reading the AV1 camera
(decode included, cold), then warm, against the state policy on the same frames without a camera.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, cast

import numpy as np

from benchlib import REPO, compose_default, markdown_table, scoring_anchors_per_second, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.data.anchors import build_anchors, draw
from vlaeval.data.cameras import VideoEncoding, VideoFrames, pixel_error
from vlaeval.data.lerobot import read_lerobot, write_lerobot
from vlaeval.policy.builtin import PolicyData, PolicySpec, obtain_policy, prepare_data

CORNER = "observation.images.corner"
CODECS = {"AV1 (libsvtav1)": "libsvtav1", "H.264 (libx264)": "libx264"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--anchors", type=int, default=256, help="anchors scored")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "camera_video.json")
    args = parser.parse_args()
    out: Dict[str, Any] = {"codecs": {}}
    with tempfile.TemporaryDirectory() as work:
        cache = args.cache_dir or str(Path(work) / "cache")
        vision_cfg = compose_default([f"paths.cache_dir={cache}", "data=metaworld_vision", "model=tiny_vla_vision"])
        state_cfg = compose_default([f"paths.cache_dir={cache}", "data=metaworld_vision", "model=tiny_vla"])
        data = prepare_data(vision_cfg.data, cache)
        demos = data.demonstrations
        frames = int(demos.observations.shape[0])
        for name, codec in CODECS.items():
            root = Path(work) / codec
            started = time.perf_counter()
            write_lerobot(demos, root, fps=80, robot_type="sawyer", video=VideoEncoding(codec))
            write_s = time.perf_counter() - started
            back = read_lerobot(root, "observation.state", "action", "x", [CORNER])
            camera = back.cameras[CORNER]  # type: ignore[index]
            started = time.perf_counter()
            camera.decode(np.arange(frames))
            every_s = time.perf_counter() - started
            shuffled = read_lerobot(root, "observation.state", "action", "x", [CORNER])
            order = np.random.default_rng(0).permutation(frames)
            started = time.perf_counter()
            for start in range(0, frames, 64):  # the audit's pattern: batches of anchors in any order
                shuffled.decode_cameras(order[start : start + 64])
            shuffled_s = time.perf_counter() - started
            started = time.perf_counter()
            shuffled.decode_cameras(order)
            warm_s = time.perf_counter() - started
            error = pixel_error(demos.cameras[CORNER], camera)  # type: ignore[index]
            size = sum(f.stat().st_size for f in (root / "videos").rglob("*.mp4"))
            out["codecs"][name] = {
                "frames": frames,
                "write_frames_per_second": frames / write_s,
                "decode_frames_per_second_in_order": frames / every_s,
                "decode_frames_per_second_shuffled_cold": frames / shuffled_s,
                "frames_per_second_warm_cache": frames / warm_s,
                "decoded_frames_shuffled": cast(VideoFrames, (shuffled.cameras or {})[CORNER]).cache.decoded_frames,
                "bytes_per_frame": size / frames,
                "psnr_db": error.psnr_db,
                "mean_abs_error": error.mean_abs,
            }
            print(name, {k: round(v, 2) for k, v in out["codecs"][name].items()})
        av1 = Path(work) / "libsvtav1"
        index, _ = draw(data.anchors, args.anchors, 0)
        rates = {}
        for role, cfg in (("vision", vision_cfg), ("state", state_cfg)):
            handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, cache, data)
            cameras = [CORNER] if role == "vision" else []
            video_demos = read_lerobot(av1, "observation.state", "action", "x", cameras)
            video_data = PolicyData(video_demos, build_anchors(video_demos, data.anchors.horizon), False)
            policy = video_data.bind(handle.model, cfg.flow)
            rates[f"{role}_cold"] = scoring_anchors_per_second(cfg, policy, video_data.anchors, index)
            rates[f"{role}_warm"] = scoring_anchors_per_second(cfg, policy, video_data.anchors, index)
        out["scoring_anchors_per_second"] = rates
        print("scoring anchors/s", {k: round(v, 1) for k, v in rates.items()})
    atomic_write_json(args.out, out)
    write_figures(
        "camera_video",
        "Cameras as video: writing, decoding, and the audit's cost",
        "python benchmarks/camera_video.py",
        _body(out, args),
    )


def _body(out: Dict[str, Any], args: Any) -> str:
    rows: List[Any] = []
    for name, c in out["codecs"].items():
        rows.append(
            (
                name,
                f"{c['write_frames_per_second']:,.0f}",
                f"{c['decode_frames_per_second_in_order']:,.0f}",
                f"{c['decode_frames_per_second_shuffled_cold']:,.0f}",
                f"{c['frames_per_second_warm_cache']:,.0f}",
                f"{c['bytes_per_frame']:,.0f}",
                f"{c['psnr_db']:.1f} dB",
            )
        )
    first = next(iter(out["codecs"].values()))
    r = out["scoring_anchors_per_second"]
    scoring = [
        ("tiny_vla_vision, the AV1 camera, cold cache (decoding included)", f"{r['vision_cold']:.1f}"),
        ("tiny_vla_vision, the AV1 camera, warm cache", f"{r['vision_warm']:.1f}"),
        ("tiny_vla (state), no camera", f"{r['state_warm']:.1f}"),
    ]
    return (
        f"The built-in demonstrations with the corner camera ({first['frames']:,} frames of 64x64) exported as a "
        "LeRobotDataset (one MP4 per camera, yuv420p, a keyframe every 2 frames, CRF 30) and read back with PyAV; "
        "frames/s. *Shuffled* decodes them in the audit's pattern -- batches of 64 anchors in a random order -- from "
        "a cold cache: each episode is decoded once, on its first anchor; *warm* is the same pass again.\n\n"
        + markdown_table(
            ["codec", "written", "decoded in order", "decoded shuffled (cold)", "warm cache", "bytes/frame", "PSNR"],
            rows,
        )
        + f"\n\nThe audit's scoring (the default estimator) of {args.anchors} anchors of the AV1 export, anchors/s:\n\n"
        + markdown_table(["policy and camera", "anchors/s"], scoring)
    )


if __name__ == "__main__":
    main()
