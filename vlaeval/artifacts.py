"""Atomic file writes and content digests.

Every output file is written to a temporary name in the destination directory and renamed into
place (os.replace is atomic on POSIX), so a reader or a killed job never sees half a file.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN/Infinity: write them as null (strict parsers reject the bare tokens)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def canonical_json(payload: Any) -> str:
    """Key-sorted, compact JSON: the byte string that content addresses are taken over."""
    return json.dumps(
        _finite_or_none(payload), sort_keys=True, separators=(",", ":"), default=_json_default, allow_nan=False
    )


def sha256_json(payload: Any) -> str:
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        for chunk in iter(lambda: source.read(8 * 1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def stable_seed(*parts: Any) -> int:
    """A 63-bit integer from a digest of `parts`: identical in every process, unlike hash()."""
    return int.from_bytes(hashlib.sha256(canonical_json(list(parts)).encode()).digest()[:8], "big") >> 1


TEMP_SUFFIX = ".tmp"
# Temporary names carry host and pid, so a later job can tell a dead writer's leftovers (SIGKILL
# skips the clean-up below) from a live writer's file in a shared cache.
_WRITER = f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_temporaries(root: str | os.PathLike) -> list[Path]:
    """Delete temporary files under `root` left by writers on this host that no longer run."""
    removed = []
    host = socket.gethostname()
    for tmp in Path(root).rglob(f".*{TEMP_SUFFIX}") if Path(root).is_dir() else ():
        writer = tmp.name[: -len(TEMP_SUFFIX)].rsplit(".", 2)
        if len(writer) != 3 or not writer[1].startswith(f"{host}-"):
            continue
        try:
            os.kill(int(writer[1][len(host) + 1 :]), 0)
            continue  # its writer is alive
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def atomic_write_bytes(path: str | os.PathLike, write: Callable[[io.BufferedWriter], None]) -> Path:
    """Call write(file) on a temporary file beside `path`, fsync, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_WRITER}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    data = text.encode("utf-8")

    def write(handle: Any) -> None:
        handle.write(data)

    return atomic_write_bytes(path, write)


def atomic_write_json(path: str | os.PathLike, payload: Any) -> Path:
    text = json.dumps(_finite_or_none(payload), indent=2, default=_json_default, allow_nan=False)
    return atomic_write_text(path, text + "\n")


def atomic_write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], *, compress: bool = True) -> Path:
    """compress=False for arrays zlib cannot shrink (packed random bits): it would only cost time."""

    def write(handle: Any) -> None:
        save = np.savez_compressed if compress else np.savez
        save(handle, **dict(arrays))  # type: ignore[arg-type]  # numpy's stub types **kwds as bool

    return atomic_write_bytes(path, write)


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
