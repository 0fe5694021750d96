"""model=smolvlm_vla: transformers' Idefics3 (SmolVLM) as the backbone of a flow-matching VLA whose
action expert attends to the prefix's per-layer keys and values. Built from a config (no download),
on the built-in camera data: its tokenizer, the prefix computed once and reused across denoising
steps, exact per-sample gradient norms through transformers' modules, a VLM saved and loaded from a
local folder, a frozen VLM, and training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.configs import compose_config
from vlaeval.errors import UserInputError
from vlaeval.policy.builtin import PolicySpec, build_model, prepare_data
from vlaeval.policy.vlm_vla import VLMFlowVLA, train_tokenizer

SMALL = ["data=tiny_vision", "model=smolvlm_vla_small", "train.steps=3", "train.batch_size=8", "train.log_every=1"]


@pytest.fixture(scope="module")
def built():
    cfg = compose_config(SMALL)
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir), None)
    return cfg, data, build_model(PolicySpec.of(cfg), data)


def batch_of(data, model, index, dtype=torch.float32):
    policy = data.bind(model, compose_config(SMALL).flow)
    batch = policy.anchor_batch(data.anchors, np.asarray(index))
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


def test_the_tokenizer_is_trained_here_deterministically_and_splits_an_unseen_word():
    words = ["reach", "the", "goal", "push", "puck", "to", "wall", "around"]
    a, b = train_tokenizer(words, 64), train_tokenizer(list(reversed(words)), 64)
    assert a.to_str() == b.to_str()  # the same tokenizer whatever the order it was handed the words in
    pieces = a.encode("reaching the puck").tokens
    assert "<unk>" not in pieces and len(pieces) > 3  # an unseen word in pieces it knows, not dropped


def test_the_prefix_runs_once_and_every_denoising_step_reuses_its_keys_and_values(built):
    _, data, model = built
    model.eval()
    batch = batch_of(data, model, range(4))
    with torch.no_grad():
        prefix = model.encode(batch)
        kv = prefix.kv
        assert len(kv) == model.vlm.config.text_config.num_hidden_layers
        assert kv[0][0].shape[0] == 4 and prefix.pad.shape == (4, kv[0][0].shape[2])
        x = torch.randn(4, model.horizon, model.action_dim, generator=torch.Generator().manual_seed(0))
        reused, recomputed = x.clone(), x.clone()
        for k in range(5):
            t = torch.full((4,), 1 - k / 5)
            reused = reused - model.velocity(prefix, reused, t) / 5
            recomputed = recomputed - model.velocity(model.encode(batch), recomputed, t) / 5
    assert torch.equal(reused, recomputed)
    # The instruction's padding is masked: extra padding tokens change no velocity.
    longer = dict(batch, instruction=torch.nn.functional.pad(batch["instruction"], (0, 4)))
    with torch.no_grad():
        t = torch.full((4,), 0.5)
        assert torch.allclose(model.velocity(model.encode(longer), x, t), model.velocity(prefix, x, t), atol=1e-5)


@pytest.mark.parametrize("which", ["action_head", "all"])
def test_per_sample_gradient_norms_through_transformers_modules_are_exact(built, which):
    """auto (the Gram form for linear layers, closed forms for the norms, vmap for the rest) against
    the per-sample loop in float64: 1e-10 relative, over the expert and over the whole VLA."""
    import copy

    from vlaeval.policy.flow import FlowConvention
    from vlaeval.residual.gradients import PerSampleGradNorms, only_trainable

    cfg, data, model = built
    model = copy.deepcopy(model).double().eval()
    batch = batch_of(data, model, range(6), torch.float64)
    generator = torch.Generator().manual_seed(1)
    t = torch.rand(6, generator=generator, dtype=torch.float64)
    noise = torch.randn(6, model.horizon, model.action_dim, generator=generator, dtype=torch.float64)
    with only_trainable(model, which) as parameters:
        norms = PerSampleGradNorms(model, parameters, FlowConvention.of(cfg.flow), "auto")
        fast, _ = norms(batch, t, noise)
        slow, _ = norms.loop(batch, t, noise)
        methods = set(norms.layer_methods.values())
    assert float(((fast - slow).abs() / slow.abs()).max()) < 1e-10
    assert "linear_gram" in methods or "linear_rows" in methods
    if which == "all":  # the VLM's own modules: RMSNorm, embeddings, the vision tower's conv
        names = set(norms.layer_methods)
        assert any(n.startswith("vlm.text_model") for n in names) and any(
            n.startswith("vlm.vision_model") for n in names
        )


def test_a_vlm_saved_to_a_folder_loads_with_its_tokenizer_and_can_be_frozen(built, tmp_path):
    cfg, data, model = built
    folder = model.save_vlm(tmp_path / "vlm")
    spec = PolicySpec.of(compose_config([*SMALL, f"model.vlm_path={folder}", "model.freeze_vlm=true"]))
    loaded = build_model(spec, data)
    assert isinstance(loaded, VLMFlowVLA)
    for (name, a), b in zip(model.vlm.state_dict().items(), loaded.vlm.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded.tokenize(["push the puck"]).tolist() == model.tokenize(["push the puck"]).tolist()
    assert not any(p.requires_grad for p in loaded.vlm.parameters())
    trainable = {id(p) for p in loaded.trainable_parameters("all")}
    assert trainable and not any(id(p) in trainable for p in loaded.vlm.parameters())

    from vlaeval.policy.training import train_policy

    before = {k: v.clone() for k, v in loaded.vlm.state_dict().items()}
    run = train_policy(data.bind(loaded, cfg.flow), data.anchors, spec.train)
    assert run.final_loss is not None and np.isfinite(run.final_loss)
    assert all(torch.equal(before[k], v) for k, v in loaded.vlm.state_dict().items())  # frozen: unchanged

    with pytest.raises(UserInputError, match=r"model.vlm_path=.* is not a saved VLM folder"):
        build_model(PolicySpec.of(compose_config([*SMALL, f"model.vlm_path={tmp_path}"])), data)


def test_bfloat16_autocast_runs_inside_the_policy_and_its_gradient_norms_stay_exact(built):
    """model.autocast=bfloat16 on the CPU (the dtype path a GPU takes): the prefix's keys and values
    are bfloat16, the velocity comes back in the chunk's float32, the loss is the float32 model's to
    bfloat16's precision, per-sample gradient norms under autocast equal the loop's under the same
    autocast (the closed forms widen to float32), and training keeps float32 weights."""
    import copy

    from vlaeval.policy.flow import FlowConvention
    from vlaeval.policy.training import train_policy
    from vlaeval.residual.gradients import PerSampleGradNorms, only_trainable

    cfg, data, model = built
    fp32 = copy.deepcopy(model).eval()
    bf16 = copy.deepcopy(model).eval()
    bf16.autocast = "bfloat16"
    batch = batch_of(data, model, range(6))
    generator = torch.Generator().manual_seed(2)
    t, noise = torch.rand(6, generator=generator), torch.randn(6, model.horizon, model.action_dim, generator=generator)
    flow = FlowConvention.of(cfg.flow)
    with torch.no_grad():
        prefix = bf16.encode(batch)
        assert prefix.kv[0][0].dtype == torch.bfloat16 and bf16.velocity(prefix, noise, t).dtype == torch.float32
        low, high = data.bind(bf16, cfg.flow).losses(batch, t, noise), data.bind(fp32, cfg.flow).losses(batch, t, noise)
    assert not torch.equal(low, high)  # it did run in bfloat16
    assert torch.allclose(low, high, rtol=0.05, atol=1e-3)
    for which in ("action_head", "all"):
        with only_trainable(bf16, which) as parameters:
            norms = PerSampleGradNorms(bf16, parameters, flow, "auto")
            fast, _ = norms(batch, t, noise)
            slow, _ = norms.loop(batch, t, noise)
        assert fast.dtype == torch.float32
        assert float(((fast - slow).abs() / slow).max()) < 1e-3, which
    run = train_policy(data.bind(bf16.train(), cfg.flow), data.anchors, PolicySpec.of(cfg).train)
    assert np.isfinite(run.final_loss) and all(p.dtype == torch.float32 for p in bf16.parameters())
    with pytest.raises(UserInputError, match=r"model.autocast=float8 is not a precision"):
        build_model(PolicySpec.of(compose_config([*SMALL, "model.autocast=float8"])), data)


def test_a_parameter_subset_is_chosen_by_name_and_a_pattern_that_matches_nothing_is_refused(built):
    from vlaeval.config import GradientsConfig
    from vlaeval.residual.gradients import only_trainable, selected_parameters

    _, _, model = built
    selection = GradientsConfig(trainable="all", parameters=["expert.*", "action_out.*"]).selection()
    assert selection == "all:expert.*,action_out.*"
    names = [n for n, _ in selected_parameters(model, selection)]
    assert names and all(n.startswith(("expert.", "action_out.")) for n in names)
    assert set(names) < {n for n, _ in selected_parameters(model, "action_head")}  # narrower than the head
    assert GradientsConfig().selection() == "action_head"
    with only_trainable(model, selection) as parameters:
        assert {id(p) for p in parameters} == {id(p) for p in model.parameters() if p.requires_grad}
    assert all(p.requires_grad for p in model.parameters())  # restored
    with pytest.raises(UserInputError, match=r"'vlm.text.\*' matches none of the .* parameters of .*trainable=all"):
        selected_parameters(model, "all:expert.*,vlm.text.*")


def test_functional_gradients_through_transformers_masks_are_refused_in_one_line(built):
    from vlaeval.residual.gradients import PerSampleGradNorms, only_trainable

    cfg, data, model = built
    batch = batch_of(data, model, range(2))
    t, noise = torch.full((2,), 0.5), torch.zeros(2, model.horizon, model.action_dim)
    with only_trainable(model, "all") as parameters:
        norms = PerSampleGradNorms(model, parameters, cfg.flow, "functional")
        with pytest.raises(UserInputError, match=r"gradients.method=functional cannot vmap VLMFlowVLA's loss"):
            norms(batch, t, noise)


def test_the_gradient_artifact_runs_the_prefix_once_per_anchor_for_all_its_seeds(built):
    """3 seeds x 4 anchors: the VLM encodes 4 rows, not 12, and the expert's per-sample norms are the
    per-row path's and the loop's; with the VLM trainable nothing is shared (its per-sample gradients
    would be summed over a shared prefix)."""
    import copy

    from vlaeval.residual.gradients import PerSampleGradNorms, only_trainable, shared_conditioning

    cfg, data, model = built
    model = copy.deepcopy(model).eval()
    policy = data.bind(model, cfg.flow)
    pair_anchor = np.tile(np.arange(4), 3)
    encoded_rows = []
    encode = model.encode
    model.encode = lambda batch: encoded_rows.append(batch["observation"].shape[0]) or encode(batch)
    generator = torch.Generator().manual_seed(4)
    t, noise = (
        torch.rand(12, generator=generator),
        torch.randn(12, model.horizon, model.action_dim, generator=generator),
    )
    with only_trainable(model, "action_head") as parameters:
        batch, conditioning = shared_conditioning(policy, data.anchors, pair_anchor)
        assert encoded_rows == [1, 4] and conditioning.kv[0][0].shape[0] == 12  # a probe row, then each anchor once
        norms = PerSampleGradNorms(model, parameters, cfg.flow, "auto")
        shared, _ = norms(batch, t, noise, conditioning)
        per_row, _ = norms(batch, t, noise)
        loop, _ = norms.loop(batch, t, noise)
    assert float(((shared - per_row).abs() / per_row).max()) < 1e-5
    assert float(((shared - loop).abs() / loop).max()) < 1e-4
    with only_trainable(model, "all"):
        assert shared_conditioning(policy, data.anchors, pair_anchor)[1] is None


def test_state_dims_keeps_the_object_and_goal_out_of_the_state_token():
    """model.state_dims=4 (hand and gripper, as tiny_vla_vision reads): the rest of the state changes
    nothing, the hand does; null reads all of it and keeps the checkpoint key it had before."""
    from vlaeval.policy.builtin import checkpoint_key, weight_model_settings

    cfg = compose_config([*SMALL, "model.state_dims=4"])
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir), None)
    model = build_model(PolicySpec.of(cfg), data).eval()
    batch = batch_of(data, model, range(4))
    x = torch.randn(4, model.horizon, model.action_dim, generator=torch.Generator().manual_seed(1))
    t = torch.full((4,), 0.5)
    with torch.no_grad():
        before = model.velocity(model.encode(batch), x, t)
        moved = dict(batch, observation=batch["observation"].clone())
        moved["observation"][:, 4:] += 3.0
        assert torch.equal(model.velocity(model.encode(moved), x, t), before)
        moved["observation"][:, :4] += 3.0
        assert not torch.allclose(model.velocity(model.encode(moved), x, t), before)
    default = compose_config(SMALL)
    assert model.state.in_features == 4
    assert checkpoint_key(PolicySpec.of(default), data) != checkpoint_key(PolicySpec.of(cfg), data)
    assert "state_dims" not in weight_model_settings(default.model)  # null: the key as before it existed
    assert weight_model_settings(cfg.model)["state_dims"] == 4
    assert build_model(PolicySpec.of(default), data).state.in_features == data.demonstrations.observations.shape[1]


def test_a_goal_blind_state_policy_never_reads_the_hidden_dims():
    """tiny_vla's model.hidden_state: the hidden dims change nothing; nothing hidden keeps the weights'
    layout and the checkpoint key a policy had before the option existed."""
    from vlaeval.policy.builtin import weight_model_settings

    cfg = compose_config(["data=tiny", "model=tiny_vla_small", "model.hidden_state=[36,37,38]"])
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir), None)
    model = build_model(PolicySpec.of(cfg), data).eval()
    batch = data.bind(model, cfg.flow).anchor_batch(data.anchors, np.arange(4))
    with torch.no_grad():
        before = model.encode(batch)
        moved = dict(batch, observation=batch["observation"].clone())
        moved["observation"][:, 36:39] += 5.0
        assert torch.equal(model.encode(moved), before)
        moved["observation"][:, 4:7] += 5.0
        assert not torch.allclose(model.encode(moved), before)
    plain = compose_config(["data=tiny", "model=tiny_vla_small"])
    assert set(build_model(PolicySpec.of(plain), data).state_dict()) == set(model.state_dict())
    assert "hidden_state" not in weight_model_settings(plain.model)
    with pytest.raises(UserInputError, match="hidden_state"):
        build_model(
            PolicySpec.of(compose_config(["data=tiny", "model=tiny_vla_small", "model.hidden_state=[99]"])), data
        )
