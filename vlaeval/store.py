"""One content-addressed store for what vlaeval builds once and reuses: the built-in demonstrations,
the built-in checkpoints and the gradient artifacts (the gauntlet's outcome arrays use the same
rules in vlaeval/gauntlet/cache.py, with hit statistics; rollout episodes live in a SQLite table).

The rules, the same for every kind: an entry's address is a digest of everything that determines it
(`key`: the caller's sha256 of its config, code version and inputs), under `<root>/<kind>/<key>/`;
its files are written atomically; a reader verifies what it reads and raises on anything wrong, and
a rejected entry is reported and rebuilt, never trusted; jobs that want the same entry at the same
time build it once (a file lock), the others wait and read it. `get_or_build` and `put` are the only
writers of an entry.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from pathlib import Path
from typing import BinaryIO, Callable, Sequence, Tuple, TypeVar

from filelock import FileLock

from vlaeval.artifacts import atomic_write_bytes
from vlaeval.errors import first_line

log = logging.getLogger(__name__)
T = TypeVar("T")


def entry_folder(root: str | os.PathLike, kind: str, key: str) -> Path:
    return Path(root) / kind / key


def get_or_build(
    root: str | os.PathLike,
    kind: str,
    key: str,
    files: Sequence[str],
    read: Callable[[Path], T],
    build: Callable[[Path], T],
) -> Tuple[T, bool]:
    """(value, built_now): `read(folder)` when the entry's `files` are all there and it verifies,
    else `build(folder)`, which writes them (atomically) and returns the value."""
    folder = entry_folder(root, kind, key)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / ".lock"):
        if all((folder / name).is_file() for name in files):
            try:
                return read(folder), False
            except Exception as error:  # a damaged entry is reported and rebuilt, never trusted
                log.warning("cached %s at %s rejected (%s): rebuilding it", kind, folder, first_line(error))
        return build(folder), True


def put(
    root: str | os.PathLike,
    kind: str,
    key: str,
    sources: Sequence[Path],
    read: Callable[[Path], object],
) -> Tuple[Path, bool]:
    """(entry folder, filled_now): an entry filled with files a job built elsewhere (job=train's
    checkpoint fills the built-in slot its config names), each copied atomically under the entry's
    lock. An entry whose files are there and pass `read` is kept as it is; a damaged one is replaced."""

    def fill(folder: Path) -> object:
        for source in sources:
            atomic_write_bytes(folder / Path(source).name, functools.partial(_copy_from, Path(source)))
        return None

    _, filled = get_or_build(root, kind, key, [Path(source).name for source in sources], read=read, build=fill)
    return entry_folder(root, kind, key), filled


def _copy_from(source: Path, out: BinaryIO) -> None:
    with open(source, "rb") as handle:
        shutil.copyfileobj(handle, out)
