"""What a policy is told in a language scenario family: its task's instruction in other words.

A family's `instructions` setting picks, per episode (by a stable digest of its seed):

    task        the task's own instruction (the default: what the demonstrations said)
    paraphrase  a rephrasing in mostly the same words (PARAPHRASES)
    unseen      a phrasing in words the demonstrations never used (UNSEEN_PHRASINGS): does the policy
                understand the instruction, or match its words?
    other_task  another of the family's tasks' instructions: a negative control -- a policy that
                reads its instruction must do worse

A family's `phrasings: {task: [text, ...]}` replaces the built-in table for those tasks (for
`paraphrase` and `unseen`), so a user tests the phrasings their operators use.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

from vlaeval.artifacts import stable_seed
from vlaeval.choices import InstructionMode
from vlaeval.envs import DEFAULT_SIMULATOR
from vlaeval.errors import UserInputError, require

PARAPHRASES: Dict[str, Tuple[str, ...]] = {
    "reach-v3": ("reach the goal position", "move to the red goal position", "reach the red goal"),
    "push-v3": ("push the puck to the goal position", "push the puck to its goal", "move the puck to the goal"),
    "pick-place-v3": (
        "pick up the puck and put it at the goal",
        "place the puck at the goal",
        "pick the puck up and place it at the goal",
    ),
    "peg-insert-side-v3": (
        "insert the peg into the hole",
        "put the peg into the hole from the side",
        "insert the peg sideways into the hole",
    ),
    "disassemble-v3": ("pick the nut off", "take the nut off the peg", "pick up the nut from the peg"),
    "stick-pull-v3": (
        "grasp the stick and pull the box",
        "pull the box with the stick",
        "grasp the stick to pull the box",
    ),
    "reach-wall-v3": ("reach the goal behind the wall", "reach the red goal over the wall"),
    "push-wall-v3": ("push the puck around the wall to the goal", "push the puck past the wall to the goal"),
    "pick-place-wall-v3": (
        "pick up the puck and place it at the goal over the wall",
        "place the puck at the goal behind the wall",
    ),
}

UNSEEN_PHRASINGS: Dict[str, Tuple[str, ...]] = {
    "reach-v3": ("touch the target spot", "extend your arm toward the marker"),
    "push-v3": ("shove the disc toward the target", "slide the disk over to the marker"),
    "pick-place-v3": ("grab the disc and drop it on the target", "lift the disk then set it down on the marker"),
    "peg-insert-side-v3": ("slot the pin sideways into the opening", "jam the rod into the socket"),
    "disassemble-v3": ("remove the ring from the post", "lift the washer off the rod"),
    "stick-pull-v3": ("use the rod to drag the crate", "hold the rod and haul the crate"),
    "reach-wall-v3": ("touch the target spot beyond the barrier",),
    "push-wall-v3": ("shove the disc around the barrier toward the target",),
    "pick-place-wall-v3": ("grab the disc and drop it on the target beyond the barrier",),
}


def instruction_mode(value: object, where: str) -> InstructionMode:
    """The mode `value` names; a one-line error naming the choices otherwise."""
    try:
        return InstructionMode(str(value))
    except ValueError:
        raise UserInputError(
            f"{where}={value!r} is unknown; use one of {', '.join(InstructionMode.values())}"
        ) from None


def phrasing_table(mode: InstructionMode, overrides: Mapping[str, Sequence[str]]) -> Dict[str, Tuple[str, ...]]:
    base = PARAPHRASES if mode == InstructionMode.paraphrase else UNSEEN_PHRASINGS
    return {**base, **{str(task): tuple(str(t) for t in texts) for task, texts in overrides.items()}}


def check_phrasings(
    where: str, mode: InstructionMode, tasks: Sequence[str], overrides: Mapping[str, Sequence[str]]
) -> None:
    """One-line errors before any episode runs: every task of the family has a phrasing to draw."""
    if mode in (InstructionMode.paraphrase, InstructionMode.unseen):
        table = phrasing_table(mode, overrides)
        lacking = [t for t in tasks if not table.get(t)]
        require(
            not lacking,
            f"{where}.instructions={mode.value}: no {mode.value} phrasing of {', '.join(lacking)}; add "
            f'{where}.phrasings: {{{lacking[0] if lacking else ""}: ["..."]}}',
        )
    if mode == InstructionMode.other_task:
        require(
            len(set(tasks)) >= 2,
            f"{where}.instructions=other_task needs at least two tasks in the family (it tells each episode another's)",
        )


def episode_instruction(
    mode: InstructionMode,
    task: str,
    tasks: Sequence[str],
    seed: int,
    overrides: Mapping[str, Sequence[str]],
    simulator: str = DEFAULT_SIMULATOR,
) -> Optional[str]:
    """What the episode's policy is told (None: its task's own instruction; other_task: another of
    `tasks`' instructions in the simulator named `simulator`)."""
    if mode == InstructionMode.task:
        return None
    pick = stable_seed("instruction", mode.value, seed)
    if mode == InstructionMode.other_task:
        others = [t for t in dict.fromkeys(tasks) if t != task]
        from vlaeval.envs import simulator as registered_simulator

        return registered_simulator(simulator).instruction(others[pick % len(others)])
    texts = phrasing_table(mode, overrides)[task]
    return texts[pick % len(texts)]
