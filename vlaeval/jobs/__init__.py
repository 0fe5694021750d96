"""One module per job, each exposing `run(cfg: <Job>JobConfig)` -- annotated with its typed config,
a frozen dataclass whose fields are the sections the job reads (vlaeval.config.JobSettings) -- and
COMPONENTS (the `_target_` config groups it builds); main.py dispatches on cfg.job.name. Every
module here is a job: code the jobs share lives outside this package (vlaeval/runs.py and the
library)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import TYPE_CHECKING, Any, List, Sequence, Tuple, Type, get_type_hints

from omegaconf import DictConfig

from vlaeval.config import JobSettings
from vlaeval.config import job_sections as schema_sections
from vlaeval.errors import UserInputError

if TYPE_CHECKING:
    from vlaeval.runs import JobResult


def available_jobs() -> list[str]:
    import vlaeval.jobs as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__))


def job_module(name: str) -> ModuleType:
    if name not in available_jobs():
        raise UserInputError(f"unknown job {name!r}; choose one of: {', '.join(available_jobs())}")
    return importlib.import_module(f"vlaeval.jobs.{name}")


def job_schema(module: ModuleType) -> Type[JobSettings]:
    """The job's typed config: the annotation of its `run`'s `cfg` (one source for what it reads)."""
    schema = get_type_hints(module.run).get("cfg")
    if not (isinstance(schema, type) and issubclass(schema, JobSettings)):
        raise TypeError(
            f"{module.__name__}.run must be annotated with its config dataclass, a subclass of "
            f"vlaeval.config.JobSettings (def run(cfg: <Job>JobConfig)); it is {schema!r}"
        )
    return schema


def reads(module: ModuleType) -> Tuple[str, ...]:
    """The sections a job always reads besides job, paths and tracking (its config's required fields)."""
    return schema_sections(job_schema(module))


def job_sections(module: ModuleType, cfg: DictConfig) -> Tuple[str, ...]:
    """The sections a job reads: its config's required fields, and those it reads when present -- the
    policy sections when its outcome source runs policies (a source whose constructor takes the run
    context: outcomes=rollout)."""
    from vlaeval.gauntlet.inputs import accepts_context

    sections = reads(module)
    if "outcomes" in sections and accepts_context(cfg.outcomes):
        sections += schema_sections(job_schema(module), optional=True)
    return sections


def job_config(cfg: DictConfig) -> DictConfig:
    """The composed config cut to what its job reads (vlaeval.config.job_config)."""
    from vlaeval.config import job_config as cut

    return cut(cfg, job_sections(job_module(str(cfg.job.name)), cfg))


def check_overrides_are_read(cfg: DictConfig, sections: Sequence[str], overrides: Sequence[str]) -> None:
    """Refuse, in one line, a command-line override of a config section the job does not read (it
    would be cut from the job's config and vanish: `vlaeval effects=catastrophic_safety` ran the
    residual audit), naming the jobs that read it. Groups that are no section (+sweep, +arm) pass."""
    from vlaeval.config import SHARED_SECTIONS
    from vlaeval.tracking import override_key

    job = str(cfg.job.name)
    for override in overrides:
        key = override_key(override)
        section = key.split(".", 1)[0].split("@", 1)[0]
        if section in SHARED_SECTIONS or section in sections or section not in cfg or section == "hydra":
            continue
        readers = [name for name in available_jobs() if section in reads(job_module(name))]
        also = "" if "outcomes" not in sections else " (or, for a policy section, an outcome source that runs policies)"
        raise UserInputError(
            f"{override}: job={job} does not read the {section} section, so the override would do nothing; "
            + (f"it is read by job={', job='.join(readers)}{also}" if readers else "no job reads it")
            + f"; add job=<one of them>, or drop {key}"
        )


def command_line_overrides() -> List[str]:
    """The run's overrides as typed on the command line (none outside a Hydra run: tests, reproduce)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return [str(o) for o in HydraConfig.get().overrides.task]
    except ValueError:  # no Hydra run: the config was composed in-process
        return []


def prepared_config(cfg: DictConfig, overrides: Sequence[str] | None = None) -> DictConfig:
    """The config a job is given, made once: checked (no unknown key, every component against its
    signature, its left-out arguments filled in from the signature), cut to the sections the job
    reads (all it logs and digests), typed by the schema, in struct mode and read-only, so what a
    run logs is what it ran with."""
    from omegaconf import OmegaConf

    from vlaeval.components import complete_components
    from vlaeval.config import check_known_keys

    module = job_module(str(cfg.job.name))
    check_known_keys(cfg)
    typed = command_line_overrides() if overrides is None else overrides  # (given: a test's, or a help example's)
    check_overrides_are_read(cfg, job_sections(module, cfg), typed)
    job_cfg = job_config(cfg)
    if "device" in job_cfg:  # before any work: a GPU this machine lacks is one line, not a traceback
        from vlaeval.devices import check_device

        check_device(str(job_cfg.device))
    from vlaeval.tracking.store import check_backend

    check_backend(str(job_cfg.tracking.backend))  # before any work, tracked or not: a typo is a typo
    if "simulator" in job_cfg:  # a name the registry lacks: one line, before any work
        from vlaeval.envs import check_simulator

        check_simulator(str(job_cfg.simulator))
    complete_components(job_cfg, module.COMPONENTS)
    OmegaConf.set_readonly(job_cfg, True)
    return job_cfg


def typed_config(cfg: DictConfig, overrides: Sequence[str] | None = None) -> JobSettings:
    """The job's typed config (its run's annotation), made once from its prepared config."""
    from vlaeval.config import typed_job_config

    return typed_job_config(job_schema(job_module(str(cfg.job.name))), prepared_config(cfg, overrides))


def dispatch(cfg: DictConfig, overrides: Sequence[str] | None = None) -> "JobResult[Any]":
    """Run the job `cfg.job.name` on its typed config; `overrides`: what the config was composed
    with (None: this Hydra run's command line; a nested run, job=reproduce's, passes its own)."""
    return job_module(str(cfg.job.name)).run(typed_config(cfg, overrides))
