"""Every config group composes; typos and wrong types fail at compose time; the CLI is light."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from helpers.configs import CONF, MAIN, REPO, compose_config, typed_gauntlet
from helpers.reliability import record_outcome
from vlaeval.config import DataLabel, StratumConfig, UserInputError

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("sweep", "hydra", "arm"))
LAUNCHER_TARGETS = {
    "local_processes": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "local_submitit": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "slurm": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "slurm_gpu": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
}


def _options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if (group, option) == ("outcomes", "file"):
        overrides.append("outcomes.path=somewhere.csv")
    cfg = compose_config(overrides)
    settings, strata, effects = typed_gauntlet(cfg)
    assert all(isinstance(s, StratumConfig) for s in strata.values())
    assert all(isinstance(s.data_label, DataLabel) for s in strata.values())
    assert set(effects) <= set(strata)


@pytest.mark.parametrize("preset", _options("hydra/launcher"))
def test_launcher_presets_compose_onto_their_plugins(preset):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=[f"hydra/launcher={preset}"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == LAUNCHER_TARGETS[preset]
    if preset.startswith("slurm"):
        assert launcher.gpus_per_node == (1 if preset == "slurm_gpu" else 0)
        assert launcher.timeout_min == 120 and launcher.partition is None  # the cluster's to set
    if preset == "local_submitit":  # one folder: no race between submitit's controller and its parent
        assert str(launcher.submitit_folder).endswith("/.submitit")
    elif "submitit" in launcher._target_:
        assert str(launcher.submitit_folder).endswith("/.submitit/%j")


@pytest.mark.parametrize("arm", _options("arm"))
def test_each_training_comparison_arm_composes_onto_job_train_and_changes_what_it_names(arm):
    """+arm=<name> on job=train: every arm sets the sampling it is named for (the reference arm
    nothing), and the sweep that runs them lists them all."""
    cfg = compose_config(["job=train", f"+arm={arm}"])
    default = compose_config(["job=train"])
    changed = {k for k in cfg.train if cfg.train[k] != default.train[k]}
    expected = {
        "uniform": set(),
        "uniform_large_batch": {"batch_size"},
        "adaptive_time": {"time_sampling"},
        "adaptive_time_residual": {"time_sampling", "anchor_sampling"},
    }[arm]
    assert changed == expected
    if arm == "uniform_large_batch":
        assert cfg.train.batch_size == 1.5 * default.train.batch_size
    sweep = compose_config(["+sweep=training_comparison"])
    assert sweep.job.name == "train"


@pytest.mark.parametrize("sweep", _options("sweep"))
def test_sweep_presets_compose(sweep):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=[f"+sweep={sweep}"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweeper.params


def test_default_strata_are_the_prototype_priority_order():
    from vlaeval.gauntlet import priority_order

    _, strata, _ = typed_gauntlet(compose_config())
    assert priority_order(strata) == [
        "safety_critical",
        "historical_regressions",
        "new_odd",
        "distribution_shift",
        "rare_events",
        "nominal",
    ]
    assert sum(s.units for s in strata.values()) == 100_000
    assert strata["safety_critical"].related == ["historical_regressions", "rare_events"]


@pytest.mark.parametrize(
    "override",
    [
        "gauntlet.margn_delta=0.1",  # misspelt key
        "strata.safety_critical.unitz=5",  # misspelt nested key
        "tracking.urii=x",
    ],
)
def test_typo_fails_at_compose_time(override):
    with pytest.raises(ConfigCompositionException) as info:
        compose_config([override])
    assert isinstance(info.value.__cause__, (ConfigKeyError, ValidationError)) or "not in" in str(info.value.__cause__)
    record_outcome(
        "configs", f"typo {override}", "fails at compose time against the structured-config schema", kind="bad input"
    )


@pytest.mark.parametrize(
    "override",
    [
        "gauntlet.alpha=abc",
        "gauntlet.budget_units=lots",
        "strata.nominal.data_label=GUESSED",
        "tracking.enabled=maybe",
        # every closed choice set is an Enum: a value outside it fails when the config is composed
        "gauntlet.cluster_order=sorted",
        "gauntlet.bet_rule=kelly",
        "gauntlet.test_mode=bayesian",
        "gauntlet.estimand=median",
        "gauntlet.alarm_fwer=holm",
        "gauntlet.preflight=maybe",
        "strata.nominal.kind=global",
        "checkpoint.kind=url",
        "estimator.kind=magic",
        "gradients.trainable=encoder",
        "outcomes=file outcomes.strata=both",
    ],
)
def test_wrong_type_fails_at_compose_time(override):
    with pytest.raises(ConfigCompositionException):
        compose_config(override.split())
    record_outcome(
        "configs",
        f"wrong type {override}",
        "fails at compose time against the structured-config schema",
        kind="bad input",
    )


def test_typo_on_the_command_line_is_a_clear_hydra_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(MAIN), "gauntlet.margn_delta=0.1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Key 'margn_delta' not in 'GauntletConfig'" in proc.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job"]])
def test_help_and_cfg_do_not_import_mlflow_or_torch(tmp_path, args):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(MAIN), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "hydra" in imported
    assert "mlflow" not in imported and "torch" not in imported and "matplotlib" not in imported
    if args == ["--cfg", "job"]:
        printed = OmegaConf.create(proc.stdout)
        assert printed.job.name == "residual_audit"  # the one default job


def test_readme_commands_exist():
    readme = (REPO / "README.md").read_text()
    assert readme.index("make demo") < 2000 and readme.index("make test") < 2000
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci


def test_make_demo_and_a_bare_command_run_the_one_default_job():
    """`make demo` names no job, so it runs what a bare `vlaeval` runs: the config's default."""
    makefile = (REPO / "Makefile").read_text()
    [recipe] = re.findall(r"^demo:.*\n\t(.*)$", makefile, re.M)
    assert recipe.strip() == "$(PY) main.py", recipe
    assert compose_config([]).job.name == "residual_audit"
    assert (
        "job=residual_audit runs (the default in conf/config.yaml), as `make demo` does"
        in (CONF / "config.yaml").read_text()
    )


def _schema_default(schema, key):
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(schema)}[key]
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    return getattr(value, "value", value)


def test_presets_name_only_what_differs_from_the_schema():
    """The rule for defaults (docs/architecture.md): a schema -- a dataclass in vlaeval/config.py,
    or a component's constructor signature -- holds every default once; an option file in conf/
    names only what differs. A preset repeating a default is a second copy that would silently win."""
    import yaml

    from vlaeval import config as schemas
    from vlaeval.components import BUILTIN_COMPONENTS, SCHEMA_SUFFIX, schema_for

    typed = {
        "gauntlet": schemas.GauntletConfig,
        "gate": schemas.GateConfig,
        "estimator": schemas.EstimatorConfig,
        "checkpoint": schemas.CheckpointConfig,
        "tracking": schemas.TrackingConfig,
    }
    component_schemas = {
        f"{option}{SCHEMA_SUFFIX}": schema_for(target, group)
        for group, options in BUILTIN_COMPONENTS.items()
        for option, target in options.items()
    }
    checked = 0
    for path in sorted(CONF.glob("*/*.yaml")):
        group, raw = path.parent.name, yaml.safe_load(path.read_text()) or {}
        bases = [d for d in raw.pop("defaults", []) if isinstance(d, str)]
        if group in typed:
            schema = typed[group]
        elif bases and bases[0] in component_schemas:
            schema = component_schemas[bases[0]]
        elif group == "strata":
            for name, entry in raw.items():
                for key, value in entry.items():
                    assert value != _schema_default(schemas.StratumConfig, key), (
                        f"{path.name}: {name}.{key} repeats the default"
                    )
                    checked += 1
            continue
        else:
            continue
        for key, value in raw.items():
            assert value != _schema_default(schema, key), (
                f"{path.relative_to(CONF)}: {key}={value!r} repeats the schema's default"
            )
            checked += 1
    assert checked > 40


def test_an_episode_means_the_same_in_evaluation_and_in_rollout_gauntlets():
    """The rollout source's signature is its schema (read without importing it), so it cannot name
    EvaluateConfig's defaults: they are written twice, and this keeps the two the same."""
    from vlaeval.components import static_parameters
    from vlaeval.config import EvaluateConfig

    defaults = {name: default for name, _, default in static_parameters("vlaeval.gauntlet.rollouts.RolloutOutcomes")}
    assert defaults["execute_actions"] == EvaluateConfig.execute_actions
    assert defaults["max_steps"] == EvaluateConfig.max_steps


@pytest.mark.parametrize("job", ["gauntlet", "residual_audit", "ablation"])
def test_a_job_is_given_one_prepared_config_typed_cut_and_read_only(job):
    """What a job runs with is made once at dispatch: cut to the sections it reads, typed by the
    schema, the component's left-out arguments filled in -- and read-only, so a job cannot change a
    setting after it was logged and digested."""
    from omegaconf.errors import ReadonlyConfigError

    from vlaeval.jobs import job_module, job_sections, prepared_config

    prepared = prepared_config(compose_config([f"job={job}"]))
    assert set(prepared) <= {"job", "paths", "tracking", "device", *job_sections(job_module(job), prepared)}
    assert OmegaConf.is_readonly(prepared) and OmegaConf.is_struct(prepared)
    with pytest.raises(ReadonlyConfigError):
        prepared.job.name = "train"
    first = next(key for key in prepared if key not in ("job", "paths", "tracking", "device"))
    with pytest.raises(ReadonlyConfigError):
        OmegaConf.update(prepared, f"{first}.anything", 1, force_add=True)
    if "model" in prepared:  # a component's signature defaults are in what is logged
        assert "encoder_hidden" in prepared.model


def test_every_job_runs_on_its_own_typed_config_made_once_at_dispatch(tmp_path):
    """Each job's run is annotated with its config dataclass (what it reads, and nothing else), each
    field typed as the schema types that section, and returns a JobResult of its own frozen result; dispatch converts once: sections are their
    dataclasses, the job's config is frozen, components stay read-only nodes."""
    import dataclasses
    import typing

    from omegaconf import DictConfig

    from vlaeval.config import Component, JobSettings, VlaevalConfig
    from vlaeval.jobs import available_jobs, job_module, job_schema, typed_config
    from vlaeval.runs import JobResult

    schema_types = typing.get_type_hints(VlaevalConfig)
    assert len(available_jobs()) == 15
    for job in available_jobs():
        module = job_module(job)
        schema = job_schema(module)
        assert issubclass(schema, JobSettings) and schema.__dataclass_params__.frozen, job
        assert typing.get_type_hints(module.run)["cfg"] is schema
        returned = typing.get_type_hints(module.run)["return"]  # JobResult[<its result dataclass>]
        assert typing.get_origin(returned) is JobResult, (job, returned)
        (result_type,) = typing.get_args(returned)
        assert dataclasses.is_dataclass(result_type) and result_type.__dataclass_params__.frozen, (job, result_type)
        for name, hint in typing.get_type_hints(schema).items():
            expected = schema_types[name]
            if expected is typing.Any:  # a `_target_` component
                expected = Component
            assert hint in (expected, typing.Optional[expected]), (job, name, hint, expected)
    with pytest.raises(
        UserInputError,
        match=r"^paths.output_dir cannot be resolved \(.*HydraConfig was not set: .*; set paths.output_dir=<value>$",
    ):
        typed_config(compose_config(["job=residual_audit"]), [])  # composed in-process: no Hydra run directory
    typed = typed_config(compose_config(["job=residual_audit"], output_dir=tmp_path), [])
    assert type(typed).__name__ == "AuditJobConfig"
    assert dataclasses.is_dataclass(typed.train) and dataclasses.is_dataclass(typed.gate)
    assert isinstance(typed.model, DictConfig) and OmegaConf.is_readonly(typed.model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.train = None
    assert not hasattr(typed, "gauntlet")  # a section it does not read is not given


def test_a_run_without_its_config_annotation_is_refused():
    """The negative control of the annotation rule: a job whose run takes an untyped cfg."""
    import types

    from vlaeval.jobs import job_schema

    module = types.ModuleType("vlaeval.jobs.untyped")
    exec("from omegaconf import DictConfig\ndef run(cfg: DictConfig): return {}", module.__dict__)
    with pytest.raises(TypeError, match="must be annotated with its config dataclass"):
        job_schema(module)


def _help_examples():
    """(args, what its comment says) of every example `vlaeval --help` prints."""
    import shlex

    from vlaeval.help import help_text

    text = help_text()
    lines = text[text.index("Examples:") :].splitlines()[1:]
    out = []
    for line in lines:
        if not line.strip().startswith("vlaeval"):
            break
        command, _, comment = line.partition("#")
        out.append((shlex.split(command)[1:], comment.strip()))
    return out


@pytest.mark.parametrize("args,says", _help_examples(), ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_every_help_example_composes_and_every_override_is_read(tmp_path, args, says):
    """Each example composes and its job reads every section it overrides (else the override would
    vanish: `vlaeval effects=catastrophic_safety` once ran the residual audit); the gauntlet's do what
    their comment says."""
    from vlaeval.jobs import prepared_config, typed_config

    overrides = [a for a in args if a != "-m"]
    overrides = [re.sub(r"=range\((\d+),\d+\)$", r"=\1", o).replace("<id>", "0" * 32) for o in overrides]
    overrides = [o.replace("<dir>", str(tmp_path)) for o in overrides]
    cfg = compose_config(overrides, output_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    job_cfg = prepared_config(cfg, overrides)
    if str(job_cfg.job.name) == "gauntlet" and "+sweep" not in " ".join(overrides):  # cheap: run it
        from vlaeval.jobs import gauntlet

        ran = compose_config([*overrides, "tracking=disabled"], output_dir=tmp_path / "run", cache_dir=tmp_path / "c")
        result = gauntlet.run(typed_config(ran, overrides))
        halted = any(e.event == "CATASTROPHIC_HALT" for e in result.result.events)
        assert halted == ("halts" in says), (args, says, [e.event for e in result.result.events])


def test_an_override_of_a_section_the_job_does_not_read_is_refused():
    from vlaeval.errors import UserInputError
    from vlaeval.jobs import prepared_config

    for overrides, needle in (
        (["effects=catastrophic_safety"], "job=residual_audit does not read the effects section"),
        (["job=gauntlet", "model=tiny_dit"], "job=gauntlet does not read the model section"),
        (["job=gauntlet", "+estimator.seeds=[1]"], "does not read the estimator section"),
    ):
        with pytest.raises(UserInputError, match=re.escape(needle)):
            prepared_config(compose_config(overrides), overrides)
    # The control: the same overrides where the job reads them pass.
    prepared_config(compose_config(["job=gauntlet", "effects=catastrophic_safety"]), ["effects=catastrophic_safety"])
    prepared_config(compose_config(["job=gauntlet", "outcomes=rollout_small", "model=tiny_dit"]), ["model=tiny_dit"])
