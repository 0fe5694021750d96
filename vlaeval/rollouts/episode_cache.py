"""Per-episode rollout outcomes, cached in one SQLite file: an episode run once is never run again.

The key is a digest of everything that decides an episode's outcome: the checkpoint's sha256, the
flow convention it samples with, the episode (scene, seed, perturbation, degradation, safety
monitor), the control settings, the rollout engine's and Meta-World's versions. So a re-run of a
gauntlet is free, and a new candidate reuses every baseline episode already run. An episode's
outcome does not depend on which episodes shared its lockstep batch (vlaeval.rollouts.engine), so
a cached outcome is exactly the one a fresh run would give. SQLite makes concurrent writers
(a sweep's jobs) safe; a row is written in one transaction, never half.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from vlaeval.artifacts import sha256_json
from vlaeval.envs import DEFAULT_SIMULATOR
from vlaeval.envs.episodes import Episode
from vlaeval.rollouts.engine import ROLLOUT_ENGINE_VERSION
from vlaeval.rollouts.outcomes import EpisodeOutcome


def episode_key(
    checkpoint_sha256: str, episode: Episode, controls: Mapping[str, Any], simulator: str = DEFAULT_SIMULATOR
) -> str:
    """The digest an episode's outcome is cached under (task_index is left out: it indexes an
    instruction table, the task name is what matters), with the simulator's identity (Meta-World:
    its version, under the key it always had)."""
    from vlaeval.envs import simulator as registered_simulator

    spec = {k: v for k, v in episode.spec().items() if k != "task_index"}
    return sha256_json(
        {
            "engine": ROLLOUT_ENGINE_VERSION,
            **registered_simulator(simulator).cache_identity(),
            "checkpoint": checkpoint_sha256,
            "episode": spec,
            "controls": dict(controls),
        }
    )


class EpisodeCache:
    """get_many / put_many over a SQLite table (key -> success, unsafe, steps); `enabled=False`
    looks nothing up and stores nothing."""

    def __init__(self, root: str | Path, enabled: bool = True) -> None:
        self.path = Path(root) / "rollouts" / "episodes.sqlite"
        self.enabled = bool(enabled)
        self.hits = 0
        self.misses = 0

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, timeout=60)
        connection.execute(
            "CREATE TABLE IF NOT EXISTS episodes (key TEXT PRIMARY KEY, checkpoint TEXT NOT NULL, "
            "success INTEGER NOT NULL, unsafe INTEGER NOT NULL, steps INTEGER NOT NULL)"
        )
        return connection

    def get_many(self, keys: Sequence[str]) -> Dict[str, EpisodeOutcome]:
        if not self.enabled:
            self.misses += len(set(keys))
            return {}
        found: Dict[str, EpisodeOutcome] = {}
        with self._connect() as connection:
            for start in range(0, len(keys), 500):  # SQLite's bound-parameter limit
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                for key, success, unsafe, steps in connection.execute(
                    f"SELECT key, success, unsafe, steps FROM episodes WHERE key IN ({marks})", chunk
                ):
                    found[key] = EpisodeOutcome(bool(success), bool(unsafe), int(steps))
        connection.close()
        self.hits += len(found)
        self.misses += len(set(keys)) - len(found)
        return found

    def put_many(self, rows: Iterable[Tuple[str, str, EpisodeOutcome]]) -> None:
        """rows: (key, checkpoint sha256, outcome), stored in one transaction."""
        if not self.enabled:
            return
        values: List[Tuple[str, str, int, int, int]] = [
            (key, checkpoint, int(o.success), int(o.unsafe), int(o.steps)) for key, checkpoint, o in rows
        ]
        if not values:
            return
        with self._connect() as connection:
            connection.executemany("INSERT OR REPLACE INTO episodes VALUES (?, ?, ?, ?, ?)", values)
        connection.close()

    def stats(self) -> Dict[str, Optional[float]]:
        looked_up = self.hits + self.misses
        return {
            "episodes_from_cache": self.hits,
            "episodes_run": self.misses,
            "hit_rate": self.hits / looked_up if looked_up else None,
        }
