"""job=score: shards of the per-anchor scores equal one whole run, and the merge refuses shards that
do not cover every anchor exactly once with the same settings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.configs import AUDIT_SMALL, builtin_policy, compose_config, for_job
from helpers.processes import run_main
from helpers.reliability import record_outcome
from vlaeval.errors import UserInputError
from vlaeval.residual.estimators import score_anchors
from vlaeval.residual.scores import find_shards, merge_shards, read_scores, shard_range, write_shard

SCORE_SMALL = [*for_job("score", AUDIT_SMALL), "job=score", "estimator.samples_per_estimator=8", "tracking=disabled"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    cfg = compose_config(
        SCORE_SMALL, output_dir=tmp_path_factory.mktemp("out"), cache_dir=tmp_path_factory.mktemp("cache")
    )
    data, handle = builtin_policy(cfg)
    return cfg, data, handle


@pytest.mark.parametrize("kind", ["sobol", "iid", "stratified"])
def test_shards_score_every_anchor_as_one_whole_run_does(small, kind):
    """Uneven shards (3 of 332 anchors, and a shard boundary inside a draw block) give the whole
    run's residuals: an anchor's draws depend on its row, not on its shard."""
    cfg, data, handle = small
    n = len(data.anchors)
    common = dict(kind=kind, seeds=[1, 2, 3, 4], samples_per_estimator=8, anchor_batch_size=64)
    whole = score_anchors(data.bind(handle.model, cfg.flow), data.anchors, np.arange(n), **common)
    parts = []
    for index in range(3):
        start, stop = shard_range(n, index, 3)
        parts.append(
            score_anchors(
                data.bind(handle.model, cfg.flow), data.anchors, np.arange(start, stop), first_row=start, **common
            ).estimator_residuals
        )
    joined = np.concatenate(parts, axis=1)
    assert np.allclose(joined, whole.estimator_residuals, rtol=1e-5, atol=0)
    # The negative control: scoring a shard from row 0 (its position in the shard) is not the same.
    start, stop = shard_range(n, 1, 3)
    wrong = score_anchors(data.bind(handle.model, cfg.flow), data.anchors, np.arange(start, stop), **common)
    assert not np.allclose(wrong.estimator_residuals, parts[1], rtol=1e-3)


SETTINGS = {
    "checkpoint_sha256": "a" * 64,
    "dataset_manifest_sha256": "b" * 64,
    "total_anchors": 100,
    "estimator": {"kind": "sobol", "seeds": [1, 2, 3, 4], "samples_per_estimator": 8},
    "flow": {},
}


def _shards(folder, count=4, settings=SETTINGS, total=100):
    rng = np.random.default_rng(0)
    for index in range(count):
        start, stop = shard_range(total, index, count)
        write_shard(folder, settings, index, count, np.arange(start, stop), rng.gamma(1.0, 1.0, (4, stop - start)))


def test_merge_joins_the_shards_in_anchor_order(tmp_path):
    _shards(tmp_path)
    metadata, arrays = merge_shards(find_shards(tmp_path))
    assert np.array_equal(arrays["anchor_positions"], np.arange(100))
    assert arrays["estimator_residuals"].shape == (4, 100)
    assert len(metadata["shards"]) == 4
    # A merged file is itself a scores file (one shard of one) that reads back the same.
    write_shard(
        tmp_path / "merged", metadata["settings"], 0, 1, arrays["anchor_positions"], arrays["estimator_residuals"]
    )
    _, again = read_scores(tmp_path / "merged" / "scores-00000-of-00001.json")
    assert np.array_equal(again["mean_residual"], arrays["mean_residual"])


@pytest.mark.parametrize(
    "total,count,gone,first,last", [(100, 4, 2, 50, 74), (101, 3, 1, 33, 66), (332, 3, 1, 110, 220)]
)
def test_merge_names_the_missing_anchors_and_the_shard_to_run(tmp_path, total, count, gone, first, last):
    """Uneven shards too (the last case is the CLI test's): the hint names exactly the shard missing."""
    _shards(tmp_path, count=count, settings={**SETTINGS, "total_anchors": total}, total=total)
    (tmp_path / f"scores-{gone:05d}-of-{count:05d}.json").unlink()
    with pytest.raises(UserInputError) as error:
        merge_shards(find_shards(tmp_path))
    message = str(error.value)
    assert f"anchors {first}-{last} have no score (of {total})" in message
    assert message.endswith(f"score.shard_count={count}: score.shard_index={gone}"), message


def test_merge_refuses_anchors_scored_twice(tmp_path):
    _shards(tmp_path / "a", count=4)
    _shards(tmp_path / "b", count=2)
    with pytest.raises(UserInputError, match="are scored twice"):
        merge_shards(find_shards(tmp_path))


@pytest.mark.parametrize(
    "field,value",
    [
        ("checkpoint_sha256", "c" * 64),
        ("dataset_manifest_sha256", "d" * 64),
        ("estimator", {"kind": "iid", "seeds": [1, 2, 3, 4], "samples_per_estimator": 8}),
    ],
)
def test_merge_refuses_shards_scored_with_other_settings(tmp_path, field, value):
    _shards(tmp_path)
    other = {**SETTINGS, field: value}
    rng = np.random.default_rng(1)
    write_shard(tmp_path, other, 3, 4, np.arange(75, 100), rng.gamma(1.0, 1.0, (4, 25)))  # replaces shard 3
    with pytest.raises(UserInputError, match=f"scored with other {field}"):
        merge_shards(find_shards(tmp_path))


def test_a_modified_shard_is_refused(tmp_path):
    _shards(tmp_path)
    npz = tmp_path / "scores-00001-of-00004.npz"
    npz.write_bytes(npz.read_bytes()[:-10])
    with pytest.raises(UserInputError, match="does not match the digest in its sidecar"):
        merge_shards(find_shards(tmp_path))


def test_score_multirun_shards_merge_to_the_single_process_scores(small, tmp_path):
    """Through main.py (on the module's cache: data and checkpoint already built): a 3-shard
    multirun and its merge equal one whole in-process scoring; a merge with a shard missing fails
    in one line."""
    cfg, data, handle = small
    common = [*SCORE_SMALL, f"paths.cache_dir={cfg.paths.cache_dir}"]
    sweep = tmp_path / "sweep"
    proc = run_main(
        [*common, "score.shard_count=3", "score.shard_index=0,1,2", f"hydra.sweep.dir={sweep}", "-m"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(find_shards(sweep)) == 3
    merged = run_main([*common, f"score.merge={sweep}", f"hydra.run.dir={tmp_path / 'merged'}"], tmp_path)
    assert merged.returncode == 0, merged.stderr[-2000:]
    result = json.loads((tmp_path / "merged" / "result.json").read_text())
    assert [s["index"] for s in result["merged_from"]] == [0, 1, 2]
    assert result["settings"]["checkpoint_sha256"] == handle.sha256
    metadata, joined = read_scores(tmp_path / "merged" / "scores-00000-of-00001.json")
    assert metadata["settings"]["dataset_manifest_sha256"] == data.demonstrations.manifest_sha256
    whole = score_anchors(
        data.bind(handle.model, cfg.flow),
        data.anchors,
        np.arange(len(data.anchors)),
        kind=str(cfg.estimator.kind),
        seeds=list(cfg.estimator.seeds),
        samples_per_estimator=int(cfg.estimator.samples_per_estimator),
        anchor_batch_size=int(cfg.estimator.anchor_batch_size),
    )
    assert np.allclose(joined["estimator_residuals"], whole.estimator_residuals, rtol=1e-5, atol=0)
    # Merging a folder with a shard missing fails in one line, writing nothing.
    (sweep / "1" / "scores-00001-of-00003.json").unlink()
    bad = run_main([*common, f"score.merge={sweep}", f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("score.shard_count=3: score.shard_index=1"), bad.stderr
    assert not (tmp_path / "bad" / "result.json").exists()
    [line] = [x for x in bad.stderr.splitlines() if x.strip()]
    record_outcome(
        "configs", "score merge with a shard missing", f"exit 2, nothing written: `{line}`", kind="bad input"
    )
