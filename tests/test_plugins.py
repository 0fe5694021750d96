"""Plug-in doors: a user's own policy and outcome source, each a class of their own with its own
constructor arguments and a config file on Hydra's search path -- as a user would add them. Every
argument is checked against the class's signature before any work (one line naming it); the
arguments the config leaves out are filled in from the signature, so the logged config and the
digests see them."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from helpers.configs import AUDIT_SMALL, REPO
from helpers.processes import run_main
from helpers.reliability import record_outcome

USER_PACKAGE = {
    "team_vla/__init__.py": "",
    "team_vla/policy.py": '''
        from vlaeval.policy.tiny_vla import TinyVLA


        import torch


        class HalfPolicy(torch.nn.Module):
            """A policy that forgot the action expert: no velocity, no trainable_parameters."""

            def __init__(self, vocab, obs_dim, action_dim, horizon):
                super().__init__()
                self.horizon, self.action_dim = horizon, action_dim
                self.encoder = torch.nn.Linear(obs_dim, 8)

            def encode(self, batch):
                return self.encoder(batch["observation"])


        class WidePolicy(TinyVLA):
            """A team's policy with constructor arguments of its own."""

            def __init__(self, vocab, obs_dim, action_dim, horizon, *, width: int = 64, depth: int = 2):
                super().__init__(vocab, obs_dim, action_dim, horizon, encoder_hidden=width, conditioning_dim=width // 2,
                                 head_hidden=width, head_layers=depth, time_embedding_dim=8)
                self.width = width
        ''',
    "team_vla/outcomes.py": '''
        from vlaeval.gauntlet.outcomes import SyntheticOutcomes


        class SiteOutcomes(SyntheticOutcomes):
            """A team's outcome source: here the synthetic one, labelled with the site it stands for."""

            def __init__(self, site: str, replay_speed: float = 1.0):
                self.site = site
                self.replay_speed = replay_speed

            def describe(self):
                return {**super().describe(), "kind": f"site-{self.site}"}


        class HalfRecordingOutcomes(SyntheticOutcomes):
            """Records its episodes for the paired-outcome file but forgot the registry and stats."""

            def __init__(self):
                self.rows = []

            def paired_outcomes_table(self):
                return self.rows

            def failures(self):
                return []


        class CountingOutcomes(SyntheticOutcomes):
            """Counts the units it is asked for: a refused source must never be asked for one."""

            asked = 0
            batch_units = "48"  # a trait of the wrong type

            def produce(self, request, clusters, cache):
                type(self).asked += len(clusters)
                return super().produce(request, clusters, cache)
        ''',
}
USER_CONFIGS = {
    "model/wide.yaml": "_target_: team_vla.policy.WidePolicy\nwidth: 48\n",
    "model/wide_typo.yaml": "_target_: team_vla.policy.WidePolicy\nwidht: 48\n",
    "outcomes/site.yaml": "_target_: team_vla.outcomes.SiteOutcomes\nsite: lab-1\n",
    "outcomes/site_unnamed.yaml": "_target_: team_vla.outcomes.SiteOutcomes\n",
    "model/missing.yaml": "_target_: team_vla.nowhere.Policy\n",
    "outcomes/half_recording.yaml": "_target_: team_vla.outcomes.HalfRecordingOutcomes\n",
    "outcomes/counting.yaml": "_target_: team_vla.outcomes.CountingOutcomes\n",
    "model/half.yaml": "_target_: team_vla.policy.HalfPolicy\n",
}
TRAIN_SMALL = ["data=tiny", "train.steps=20", "train.batch_size=32", "train.evaluate_after=false", "tracking=disabled"]


@pytest.fixture
def user(tmp_path):
    """(working folder, the Hydra override naming the user's config folder, env with PYTHONPATH)."""
    for relative, text in USER_PACKAGE.items():
        path = tmp_path / "code" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for relative, text in USER_CONFIGS.items():
        path = tmp_path / "team_conf" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    return work, f"hydra.searchpath=[file://{tmp_path / 'team_conf'}]", {"PYTHONPATH": str(tmp_path / "code")}


def test_a_users_policy_with_its_own_arguments_trains(user):
    work, searchpath, env = user
    proc = run_main(["job=train", "model=wide", "model.width=40", searchpath, *TRAIN_SMALL], work, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = (work / "outputs").glob("*_train")
    result = json.loads((run_dir / "result.json").read_text())
    sidecar = json.loads((run_dir / "model.json").read_text())
    # The argument the YAML left out is filled in from the signature: logged, and in the checkpoint key.
    assert sidecar["config"]["model"] == {"_target_": "team_vla.policy.WidePolicy", "width": 40, "depth": 2}
    assert result["parameters"] > 0 and "trained" in proc.stdout


@pytest.mark.parametrize(
    "config,extra,needle",
    [
        (
            "model=wide_typo",
            [],
            "model.widht is not an argument of team_vla.policy.WidePolicy(vocab, obs_dim, action_dim, "
            "horizon, *, width: int = 64, depth: int = 2); did you mean width?",
        ),
        ("model=wide", ["+model.vocab=[a]"], "model.vocab is supplied by vlaeval when it builds the model"),
        (
            "model=wide",
            ["model.width=64x"],
            "model.width='64x' is not of type int, as team_vla.policy.WidePolicy(vocab, obs_dim, action_dim, horizon, "
            "*, width: int = 64, depth: int = 2) asks",
        ),
        ("model=wide", ["+model.depth=2.5"], "model.depth=2.5 is not of type int"),
        ("model=missing", [], "model._target_=team_vla.nowhere.Policy cannot be imported (ModuleNotFoundError"),
        (
            "model=half",
            [],
            "model._target_=team_vla.policy.HalfPolicy lacks velocity, trainable_parameters of the "
            "FlowMatchingPolicy protocol",
        ),
    ],
)
def test_a_bad_policy_config_is_one_line_naming_the_signature(user, config, extra, needle):
    work, searchpath, env = user
    proc = run_main(["job=train", config, searchpath, *extra, *TRAIN_SMALL], work, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (work / "outputs").exists() or not any((work / "outputs").iterdir())  # nothing written
    record_outcome(
        "configs",
        f"user component: {config} {' '.join(extra)}".strip(),
        f"exit 2 before any work: `{lines[0]}`",
        kind="bad input",
    )


def test_a_users_outcome_source_runs_the_gauntlet(user):
    work, searchpath, env = user
    # An argument the file leaves out is added with + (and still checked against the signature).
    proc = run_main(
        [
            "job=gauntlet",
            "outcomes=site",
            "+outcomes.replay_speed=2.0",
            searchpath,
            "strata=small",
            "gauntlet.plot=false",
            "tracking=disabled",
        ],
        work,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = (work / "outputs").glob("*_gauntlet")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["lineage"]["data_source"]["kind"] == "site-lab-1"
    assert result["recommendation"]["recommendation"] in ("LAUNCH", "NEEDS_REVIEW")
    unnamed = run_main(
        ["job=gauntlet", "outcomes=site_unnamed", searchpath, "strata=small", "tracking=disabled"], work, env=env
    )
    assert unnamed.returncode == 2
    assert (
        "outcomes misses argument site of team_vla.outcomes.SiteOutcomes(site: str, replay_speed: float = 1.0)"
        in unnamed.stderr
    )


def test_builtin_component_schemas_are_their_signatures():
    """The schemas generated from the source (without importing it) match inspect.signature."""
    import inspect

    from vlaeval.components import BUILTIN_COMPONENTS, RUNTIME_ARGUMENTS, import_target, static_parameters

    for group, options in BUILTIN_COMPONENTS.items():
        for target in options.values():
            signature = inspect.signature(import_target(target, group))
            expected = [(n, p.default) for n, p in signature.parameters.items()]
            expected = [(n, list(d) if isinstance(d, tuple) else d) for n, d in expected]
            assert [(n, d) for n, _, d in static_parameters(target)] == expected, target
            assert not set(RUNTIME_ARGUMENTS.get(group, ())) - set(signature.parameters)


def _readme_adapter():
    """The documented adapter (docs/extending.md) and its config, exactly as written there."""
    text = (REPO / "docs" / "extending.md").read_text()
    section = text[text.index("<!-- adapter:") :]
    code = re.search(r"```python\n# my_code/my_team/adapter.py\n(.*?)```", section, re.S).group(1)
    config = re.search(r"```yaml\n# my_conf/model/my_policy.yaml\n(.*?)```", section, re.S).group(1)
    return code, config


def test_the_readme_adapter_is_audited_end_to_end(tmp_path):
    """The adapter sees and reads: trained on the corner camera's pixels and its own word ids, audited."""
    code, config = _readme_adapter()
    assert len(code.strip().splitlines()) <= 45
    (tmp_path / "my_code" / "my_team").mkdir(parents=True)
    (tmp_path / "my_code" / "my_team" / "__init__.py").write_text("")
    (tmp_path / "my_code" / "my_team" / "adapter.py").write_text(code)
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "my_policy.yaml").write_text(config)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_main(
        [
            "job=residual_audit",
            "model=my_policy",
            f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
            "tracking=disabled",
            *[o for o in AUDIT_SMALL if not o.startswith(("model=", "data="))],
            "data=tiny_vision",
            "gradients.trainable=all",
            f"hydra.run.dir={work / 'audit'}",
        ],
        work,
        env={"PYTHONPATH": str(tmp_path / "my_code"), "VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((work / "audit" / "result.json").read_text())
    assert result["sample_count"] == 16 and "Residual audit gate" in proc.stdout
    methods = result["gradient_artifact"]["layer_methods"]
    assert methods["net.vision.0"] == "conv2d_outer" and methods["net.words"] == "functional_vjp"
    assert methods["net.head.0"] == methods["net.prefix.0"] == "linear_rows"


@pytest.mark.parametrize(
    "config,needle",
    [
        (
            "outcomes=half_recording",
            "outcome source HalfRecordingOutcomes implements paired_outcomes_table, failures but not stats, registry: "
            "RecordsEpisodes (the OutcomeSource protocol (vlaeval/gauntlet/sources.py)) is all of "
            "paired_outcomes_table, failures, stats, registry or none",
        ),
        ("outcomes=counting", "outcome source CountingOutcomes declares batch_units='48'; SourceTraits"),
    ],
)
def test_a_source_that_half_implements_a_capability_is_refused_before_work(user, config, needle):
    """A user source claiming a hook it does not fully implement fails when it is built -- not with
    an AttributeError after every unit was produced (the review's finding)."""
    work, searchpath, env = user
    proc = run_main(["job=gauntlet", config, searchpath, "strata=small", "tracking=disabled"], work, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (work / "outputs").exists() or not any((work / "outputs").iterdir())  # nothing written
    record_outcome(
        "configs", f"user outcome source: {config}", f"exit 2 before any work: `{lines[0]}`", kind="bad input"
    )


def _kv_adapter():
    """The documented KV-cache / loss-level adapter (docs/extending.md), exactly as written there."""
    text = (REPO / "docs" / "extending.md").read_text()
    section = text[text.index("<!-- adapter (KV cache") :]
    return re.search(r"```python\n# my_code/my_team/prefix_vla.py\n(.*?)```", section, re.S).group(1)


# The rollout gauntlet on two of rollout_small's strata, its baseline trained 60 steps: the twins must
# meet the same episodes and act alike on them, which a safety and a nominal stratum show as well as five.
TWO_STRATA = [
    "~outcomes.scenarios.new_odd",
    "~outcomes.scenarios.rare_events",
    "~outcomes.scenarios.distribution_shift",
    "outcomes.policies.baseline.train.steps=60",
]


def test_a_vla_conditioned_on_keys_and_values_and_its_loss_level_twin_agree_through_audit_and_gauntlet(tmp_path):
    """A conditioning that is a dict of per-layer keys and values (not a tensor), and the same network
    as LeRobot packages it (loss and predict_action_chunk only): each trained, audited (scores and
    exact gradient norms) and run through the rollout gauntlet -- and the two agree draw for draw."""
    (tmp_path / "my_code" / "my_team").mkdir(parents=True)
    (tmp_path / "my_code" / "my_team" / "__init__.py").write_text("")
    (tmp_path / "my_code" / "my_team" / "prefix_vla.py").write_text(_kv_adapter())
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    for name, cls in (("prefix_vla", "PrefixVLA"), ("lerobot_style", "LeRobotStyleVLA")):
        (tmp_path / "my_conf" / "model" / f"{name}.yaml").write_text(f"_target_: my_team.prefix_vla.{cls}\nwidth: 32\n")
    env = {"PYTHONPATH": str(tmp_path / "my_code"), "VLAEVAL_CACHE_DIR": str(tmp_path / "cache")}
    common = [f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "tracking=disabled"]
    audited, paired = {}, {}
    for model in ("prefix_vla", "lerobot_style"):
        audit = tmp_path / f"audit_{model}"
        proc = run_main(
            ["job=residual_audit", f"model={model}", *common, *[o for o in AUDIT_SMALL if not o.startswith("model=")],
             f"hydra.run.dir={audit}"],
            tmp_path,
            env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        audited[model] = json.loads((audit / "result.json").read_text())
        gauntlet = tmp_path / f"gauntlet_{model}"
        proc = run_main(
            ["job=gauntlet", "outcomes=rollout_small", f"model={model}", *common, *TWO_STRATA,
             f"outcomes.registry={tmp_path / model}.jsonl", f"hydra.run.dir={gauntlet}"],
            tmp_path,
            env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((gauntlet / "result.json").read_text())["scale"]["units_evaluated"] > 0
        paired[model] = sorted((gauntlet / "paired_outcomes.csv").read_text().splitlines())
    kv, loss_level = audited["prefix_vla"], audited["lerobot_style"]
    assert kv["sample_count"] == 16
    methods = kv["gradient_artifact"]["layer_methods"]
    assert methods["query.0"] == methods["expert_out"] == "linear_gram"  # exact, over the chunk's tokens
    for field in ("mean_residual", "gradient_rms"):
        assert [a[field] for a in kv["anchors"]] == [a[field] for a in loss_level["anchors"]], field
    assert paired["prefix_vla"] == paired["lerobot_style"] and len(paired["prefix_vla"]) > 24
