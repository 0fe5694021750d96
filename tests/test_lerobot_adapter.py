"""LeRobot's policy API through vlaeval's one adapter (vlaeval/policy/lerobot_adapter.py), tested
against a class with exactly LeRobot 0.4.4's signatures (tests/helpers/lerobot_signature.py):
lerobot's own policy classes do not import beside torch 2.13 on this machine (they import
torchvision, and the index's torchvision for torch 2.13 is a CUDA build whose operators cannot
register against the CPU torch: "operator torchvision::nms does not exist")."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.configs import AUDIT_SMALL, REPO
from helpers.processes import run_main
from helpers.servers import need, osmesa_installed
from vlaeval.errors import UserInputError
from vlaeval.policy.lerobot_adapter import LeRobotPolicyAdapter

HELPERS = Path(__file__).resolve().parent / "helpers"
sys.path.insert(0, str(HELPERS))
from lerobot_signature import SignaturePolicy, SmolVLAConfig, TaskTokenizer  # noqa: E402

# LeRobot 0.4.4's signatures as its source writes them (ast.unparse of each def's arguments, then
# its return annotation): SmolVLAPolicy's methods (lerobot/policies/smolvla/modeling_smolvla.py) and
# PreTrainedPolicy.from_pretrained (lerobot/policies/pretrained.py).
LEROBOT_0_4_4 = {
    "__init__": ("self, config: SmolVLAConfig, **kwargs", "None"),
    "reset": ("self", "None"),
    "get_optim_params": ("self", "dict"),
    "predict_action_chunk": (
        "self, batch: dict[str, Tensor], noise: Tensor | None=None, **kwargs: Unpack[ActionSelectKwargs]",
        "Tensor",
    ),
    "select_action": (
        "self, batch: dict[str, Tensor], noise: Tensor | None=None, **kwargs: Unpack[ActionSelectKwargs]",
        "Tensor",
    ),
    "forward": ("self, batch: dict[str, Tensor], noise=None, time=None, reduction: str='mean'", "dict[str, Tensor]"),
    "from_pretrained": (
        "cls: builtins.type[T], pretrained_name_or_path: str | Path, *, config: PreTrainedConfig | None=None, "
        "force_download: bool=False, resume_download: bool | None=None, proxies: dict | None=None, "
        "token: str | bool | None=None, cache_dir: str | Path | None=None, local_files_only: bool=False, "
        "revision: str | None=None, strict: bool=False, **kwargs",
        "T",
    ),
}


def test_the_stand_in_keeps_lerobot_0_4_4s_policy_signatures():
    tree = ast.parse((HELPERS / "lerobot_signature.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SignaturePolicy")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    for name, (arguments, returns) in LEROBOT_0_4_4.items():
        assert (ast.unparse(methods[name].args), ast.unparse(methods[name].returns)) == (arguments, returns), name


def adapter(**kwargs):
    torch.manual_seed(0)
    policy = SignaturePolicy(SmolVLAConfig())
    defaults = dict(policy=policy, preprocessor=TaskTokenizer(), observation_convention="metaworld")
    return LeRobotPolicyAdapter(["reach", "the", "goal"], 39, 4, 4, **{**defaults, **kwargs})


def vlaeval_batch(model, b=3):
    g = torch.Generator().manual_seed(0)
    return {
        "observation": torch.randn(b, 39, generator=g),
        "instruction": model.tokenize(["reach the goal", "push the puck", "reach the goal"][:b]),
        "observation.images.corner2": torch.randint(0, 256, (b, 3, 32, 32), generator=g, dtype=torch.uint8),
        "target_actions": torch.randn(b, 4, 4, generator=g),
        "target_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]][:b], dtype=torch.bool),
    }


def test_the_adapter_maps_vlaeval_batches_to_lerobots_keys_in_its_metaworld_convention():
    model = adapter()
    batch = vlaeval_batch(model)
    seen = model.observations(batch)
    assert torch.equal(seen["observation.state"], batch["observation"][:, :4])  # LeRobot's agent_pos
    flipped = batch["observation.images.corner2"].float().flip(-1) / 255  # corner2 as LeRobot's MetaworldEnv shows it
    assert torch.equal(seen["observation.image"], flipped) and 0 <= float(seen["observation.image"].min())
    assert seen["task"] == ["reach the goal", "push the puck", "reach the goal"]

    g = torch.Generator().manual_seed(1)
    t, noise = torch.rand(3, generator=g), torch.randn(3, 4, 4, generator=g)
    losses = model.loss(batch, noise, t)
    assert losses.shape == (3,)
    # The same number LeRobot's forward gives on the batch its processors make, with the action
    # padded to the chunk and max_action_dim and the padding marked.
    lerobot = TaskTokenizer()(dict(seen))
    lerobot["action"] = torch.nn.functional.pad(batch["target_actions"], (0, 0, 0, 4))
    lerobot["action_is_pad"] = torch.nn.functional.pad(~batch["target_mask"], (0, 4), value=True)
    wide = torch.nn.functional.pad(noise, (0, 2, 0, 4))
    expected, _ = model.policy.forward(lerobot, noise=wide, time=t, reduction="none")
    assert torch.equal(losses, expected)
    unmasked = dict(batch, target_mask=torch.ones(3, 4, dtype=torch.bool))
    assert model.loss(unmasked, noise, t)[0] == losses[0] and model.loss(unmasked, noise, t)[1] != losses[1]

    chunk = model.predict_action_chunk(batch, noise)
    assert chunk.shape == (3, 4, 4)
    assert torch.equal(chunk, model.policy.predict_action_chunk(TaskTokenizer()(dict(seen)), noise=wide)[:, :4, :4])
    bounded = adapter(postprocessor=lambda action: action.clamp(-0.25, 0.25)).predict_action_chunk(batch, noise)
    assert float(bounded.abs().max()) <= 0.25 < float(chunk.abs().max())  # the policy's postprocessor applied
    plain = adapter(observation_convention="vlaeval", cameras={"observation.images.corner2": "observation.image"})
    assert plain.observations(batch)["observation.state"].shape == (3, 39)


def test_the_rollout_engine_resets_the_lerobot_policy_before_its_episodes_and_acts_through_it():
    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    from helpers.configs import compose_config
    from vlaeval.envs.episodes import Episode
    from vlaeval.policy.bound import bind_policy
    from vlaeval.rollouts.engine import rollout_lockstep

    model = adapter()
    bound = bind_policy(model, ["reach the goal"], compose_config([]).flow, image_size=32)
    before = model.policy.resets
    episodes = [Episode("reach-v3", 0, 25, 1), Episode("reach-v3", 0, 26, 2)]
    outcomes = rollout_lockstep(bound, episodes, execute_actions=2, max_steps=6)
    assert model.policy.resets == before + 1 and len(outcomes.success) == 2


def test_a_policy_that_is_not_lerobots_is_refused_in_one_line():
    with pytest.raises(UserInputError, match=r"model.policy built a Linear, which is not a LeRobot policy"):
        LeRobotPolicyAdapter([], 39, 4, 4, policy=torch.nn.Linear(2, 2))
    with pytest.raises(UserInputError, match=r"chunk_size=8 is shorter than the data's horizon=12"):
        LeRobotPolicyAdapter([], 39, 4, 12, policy=SignaturePolicy(SmolVLAConfig()))
    with pytest.raises(
        UserInputError, match=r"model.observation_convention=lerobot is not a convention; use vlaeval or metaworld"
    ):
        adapter(observation_convention="lerobot")


def test_a_lerobot_policy_plugs_in_by_target_trains_and_is_audited(tmp_path):
    """A pretrained folder as LeRobot writes one, loaded by its from_pretrained (a nested _target_),
    its processors beside it, Meta-World observations in LeRobot's convention: the built-in
    checkpoint fine-tunes it through its forward, the audit scores it through its forward and
    measures the expert's exact gradient norms by name (closed loop through predict_action_chunk and
    reset: the rollout engine test above)."""
    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    SignaturePolicy(SmolVLAConfig()).save_pretrained(tmp_path / "smolvla_pretrained")
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "lerobot_smolvla.yaml").write_text(
        documented_config()
        .replace("lerobot.policies.smolvla.modeling_smolvla.SmolVLAPolicy", "lerobot_signature.SignaturePolicy")
        .replace("lerobot.processor.PolicyProcessorPipeline", "lerobot_signature.PolicyProcessorPipeline")
        .replace("/ckpt/smolvla_metaworld", str(tmp_path / "smolvla_pretrained"))
    )
    env = {"PYTHONPATH": str(HELPERS), "VLAEVAL_CACHE_DIR": str(tmp_path / "cache")}
    common = [
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "model=lerobot_smolvla",
        "data=tiny_vision",
        "data.cameras=[corner2]",
        "tracking=disabled",
    ]
    audit = [o for o in AUDIT_SMALL if not o.startswith(("data=", "model="))]
    proc = run_main([*common, *audit, f"hydra.run.dir={tmp_path / 'audit'}"], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "audit" / "result.json").read_text())
    methods = result["gradient_artifact"]["layer_methods"]
    assert methods and all(
        name.startswith(("policy.model.vlm_with_expert.lm_expert.", "policy.model.action_")) for name in methods
    )
    assert methods["policy.model.action_out_proj"] == "linear_gram" and len(methods) == 5
    assert np.isfinite([a["mean_residual"] for a in result["anchors"]]).all()


def documented_config() -> str:
    """The model config in docs/extending.md's LeRobot section, exactly as written there."""
    text = (REPO / "docs" / "extending.md").read_text()
    section = text[text.index("<!-- lerobot adapter") :]
    found = re.search(r"```yaml\n# my_conf/model/smolvla_metaworld.yaml\n(.*?)```", section, re.S)
    assert found, "docs/extending.md lost its LeRobot adapter config"
    return found.group(1)
