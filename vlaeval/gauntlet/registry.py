"""The failure registry: scenarios on which a candidate failed where the baseline succeeded.

Every rollout gauntlet records its discordant episodes here (candidate failed, baseline
succeeded: the episode, with its seed and perturbation, is replayable exactly); the
`historical_regressions` stratum of later rollout gauntlets replays them (one cluster per scene),
and `job=regressions` lists them. It is a JSON-lines file beside the tracking store (the SQLite
file's folder; the cache folder for a tracking server or no tracking), so it survives restarts
and travels with the store. Writes hold a lock and replace the whole file atomically: concurrent
gauntlets never lose an entry, and a crash never leaves half a line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional

from filelock import FileLock

from vlaeval.artifacts import atomic_write_text, sha256_json
from vlaeval.errors import UserInputError

REGISTRY_FILE = "vlaeval_failure_registry.jsonl"
REGISTRY_SCHEMA_VERSION = 1


def registry_path(explicit: Optional[str], tracking: Any, cache_dir: str) -> Path:
    """outcomes.registry if given; else beside a SQLite tracking store; else in the cache folder."""
    if explicit:
        return Path(str(explicit))
    if tracking is not None and bool(getattr(tracking, "enabled", False)):
        from vlaeval.tracking import resolve_uri

        uri = resolve_uri(tracking)
        if uri.startswith("sqlite:///"):
            return Path(uri[len("sqlite:///") :]).parent / REGISTRY_FILE
    return Path(cache_dir) / REGISTRY_FILE


def entry_id(episode: Mapping[str, Any]) -> str:
    """A scenario's identity: its episode spec (scene, seed, perturbation, safety monitor)."""
    return sha256_json(dict(episode))[:16]


class FailureRegistry:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def entries(self) -> List[Dict[str, Any]]:
        """Every recorded scenario, oldest first; an absent file is an empty registry."""
        if not self.path.is_file():
            return []
        out = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                entry["episode"]["task"]  # noqa: B018 - the one field every replay needs
            except (ValueError, KeyError, TypeError):
                raise UserInputError(
                    f"failure registry {self.path}: line {number} is not a registry entry; "
                    "restore the file or move it away to start an empty registry"
                ) from None
            out.append(entry)
        return out

    def record(self, new: Iterable[Mapping[str, Any]]) -> int:
        """Add entries (each with an `episode` spec) not yet present; returns how many were added."""
        new = list(new)
        if not new:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(self.path.with_name(self.path.name + ".lock")):
            entries = self.entries()
            known = {e["id"] for e in entries}
            added = 0
            for entry in new:
                identity = entry_id(entry["episode"])
                if identity in known:
                    continue
                known.add(identity)
                entries.append({"schema_version": REGISTRY_SCHEMA_VERSION, "id": identity, **entry})
                added += 1
            if added:
                atomic_write_text(self.path, "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
        return added
