"""An episode as every simulator runs it: its spec (task, scene, seed, the scenario's perturbation,
a degradation planted on one policy, the unsafe-contact monitor) and the disturbances it meets.

Below the policies and independent of the simulator: an episode's seed alone decides its
perturbation streams (each its own stream, drawn the same way at every step whatever acts), so two
policies run on one episode meet identical disturbances (vlaeval/rollouts/engine.py runs them;
vlaeval/envs/protocol.py says what a simulator provides).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np

from vlaeval.artifacts import stable_seed
from vlaeval.errors import require

DEFAULT_OBSTACLE = ("wall",)  # the bodies whose contact force makes an episode unsafe, unless a family names others

# The held-out scenes, whole or halved: a learning-rate grid chooses on `validation` (the first half)
# and reports on `test` (the second), so what is chosen is never what is reported
# (train.validation_scenes, train.heldout_scenes, evaluate.scenes; data.scenes of a held-out recording).
HELD_OUT_SPLITS = ("held_out", "validation", "test")


def held_out_split(held_out: range, split: str) -> range:
    """The scenes of `split` among a simulator's held-out variants: all of them, or one half."""
    if split not in HELD_OUT_SPLITS:
        raise ValueError(f"{split!r} is not a held-out split; choose from {', '.join(HELD_OUT_SPLITS)}")
    middle = held_out.start + len(held_out) // 2
    return {"held_out": held_out, "validation": range(held_out.start, middle), "test": range(middle, held_out.stop)}[
        split
    ]


def require_held_out_split(name: str, split: object) -> None:
    """A one-line error for a setting that must name a held-out split."""
    require(
        split in HELD_OUT_SPLITS,
        f"{name}={split!r} is not a held-out split; choose from {', '.join(HELD_OUT_SPLITS)} "
        "(validation and test are its two halves)",
    )


@dataclass(frozen=True)
class Perturbation:
    """Disturbances while an episode runs; all zero is the clean episode.

    observation_noise: std of Gaussian noise on every observation the policy sees.
    action_noise: std of Gaussian noise added to every executed action (before clipping to [-1, 1]).
    burst_rate: probability per control step that a burst of uniformly random actions starts.
    burst_steps: length of a burst, in control steps.
    control_delay: control steps between the policy choosing an action and its execution (the
        first `control_delay` executed actions are zero).

    What the cameras show the policy (a policy without cameras meets none of these):
    image_noise: std of Gaussian pixel noise, as a fraction of the full 0-255 range, fresh at every call.
    brightness: added to every pixel, as a fraction of the range (-1 to 1).
    contrast: every pixel's distance from the image mean is scaled by this (1: unchanged).
    occlusion: side of a grey square patch, as a fraction of the image side, at a place drawn
        once per episode (0: none).
    camera_shift: each camera is moved by this many metres in a direction drawn once per episode.
    blank_camera: every image is black (the camera sees nothing: a policy that uses its camera
        must do worse).
    goal_marker_shift: the goal marker the cameras show is drawn this many metres from the true goal,
        on the table, in a direction drawn once per episode; the physics, the success test and the
        state observation keep the true goal (a counterfactual marker: a policy that finds the goal
        in its camera must do worse, one that ignores the marker cannot tell).
    """

    observation_noise: float = 0.0
    action_noise: float = 0.0
    burst_rate: float = 0.0
    burst_steps: int = 5
    control_delay: int = 0
    image_noise: float = 0.0
    brightness: float = 0.0
    contrast: float = 1.0
    occlusion: float = 0.0
    camera_shift: float = 0.0
    blank_camera: bool = False
    goal_marker_shift: float = 0.0

    @classmethod
    def parse(cls, values: Any, where: str) -> "Perturbation":
        """From a mapping of the fields above; a one-line error names an unknown key or a bad value."""
        from vlaeval.errors import UserInputError, require

        values = dict(values or {})
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                raise UserInputError(f"{where}.{key} is not a perturbation; use {', '.join(known)}")
        out = cls(**{k: type(getattr(cls(), k))(v) for k, v in values.items()})
        for name in ("observation_noise", "action_noise"):
            require(getattr(out, name) >= 0, f"{where}.{name}={getattr(out, name)} must be >= 0 (a standard deviation)")
        require(0 <= out.burst_rate <= 1, f"{where}.burst_rate={out.burst_rate} must be a probability in [0, 1]")
        require(out.burst_steps >= 1, f"{where}.burst_steps={out.burst_steps} must be >= 1")
        require(out.control_delay >= 0, f"{where}.control_delay={out.control_delay} must be >= 0 steps")
        require(out.image_noise >= 0, f"{where}.image_noise={out.image_noise} must be >= 0 (a fraction of 255)")
        require(
            -1 <= out.brightness <= 1, f"{where}.brightness={out.brightness} must be in [-1, 1] (a fraction of 255)"
        )
        require(out.contrast >= 0, f"{where}.contrast={out.contrast} must be >= 0 (1: unchanged)")
        require(0 <= out.occlusion <= 1, f"{where}.occlusion={out.occlusion} must be in [0, 1] (of the image side)")
        require(out.camera_shift >= 0, f"{where}.camera_shift={out.camera_shift} must be >= 0 metres")
        require(out.goal_marker_shift >= 0, f"{where}.goal_marker_shift={out.goal_marker_shift} must be >= 0 metres")
        return out

    @property
    def active(self) -> bool:
        return self != Perturbation()

    @property
    def visual(self) -> bool:
        """Whether it changes what the cameras show."""
        return any(getattr(self, name) != getattr(NO_PERTURBATION, name) for name in VISUAL_FIELDS)

    def spec(self) -> Dict[str, Any]:
        """Its fields for an episode's spec and cache key; the camera fields only when set, so an
        episode without them keeps the key it had before they existed."""
        out = dataclasses.asdict(self)
        for name in VISUAL_FIELDS:
            if out[name] == getattr(NO_PERTURBATION, name):
                out.pop(name)
        return out


NO_PERTURBATION = Perturbation()
VISUAL_FIELDS = (
    "image_noise",
    "brightness",
    "contrast",
    "occlusion",
    "camera_shift",
    "blank_camera",
    "goal_marker_shift",
)


@dataclass(frozen=True)
class Episode:
    """One closed-loop episode. `family` is the Meta-World benchmark seed that draws the task's 50
    scene variants (0: the family the demonstrations come from). `perturbation` is the scenario's,
    drawn from the episode's perturbation stream; `degradation` is planted on one policy only
    (effects), drawn from a stream of its own so the scenario's draws stay identical. With
    `unsafe_contact_force` set, contact between anything and `obstacle` bodies pushing harder than
    that many newtons is an unsafe event: the episode stops there and counts as a failure."""

    task: str
    task_index: int
    variant: int
    seed: int
    family: int = 0
    perturbation: Perturbation = NO_PERTURBATION
    degradation: Perturbation = NO_PERTURBATION
    unsafe_contact_force: Optional[float] = None
    obstacle: Tuple[str, ...] = field(default=DEFAULT_OBSTACLE)
    instruction: Optional[str] = None  # what the policy is told, when not its task's own instruction

    def spec(self) -> Dict[str, Any]:
        """What decides the episode's outcome, as plain values (task_index and degradation left to
        the caller); fields at their defaults that did not always exist are left out, so the
        episodes of earlier versions keep their cache keys."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["perturbation"], out["degradation"] = self.perturbation.spec(), self.degradation.spec()
        out["obstacle"] = list(self.obstacle)
        if self.instruction is None:
            out.pop("instruction")
        return out


class EpisodeDisturbances:
    """An episode's perturbation and degradation streams. Every control step draws the same
    numbers in the same order whatever the policy does, so the k-th step of two policies' runs of
    one episode meets the same disturbance."""

    def __init__(self, episode: Episode, action_dim: int) -> None:
        self.scenario, self.degradation = episode.perturbation, episode.degradation
        self.action_dim = int(action_dim)
        self.streams = [
            np.random.default_rng(stable_seed("perturbation", episode.seed)),
            np.random.default_rng(stable_seed("degradation", episode.seed)),
        ]
        delay = self.scenario.control_delay + self.degradation.control_delay
        self.pending: Deque[np.ndarray] = deque(np.zeros(self.action_dim) for _ in range(delay))
        self.burst_left = [0, 0]
        self.observation_draws: List[np.ndarray] = []
        # The cameras' disturbances draw from streams of their own, so adding a camera never moves
        # the draws above; where the occluding patch sits is drawn once per episode.
        self.image_streams = [
            np.random.default_rng(stable_seed("image-perturbation", episode.seed)),
            np.random.default_rng(stable_seed("image-degradation", episode.seed)),
        ]
        self.patch_corner = [rng.random(2) for rng in self.image_streams]

    def observe(self, obs: np.ndarray) -> np.ndarray:
        """What the policy sees of this step's observation."""
        out = np.asarray(obs, dtype=np.float32)
        for spec, rng in zip((self.scenario, self.degradation), self.streams):
            if spec.observation_noise > 0:
                out = out + np.float32(spec.observation_noise) * rng.standard_normal(out.shape).astype(np.float32)
        return out

    def observe_images(self, images: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """What the policy sees of the cameras' uint8 (H, W, 3) images at a policy call."""
        specs = [
            (spec, rng, corner)
            for spec, rng, corner in zip((self.scenario, self.degradation), self.image_streams, self.patch_corner)
            if spec.visual
        ]
        if not specs:
            return images
        out = {}
        for key in sorted(images):
            x = images[key].astype(np.float32)
            for spec, rng, corner in specs:
                x = disturbed_image(x, spec, rng, corner)
            out[key] = np.clip(np.rint(x), 0, 255).astype(np.uint8)
        return out

    def execute(self, chosen: np.ndarray) -> np.ndarray:
        """The action the robot executes this step, given the policy's choice."""
        self.pending.append(np.asarray(chosen, dtype=np.float64))
        action = self.pending.popleft()
        for k, (spec, rng) in enumerate(zip((self.scenario, self.degradation), self.streams)):
            if spec.burst_rate > 0:
                start, random_action = rng.random(), rng.uniform(-1.0, 1.0, self.action_dim)
                if self.burst_left[k] == 0 and start < spec.burst_rate:
                    self.burst_left[k] = spec.burst_steps
                if self.burst_left[k] > 0:
                    action, self.burst_left[k] = random_action, self.burst_left[k] - 1
            if spec.action_noise > 0:
                action = action + spec.action_noise * rng.standard_normal(self.action_dim)
        return np.clip(action, -1.0, 1.0)


def disturbed_image(x: np.ndarray, spec: Perturbation, rng: np.random.Generator, corner: np.ndarray) -> np.ndarray:
    """One perturbation's change to a float (H, W, 3) image in 0-255: blank, then brightness and
    contrast, then the occluding patch, then pixel noise (drawn from `rng` only when set)."""
    if spec.blank_camera:
        x = np.zeros_like(x)
    if spec.contrast != 1.0:
        x = (x - x.mean()) * np.float32(spec.contrast) + x.mean()
    if spec.brightness != 0.0:
        x = x + np.float32(255.0 * spec.brightness)
    if spec.occlusion > 0:
        h, w = x.shape[:2]
        side_h, side_w = max(int(round(spec.occlusion * h)), 1), max(int(round(spec.occlusion * w)), 1)
        top, left = int(corner[0] * (h - side_h + 1)), int(corner[1] * (w - side_w + 1))
        x = x.copy()
        x[top : top + side_h, left : left + side_w] = 128.0
    if spec.image_noise > 0:
        x = x + np.float32(255.0 * spec.image_noise) * rng.standard_normal(x.shape).astype(np.float32)
    return x


def camera_offset(episode: Episode) -> np.ndarray:
    """How far (metres, xyz) the episode's perturbations move every camera: a direction drawn once
    per episode from a stream of its own, times the scenario's and the degradation's shift."""
    shift = episode.perturbation.camera_shift + episode.degradation.camera_shift
    if shift == 0:
        return np.zeros(3)
    direction = np.random.default_rng(stable_seed("camera-shift", episode.seed)).standard_normal(3)
    return shift * direction / np.linalg.norm(direction)


def goal_marker_offset(episode: Episode) -> np.ndarray:
    """Where (metres, xyz) the cameras draw the goal marker relative to the true goal: on the table
    (z unchanged), in a direction drawn once per episode from a stream of its own, times the
    scenario's and the degradation's goal_marker_shift."""
    shift = episode.perturbation.goal_marker_shift + episode.degradation.goal_marker_shift
    if shift == 0:
        return np.zeros(3)
    angle = np.random.default_rng(stable_seed("goal-marker-shift", episode.seed)).uniform(0.0, 2.0 * np.pi)
    return shift * np.array([np.cos(angle), np.sin(angle), 0.0])
