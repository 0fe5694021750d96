"""One module per job, each exposing run(cfg) -> result dict and COMPONENTS (the `_target_`
config groups it builds); main.py dispatches on cfg.job.name. Every module here is a job: code
the jobs share lives outside this package (vlaeval/runs.py and the library)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Dict

from omegaconf import DictConfig

from vlaeval.errors import UserInputError


def available_jobs() -> list[str]:
    import vlaeval.jobs as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__))


def job_module(name: str) -> ModuleType:
    if name not in available_jobs():
        raise UserInputError(f"unknown job {name!r}; choose one of: {', '.join(available_jobs())}")
    return importlib.import_module(f"vlaeval.jobs.{name}")


def dispatch(cfg: DictConfig) -> Dict[str, Any]:
    """Check the config (no unknown key, every component against its signature), then run the job."""
    from vlaeval.components import complete_components
    from vlaeval.config import check_known_keys

    module = job_module(str(cfg.job.name))
    check_known_keys(cfg)
    complete_components(cfg, getattr(module, "COMPONENTS", ()))
    return module.run(cfg)
