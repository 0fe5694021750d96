"""Lineage of an evaluation: what was compared, on which data, with which code and config.

A run whose lineage is invalid is never valid for launch, whatever its statistics say.
"""

from __future__ import annotations

import functools
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Mapping

import vlaeval

REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def code_version() -> Dict[str, Any]:
    """vlaeval's version and, when running from a git checkout, its commit and dirty flag."""
    info: Dict[str, Any] = {"vlaeval_version": vlaeval.__version__, "git_sha": None, "git_dirty": None}
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=10, check=True).stdout
        info.update(git_sha=sha, git_dirty=bool(status.strip()))
    except (OSError, subprocess.SubprocessError):
        pass  # not a checkout (an installed package): the version alone identifies the code
    return info


def build_lineage(
    *,
    candidate_version: str,
    baseline_version: str,
    data_source: Mapping[str, Any],
    seeds: Mapping[str, int],
    config_sha256: str,
    require_clean_code: bool = False,
) -> Dict[str, Any]:
    code = code_version()
    problems: List[str] = []
    if not str(candidate_version).strip():
        problems.append("candidate version is empty")
    if not str(baseline_version).strip():
        problems.append("baseline version is empty")
    if str(candidate_version) == str(baseline_version):
        problems.append("candidate and baseline versions are identical")
    if not data_source.get("sha256"):
        problems.append("data source has no content digest")
    if require_clean_code and code["git_sha"] is None:
        problems.append("code version is not pinned to a git commit")
    if require_clean_code and code["git_dirty"]:
        problems.append("code has uncommitted changes")
    return {
        "candidate_version": candidate_version,
        "baseline_version": baseline_version,
        "data_source": dict(data_source),
        "seeds": dict(seeds),
        "code": code,
        "config_sha256": config_sha256,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "problems": problems,
        "valid": not problems,
    }
