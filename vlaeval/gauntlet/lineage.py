"""Lineage of an evaluation: what was compared, on which data, with which code and config.

A run whose lineage is invalid is never valid for launch, whatever its statistics say.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, List, Mapping

from vlaeval.gauntlet.result import Lineage
from vlaeval.provenance import code_version


def build_lineage(
    *,
    candidate_version: str,
    baseline_version: str,
    data_source: Mapping[str, Any],
    seeds: Mapping[str, Any],
    config_sha256: str,
    cluster_order: str = "",
    require_clean_code: bool = False,
) -> Lineage:
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
    if require_clean_code and code.git_sha is None:
        problems.append("code version is not pinned to a git commit")
    if require_clean_code and code.git_dirty:
        problems.append("code has uncommitted changes")
    return Lineage(
        candidate_version=candidate_version,
        baseline_version=baseline_version,
        data_source=dict(data_source),
        seeds=dict(seeds),
        cluster_order=cluster_order,
        code=code.to_json(),
        config_sha256=config_sha256,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        problems=tuple(problems),
        valid=not problems,
    )
