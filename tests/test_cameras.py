"""Cameras end to end: the built-in recorder renders Meta-World cameras offscreen on the CPU
(MuJoCo through OSMesa), caches them with the demonstrations, and job=export_lerobot writes them as
LeRobot writes a camera -- AV1 video under videos/ -- which data=lerobot reads back frame for frame."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from helpers.processes import run_main
from helpers.servers import need, osmesa_installed
from vlaeval.data.cameras import MIN_ROUND_TRIP_PSNR_DB, pixel_error
from vlaeval.data.lerobot import read_lerobot
from vlaeval.data.metaworld import MetaWorldDemonstrations, dataset_key, load_or_build_demonstrations
from vlaeval.errors import UserInputError

CORNER = "observation.images.corner"


@pytest.fixture(autouse=True, scope="module")
def _osmesa():
    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")


SMALL = dict(tasks=["reach-v3", "push-v3"], episodes_per_task=1, max_steps=30)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    data = MetaWorldDemonstrations(**SMALL, cameras=["corner", "topview"], image_size=48)
    demos, built = load_or_build_demonstrations(data, cache)
    assert built
    return data, cache, demos


def test_the_recorder_renders_each_camera_at_every_step(recorded):
    data, cache, demos = recorded
    steps = demos.observations.shape[0]
    images = demos.decode_cameras(np.arange(steps))
    assert sorted(images) == [CORNER, "observation.images.topview"]
    corner = images[CORNER]
    assert corner.shape == (steps, 3, 48, 48) and corner.dtype == np.uint8
    # The scene is lit and the arm moves: frames are not blank, and they change along an episode.
    assert 40 < corner.mean() < 220
    first, last = corner[0].astype(int), corner[int(demos.episode_length[0]) - 1].astype(int)
    assert np.abs(first - last).mean() > 1.0
    # The two cameras see different things.
    assert np.abs(corner.astype(int) - images["observation.images.topview"].astype(int)).mean() > 10
    assert demos.manifest["cameras"] == [CORNER, "observation.images.topview"]


def test_cameras_are_cached_with_the_demonstrations_and_rendering_is_deterministic(recorded):
    data, cache, demos = recorded
    again, built = load_or_build_demonstrations(data, cache)
    assert not built and again.manifest_sha256 == demos.manifest_sha256
    steps = np.arange(demos.observations.shape[0])
    assert np.array_equal(again.decode_cameras(steps)[CORNER], demos.decode_cameras(steps)[CORNER])
    # A second recording renders the very same pixels (the digest covers them).
    fresh, built = load_or_build_demonstrations(data, cache / "elsewhere")
    assert built and fresh.manifest_sha256 == demos.manifest_sha256
    # Without cameras the data (and its cache key) is what it was before cameras existed.
    plain = MetaWorldDemonstrations(**SMALL)
    legacy = SimpleNamespace(**{k: v for k, v in vars(plain).items() if k not in ("cameras", "image_size")})
    assert dataset_key(plain) == dataset_key(legacy) != dataset_key(data)


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"cameras": ["front"]}, "'front' is not a Meta-World camera; choose from topview, corner"),
        ({"cameras": ["corner", "corner"]}, "lists a camera twice"),
        ({"cameras": ["corner"], "image_size": 4}, "data.image_size=4 must be between 8 and 512"),
    ],
)
def test_a_bad_camera_setting_is_one_line_before_recording(settings, needle, tmp_path):
    with pytest.raises(UserInputError) as error:
        MetaWorldDemonstrations(**SMALL, **settings).load(tmp_path)
    assert needle in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "demonstrations").exists()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    work = tmp_path_factory.mktemp("export")
    env = {"VLAEVAL_CACHE_DIR": str(work / "cache")}
    proc = run_main(
        [
            "job=export_lerobot",
            "data=tiny_vision",
            "tracking=disabled",
            f"export.root={work / 'lerobot'}",
            f"hydra.run.dir={work / 'run'}",
        ],
        work,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, env, json.loads((work / "run" / "result.json").read_text())


def test_the_export_writes_each_camera_as_av1_video_the_way_lerobot_does(exported):
    work, env, result = exported
    root = work / "lerobot"
    info = json.loads((root / "meta" / "info.json").read_text())
    feature = info["features"][CORNER]
    assert feature["dtype"] == "video" and feature["shape"] == [64, 64, 3]
    assert feature["info"]["video.codec"] == "av1" and feature["info"]["video.pix_fmt"] == "yuv420p"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert (root / "videos" / CORNER / "chunk-000" / "file-000.mp4").is_file()
    episodes = pd.read_parquet(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    starts = np.r_[0, np.cumsum(episodes["length"])[:-1]] / 80.0
    assert np.allclose(episodes[f"videos/{CORNER}/from_timestamp"], starts)
    assert result["round_trip_identical"]  # every array but the pixels, bit for bit
    camera = result["cameras"][CORNER]
    assert camera["codec"] == "av1" and camera["within_codec_error"] and camera["psnr_db"] >= MIN_ROUND_TRIP_PSNR_DB


def test_the_exported_video_reads_back_frame_for_frame(exported):
    """Each frame read back is the recorded frame at its own step: its error is the codec's, and
    it is smaller than against the neighbouring step (a one-frame slip would show)."""
    work, env, result = exported
    source = MetaWorldDemonstrations(**{**SMALL, "episodes_per_task": 3, "max_steps": 60}, cameras=["corner"])
    demos, _ = source.load(work / "cache")
    back = read_lerobot(work / "lerobot", "observation.state", "action", "x", [CORNER])
    assert back.manifest_sha256 == result["dataset_sha256"]
    error = pixel_error(demos.cameras[CORNER], back.cameras[CORNER])
    assert error.psnr_db == pytest.approx(result["cameras"][CORNER]["psnr_db"], abs=1e-6)
    steps = np.arange(demos.observations.shape[0])
    a = demos.decode_cameras(steps)[CORNER].astype(float)
    b = back.decode_cameras(steps)[CORNER].astype(float)
    moving = np.flatnonzero(np.abs(a[1:] - a[:-1]).mean(axis=(1, 2, 3)) > 0.5)  # steps where the scene changes
    aligned = ((a[moving] - b[moving]) ** 2).mean(axis=(1, 2, 3))
    slipped = ((a[moving + 1] - b[moving]) ** 2).mean(axis=(1, 2, 3))
    assert moving.size > 50 and np.mean(aligned < slipped) > 0.9


def _scene(task: str):
    from vlaeval.envs.metaworld import EpisodeRunner

    runner = EpisodeRunner()
    env, _ = runner.env(task, 0)
    for _ in range(5):
        env.step(np.array([0.5, 0.2, 0.1, 0.0]))
    return runner, env


def test_closing_one_renderer_leaves_the_others_drawing_their_own_scene():
    """MuJoCo frees a renderer's GL objects in whichever OSMesa context is current; closing one
    renderer while another lives used to delete the live one's buffers (its frames turned to noise)."""
    from vlaeval.envs.rendering import SceneCameras

    runner, push = _scene("push-v3")
    reach, _ = runner.env("reach-v3", 0)
    first = SceneCameras(push.unwrapped.model, ["corner"], 32)
    second = SceneCameras(reach.unwrapped.model, ["corner"], 32)
    before = second.render(reach.unwrapped.data)[CORNER]
    first.close()  # the second renderer's context is the current one here
    after = second.render(reach.unwrapped.data)[CORNER]
    assert np.array_equal(before, after)
    second.close()
    runner.close()


def test_simplified_meshes_change_few_pixels_and_leave_the_physics_its_own_faces():
    """The renderer draws meshes simplified by vertex clustering (a fraction of the triangles); the
    frame barely changes, and the model's own faces are back once the renderer has uploaded them."""
    import mujoco

    from vlaeval.envs import rendering

    runner, env = _scene("pick-place-v3")
    model, data = env.unwrapped.model, env.unwrapped.data
    faces = model.mesh_face.copy()
    simplified = rendering.SceneCameras(model, ["corner"], 64, goal_marker=None)  # the meshes alone
    assert np.array_equal(model.mesh_face, faces)
    frame = simplified.render(data)[CORNER].astype(int)
    simplified.close()
    kept = rendering.simplify_meshes(model, rendering.MESH_CELL_AT_64)
    assert np.array_equal(kept, faces)  # what it returns is what was there
    dropped = float(np.mean(np.all(model.mesh_face == 0, axis=1)))
    model.mesh_face[:] = kept
    assert dropped > 0.5  # most of the Sawyer's triangles are far below a pixel
    full = mujoco.Renderer(model, 64, 64)
    full.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = full.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
    model.vis.quality.offsamples = 0
    full.update_scene(data, camera="corner")
    reference = full.render()[::-1].astype(int)
    full.close()
    changed = float(np.mean(np.abs(frame - reference).max(axis=-1) > 30))
    assert changed < 0.02, changed
    assert np.abs(frame - reference).mean() < 2.0
    runner.close()


def _pixel_of(model, data, camera: str, point: np.ndarray, size: int) -> np.ndarray:
    """Where `point` (world, metres) falls in a size x size frame of `camera`, (row, column): MuJoCo's
    pinhole camera looks down its -z axis with vertical field of view fovy, and in the renderer's
    frames (flipped rows: Meta-World's cameras are set up with y pointing down) +y runs down the rows."""
    import mujoco

    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    local = data.cam_xmat[cam].reshape(3, 3).T @ (point - data.cam_xpos[cam])
    focal = (size / 2) / np.tan(np.radians(model.cam_fovy[cam]) / 2)
    return np.array([size / 2 + focal * local[1] / -local[2], size / 2 + focal * local[0] / -local[2]])


@pytest.mark.parametrize("variant", [0, 7, 19])
def test_the_goal_is_drawn_where_the_camera_sees_it_and_the_physics_never_sees_the_marker(variant):
    """Meta-World's goal site is a 1-2 px speck at 64x64 (red on the red arm for reach): the renderer
    draws it as a GOAL_MARKER_RADIUS green sphere. The blob of marker pixels sits on the goal's
    projection; Meta-World's own drawing (goal_marker=None) has none there; the model and the state
    observation are untouched."""
    import mujoco

    from vlaeval.envs import rendering
    from vlaeval.envs.metaworld import EpisodeRunner

    runner = EpisodeRunner()
    env, obs = runner.env("reach-v3", variant)
    model, data = env.unwrapped.model, env.unwrapped.data
    goal = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, rendering.GOAL_SITE)
    size_before, rgba_before = model.site_size.copy(), model.site_rgba.copy()
    marked = rendering.SceneCameras(model, ["corner"], 64)
    plain = rendering.SceneCameras(model, ["corner"], 64, goal_marker=None)
    frame, own = marked.render(data)[CORNER].astype(int), plain.render(data)[CORNER].astype(int)
    marked.close(), plain.close()

    def green(image):
        return (image[..., 1] > 150) & (image[..., 0] < 120) & (image[..., 2] < 120)

    blob = np.argwhere(green(frame))
    assert 4 <= len(blob) <= 40, len(blob)  # a few pixels across, not a wash over the scene
    expected = _pixel_of(model, data, "corner", data.site_xpos[goal], 64)
    assert np.abs(blob.mean(axis=0) + 0.5 - expected).max() < 1.5, (blob.mean(axis=0), expected)
    assert not green(own).any()  # Meta-World's reach goal is a red speck
    changed = np.argwhere(np.abs(frame - own).max(axis=-1) > 30)
    assert np.abs(changed - expected).max() < 4  # nothing else in the frame moved
    assert np.array_equal(model.site_size, size_before) and np.array_equal(model.site_rgba, rgba_before)
    assert np.array_equal(env.unwrapped._get_obs(), obs)
    runner.close()


@pytest.mark.parametrize("seed", [3, 11])
def test_a_counterfactual_marker_is_drawn_away_from_the_goal_which_the_physics_keeps(seed):
    """perturbation.goal_marker_shift: the cameras show the marker that many metres from the true goal
    on the table (a direction drawn from the episode's seed), where the unshifted episode shows it on
    the goal; the state observation, the steps and the success test are the true goal's."""
    import mujoco

    from vlaeval.envs import rendering
    from vlaeval.envs.episodes import Episode, Perturbation, goal_marker_offset
    from vlaeval.envs.metaworld import SceneEnvironments

    def green(image):
        return (image[..., 1] > 150) & (image[..., 0] < 120) & (image[..., 2] < 120)

    shifted = Episode("reach-v3", 0, 30, seed, perturbation=Perturbation(goal_marker_shift=0.15))
    offset = goal_marker_offset(shifted)
    assert np.isclose(np.linalg.norm(offset), 0.15) and offset[2] == 0.0
    envs = SceneEnvironments(["corner"], 64)
    try:
        observations = [envs.open(Episode("reach-v3", 0, 30, seed)), envs.open(shifted)]
        assert np.array_equal(*observations)  # the state observation: the true goal
        model, data = envs.envs[1].unwrapped.model, envs.envs[1].unwrapped.data
        goal = data.site_xpos[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, rendering.GOAL_SITE)].copy()
        for k, where in ((0, goal), (1, goal + offset)):
            blob = np.argwhere(green(envs.images(k)[CORNER]))
            assert len(blob) >= 3
            expected = _pixel_of(model, data, "corner", where, 64)
            assert np.abs(blob.mean(axis=0) + 0.5 - expected).max() < 2.0, (k, blob.mean(axis=0), expected)
        steps = [envs.step(k, np.array([0.5, 0.0, 0.0, 0.0])) for k in (0, 1)]
        assert np.array_equal(steps[0][0], steps[1][0]) and steps[0][1:] == steps[1][1:]
    finally:
        envs.close()
