"""A killed first-use training continues where it was: the built-in checkpoint's cache entry keeps the
loop's state (weights, optimizer, schedule, moving average, every generator, the curves so far), and
the next run that needs that checkpoint continues from the last save to the very weights an
uninterrupted run ends with."""

from __future__ import annotations

import pytest
import torch

from helpers.configs import AUDIT_SMALL, compose_config
from vlaeval.policy.builtin import CHECKPOINT_FILE, RESUME_FILE, PolicySpec, obtain_policy, prepare_data
from vlaeval.store import entry_folder

# AUDIT_SMALL's data and policy with every part of the loop's state in play: warmup and a cosine, the
# moving average, the adaptive flow-time sampler, clipping, and the state kept after every step.
RESUMABLE = [
    *(o for o in AUDIT_SMALL if o.startswith(("data=", "model=", "train."))),
    "train.steps=30",
    "train.log_every=1",
    "train.warmup_steps=5",
    "train.ema_decay=0.9",
    "train.grad_clip_norm=1.0",
    "train.time_sampling=adaptive",
    "train.resume_every_s=0",
]


# The vision policy draws its random image shifts from torch's generator, which the state keeps too.
VISION = [*RESUMABLE, "data=tiny_vision", "model=tiny_vla_vision_small"]


class Killed(Exception):
    pass


def train(cache, kill_at=None, overrides=RESUMABLE):
    """The built-in checkpoint in `cache`; the steps the progress callback saw; killed at `kill_at`."""
    cfg = compose_config(overrides, cache_dir=cache)
    data = prepare_data(cfg.data, str(cache))
    seen = []

    def progress(step, loss):
        seen.append(step)
        if step == kill_at:
            raise Killed

    handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cache), data, progress)
    return handle, seen


@pytest.mark.parametrize("overrides", [RESUMABLE, VISION], ids=["state", "vision"])
def test_a_killed_training_continues_to_the_weights_an_uninterrupted_one_ends_with(tmp_path, overrides):
    whole, steps = train(tmp_path / "whole", overrides=overrides)
    assert steps == list(range(1, 31))
    cache = tmp_path / "killed"
    with pytest.raises(Killed):
        train(cache, kill_at=17, overrides=overrides)
    [folder] = [p for p in (cache / "checkpoints").iterdir() if p.is_dir()]
    assert (folder / RESUME_FILE).is_file() and not (folder / CHECKPOINT_FILE).exists()
    resumed, steps = train(cache, overrides=overrides)
    assert steps == list(range(17, 31))  # the last save was after step 16: step 17 runs again, no earlier one
    assert not (folder / RESUME_FILE).exists()  # the run ended: nothing left to continue
    for name, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    ours, theirs = resumed.sidecar["metrics"], whole.sidecar["metrics"]
    assert ours["loss_curve"] == theirs["loss_curve"] and ours["time_sampling"] == theirs["time_sampling"]
    assert entry_folder(cache, "checkpoints", folder.name) == folder


def test_a_damaged_resume_file_is_set_aside_and_the_run_starts_over(tmp_path, caplog):
    cache = tmp_path / "cache"
    with pytest.raises(Killed):
        train(cache, kill_at=3)
    [folder] = [p for p in (cache / "checkpoints").iterdir() if p.is_dir()]
    (folder / RESUME_FILE).write_bytes(b"not a training state")
    handle, steps = train(cache)
    assert steps == list(range(1, 31)) and "not used" in caplog.text
    whole, _ = train(tmp_path / "whole")
    assert all(torch.equal(v, whole.model.state_dict()[k]) for k, v in handle.model.state_dict().items())
