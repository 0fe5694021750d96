"""data=lerobot and external gradient artifacts: a LeRobotDataset (v3.0 as LeRobot's source writes
it, v2.1 too) read with pyarrow; the built-in demonstrations exported and audited back to the same
scores; a foreign dataset with other dimensions, per-frame tasks and its own episode ids trains the
built-in policy and is audited; an artifact written with the docs' own snippet is accepted and a
mismatched one refused."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.configs import AUDIT_SMALL, REPO, compose_config
from helpers.lerobot import WRIST, foreign_dataset, wrist_pixel
from helpers.processes import run_main
from helpers.reliability import record_outcome
from vlaeval.data.lerobot import dataset_sha256, read_lerobot
from vlaeval.errors import UserInputError
from vlaeval.residual.artifact import ARTIFACT_JSON_SCHEMA

AUDIT_ON_LEROBOT = [o for o in AUDIT_SMALL if not o.startswith("data=")]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("lerobot")
    env = {"VLAEVAL_CACHE_DIR": str(work / "cache")}
    proc = run_main(
        [
            "job=export_lerobot",
            "data=tiny",
            "tracking=disabled",
            f"export.root={work / 'export'}",
            f"hydra.run.dir={work / 'x'}",
        ],
        work,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, env


def test_the_export_is_a_lerobot_v3_dataset_that_reads_back_to_the_same_demonstrations(work):
    work, env = work
    root = work / "export"
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] > 0 and info["fps"] == 80
    assert {"observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index"} == set(
        info["features"]
    )
    tasks = pd.read_parquet(root / "meta" / "tasks.parquet")
    assert tasks.index.name == "task" and list(tasks["task_index"]) == [0, 1]
    assert list(tasks.index) == ["reach the red goal position", "push the puck to the goal"]
    episodes = pd.read_parquet(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    assert {"episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index", "data/chunk_index"} <= set(
        episodes
    )
    data = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    assert data.schema.field("observation.state").type == pa.list_(pa.float32(), 39)
    assert len(data) == info["total_frames"] == int(episodes["length"].sum())
    result = json.loads((work / "x" / "result.json").read_text())
    assert result["round_trip_identical"] and result["dataset_sha256"] == result["source_manifest_sha256"]
    assert dataset_sha256(str(root)) == result["dataset_sha256"]


def test_auditing_the_export_scores_exactly_as_the_builtin_data(work):
    work, env = work
    results = {}
    for name, data in (("builtin", ["data=tiny"]), ("lerobot", ["data=lerobot", f"data.root={work / 'export'}"])):
        proc = run_main(
            ["job=residual_audit", "tracking=disabled", *AUDIT_ON_LEROBOT, *data, f"hydra.run.dir={work / name}"],
            work,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads((work / name / "result.json").read_text())
    a, b = results["builtin"], results["lerobot"]
    assert [x["mean_residual"] for x in a["anchors"]] == [x["mean_residual"] for x in b["anchors"]]
    assert [x["gradient_rms"] for x in a["anchors"]] == [x["gradient_rms"] for x in b["anchors"]]
    assert [(x["episode"], x["frame"]) for x in a["anchors"]] == [(x["episode"], x["frame"]) for x in b["anchors"]]
    assert (
        a["metrics"]["alignment.spearman_residual_vs_gradient_rms"]
        == b["metrics"]["alignment.spearman_residual_vs_gradient_rms"]
    )


def test_v2_1_and_v3_layouts_of_one_dataset_read_the_same(tmp_path):
    v3 = read_lerobot(foreign_dataset(tmp_path / "v3"), "observation.state", "action", "x")
    v21 = read_lerobot(foreign_dataset(tmp_path / "v21", version="v2.1"), "observation.state", "action", "x")
    assert v3.manifest_sha256 == v21.manifest_sha256
    assert v3.observations.shape == (146, 7) and v3.actions.shape == (146, 2)
    assert list(v3.episode_ids()) == list(range(10, 16)) and list(v3.episode_length) == [23, 31, 17, 26, 29, 20]
    assert v3.frame_task is not None and v3.frame_task[23 + 20] == 1 and v3.frame_task[23] == 0  # task per frame
    assert v3.trajectory_id(1) == "stack the red cube on the blue one/episode-11"


def test_camera_features_are_decoded_for_the_anchors_a_batch_uses(tmp_path):
    import torch

    from vlaeval.config import FlowConfig
    from vlaeval.data.anchors import build_anchors
    from vlaeval.policy.bound import bind_policy

    root = foreign_dataset(tmp_path / "d")
    demos = read_lerobot(root, "observation.state", "action", "x", ["observation.images.top"])
    plain = read_lerobot(root, "observation.state", "action", "x")
    assert demos.manifest_sha256 != plain.manifest_sha256  # the images are part of what the digest covers
    anchors = build_anchors(demos, 4)
    policy = bind_policy(torch.nn.Linear(1, 1), ["open the drawer", "close it"], FlowConfig())
    batch = policy.anchor_batch(anchors, np.array([5, 40]))
    images = batch["observation.images.top"]
    assert images.shape == (2, 3, 6, 8) and images.dtype == torch.uint8  # the documented layout
    assert images[:, 0, 0, 0].tolist() == [5, 40]  # frame i's red channel is i
    assert images[:, 2, 0, 0].tolist() == [255, 255] and int(images[:, 2, 1, 1].max()) == 0
    assert "observation.images.top" not in policy.anchor_batch(build_anchors(plain, 4), np.array([5]))


def _expected_wrist(demos):
    episode = np.repeat(demos.episode_ids(), demos.episode_length)
    frame = np.arange(demos.episode_length.sum()) - np.repeat(demos.episode_start, demos.episode_length)
    return np.stack([wrist_pixel(i, int(e), int(f)) for i, (e, f) in enumerate(zip(episode, frame))]).astype(int)


@pytest.mark.parametrize(
    "version, codec",
    [("v3.0", "libsvtav1"), ("v2.1", "libsvtav1"), ("v3.0", "libx264")],
    ids=["v3-av1", "v2.1-av1", "v3-h264"],
)
def test_a_video_camera_reaches_the_policy_at_each_frames_timestamp_decoded_once(tmp_path, version, codec):
    """Each anchor's wrist image is the video frame at its episode's from_timestamp plus its own
    timestamp (v3: several episodes per file, files split where the data files are not), within
    the codec's error; decoding every anchor twice decodes each frame once."""
    root = foreign_dataset(tmp_path / "d", version=version, video_codec=codec)
    demos = read_lerobot(root, "observation.state", "action", "x", [WRIST])
    frames = demos.cameras[WRIST]
    order = np.random.default_rng(0).permutation(len(frames))  # anchors come in any order
    images = demos.decode_cameras(order)[WRIST]
    assert images.shape == (len(frames), 3, 64, 64) and images.dtype == np.uint8
    error = np.abs(images[:, :, 32, 32].astype(int) - _expected_wrist(demos)[order])
    assert error.max() <= 4, error.max()  # the right frame: neighbours differ by >= 8 levels in some channel
    first_pass = frames.cache.decoded_frames
    assert len(frames) <= first_pass <= len(frames) + 4  # at most a keyframe's lead-in per file besides
    demos.decode_cameras(order[::-1])
    assert frames.cache.decoded_frames == first_pass  # the second pass is served from the cache


def test_the_video_cache_is_bounded_and_a_copy_starts_empty(tmp_path):
    import pickle

    root = foreign_dataset(tmp_path / "d")
    demos = read_lerobot(root, "observation.state", "action", "x", [WRIST], video_cache_bytes=2 * 31 * 3 * 64 * 64)
    frames = demos.cameras[WRIST]
    everything = demos.decode_cameras(np.arange(len(frames)))[WRIST]
    assert frames.cache.bytes <= frames.cache.max_bytes and len(frames.cache.segments) < 6
    again = pickle.loads(pickle.dumps(frames))
    assert again.cache.decoded_frames == 0 and np.array_equal(again.decode(np.arange(len(frames))), everything)


def _audit_foreign(work, env, root, *extra):
    return run_main(
        [
            "job=residual_audit",
            "tracking=disabled",
            *AUDIT_ON_LEROBOT,
            "data=lerobot",
            f"data.root={root}",
            "gradients.num_anchors=12",
            "gate.min_anchors=8",
            "gate.formal_min_anchors=8",
            *extra,
        ],
        work,
        env=env,
    )


def test_a_foreign_dataset_with_its_own_dimensions_trains_the_builtin_policy_and_is_audited(work, tmp_path):
    work, env = work
    root = foreign_dataset(tmp_path / "foreign")
    proc = _audit_foreign(
        work, env, root, "data.camera_features=[observation.images.top]", f"hydra.run.dir={tmp_path / 'audit'}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "audit" / "result.json").read_text())
    assert result["sample_count"] == 12 and all(x["episode"] >= 10 for x in result["anchors"])
    assert result["gradient_artifact"]["dataset_sha256"] == dataset_sha256(
        str(root), camera_features=["observation.images.top"]
    )
    # The same dataset without its camera, in the same cache: a state policy trains to the same
    # weights, but the data (and so the artifact's anchors' dataset) differ -- a new artifact, no refusal.
    again = _audit_foreign(work, env, root, f"hydra.run.dir={tmp_path / 'again'}")
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "again" / "result.json").read_text())
    assert second["gradient_artifact"]["dataset_sha256"] == dataset_sha256(str(root))


def test_a_dataset_whose_camera_is_av1_video_is_audited_with_a_vision_policy_reading_it(work, tmp_path):
    """The issue's user: a LeRobotDataset with an AV1 camera, the vision-language policy trained on
    its pixels and audited, its convolutions' per-sample gradients exact (checked against the loop)."""
    work, env = work
    root = foreign_dataset(tmp_path / "foreign")
    proc = _audit_foreign(
        work,
        env,
        root,
        "model=tiny_vla_vision_small",
        f"model.cameras=[{WRIST}]",
        f"data.camera_features=[{WRIST}]",
        "gradients.trainable=all",
        f"hydra.run.dir={tmp_path / 'audit'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "audit" / "result.json").read_text())
    artifact = result["gradient_artifact"]
    assert artifact["dataset_sha256"] == dataset_sha256(str(root), camera_features=[WRIST])
    assert artifact["layer_methods"]["images.0.layers.0"] == "conv2d_outer"  # the first Conv2d, in closed form
    assert artifact["layer_methods"]["text.embedding"] == "functional_vjp"
    assert result["sample_count"] == 12 and np.isfinite([a["mean_residual"] for a in result["anchors"]]).all()


def _snippet():
    text = (REPO / "docs" / "gradient_artifact.md").read_text()
    [code] = re.findall(r"## A writer any training loop can call\n\n```python\n(.*?)```", text, re.S)
    namespace: dict = {}
    exec(compile(code, "docs/gradient_artifact.md", "exec"), namespace)
    return namespace


def test_an_artifact_written_with_the_docs_snippet_is_audited_and_a_mismatched_one_refused(work, tmp_path):
    import torch

    from helpers.configs import builtin_policy
    from vlaeval.policy.flow import FlowConvention, flow_matching_losses

    work, env = work
    root = foreign_dataset(tmp_path / "foreign")
    cfg = compose_config([*AUDIT_ON_LEROBOT, "data=lerobot", f"data.root={root}"], cache_dir=work / "cache")
    data, handle = builtin_policy(cfg)
    model = handle.model
    params = list(model.trainable_parameters("action_head"))
    snippet = _snippet()
    rows, seeds = [], list(range(40, 56))
    flow = FlowConvention.of(cfg.flow)
    demos = data.demonstrations
    for anchor in np.random.default_rng(1).choice(len(data.anchors), 12, replace=False):
        batch = data.bind(model, cfg.flow).anchor_batch(data.anchors, np.array([anchor]))
        draws = []
        for seed in seeds:
            g = np.random.default_rng(seed * 100_003 + int(anchor))
            draws.append(
                (
                    torch.tensor(flow.sample_time(g, 1), dtype=torch.float32),
                    torch.from_numpy(g.standard_normal((1, 4, 2)).astype(np.float32)),
                )
            )
        row = snippet["gradient_artifact_row"](
            lambda d, batch=batch: flow_matching_losses(model, batch, d[0], d[1], flow)[0], params, draws
        )
        e = int(data.anchors.trajectory_index[anchor])
        rows.append((int(demos.episode_ids()[e]), int(data.anchors.anchor_index[anchor]), row))
    path = tmp_path / "theirs.json"
    snippet["write_gradient_artifact"](path, dataset_sha256(str(root)), rows, seeds, handle.sha256)
    jsonschema.validate(
        json.loads(path.read_text()), json.loads((REPO / "docs" / "gradient_artifact.schema.json").read_text())
    )

    proc = _audit_foreign(work, env, root, f"audit.gradient_artifact={path}", f"hydra.run.dir={tmp_path / 'audit'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "audit" / "result.json").read_text())
    assert [(x["episode"], x["frame"]) for x in result["anchors"]] == [(e, f) for e, f, _ in rows]
    assert result["gradient_artifact"]["gradient_seeds"] == seeds
    assert "alignment.spearman_residual_vs_gradient_rms" in result["metrics"]

    cases = {
        "another dataset's digest": ({"dataset_sha256": dataset_sha256(str(work / "export"))}, "indexes dataset"),
        "a frame past its episode": ({"anchors": [{**rows_json(path)[0], "frame": 500}]}, "anchor 0 (episode"),
        "an episode the dataset lacks": ({"anchors": [{**rows_json(path)[0], "episode": 3}]}, "has no episode 3"),
    }
    for case, (change, needle) in cases.items():
        bad = json.loads(path.read_text())
        if "anchors" in change:
            bad["anchors"] = change["anchors"] + bad["anchors"][1:]
        else:
            bad.update(change)
        bad_path = tmp_path / "bad.json"
        bad_path.write_text(json.dumps(bad))
        fresh = {"VLAEVAL_CACHE_DIR": str(tmp_path / "fresh_cache")}  # refused before any policy is trained
        proc = _audit_foreign(work, fresh, root, f"audit.gradient_artifact={bad_path}")
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
        assert not (tmp_path / "fresh_cache" / "checkpoints").exists()
        record_outcome(
            "gradient artifacts",
            f"external artifact: {case}",
            f"exit 2 before training: `{lines[0]}`",
            kind="bad input",
        )


def rows_json(path):
    return json.loads(path.read_text())["anchors"]


def test_the_schema_in_docs_is_the_schema_the_audit_checks():
    assert json.loads((REPO / "docs" / "gradient_artifact.schema.json").read_text()) == ARTIFACT_JSON_SCHEMA


def _with_codec(feature, codec):
    return {**feature, "info": {**feature["info"], "video.codec": codec}}


BAD_DATASETS = {
    "no meta/info.json": (lambda root: (root / "meta" / "info.json").unlink(), {}, "is not a LeRobotDataset"),
    "unknown state feature": (
        lambda root: None,
        {"state_feature": "observation.joints"},
        "its numeric features: observation.state, action",
    ),
    "image feature as state": (
        lambda root: None,
        {"state_feature": "observation.images.wrist"},
        "must be a 1-D float vector",
    ),
    "missing video file": (
        lambda root: (root / "videos" / WRIST / "chunk-000" / "file-001.mp4").unlink(),
        {"camera_features": [WRIST]},
        "file-001.mp4 is missing",
    ),
    "corrupt video file": (
        lambda root: (root / "videos" / WRIST / "chunk-000" / "file-000.mp4").write_bytes(b"\x00" * 300),
        {"camera_features": [WRIST]},
        "is corrupt or not a video",
    ),
    "video codec without a decoder": (
        lambda root: [
            f.write_bytes(f.read_bytes().replace(b"av01", b"zz01")) for f in (root / "videos").rglob("*.mp4")
        ],
        {"camera_features": [WRIST]},
        "cannot decode; re-encode it as AV1 or H.264",
    ),
    "video re-encoded without updating info.json": (
        lambda root: (root / "meta" / "info.json").write_text(
            json.dumps(
                (info := json.loads((root / "meta" / "info.json").read_text()))
                | {"features": {**info["features"], WRIST: _with_codec(info["features"][WRIST], "h264")}}
            )
        ),
        {"camera_features": [WRIST]},
        "is av1 video, but meta/info.json says video.codec=h264",
    ),
    "timestamp outside the video": (
        lambda root: (
            pd.read_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
            .assign(**{f"videos/{WRIST}/from_timestamp": [0.0, 0.8, 1.9, 2.5, 0.0, 3.0]})
            .to_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
        ),
        {"camera_features": [WRIST]},
        "outside its video",
    ),
    "unknown camera": (
        lambda root: None,
        {"camera_features": ["observation.images.side"]},
        "its camera features: observation.images.wrist, observation.images.top",
    ),
    "unreadable version": (
        lambda root: (root / "meta" / "info.json").write_text(
            json.dumps({**json.loads((root / "meta" / "info.json").read_text()), "codebase_version": "v1.6"})
        ),
        {},
        "codebase_version v1.6 is not one vlaeval reads",
    ),
    "truncated data file": (
        lambda root: [
            f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2]) for f in (root / "data").rglob("*.parquet")
        ],
        {},
        "is corrupt or not a Parquet file",
    ),
    "data file without the action column": (
        lambda root: [
            pd.read_parquet(f).drop(columns=["action"]).to_parquet(f) for f in (root / "data").rglob("*.parquet")
        ],
        {},
        "lacks the column(s) ['action']",
    ),
    "episode length disagrees with its metadata": (
        lambda root: (
            pd.read_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
            .assign(length=[23, 30, 17, 26, 29, 20])
            .to_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
        ),
        {},
        "episode 11 of",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_DATASETS))
def test_a_bad_dataset_is_one_line_naming_the_problem(tmp_path, case):
    damage, settings, needle = BAD_DATASETS[case]
    root = foreign_dataset(tmp_path / "d")
    damage(root)
    from vlaeval.data.lerobot import LeRobotDemonstrations

    source = LeRobotDemonstrations(str(root), **settings)
    with pytest.raises(UserInputError) as error:
        source.validate()
        source.load(tmp_path)
    message = str(error.value)
    assert needle in message and "\n" not in message, message
    record_outcome(
        "datasets", f"LeRobotDataset: {case}", f"one-line error before any work: `{message}`", kind="bad input"
    )


def test_the_frames_of_an_av1_camera_decide_a_vision_policys_scores(tmp_path):
    """A vision policy scoring a dataset whose camera is AV1 video reads the decoded frames: the
    same anchors score differently when only the video's pixels differ (another video of the same
    length: a textured scene, where the flat colours of the original give the spatial softmax no
    place to point), and identically when the video is the same."""
    import shutil

    import torch

    from helpers.lerobot import write_av1
    from vlaeval.config import FlowConfig
    from vlaeval.data.anchors import build_anchors
    from vlaeval.policy.builtin import PolicyData
    from vlaeval.policy.tiny_vla_vision import TinyVLAVision
    from vlaeval.residual.estimators import score_anchors

    root = foreign_dataset(tmp_path / "d")
    other = tmp_path / "other"
    shutil.copytree(root, other)
    rng = np.random.default_rng(0)
    for video in (other / "videos").rglob("*.mp4"):
        import av

        with av.open(str(video)) as container:
            frames = container.streams.video[0].frames
        blocks = rng.integers(0, 256, (frames, 8, 8, 3), dtype=np.uint8)
        write_av1(video, np.ascontiguousarray(blocks.repeat(8, axis=1).repeat(8, axis=2)))

    def scores(folder):
        demos = read_lerobot(folder, "observation.state", "action", "x", [WRIST])
        data = PolicyData(demos, build_anchors(demos, 4), False)
        torch.manual_seed(0)
        model = TinyVLAVision(data.vocabulary, 7, 2, 4, cameras=[WRIST], image_size=32, image_channels=8)
        policy = data.bind(model, FlowConfig())
        index = np.arange(0, len(data.anchors.base_index), 7)
        return score_anchors(
            policy, data.anchors, index, kind="iid", seeds=[1, 2], samples_per_estimator=4, anchor_batch_size=16
        ).estimator_residuals.mean(axis=0)

    seen, again, textured = scores(root), scores(root), scores(other)
    assert np.array_equal(seen, again)
    # The pixels move the scores: far beyond float32 rounding (~1e-7 here), though an untrained
    # spatial softmax is nearly flat, so by little.
    assert np.abs(seen - textured).max() > 1e-5
