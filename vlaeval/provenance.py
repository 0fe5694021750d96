"""Which code produced a result: vlaeval's version and, in a git checkout, its commit and dirty flag."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import vlaeval

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CodeVersion:
    """vlaeval's version and, in a git checkout, its commit and whether it has uncommitted changes
    (None: not a checkout, an installed package)."""

    vlaeval_version: str
    git_sha: Optional[str] = None
    git_dirty: Optional[bool] = None

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@functools.lru_cache(maxsize=1)
def code_version() -> CodeVersion:
    """This code's version (CodeVersion), read once per process."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return CodeVersion(vlaeval.__version__)  # not a checkout (an installed package): the version alone
    return CodeVersion(vlaeval.__version__, sha, bool(status.strip()))
