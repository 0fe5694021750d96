"""What a rollout gauntlet draws its clusters from: scenario families (tasks, scene variants,
episodes per scene, perturbations, an unsafe-contact limit) expanded into scenes of episodes, the
policies it rolls out, episodes as cacheable specs, and the paired-outcome file it writes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from vlaeval.choices import InstructionMode
from vlaeval.envs import DEFAULT_SIMULATOR
from vlaeval.envs.episodes import DEFAULT_OBSTACLE, NO_PERTURBATION, Episode, Perturbation
from vlaeval.errors import require
from vlaeval.policy.bound import BoundPolicy
from vlaeval.rollouts.evaluation import write_paired_outcomes as write_outcome_rows
from vlaeval.rollouts.language import check_phrasings, episode_instruction, instruction_mode

BUILTIN_PREFIX = "builtin:"
FAMILY_KEYS = (
    "tasks",
    "variants",
    "variant_families",
    "episodes_per_scene",
    "perturbation",
    "unsafe_contact_force",
    "obstacle",
    "replay",
    "instructions",
    "phrasings",
)
VARIANTS_PER_FAMILY = 50  # Meta-World draws 50 scene variants per task and benchmark seed


@dataclass(frozen=True)
class ScenarioFamily:
    """A stratum's scenarios. tasks: Meta-World tasks (null: the run's data.tasks); variants:
    [first, stop) scene variants of each of `variant_families` (MT1 benchmark seeds; family 0
    variants 0-24 are the built-in demonstrations' scenes); episodes_per_scene: units
    per cluster; perturbation: see vlaeval.envs.episodes.Perturbation; unsafe_contact_force:
    newtons above which contact with an `obstacle` body is an unsafe event; replay: the failure
    registry's scenarios instead; instructions: what each episode's policy is told, phrasings:
    {task: [texts]} replacing the built-in table (vlaeval/rollouts/language.py)."""

    tasks: Tuple[str, ...]
    variants: Tuple[int, int] = (0, 25)
    variant_families: Tuple[int, ...] = (0,)
    episodes_per_scene: int = 4
    perturbation: Perturbation = NO_PERTURBATION
    unsafe_contact_force: Optional[float] = None
    obstacle: Tuple[str, ...] = DEFAULT_OBSTACLE
    replay: bool = False
    instructions: InstructionMode = InstructionMode.task
    phrasings: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # (task, texts), hashable

    def spec(self) -> Dict[str, Any]:
        """Its settings as plain values (the source's description and digest); the camera and
        language settings only when set, so a family without them describes itself as before."""
        out = dataclasses.asdict(self)
        out["perturbation"] = self.perturbation.spec()
        if self.instructions == InstructionMode.task:
            out.pop("instructions")
        else:
            out["instructions"] = self.instructions.value
        if not self.phrasings:
            out.pop("phrasings")
        return out

    def instruction(self, task: str, seed: int, simulator: str = DEFAULT_SIMULATOR) -> Optional[str]:
        """What the episode of `task` with `seed` is told (None: the task's own instruction)."""
        return episode_instruction(self.instructions, task, self.tasks, seed, dict(self.phrasings), simulator)

    @classmethod
    def parse(cls, stratum: str, values: Any, default_tasks: Sequence[str]) -> "ScenarioFamily":
        where = f"outcomes.scenarios.{stratum}"
        require(isinstance(values, Mapping), f"{where} must be a mapping of {', '.join(FAMILY_KEYS)}")
        for key in values:
            require(key in FAMILY_KEYS, f"{where}.{key} is not a scenario-family setting; use {', '.join(FAMILY_KEYS)}")
        replay = bool(values.get("replay", False))
        tasks = tuple(str(t) for t in (values.get("tasks") or default_tasks))
        variants = tuple(int(v) for v in values.get("variants", (0, 25)))
        require(
            len(variants) == 2 and 0 <= variants[0] < variants[1] <= VARIANTS_PER_FAMILY,
            f"{where}.variants={list(variants)} must be [first, stop) with 0 <= first < stop <= {VARIANTS_PER_FAMILY}",
        )
        episodes = int(values.get("episodes_per_scene", 4))
        require(episodes >= 1, f"{where}.episodes_per_scene={episodes} must be >= 1")
        force = values.get("unsafe_contact_force")
        require(force is None or float(force) > 0, f"{where}.unsafe_contact_force={force} must be > 0 newtons")
        require(len(tasks) > 0 or replay, f"{where}.tasks is empty; list Meta-World tasks")
        mode = instruction_mode(values.get("instructions", "task"), f"{where}.instructions")
        return cls(
            tasks=tasks,
            variants=(variants[0], variants[1]),
            variant_families=tuple(int(f) for f in values.get("variant_families", (0,))),
            episodes_per_scene=episodes,
            perturbation=Perturbation.parse(values.get("perturbation"), f"{where}.perturbation"),
            unsafe_contact_force=None if force is None else float(force),
            obstacle=tuple(str(b) for b in values.get("obstacle", DEFAULT_OBSTACLE)),
            replay=replay,
            instructions=mode,
            phrasings=family_phrasings(where, mode, tasks, values.get("phrasings") or {}),
        )


def family_phrasings(
    where: str, mode: InstructionMode, tasks: Sequence[str], phrasings: Any
) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """A family's own phrasings ({task: [instruction, ...]}), checked against its instruction mode."""
    require(
        isinstance(phrasings, Mapping) and all(not isinstance(v, str) for v in phrasings.values()),
        f'{where}.phrasings must map a task to a list of instructions, e.g. {{reach-v3: ["touch the target"]}}',
    )
    check_phrasings(where, mode, tasks, phrasings)
    return tuple((str(t), tuple(str(x) for x in texts)) for t, texts in phrasings.items())


@dataclass(frozen=True)
class Scene:
    """A cluster: one scene variant of a task, and the episodes run on it."""

    task: str
    family: int
    variant: int
    episodes: Tuple[Dict[str, Any], ...]  # episode specs (seed, perturbation, safety monitor)

    @property
    def id(self) -> str:
        return f"{self.task}/family-{self.family}/variant-{self.variant}"


@dataclass
class RolloutPolicy:
    role: str
    reference: str
    version: str
    sha256: str
    bound: BoundPolicy  # bound to the tasks of the data it was built on
    flow: Any  # the flow section, as the episode cache keys record it


def episode_spec(episode: Episode) -> Dict[str, Any]:
    """What identifies an episode for replay and for the registry (not its instruction index, not
    a planted degradation)."""
    spec = episode.spec()
    spec.pop("task_index")
    spec.pop("degradation")
    return spec


def episode_from_spec(spec: Mapping[str, Any], task_index: int, degradation: Perturbation) -> Episode:
    return Episode(
        task=str(spec["task"]),
        task_index=int(task_index),
        variant=int(spec["variant"]),
        seed=int(spec["seed"]),
        family=int(spec.get("family", 0)),
        perturbation=Perturbation(**dict(spec.get("perturbation") or {})),
        degradation=degradation,
        unsafe_contact_force=spec.get("unsafe_contact_force"),
        obstacle=tuple(spec.get("obstacle", DEFAULT_OBSTACLE)),
        instruction=spec.get("instruction"),
    )


def write_paired_outcomes(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The outcome-file format plus each policy's unsafe flag and steps, written atomically."""
    return write_outcome_rows(rows, path, ("baseline_unsafe", "candidate_unsafe", "baseline_steps", "candidate_steps"))
