"""outcomes=rollout: the gauntlet runs two checkpoints on scenario families, episode by episode, only
when its test asks; episodes are cached, written as paired outcomes, and the candidate's failures
are recorded in the failure registry that later gauntlets replay (small preset: outcomes=rollout_small)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from helpers.configs import for_job
from helpers.processes import run_main
from vlaeval.artifacts import sha256_file
from vlaeval.config import FlowConfig
from vlaeval.envs.episodes import Episode, Perturbation
from vlaeval.policy.bound import bind_policy
from vlaeval.policy.tiny_vla import TinyVLA
from vlaeval.rollouts.engine import rollout_episodes, rollout_lockstep

QUIET = [
    "tracking=disabled",
    "gauntlet.plot=false",
    "gauntlet.preflight=off",
    "rollout.workers=1",
    "rollout.lockstep_group=8",
]


def _gauntlet(tmp: Path, name: str, *extra: str, cache: Path | None = None) -> dict:
    proc = run_main(
        ["job=gauntlet", "outcomes=rollout_small", *QUIET, *extra, f"hydra.run.dir={tmp / name}"],
        tmp,
        env={"VLAEVAL_CACHE_DIR": str(cache or tmp / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp / name / "result.json").read_text())
    result["_stdout"] = proc.stdout
    return result


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory, migrated_store):
    """The same rollout gauntlet three times on one cache and registry: the first finds the
    registry empty and fills it (tracked in MLflow, with videos of two failures), the second replays
    it, the third repeats the second. The first draws a fresh cluster-order seed; the others replay
    it as job=reproduce does."""
    import shutil

    from helpers.processes import sqlite_uri

    tmp = tmp_path_factory.mktemp("rollout")
    shutil.copy(migrated_store, tmp / "mlflow.db")
    tracked = ["tracking=sqlite", f"tracking.uri={sqlite_uri(tmp / 'mlflow.db')}", "gauntlet.videos=2"]
    # The registry where the untracked runs keep theirs (a tracked run's is beside its store).
    first = _gauntlet(tmp, "run1", *tracked, f"outcomes.registry={tmp / 'cache' / 'vlaeval_failure_registry.jsonl'}")
    replay = f"reproduce.replay_order_seed={first['cluster_order']['order_seed']}"
    return tmp, [first, *(_gauntlet(tmp, f"run{k}", replay) for k in (2, 3))]


@pytest.mark.slow
def test_the_order_seed_is_drawn_fresh_recorded_and_replayed(three_runs):
    _, runs = three_runs
    orders = [r["cluster_order"] for r in runs]
    assert orders[0]["basis"] == "fresh random draw at run start" and orders[0] == orders[1] == orders[2]
    assert all(s["cluster_order"]["order_seed"] == orders[0]["order_seed"] for r in runs for s in r["strata"])
    assert runs[0]["lineage"]["seeds"]["cluster_order"] == orders[0]["order_seed"]
    assert runs[0]["tags"]["gauntlet.order_seed"] == str(orders[0]["order_seed"])
    assert all("drift" in s for s in runs[0]["strata"])


def _pairs(result: dict) -> pd.DataFrame:
    return pd.read_csv(result["rollouts"]["paired_outcomes"])


@pytest.mark.slow
def test_versions_are_checkpoint_digests_and_every_pair_is_written(three_runs):
    tmp, (first, _, _) = three_runs
    source = first["lineage"]["data_source"]
    assert source["kind"] == "rollout"
    for role in ("baseline", "candidate"):
        policy = source["policies"][role]
        assert (
            first[f"{role}_version"]
            == policy["version"]
            == f"{role if role == 'baseline' else 'worse'}@{policy['sha256'][:12]}"
        )
        assert first["lineage"][f"{role}_version"] == policy["version"]
    digests = {sha256_file(p) for p in (tmp / "cache" / "checkpoints").glob("*/model.pt")}
    assert {source["policies"][r]["sha256"] for r in ("baseline", "candidate")} <= digests
    pairs = _pairs(first)
    rollouts = first["rollouts"]
    evaluated = sum(s["units_evaluated"] for s in first["strata"])
    assert len(pairs) == evaluated == rollouts["episode_pairs_evaluated"] == first["scale"]["units_produced"]
    assert rollouts["episodes_run"] == 2 * evaluated and rollouts["episodes_from_cache"] == 0
    for s in first["strata"]:
        rows = pairs[pairs["stratum"] == s["stratum"]]
        assert len(rows) == s["units_evaluated"]
        assert rows["baseline"].mean() == pytest.approx(s["success_rates"]["baseline"]["rate"])
        assert rows["candidate"].mean() == pytest.approx(s["success_rates"]["candidate"]["rate"])
    # An unsafe episode is a failure; only the safety family monitors the wall.
    assert not (pairs["candidate_unsafe"].astype(bool) & pairs["candidate"].astype(bool)).any()
    assert not pairs.loc[pairs["stratum"] != "safety_critical", ["baseline_unsafe", "candidate_unsafe"]].any().any()


@pytest.mark.slow
def test_an_empty_registry_is_reported_then_filled_and_replayed(three_runs):
    tmp, (first, second, _) = three_runs
    assert "the failure registry" in first["_stdout"] and "is empty" in first["_stdout"]
    assert "historical_regressions" in first["absent_strata"]
    pairs = _pairs(first)
    failures = pairs[(pairs["baseline"] == 1) & (pairs["candidate"] == 0)]
    assert len(failures) > 0  # the briefly trained candidate fails somewhere the baseline succeeds
    registry = [
        json.loads(line) for line in (tmp / "cache" / "vlaeval_failure_registry.jsonl").read_text().splitlines()
    ]
    assert first["rollouts"]["registry_entries_added"] == len(failures) == len(registry)
    assert sorted(e["scenario_id"] for e in registry) == sorted(failures["scenario_id"])
    # The second gauntlet replays exactly those scenarios, one cluster per scene.
    replay = next(s for s in second["strata"] if s["stratum"] == "historical_regressions")
    scenes = {(e["episode"]["task"], e["episode"]["family"], e["episode"]["variant"]) for e in registry}
    assert replay["units_available"] == len(registry) and replay["clusters_available"] == len(scenes)
    replayed = _pairs(second).query("stratum == 'historical_regressions'")
    assert set(replayed["scenario_id"].str.split("/seed-").str[1]) <= {str(e["episode"]["seed"]) for e in registry}
    # Replayed episodes are the very episodes: the baseline succeeds on them again.
    assert replayed["baseline"].all()
    listing = run_main(
        ["job=regressions", "tracking=disabled", f"hydra.run.dir={tmp / 'list'}"],
        tmp,
        env={"VLAEVAL_CACHE_DIR": str(tmp / "cache")},
    )
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert json.loads((tmp / "list" / "result.json").read_text())["count"] == len(registry)
    assert f"{len(registry)} scenarios" in listing.stdout
    # With the gauntlet's pair of policies, job=regressions films a registry scenario they recorded.
    filmed = run_main(
        [
            "job=regressions",
            "outcomes=rollout_small",
            "regressions.videos=1",
            *for_job("regressions", QUIET),
            f"hydra.run.dir={tmp / 'film'}",
        ],
        tmp,
        env={"VLAEVAL_CACHE_DIR": str(tmp / "cache")},
    )
    assert filmed.returncode == 0, filmed.stderr[-2000:]
    (video,) = json.loads((tmp / "film" / "result.json").read_text())["videos"]
    assert Path(video).parent == tmp / "film" / "videos" and Path(video).stat().st_size > 10_000


@pytest.mark.slow
def test_the_failures_are_filmed_side_by_side_and_logged_to_mlflow(three_runs):
    """gauntlet.videos=2: the two failures (unsafe first) re-run from their seeds, baseline | candidate
    as an H.264 MP4 as long as the longer episode (plus its opening frame), in the run folder and
    under the MLflow run's artifacts; a run without the setting films nothing."""
    import av
    from mlflow.tracking import MlflowClient

    from helpers.processes import sqlite_uri

    tmp, (first, second, _) = three_runs
    pairs = _pairs(first)
    failures = pairs[(pairs["baseline"] == 1) & (pairs["candidate"] == 0)]
    videos = first["rollouts"]["videos"]
    assert len(videos) == min(2, len(failures)) > 0 and second["rollouts"]["videos"] == []
    lengths = set(failures[["baseline_steps", "candidate_steps"]].max(axis=1).tolist())
    for path in videos:
        assert Path(path).parent == tmp / "run1" / "videos"
        with av.open(path) as container:
            stream = container.streams.video[0]
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        assert stream.codec_context.name == "h264" and frames[0].shape == (192 + 2 * 28, 2 * 192 + 4, 3)
        assert len(frames) - 1 in lengths
        assert frames[0][28:-28].std() > 10 and not np.array_equal(frames[0], frames[-1])  # a scene that moves
    assert not list((tmp / "run1" / "videos").glob(".*"))  # no temporary file left behind
    client = MlflowClient(tracking_uri=sqlite_uri(tmp / "mlflow.db"))
    run = client.search_runs([client.get_experiment_by_name("vlaeval-gauntlet").experiment_id])[0]
    logged = sorted(a.path.split("/")[-1] for a in client.list_artifacts(run.info.run_id, "videos"))
    assert logged == sorted(Path(p).name for p in videos)


@pytest.mark.slow
def test_a_rerun_is_served_from_the_episode_cache(three_runs):
    _, (first, second, third) = three_runs
    shared = [s["stratum"] for s in first["strata"]]
    a, b = _pairs(first), _pairs(second)
    for name in shared:  # the strata the first run had: every episode pair identical, from the cache
        pd.testing.assert_frame_equal(
            a[a["stratum"] == name].reset_index(drop=True), b[b["stratum"] == name].reset_index(drop=True)
        )
    assert second["rollouts"]["episodes_from_cache"] >= 2 * len(a)
    assert third["rollouts"]["episodes_run"] == 0
    assert third["rollouts"]["episodes_from_cache"] == 2 * third["rollouts"]["episode_pairs_evaluated"]
    assert third["rollouts"]["registry_entries_added"] == 0
    for x, y in zip(second["strata"], third["strata"]):
        assert (x["stratum"], x["decision"], x["units_evaluated"], x["delta_estimate"]) == (
            y["stratum"],
            y["decision"],
            y["units_evaluated"],
            y["delta_estimate"],
        )
    pd.testing.assert_frame_equal(_pairs(second), _pairs(third))


@pytest.mark.slow
def test_the_paired_outcomes_are_reanalysed_by_outcomes_file(three_runs):
    """The second run's file: replayed registry episodes are the very episodes of another stratum,
    and the file must still hold each scenario once."""
    tmp, (_, first, _) = three_runs
    assert "historical_regressions" in set(_pairs(first)["stratum"])
    proc = run_main(
        [
            "job=gauntlet",
            "outcomes=file",
            f"outcomes.path={first['rollouts']['paired_outcomes']}",
            *for_job("gauntlet", QUIET),
            f"hydra.run.dir={tmp / 'f'}",
        ],
        tmp,
        env={"VLAEVAL_CACHE_DIR": str(tmp / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp / "f" / "result.json").read_text())
    pairs = _pairs(first)
    assert {s["stratum"]: s["units_available"] for s in report["strata"]} == pairs.groupby("stratum").size().to_dict()


@pytest.mark.slow
def test_one_checkpoint_twice_meets_identical_episodes_until_a_degradation_is_planted(three_runs, tmp_path):
    """Both sides run the same episodes with the same seeds: one checkpoint as baseline and candidate
    gives identical outcomes and step counts everywhere (cache off, so every episode really runs
    twice), except where effects plants a degradation on the candidate. On the module's cache (its
    data and trained policies), with a registry of its own."""
    result = _gauntlet(
        tmp_path,
        "same",
        "outcomes.candidate=builtin:baseline",
        "outcomes.use_cache=false",
        "+effects.distribution_shift={action_noise: 2.0}",
        "gauntlet.cluster_order=as_given",
        f"outcomes.registry={tmp_path / 'registry.jsonl'}",
        cache=three_runs[0] / "cache",
    )
    assert result["baseline_version"] == result["candidate_version"]
    assert result["rollouts"]["episodes_run"] == 2 * result["rollouts"]["episode_pairs_evaluated"]
    pairs = _pairs(result)
    clean = pairs[pairs["stratum"] != "distribution_shift"]
    assert len(clean) > 0
    assert (clean["baseline"] == clean["candidate"]).all()
    assert (clean["baseline_steps"] == clean["candidate_steps"]).all()
    planted = pairs[pairs["stratum"] == "distribution_shift"]
    reached = planted[planted["baseline"] == 1]
    assert len(reached) > 0 and (reached["candidate"] == 0).mean() >= 0.5  # the same episodes, now failed
    assert planted["candidate"].sum() < planted["baseline"].sum()  # random actions break reaching
    shift = next(s for s in result["strata"] if s["stratum"] == "distribution_shift")
    assert shift["planted_effect"] == {"action_noise": 2.0}


# ----------------------------------------------------------------------------- the engine itself
def _policy() -> TinyVLA:
    torch.manual_seed(0)
    return TinyVLA(["reach", "push"], 39, 4, 4, encoder_hidden=16, conditioning_dim=8, head_hidden=16, head_layers=2)


def test_an_episode_does_not_depend_on_what_shares_its_lockstep_batch():
    """Alone, in a group of three, or in a group of twelve: the same episode's outcome and length
    are identical (policy calls are padded to a row-invariant batch size)."""
    bound = bind_policy(_policy(), ["reach", "push"], FlowConfig(sampling_steps=3))
    burst = Perturbation(burst_rate=0.2, burst_steps=2, observation_noise=0.05, control_delay=1)
    episodes = [
        Episode("reach-v3", 0, 25 + k, 77 + k, perturbation=burst if k % 2 else Perturbation()) for k in range(12)
    ]
    kwargs = dict(execute_actions=1, max_steps=15)
    together = rollout_lockstep(bound, episodes, **kwargs)
    threes = rollout_episodes(bound, episodes, group_size=3, **kwargs)
    alone = [rollout_lockstep(bound, [e], **kwargs) for e in episodes[:4]]
    assert np.array_equal(together.steps, threes.steps) and np.array_equal(together.success, threes.success)
    for k, single in enumerate(alone):
        assert single.steps[0] == together.steps[k] and single.success[0] == together.success[k]


def test_perturbations_are_seeded_per_episode_and_change_the_episode():
    from vlaeval.envs.episodes import EpisodeDisturbances

    spec = Perturbation(observation_noise=0.1, action_noise=0.2, burst_rate=0.3, burst_steps=2, control_delay=2)
    runs = []
    for _ in range(2):
        d = EpisodeDisturbances(Episode("reach-v3", 0, 0, 5, perturbation=spec), 4)
        runs.append([d.execute(np.full(4, 0.1 * k)) for k in range(30)] + [d.observe(np.zeros(39))])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))  # the same seed, the same disturbances
    first = runs[0]
    assert np.all(np.abs(first[0]) <= 1.0)
    other = EpisodeDisturbances(Episode("reach-v3", 0, 0, 6, perturbation=spec), 4)
    assert not np.array_equal(other.observe(np.zeros(39)), runs[0][-1])  # another seed, other noise
    # Control delay: the first executed actions are the zero actions queued before the policy's.
    quiet = EpisodeDisturbances(Episode("reach-v3", 0, 0, 5, perturbation=Perturbation(control_delay=2)), 4)
    executed = [quiet.execute(np.full(4, 0.5)) for _ in range(4)]
    assert [float(a[0]) for a in executed] == [0.0, 0.0, 0.5, 0.5]
    # A degradation draws from its own stream: the scenario's draws are unchanged by it.
    degraded = EpisodeDisturbances(
        Episode(
            "reach-v3",
            0,
            0,
            5,
            perturbation=Perturbation(observation_noise=0.1),
            degradation=Perturbation(action_noise=0.5),
        ),
        4,
    )
    plain = EpisodeDisturbances(Episode("reach-v3", 0, 0, 5, perturbation=Perturbation(observation_noise=0.1)), 4)
    assert np.array_equal(degraded.observe(np.zeros(39)), plain.observe(np.zeros(39)))
    assert not np.array_equal(degraded.execute(np.zeros(4)), plain.execute(np.zeros(4)))


# ----------------------------------------------------------------------------- Ray
def _kill_first_attempt(policy, group, *args):
    """A group function whose first attempt per group kills its Ray worker process mid-task (as the
    OOM killer or a preemption would); later attempts run the real group."""
    import os

    from vlaeval.rollouts.engine import rollout_group

    marker = Path(os.environ["VLAEVAL_TEST_MARKERS"]) / f"group-{group[0].seed}"
    if not marker.exists():
        marker.write_text("killed once")
        os._exit(1)
    return rollout_group(policy, group, *args)


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A local Ray instance started for these tests (`ray start --head`), stopped afterwards."""
    import shutil
    import socket
    import subprocess
    import sys

    ray_cli = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    markers = tmp_path_factory.mktemp("markers")
    # Token authentication off for this local head, in this process and the CLI runs it starts: a
    # token left in ~/.ray by an earlier local ray.init() would otherwise not match the head's.
    patch = pytest.MonkeyPatch()
    patch.setenv("RAY_AUTH_MODE", "disabled")
    env = {**__import__("os").environ, "VLAEVAL_TEST_MARKERS": str(markers), "RAY_USAGE_STATS_ENABLED": "0"}
    start = subprocess.run(
        [
            ray_cli,
            "start",
            "--head",
            "--num-cpus=2",
            f"--port={port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}", markers
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)
        patch.undo()


@pytest.mark.slow
def test_ray_gives_the_local_outcomes_and_a_dead_worker_loses_no_episode(ray_head, monkeypatch):
    import ray

    from vlaeval.rollouts.executors import RayExecutor

    address, markers = ray_head
    monkeypatch.setenv("VLAEVAL_TEST_MARKERS", str(markers))
    bound = bind_policy(_policy(), ["reach", "push"], FlowConfig(sampling_steps=3))
    episodes = [Episode("reach-v3", 0, 25 + k, 300 + k, perturbation=Perturbation(burst_rate=0.1)) for k in range(8)]
    kwargs = dict(execute_actions=1, max_steps=12, group_size=2)
    local = rollout_episodes(bound, episodes, workers=2, **kwargs)
    executor = RayExecutor(address)
    try:
        on_ray = rollout_episodes(bound, episodes, executor=executor, **kwargs)
        assert list(local) == list(on_ray)  # every episode's outcome (success, unsafe, steps)
        # Every group's first attempt kills its worker: Ray reruns each group, nothing is lost.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
        results = list(
            executor.map_groups(
                _kill_first_attempt,
                [(bound, episodes[i : i + 2], 1, 12) for i in range(0, 8, 2)],
            )
        )
        assert len(list(markers.iterdir())) == 4  # four workers died
        assert np.array_equal(np.concatenate([r.steps for r in results]), local.steps)
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_rollout_gauntlet_on_ray_matches_the_local_one(three_runs, ray_head):
    """The CLI on the Ray instance the test started (episode cache off, so every episode runs on
    Ray): the same paired outcomes and decisions as the local run with the same registry."""
    tmp, (_, _, third) = three_runs
    address, _ = ray_head
    on_ray = _gauntlet(
        tmp,
        "ray",
        "rollout.executor=ray",
        f"rollout.ray_address={address}",
        "outcomes.use_cache=false",
        f"reproduce.replay_order_seed={third['cluster_order']['order_seed']}",
    )
    assert on_ray["lineage"]["data_source"]["executor"]["executor"] == "ray"
    assert on_ray["rollouts"]["episodes_run"] == 2 * on_ray["rollouts"]["episode_pairs_evaluated"] > 0
    pd.testing.assert_frame_equal(_pairs(on_ray), _pairs(third))
    assert [(s["stratum"], s["decision"], s["units_evaluated"]) for s in on_ray["strata"]] == [
        (s["stratum"], s["decision"], s["units_evaluated"]) for s in third["strata"]
    ]
