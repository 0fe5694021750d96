"""A training recipe as overrides of the sections that decide a built-in policy's weights (model,
data, flow, train), applied to the run's own sections: `train.steps=300`, `model.locate=[4,5,6]`,
`data.cameras=[corner,corner4]`. Every key must already exist in its section (a typo is refused, not
added), values are typed by the section (the train and flow dataclasses check them), and the seed is
the comparison's: a recipe may not set train.seed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vlaeval.config import FlowConfig, TrainConfig, to_plain
from vlaeval.errors import UserInputError, first_line, require
from vlaeval.policy.builtin import PolicySpec

RECIPE_SECTIONS = tuple(f.name for f in dataclasses.fields(PolicySpec))  # model, data, flow, train
SEED_KEY = "train.seed"


@dataclass(frozen=True)
class Recipe:
    """A named recipe and the overrides that make it, checked against the sections they change."""

    name: str
    overrides: Tuple[str, ...]
    seed_offset: int = 0

    def spec(self, base: PolicySpec, pair_seed: int) -> PolicySpec:
        """`base` with this recipe's overrides, trained at the seed pair's seed plus its offset."""
        return recipe_spec(base, self.overrides, pair_seed + self.seed_offset, self.name)


def _split(override: str, recipe: str) -> Tuple[str, str]:
    key, sep, value = override.partition("=")
    key = key.strip()
    section = key.partition(".")[0]
    require(
        bool(sep) and "." in key and section in RECIPE_SECTIONS,
        f"recipes.{recipe}.overrides has {override!r}: write section.key=value with a section of "
        f"{', '.join(RECIPE_SECTIONS)} (e.g. train.steps=300)",
    )
    require(
        key != SEED_KEY,
        f"recipes.{recipe}.overrides sets {SEED_KEY}: the comparison trains every recipe at each seed it adds "
        "(recipes.first_seed onwards); remove it",
    )
    return key, value


def recipe_spec(base: PolicySpec, overrides: Sequence[str], seed: int, recipe: str = "recipe") -> PolicySpec:
    """`base` with `overrides` applied and train.seed=seed; one-line errors for a key the section
    does not have or a value it does not accept."""
    tree = OmegaConf.create(
        {
            "model": to_plain(base.model),
            "data": to_plain(base.data),
            "flow": OmegaConf.structured(base.flow),
            "train": OmegaConf.structured(base.train),
        }
    )
    missing = object()
    for override in overrides:
        key, _ = _split(override, recipe)
        require(
            OmegaConf.select(tree, key, default=missing) is not missing,
            f"recipes.{recipe}.overrides sets {key}, which the {key.partition('.')[0]} section does not have; "
            "check its spelling against the section (python main.py --cfg job)",
        )
        try:
            merged = OmegaConf.merge(tree, OmegaConf.from_dotlist([override]))
        except OmegaConfBaseException as error:
            raise UserInputError(f"recipes.{recipe}.overrides has {override!r}: {first_line(error)}") from None
        assert isinstance(merged, DictConfig)
        tree = merged
    train = OmegaConf.to_object(tree.train)
    flow = OmegaConf.to_object(tree.flow)
    assert isinstance(train, TrainConfig) and isinstance(flow, FlowConfig)
    return PolicySpec(
        model=_read_only(tree.model),
        data=_read_only(tree.data),
        flow=flow,
        train=dataclasses.replace(train, seed=int(seed)),
    )


def _read_only(node: DictConfig) -> DictConfig:
    """A component section as the job holds it: a read-only node of its resolved values."""
    out = OmegaConf.create(OmegaConf.to_container(node, resolve=True))
    assert isinstance(out, DictConfig)
    OmegaConf.set_readonly(out, True)
    return out
