"""The training recipe (train.warmup_steps, grad_clip_norm, ema_decay): the learning rate rises over
the warmup and then follows the cosine; every step's gradient is clipped; the moving average of the
weights is what the held-out loss reads and what training leaves in the model (and so in the
checkpoint), exactly as its formula says; the recipe switched off keeps the keys checkpoints were
cached under; bad settings are one-line errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.optim.optimizer import register_optimizer_step_post_hook

from helpers.configs import AUDIT_SMALL, compose_config
from vlaeval.config import TrainConfig
from vlaeval.errors import UserInputError
from vlaeval.policy.builtin import PolicySpec, build_model, checkpoint_key, prepare_data, weight_train_settings
from vlaeval.policy.training import (
    TrainingExtras,
    learning_rate_schedule,
    train_policy,
    validate_training_recipe,
)

RECIPE = ["train.warmup_steps=5", "train.grad_clip_norm=0.5", "train.ema_decay=0.9"]
OFF = ["train.warmup_steps=0", "train.grad_clip_norm=null", "train.ema_decay=null"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = compose_config(AUDIT_SMALL, cache_dir=tmp_path_factory.mktemp("cache"))
    return cfg, prepare_data(cfg.data, str(cfg.paths.cache_dir))


def test_the_learning_rate_warms_up_linearly_then_follows_the_cosine_to_zero():
    train = TrainConfig(steps=20, warmup_steps=4, learning_rate=1.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = learning_rate_schedule(optimizer, train)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    expected = [0.5 * (1 + math.cos(math.pi * (s - 4) / 16)) for s in range(4, 20)]
    assert rates[4:] == pytest.approx(expected)
    # Without warmup: the cosine from the first step, as before the setting existed.
    plain = learning_rate_schedule(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), TrainConfig(steps=20, warmup_steps=0)
    )
    assert isinstance(plain, torch.optim.lr_scheduler.CosineAnnealingLR)


def test_every_step_is_clipped_to_the_norm(tiny):
    """Plain SGD at learning rate 1 (the cosine's first step): the weights move by the clipped gradient."""
    cfg, data = tiny
    moves = {}
    for clip in (None, 1e-3):
        spec = PolicySpec.of(compose_config([*AUDIT_SMALL, "train.steps=1", "train.optimizer=sgd", "train.momentum=0"]))
        model = build_model(spec, data)
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        train = OmegaConf.merge(
            spec.train, {"learning_rate": 1.0, "grad_clip_norm": clip, "warmup_steps": 0, "ema_decay": None}
        )
        train_policy(data.bind(model, cfg.flow), data.anchors, train)
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        moves[clip] = float((after - before).norm())
    assert moves[1e-3] == pytest.approx(1e-3, rel=1e-4)
    assert moves[None] > 100 * moves[1e-3]


def test_the_moving_average_is_what_the_model_keeps_and_the_heldout_loss_reads(tiny):
    """The online weights after each step are recorded by an optimizer hook; the average computed
    from them by the documented formula is what training leaves in the model, and what the held-out
    callback was handed; the online weights are not."""
    cfg, data = tiny
    spec = PolicySpec.of(compose_config([*AUDIT_SMALL, *RECIPE, "train.steps=12"]))
    model = build_model(spec, data)
    average = [p.detach().clone() for p in model.parameters()]
    online = []

    def record(optimizer, args, kwargs):
        online.append([p.detach().clone() for p in model.parameters()])

    seen = []

    def heldout(module: torch.nn.Module) -> float:
        seen.append([p.detach().clone() for p in module.parameters()])
        return 0.0

    handle = register_optimizer_step_post_hook(record)
    try:
        metrics = train_policy(
            data.bind(model, cfg.flow),
            data.anchors,
            spec.train,
            extras=TrainingExtras(heldout=heldout, heldout_every=12),
        )
    finally:
        handle.remove()
    assert len(online) == 12 and metrics.weights == "ema"
    for step, weights in enumerate(online, start=1):
        decay = min(0.9, (1 + step) / (10 + step))
        average = [a + (1 - decay) * (w - a) for a, w in zip(average, weights)]
    final = list(model.parameters())
    for a, f in zip(average, final):
        torch.testing.assert_close(f.detach(), a, rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(f.detach(), w) for f, w in zip(final, online[-1]))
    for a, h in zip(average, seen[-1]):  # the held-out loss at the last step read the average
        torch.testing.assert_close(h, a, rtol=1e-5, atol=1e-6)


def test_the_recipe_switched_off_keeps_the_checkpoint_keys_and_each_setting_changes_them(tiny):
    cfg, data = tiny
    off = compose_config([*AUDIT_SMALL, *OFF])
    assert not {"warmup_steps", "grad_clip_norm", "ema_decay"} & set(weight_train_settings(off.train))
    keys = {checkpoint_key(PolicySpec.of(off), data)}
    for setting in RECIPE:
        keys.add(checkpoint_key(PolicySpec.of(compose_config([*AUDIT_SMALL, *OFF, setting])), data))
    assert len(keys) == 1 + len(RECIPE)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.warmup_steps=-1", "train.warmup_steps=-1 must be >= 0"),
        ("train.grad_clip_norm=0", "train.grad_clip_norm=0.0 must be > 0 (null: no clipping)"),
        ("train.ema_decay=1", "train.ema_decay=1.0 must be in (0, 1)"),
        ("train.ema_decay=0", "train.ema_decay=0.0 must be in (0, 1)"),
    ],
)
def test_bad_recipe_settings_are_one_line_errors(override, message):
    cfg = compose_config([*AUDIT_SMALL, override])
    with pytest.raises(UserInputError) as error:
        validate_training_recipe(cfg.train)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_recipe_run_is_seeded(tiny):
    cfg, data = tiny
    spec = PolicySpec.of(compose_config([*AUDIT_SMALL, *RECIPE, "train.steps=6"]))
    runs = []
    for _ in range(2):
        model = build_model(spec, data)
        train_policy(data.bind(model, cfg.flow), data.anchors, spec.train)
        runs.append(np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]))
    assert np.array_equal(runs[0], runs[1])


@pytest.fixture(scope="module")
def tiny_vision(tmp_path_factory):
    from helpers.servers import need, osmesa_installed

    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    cfg = compose_config(
        [*AUDIT_SMALL, "data=tiny_vision", "model=tiny_vla_vision_small"], cache_dir=tmp_path_factory.mktemp("cache")
    )
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
    return cfg, data, build_model(PolicySpec.of(cfg), data)


def test_draws_per_anchor_are_the_loss_of_each_anchor_repeated_with_its_encoder_run_once(tiny_vision):
    """k draws per anchor give, draw for draw, the losses of a batch holding each anchor k times (the
    same t and noise); the image encoder sees each anchor once."""
    from vlaeval.policy.training import flow_draws

    cfg, data, model = tiny_vision
    policy = data.bind(model, cfg.flow)
    model.eval()  # no augmentation: the repeated batch's copies see the same pixels
    index, k = np.array([3, 17, 5, 40, 3]), 4
    chunk = (data.anchors.horizon, data.anchors.target_actions.shape[-1])
    t, noise = flow_draws(np.random.default_rng(1), index.size * k, *chunk, cfg.flow)
    rows: list = []
    hook = model.images[0].register_forward_hook(lambda module, args, output: rows.append(output.shape[0]))
    try:
        with torch.no_grad():
            drawn = policy.losses(policy.anchor_batch(data.anchors, index), t, noise, draws=k)
            repeated = policy.losses(policy.anchor_batch(data.anchors, np.repeat(index, k)), t, noise)
    finally:
        hook.remove()
    assert rows == [index.size, index.size * k]
    assert drawn.shape == (index.size * k,)
    torch.testing.assert_close(drawn, repeated, rtol=1e-5, atol=1e-6)
    # A negative control: the draws paired with the wrong anchors (tiled, not repeated) differ.
    with torch.no_grad():
        tiled = policy.losses(policy.anchor_batch(data.anchors, np.tile(index, k)), t, noise)
    assert not torch.allclose(drawn, tiled, rtol=1e-3)


@pytest.mark.parametrize("sampling", [[], ["train.time_sampling=adaptive"]])
def test_a_run_with_draws_per_anchor_is_seeded_and_one_draw_is_the_run_it_was(tiny, sampling):
    """draws_per_anchor=1 trains bit for bit as the default run (the run before the setting existed)
    and keeps its checkpoint key; 2 trains another (seeded) run under another key, on the weighted
    path as well."""
    cfg, data = tiny
    runs = {}
    for draws in (None, 1, 2, 2):
        extra = [] if draws is None else [f"train.draws_per_anchor={draws}"]
        spec = PolicySpec.of(compose_config([*AUDIT_SMALL, *sampling, *extra, "train.steps=4"]))
        model = build_model(spec, data)
        metrics = train_policy(data.bind(model, cfg.flow), data.anchors, spec.train)
        weights = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
        runs.setdefault(draws, []).append((weights, metrics.final_loss, checkpoint_key(spec, data)))
    (before,), (one,), twice = runs[None], runs[1], runs[2]
    assert np.array_equal(before[0], one[0]) and before[2] == one[2]
    assert np.array_equal(twice[0][0], twice[1][0]) and twice[0][2] == twice[1][2]
    assert not np.array_equal(one[0], twice[0][0]) and one[2] != twice[0][2]


@pytest.mark.parametrize(
    "draws, message",
    [(3, "train.draws_per_anchor=3 must be >= 1 and divide"), (0, "train.draws_per_anchor=0 must be >= 1")],
)
def test_draws_that_do_not_divide_the_batch_are_one_line_errors(draws, message):
    cfg = compose_config([*AUDIT_SMALL, "train.batch_size=32", f"train.draws_per_anchor={draws}"])
    with pytest.raises(UserInputError) as error:
        validate_training_recipe(cfg.train)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_gauntlet_built_in_policy_with_a_bad_recipe_is_one_line_naming_it_before_any_recording(tmp_path):
    from helpers.processes import run_main

    proc = run_main(
        [
            "job=gauntlet",
            "outcomes=rollout_small",
            "strata=small",
            "tracking=disabled",
            "+outcomes.policies.baseline.train.draws_per_anchor=3",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "error: outcomes.policies.baseline: train.draws_per_anchor=3 must be >= 1 and divide train.batch_size=64"
    ), lines[0]
    assert not (tmp_path / "cache" / "demonstrations").exists()  # nothing recorded, nothing trained


LOCATE = "model.locate=[4,5,6,36,37,38]"  # Meta-World: the first object's and the goal's x, y, z


def test_locate_adds_a_read_out_of_where_things_are_to_the_training_objective_alone(tiny_vision):
    """With model.locate, a training step minimises the flow-matching loss plus locate_weight times
    the squared error of a linear read-out of the image features onto those standardised state dims,
    from the same encoder pass, each anchor weighted as drawn; the flow-matching losses (what scoring,
    gradients and the loss curve see) are those of encode alone, and the auxiliary gradient reaches
    the image encoder."""
    from vlaeval.policy.training import flow_draws, minibatch_loss

    cfg, data, _ = tiny_vision
    located = compose_config(
        [*AUDIT_SMALL, "data=tiny_vision", "model=tiny_vla_vision_small", LOCATE, "model.locate_weight=0.5"]
    )
    model = build_model(PolicySpec.of(located), data).eval()  # eval: no augmentation, the same pixels twice
    policy = data.bind(model, cfg.flow)
    index, k = np.array([3, 17, 5, 40]), 2
    batch = policy.anchor_batch(data.anchors, index)
    t, noise = flow_draws(np.random.default_rng(1), index.size * k, data.anchors.horizon, 4, cfg.flow)
    features: list = []
    hooks = [encoder.register_forward_hook(lambda m, a, out: features.append(out)) for encoder in model.images]
    try:
        with torch.no_grad():
            losses, auxiliary = policy.training_losses(batch, t, noise, k)
            plain = policy.losses(batch, t, noise, k)
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(losses, plain, rtol=0, atol=0)
    state = model.normalise(batch["observation"])[:, [4, 5, 6, 36, 37, 38]]
    by_hand = 0.5 * ((model.locate_head(torch.cat(features[: len(model.images)], -1)) - state) ** 2).mean(-1)
    assert auxiliary is not None and auxiliary.shape == (index.size,)
    torch.testing.assert_close(auxiliary, by_hand.detach())
    assert float(auxiliary.min()) > 0

    # The step's objective: uniform draws, then a proposal q (each anchor weighted 1 / (N q_i)).
    q = np.linspace(1.0, 3.0, len(data.anchors))
    q /= q.sum()
    for proposal in (None, q):
        step = minibatch_loss(policy, data.anchors, np.random.default_rng(7), 8, proposal, None, k)
        rng = np.random.default_rng(7)
        drawn = (
            rng.integers(0, len(data.anchors), size=4) if proposal is None else rng.choice(len(data.anchors), 4, p=q)
        )
        with torch.no_grad():
            _, again = policy.training_losses(policy.anchor_batch(data.anchors, drawn), t, noise, k)
        weights = np.ones(4) if proposal is None else 1.0 / (len(data.anchors) * q[drawn])
        expected = float((torch.from_numpy(weights.astype(np.float32)) * again).mean())
        assert step.auxiliary is not None
        assert float(step.auxiliary.detach()) == pytest.approx(expected, rel=1e-5)
        flow = (
            step.losses
            if proposal is None
            else torch.from_numpy(np.repeat(weights, k).astype(np.float32)) * step.losses
        ).mean()
        assert float(step.objective.detach()) == pytest.approx(float(flow.detach()) + expected, rel=1e-5)

    # The auxiliary loss's gradient reaches the image encoder (the head alone would not teach it).
    encoder = list(model.images[0].parameters())[0]
    without = torch.autograd.grad(policy.losses(batch, t, noise, k).mean(), encoder)[0]
    with_it = torch.autograd.grad(sum(x.mean() for x in policy.training_losses(batch, t, noise, k)), encoder)[0]
    assert not torch.allclose(with_it, without, rtol=1e-3, atol=1e-8)


def test_locate_trains_its_own_curve_and_off_keeps_the_model_and_its_key(tiny_vision):
    """A run with locate logs the auxiliary loss beside the flow-matching curve; off (the default),
    the model has no read-out, its checkpoint key is the one it had before the setting existed, and
    locate_weight alone changes nothing."""
    cfg, data, model = tiny_vision
    assert not any(name.startswith("locate_head") for name in model.state_dict())
    base = [*AUDIT_SMALL, "data=tiny_vision", "model=tiny_vla_vision_small"]
    key = checkpoint_key(PolicySpec.of(cfg), data)
    spec = PolicySpec.of(cfg)
    before = OmegaConf.to_container(spec.model)
    assert isinstance(before, dict)
    for name in ("locate", "locate_weight"):
        before.pop(name)
    assert checkpoint_key(PolicySpec(**{**vars(spec), "model": OmegaConf.create(before)}), data) == key
    assert checkpoint_key(PolicySpec.of(compose_config([*base, "model.locate_weight=3"])), data) == key
    assert checkpoint_key(PolicySpec.of(compose_config([*base, "model.locate=[]"])), data) == key
    located = compose_config([*base, LOCATE, "train.steps=6", "train.log_every=2"])
    assert checkpoint_key(PolicySpec.of(located), data) != key
    trained = build_model(PolicySpec.of(located), data)
    metrics = train_policy(data.bind(trained, located.flow), data.anchors, located.train)
    assert metrics.auxiliary_curve is not None
    assert [s for s, _ in metrics.auxiliary_curve] == [s for s, _ in metrics.loss_curve] == [2, 4, 6]
    assert all(math.isfinite(v) and v > 0 for _, v in metrics.auxiliary_curve)
    # the sidecar's layout: the auxiliary loss's final value beside its curve; read back whole
    assert list(metrics.to_json())[:8] == [
        "weights",
        "loss_curve",
        "final_loss",
        "train_seconds",
        "steps",
        "diverged_at_step",
        "auxiliary_curve",
        "final_auxiliary_loss",
    ]
    saved = json.loads(json.dumps(metrics.to_json()))
    assert type(metrics).from_json(saved).loss_curve == metrics.loss_curve
    assert json.loads(json.dumps(type(metrics).from_json(saved).to_json())) == saved
    assert metrics.final_auxiliary_loss == metrics.auxiliary_curve[-1][1]
    from vlaeval.jobs.train import training_view

    headline, curves = training_view(metrics)  # what MLflow shows: its own curve beside the loss
    assert curves["train.auxiliary_loss"] == list(metrics.auxiliary_curve)
    assert headline["train.final_auxiliary_loss"] == metrics.final_auxiliary_loss


def test_a_snapshot_holds_the_weights_a_run_that_stopped_there_ends_with(tiny, tmp_path):
    """Within the warmup the schedule does not depend on the run's length, so the snapshot at step 8
    of a 12-step run is the 8-step run's final (moving-average) weights, exactly; its sidecar records
    the 8 steps; there is none at the last step (that is model.pt)."""
    from vlaeval.jobs import dispatch

    cache = tiny[0].paths.cache_dir
    recipe = [*AUDIT_SMALL, "job=train", "train.evaluate_after=false", "tracking=disabled", "train.warmup_steps=20"]
    long = compose_config(
        [*recipe, "train.steps=12", "train.save_every=4"], output_dir=tmp_path / "long", cache_dir=cache
    )
    short = compose_config([*recipe, "train.steps=8"], output_dir=tmp_path / "short", cache_dir=cache)
    dispatch(long, ["train.steps=12", "train.save_every=4"])
    dispatch(short, ["train.steps=8"])
    snapshots = sorted((tmp_path / "long" / "snapshots").glob("*/model.pt"))
    assert [p.parent.name for p in snapshots] == ["step_0000004", "step_0000008"]
    at_8 = torch.load(snapshots[1], weights_only=True)
    final_8 = torch.load(tmp_path / "short" / "model.pt", weights_only=True)
    assert at_8.keys() == final_8.keys() and all(torch.equal(at_8[k], final_8[k]) for k in at_8)
    sidecar = json.loads(snapshots[1].with_suffix(".json").read_text())
    assert sidecar["metrics"]["steps"] == 8 and sidecar["config"]["train"]["steps"] == 12
    final_12 = torch.load(tmp_path / "long" / "model.pt", weights_only=True)
    assert not all(torch.equal(at_8[k], final_12[k]) for k in at_8)
