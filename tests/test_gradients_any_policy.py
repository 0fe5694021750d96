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


class NaNPolicy(TokenPolicy):
    """A policy whose velocity is NaN on the anchors whose first observation is negative."""

    def velocity(self, conditioning, noisy, t):
        v = super().velocity(conditioning, noisy, t)
        return torch.where(conditioning[:, :1, None] < 0, torch.full_like(v, float("nan")), v)


def test_a_policy_whose_velocity_is_nan_is_named_not_the_gradient_method():
    import numpy as np

    from vlaeval.residual.gradients import require_finite

    torch.manual_seed(5)
    model = NaNPolicy().double()
    norms = PerSampleGradNorms(model, list(model.trainable_parameters("all")), FLOW, "auto")
    batch, t, noise = batch_of(6)
    sq, loss = norms(batch, t, noise)
    assert not bool(torch.isfinite(loss).all())  # the policy, not the method: the loss itself is NaN
    with pytest.raises(
        UserInputError, match=r"the policy's flow-matching loss is nan on anchor 1\d\d at flow time .*fix the policy"
    ):
        require_finite(loss, sq, t, np.arange(100, 106))
    finite = TokenPolicy().double()  # the control: a finite policy passes the same check
    sq, loss = PerSampleGradNorms(finite, list(finite.trainable_parameters("all")), FLOW, "auto")(batch, t, noise)
    require_finite(loss, sq, t, np.arange(100, 106))


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
        assert {"linear_gram", "linear_rows", "layer_norm"} <= used  # tokens, per-sample rows, the norm in closed form
        assert norms.layer_methods["final_norm"] == "layer_norm"
        assert norms.layer_methods["blocks.0.cross_attention.key"] == "linear_gram"


VISION_VARIANTS = {
    "as before": {"keypoint_norm": "none"},
    "layernorm, film, two cameras, crop": {
        "keypoint_norm": "layernorm",
        "film": True,
        "cameras": ["observation.images.corner", "observation.images.top"],
        "crop": [0.1, 0.0, 0.8, 0.9],
    },
    "standardise, two frames": {"keypoint_norm": "standardise", "sharpness": 20.0, "history": 2},
}


@pytest.mark.parametrize(
    "which,method,variant",
    # The encoder's variants change nothing in the action head's gradients: only "all" varies them.
    [(w, m, "as before") for w in ("action_head", "all") for m in ("auto", "functional")]
    + [("all", m, v) for m in ("auto", "functional") for v in list(VISION_VARIANTS)[1:]],
)
def test_the_vision_language_policy_equals_the_per_sample_loop_in_float64(which, method, variant):
    """Conv2d, GroupNorm, FiLM, Embedding, a learned position table, LayerNorm and attention over words:
    every per-sample norm exact, on uint8 images the policy crops and resizes itself and its own word ids;
    the convolutions and norms in closed form."""
    torch.manual_seed(6)
    options = {"cameras": ["observation.images.corner"], **VISION_VARIANTS[variant]}
    model = TinyVLAVision(
        VOCAB + ["the", "puck"],
        OBS,
        A,
        H,
        image_size=16,
        image_channels=8,
        text_width=16,
        max_words=5,
        conditioning_dim=16,
        head_hidden=16,
        head_layers=2,
        time_embedding_dim=8,
        **options,
    ).double()
    g = torch.Generator().manual_seed(7)
    frames = 3 * model.history
    images = {c: torch.randint(0, 256, (9, frames, 20, 20), generator=g, dtype=torch.uint8) for c in model.cameras}
    model.set_keypoint_statistics(images)
    for film in model.images[0].film or ():  # zero-initialised: give FiLM something to differentiate
        torch.nn.init.normal_(film.project.weight, std=0.3)
    model.eval()  # as gradient_measurements runs it: no training-time image shifts
    params = list(model.trainable_parameters(which))
    for p in model.parameters():
        p.requires_grad_(any(p is q for q in params))
    norms = PerSampleGradNorms(model, params, FLOW, method)
    batch, t, noise = batch_of(9)
    batch.update(images)  # resized to 16 inside
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
        assert methods["images.0.layers.0"] == "conv2d_outer"  # 8 x 75 weights < 64^2 positions
        assert methods["images.0.layers.3"] == "conv2d_gram"  # 8 x 72 weights > 4^2 positions
        assert methods["images.0.layers.1"] == "group_norm"
        assert methods["text.norm"] == "layer_norm"
        for layer in ("images.0.layers.7", "text.embedding", "text.positions"):  # no closed form
            assert methods[layer] == "functional_vjp", (layer, methods[layer])
        assert methods["text.attention.query"] == "linear_gram" and methods["encoder.0"] == "linear_rows"
        if variant == "layernorm, film, two cameras, crop":
            assert methods["images.1.keypoint_norm"] == "layer_norm"
            assert methods["images.0.film.0.project"] == "linear_rows"


class ConvNet(nn.Module):
    """Convolutions the closed form must get right: stride, padding, dilation, groups, no bias, a
    rectangular kernel, one conv called twice (its gradient is the sum over both calls), GroupNorm and a
    LayerNorm over the channel axis of every position."""

    def __init__(self):
        super().__init__()
        self.horizon, self.action_dim = H, A
        self.first = nn.Conv2d(3, 6, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2))
        self.grouped = nn.Conv2d(6, 6, 3, padding=1, groups=3, bias=False)
        self.norm = nn.GroupNorm(3, 6)
        self.tokens_norm = nn.LayerNorm(6)
        self.head = nn.Linear(6 + A + 1 + OBS, A)

    def encode(self, batch):
        x = self.first(batch["image"])
        x = self.grouped(torch.tanh(self.norm(x)))
        x = self.grouped(torch.tanh(x))  # called twice
        x = self.tokens_norm(x.flatten(2).transpose(1, 2)).mean(dim=1)
        return torch.cat([x, batch["observation"]], -1)

    def velocity(self, conditioning, noisy, t):
        b = noisy.shape[0]
        c = conditioning[:, None].expand(b, self.horizon, conditioning.shape[-1])
        return self.head(torch.cat([c, noisy, t[:, None, None].expand(b, self.horizon, 1)], -1))

    def trainable_parameters(self, which):
        return list(self.parameters())


def test_convolutions_and_norms_in_closed_form_equal_the_loop_in_float64():
    torch.manual_seed(3)
    model = ConvNet()
    fast_methods = {}
    for size in (7, 3):
        batch_extra = torch.randn(size, 3, 9, 11, generator=torch.Generator().manual_seed(size), dtype=torch.float64)
        model = model.double()
        params = list(model.parameters())
        norms = PerSampleGradNorms(model, params, FLOW, "auto")
        batch, t, noise = batch_of(size)
        batch["image"] = batch_extra
        fast, _ = norms(batch, t, noise)
        slow, _ = norms.loop(batch, t, noise)
        assert float(((fast - slow).abs() / slow).max()) < 1e-10
        fast_methods = norms.layer_methods
    assert fast_methods["first"] == "conv2d_outer" and fast_methods["grouped"].startswith("conv2d_")
    assert fast_methods["grouped"].endswith("x2 calls")
    assert fast_methods["norm"] == "group_norm" and fast_methods["tokens_norm"] == "layer_norm"


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
