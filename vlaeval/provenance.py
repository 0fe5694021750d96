"""Which code produced a result: vlaeval's version and, in a git checkout, its commit and dirty flag."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any, Dict

import vlaeval

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def code_version() -> Dict[str, Any]:
    """vlaeval's version and, when running from a git checkout, its commit and dirty flag."""
    info: Dict[str, Any] = {"vlaeval_version": vlaeval.__version__, "git_sha": None, "git_dirty": None}
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
        info.update(git_sha=sha, git_dirty=bool(status.strip()))
    except (OSError, subprocess.SubprocessError):
        pass  # not a checkout (an installed package): the version alone identifies the code
    return info
