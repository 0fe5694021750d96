"""Shared helpers: compose configs in-process, run main.py in a subprocess, MLflow stores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

import vlaeval.config  # noqa: F401  (registers the schemas)

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
MAIN = REPO / "main.py"


def compose_config(overrides: List[str] = (), *, output_dir: Optional[Path] = None,
                   cache_dir: Optional[Path] = None) -> DictConfig:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=list(overrides))
    with open_dict(cfg):
        if output_dir is not None:
            cfg.paths.output_dir = str(output_dir)
        if cache_dir is not None:
            cfg.paths.cache_dir = str(cache_dir)
    return cfg


def typed_gauntlet(cfg: DictConfig):
    settings = OmegaConf.to_object(cfg.gauntlet)
    strata = {k: OmegaConf.to_object(v) for k, v in cfg.strata.items()}
    effects = {str(k): float(v) for k, v in cfg.effects.items()}
    return settings, strata, effects


def run_main(args: List[str], cwd: Path, env: Optional[Dict[str, str]] = None,
             timeout: int = 600) -> subprocess.CompletedProcess:
    """python main.py <args> in `cwd` (outputs/, multirun_sweeps/ and .cache/ land there)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "VLAEVAL_"))}
    full_env.update({"PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "HYDRA_FULL_ERROR": "0"})
    full_env.update(env or {})
    return subprocess.run([sys.executable, str(MAIN), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path}"


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
    import reliability
    from vlaeval.artifacts import atomic_write_text

    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["reliability_records"] = json.dumps(reliability.records())
        return
    options = session.config.option
    full_run = not options.keyword and not options.markexpr and not getattr(options, "deselect", None) \
        and all(Path(a).resolve() == REPO / "tests" for a in session.config.args)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = bool(reporter and reporter.stats.get("skipped"))
    if exitstatus == 0 and full_run and not skipped and reliability.records():
        atomic_write_text(reliability.DOC, reliability.render(reliability.records()))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: collect a finished worker's reliability records."""
    import reliability

    records = getattr(node, "workeroutput", {}).get("reliability_records")
    if records:
        reliability.add_records(json.loads(records))
