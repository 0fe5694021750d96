"""Fixtures (the helpers the test modules share are in tests/helpers/) and the session hooks that
write docs/reliability.md from the tests' records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.configs import REPO
from helpers.processes import sqlite_uri


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


def pytest_sessionfinish(session, exitstatus):
    """A full run that passed with nothing skipped regenerates docs/reliability.md. Under xdist each
    worker hands its records to the controller (pytest_testnodedown), which writes the file."""
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
    if exitstatus == 0 and full_run and not skipped and reliability.records():
        atomic_write_text(reliability.DOC, reliability.render(reliability.records()))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: collect a finished worker's reliability records."""
    from helpers import reliability

    records = getattr(node, "workeroutput", {}).get("reliability_records")
    if records:
        reliability.add_records(json.loads(records))
