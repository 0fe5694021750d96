"""The content-addressed store behind the built-in data, checkpoints and gradient artifacts: an entry
is read when whole and verified, rebuilt (and reported) when damaged, built once when absent."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from vlaeval.artifacts import atomic_write_json, read_json
from vlaeval.store import get_or_build, put


def _reader(folder: Path) -> dict:
    value = read_json(folder / "value.json")
    if value.get("check") != value["n"] * 2:
        raise ValueError("the value does not match its check")
    return value


def _builder(calls: list):
    def build(folder: Path) -> dict:
        calls.append(folder)
        value = {"n": 21, "check": 42}
        atomic_write_json(folder / "value.json", value)
        return value

    return build


def test_built_once_then_read(tmp_path):
    calls: list = []
    first = get_or_build(tmp_path, "things", "a" * 64, ["value.json"], _reader, _builder(calls))
    second = get_or_build(tmp_path, "things", "a" * 64, ["value.json"], _reader, _builder(calls))
    assert first == ({"n": 21, "check": 42}, True) and second == ({"n": 21, "check": 42}, False)
    assert len(calls) == 1 and calls[0] == tmp_path / "things" / ("a" * 64)


@pytest.mark.parametrize("damage", ["not json", '{"n": 21, "check": 41}', ""])
def test_a_damaged_entry_is_reported_and_rebuilt_never_trusted(tmp_path, caplog, damage):
    calls: list = []
    get_or_build(tmp_path, "things", "b" * 64, ["value.json"], _reader, _builder(calls))
    (tmp_path / "things" / ("b" * 64) / "value.json").write_text(damage)
    with caplog.at_level(logging.WARNING, logger="vlaeval.store"):
        value, built = get_or_build(tmp_path, "things", "b" * 64, ["value.json"], _reader, _builder(calls))
    assert built and value["check"] == 42 and len(calls) == 2
    assert "cached things at" in caplog.text and "rejected" in caplog.text
    assert json.loads((tmp_path / "things" / ("b" * 64) / "value.json").read_text())["check"] == 42


def test_an_entry_missing_one_of_its_files_is_built_without_a_warning(tmp_path, caplog):
    calls: list = []
    folder = tmp_path / "things" / ("c" * 64)
    folder.mkdir(parents=True)
    (folder / "other.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="vlaeval.store"):
        _, built = get_or_build(tmp_path, "things", "c" * 64, ["value.json", "other.json"], _reader, _builder(calls))
    assert built and "rejected" not in caplog.text


def test_put_fills_an_entry_the_reader_then_serves_and_keeps_a_good_one(tmp_path, caplog):
    """store.put is how a job that built an entry's files elsewhere (job=train's checkpoint) fills it:
    the entry is then read, not built; a complete, verified entry is kept; a damaged one replaced."""
    built_elsewhere = tmp_path / "run" / "value.json"
    atomic_write_json(built_elsewhere, {"n": 5, "check": 10})
    folder, filled = put(tmp_path / "store", "things", "d" * 64, [built_elsewhere], _reader)
    assert filled and folder == tmp_path / "store" / "things" / ("d" * 64)
    calls: list = []
    assert get_or_build(tmp_path / "store", "things", "d" * 64, ["value.json"], _reader, _builder(calls)) == (
        {"n": 5, "check": 10},
        False,
    )
    assert calls == []
    other = tmp_path / "other" / "value.json"
    atomic_write_json(other, {"n": 6, "check": 12})
    assert put(tmp_path / "store", "things", "d" * 64, [other], _reader) == (folder, False)  # kept
    assert read_json(folder / "value.json")["n"] == 5
    (folder / "value.json").write_text('{"n": 5, "check": 9}')  # damaged: replaced, and said so
    with caplog.at_level(logging.WARNING, logger="vlaeval.store"):
        assert put(tmp_path / "store", "things", "d" * 64, [other], _reader) == (folder, True)
    assert read_json(folder / "value.json")["n"] == 6 and "rejected" in caplog.text
    assert not [p for p in folder.iterdir() if p.name.startswith(".value.json")]  # no temporary left


def test_each_cached_kinds_key_holds_the_digests_its_reader_compares():
    """A key that leaves out what the entry's reader checks hands a later run an entry it must refuse
    (the gradient artifact of a checkpoint trained to the same weights on other data: "indexes
    dataset ..., but the data here is ..."). Each kind's key changes with each such digest."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from helpers.configs import compose_config
    from vlaeval.envs.episodes import Episode
    from vlaeval.policy.builtin import PolicySpec, checkpoint_key
    from vlaeval.residual.artifact import gradient_artifact_key
    from vlaeval.rollouts.episode_cache import episode_key

    # gradients: recover_anchors compares the dataset, check_checkpoint the checkpoint.
    g, flow = OmegaConf.create({"num_anchors": 8}), OmegaConf.create({"kind": "pi0"})
    base = gradient_artifact_key("c" * 64, "d" * 64, g, flow)
    assert base != gradient_artifact_key("c" * 64, "e" * 64, g, flow)
    assert base != gradient_artifact_key("f" * 64, "d" * 64, g, flow)
    # checkpoints: a checkpoint is trained on the data its manifest names.
    spec = PolicySpec.of(compose_config([]))

    def data(manifest: str) -> SimpleNamespace:
        return SimpleNamespace(
            demonstrations=SimpleNamespace(manifest_sha256=manifest), anchors=SimpleNamespace(horizon=4)
        )

    assert checkpoint_key(spec, data("d" * 64)) != checkpoint_key(spec, data("e" * 64))
    # rollout episodes: an outcome is the checkpoint's on that episode under those controls.
    episode = Episode("reach-v3", 0, 25, 7)
    controls = OmegaConf.create({"max_steps": 10})
    assert episode_key("c" * 64, episode, controls) != episode_key("f" * 64, episode, controls)
