"""job=recipe_comparison end to end on real training, rollouts and MLflow: each seed pair's checkpoints
trained once and found again (a stopped comparison resumes where it was, a seed trained by job=train
is reused), a parent run with a child per seed pair, its outcome file decided the same way by
recipes.file, a certified answer from a file with a seed column -- and one-line refusals of a bad
recipe before any training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from helpers.configs import AUDIT_SMALL, compose_config, for_job
from helpers.reliability import record_outcome
from helpers.runs import runs_of
from vlaeval.errors import UserInputError
from vlaeval.jobs import dispatch
from vlaeval.seqtest.seeds import WORSE, seed_test

SMALL = [
    *for_job("recipe_comparison", AUDIT_SMALL),
    "job=recipe_comparison",
    "evaluate.episodes_per_task=2",
    "rollout.workers=1",
    'recipes.candidate.overrides=["train.steps=4"]',
    "recipes.candidate.name=four_steps",
]


def compare(tmp_path: Path, cache: Path, name: str, overrides, uri=None) -> dict:
    tracking = [f"tracking.uri={uri}"] if uri else ["tracking=disabled"]
    every = [*SMALL, *tracking, *overrides]
    cfg = compose_config(every, output_dir=tmp_path / name, cache_dir=cache)
    dispatch(cfg, every)
    return json.loads((tmp_path / name / "result.json").read_text())


def entries(cache: Path, kind: str) -> int:
    folder = cache / kind
    return len(list(folder.iterdir())) if folder.is_dir() else 0


def test_seed_pairs_are_trained_once_resumed_tracked_and_their_file_decides_the_same_way(tmp_path, store):
    cache = tmp_path / "cache"
    first = compare(tmp_path, cache, "two", ["recipes.max_seeds=2"])
    assert [p["seed"] for p in first["pairs"]] == [0, 1]
    assert entries(cache, "checkpoints") == 4 and entries(cache, "seed_evaluations") == 4
    # A longer run of the same comparison (a killed one restarted) trains only the seed pair it lacks.
    again = compare(tmp_path, cache, "three", ["recipes.max_seeds=3"], uri=store)
    assert entries(cache, "checkpoints") == 6 and entries(cache, "seed_evaluations") == 6
    assert again["pairs"][:2] == first["pairs"]
    assert len(again["looks"]) == 3 and again["decision"] in ("UNDECIDED", "BETTER", "WORSE", "EQUIVALENT")
    # Each pair: both recipes on the same episodes, different checkpoints.
    for pair in again["pairs"]:
        assert pair["baseline"]["episodes"] == pair["candidate"]["episodes"]
        assert pair["baseline"]["checkpoint_sha256"] != pair["candidate"]["checkpoint_sha256"]
    # The parent run and a child per seed pair in MLflow.
    client, runs = runs_of(store, "vlaeval-recipe_comparison")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and sorted(r.data.tags["recipes.seed"] for r in children) == ["0", "1", "2"]
    assert parents[0].data.tags["recipes.decision"] == again["decision"]
    assert parents[0].data.metrics["recipes.seeds"] == 3
    for child in children:
        pair = again["pairs"][int(child.data.tags["recipes.seed"])]
        expected = np.mean(pair["candidate"]["success"]) - np.mean(pair["baseline"]["success"])
        assert child.data.metrics["recipes.difference"] == pytest.approx(expected)
    # The outcome file it wrote, read back with recipes.file: the same pairs, the same test.
    outcomes = again["seed_outcomes"]
    with open(outcomes) as handle:
        header = next(csv.reader(handle))
    assert header[-1] == "seed" and header[:5] == ["stratum", "scenario_id", "cluster_id", "baseline", "candidate"]
    replay = compare(tmp_path, cache, "file", ["recipes.max_seeds=3", f"recipes.file={outcomes}"])
    assert entries(cache, "checkpoints") == 6  # nothing trained
    for key in ("decision", "decided_at", "looks", "sd_floor"):
        assert replay.get(key) == again.get(key), key
    assert replay["baseline"]["success"] == again["baseline"]["success"]


def test_a_seed_trained_by_job_train_is_the_comparisons_checkpoint(tmp_path):
    cache = tmp_path / "cache"
    train = [*for_job("train", AUDIT_SMALL), "job=train", "train.evaluate_after=false", "tracking=disabled"]
    cfg = compose_config([*train, "train.seed=0"], output_dir=tmp_path / "train", cache_dir=cache)
    dispatch(cfg, ["train.seed=0"])
    trained = json.loads((tmp_path / "train" / "result.json").read_text())["checkpoint_sha256"]
    result = compare(tmp_path, cache, "compare", ["recipes.max_seeds=2"])
    assert result["pairs"][0]["baseline"]["checkpoint_sha256"] == trained


def write_seed_file(path: Path, differences, episodes: int = 60) -> Path:
    """Seed pairs whose candidate succeeds on `episodes * (0.6 + d)` of the baseline's episodes' rows."""
    rng = np.random.default_rng(5)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["seed", "stratum", "scenario_id", "cluster_id", "baseline", "candidate"])
        for seed, d in enumerate(differences):
            base = np.zeros(episodes, dtype=int)
            base[: int(round(0.6 * episodes))] = 1
            cand = np.zeros(episodes, dtype=int)
            cand[: int(round((0.6 + d) * episodes))] = 1
            for e in rng.permutation(episodes):
                writer.writerow([seed, "s", f"task-{e % 3}/variant-{e}/seed-{e}", f"c{e}", base[e], cand[e]])
    return path


def test_a_file_with_a_seed_column_certifies_where_the_test_does(tmp_path):
    differences = [-0.30, -0.25, -0.35, -0.30, -0.2833, -0.3167, -0.30]
    path = write_seed_file(tmp_path / "seeds.csv", differences)
    result = compare(tmp_path, tmp_path / "cache", "file", [f"recipes.file={path}", "recipes.max_seeds=10"])
    measured = [round(0.6 + d, 10) for d in differences]
    expected = seed_test(
        [round(m * 60) / 60 - 0.6 for m in measured], alpha=0.05, margin=0.05, prior_scale=2.0, resolution=1 / 60
    )
    assert result["decision"] == WORSE == expected.decision
    assert result["decided_at"] == expected.decided_at and len(result["pairs"]) == expected.decided_at
    assert result["looks"][-1]["high"] < 0
    assert not (tmp_path / "cache" / "checkpoints").exists()


@pytest.mark.parametrize(
    "case, overrides, message",
    [
        ("a key the section lacks", ['recipes.candidate.overrides=["train.stepz=4"]'], "does not have"),
        ("a value the section refuses", ['recipes.candidate.overrides=["train.steps=many"]'], "train.steps"),
        ("not section.key=value", ['recipes.candidate.overrides=["steps"]'], "section.key=value"),
        ("the seed set by a recipe", ['recipes.candidate.overrides=["train.seed=3"]'], "train.seed"),
        ("one recipe twice at the same seeds", ["recipes.candidate.overrides=[]"], "seed_offset"),
        ("one seed pair", ["recipes.max_seeds=1"], "max_seeds"),
        ("both recipes one name", ["recipes.candidate.name=baseline"], "different names"),
        ("a file without a seed column", ["recipes.file={bad}"], "lacks column(s) seed"),
        ("a file whose seeds ran other tasks", ["recipes.file={mixed}"], "every seed pair runs the same tasks"),
        ("an outcome that is not 0 or 1", ["recipes.file={partial}"], "outcomes are 0 or 1"),
    ],
)
def test_a_bad_comparison_is_refused_in_one_line_before_any_training(tmp_path, case, overrides, message):
    bad = tmp_path / "no_seed.csv"
    bad.write_text("stratum,scenario_id,cluster_id,baseline,candidate\ns,a,a,1,0\n")
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("seed,scenario_id,baseline,candidate\n0,push/v-1/seed-1,1,0\n1,reach/v-1/seed-1,1,0\n")
    partial = tmp_path / "partial.csv"
    partial.write_text("seed,scenario_id,baseline,candidate\n0,push/v-1/seed-1,0.5,0\n")
    files = {"{bad}": bad, "{mixed}": mixed, "{partial}": partial}
    overrides = [o.replace(k, str(v)) for o in overrides for k, v in files.items() if k in o] or overrides
    with pytest.raises(UserInputError) as error:
        compare(tmp_path, tmp_path / "cache", "bad", overrides)
    text = str(error.value)
    assert message in text and "\n" not in text, text
    assert not (tmp_path / "cache" / "checkpoints").exists()
    record_outcome("recipe comparison", case, text, kind="bad input")


def test_the_presets_compose_into_the_typed_section():
    from helpers.configs import as_job

    for preset, name in (("steps", "tenth_steps"), ("aa", "same_recipe_other_seeds")):
        typed = as_job(compose_config(["job=recipe_comparison", f"recipes={preset}"]), "recipe_comparison")
        assert typed.recipes.candidate.name == name and typed.evaluate.episodes_per_task == 20
        assert typed.evaluate.scenes == "test"
