"""Composing conf/ in-process, and the small presets the tests use."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

import vlaeval.config  # noqa: F401  (registers the schemas)

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
MAIN = REPO / "main.py"

# A residual audit in seconds: two tasks, a small policy trained briefly, 16 anchors x 16 seeds.
AUDIT_SMALL = [
    "data=tiny",
    "model=tiny_vla_small",
    "train.steps=40",
    "train.batch_size=32",
    "train.log_every=10",
    "gradients.num_anchors=16",
    "gradients.seeds=${range:100,116}",
    "gate=smoke",
    "audit.permutations=500",
]
GAUNTLET_SMALL = ["job=gauntlet", "strata=small", "gauntlet.plot=false"]
# The importance-sampling ablation in seconds, on AUDIT_SMALL's policy: 4 proposals x 2 seeds x 20
# steps, the gradient moments at steps 0, 10, 20 on 2 judge draws and 4 minibatches.
ABLATION_SMALL = [
    *AUDIT_SMALL,
    "job=ablation",
    "ablation.proposals=[uniform,residual,residual_flow_time,adaptive_flow_time]",
    "ablation.seeds=[0,1]",
    "ablation.steps=20",
    "ablation.measure_every=10",
    "ablation.judge_draws=2",
    "ablation.build_draws=4",
    "ablation.minibatches=4",
    "ablation.batch_size=32",
    "ablation.heldout_every=10",
    "ablation.heldout_episodes_per_task=1",
    "evaluate.episodes_per_task=1",
    "estimator.samples_per_estimator=8",
]


def for_job(job: str, overrides: Sequence[str]) -> List[str]:
    """A shared test preset (AUDIT_SMALL, a rollout gauntlet's QUIET) cut to what `job` reads: a job
    refuses an override of a section it does not read (vlaeval.jobs.check_overrides_are_read)."""
    from vlaeval.config import POLICY_SECTIONS, SHARED_SECTIONS
    from vlaeval.jobs import job_module, reads
    from vlaeval.tracking import override_key

    sections = set(reads(job_module(job))) | set(SHARED_SECTIONS) | {"hydra"}
    if any(o.startswith("outcomes=rollout") for o in overrides):
        sections |= set(POLICY_SECTIONS)  # a source that runs policies reads their sections
    return [o for o in overrides if override_key(o).split(".")[0] in sections]


def compose_config(
    overrides: Sequence[str] = (), *, output_dir: Optional[Path] = None, cache_dir: Optional[Path] = None
) -> DictConfig:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=list(overrides))
    with open_dict(cfg):
        if output_dir is not None:
            cfg.paths.output_dir = str(output_dir)
        if cache_dir is not None:
            cfg.paths.cache_dir = str(cache_dir)
    return cfg


def as_job(cfg: DictConfig, job: str, overrides: Sequence[str] = ()):
    """The typed config job `job` is given for the composed `cfg`, made as dispatch makes it
    (vlaeval.jobs.typed_config: cut, checked, converted once)."""
    import tempfile

    from vlaeval.jobs import typed_config

    with open_dict(cfg):
        cfg.job.name = job
        if OmegaConf.is_interpolation(cfg.paths, "output_dir"):  # Hydra's run directory: none in-process
            cfg.paths.output_dir = tempfile.mkdtemp(prefix="vlaeval-test-")
    return typed_config(cfg, list(overrides))


def gauntlet_inputs_of(cfg: DictConfig):
    """vlaeval.gauntlet.inputs.gauntlet_inputs on the typed sections job=gauntlet is given."""
    from vlaeval.gauntlet.inputs import gauntlet_inputs

    typed = as_job(cfg, "gauntlet")
    return gauntlet_inputs(typed.gauntlet, typed.strata, typed.effects, typed.outcomes)


def typed_gauntlet(cfg: DictConfig):
    settings = OmegaConf.to_object(cfg.gauntlet)
    strata = {k: OmegaConf.to_object(v) for k, v in cfg.strata.items()}
    from vlaeval.gauntlet.inputs import planted_effects

    return settings, strata, planted_effects(cfg.effects)


def builtin_policy(cfg: DictConfig):
    """(data, policy handle) the way the jobs obtain them: recorded and trained on first use."""
    from vlaeval.policy.builtin import PolicySpec, obtain_policy, prepare_data

    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    return data, obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
