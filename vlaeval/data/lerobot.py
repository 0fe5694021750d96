"""data=lerobot: a local LeRobotDataset read with pyarrow (no `lerobot` package), and the writer
behind job=export_lerobot.

The layout follows LeRobot's own source (lerobot/datasets/utils.py, io_utils.py,
dataset_metadata.py and dataset_writer.py; codebase_version "v3.0"):

    meta/info.json                                 fps, features {name: {dtype, shape, names}}, totals,
                                                   data_path template
    meta/tasks.parquet                             index "task" (the instruction), column task_index
    meta/episodes/chunk-XXX/file-YYY.parquet       episode_index, tasks, length, dataset_from_index,
                                                   dataset_to_index, data/chunk_index, data/file_index
    data/chunk-XXX/file-YYY.parquet                one row per frame: the features plus timestamp,
                                                   frame_index, episode_index, index, task_index

v2.1 (meta/tasks.jsonl, meta/episodes.jsonl, data/chunk-XXX/episode_YYYYYY.parquet) is read too.
The state and action features are chosen by name; the task instruction comes per frame
(task_index). Camera features named in `camera_features` -- `image` features (PNG/JPEG bytes in the
parquet files) and `video` features (MP4 files under videos/, AV1 by LeRobot's default, each frame
read at its timestamp) -- are kept encoded and decoded only for the anchors a batch uses
(vlaeval/data/cameras.py); they reach the policy as batch[<feature>], uint8 (B, 3, height, width).

    videos/<feature>/chunk-XXX/file-YYY.mp4        v3.0: many episodes per file; the episode
                                                   metadata's videos/<feature>/{chunk_index,
                                                   file_index, from_timestamp, to_timestamp} place
                                                   each episode in its file
    videos/chunk-XXX/<feature>/episode_YYYYYY.mp4  v2.x: one file per episode

The export writes the same layout; it adds columns LeRobot ignores (`vlaeval/...`) carrying the
built-in episodes' task names, scene variants, seeds and success, so reading an export back gives
the very arrays -- and so the same content digest, sampler order and scores -- as data=metaworld.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from vlaeval.data.cameras import (
    CameraFrames,
    DecodedFrameCache,
    EncodedImages,
    VideoEncoding,
    VideoFrames,
    probe_video,
    video_feature_info,
    write_video,
)
from vlaeval.data.demonstrations import Demonstrations, content_sha256
from vlaeval.errors import UserInputError, first_line, require

CODEBASE_VERSION = "v3.0"
READABLE_VERSIONS = ("v3.0", "v2.1", "v2.0")
INFO_PATH = "meta/info.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
LEROBOT_VIDEO = VideoEncoding()  # how LeRobot encodes a camera by default
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
FRAME_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
EXTRA = "vlaeval/"  # columns LeRobot ignores: the built-in data's labels, for an exact round trip


class LeRobotDemonstrations:
    """data=lerobot: the frames of a local LeRobotDataset as demonstrations. `root` is the folder
    holding meta/ and data/; `state_feature` and `action_feature` name the features the policy
    observes and acts in; `horizon` is the length H of the target action chunk."""

    def __init__(
        self,
        root: str,
        state_feature: str = "observation.state",
        action_feature: str = "action",
        horizon: int = 4,
        name: str = "lerobot",
        camera_features: Sequence[str] = (),
        video_cache_mb: int = 1024,
    ) -> None:
        self.root = str(root)
        self.camera_features = [str(c) for c in camera_features]
        self.video_cache_mb = int(video_cache_mb)  # decoded video frames kept in memory (least recently used dropped)
        self.state_feature = str(state_feature)
        self.action_feature = str(action_feature)
        self.horizon = int(horizon)
        self.name = str(name)

    def validate(self) -> None:
        read_info(Path(self.root), self.state_feature, self.action_feature, self.camera_features)
        require(self.horizon >= 1, f"data.horizon={self.horizon} must be >= 1 (the action chunk length H)")
        require(self.video_cache_mb >= 1, f"data.video_cache_mb={self.video_cache_mb} must be >= 1 (MiB)")

    def load(
        self, cache_dir: str | os.PathLike, progress: Optional[Callable[[int, int, str], None]] = None
    ) -> Tuple[Demonstrations, bool]:
        demos = read_lerobot(
            Path(self.root),
            self.state_feature,
            self.action_feature,
            self.name,
            self.camera_features,
            video_cache_bytes=self.video_cache_mb << 20,
        )
        if progress is not None:
            progress(1, 1, f"read {demos.manifest['episodes']} episodes")
        return demos, False


def read_info(root: Path, state_feature: str, action_feature: str, cameras: Sequence[str] = ()) -> Dict[str, Any]:
    """meta/info.json, checked: a LeRobot layout this reader knows, with both features 1-D."""
    require(
        (root / INFO_PATH).is_file(),
        f"data.root={root} is not a LeRobotDataset (no {INFO_PATH}); give the folder LeRobot wrote, "
        "the one holding meta/ and data/",
    )
    try:
        info = json.loads((root / INFO_PATH).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserInputError(f"{root / INFO_PATH} is not valid JSON ({error}); the dataset is damaged") from None
    version = str(info.get("codebase_version", "?"))
    require(
        version in READABLE_VERSIONS,
        f"{root / INFO_PATH}: codebase_version {version} is not one vlaeval reads ({', '.join(READABLE_VERSIONS)}); "
        "convert it with LeRobot's converter",
    )
    features = info.get("features") or {}
    for key, which in ((state_feature, "state_feature"), (action_feature, "action_feature")):
        if key not in features:
            numeric = [
                k for k, f in features.items() if f.get("dtype") in ("float32", "float64") and k not in FRAME_COLUMNS
            ]
            raise UserInputError(
                f"data.{which}={key} is not a feature of the dataset at {root}; its numeric features: "
                f"{', '.join(numeric) or 'none'}"
            )
        shape = list(features[key].get("shape") or [])
        require(
            len(shape) == 1 and features[key].get("dtype") in ("float32", "float64"),
            f"data.{which}={key} has dtype {features[key].get('dtype')} and shape {shape}; it must be a 1-D float vector",
        )
    for key in cameras:
        dtype = (features.get(key) or {}).get("dtype")
        images = [k for k, f in features.items() if f.get("dtype") in ("image", "video")]
        require(
            dtype is not None,
            f"data.camera_features names {key}, not a feature of the dataset at {root}; its camera features: "
            f"{', '.join(images) or 'none'}",
        )
        require(
            dtype in ("image", "video"),
            f"data.camera_features: {key} has dtype {dtype}; a camera is an image or video feature: "
            f"{', '.join(images) or 'none'}",
        )
        if dtype == "video":
            require(
                bool(info.get("video_path")) or not str(info.get("codebase_version", "")).startswith("v3"),
                f"{root / INFO_PATH} has a video feature {key} but no video_path; the dataset is damaged",
            )
    return info


def _vector_column(table: Any, name: str, width: int) -> np.ndarray:
    column = table.column(name).combine_chunks()
    values = column.flatten().to_numpy(zero_copy_only=False)
    require(values.size == len(table) * width, f"feature {name} does not hold {width} values in every frame")
    return values.reshape(len(table), width).astype(np.float32)


def _read_tasks(root: Path) -> Tuple[List[str], Optional[List[str]]]:
    """(instructions by task_index, vlaeval task names or None)."""
    import pandas as pd

    if (root / TASKS_PATH).is_file():
        frame = pd.read_parquet(root / TASKS_PATH)
        order = np.argsort(frame["task_index"].to_numpy(), kind="stable")
        indices = frame["task_index"].to_numpy()[order]
        instructions = [str(t) for t in np.asarray(frame.index)[order]]
        names = [str(n) for n in frame[EXTRA + "task_name"].to_numpy()[order]] if EXTRA + "task_name" in frame else None
    else:
        path = root / "meta" / "tasks.jsonl"
        require(path.is_file(), f"the dataset at {root} has neither {TASKS_PATH} nor meta/tasks.jsonl")
        rows = sorted(
            (json.loads(line) for line in path.read_text().splitlines() if line.strip()), key=lambda r: r["task_index"]
        )
        indices = np.array([r["task_index"] for r in rows])
        instructions, names = [str(r["task"]) for r in rows], None
    require(
        list(indices) == list(range(len(indices))),
        f"the dataset at {root} numbers its tasks {list(indices)[:5]}...; task_index must run 0..{len(indices) - 1}",
    )
    return instructions, names


def _read_episodes(root: Path) -> Optional[Any]:
    import pandas as pd

    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if files:
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    path = root / "meta" / "episodes.jsonl"
    if path.is_file():
        return pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    return None


def _read_frames(root: Path, columns: Sequence[str]) -> Any:
    """Every data file's `columns` as one pyarrow table in global `index` order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((root / "data").glob("chunk-*/*.parquet"))
    require(bool(files), f"the dataset at {root} has no data/chunk-*/*.parquet files")
    parts = []
    for f in files:
        # Open first, then read: a file that does not open (truncated, not Parquet) is corrupt;
        # one that opens without a column vlaeval reads lacks it -- two different fixes.
        try:
            schema = pq.read_schema(f)
        except (pa.ArrowInvalid, OSError) as error:
            raise UserInputError(
                f"{f} is corrupt or not a Parquet file ({first_line(error)}); re-copy or re-export the dataset"
            ) from None
        absent = [c for c in columns if c not in schema.names]
        require(not absent, f"{f} lacks the column(s) {absent} vlaeval reads; expected {list(columns)}")
        try:
            parts.append(pq.read_table(f, columns=list(columns)))
        except (pa.ArrowInvalid, OSError) as error:
            raise UserInputError(
                f"{f} is corrupt: its footer opens but its data does not ({first_line(error)}); re-copy or re-export the dataset"
            ) from None
    table = pa.concat_tables(parts)
    order = np.argsort(table.column("index").to_numpy(), kind="stable")
    table = table.take(pa.array(order))
    require(len(table) > 0, f"the dataset at {root} has no frames")
    return table


def _episode_layout(root: Path, episode: np.ndarray, frame: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first frame, length, id) of each episode, checked: an episode's frames are contiguous in the
    global index and run 0..length-1."""
    n = episode.size
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]])
    lengths = np.diff(np.r_[starts, n])
    ids = episode[starts]
    require(
        np.unique(ids).size == ids.size,
        f"the frames of episode {ids[np.argmax(np.bincount(np.searchsorted(np.sort(ids), ids)))]} in {root} are "
        "not contiguous in the global index; the dataset is damaged",
    )
    expected_frames = np.arange(n) - np.repeat(starts, lengths)
    bad = np.flatnonzero(frame != expected_frames)
    require(
        bad.size == 0,
        f"episode {int(episode[bad[0]]) if bad.size else 0} in {root} has frame_index "
        f"{int(frame[bad[0]]) if bad.size else 0} at its position {int(expected_frames[bad[0]]) if bad.size else 0}; "
        "frames must run 0..length-1",
    )
    return starts, lengths, ids


def _episode_extras(root: Path, episodes: Optional[Any], ids: np.ndarray, lengths: np.ndarray) -> Dict[str, np.ndarray]:
    """vlaeval's own per-episode columns (variant, seed, success) from the episode metadata, whose
    lengths must match the frames; {} for a dataset without episode metadata."""
    extras: Dict[str, np.ndarray] = {}
    if episodes is None:
        return extras
    by_id = {int(e): i for i, e in enumerate(episodes["episode_index"].to_numpy())}
    for e, length in zip(ids, lengths):
        row = by_id.get(int(e))
        require(row is not None, f"episode {int(e)} of {root} has frames but no row in its episode metadata")
        recorded = int(episodes["length"].to_numpy()[row])
        require(
            recorded == int(length),
            f"episode {int(e)} of {root} has {int(length)} frames but its metadata says length {recorded}",
        )
    rows = np.array([by_id[int(e)] for e in ids])
    for key in ("variant", "seed", "success"):
        if EXTRA + key in episodes:
            extras[key] = episodes[EXTRA + key].to_numpy()[rows]
    return extras


def _read_cameras(
    root: Path,
    info: Dict[str, Any],
    table: Any,
    cameras: Sequence[str],
    layout: "EpisodeLayout",
    episodes: Optional[Any],
    cache_bytes: int,
) -> Dict[str, CameraFrames]:
    """Each named camera's frames: image features from the parquet's embedded bytes, video
    features from their files (probed now: a bad file is a one-line error before any work)."""
    out: Dict[str, CameraFrames] = {}
    cache = DecodedFrameCache(cache_bytes)  # shared by the cameras: one memory bound
    for key in cameras:
        if info["features"][key]["dtype"] == "image":
            column = table.column(key).combine_chunks()
            frames = [b if isinstance(b, bytes) else b"" for b in column.field("bytes").to_pylist()]
            empty = [i for i, b in enumerate(frames) if not b]
            require(not empty, f"camera feature {key} of {root} has no embedded image bytes at frame index {empty[:1]}")
            out[key] = EncodedImages(key, frames)
        else:
            out[key] = _video_frames(root, info, table, key, layout, episodes, cache)
    return out


def _video_frames(
    root: Path,
    info: Dict[str, Any],
    table: Any,
    key: str,
    layout: "EpisodeLayout",
    episodes: Optional[Any],
    cache: DecodedFrameCache,
) -> VideoFrames:
    """Where each frame of video feature `key` is: its episode's file, at the episode's
    from_timestamp plus the frame's own timestamp."""
    v3 = str(info["codebase_version"]).startswith("v3")
    template = str(
        info.get("video_path") or "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    )
    files: Dict[str, int] = {}
    file_of_episode, offset = np.zeros(layout.ids.size, dtype=np.int64), np.zeros(layout.ids.size)
    by_id = {} if episodes is None else {int(e): i for i, e in enumerate(episodes["episode_index"].to_numpy())}
    for e, episode_id in enumerate(layout.ids):
        if v3:
            columns = [f"videos/{key}/{c}" for c in ("chunk_index", "file_index", "from_timestamp")]
            require(
                episodes is not None and all(c in episodes for c in columns),
                f"the episode metadata of {root} lacks {columns[0]} (and the file index and from_timestamp) of "
                f"video feature {key}; the dataset is damaged",
            )
            row = episodes.iloc[by_id[int(episode_id)]]  # type: ignore[union-attr]
            name = template.format(video_key=key, chunk_index=int(row[columns[0]]), file_index=int(row[columns[1]]))
            offset[e] = float(row[columns[2]])
        else:
            chunk = int(episode_id) // int(info.get("chunks_size") or 1000)
            name = template.format(video_key=key, episode_chunk=chunk, episode_index=int(episode_id))
        file_of_episode[e] = files.setdefault(name, len(files))
    videos = [probe_video(root / name, key) for name in files]
    timestamps = table.column("timestamp").to_numpy().astype(np.float64)
    episode_of_step = np.repeat(np.arange(layout.ids.size), layout.lengths)
    frames = VideoFrames(
        key,
        videos,
        file_of_episode[episode_of_step],
        offset[episode_of_step] + timestamps,
        episode_of_step,
        cache,
    )
    frames.check_timestamps(layout.ids[episode_of_step])
    shape = list(info["features"][key].get("shape") or [])
    feature = info["features"][key]
    recorded = (feature.get("info") or feature.get("video_info") or {}).get("video.codec")  # v3.0 / v2.1
    for video in videos:
        require(
            recorded is None or str(recorded) == video.codec_family,
            f"camera feature {key}: {video.path} is {video.codec_family} video, but meta/info.json says "
            f"video.codec={recorded}; the file was re-encoded without updating info.json: fix the one that is wrong",
        )
        require(
            not shape or sorted(shape) == sorted([video.height, video.width, 3]),
            f"camera feature {key}: {video.path} is {video.height}x{video.width}, but meta/info.json says shape "
            f"{shape}; the dataset is damaged",
        )
    return frames


@dataclass(frozen=True)
class EpisodeLayout:
    """Where each episode's frames are in the global index: first frame, length, the dataset's id."""

    starts: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray


def read_lerobot(
    root: Path,
    state_feature: str,
    action_feature: str,
    name: str,
    cameras: Sequence[str] = (),
    *,
    video_cache_bytes: int = 1 << 30,
) -> Demonstrations:
    """The dataset's frames as Demonstrations, every structural fact checked; camera features are
    kept encoded (decoded per batch, for the anchors it uses)."""
    info = read_info(root, state_feature, action_feature, cameras)
    features = info["features"]
    images = [c for c in cameras if features[c]["dtype"] == "image"]  # video frames live in videos/, not here
    timestamp = ["timestamp"] if len(images) < len(cameras) else []
    columns = [
        state_feature,
        action_feature,
        "episode_index",
        "frame_index",
        "index",
        "task_index",
        *timestamp,
        *images,
    ]
    table = _read_frames(root, columns)
    n = len(table)
    observations = _vector_column(table, state_feature, int(features[state_feature]["shape"][0]))
    actions = _vector_column(table, action_feature, int(features[action_feature]["shape"][0]))
    episode = table.column("episode_index").to_numpy().astype(np.int64)
    task = table.column("task_index").to_numpy().astype(np.int64)
    starts, lengths, ids = _episode_layout(root, episode, table.column("frame_index").to_numpy().astype(np.int64))
    instructions, names = _read_tasks(root)
    require(
        int(task.max()) < len(instructions) and int(task.min()) >= 0,
        f"the dataset at {root} has frames with task_index {int(task.max())} but {len(instructions)} tasks",
    )
    episodes = _read_episodes(root)  # the episode metadata, read once for the extras and the videos
    extras = _episode_extras(root, episodes, ids, lengths)
    episode_task = task[starts]
    per_frame = task if np.any(task != np.repeat(episode_task, lengths)) else None
    arrays: Dict[str, np.ndarray] = {
        "observations": observations,
        "actions": actions,
        "episode_start": starts.astype(np.int64),
        "episode_length": lengths.astype(np.int64),
        "episode_task": episode_task,
        "episode_success": extras.get("success", np.zeros(ids.size)).astype(bool),
        "episode_variant": extras.get("variant", np.full(ids.size, -1)).astype(np.int64),
        "episode_seed": extras.get("seed", np.full(ids.size, -1)).astype(np.int64),
    }
    optional: Dict[str, np.ndarray] = {}
    if per_frame is not None:
        optional["frame_task"] = per_frame
    if not np.array_equal(ids, np.arange(ids.size)):
        optional["episode_index"] = ids
    camera_frames = _read_cameras(
        root, info, table, cameras, EpisodeLayout(starts, lengths, ids), episodes, video_cache_bytes
    )
    optional.update(
        {f"camera:{k}": np.frombuffer(frames.content_digest(), dtype=np.uint8) for k, frames in camera_frames.items()}
    )
    tasks = names if names is not None else instructions
    manifest = {
        "schema_version": 1,
        "name": name,
        "source": {
            "format": "LeRobotDataset",
            "codebase_version": info["codebase_version"],
            "root": str(root.resolve()),
        },
        "features": {"state": state_feature, "action": action_feature, "cameras": list(cameras)},
        "fps": info.get("fps"),
        "tasks": tasks,
        "instructions": instructions,
        "episodes": int(ids.size),
        "steps": n,
        "expert_success_rate": float(arrays["episode_success"].mean()) if "success" in extras else None,
        "content_sha256": content_sha256({**arrays, **optional}, tasks, instructions),
    }
    fields = {k: v for k, v in optional.items() if not k.startswith("camera:")}
    return Demonstrations(
        **arrays,
        tasks=tasks,
        instructions=instructions,
        manifest=manifest,
        cameras=camera_frames or None,
        **fields,
    )


def dataset_sha256(
    root: str,
    state_feature: str = "observation.state",
    action_feature: str = "action",
    camera_features: Sequence[str] = (),
) -> str:
    """The content digest vlaeval gives a LeRobotDataset read with these data.* settings: what a
    gradient artifact names as its `dataset_sha256` (docs/gradient_artifact.md)."""
    return read_lerobot(Path(root), state_feature, action_feature, "lerobot", camera_features).manifest_sha256


# ----------------------------------------------------------------------------- export
def write_lerobot(
    demos: Demonstrations,
    root: Path,
    *,
    fps: int,
    robot_type: Optional[str],
    video: VideoEncoding = LEROBOT_VIDEO,
) -> Path:
    """Write demonstrations as a LeRobotDataset v3.0 folder at `root`, atomically: everything is
    written into a temporary sibling folder that is renamed into place. Cameras become video
    features (one file per camera, every episode placed in it by from_timestamp), encoded as `video`."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    require(
        not root.exists() or not any(root.iterdir()),
        f"export.root={root} exists and is not empty; choose a new folder (an export never overwrites)",
    )
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        n, obs_dim, action_dim = demos.observations.shape[0], demos.observations.shape[1], demos.actions.shape[1]
        lengths, starts = demos.episode_length, demos.episode_start
        ids = demos.episode_ids()
        episode = np.repeat(ids, lengths)
        frame = np.arange(n) - np.repeat(starts, lengths)
        task = demos.frame_tasks()
        data = pa.table(
            {
                "observation.state": pa.FixedSizeListArray.from_arrays(
                    pa.array(demos.observations.reshape(-1), pa.float32()), obs_dim
                ),
                "action": pa.FixedSizeListArray.from_arrays(
                    pa.array(demos.actions.reshape(-1), pa.float32()), action_dim
                ),
                "timestamp": pa.array((frame / float(fps)).astype(np.float32)),
                "frame_index": pa.array(frame.astype(np.int64)),
                "episode_index": pa.array(episode.astype(np.int64)),
                "index": pa.array(np.arange(n, dtype=np.int64)),
                "task_index": pa.array(task.astype(np.int64)),
            }
        )
        path = staging / DATA_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True)
        pq.write_table(data, path, compression="snappy")
        tasks = pd.DataFrame(
            {"task_index": np.arange(len(demos.instructions)), EXTRA + "task_name": list(demos.tasks)},
            index=pd.Index(list(demos.instructions), name="task"),
        )
        (staging / "meta").mkdir()
        tasks.to_parquet(staging / TASKS_PATH)
        episodes = pd.DataFrame(
            {
                "episode_index": ids.astype(np.int64),
                "tasks": [[demos.instructions[int(t)]] for t in demos.episode_task],
                "length": lengths.astype(np.int64),
                "data/chunk_index": np.zeros(ids.size, dtype=np.int64),
                "data/file_index": np.zeros(ids.size, dtype=np.int64),
                "dataset_from_index": starts.astype(np.int64),
                "dataset_to_index": (starts + lengths).astype(np.int64),
                "meta/episodes/chunk_index": np.zeros(ids.size, dtype=np.int64),
                "meta/episodes/file_index": np.zeros(ids.size, dtype=np.int64),
                EXTRA + "variant": demos.episode_variant.astype(np.int64),
                EXTRA + "seed": demos.episode_seed.astype(np.int64),
                EXTRA + "success": demos.episode_success.astype(bool),
            }
        )
        camera_features = _write_videos(demos, staging, fps, video)
        for key in camera_features:
            seconds = np.concatenate(([0], np.cumsum(lengths)[:-1])) / float(fps)
            episodes[f"videos/{key}/chunk_index"] = np.zeros(ids.size, dtype=np.int64)
            episodes[f"videos/{key}/file_index"] = np.zeros(ids.size, dtype=np.int64)
            episodes[f"videos/{key}/from_timestamp"] = seconds
            episodes[f"videos/{key}/to_timestamp"] = seconds + lengths / float(fps)
        path = staging / EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True)
        episodes.to_parquet(path)
        info = _info_json(demos, fps, robot_type, camera_features)
        (staging / INFO_PATH).write_text(json.dumps(info, indent=4), encoding="utf-8")
        stats = _stats_json(demos)
        (staging / "meta" / "stats.json").write_text(json.dumps(stats, indent=4), encoding="utf-8")
        if root.exists():
            root.rmdir()  # empty (checked above)
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root


def _info_json(
    demos: Demonstrations, fps: int, robot_type: Optional[str], camera_features: Dict[str, Any]
) -> Dict[str, Any]:
    """meta/info.json of an export: LeRobot v3.0's fields, the cameras as video features."""
    n, ids = demos.observations.shape[0], demos.episode_ids()
    obs_dim, action_dim = demos.observations.shape[1], demos.actions.shape[1]
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": int(ids.size),
        "total_frames": int(n),
        "total_tasks": len(demos.instructions),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": int(fps),
        "splits": {"train": f"0:{int(ids.size)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": VIDEO_PATH if camera_features else None,
        "features": {
            **camera_features,
            "observation.state": {"dtype": "float32", "shape": [obs_dim], "names": None},
            "action": {"dtype": "float32", "shape": [action_dim], "names": None},
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            "frame_index": {"dtype": "int64", "shape": [1], "names": None},
            "episode_index": {"dtype": "int64", "shape": [1], "names": None},
            "index": {"dtype": "int64", "shape": [1], "names": None},
            "task_index": {"dtype": "int64", "shape": [1], "names": None},
        },
    }


def _stats_json(demos: Demonstrations) -> Dict[str, Any]:
    """meta/stats.json of an export: per-feature mean, std, min, max and count."""
    n = demos.observations.shape[0]
    return {
        key: {
            "mean": values.mean(0).tolist(),
            "std": values.std(0).tolist(),
            "min": values.min(0).tolist(),
            "max": values.max(0).tolist(),
            "count": [int(n)],
        }
        for key, values in (("observation.state", demos.observations), ("action", demos.actions))
    }


def _write_videos(demos: Demonstrations, staging: Path, fps: int, video: VideoEncoding) -> Dict[str, Any]:
    """Each camera as one video file of every episode in order (frame k of the file is step k);
    returns the cameras' info.json features."""
    features: Dict[str, Any] = {}
    for key, frames in (demos.cameras or {}).items():
        pixels = frames.decode(np.arange(len(frames))).transpose(0, 2, 3, 1)
        path = staging / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True)
        write_video(path, pixels, fps, video)
        features[key] = video_feature_info(int(pixels.shape[1]), int(pixels.shape[2]), fps, video)
    return features
