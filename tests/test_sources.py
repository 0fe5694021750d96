"""The outcome-source protocol (vlaeval/gauntlet/sources.py): checked once, typed traits, and every
hook the gauntlet uses is declared in it."""

from __future__ import annotations

import ast
from typing import Any, Dict, List

import numpy as np
import pytest

from helpers.configs import REPO
from vlaeval.errors import UserInputError
from vlaeval.gauntlet.outcomes import SyntheticOutcomes
from vlaeval.gauntlet.sources import (
    CAPABILITIES,
    OUTCOME_HOOKS,
    REQUIRED_HOOKS,
    CheckedSource,
    SourceTraits,
    checked_source,
)


class Minimal:
    def describe(self) -> Dict[str, Any]:
        return {"kind": "minimal"}

    def validate(self, strata: Any, effects: Any) -> None:
        pass

    def available_strata(self) -> None:
        return None

    def cluster_sizes(self, request: Any) -> np.ndarray:
        return np.ones(3, dtype=np.int64)

    def load(self, request: Any, cache: Any) -> Any:
        raise AssertionError("not asked in these tests")


def test_a_minimal_source_passes_with_default_traits_and_no_capabilities():
    checked = checked_source(Minimal())
    assert checked.traits == SourceTraits()
    assert not (checked.prepares_policies or checked.records_episodes or checked.closable or checked.produces)
    assert checked.notices() == [] and checked.stratum_data_labels() == {} and checked.prepare() is None
    checked.close()  # a no-op
    assert checked_source(checked) is checked  # checked once


@pytest.mark.parametrize("hook", REQUIRED_HOOKS)
def test_a_missing_required_hook_is_named(hook):
    source = Minimal()
    setattr(source, hook, None)
    with pytest.raises(UserInputError, match=f"lacks {hook} of the OutcomeSource protocol"):
        checked_source(source)


def test_a_source_without_produce_or_load_is_refused():
    source = Minimal()
    source.load = None
    with pytest.raises(UserInputError, match="neither produce"):
        checked_source(source)


@pytest.mark.parametrize("capability", [c for c, hooks in CAPABILITIES.items() if len(hooks) > 1])
def test_every_partial_capability_is_refused(capability):
    hooks = CAPABILITIES[capability]
    for present in range(1, len(hooks)):
        source = Minimal()
        for hook in hooks[:present]:
            setattr(source, hook, object() if hook == "registry" else (lambda *a, **k: None))
        with pytest.raises(UserInputError, match=f"{capability} .* is all of"):
            checked_source(source)


def test_traits_are_typed():
    for name, bad in (("holds_outcomes", "yes"), ("batch_units", True), ("batch_units", 0), ("data_label", 3)):
        source = Minimal()
        setattr(source, name, bad)
        with pytest.raises(UserInputError, match=name):
            checked_source(source)


def test_builtin_sources_declare_what_they_are():
    assert checked_source(SyntheticOutcomes()).traits == SourceTraits(data_label="GENERATED")
    assert checked_source(SyntheticOutcomes()).produces


def hooks_used_on_sources() -> Dict[str, List[str]]:
    """Every attribute the package reads off a source (a name `source` or `*.source`), outside the
    sources' own modules: each must be part of the checked protocol."""
    used: Dict[str, List[str]] = {}
    own = {"sources.py", "rollouts.py"}
    paths = sorted((REPO / "vlaeval" / "jobs").glob("*.py")) + sorted((REPO / "vlaeval" / "gauntlet").glob("*.py"))
    for path in paths:
        if path.name in own:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            is_source = (isinstance(value, ast.Name) and value.id == "source") or (
                isinstance(value, ast.Attribute) and value.attr == "source"
            )
            if is_source:
                used.setdefault(node.attr, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    return used


def test_every_source_hook_the_jobs_use_is_declared_in_the_protocol():
    declared = {name for name in dir(CheckedSource) if not name.startswith("_")}
    declared |= {"traits", "produces", "prepares_policies", "records_episodes", "closable", "has_notices"}
    declared |= {"labels_strata", "source"} | {hook for hooks in CAPABILITIES.values() for hook in hooks}
    used = hooks_used_on_sources()
    assert used, "the scan found no use of a source: it is looking in the wrong place"
    undeclared = {name: places for name, places in used.items() if name not in declared}
    assert undeclared == {}
    assert set(REQUIRED_HOOKS) | set(OUTCOME_HOOKS) <= declared
