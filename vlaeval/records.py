"""Frozen records that are also a JSON layout: a result's parts (a plan row, the lineage, the
rollouts' bill) are typed where they are built and read, and become JSON only where a file or a
tracking call needs it. One rule for every such record, so a field renamed in the class is renamed
in the file too (a dict key renamed in one place and read in another silently became a default).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Mapping, Tuple, Type, TypeVar

T = TypeVar("T", bound="JsonRecord")


def _tuples(value: object) -> object:
    """JSON's lists back as the tuples a frozen record holds (nested too)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _plain(value: object) -> object:
    """A field's JSON form: a nested record by its own to_json, tuples as lists, mappings as dicts."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


class JsonRecord:
    """Mixin for a frozen dataclass: `to_json` writes its fields in their order (a None field -- one
    only some runs have -- left out); `from_json` reads them back by name, ignoring keys it does not
    know (a later version's) and leaving absent ones at their defaults (an earlier version's).
    `WRITTEN_WHEN_NONE` names the fields a reader expects as null rather than absent."""

    WRITTEN_WHEN_NONE: ClassVar[Tuple[str, ...]] = ()

    def written_when_none(self) -> Tuple[str, ...]:
        return self.WRITTEN_WHEN_NONE

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        nullable = self.written_when_none()
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None or f.name in nullable:
                out[f.name] = _plain(value)
        return out

    @classmethod
    def from_json(cls: Type[T], data: Mapping[str, Any]) -> T:
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
        # A field typed as a tuple reads JSON's list back as one (annotations are strings here).
        tupled = {
            name for name, kind in fields.items() if kind.removeprefix("Optional[").startswith(("Tuple", "tuple"))
        }
        return cls(**{k: _tuples(v) if k in tupled else v for k, v in data.items() if k in fields})
