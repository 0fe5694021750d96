"""A policy that sees and reads, in rollouts and jobs: the lockstep engine renders the cameras a
policy reads at every call, visual perturbations change what it sees identically for any policy on
an episode, language families change what it is told, episodes without either keep their cache
keys; job=train's evaluation conditions, the vision gauntlet and the ablation run on it."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest
import torch

from helpers.servers import need, osmesa_installed
from vlaeval.choices import InstructionMode
from vlaeval.config import FlowConfig
from vlaeval.envs.episodes import Episode, EpisodeDisturbances, Perturbation, disturbed_image
from vlaeval.errors import UserInputError
from vlaeval.policy.bound import bind_policy
from vlaeval.policy.tiny_vla_vision import TinyVLAVision
from vlaeval.rollouts.engine import rollout_lockstep
from vlaeval.rollouts.episode_cache import episode_key
from vlaeval.rollouts.language import PARAPHRASES, UNSEEN_PHRASINGS, episode_instruction
from vlaeval.rollouts.scenarios import ScenarioFamily, episode_spec

CORNER = "observation.images.corner"
TASKS = ["reach-v3", "push-v3"]
INSTRUCTIONS = ["reach the red goal position", "push the puck to the goal"]


class SeeingPolicy(TinyVLAVision):
    """The small vision policy, keeping what every policy call was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: List[Dict[str, torch.Tensor]] = []

    def encode(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen.append({k: v.clone() for k, v in batch.items()})
        return super().encode(batch)


def seeing_policy(**options: Any) -> Any:
    torch.manual_seed(0)
    vocab = sorted({w for text in INSTRUCTIONS for w in text.split()})
    model = SeeingPolicy(
        vocab, 39, 4, 4, image_size=32, image_channels=8, text_width=16, conditioning_dim=16, **options
    )
    return bind_policy(model, INSTRUCTIONS, FlowConfig(), vocab=vocab, image_size=32)


def test_episodes_without_cameras_or_instructions_keep_the_cache_keys_they_had():
    """Computed before the visual and language fields existed (commit c30f5bc)."""
    episode = Episode(
        "push-v3",
        1,
        30,
        12345,
        family=2,
        perturbation=Perturbation(observation_noise=0.002, burst_rate=0.02),
        unsafe_contact_force=50.0,
    )
    key = episode_key("ab" * 32, episode, {"max_steps": 40, "execute_actions": 1})
    assert key == "8aafb09bab7989cdb37e207bb2ecc7e9368f0e0044b3c17ddb2c65a7426e5e27"
    moved = Episode("push-v3", 1, 30, 12345, perturbation=Perturbation(occlusion=0.25))
    told = Episode("push-v3", 1, 30, 12345, instruction="shove the disc")
    keys = {episode_key("ab" * 32, e, {}) for e in (moved, told, Episode("push-v3", 1, 30, 12345))}
    assert len(keys) == 3  # what the policy sees or is told is part of the key
    assert episode_spec(told)["instruction"] == "shove the disc" and "instruction" not in episode_spec(moved)


def test_each_visual_perturbation_changes_the_image_as_documented():
    rng = np.random.default_rng(0)
    image = rng.integers(40, 200, (32, 32, 3)).astype(np.float32)
    corner = np.array([0.5, 0.25])

    def apply(**fields: Any) -> np.ndarray:
        return disturbed_image(image, Perturbation(**fields), np.random.default_rng(1), corner)

    assert np.array_equal(apply(blank_camera=True), np.zeros_like(image))
    assert np.allclose(apply(brightness=0.1), image + 25.5)
    low = apply(contrast=0.5)
    assert np.isclose(low.mean(), image.mean()) and np.isclose(low.std(), image.std() / 2, rtol=1e-5)
    patched = apply(occlusion=0.25)  # an 8x8 grey patch at rows 12-19, columns 6-13
    assert np.all(patched[12:20, 6:14] == 128.0) and np.array_equal(patched[:12], image[:12])
    assert int((patched != image).any(axis=-1).sum()) <= 64
    noisy = apply(image_noise=0.05)
    assert abs(float((noisy - image).std()) - 12.75) < 0.5


def test_image_disturbances_are_the_same_for_any_policy_and_leave_the_other_streams_alone():
    scenario = Perturbation(observation_noise=0.01, image_noise=0.05, occlusion=0.3)
    episode = Episode("reach-v3", 0, 3, 99, perturbation=scenario)
    images = {CORNER: np.full((16, 16, 3), 100, dtype=np.uint8)}
    a, b = EpisodeDisturbances(episode, 4), EpisodeDisturbances(episode, 4)
    for _ in range(3):  # the k-th call of two policies on one episode sees the same image
        assert np.array_equal(a.observe_images(images)[CORNER], b.observe_images(images)[CORNER])
    # The state's observation noise draws what it drew before the cameras' disturbances existed.
    plain = EpisodeDisturbances(Episode("reach-v3", 0, 3, 99, perturbation=Perturbation(observation_noise=0.01)), 4)
    obs = np.zeros(39, dtype=np.float32)
    assert np.array_equal(a.observe(obs), plain.observe(obs))


def test_language_families_tell_each_episode_a_phrasing_drawn_by_its_seed():
    assert episode_instruction(InstructionMode.task, "push-v3", TASKS, 5, {}) is None
    told = {episode_instruction(InstructionMode.paraphrase, "push-v3", TASKS, seed, {}) for seed in range(40)}
    assert told == set(PARAPHRASES["push-v3"])  # every phrasing is drawn, nothing else
    unseen = episode_instruction(InstructionMode.unseen, "reach-v3", TASKS, 1, {})
    assert unseen in UNSEEN_PHRASINGS["reach-v3"]
    other = {episode_instruction(InstructionMode.other_task, "push-v3", TASKS, seed, {}) for seed in range(10)}
    assert other == {"reach the red goal position"}
    mine = {"push-v3": ["nudge the hockey puck home"]}
    assert episode_instruction(InstructionMode.unseen, "push-v3", TASKS, 3, mine) == "nudge the hockey puck home"
    family = ScenarioFamily.parse("language", {"instructions": "paraphrase", "phrasings": mine}, TASKS)
    assert family.instruction("push-v3", 7) == "nudge the hockey puck home"


@pytest.mark.parametrize(
    "values, needle",
    [
        ({"instructions": "shout"}, "instructions='shout' is unknown; use one of task, paraphrase, unseen, other_task"),
        ({"instructions": "unseen", "tasks": ["button-press-v3"]}, "no unseen phrasing of button-press-v3"),
        ({"instructions": "other_task", "tasks": ["reach-v3"]}, "needs at least two tasks"),
        ({"phrasings": {"reach-v3": "touch it"}}, "phrasings must map a task to a list"),
        ({"perturbation": {"occlusion": 2}}, "occlusion=2.0 must be in [0, 1]"),
    ],
)
def test_a_bad_language_or_visual_setting_is_one_line(values, needle):
    with pytest.raises(UserInputError) as error:
        ScenarioFamily.parse("s", values, TASKS)
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_a_vision_policy_sees_its_camera_and_is_told_its_episode_instruction_at_every_call():
    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    policy = seeing_policy()
    episodes = [
        Episode("reach-v3", 0, 25, 1),
        Episode("push-v3", 1, 26, 2, instruction="shove the disc toward the target"),
        Episode("reach-v3", 0, 25, 1, perturbation=Perturbation(blank_camera=True)),
        Episode("push-v3", 1, 26, 2, perturbation=Perturbation(camera_shift=0.1)),
    ]
    out = rollout_lockstep(policy, episodes, execute_actions=2, max_steps=6)
    assert out.steps.tolist() == [6, 6, 6, 6]
    seen = policy.model.seen
    assert len(seen) == 3  # one call per 2 executed actions
    first = seen[0]
    images = first[CORNER][:4]
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert 30 < float(images[0].float().mean()) < 220  # a lit scene
    assert int(images[2].max()) == 0  # the blanked camera
    assert float((images[3].float() - images[1].float()).abs().mean()) > 5  # the moved camera sees another view
    tokens = first["instruction"][:4]
    model = policy.model
    assert tokens[0].tolist() == model.tokenize([INSTRUCTIONS[0]])[0].tolist()
    assert tokens[1].tolist() == model.tokenize(["shove the disc toward the target"])[0].tolist()
    assert tokens[3].tolist() == model.tokenize([INSTRUCTIONS[1]])[0].tolist()
    # The same episode alone: the same images at its first call (rendering and disturbances are per episode).
    alone = seeing_policy()
    rollout_lockstep(alone, episodes[3:], execute_actions=2, max_steps=2)
    assert torch.equal(alone.model.seen[0][CORNER][0], images[3])


def test_a_policy_reading_two_frames_sees_the_previous_step_and_the_present_one():
    """model.history=2: every call gets each camera's last two frames, oldest first, stacked on the
    channels; the first call repeats the opening frame (as an episode's first anchor does in training),
    and each later frame is the one after the step before -- even between calls (execute_actions=2)."""
    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    episodes = [Episode("reach-v3", 0, 25, 1), Episode("push-v3", 1, 26, 2)]
    two = seeing_policy(history=2)
    rollout_lockstep(two, episodes, execute_actions=1, max_steps=3)
    calls = [c[CORNER][:2] for c in two.model.seen]
    assert calls[0].shape == (2, 6, 32, 32)
    assert torch.equal(calls[0][:, :3], calls[0][:, 3:])  # the opening frame, twice
    for before, after in zip(calls, calls[1:]):
        assert torch.equal(after[:, :3], before[:, 3:])  # the previous call's present is this call's past
    one = seeing_policy()
    rollout_lockstep(one, episodes, execute_actions=1, max_steps=1)
    assert torch.equal(calls[0][:, 3:], one.model.seen[0][CORNER][:2])  # the present frame is the one-frame policy's
    # Between calls too: with 2 actions per call, the second call's past is the frame after step 1,
    # rendered by the same camera at the same size as a watcher sees it.
    from vlaeval.data.cameras import channel_first

    after_step: Dict[int, List[np.ndarray]] = {0: [], 1: []}

    def watch(k, envs):  # Meta-World's video view is the corner camera: what this policy reads
        after_step[k].append(envs.frame(k, 32))

    skipping = seeing_policy(history=2)
    rollout_lockstep(skipping, episodes, execute_actions=2, max_steps=4, watch=watch)
    later = skipping.model.seen[1][CORNER][:2]
    for k in (0, 1):  # after_step[k][0] is the opening frame, [1] the frame after step 1
        assert torch.equal(later[k, :3], torch.from_numpy(channel_first(after_step[k][1][None])[0]))
        assert torch.equal(later[k, 3:], torch.from_numpy(channel_first(after_step[k][2][None])[0]))


def test_the_anchors_of_a_two_frame_policy_carry_the_step_before():
    from vlaeval.policy.bound import anchor_frames

    class Frames:
        def decode_cameras(self, steps):
            return {CORNER: np.asarray(steps, dtype=np.uint8)[:, None, None, None] * np.ones((1, 3, 2, 2), np.uint8)}

    class Anchors:
        demonstrations = Frames()
        base_index = np.array([10, 11, 12, 20])
        anchor_index = np.array([0, 1, 2, 0])  # 10 and 20 open their episodes

    frames = anchor_frames(Anchors(), np.arange(4), 2)[CORNER]
    assert frames.shape == (4, 6, 2, 2)
    assert frames[:, 0, 0, 0].tolist() == [10, 10, 11, 20] and frames[:, 3, 0, 0].tolist() == [10, 11, 12, 20]


def test_a_policy_reading_a_camera_meta_world_lacks_is_refused_by_name():
    policy = seeing_policy()
    model = policy.model
    model.cameras = ["observation.images.wrist"]
    bound = bind_policy(model, INSTRUCTIONS, FlowConfig(), image_size=32)
    with pytest.raises(UserInputError, match="reads camera observation.images.wrist, which Meta-World does not have"):
        rollout_lockstep(bound, [Episode("reach-v3", 0, 25, 1)], execute_actions=1, max_steps=2)


def test_train_evaluates_the_vision_policy_clean_and_under_each_condition(tmp_path):
    """job=train on pixels (data=tiny_vision), then the held-out evaluation on the same episodes
    clean, with the camera blanked and with another task's instruction; all reported and logged.
    The rollout workers are forked after this process rendered the recording: they render too
    (a llvmpipe thread pool inherited across fork once hung them; vlaeval/__init__.py)."""
    import json

    from helpers.processes import run_main

    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    proc = run_main(
        [
            "job=train",
            "data=tiny_vision",
            "model=tiny_vla_vision_small",
            "train.steps=30",
            "train.batch_size=32",
            "evaluate.episodes_per_task=2",
            "evaluate.max_steps=20",
            "rollout.workers=2",
            "rollout.lockstep_group=2",
            "+evaluate.conditions.blank_camera.perturbation.blank_camera=true",
            "+evaluate.conditions.other_instruction.instructions=other_task",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    evaluation = result["evaluation"]
    assert sorted(evaluation["conditions"]) == ["blank_camera", "other_instruction"]
    blank = evaluation["conditions"]["blank_camera"]
    assert blank["changed"] == "blank_camera=True" and set(blank["per_task"]) == {"reach-v3", "push-v3"}
    assert blank["drop"] == pytest.approx(evaluation["policy_success_rate"] - blank["policy_success_rate"])
    assert evaluation["conditions"]["other_instruction"]["changed"] == "instructions=other_task"
    assert "The same episodes under each condition" in proc.stdout
    assert result["metrics"]["eval.condition.blank_camera.drop"] == blank["drop"]


def test_a_bad_evaluation_condition_is_one_line_before_any_work(tmp_path):
    from helpers.processes import run_main

    proc = run_main(
        [
            "job=evaluate",
            "data=tiny",
            "tracking=disabled",
            "+evaluate.conditions.dark.perturbation.brightnes=-0.5",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "evaluate.conditions.dark.perturbation.brightnes is not a perturbation" in lines[0]
    assert not (tmp_path / "cache" / "demonstrations").exists()


@pytest.mark.slow
def test_a_rollout_gauntlet_with_visual_and_language_strata_decides_and_saves_every_rollout(tmp_path):
    """The small vision gauntlet end to end: two vision policies trained on pixels, each visual and
    language family a stratum with a decision, every episode pair written, the families' settings
    in the lineage; a second run takes every episode from the cache."""
    import json

    import pandas as pd

    from helpers.processes import run_main

    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    common = [
        "job=gauntlet",
        "model=tiny_vla_vision_small",
        "strata=vision",
        "outcomes=rollout_vision_small",
        "tracking=disabled",
        "gauntlet.plot=false",
        "gauntlet.preflight=off",
        "rollout.workers=2",
        "rollout.lockstep_group=4",
    ]
    env = {"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for name in ("first", "again"):
        proc = run_main([*common, f"hydra.run.dir={tmp_path / name}"], tmp_path, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads((tmp_path / name / "result.json").read_text()))
    first, again = runs
    strata = {s["stratum"]: s for s in first["strata"]}
    families = ["camera_pose", "occlusion", "visual_shift", "paraphrase", "unseen_phrasing"]
    assert set(families) <= set(strata) and all(strata[f]["decision"] for f in families)
    pairs = pd.read_csv(first["rollouts"]["paired_outcomes"])
    for family in families:
        assert (pairs["stratum"] == family).sum() == strata[family]["units_evaluated"] > 0
    scenarios = first["lineage"]["data_source"]["scenarios"]
    assert scenarios["paraphrase"]["instructions"] == "paraphrase"
    assert scenarios["occlusion"]["perturbation"]["occlusion"] == 0.2
    assert "instructions" not in scenarios["nominal"] and "occlusion" not in scenarios["nominal"]["perturbation"]
    assert first["rollouts"]["episodes_run"] == 2 * len(pairs) and first["rollouts"]["episodes_from_cache"] == 0
    assert again["rollouts"]["episodes_run"] == 0  # the same episodes, from the cache
    assert [s["decision"] for s in again["strata"]] == [s["decision"] for s in first["strata"]]


@pytest.mark.slow
def test_the_ablation_runs_on_the_vision_policy(tmp_path):
    """job=ablation end to end on a policy trained on pixels: the anchors' gradients through its
    convolutions, importance-weighted fine-tuning under each proposal, the held-out loss on the
    held-out scenes' camera frames and the closed-loop check with rendered cameras."""
    import json

    from helpers.configs import ABLATION_SMALL
    from helpers.processes import run_main

    need(osmesa_installed(), "Debian's libosmesa6 (OSMesa: MuJoCo's camera rendering on the CPU)")
    overrides = [
        o for o in ABLATION_SMALL if not o.startswith(("data=", "model=", "ablation.proposals=", "ablation.seeds="))
    ]
    proc = run_main(
        [
            *overrides,
            "data=tiny_vision",
            "model=tiny_vla_vision_small",
            "tracking=disabled",
            "rollout.workers=2",
            # Two proposals (two seeds, the fewest it takes): what is the vision policy's own here (gradients through its
            # convolutions, camera frames in the held-out loss and the closed loop) every run shows;
            # the other proposals are the state policy's test (test_ablation.py).
            "ablation.proposals=[uniform,residual]",
            "ablation.seeds=[0,1]",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        env={"VLAEVAL_CACHE_DIR": str(tmp_path / "cache")},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    summary = result["summary"]
    assert set(summary) == {"uniform", "residual"}
    assert len(result["runs"]) == 4 and result["heldout_anchors"] > 0
    for proposal in summary.values():
        assert np.isfinite(proposal["final_heldout_loss"]["mean"]) and "success_rate" in proposal


def _small_vision(**options: Any) -> TinyVLAVision:
    torch.manual_seed(0)
    vocab = sorted({w for text in INSTRUCTIONS for w in text.split()})
    return TinyVLAVision(
        vocab, 39, 4, 4, image_size=16, image_channels=8, text_width=16, conditioning_dim=16, **options
    )


def test_the_keypoints_are_standardised_on_the_images_they_were_measured_on_and_saved_with_the_weights():
    model = _small_vision(keypoint_norm="standardise", sharpness=20.0).eval()
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (64, 3, 24, 24), generator=g, dtype=torch.uint8)
    model.set_keypoint_statistics({CORNER: images})
    with torch.no_grad():
        features = model.images[0](model.pixels(images))
    torch.testing.assert_close(features.mean(0), torch.zeros(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(features.std(0), torch.ones(16), atol=1e-4, rtol=0)
    state = model.state_dict()
    assert {"images.0.keypoint_norm.mean", "images.0.keypoint_norm.sd"} <= set(state)
    again = _small_vision(keypoint_norm="standardise", sharpness=20.0)
    again.load_state_dict(state)
    torch.testing.assert_close(again.images[0].keypoint_norm.sd, model.images[0].keypoint_norm.sd)
    # The encoder as it was (no norm) keeps its checkpoints' keys.
    assert set(_small_vision(keypoint_norm="none").state_dict()) == {k for k in state if "keypoint_norm" not in k}


def test_film_starts_as_the_unconditioned_encoder_and_the_crop_takes_the_named_part_of_the_frame():
    plain, film = _small_vision(), _small_vision(film=True)
    film.load_state_dict(plain.state_dict(), strict=False)  # FiLM's projections are extra, zero-initialised
    g = torch.Generator().manual_seed(2)
    batch = {
        "observation": torch.randn(5, 39, generator=g),
        "instruction": plain.tokenize(INSTRUCTIONS * 2 + INSTRUCTIONS[:1]),
        CORNER: torch.randint(0, 256, (5, 3, 16, 16), generator=g, dtype=torch.uint8),
    }
    plain.eval(), film.eval()
    with torch.no_grad():
        torch.testing.assert_close(film.encode(batch), plain.encode(batch))
    cropped = _small_vision(crop=[0.25, 0.5, 0.5, 0.5]).eval()
    frame = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    frame[..., 8:24, 16:32] = 255  # exactly the crop's rows 8..24, columns 16..32
    assert float(cropped.pixels(frame).min()) == 1.0


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"keypoint_norm": "batchnorm"}, "model.keypoint_norm=batchnorm is not one of none, layernorm, standardise"),
        ({"crop": [0.5, 0.0, 0.6, 1.0]}, "model.crop=[0.5, 0.0, 0.6, 1.0] is not (top, left, height, width) fractions"),
        ({"crop": [0.1, 0.1]}, "model.crop=[0.1, 0.1] is not (top, left, height, width)"),
        ({"sharpness": 0.0}, "model.sharpness=0.0 must be positive"),
        ({"cameras": []}, "model.cameras is empty"),
        ({"locate": [4, 39]}, "model.locate=[4, 39] must list distinct observation dims in [0, 39)"),
        ({"locate": [4, 4]}, "model.locate=[4, 4] must list distinct observation dims"),
        ({"locate": [4], "locate_weight": 0.0}, "model.locate_weight=0.0 must be > 0"),
    ],
)
def test_a_bad_vision_setting_is_one_line(options, needle):
    with pytest.raises(UserInputError) as error:
        _small_vision(**options)
    assert str(error.value).startswith(needle) and "\n" not in str(error.value)
