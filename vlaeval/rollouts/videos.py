"""Videos of the episodes that decide: baseline | candidate side by side on the same scene and seed,
for the paired episodes where the candidate failed and the baseline succeeded.

Nothing is stored during a run: an episode is decided by its spec and seed alone
(vlaeval/rollouts/engine.py), so it is run again here with a watcher that renders a larger view of
the scene after every step -- the same episode, step for step, as the one the gauntlet counted (the
watcher only reads the environment; the outcome is checked against the recorded one). Each frame
carries the instruction the policy was told, the step, and each side's outcome; the MP4 is H.264
(every browser plays it, MLflow's UI included), written to a temporary name and renamed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.data.cameras import VideoEncoding, write_video
from vlaeval.envs import DEFAULT_SIMULATOR
from vlaeval.envs import simulator as registered_simulator
from vlaeval.envs.episodes import Episode
from vlaeval.envs.protocol import Environments
from vlaeval.policy.bound import BoundPolicy
from vlaeval.rollouts.engine import rollout_lockstep, single_threaded_torch

VIDEO_SIZE = 192  # pixels a side: large enough to see the objects the policy's 64x64 view barely shows
VIDEO_FPS = 20
CAPTION_HEIGHT = 28
ENCODING = VideoEncoding(codec="libx264", gop=VIDEO_FPS, crf=23)


@dataclass(frozen=True)
class FilmedEpisode:
    frames: np.ndarray  # uint8 (steps + 1, VIDEO_SIZE, VIDEO_SIZE, 3): the scene when it opens, then after each step
    success: bool
    unsafe: bool
    steps: int


def film(
    policy: BoundPolicy, episode: Episode, *, execute_actions: int, max_steps: int, simulator: str = DEFAULT_SIMULATOR
) -> FilmedEpisode:
    """Run `episode` again with `policy` (alone: an episode's outcome does not depend on what shares
    its lockstep group), the simulator's view of its scene (Environments.frame) at VIDEO_SIZE after
    every step."""
    frames: List[np.ndarray] = []

    def watch(k: int, envs: Environments) -> None:
        frames.append(envs.frame(k, VIDEO_SIZE))

    with single_threaded_torch():
        [outcome] = rollout_lockstep(
            policy,
            [episode],
            execute_actions=execute_actions,
            max_steps=max_steps,
            watch=watch,
            simulator=registered_simulator(simulator),
        )
    return FilmedEpisode(np.stack(frames), outcome.success, outcome.unsafe, outcome.steps)


def outcome_word(episode: FilmedEpisode) -> str:
    return "success" if episode.success else ("UNSAFE" if episode.unsafe else "failed")


def side_by_side(baseline: FilmedEpisode, candidate: FilmedEpisode, instruction: str, title: str) -> np.ndarray:
    """(n, CAPTION_HEIGHT * 2 + VIDEO_SIZE, 2 * VIDEO_SIZE + 4, 3) frames: baseline left, candidate right,
    the shorter episode holding its last frame; a caption above with the title and the instruction, one
    below with the step and each side's outcome so far."""
    from PIL import Image, ImageDraw

    n = max(len(baseline.frames), len(candidate.frames))
    width, height = 2 * VIDEO_SIZE + 4, VIDEO_SIZE + 2 * CAPTION_HEIGHT
    out = np.zeros((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        canvas = Image.new("RGB", (width, height), (24, 24, 24))
        for column, side in enumerate((baseline, candidate)):
            frame = side.frames[min(i, len(side.frames) - 1)]
            canvas.paste(Image.fromarray(frame), (column * (VIDEO_SIZE + 4), CAPTION_HEIGHT))
        draw = ImageDraw.Draw(canvas)
        draw.text((4, 2), title, fill=(255, 255, 255))
        draw.text((4, 14), f'"{instruction}"', fill=(255, 220, 120))
        for column, (name, side) in enumerate((("baseline", baseline), ("candidate", candidate))):
            done = i >= len(side.frames) - 1
            status = outcome_word(side) if done else "running"
            draw.text(
                (column * (VIDEO_SIZE + 4) + 4, CAPTION_HEIGHT + VIDEO_SIZE + 4),
                f"{name}: step {min(i, side.steps)} / {side.steps}, {status}",
                fill=(120, 255, 120) if done and side.success else (255, 120, 120) if done else (220, 220, 220),
            )
        out[i] = np.asarray(canvas)
    return out


def write_mp4(path: Path, frames: np.ndarray) -> Path:
    """`frames` as an H.264 MP4 at VIDEO_FPS, written to a temporary name and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp.mp4")
    try:
        write_video(temporary, frames, VIDEO_FPS, ENCODING)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def regression_video(
    baseline: BoundPolicy,
    candidate: BoundPolicy,
    episodes: Mapping[str, Episode],
    path: Path,
    *,
    title: str,
    instruction: str,
    execute_actions: int,
    max_steps: int,
    simulator: str = DEFAULT_SIMULATOR,
    expected: Optional[Mapping[str, bool]] = None,
) -> Path:
    """One paired episode filmed for each policy (`episodes`: baseline's and candidate's, the same
    scene and seed; the candidate's may carry a planted degradation) and written side by side. With
    `expected` (each role's recorded success), a re-run that disagrees is refused: the video would
    not show the episode that was counted."""
    filmed = {
        role: film(policy, episodes[role], execute_actions=execute_actions, max_steps=max_steps, simulator=simulator)
        for role, policy in (("baseline", baseline), ("candidate", candidate))
    }
    for role, success in (expected or {}).items():
        if filmed[role].success != bool(success):
            raise RuntimeError(
                f"the {role}'s episode re-ran to {outcome_word(filmed[role])}, not the recorded outcome: the rollout "
                "engine is not deterministic here, and the video would not show the counted episode"
            )
    return write_mp4(path, side_by_side(filmed["baseline"], filmed["candidate"], instruction, title))


def video_name(stratum: str, scenario_id: str) -> str:
    """A file name for a scenario's video, unique and stable (a digest of its id)."""
    digest = stable_seed("video", scenario_id) % 16**8
    return f"{stratum}-{digest:08x}.mp4"


def pick(failures: Sequence[Mapping[str, Any]], count: int) -> List[Mapping[str, Any]]:
    """Up to `count` failures, the unsafe ones first, then in the order they were found."""
    ordered = sorted(range(len(failures)), key=lambda i: (not failures[i]["candidate"].get("unsafe"), i))
    return [failures[i] for i in ordered[: max(int(count), 0)]]
