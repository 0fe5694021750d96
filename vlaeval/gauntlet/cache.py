"""Content-addressed on-disk cache of outcome arrays.

The address is the sha256 of the canonical JSON of everything that determines the arrays (the
caller's key payload, which includes component versions, so a version bump is a miss). Entries
are NPZ written atomically; each stores its key payload and a digest of its array
bytes, and is verified on read: a truncated, bit-flipped or mislabelled entry is reported,
recomputed and rewritten, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

from vlaeval.artifacts import atomic_write_npz, canonical_json, sha256_json

log = logging.getLogger(__name__)

CACHE_SCHEMA_VERSION = 1
_META = "__meta__"

Arrays = Dict[str, np.ndarray]


def arrays_digest(arrays: Arrays) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    corrupt_entries: List[str] = field(default_factory=list)

    def snapshot(self) -> "CacheStats":
        """The counts as they stand now (they go on counting)."""
        return CacheStats(self.hits, self.misses, self.corrupt, list(self.corrupt_entries))


class ArrayCache:
    def __init__(self, root: str | Path, *, enabled: bool = True, namespace: str = "arrays") -> None:
        self.root = Path(root) / namespace
        self.enabled = enabled
        self.stats = CacheStats()

    def key(self, payload: Dict[str, Any]) -> str:
        return sha256_json({"cache_schema_version": CACHE_SCHEMA_VERSION, **payload})

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.npz"

    def get_or_compute(self, payload: Dict[str, Any], compute: Callable[[], Arrays]) -> tuple[Arrays, str]:
        """Return (arrays, status) with status "hit", "miss" or "corrupt" (recomputed)."""
        if not self.enabled:
            return compute(), "disabled"
        key = self.key(payload)
        path = self.path_for(key)
        status = "miss"
        if path.exists():
            arrays, problem = self._read_verified(path, payload)
            if problem is None:
                self.stats.hits += 1
                return arrays, "hit"
            status = "corrupt"
            self.stats.corrupt += 1
            self.stats.corrupt_entries.append(str(path))
            log.warning("cache entry %s is corrupt (%s): recomputing", path, problem)
        self.stats.misses += 1
        arrays = compute()
        meta = {"payload": payload, "key": key, "arrays_sha256": arrays_digest(arrays)}
        meta_bytes = np.frombuffer(canonical_json(meta).encode("utf-8"), dtype=np.uint8)
        # Outcomes are packed bits of random draws: zlib cannot shrink them, and compressing
        # them took a quarter of a 10M-unit gauntlet's time.
        atomic_write_npz(path, {**arrays, _META: meta_bytes}, compress=False)
        return arrays, status

    @staticmethod
    def _read_verified(path: Path, payload: Dict[str, Any]) -> tuple[Arrays, str | None]:
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
            meta = json.loads(arrays.pop(_META).tobytes().decode("utf-8"))
        except Exception as error:  # truncated zip, bad CRC, missing meta, bad JSON ...
            return {}, f"unreadable: {type(error).__name__}: {error}"
        if canonical_json(meta.get("payload")) != canonical_json(payload):
            return {}, "stored key payload differs from the requested one"
        if meta.get("arrays_sha256") != arrays_digest(arrays):
            return {}, "content digest mismatch"
        return arrays, None
