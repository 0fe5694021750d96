"""Fixtures (the helpers the test modules share are in tests/helpers/) and the session hooks that
check (or, on request, write) docs/reliability.md from the tests' records."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers.configs import REPO
from helpers.processes import sqlite_uri

_reliability_notes: list[str] = []


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    """An empty, fully migrated MLflow SQLite store, created once per session (~7 s)."""
    from vlaeval.tracking import ensure_store

    path = tmp_path_factory.mktemp("store-template") / "mlflow.db"
    ensure_store(sqlite_uri(path))
    return path


@pytest.fixture
def store(migrated_store, tmp_path) -> str:
    """A fresh copy of the migrated store for one test: its tracking URI."""
    path = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, path)
    return sqlite_uri(path)


@pytest.fixture
def workdir(tmp_path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


# The test files that take longest (fresh-clone durations, 2 cores), longest first. `make test` runs
# each file on one of two workers (--dist loadfile) in collection order: started last, a long file
# leaves the other worker idle at the end; started first, the short files fill in beside it.
LONGEST_FIRST = (
    "test_vision_policy.py",
    "test_tracking_server.py",
    "test_rollout_gauntlet.py",
    "test_vlm_vla_jobs.py",
    "test_faults.py",
    "test_plugins.py",
    "test_ablation.py",
    "test_security.py",
    "test_tracking.py",
    "test_rollouts.py",
    "test_ui.py",
    "test_time_sampling.py",
    "test_offline_validity.py",
    "test_cameras.py",
    "test_policy_data.py",
    "test_lerobot.py",
    "test_audit.py",
    "test_lerobot_adapter.py",
)


def pytest_collection_modifyitems(session, config, items):
    """The longest files first (LONGEST_FIRST), the rest in their own order after them."""
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


def pytest_sessionfinish(session, exitstatus):
    """A full run that passed with nothing skipped renders docs/reliability.md and checks it against
    the committed file, or writes it when VLAEVAL_WRITE_RELIABILITY=1 (`make reliability`). Under
    xdist each worker hands its records to the controller (pytest_testnodedown), which does this."""
    from helpers import reliability
    from vlaeval.artifacts import atomic_write_text

    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["reliability_records"] = json.dumps(reliability.records())
        return
    options = session.config.option
    full_run = (
        not options.keyword
        and not options.markexpr
        and not getattr(options, "deselect", None)
        and all(Path(a).resolve() == REPO / "tests" for a in session.config.args)
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = bool(reporter and reporter.stats.get("skipped"))
    if exitstatus != 0 or not full_run or skipped or not reliability.records():
        return
    rendered = reliability.render(reliability.records())
    if os.environ.get("VLAEVAL_WRITE_RELIABILITY") == "1":
        atomic_write_text(reliability.DOC, rendered)
        _reliability_notes.append(f"wrote {reliability.DOC.relative_to(REPO)}")
    elif not reliability.DOC.exists() or reliability.DOC.read_text() != rendered:
        cache = getattr(session.config, "cache", None)  # None under -p no:cacheprovider
        observed = Path(cache.mkdir("reliability") if cache else tempfile.mkdtemp()) / "reliability.md"
        atomic_write_text(observed, rendered)
        _reliability_notes.append(
            f"{reliability.DOC.relative_to(REPO)} is out of date with what the tests observed "
            f"(diff it with {observed}): run `make reliability` and commit it"
        )


def pytest_terminal_summary(terminalreporter):
    for note in _reliability_notes:
        terminalreporter.write_line(f"reliability table: {note}", yellow=True, bold=True)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: collect a finished worker's reliability records."""
    from helpers import reliability

    records = getattr(node, "workeroutput", {}).get("reliability_records")
    if records:
        reliability.add_records(json.loads(records))
