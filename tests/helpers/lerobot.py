"""A LeRobotDataset written independently of vlaeval's writer, from the layout in LeRobot's source
(lerobot/datasets/utils.py, video_utils.py): the test's stand-in for a dataset LeRobot wrote."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

FPS = 30
WRIST = "observation.images.wrist"  # the video camera: AV1 (LeRobot's default codec), 64x64
LENGTHS = (23, 31, 17, 26, 29, 20)


def wrist_pixel(index: int, episode: int, frame: int) -> np.ndarray:
    """The wrist camera's flat colour at a frame: red says the global index, green the episode,
    blue the frame -- flat fields, so a lossy codec keeps them within a few levels."""
    return np.array([(37 * index) % 200 + 28, (40 * episode) % 200 + 28, (8 * frame) % 200 + 28], dtype=np.uint8)


def write_av1(path, frames, codec="libsvtav1"):
    """Encode uint8 (n, H, W, 3) frames at FPS the way LeRobot's encode_video_frames does (yuv420p,
    a keyframe every 2 frames, CRF 30)."""
    import os

    import av

    os.environ.setdefault("SVT_LOG", "1")
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS, options={"g": "2", "crf": "30"})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def foreign_dataset(root, version="v3.0", state_dim=7, action_dim=2, video_codec="libsvtav1"):
    """A LeRobotDataset written independently of vlaeval's writer, from the layout in LeRobot's
    source: two data files, episode ids from 10, a task that changes inside an episode."""
    rng = np.random.default_rng(0)
    lengths = list(LENGTHS)
    ids = list(range(10, 10 + len(lengths)))
    tasks = ["stack the red cube on the blue one", "wipe the table"]
    frames = []
    index = 0
    for e, length in zip(ids, lengths):
        for f in range(length):
            task = 0 if e % 2 == 0 else (1 if f >= length // 2 else 0)
            frames.append(
                {
                    "observation.state": rng.standard_normal(state_dim).astype(np.float32),
                    "action": np.tanh(rng.standard_normal(action_dim)).astype(np.float32),
                    "timestamp": np.float32(f / 30),
                    "frame_index": f,
                    "episode_index": e,
                    "index": index,
                    "task_index": task,
                }
            )
            index += 1

    def png(i):
        import io

        from PIL import Image

        pixels = np.zeros((6, 8, 3), dtype=np.uint8)
        pixels[..., 0], pixels[..., 1], pixels[0, 0, 2] = i % 256, (i * 7) % 256, 255
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        return buffer.getvalue()

    def table(rows):
        image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        return pa.table(
            {
                "observation.images.top": pa.array(
                    [{"bytes": png(r["index"]), "path": None} for r in rows], image_type
                ),
                "observation.state": pa.array(
                    [r["observation.state"].tolist() for r in rows], pa.list_(pa.float32(), state_dim)
                ),
                "action": pa.array([r["action"].tolist() for r in rows], pa.list_(pa.float32(), action_dim)),
                **{
                    k: pa.array([r[k] for r in rows])
                    for k in ("timestamp", "frame_index", "episode_index", "index", "task_index")
                },
            }
        )

    half = sum(lengths[:3])
    (root / "meta").mkdir(parents=True)
    features = {
        "observation.state": {"dtype": "float32", "shape": [state_dim], "names": None},
        "action": {"dtype": "float32", "shape": [action_dim], "names": None},
        WRIST: {
            "dtype": "video",
            "shape": [64, 64, 3],
            "names": ["height", "width", "channels"],
            "info": {"video.codec": "av1" if video_codec == "libsvtav1" else "h264", "video.pix_fmt": "yuv420p"},
        },
        "observation.images.top": {"dtype": "image", "shape": [6, 8, 3], "names": ["height", "width", "channel"]},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    info = {
        "codebase_version": version,
        "fps": 30,
        "robot_type": "so100",
        "features": features,
        "total_episodes": len(ids),
        "chunks_size": 1000,
        "video_path": (
            "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
            if version == "v3.0"
            else "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        ),
    }
    (root / "meta" / "info.json").write_text(json.dumps(info))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pixels = np.stack(
        [np.broadcast_to(wrist_pixel(r["index"], r["episode_index"], r["frame_index"]), (64, 64, 3)) for r in frames]
    )
    if version == "v3.0":
        # Two video files split where the data files are not: episodes 0-3 and 4-5, each placed
        # in its file by from_timestamp.
        video_file = [0, 0, 0, 0, 1, 1]
        from_timestamp = []
        for f in (0, 1):
            mine = [k for k in range(len(ids)) if video_file[k] == f]
            write_av1(
                root / "videos" / WRIST / "chunk-000" / f"file-{f:03d}.mp4",
                np.concatenate([pixels[starts[k] : starts[k] + lengths[k]] for k in mine]),
                video_codec,
            )
            from_timestamp += list(np.cumsum([0] + [lengths[k] for k in mine[:-1]]) / FPS)
        for file_index, rows in enumerate((frames[:half], frames[half:])):
            path = root / "data" / "chunk-000" / f"file-{file_index:03d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table(rows), path)
        pd.DataFrame({"task_index": [0, 1]}, index=pd.Index(tasks, name="task")).to_parquet(
            root / "meta" / "tasks.parquet"
        )
        episodes = pd.DataFrame(
            {
                "episode_index": ids,
                "tasks": [tasks[:1] if e % 2 == 0 else tasks for e in ids],
                "length": lengths,
                "dataset_from_index": starts,
                "dataset_to_index": starts + np.array(lengths),
                f"videos/{WRIST}/chunk_index": np.zeros(len(ids), dtype=np.int64),
                f"videos/{WRIST}/file_index": np.array(video_file, dtype=np.int64),
                f"videos/{WRIST}/from_timestamp": np.array(from_timestamp),
                f"videos/{WRIST}/to_timestamp": np.array(from_timestamp) + np.array(lengths) / FPS,
            }
        )
        (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
        episodes.to_parquet(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    else:  # v2.1: one parquet file per episode, JSON-lines metadata
        for e, start, length in zip(ids, starts, lengths):
            path = root / "data" / "chunk-000" / f"episode_{e:06d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table(frames[start : start + length]), path)
            write_av1(
                root / "videos" / "chunk-000" / WRIST / f"episode_{e:06d}.mp4",
                pixels[start : start + length],
                video_codec,
            )
        lines = [json.dumps({"task_index": i, "task": t}) for i, t in enumerate(tasks)]
        (root / "meta" / "tasks.jsonl").write_text("\n".join(lines) + "\n")
        lines = [json.dumps({"episode_index": e, "tasks": tasks, "length": n}) for e, n in zip(ids, lengths)]
        (root / "meta" / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    return root
