"""One module per job, each exposing run(cfg) -> result dict; main.py dispatches on cfg.job.name."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Dict

from omegaconf import DictConfig

from vlaeval.config import UserInputError


def available_jobs() -> list[str]:
    import vlaeval.jobs as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name != "common")


def job_runner(name: str) -> Callable[[DictConfig], Dict[str, Any]]:
    if name not in available_jobs():
        raise UserInputError(f"unknown job {name!r}; choose one of: {', '.join(available_jobs())}")
    return importlib.import_module(f"vlaeval.jobs.{name}").run


def dispatch(cfg: DictConfig) -> Dict[str, Any]:
    return job_runner(str(cfg.job.name))(cfg)
