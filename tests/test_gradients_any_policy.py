"""Exact per-sample gradient norms for any policy: Linear over token axes (the Gram form), layers
called twice, layers with no closed form (torch.func), refusals instead of approximations, and
both built-in policies against a per-sample autograd loop in float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vlaeval.config import FlowConfig
from vlaeval.errors import UserInputError
from vlaeval.policy.tiny_dit import TinyDiT
from vlaeval.policy.tiny_vla import TinyVLA
from vlaeval.policy.tiny_vla_vision import TinyVLAVision
from vlaeval.residual.gradients import PerSampleGradNorms

FLOW = FlowConfig()
H, A, OBS, VOCAB = 4, 3, 6, ["pick", "place", "push"]


def batch_of(size: int, seed: int = 0, horizon: int = H):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(size, horizon, dtype=torch.bool)
    mask[0, horizon // 2 :] = False  # a chunk running past its episode end
    batch = {
        "observation": torch.randn(size, OBS, generator=g, dtype=torch.float64),
        "instruction": torch.rand(size, len(VOCAB), generator=g, dtype=torch.float64),
        "task_index": torch.zeros(size, dtype=torch.int64),
        "target_actions": torch.randn(size, horizon, A, generator=g, dtype=torch.float64),
        "target_mask": mask,
    }
    t = torch.rand(size, generator=g, dtype=torch.float64)
    return batch, t, torch.randn(size, horizon, A, generator=g, dtype=torch.float64)


class TokenPolicy(nn.Module):
    """A minimal policy whose head is one Linear over the horizon axis (optionally applied twice,
    optionally with a position table looked up without the batch)."""

    def __init__(self, horizon: int = H, twice: bool = False, unbatched_lookup: bool = False, mix: bool = False):
        super().__init__()
        self.horizon, self.action_dim = horizon, A
        self.twice, self.unbatched_lookup, self.mix = twice, unbatched_lookup, mix
        self.cond = nn.Linear(OBS, 8)
        self.tokens = nn.Linear(A + 8 + 1, A)
        self.table = nn.Embedding(horizon, A)

    def encode(self, batch):
        return self.cond(batch["observation"])

    def velocity(self, conditioning, noisy, t):
        b = noisy.shape[0]
        x = torch.cat(
            [noisy, conditioning[:, None].expand(b, self.horizon, 8), t[:, None, None].expand(b, self.horizon, 1)], -1
        )
        if self.mix:  # couples the samples of a batch: no per-sample gradient exists for the layer-wise path
            x = x - x.mean(dim=0, keepdim=True)
        y = self.tokens(x)
        if self.twice:
            y = y + self.tokens(torch.cat([torch.tanh(y), x[..., A:]], -1))
        if self.unbatched_lookup:
            y = y + self.table(torch.arange(self.horizon))  # (H, A): no batch axis
        return y

    def trainable_parameters(self, which):
        return list(self.parameters()) if which == "all" else list(self.tokens.parameters())


def loop_and(method: str, model: nn.Module, which: str, size: int, horizon: int = H):
    model = model.double()
    params = list(model.trainable_parameters(which))  # type: ignore[operator]
    for p in model.parameters():
        p.requires_grad_(any(p is q for q in params))
    norms = PerSampleGradNorms(model, params, FLOW, method)
    batch, t, noise = batch_of(size, horizon=horizon)
    fast, fast_loss = norms(batch, t, noise)
    slow, slow_loss = norms.loop(batch, t, noise)
    return fast, slow, fast_loss, slow_loss, norms


@pytest.mark.parametrize("size", [5, H])  # batch == sequence length: the old code's silent (B, B) case
def test_linear_over_tokens_takes_the_gram_form_and_equals_the_loop(size):
    torch.manual_seed(1)
    fast, slow, fast_loss, slow_loss, norms = loop_and("auto", TokenPolicy(), "action_head", size)
    assert fast.shape == (size,)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=0)
    torch.testing.assert_close(fast_loss, slow_loss, rtol=1e-12, atol=0)
    assert norms.layer_methods == {"tokens": "linear_gram"}
    # Negative control: the per-row identity summed over tokens, sum_t |g_t|^2 |a_t|^2, is not the norm.
    model = TokenPolicy().double()
    batch, t, noise = batch_of(size)
    records = []
    handle = model.tokens.register_forward_hook(lambda m, i, o: records.append((i[0], o)))
    from vlaeval.policy.flow import flow_matching_losses

    losses = flow_matching_losses(model, batch, t, noise, FLOW)
    handle.remove()
    ((a, y),) = records
    (g,) = torch.autograd.grad(losses.sum(), [y])
    per_row = (g.pow(2).sum(-1) * a.detach().pow(2).sum(-1)).sum(-1) + g.sum(1).pow(2).sum(-1)
    assert float(((per_row - slow) / slow).abs().max()) > 0.01


def test_a_layer_called_twice_in_one_forward_is_summed_before_the_norm():
    torch.manual_seed(2)
    fast, slow, *_, norms = loop_and("auto", TokenPolicy(twice=True), "action_head", 6)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=0)
    # 2 calls x 4 tokens: T^2 = 64 > d_in * d_out = 36, so dW_i itself is the cheaper exact form here
    assert norms.layer_methods == {"tokens": "linear_outer x2 calls"}


def test_a_lookup_without_the_batch_axis_is_refused_by_name_and_the_functional_method_handles_it():
    torch.manual_seed(3)
    model = TokenPolicy(unbatched_lookup=True)
    with pytest.raises(
        UserInputError, match=r"layer table .*does not lead with the batch.*gradients.method=functional"
    ):
        loop_and("auto", model, "all", 6)
    fast, slow, *_ = loop_and("functional", model, "all", 6)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=0)


def test_a_layer_that_mixes_the_samples_of_a_batch_is_caught_by_the_loop_check():
    from vlaeval.data.anchors import AnchorSet  # noqa: F401  (the check runs inside gradient_measurements)
    from vlaeval.residual.gradients import verify_against_loop

    torch.manual_seed(4)
    model = TokenPolicy(mix=True).double()
    params = list(model.trainable_parameters("all"))
    norms = PerSampleGradNorms(model, params, FLOW, "auto")
    batch, t, noise = batch_of(6)
    sq, _ = norms(batch, t, noise)
    with pytest.raises(UserInputError, match="differ from the per-sample loop.*gradients.method=functional"):
        verify_against_loop(norms, batch, t, noise, sq, pairs=4)


@pytest.mark.parametrize("policy", ["tiny_vla", "tiny_dit"])
@pytest.mark.parametrize("which", ["action_head", "all"])
@pytest.mark.parametrize("method", ["auto", "functional"])
def test_both_builtin_policies_equal_the_per_sample_loop_in_float64(policy, which, method):
    torch.manual_seed(5)
    model = TinyVLA(VOCAB, OBS, A, H) if policy == "tiny_vla" else TinyDiT(VOCAB, OBS, A, H, width=32, heads=4)
    fast, slow, fast_loss, slow_loss, norms = loop_and(method, model, which, 9)
    relative = float(((fast - slow).abs() / slow).max())
    assert relative < 1e-10, relative
    torch.testing.assert_close(fast_loss, slow_loss, rtol=1e-12, atol=0)
    if policy == "tiny_dit" and method == "auto":
        used = set(norms.layer_methods.values())
        assert {"linear_gram", "linear_rows", "functional_vjp"} <= used  # tokens, per-sample rows, no closed form
        assert norms.layer_methods["final_norm"] == "functional_vjp"
        assert norms.layer_methods["blocks.0.cross_attention.key"] == "linear_gram"


@pytest.mark.parametrize("which", ["action_head", "all"])
@pytest.mark.parametrize("method", ["auto", "functional"])
def test_the_vision_language_policy_equals_the_per_sample_loop_in_float64(which, method):
    """Conv2d, GroupNorm, Embedding, a learned position table, LayerNorm and attention over words:
    every per-sample norm exact, on uint8 images the policy resizes itself and its own word ids."""
    torch.manual_seed(6)
    camera = "observation.images.corner"
    model = TinyVLAVision(
        VOCAB + ["the", "puck"],
        OBS,
        A,
        H,
        cameras=[camera],
        image_size=16,
        image_channels=8,
        text_width=16,
        max_words=5,
        conditioning_dim=16,
        head_hidden=16,
        head_layers=2,
        time_embedding_dim=8,
    ).double()
    model.eval()  # as gradient_measurements runs it: no training-time image shifts
    params = list(model.trainable_parameters(which))
    for p in model.parameters():
        p.requires_grad_(any(p is q for q in params))
    norms = PerSampleGradNorms(model, params, FLOW, method)
    batch, t, noise = batch_of(9)
    g = torch.Generator().manual_seed(7)
    batch[camera] = torch.randint(0, 256, (9, 3, 20, 20), generator=g, dtype=torch.uint8)  # resized to 16 inside
    texts = ["pick the puck", "place the puck", "push", "pick up the blue puck", "place"] * 2
    batch["instruction"] = model.tokenize(texts[:9])
    assert batch["instruction"].shape == (9, 5) and batch["instruction"][3, [1, 3]].tolist() == [1, 1]  # up, blue
    fast, fast_loss = norms(batch, t, noise)
    slow, slow_loss = norms.loop(batch, t, noise)
    relative = float(((fast - slow).abs() / slow).max())
    assert relative < 1e-10, relative
    torch.testing.assert_close(fast_loss, slow_loss, rtol=1e-12, atol=0)
    if which == "all" and method == "auto":
        methods = norms.layer_methods
        for layer in (
            "images.0.layers.0",  # Conv2d
            "images.0.layers.1",  # GroupNorm
            "images.0.layers.7",  # the spatial softmax's sharpness
            "text.embedding",
            "text.positions",
            "text.norm",
        ):
            assert methods[layer] == "functional_vjp", (layer, methods[layer])
        assert methods["text.attention.query"] == "linear_gram" and methods["encoder.0"] == "linear_rows"


def test_the_vision_policy_tokenizes_words_in_order_and_marks_unknown_ones():
    model = TinyVLAVision(["pick", "place", "puck", "the"], OBS, A, H, max_words=4)
    tokens = model.tokenize(["pick the puck", "place the red puck now", "PICK  the   Puck"])
    assert tokens.tolist() == [[2, 5, 4, 0], [3, 5, 1, 4], [2, 5, 4, 0]]  # ids from 2; 1 unknown; 0 padding
    swapped = model.tokenize(["the puck pick"])
    assert swapped.tolist() != tokens[:1].tolist()  # word order is kept (unlike a bag-of-words)


def test_the_transformer_expert_is_trained_and_audited_end_to_end(tmp_path):
    import json

    from helpers.configs import AUDIT_SMALL
    from helpers.processes import run_main

    overrides = [o for o in AUDIT_SMALL if not o.startswith("model=")]
    proc = run_main(
        [
            "job=residual_audit",
            "model=tiny_dit_small",
            "tracking=disabled",
            *overrides,
            f"hydra.run.dir={tmp_path / 'a'}",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "a" / "result.json").read_text())
    artifact = result["gradient_artifact"]
    assert result["sample_count"] == 16 and "Residual audit gate" in proc.stdout
    assert artifact["layer_methods"]["positions"] == "functional_vjp"
    assert artifact["layer_methods"]["blocks.0.self_attention.query"] == "linear_gram"
    assert artifact["layer_methods"]["blocks.0.modulation"] == "linear_rows"
    assert result["metrics"]["repeatability.spearman"] > 0.5


def test_the_vision_policy_shifts_its_images_only_while_training():
    torch.manual_seed(8)
    model = TinyVLAVision(VOCAB, OBS, A, H, image_size=16, augment_shift=3)
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    model.eval()
    assert torch.equal(model.pixels(images), images.float() / 255)  # scoring, gradients, rollouts: as given
    model.train()
    torch.manual_seed(9)
    shifted = model.pixels(images)
    torch.manual_seed(9)
    assert torch.equal(model.pixels(images), shifted)  # drawn from torch's seeded generator
    moved = (shifted - images.float() / 255).abs().flatten(1).amax(dim=1)
    assert int((moved > 0).sum()) >= 3  # (a zero shift is one of 49 draws per image)
    whole = torch.zeros(1, 3, 16, 16, dtype=torch.uint8)
    whole[..., 8, 8] = 255  # one bright pixel moves by whole pixels, staying one pixel
    torch.manual_seed(10)
    out = model.pixels(whole)[0, 0]
    assert torch.isclose(out.sum(), torch.tensor(1.0)) and float(out.max()) == pytest.approx(1.0)
