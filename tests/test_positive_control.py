"""The gate's positive control (data=metaworld_jittery): demonstrations where a few episodes were
recorded by a jittery operator, whose anchors keep a high loss and large gradients however long the
policy trains. There the audit must find those anchors and PASS its ratio verdict; on the same data
with clean labels (the negative control) it must not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.configs import AUDIT_SMALL, compose_config
from vlaeval.data.metaworld import jittery_episodes
from vlaeval.jobs import dispatch

# AUDIT_SMALL's data and policy at a formal gate: 64 anchors, the policy trained long enough that its
# loss on clean anchors has fallen well below the jitter's.
SMALL = [
    *(o for o in AUDIT_SMALL if not o.startswith(("gate=", "gradients.num_anchors", "train.steps"))),
    "gate=formal",
    "gradients.num_anchors=64",
    "train.steps=300",
    "audit.plot=false",
    "tracking=disabled",
]
JITTER = ["data.noisy_label_fraction=0.34", "data.label_noise=3.0"]  # 2 of data=tiny's 6 episodes


def audit(tmp_path: Path, cache: Path, name: str, overrides) -> dict:
    every = [*SMALL, *overrides]
    cfg = compose_config(every, output_dir=tmp_path / name, cache_dir=cache)
    dispatch(cfg, every)
    return json.loads((tmp_path / name / "result.json").read_text())


def test_which_episodes_are_jittery_is_seeded_and_sized():
    assert jittery_episodes(72, 0.0, 0) == frozenset()
    assert len(jittery_episodes(72, 0.1, 0)) == 7 and len(jittery_episodes(6, 0.01, 0)) == 1  # at least one
    assert jittery_episodes(72, 0.1, 0) == jittery_episodes(72, 0.1, 0) != jittery_episodes(72, 0.1, 1)
    assert jittery_episodes(6, 1.0, 3) == frozenset(range(6))


@pytest.fixture(scope="module")
def audits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("control")
    cache = tmp / "cache"
    return audit(tmp, cache, "jittery", JITTER), audit(tmp, cache, "clean", []), cache


def test_the_gate_passes_where_anchor_sampling_pays_and_not_on_clean_labels(audits):
    jittery, clean, _ = audits
    verdict = jittery["gate"]["verdict"]
    assert verdict["verdict"] == "PASS", verdict
    assert verdict["high"] < 0.9 and jittery["gate"]["pass"]
    # The negative control: the same data and policy with clean labels is no PASS.
    assert clean["gate"]["verdict"]["verdict"] != "PASS", clean["gate"]["verdict"]


def test_the_score_ranks_the_jittery_operators_anchors_first(audits):
    """The anchors the residual ranks highest are the jittery episodes' (from the recorded labels and
    the manifest's list of those episodes), and the clean-label data records none."""
    jittery, _, cache = audits
    from vlaeval.policy.builtin import prepare_data

    cfg = compose_config([*SMALL, *JITTER], cache_dir=cache)
    data = prepare_data(cfg.data, str(cache))
    demos = data.anchors.demonstrations
    noisy = set(demos.manifest["jittery_episodes"])
    assert len(noisy) == 2
    clean_cfg = compose_config(SMALL, cache_dir=cache)
    clean_demos = prepare_data(clean_cfg.data, str(cache)).anchors.demonstrations
    assert "jittery_episodes" not in clean_demos.manifest

    # The clean episodes' labels are the clean data's, to the bit: the jitter draws from its own stream.
    def labels(d, e):
        return d.actions[d.episode_start[e] : d.episode_start[e] + d.episode_length[e]]

    for e in range(demos.episode_length.size):
        assert np.array_equal(labels(demos, e), labels(clean_demos, e)) == (e not in noisy)
    anchors = jittery["anchors"]
    on_noisy = np.array([a["episode"] in noisy for a in anchors])
    score = np.array([a["mean_residual"] for a in anchors])
    assert 0 < on_noisy.sum() < on_noisy.size
    top = np.argsort(-score)[: on_noisy.sum()]
    assert on_noisy[top].mean() >= 0.9  # the highest scores are the jittery anchors
