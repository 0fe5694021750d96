"""A demonstration's camera frames: kept encoded, decoded only for the frames a batch uses, into
the one layout every policy receives.

    IMAGE LAYOUT   uint8, (n, 3, height, width), RGB, channel-first -- LeRobot's (C, H, W) order; the
                   policy converts and normalises (vlaeval/policy/protocol.py)

Three stores, one interface (`CameraFrames.decode(steps)`):

* `EncodedImages` -- one PNG/JPEG per frame (a LeRobot `image` feature, embedded in the parquet).
* `FrameArray` -- raw uint8 frames (the built-in Meta-World recorder's renders, kept in its cache).
* `VideoFrames` -- a LeRobot `video` feature: each frame is the video frame at its timestamp
  (within LeRobot's tolerance) in an MP4 file under videos/, decoded with PyAV (its wheels carry
  FFmpeg with dav1d, so AV1 -- LeRobot's default -- and H.264 both decode). Every file is probed
  when the dataset is read -- present, opens, a codec this FFmpeg decodes, every timestamp inside
  the video -- so a bad file is a one-line error before any work. A file's episode is decoded
  once, on first use, into a bounded cache (`DecodedFrameCache`): an audit never decodes a frame
  twice, and training touches each episode's frames at one decode each.
"""

from __future__ import annotations

import hashlib
import io
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from vlaeval.errors import UserInputError, first_line, require

# LeRobot's default tolerance between a frame's timestamp and the video frame it reads
# (lerobot/datasets/lerobot_dataset.py: tolerance_s=1e-4).
TIMESTAMP_TOLERANCE_S = 1e-4


def channel_first(images: np.ndarray) -> np.ndarray:
    """(n, height, width, 3) uint8 -> (n, 3, height, width) uint8, contiguous: the policy's layout."""
    return np.ascontiguousarray(np.asarray(images, dtype=np.uint8).transpose(0, 3, 1, 2))


class CameraFrames(ABC):
    """One camera's frames, one per demonstration step (flat step order)."""

    key: str

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def decode(self, steps: np.ndarray) -> np.ndarray:
        """uint8 (len(steps), 3, height, width) of the given flat steps."""

    @abstractmethod
    def content_digest(self) -> bytes:
        """sha256 of what decides the pixels (32 bytes): part of the dataset's content digest."""

    @property
    def height(self) -> int:
        """The frames' height in pixels (the first frame's, decoded, unless the store knows it)."""
        return int(self.decode(np.array([0])).shape[2])


@dataclass
class EncodedImages(CameraFrames):
    """Each frame's PNG or JPEG bytes."""

    key: str
    frames: List[bytes]

    def __len__(self) -> int:
        return len(self.frames)

    def decode(self, steps: np.ndarray) -> np.ndarray:
        from PIL import Image

        images = [np.asarray(Image.open(io.BytesIO(self.frames[int(s)])).convert("RGB")) for s in np.asarray(steps)]
        return channel_first(np.stack(images))

    def content_digest(self) -> bytes:
        return hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in self.frames)).digest()


@dataclass
class FrameArray(CameraFrames):
    """Raw frames, uint8 (steps, height, width, 3)."""

    key: str
    pixels: np.ndarray

    def __len__(self) -> int:
        return int(self.pixels.shape[0])

    def decode(self, steps: np.ndarray) -> np.ndarray:
        return channel_first(self.pixels[np.asarray(steps, dtype=np.int64)])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[1])

    def content_digest(self) -> bytes:
        return hashlib.sha256(np.ascontiguousarray(self.pixels).tobytes()).digest()


# ----------------------------------------------------------------------------- video
class DecodedFrameCache:
    """Decoded segments (one episode of one video file each), least recently used dropped first
    once they hold more than `max_bytes`. `decoded_frames` counts every frame ever decoded."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.segments: "OrderedDict[Tuple[str, int], np.ndarray]" = OrderedDict()
        self.bytes = 0
        self.decoded_frames = 0

    def get(self, key: Tuple[str, int]) -> Optional[np.ndarray]:
        frames = self.segments.get(key)
        if frames is not None:
            self.segments.move_to_end(key)
        return frames

    def put(self, key: Tuple[str, int], frames: np.ndarray) -> None:
        self.segments[key] = frames
        self.bytes += frames.nbytes
        while self.bytes > self.max_bytes and len(self.segments) > 1:
            _, dropped = self.segments.popitem(last=False)
            self.bytes -= dropped.nbytes


@dataclass(frozen=True)
class VideoFile:
    """What probing a video file found: its codec, frame size, and the time its last frame ends."""

    path: Path
    codec: str  # the decoder FFmpeg picked (libdav1d, h264, ...)
    height: int
    width: int
    end_s: float

    @property
    def codec_family(self) -> str:
        """The codec the stream is in, as LeRobot's info.json names it (av1, h264, hevc, ...)."""
        import av

        try:
            return str(av.codec.Codec(self.codec, "r").canonical_name)
        except Exception:
            return self.codec


def probe_video(path: Path, key: str) -> VideoFile:
    """Open `path` and check it is a video this FFmpeg decodes; one-line errors otherwise."""
    import av

    require(path.is_file(), f"camera feature {key}: video file {path} is missing; re-copy or re-download the dataset")
    try:
        with av.open(str(path)) as container:
            require(bool(container.streams.video), f"camera feature {key}: {path} holds no video stream")
            stream = container.streams.video[0]
            context = stream.codec_context  # None when FFmpeg has no decoder for the stream's codec
            codec = str(context.name) if context is not None else str(getattr(stream, "codec_tag", "") or "unknown")
            try:
                require(context is not None, "no decoder")
                av.codec.Codec(codec, "r")
            except Exception:
                raise UserInputError(
                    f"camera feature {key}: {path} is in a codec ({codec}) this FFmpeg (PyAV {av.__version__}) cannot "
                    "decode; re-encode it as AV1 or H.264"
                ) from None
            rate = float(stream.average_rate or stream.base_rate or 0) or None
            if stream.duration is not None and stream.time_base is not None:
                end = float(stream.duration * stream.time_base) + float(stream.start_time or 0) * float(
                    stream.time_base
                )
            elif container.duration is not None:
                end = container.duration / 1e6
            else:
                end = float(stream.frames) / rate if rate and stream.frames else float("inf")
            return VideoFile(path, codec, int(stream.codec_context.height), int(stream.codec_context.width), end)
    except UserInputError:
        raise
    except Exception as error:  # av.error.InvalidDataError and kin: the container does not open
        raise UserInputError(
            f"camera feature {key}: {path} is corrupt or not a video ({first_line(error)}); re-copy or re-encode it"
        ) from None


@dataclass
class VideoFrames(CameraFrames):
    """Frames read from video files at timestamps. Step s is the frame at `timestamps[s]` seconds
    in `files[file_of_step[s]]`; `segment_of_step[s]` names the contiguous run of steps (an episode)
    decoded together and cached as one."""

    key: str
    files: List[VideoFile]
    file_of_step: np.ndarray  # int64 (steps,)
    timestamps: np.ndarray  # float64 (steps,) seconds from the file's start
    segment_of_step: np.ndarray  # int64 (steps,)
    cache: DecodedFrameCache = field(default_factory=lambda: DecodedFrameCache(1 << 30), repr=False)
    tolerance_s: float = TIMESTAMP_TOLERANCE_S

    def __post_init__(self) -> None:
        self.segment_steps: Dict[int, np.ndarray] = {}
        order = np.argsort(self.segment_of_step, kind="stable")
        bounds = np.flatnonzero(np.r_[True, np.diff(self.segment_of_step[order]) != 0, True])
        for a, b in zip(bounds[:-1], bounds[1:]):
            self.segment_steps[int(self.segment_of_step[order[a]])] = order[a:b]

    def __len__(self) -> int:
        return int(self.timestamps.size)

    @property
    def height(self) -> int:  # from the probe: no segment decoded for it
        return self.files[0].height

    def check_timestamps(self, episode_of_step: np.ndarray) -> None:
        """Every step's timestamp lies inside its file's video (checked from the container's header)."""
        for f, video in enumerate(self.files):
            mine = np.flatnonzero(self.file_of_step == f)
            if mine.size == 0:
                continue
            late = mine[self.timestamps[mine] > video.end_s + self.tolerance_s]
            early = mine[self.timestamps[mine] < -self.tolerance_s]
            bad = np.r_[early, late]
            require(
                bad.size == 0,
                f"camera feature {self.key}: episode {int(episode_of_step[bad[0]]) if bad.size else 0} reads "
                f"t={float(self.timestamps[bad[0]]) if bad.size else 0:.4f} s of {video.path}, outside its video "
                f"(0..{video.end_s:.4f} s); the episode metadata's videos/{self.key}/from_timestamp or the video is wrong",
            )

    def decode(self, steps: np.ndarray) -> np.ndarray:
        steps = np.asarray(steps, dtype=np.int64)
        first = self.files[int(self.file_of_step[steps[0]])] if steps.size else self.files[0]
        out = np.empty((steps.size, 3, first.height, first.width), dtype=np.uint8)
        segments = self.segment_of_step[steps]
        for segment in np.unique(segments):
            frames = self._segment(int(segment))
            where = np.flatnonzero(segments == segment)
            positions = np.searchsorted(self.segment_steps[int(segment)], steps[where])
            out[where] = frames[positions]
        return out

    def _segment(self, segment: int) -> np.ndarray:
        """uint8 (steps of the segment, 3, H, W), in step order: decoded once, then from the cache."""
        video = self.files[int(self.file_of_step[self.segment_steps[segment][0]])]
        cached = self.cache.get((str(video.path), segment))
        if cached is not None:
            return cached
        steps = self.segment_steps[segment]
        frames = channel_first(self._decode_at(video, self.timestamps[steps]))
        self.cache.put((str(video.path), segment), frames)
        return frames

    def _decode_at(self, video: VideoFile, wanted: np.ndarray) -> np.ndarray:
        """(len(wanted), H, W, 3): the frame whose time is within the tolerance of each wanted time."""
        import av

        order = np.argsort(wanted, kind="stable")
        out = np.empty((wanted.size, video.height, video.width, 3), dtype=np.uint8)
        filled = np.zeros(wanted.size, dtype=bool)
        k = 0  # next position in `order` to fill
        try:
            with av.open(str(video.path)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                time_base = float(stream.time_base or 1e-6)
                start = float(wanted[order[0]])
                container.seek(max(int(start / time_base), 0), stream=stream, backward=True)
                for frame in container.decode(stream):
                    if frame.pts is None:
                        continue
                    t = float(frame.pts) * time_base
                    self.cache.decoded_frames += 1
                    while k < order.size and wanted[order[k]] < t - self.tolerance_s:
                        k += 1  # passed without a match: reported below
                    rgb = None
                    while k < order.size and abs(wanted[order[k]] - t) <= self.tolerance_s:
                        rgb = frame.to_ndarray(format="rgb24") if rgb is None else rgb
                        out[order[k]], filled[order[k]] = rgb, True
                        k += 1
                    if k >= order.size:
                        break
        except Exception as error:
            raise UserInputError(
                f"camera feature {self.key}: decoding {video.path} failed ({first_line(error)}); the file is "
                "corrupt: re-copy or re-encode it"
            ) from None
        missing = np.flatnonzero(~filled)
        require(
            missing.size == 0,
            f"camera feature {self.key}: {video.path} has no frame within {self.tolerance_s:g} s of "
            f"t={float(wanted[missing[0]]) if missing.size else 0:.4f} s; the timestamps do not match the video's frames",
        )
        return out

    def content_digest(self) -> bytes:
        digest = hashlib.sha256()
        for video in self.files:
            digest.update(file_sha256(video.path))
        for values in (self.file_of_step, np.round(self.timestamps, 6)):
            digest.update(np.ascontiguousarray(values).tobytes())
        return digest.digest()

    def __getstate__(self) -> Dict[str, Any]:  # a copy sent to another process starts with an empty cache
        state = dict(self.__dict__)
        state["cache"] = DecodedFrameCache(self.cache.max_bytes)
        return state


def file_sha256(path: Path) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


# ----------------------------------------------------------------------------- writing
VIDEO_ENCODERS = ("libsvtav1", "libx264")  # AV1 (LeRobot's default) and H.264
# A camera written and read back is "within the codec's error" at this PSNR or above. At CRF 30
# (LeRobot's setting) the built-in 64x64 renders measure ~30 dB through AV1 and ~25 dB through
# H.264: yuv420p halves the colour resolution, which costs the thin saturated-red arm most; a
# colour-channel swap or a blank frame falls far below.
MIN_ROUND_TRIP_PSNR_DB = 24.0


@dataclass(frozen=True)
class PixelError:
    """How far a camera's frames moved through a codec: largest and mean absolute error (levels of
    255) and the PSNR over every pixel."""

    max_abs: int
    mean_abs: float
    psnr_db: float

    @property
    def within_codec_error(self) -> bool:
        return self.psnr_db >= MIN_ROUND_TRIP_PSNR_DB

    def as_dict(self) -> Dict[str, Any]:
        return {
            "max_abs_error": self.max_abs,
            "mean_abs_error": self.mean_abs,
            "psnr_db": self.psnr_db,
            "within_codec_error": self.within_codec_error,
        }


def pixel_error(source: CameraFrames, copy: CameraFrames, block: int = 4096) -> PixelError:
    """Compare two cameras frame by frame (in blocks of `block` frames, to bound memory)."""
    require(len(source) == len(copy), f"camera {source.key}: {len(source)} frames written, {len(copy)} read back")
    largest, total, squared, count = 0, 0.0, 0.0, 0
    for start in range(0, len(source), block):
        steps = np.arange(start, min(start + block, len(source)))
        diff = source.decode(steps).astype(np.int32) - copy.decode(steps).astype(np.int32)
        largest = max(largest, int(np.abs(diff).max()))
        total += float(np.abs(diff).sum())
        squared += float((diff.astype(np.float64) ** 2).sum())
        count += diff.size
    mse = squared / max(count, 1)
    psnr = float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))
    return PixelError(largest, total / max(count, 1), round(psnr, 3))


@dataclass(frozen=True)
class VideoEncoding:
    """How an export writes a camera as video: LeRobot's defaults (lerobot/datasets/video_utils.py:
    encode_video_frames) -- AV1 by SVT-AV1, yuv420p, a keyframe every 2 frames, CRF 30."""

    codec: str = "libsvtav1"
    pix_fmt: str = "yuv420p"
    gop: int = 2
    crf: int = 30

    @property
    def info_codec(self) -> str:
        """The codec name LeRobot's info.json records (`video.codec`)."""
        return {"libsvtav1": "av1", "libaom-av1": "av1", "libx264": "h264", "libx265": "hevc"}.get(
            self.codec, self.codec
        )


def write_video(path: Path, frames: np.ndarray, fps: int, encoding: VideoEncoding) -> None:
    """Encode uint8 (n, height, width, 3) frames at `fps` into `path` (an MP4): frame i is shown at
    i / fps seconds."""
    import os

    import av

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner on stderr otherwise
    require(
        encoding.codec in av.codecs_available, f"export.video_codec={encoding.codec} is not an encoder this FFmpeg has"
    )
    with av.open(str(path), "w", format="mp4") as container:
        stream: Any = container.add_stream(
            encoding.codec, rate=int(fps), options={"g": str(encoding.gop), "crf": str(encoding.crf)}
        )
        stream.width, stream.height, stream.pix_fmt = int(frames.shape[2]), int(frames.shape[1]), encoding.pix_fmt
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def video_feature_info(height: int, width: int, fps: int, encoding: VideoEncoding) -> Dict[str, Any]:
    """A video feature's entry in meta/info.json, as LeRobot writes it."""
    return {
        "dtype": "video",
        "shape": [int(height), int(width), 3],
        "names": ["height", "width", "channels"],
        "info": {
            "video.height": int(height),
            "video.width": int(width),
            "video.codec": encoding.info_codec,
            "video.pix_fmt": encoding.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(fps),
            "video.channels": 3,
            "has_audio": False,
        },
    }
