"""job=offline_validity: the agreements against their definitions, the bootstrap's false validations
under nulls built to break it (few checkpoints, rare and skewed success, heavy-tailed and ordered
metrics, both directions) with a miscalibrated control that must be caught, and the job end to end
on real checkpoints, rollouts and MLflow -- with its one-line refusals before any work."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from helpers.configs import compose_config
from helpers.processes import run_main, sqlite_uri
from helpers.reliability import record_outcome
from vlaeval.errors import UserInputError
from vlaeval.jobs import dispatch
from vlaeval.validity.statistics import (
    MIN_CHECKPOINTS,
    agreement,
    mmrv_rows,
    pearson_rows,
    spearman_rows,
    success_reliability,
)


def mmrv_by_definition(metric, success) -> float:
    """SimplerEnv's MMRV, written as its loops."""
    n = len(metric)
    worst = []
    for i in range(n):
        worst.append(
            max(
                abs(success[i] - success[j]) * float((metric[i] < metric[j]) != (success[i] < success[j]))
                for j in range(n)
            )
        )
    return float(np.mean(worst))


def test_the_agreements_match_their_definitions_ties_included():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(3, 15))
        metric = rng.integers(0, 4, n).astype(float)  # ties in the metric
        success = rng.integers(0, 5, n) / 4  # and in success
        assert mmrv_rows(metric, success)[0] == pytest.approx(mmrv_by_definition(metric, success), abs=1e-12)
        if metric.std() > 0 and success.std() > 0:
            assert pearson_rows(metric, success) == pytest.approx(pearsonr(metric, success)[0], abs=1e-12)
            assert spearman_rows(metric, success) == pytest.approx(spearmanr(metric, success)[0], abs=1e-12)
    # A perfect ranking violates nothing; the reversed one costs the largest gaps.
    success = np.array([0.1, 0.4, 0.5, 0.9])
    assert mmrv_rows(success * 2, success)[0] == 0.0
    assert mmrv_rows(-success, success)[0] == pytest.approx(np.mean([0.8, 0.5, 0.4, 0.8]))


def null_design(design: str, rng: np.random.Generator, checkpoints: int, episodes: int):
    """(metric, successes, episode_task) with the metric independent of success."""
    if design == "rare":  # most checkpoints never succeed: success rates tie at 0
        p = rng.uniform(0.0, 0.06, checkpoints)
    elif design == "one_succeeds":  # a single checkpoint ever succeeds: most resamples tie everywhere
        p = np.where(np.arange(checkpoints) == rng.integers(checkpoints), 0.3, 0.0)
    elif design == "skewed":
        p = rng.beta(0.3, 3.0, checkpoints)
    else:
        p = rng.uniform(0.1, 0.9, checkpoints)
    successes = (rng.random((checkpoints, episodes)) < p[:, None]).astype(float)
    if design == "heavy_tailed":
        metric = rng.standard_cauchy(checkpoints)
    elif design == "ordered":  # the metric sorted, the checkpoints listed in that order: order must not matter
        metric = np.sort(rng.normal(size=checkpoints))
    else:
        metric = rng.standard_exponential(checkpoints)
    tasks = np.repeat(np.arange(3), -(-episodes // 3))[:episodes]
    return metric, successes, tasks


def false_validations(design: str, checkpoints: int, sign: float, level: float, reps: int) -> float:
    hits = 0
    for r in range(reps):
        rng = np.random.default_rng(10_000 + r)
        metric, successes, tasks = null_design(design, rng, checkpoints, 30)
        found = agreement("m", "pooled", sign * metric, successes, tasks, level=level, resamples=300, seed=r)
        hits += found.validates
    return hits / reps


REPS = 300


@pytest.mark.parametrize(
    "design,checkpoints,sign",
    [
        ("uniform", MIN_CHECKPOINTS, 1.0),
        ("rare", 40, 1.0),
        ("one_succeeds", 12, 1.0),
        ("skewed", MIN_CHECKPOINTS, -1.0),
        ("heavy_tailed", 20, 1.0),
        ("ordered", 20, -1.0),
    ],
)
def test_an_unrelated_metric_rarely_validates(design, checkpoints, sign):
    """Spearman's 95% interval is above 0 for an unrelated metric at most ~2.5% of the time (the
    bound below allows 3.4 binomial SEs over it at 300 repetitions)."""
    rate = false_validations(design, checkpoints, sign, 0.95, REPS)
    assert rate <= 0.025 + 3.4 * np.sqrt(0.025 * 0.975 / REPS), rate


def test_the_negative_control_a_miscalibrated_interval_is_caught():
    """The same count at a 40% interval (what a broken level would give) must exceed the bound."""
    rate = false_validations("uniform", MIN_CHECKPOINTS, 1.0, 0.6, REPS)
    assert rate > 0.025 + 3.4 * np.sqrt(0.025 * 0.975 / REPS), rate


def test_a_predictive_metric_validates_and_a_reversed_one_does_not():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.1, 0.9, 30)
    successes = (rng.random((30, 60)) < p[:, None]).astype(float)
    tasks = np.repeat(np.arange(3), 20)
    metric = p + rng.normal(0, 0.05, 30)
    good = agreement("m", "pooled", metric, successes, tasks, level=0.95, resamples=1000, seed=0)
    bad = agreement("m", "pooled", -metric, successes, tasks, level=0.95, resamples=1000, seed=0)
    assert good.validates and good.spearman_interval[0] > 0.5 and good.mmrv < good.mmrv_unrelated / 2
    assert not bad.validates and bad.spearman_interval[1] < 0 and bad.mmrv > good.mmrv
    # Fewer than MIN_CHECKPOINTS never validate, however clean the ranking.
    few = agreement("m", "pooled", metric[:5], successes[:5], tasks, level=0.95, resamples=500, seed=0)
    assert not few.validates
    # The same inputs give the same numbers (seeded by a digest, not by the process).
    again = agreement("m", "pooled", metric, successes, tasks, level=0.95, resamples=1000, seed=0)
    assert again == good


def test_the_success_reliability_is_near_one_for_spread_rates_and_near_zero_for_equal_ones():
    rng = np.random.default_rng(5)
    tasks = np.repeat(np.arange(3), 40)
    spread = (rng.random((30, 120)) < rng.uniform(0.05, 0.95, 30)[:, None]).astype(float)
    equal = (rng.random((30, 120)) < 0.5).astype(float)
    assert success_reliability("pooled", spread, tasks).reliability > 0.9
    assert abs(success_reliability("pooled", equal, tasks).reliability) < 0.6


# ---------------------------------------------------------------------------------------------- the job

SMALL = ["data=tiny", "model=tiny_vla_small", "train.evaluate_after=false", "tracking=disabled"]
JOB = [
    "job=offline_validity",
    "data=tiny",
    "evaluate.episodes_per_task=2",
    "validity.resamples=200",
    "validity.anchors=16",
    "validity.gradient_seeds=[100,101]",
    "validity.heldout_episodes_per_task=1",
    "validity.heldout_draws=1",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Six tiny checkpoints that differ in steps and seed: two seeds of job=train, each with snapshots."""
    work = tmp_path_factory.mktemp("validity")
    sweep = work / "sweep"
    proc = run_main(
        [
            "-m",
            "job=train",
            *SMALL,
            "train.steps=60",
            "train.save_every=20",
            "train.seed=0,1",
            f"hydra.sweep.dir={sweep}",
        ],
        work,
        env={"VLAEVAL_CACHE_DIR": str(work / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, sweep


def test_the_job_reports_every_agreement_and_tracks_a_run_per_checkpoint(checkpoints, migrated_store):
    work, sweep = checkpoints
    store = work / "mlflow.db"
    shutil.copy(migrated_store, store)
    proc = run_main(
        [*JOB, f"validity.checkpoints=[{sweep}]", "validity.within=train.seed", f"tracking.uri={sqlite_uri(store)}"],
        work,
        env={"VLAEVAL_CACHE_DIR": str(work / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = work.glob("outputs/*_offline_validity")
    result = json.loads((run_dir / "result.json").read_text())
    rows = result["checkpoints"]
    snapshots = ["snapshots/step_0000020", "snapshots/step_0000040"]
    assert [r["label"] for r in rows] == [
        f"{seed}{part}" for seed in "01" for part in ("", *("/" + s for s in snapshots))
    ]
    assert sorted(rows[0]["varies"]) == ["train.seed", "trained_steps"]  # what the set varies, from the sidecars
    assert [r["varies"]["trained_steps"] for r in rows[:3]] == [60, 20, 40]
    names = {"heldout_loss", "heldout_loss.bin_0", "heldout_loss.bin_3", "action_error", "residual_mean", "audit_ratio"}
    assert names <= set(rows[0]["metrics"])
    assert len(rows[0]["per_task_success"]) == len(result["tasks"])
    # Every episode's outcome is kept, in the order of episode_tasks: a subset can be re-analysed.
    assert len(rows[0]["episode_successes"]) == len(result["episode_tasks"]) == 2 * len(result["tasks"])
    assert np.mean(rows[0]["episode_successes"]) == rows[0]["success_rate"]
    scopes = {(a["metric"], a["scope"]) for a in result["agreements"]}
    assert ("audit_ratio", "pooled") in scopes and not any(
        m == "audit_ratio" and s in result["tasks"] for m, s in scopes
    )
    # validity.within=train.seed: each seed's three snapshots compared among themselves, too.
    assert {s for _, s in scopes} == {"pooled", *result["tasks"], "train.seed=0", "train.seed=1"}
    assert result["validated"] == []  # 6 checkpoints never validate anything
    assert "fewer than" in proc.stdout + proc.stderr
    # The console says what validity.within found, and, since nothing ranks, each checkpoint's success
    # per task is the headline (best first).
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "within each group" in said and "train.seed=1" in said, said[-3000:]
    assert "no offline metric ranks these checkpoints" in said and "per task is the result" in said
    csv = (run_dir / "checkpoints.csv").read_text().splitlines()
    assert csv[0].startswith("checkpoint,sha256,train.seed,trained_steps,heldout_loss") and len(csv) == 7
    assert (run_dir / "offline_validity.png").is_file()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=sqlite_uri(store))
    [experiment] = [e for e in client.search_experiments() if e.name == "vlaeval-offline_validity"]
    runs = client.search_runs([experiment.experiment_id])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parent) == 1 and len(children) == 6
    # The policies this short never succeed: every rate ties, a correlation is undefined (not logged),
    # the MMRV is 0 and nothing validates.
    assert parent[0].data.metrics["validity.heldout_loss.mmrv"] == 0.0
    assert parent[0].data.metrics["validity.audit_ratio.validates"] == 0.0
    assert {c.data.params["trained_steps"] for c in children} == {"20", "40", "60"}
    assert all("eval.policy_success_rate" in c.data.metrics for c in children)


CASES = {  # what each refusal in the test below is given, for docs/reliability.md
    "needs >= 3": "two checkpoints",
    "the same weights twice": "the same weights in two folders",
    "mixes policy families": "checkpoints of two model _target_s",
    "is not a file or folder": "a path that does not exist",
    "validity.checkpoints is empty": "no checkpoints",
    "validity.level=1.5 must be in (0.5, 1)": "validity.level=1.5",
    "validity.within=train.learning_rate is not a setting these checkpoints differ in; use one of train.seed, "
    "trained_steps": "validity.within naming a setting the checkpoints share",
}


def test_bad_checkpoint_sets_are_one_line_errors_before_any_work(checkpoints, tmp_path):
    work, sweep = checkpoints
    other = tmp_path / "other"
    shutil.copytree(sweep / "0", other / "copy")  # the same weights twice
    sidecar = json.loads((sweep / "1" / "model.json").read_text())
    sidecar["config"]["model"]["_target_"] = "vlaeval.policy.tiny_dit.TinyDiT"
    family = tmp_path / "family"
    shutil.copytree(sweep / "1", family / "dit")
    (family / "dit" / "model.json").write_text(json.dumps(sidecar))
    cases = [
        ([f"validity.checkpoints=[{sweep / '0' / 'model.pt'},{sweep / '1' / 'model.pt'}]"], "needs >= 3"),
        ([f"validity.checkpoints=[{sweep},{other}]"], "the same weights twice"),
        ([f"validity.checkpoints=[{sweep / '0'},{family}]"], "mixes policy families"),
        ([f"validity.checkpoints=[{tmp_path / 'nowhere'}]"], "is not a file or folder"),
        (["validity.checkpoints=[]"], "validity.checkpoints is empty"),
        ([f"validity.checkpoints=[{sweep}]", "validity.level=1.5"], "validity.level=1.5 must be in (0.5, 1)"),
        (
            [f"validity.checkpoints=[{sweep}]", "validity.within=train.learning_rate"],
            "validity.within=train.learning_rate is not a setting these checkpoints differ in; use one of train.seed, trained_steps",
        ),
    ]
    for overrides, message in cases:
        out = tmp_path / "out" / str(len(message))
        cfg = compose_config([*JOB, "tracking=disabled", *overrides], output_dir=out, cache_dir=work / "cache")
        with pytest.raises(UserInputError) as error:
            dispatch(cfg, [*JOB, *overrides])
        assert message in str(error.value) and "\n" not in str(error.value), (message, str(error.value))
        assert not out.exists() or not any(out.iterdir())  # refused before any work: nothing written
        record_outcome(
            "offline validity",
            f"job=offline_validity: {CASES[message]}",
            f"one-line error before any work, nothing written: `... {message} ...`",
            kind="bad input",
        )
