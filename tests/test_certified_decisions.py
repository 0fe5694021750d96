"""Certified means certified: the attacks of the independent review, each where its guarantee is
most likely to break. No test constant from the outcomes being tested (rare giant clusters for the
unit estimand, both sides, through outcomes=file); a random order for each file (the error given the
seed over 100 fixed seeds on a file sorted worst scenes first); approximate modes that never halt or
block (broken-scene and halting nulls for every mode); the prototype's halt with honest words;
intervals that cover at the ceiling; advice, names and labels that do not mislead.

Rates are judged by one-sided 95% Clopper-Pearson bounds (a procedure fails when even the lower
bound exceeds alpha), and each guarantee has a negative control that must fail.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import beta as beta_dist

from helpers.configs import compose_config, gauntlet_inputs_of, typed_gauntlet
from helpers.outcomes import outcome_table, rows_from_cluster_means
from vlaeval.artifacts import sha256_file, stable_seed
from vlaeval.config import UserInputError
from vlaeval.gauntlet import ArrayCache, FileOutcomes, SyntheticOutcomes, run_gauntlet, validate_gauntlet
from vlaeval.gauntlet.constants import ORDER_FROM_FRESH_DRAW, run_order_seed
from vlaeval.gauntlet.outcomes import cluster_permutation
from vlaeval.gauntlet.planning import plan_gauntlet
from vlaeval.gauntlet.result import Lineage
from vlaeval.seqtest import PairedSequentialTest, drift_diagnostic, size_adaptive_cap
from vlaeval.seqtest.simulation import (
    NEVER,
    broken_scene_cluster_means,
    every_mode_decision_times,
    exact_decision_times,
    rare_giant_cluster_means,
    skewed_null_cluster_means,
)
from vlaeval.seqtest.state import TestSettings
from vlaeval.seqtest.units import FEW_SCENES, success_rate_interval

ALPHA, DELTA, CAT = 0.05, 0.02, 0.05
ALARM = ALPHA / 7  # the default strata's Bonferroni alarm level: 6 REGRESSION alarms + 1 halt
LINEAGE = Lineage(valid=True)


def cp_lower(k: int, n: int) -> float:
    return 0.0 if k == 0 else float(beta_dist.ppf(0.05, k, n - k + 1))


def test_the_clopper_pearson_bound_every_rate_is_judged_by_matches_scipy():
    from scipy.stats import binomtest

    for k, n in ((0, 60), (1, 60), (15, 60), (104, 2000), (1999, 2000)):
        exact = binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact").low  # one-sided 95%
        assert cp_lower(k, n) == pytest.approx(exact, abs=1e-12), (k, n)


def decided(times: dict, kind: str) -> int:
    return int((times[kind] < NEVER).sum())


def one_stratum(overrides=(), name="safety_critical", **stratum):
    settings, strata, _ = typed_gauntlet(compose_config(["gauntlet.preflight=off", *overrides]))
    return settings, {name: replace(strata[name], **stratum)}


# ----------------------------------------------------------------------------- 1. constants
SIDES = ("regression", "pass")


@pytest.mark.parametrize("side", SIDES)
def test_rare_giant_design_sits_exactly_at_the_unit_margin(side):
    x, n = rare_giant_cluster_means(np.random.default_rng(0), 1, 3_000_000, side)
    assert float((x * n).sum() / n.sum()) == pytest.approx(-DELTA, abs=0.002)
    assert float(x[n == 5].mean()) != pytest.approx(-DELTA, abs=0.015)  # the mean of cluster means is not


@pytest.mark.parametrize("side", SIDES)
def test_the_unit_normaliser_from_the_file_fails_and_a_declared_one_holds(side):
    """1,000 files of 400 clusters; the giants (200 units, 0.15% of clusters) carry the
    scenario-weighted mean. Normalised by each file's own largest cluster, a file without a giant
    weights every cluster 1 and tests the mean of cluster means: the attacked decision in ~40-50% of
    files. Normalised by the declared 200: within alpha on both sides."""
    reps = 1000
    x, n = rare_giant_cluster_means(np.random.default_rng(10 + SIDES.index(side)), reps, 400, side)
    cap = float(size_adaptive_cap(5))
    from_file = exact_decision_times(x, DELTA, ALPHA, rule="blend", cap=cap, weights=n / n.max(axis=1, keepdims=True))
    assert cp_lower(decided(from_file, side), reps) > 0.3, decided(from_file, side)  # the defect, measured
    declared = exact_decision_times(x, DELTA, ALPHA, rule="blend", cap=cap, weights=n / 200)
    for kind in SIDES:
        assert cp_lower(decided(declared, kind), reps) <= ALPHA, (side, kind, decided(declared, kind))


@pytest.mark.parametrize("side", SIDES)
def test_rare_giant_files_through_outcomes_file(tmp_path, side):
    """The same attack as a user meets it: real Parquet files read by FileOutcomes and run by
    run_gauntlet with estimand=unit. With strata.<name>.max_cluster_size declared: within alpha, no
    halt. Declaring each file's own largest cluster instead (what the scheduler used to do) is the
    negative control and must fail."""
    reps = 60
    x, n = rare_giant_cluster_means(np.random.default_rng(20 + SIDES.index(side)), reps, 400, side)
    counts = {"declared": {"pass": 0, "regression": 0, "halted": 0}, "file's own": {"pass": 0, "regression": 0}}
    # 4 orders: the order-free average is an e-value for any number, and tiny unit weights (5/200)
    # keep most of the grid alive, so each order costs a full pass. Composed once, not per file.
    settings, composed = one_stratum(["gauntlet.estimand=unit", "gauntlet.orders=4"])
    for r in range(reps):
        path = tmp_path / f"file-{r}.parquet"
        rows_from_cluster_means(x[r], n[r]).to_parquet(path, index=False)
        source = FileOutcomes(str(path))
        source.validate({"safety_critical": None}, {})  # reads the file (the stratum's settings are not used)
        for label, largest in (("declared", 200), ("file's own", int(n[r].max()))):
            strata = {name: replace(spec, max_cluster_size=largest) for name, spec in composed.items()}
            result = run_gauntlet(settings, strata, {}, source, ArrayCache(tmp_path, enabled=False), LINEAGE).to_json()
            s = result["strata"][0]
            assert s["cluster_size_bounds"]["max_cluster_size"] == largest
            assert s["cluster_size_bounds"]["max_cluster_size_from"] == "declared"
            for kind in SIDES:
                counts[label][kind] += s["decision"] == kind.upper()
            if label == "declared":
                counts[label]["halted"] += result["halted"]
    assert cp_lower(counts["file's own"][side], reps) > ALPHA, counts
    assert max(cp_lower(counts["declared"][kind], reps) for kind in SIDES) <= ALPHA, counts
    assert counts["declared"]["halted"] == 0


def test_a_file_needs_a_declared_largest_cluster_for_the_unit_estimand(tmp_path):
    path = tmp_path / "o.csv"
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    outcome_table(strata).to_csv(path, index=False)
    cfg = compose_config(["strata=small", "outcomes=file", f"outcomes.path={path}", "gauntlet.estimand=unit"])
    with pytest.raises(
        UserInputError, match=r"gauntlet.estimand=unit needs strata.safety_critical.max_cluster_size"
    ) as refused:
        gauntlet_inputs_of(cfg)
    # It names no number read off the file (its own largest cluster is a data-derived normaliser).
    assert "generator can produce" in str(refused.value) and not re.search(r"max_cluster_size=\d", str(refused.value))
    cfg = compose_config(
        ["strata=small", "outcomes=file", f"outcomes.path={path}", "strata.nominal.min_cluster_size=45"]
    )
    with pytest.raises(UserInputError, match=r"fewer than its declared strata.nominal.min_cluster_size=45"):
        gauntlet_inputs_of(cfg)
    # The synthetic source's plan is fixed before any outcome: its extremes need no declaration.
    cfg = compose_config(["strata=small", "gauntlet.estimand=unit"])
    inputs = gauntlet_inputs_of(cfg)
    result = run_gauntlet(
        inputs.settings, inputs.strata, {}, inputs.source, ArrayCache(tmp_path, enabled=False), LINEAGE
    ).to_json()
    assert {s["cluster_size_bounds"]["max_cluster_size_from"] for s in result["strata"]} == {
        "the scenario plan (fixed before outcomes)"
    }


def running_minimum_caps(n: np.ndarray) -> np.ndarray:
    """The cap of each cluster's bet from the sizes seen before it (1 before the first)."""
    before = np.minimum.accumulate(np.concatenate([np.full((n.shape[0], 1), np.inf), n[:, :-1]], axis=1), axis=1)
    return size_adaptive_cap(np.where(np.isfinite(before), before, 1.0))


@pytest.mark.parametrize("small_share", [0.004, 0.01])
def test_the_running_minimum_cap_is_valid_on_a_rare_small_cluster_null(small_share):
    """The bet cap of a file's stratum without a declared smallest size: the running minimum, which
    is predictable. Attacked with rare single-scenario clusters at +1 among scenes of 40 with one
    candidate-only failure, Delta exactly at the margin: the cap starts at 0.8, rises to 0.995 and
    falls back to 0.8 after the first small cluster."""
    rng = np.random.default_rng(int(small_share * 1e4) + 1)
    reps, clusters = 2000, 1500
    small = rng.random((reps, clusters)) < small_share
    x = np.where(small, 1.0, -1.0 / 40)
    n = np.where(small, 1, 40)
    margin = small_share - (1 - small_share) / 40
    times = exact_decision_times(x, -margin, ALPHA, rule="blend", cap=running_minimum_caps(n))
    assert max(cp_lower(decided(times, kind), reps) for kind in SIDES) <= ALPHA


def test_the_sequential_test_bets_with_the_running_minimum_exactly_as_simulated():
    rng = np.random.default_rng(3)
    x, n = rare_giant_cluster_means(rng, 1, 600, "regression")
    n = np.where(rng.random(n.shape) < 0.05, 2, n)  # some smaller clusters arrive late
    expected = exact_decision_times(x, DELTA, ALPHA, rule="blend", cap=running_minimum_caps(n), weights=n / 200)
    test = PairedSequentialTest(TestSettings(DELTA, ALPHA, estimand="unit", max_cluster_size=200))
    for part in np.array_split(np.arange(600), [1, 9, 40, 41, 300]):
        test.update(x[0, part], n[0, part])
    first = min(expected["pass"][0], expected["regression"][0])
    assert test.state.decided_at_cluster == (None if first == NEVER else first)
    assert "running minimum" in test.state.settings.bet_cap_rule
    with pytest.raises(ValueError, match="larger than max_cluster_size=200"):
        test.update(np.array([0.0]), np.array([201]))


# ----------------------------------------------------------------------------- 2. the order
def sorted_files(reps: int, scenes: int = 200, size: int = 8, seed: int = 5) -> np.ndarray:
    """Files of i.i.d. scenes (half 16 points worse, half 12 better: Delta exactly -0.02), each
    sorted worst scene first, as an export sorted by difficulty is."""
    rng = np.random.default_rng(seed)
    worse = rng.random((reps, scenes)) < 0.5
    u = rng.random((reps, scenes, size))
    candidate = u < 0.8 + np.where(worse, -0.16, 0.12)[..., None]
    x = (candidate.astype(np.int8) - (u < 0.8).astype(np.int8)).mean(axis=2)
    return np.sort(x, axis=1)


def test_one_permutation_for_every_file_is_invalid_given_the_seed_and_a_content_digest_is_not():
    """The error rate *given the order seed* over 100 fixed seeds, 400 sorted files each. One
    permutation shared by every file (the old default: gauntlet.seed) puts the same ranks first in
    every file, so for some seeds almost every file decides wrongly; a permutation per file from its
    content digest is within alpha, and does not depend on gauntlet.seed at all."""
    x = sorted_files(400)
    reps = x.shape[0]
    cap = float(size_adaptive_cap(8))

    def wrong(matrix: np.ndarray) -> int:
        times = exact_decision_times(matrix, DELTA, ALPHA, rule="blend", cap=cap)
        return int(((times["pass"] < NEVER) | (times["regression"] < NEVER)).sum())

    per_seed = np.array([wrong(x[:, cluster_permutation(x.shape[1], seed, "nominal")]) for seed in range(100)])
    assert (per_seed / reps).min() < ALPHA / 2  # some seeds look fine ...
    assert cp_lower(int(per_seed.max()), reps) > 2 * ALPHA, per_seed.max()  # ... and some are far off
    assert sum(cp_lower(int(k), reps) > ALPHA for k in per_seed) >= 5
    digests = [stable_seed("cluster-order-of-content", hashlib.sha256(row.tobytes()).hexdigest()) for row in x]
    own = np.stack([row[cluster_permutation(row.size, seed, "nominal")] for row, seed in zip(x, digests)])
    assert cp_lower(wrong(own), reps) <= ALPHA


def meaning_preserving_saves(table: pd.DataFrame, folder) -> dict:
    """One table saved the ways a user re-saves a file without changing what it says."""
    folder.mkdir(parents=True, exist_ok=True)
    saves = {}
    shuffled = table.sample(frac=1.0, random_state=3).reset_index(drop=True)
    renamed = table.assign(scenario_id="r-" + table["scenario_id"], cluster_id="variant-" + table["cluster_id"])
    for name, frame in (
        ("as_exported", table),
        ("rows_shuffled", shuffled),
        ("ids_renamed", renamed),
        ("extra_column", table.assign(exported_by="nightly")),
        ("columns_reordered", table[list(table.columns)[::-1]]),
        ("true_false", table.assign(baseline=table["baseline"] == 1, candidate=table["candidate"] == 1)),
    ):
        saves[name] = folder / f"{name}.csv"
        frame.to_csv(saves[name], index=False)
    saves["crlf"] = folder / "crlf.csv"
    saves["crlf"].write_bytes(table.to_csv(index=False, lineterminator="\r\n").encode())
    saves["trailing_newline"] = folder / "trailing_newline.csv"
    saves["trailing_newline"].write_bytes((table.to_csv(index=False) + "\n").encode())
    saves["parquet"] = folder / "renamed_shuffled.parquet"
    renamed.sample(frac=1.0, random_state=5).to_parquet(saves["parquet"], index=False)
    return saves


def test_a_files_decision_cannot_be_bought_by_resaving_it_or_by_an_order_seed(tmp_path):
    """Ten meaning-preserving saves of a file (sorted worst scenes first) get one decision with the
    same e-values and confidence sequence; gauntlet.seed changes nothing; one changed scenario is
    other evidence; gauntlet.order_seed on a file is refused in one line. The old order seed was the
    file's byte digest: every save here drew another order (and its own decision)."""
    x = sorted_files(1)[0]
    table = rows_from_cluster_means(x, np.full(x.size, 8))
    saves = meaning_preserving_saves(table, tmp_path / "saves")
    assert len({sha256_file(p) for p in saves.values()}) == len(saves)  # every save's bytes differ
    picked = (
        "decision",
        "e_value_pass",
        "e_value_regression",
        "confidence_sequence",
        "delta_estimate",
        "cluster_order",
    )
    seen = []
    for path in saves.values():
        for overrides in ([], ["gauntlet.seed=12"]):
            settings, strata = one_stratum(overrides)
            source = FileOutcomes(str(path))
            source.validate(strata, {})
            s = run_gauntlet(settings, strata, {}, source, ArrayCache(tmp_path, enabled=False), LINEAGE).strata[0]
            seen.append({k: s.to_json()[k] for k in picked})
    assert all(r == seen[0] for r in seen), [r["e_value_pass"] for r in seen]
    assert seen[0]["cluster_order"]["mode"] == "order_free" and seen[0]["cluster_order"]["orders"] == 16
    changed = x.copy()
    changed[0] = changed[0] + 1 / 8
    rows_from_cluster_means(changed, np.full(x.size, 8)).to_csv(tmp_path / "b.csv", index=False)
    settings, strata = one_stratum()
    source = FileOutcomes(str(tmp_path / "b.csv"))
    source.validate(strata, {})
    other = run_gauntlet(settings, strata, {}, source, ArrayCache(tmp_path, enabled=False), LINEAGE).strata[0]
    assert other.details["blocks"][0]["digest"] != seen[0]["cluster_order"].get("digest", "x")
    assert other.e_value_pass != seen[0]["e_value_pass"]
    settings, strata = one_stratum(["gauntlet.order_seed=5"])
    source = FileOutcomes(str(saves["as_exported"]))
    source.validate(strata, {})
    with pytest.raises(UserInputError, match=r"^gauntlet.order_seed=5 cannot be set for outcomes that all exist"):
        run_gauntlet(settings, strata, {}, source, ArrayCache(tmp_path, enabled=False), LINEAGE)


def test_a_source_that_runs_policies_draws_a_fresh_order_seed_and_replays_it(tmp_path):
    settings, _, _ = typed_gauntlet(compose_config([]))

    class OnDemand(SyntheticOutcomes):
        produces_on_demand = True

    seeds = {run_order_seed(settings, OnDemand()).seed for _ in range(5)}
    assert len(seeds) == 5 and run_order_seed(settings, OnDemand()).basis == ORDER_FROM_FRESH_DRAW
    assert run_order_seed(settings, OnDemand(), replay=1234).seed == 1234
    assert run_order_seed(settings, SyntheticOutcomes()).seed == settings.seed  # i.i.d. by construction
    # job=reproduce hands the original's fresh seed to the re-run (and the digest ignores it).
    from vlaeval.jobs.reproduce import rerun_config
    from vlaeval.tracking import config_sha256

    cfg = compose_config(["job=reproduce", f"paths.output_dir={tmp_path}"])
    saved = compose_config(["outcomes=rollout_small"])
    tags = {"gauntlet.order_seed": "987654321", "gauntlet.order_seed_basis": ORDER_FROM_FRESH_DRAW}
    rerun = rerun_config(cfg, saved, tags)
    assert rerun.reproduce.replay_order_seed == 987654321
    from omegaconf import OmegaConf

    plain = lambda c: OmegaConf.to_container(c, resolve=True)  # noqa: E731
    assert config_sha256(plain(rerun)) == config_sha256(plain(rerun_config(cfg, saved, {})))
    assert (
        rerun_config(cfg, saved, {**tags, "gauntlet.order_seed_basis": "content digest"}).reproduce.replay_order_seed
        is None
    )


def test_duplicated_clusters_are_flagged_and_chance_repeats_are_not(tmp_path):
    rng = np.random.default_rng(8)
    x = np.clip(rng.normal(0, 0.2, 150), -1, 1)
    sizes = np.full(150, 8)
    drawn = rng.integers(50, 150, size=(150, 8))
    steps = {"steps": lambda c, p: int(drawn[c, p])}  # a per-episode column, as exports have
    original = rows_from_cluster_means(x, sizes, extra=steps)
    copy = original.iloc[: 8 * 20].copy()
    copy["scenario_id"] = copy["scenario_id"] + "-again"
    copy["cluster_id"] = copy["cluster_id"] + "-again"
    path = tmp_path / "dup.csv"
    pd.concat([original, copy], ignore_index=True).to_csv(path, index=False)
    settings, strata = one_stratum()
    source = FileOutcomes(str(path))
    source.validate(strata, {})
    notices = source.notices()
    assert len(notices) == 1 and "20 cluster(s) repeat another one's rows" in notices[0]
    assert "'scene-0-again' = 'scene-0'" in notices[0]
    assert "remove" not in notices[0] and "never drop clusters" in notices[0]  # no advice to delete evidence
    # Rows compared as multisets: a copy whose rows were re-ordered is the same copy.
    moved = copy.assign(_k=np.arange(len(copy))).sort_values(["cluster_id", "_k"], ascending=[True, False])
    moved = moved.drop(columns="_k")
    pd.concat([original, moved], ignore_index=True).to_csv(path, index=False)
    source = FileOutcomes(str(path))
    source.validate(strata, {})
    assert "20 cluster(s) repeat" in source.notices()[0]
    # No copies: nothing flagged, although clusters where every scenario succeeds repeat by chance.
    clean = tmp_path / "clean.csv"
    _, strata_small, _ = typed_gauntlet(compose_config(["strata=small"]))
    outcome_table(strata_small).to_csv(clean, index=False)
    source = FileOutcomes(str(clean))
    source.validate(strata_small, {})
    assert source.notices() == []


def file_notices(table, path, strata):
    """The notices FileOutcomes gives on `table` written to `path`."""
    table.to_csv(path, index=False)
    source = FileOutcomes(str(path))
    source.validate(strata, {})
    return source.notices()


def exported_twice(table, clusters):
    """`table` with the rows of `clusters` appended again under new ids (a scene exported twice)."""
    copies = table[table["cluster_id"].isin(clusters)]
    copies = copies.assign(cluster_id="again-" + copies["cluster_id"], scenario_id="again-" + copies["scenario_id"])
    return pd.concat([table, copies])


def test_the_duplicate_notice_stays_quiet_on_clean_files_with_broken_scenes(tmp_path):
    """Clean files of 48 scenes x 8 with 2% broken scenes (every episode fails, 150 steps) and episode
    seeds 0..7 in every scene (steps by seed): the old notice (rows in file order, constant clusters
    included) fired on most of them and advised removing clusters; now at most 1% fire. Three scenes
    exported twice with their timestamps are still caught in every file."""
    settings, strata = one_stratum()
    fired = caught = 0
    files = 100
    for f in range(files):
        rng = np.random.default_rng([f, 17])
        dead = np.repeat(rng.random(48) < 0.02, 8)
        base = (rng.random(384) < 0.8) & ~dead
        cand = (rng.random(384) < 0.8) & ~dead
        table = pd.DataFrame(
            {
                "stratum": "safety_critical",
                "scenario_id": [f"s{i}" for i in range(384)],
                "cluster_id": [f"scene-{i // 8}" for i in range(384)],
                "baseline": base.astype(int),
                "candidate": cand.astype(int),
                "seed": np.arange(384) % 8,
                "steps": np.where(base | cand, 150 - 10 * (np.arange(384) % 8), 150),
            }
        )
        path = tmp_path / f"clean{f}.csv"
        fired += bool(file_notices(table, path, strata))
        if f < 20:
            table["timestamp"] = 1_700_000_000 + rng.permutation(10**6)[:384]
            notices = file_notices(exported_twice(table, ["scene-3", "scene-9", "scene-30"]), path, strata)
            caught += any("3 cluster(s) repeat" in n for n in notices)
    assert fired / files <= 0.01, fired
    assert caught == 20


def near_broken_file(rng, scenes, size, base, broken_share):
    """A clean file with only the required columns: scenes of heterogeneous difficulty (+-10 points
    around `base`, the two policies independent within a scene) and a share of near-broken scenes,
    where both policies fail together but for the odd episode both succeed."""
    rate = np.clip(base + rng.uniform(-0.1, 0.1, scenes), 0.0, 1.0)
    broken = rng.random(scenes) < broken_share
    p = np.repeat(rate, size)
    base_ok, cand_ok = rng.random(p.size) < p, rng.random(p.size) < p
    both = rng.random(p.size) < 0.05  # a near-broken scene's rare episode that works for both
    dead = np.repeat(broken, size)
    base_ok, cand_ok = np.where(dead, both, base_ok), np.where(dead, both, cand_ok)
    return pd.DataFrame(
        {
            "stratum": "safety_critical",
            "scenario_id": [f"s{i}" for i in range(p.size)],
            "cluster_id": [f"scene-{i // size}" for i in range(p.size)],
            "baseline": base_ok.astype(int),
            "candidate": cand_ok.astype(int),
        }
    )


@pytest.mark.parametrize(
    "scenes, size, base, broken_share",
    [(300, 20, 0.6, 0.05), (300, 8, 0.95, 0.03)],
    ids=["300x20-5%-near-broken", "300x8-ceiling-3%-near-broken"],
)
def test_the_duplicate_notice_fits_scenes_not_independent_episodes(tmp_path, scenes, size, base, broken_share):
    """Issue 50's designs: near-broken scenes (19 both-fail pairs and one both-succeed) are alike by
    nature; under a model of independent episodes two of them are 'a copy' (it fired on 200/200 and
    124/200 of these files). The chance model now fits the scenes' spread (Dirichlet-multinomial over
    the four kinds of pair): at most 1% of clean files fire, and a scene exported twice with its
    per-episode steps is still caught."""
    settings, strata = one_stratum()
    files, fired, caught = 100, 0, 0
    for f in range(files):
        rng = np.random.default_rng([f, 50])
        table = near_broken_file(rng, scenes, size, base, broken_share)
        path = tmp_path / f"clean{f}.csv"
        fired += bool(file_notices(table, path, strata))
        if f < 10:
            table["steps"] = rng.integers(40, 400, len(table))
            notices = file_notices(exported_twice(table, ["scene-3", "scene-9"]), path, strata)
            caught += any("2 cluster(s) repeat" in n for n in notices)
    assert fired / files <= 0.01, fired
    assert caught == 10


def test_the_drift_diagnostic_sees_a_drift_in_evaluation_order():
    rng = np.random.default_rng(4)
    steady = rng.normal(-0.02, 0.06, 400)
    drifting = rng.normal(np.linspace(-0.05, 0.01, 400), 0.06)
    sizes = np.full(400, 8)
    assert abs(drift_diagnostic(steady, sizes).z) < 3
    d = drift_diagnostic(drifting, sizes)
    assert d.z > 3 and d.second_half > d.first_half
    assert drift_diagnostic(steady[:3], sizes[:3]).z is None
    settings, strata, effects = typed_gauntlet(compose_config(["strata=small"]))
    result = run_gauntlet(
        settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False), LINEAGE
    ).to_json()
    assert all(
        set(s["drift"]) == {"clusters", "first_half", "second_half", "difference", "z"} for s in result["strata"]
    )


# ----------------------------------------------------------------------------- 3. approximate modes
NULLS = {
    # 2% broken scenes (Delta = -delta): a PASS is the false decision.
    "broken scenes": (
        "pass",
        DELTA,
        ALPHA,
        lambda rng, reps, scenes: broken_scene_cluster_means(rng, reps, scenes, 8, DELTA),
    ),
    # Scenes 8 points worse and rare +1 scenes (Delta = -catastrophic_delta): a certified halt is false.
    "halting": (
        "regression",
        CAT,
        min(ALPHA / 2, ALARM),
        lambda rng, reps, scenes: skewed_null_cluster_means(rng, reps, scenes, -CAT, low=-0.08),
    ),
}


@pytest.mark.parametrize("null", sorted(NULLS))
@pytest.mark.parametrize("scenes", [48, 600])
def test_broken_scene_and_halting_nulls_for_every_mode(null, scenes):
    """The exact test holds alpha on both nulls at 48 and 600 scenes of 8; the approximate modes do
    not (their plug-in variance collapses when the rare scenes are absent), which is why their
    decisions are evidence for review only (next test)."""
    kind, margin, level, draw = NULLS[null]
    reps = 2000
    x = draw(np.random.default_rng(scenes + len(null)), reps, scenes)
    looks = np.arange(1, 11) * scenes // 10
    times = every_mode_decision_times(x, margin, ALPHA, cluster_size=8, looks=looks, alarm_alpha=level)
    rates = {mode: decided(t, kind) for mode, t in times.items()}
    allowed = ALPHA if kind == "pass" else level
    assert cp_lower(rates["exact"], reps) <= allowed, rates
    if scenes == 48:
        assert cp_lower(rates["asymptotic"], reps) > allowed and cp_lower(rates["group_sequential"], reps) > allowed, (
            rates
        )


@pytest.mark.parametrize("mode", ["asymptotic", "group_sequential"])
def test_an_approximate_mode_never_halts_and_never_blocks(mode):
    settings, strata, effects = typed_gauntlet(
        compose_config([f"gauntlet.test_mode={mode}", "effects=catastrophic_safety"])
    )
    validate_gauntlet(settings, strata, effects)
    result = run_gauntlet(
        settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False), LINEAGE
    ).to_json()
    assert not result["halted"] and result["status"] == "completed"
    assert sorted(result["processed_order"]) == sorted(result["priority_order"])  # every stratum evaluated
    signal = next(e for e in result["events"] if e["stratum"] == "safety_critical")
    assert signal["event"] == "APPROXIMATE_HALT_SIGNAL"
    assert signal["detail"].startswith(f"safety_critical: approximate ({mode}) REGRESSION")
    assert signal["detail"].endswith("not a halt: confirm with gauntlet.test_mode=exact")
    rec = result["recommendation"]
    assert rec["recommendation"] == "NEEDS_REVIEW" and rec["blockers"] == []
    label = mode.upper().replace("_", "-")
    assert any(r.startswith(f"safety_critical: approximate REGRESSION ({label}") for r in rec["review_reasons"])
    assert all("confirm with gauntlet.test_mode=exact" in r for r in rec["review_reasons"] if "approximate" in r)


# ----------------------------------------------------------------------------- 4. the halt
# The prototype's catastrophic example, now answered by sampling on: tests/test_questions.py.


# ----------------------------------------------------------------------------- 5. intervals and words
def coverage(
    wins: np.ndarray, size: int | np.ndarray, truth: float, few_scenes: int = FEW_SCENES, unseen_scene: bool = True
) -> float:
    sizes = np.broadcast_to(np.asarray(size), wins.shape)
    return float(
        np.mean(
            [
                success_rate_interval(row, n, few_scenes=few_scenes, unseen_scene=unseen_scene).covers(truth)
                for row, n in zip(wins, sizes)
            ]
        )
    )


@pytest.mark.parametrize("broken, stray", [(0.02, 0.005), (0.04, 0.01)])
def test_success_rate_intervals_cover_just_below_the_ceiling(broken, stray):
    """48 scenes of 8 with broken scenes and stray failures: a few scenes hold every failure. The
    cluster-robust interval alone (few_scenes=0, the negative control) covered the true rate 0.70 and
    0.81 of the time; widened to a scene-level Clopper-Pearson interval, at least 0.93. Unequal sizes
    and few heterogeneous scenes keep their coverage too."""
    rng = np.random.default_rng([22, int(broken * 100)])
    reps = 2000
    ok = ~(rng.random((reps, 48, 1)) < broken) & ~(rng.random((reps, 48, 8)) < stray)
    wins, truth = ok.sum(axis=2), (1 - broken) * (1 - stray)
    assert coverage(wins, 8, truth) >= 0.93
    assert coverage(wins, 8, truth, few_scenes=0, unseen_scene=False) < 0.88
    n = rng.integers(2, 31, (reps, 48))
    assert coverage(rng.binomial(n, rng.uniform(0.35, 0.85, (reps, 48))), n, 0.6) >= 0.93
    assert coverage(rng.binomial(8, rng.uniform(0.35, 0.85, (reps, 6))), 8, 0.6) >= 0.93


# (scenes, scenario per scene, broken share, stray failure rate), coverage of the cluster-robust interval alone:
# 48 x 20 is the review's design (0.837); the others the worst of benchmarks/certified_decisions.py's grid.
JUST_PAST_THE_FLOOR = [
    (48, 20, 0.02, 0.01),
    (48, 40, 0.01, 0.01),
    (96, 20, 0.02, 0.02),
    (24, 40, 0.02, 0.02),
    (96, 8, 0.02, 0.02),
]


@pytest.mark.parametrize("scenes, size, broken, stray", JUST_PAST_THE_FLOOR)
@pytest.mark.parametrize("side", ["ceiling", "floor"])
def test_success_rate_intervals_cover_just_past_the_scene_level_floor(scenes, size, broken, stray, side):
    """Ten or more scenes hold a failure, but a broken scene is rare: a sample without one read ~0.99
    +- 0.007 around a true 0.970 (issue 50, finding 4: coverage 0.837 on 48 x 20). The pseudo-scene
    an unseen broken scene could be keeps coverage >= 0.93 on both sides (the floor is the mirror:
    rare perfect scenes, stray successes); without it (the negative control) under 0.90."""
    rng = np.random.default_rng([50, 4, scenes, size, int(broken * 100), int(stray * 1000)])
    reps = 1500
    ok = ~(rng.random((reps, scenes, 1)) < broken) & ~(rng.random((reps, scenes, size)) < stray)
    wins, truth = ok.sum(axis=2), (1 - broken) * (1 - stray)
    if side == "floor":
        wins, truth = size - wins, 1 - truth
    assert np.mean(np.minimum((wins < size).sum(1), (wins > 0).sum(1)) >= 10) > 0.4  # past the floor mostly
    assert coverage(wins, size, truth) >= 0.93
    assert coverage(wins, size, truth, unseen_scene=False) < 0.90


def test_success_rate_intervals_cover_at_the_ceiling_with_few_clusters_and_on_todays_design():
    rng = np.random.default_rng(21)
    reps = 2000
    # 48 scenes of 8, 2% broken (every scenario fails), the rest always solved: truth 0.98. 38% of the
    # samples have no failure; with deff = 1 they read [0.990, 1.000] and coverage was 54%.
    broken = rng.random((reps, 48)) < 0.02
    assert coverage(np.where(broken, 0, 8), 8, 0.98) > 0.92
    ceiling = success_rate_interval(np.full(48, 8), np.full(48, 8))
    assert ceiling.design_effect == 8 and ceiling.lower < 0.93
    # 12 clusters of 8 with scene-to-scene spread; today's synthetic design (clusters of 20, scene sd 0.02).
    spread = rng.binomial(8, rng.beta(8.1, 0.9, size=(reps, 12)))
    assert coverage(spread, 8, 0.9) > 0.94
    today = rng.binomial(20, np.clip(0.9 + rng.normal(0, 0.02, (reps, 50)), 0.02, 0.995))
    assert coverage(today, 20, 0.9) > 0.94
    # The unseen scene weighs 12% there (the scenes without a failure): the interval stays near its old width.
    widths = [success_rate_interval(row, np.full(50, 20)).width for row in today[:300]]
    assert 0.038 < np.mean(widths) < 0.05


def test_pre_flight_advice_never_widens_the_margin_after_the_data(tmp_path):
    path = tmp_path / "o.csv"
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    outcome_table(strata).to_csv(path, index=False)
    cfg = compose_config(["strata=small", "outcomes=file", f"outcomes.path={path}", "gauntlet.margin_delta=0.005"])
    plan = gauntlet_inputs_of(cfg).plan()
    assert plan.warnings and not any("widen" in w or "wider margin" in w for w in plan.warnings)
    assert all("the margin is fixed in advance" in w and "evidence ledger" in w for w in plan.warnings)
    stuck = [r for r in plan.strata if r.decision_probability_within_limit < 0.5]
    assert stuck and all(r.likely_outcome == "INSUFFICIENT" and r.observed is not None for r in stuck)
    settings, strata, _ = typed_gauntlet(compose_config(["gauntlet.margin_delta=0.005"]))
    synthetic = plan_gauntlet(settings, strata, assumed_effect=0.0, replications=40)
    assert any("choose a wider margin before any outcome" in w for w in synthetic.warnings)
    assert not synthetic.from_outcomes


def test_file_strata_with_likely_typos_are_refused_unless_accepted(tmp_path):
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    table = outcome_table(strata)
    path = tmp_path / "typo.csv"
    table.assign(stratum=table["stratum"].replace("distribution_shift", "distribution_shfit")).to_csv(path, index=False)
    base = ["strata=small", "outcomes=file", f"outcomes.path={path}"]
    cfg = compose_config(base)
    with pytest.raises(
        UserInputError, match=r"did you mean 'distribution_shift'\? .*accept_new_strata=\[distribution_shfit\]"
    ):
        gauntlet_inputs_of(cfg)
    cfg = compose_config([*base, "gauntlet.accept_new_strata=[distribution_shfit]"])
    inputs = gauntlet_inputs_of(cfg)
    assert "distribution_shfit" in inputs.resolved.added
    assert any("'distribution_shfit' is in" in n for n in inputs.resolved.notices)
    # A name far from every configured stratum keeps today's notice.
    path2 = tmp_path / "moon.csv"
    table.assign(stratum=table["stratum"].replace("nominal", "moon_base")).to_csv(path2, index=False)
    cfg = compose_config(["strata=small", "outcomes=file", f"outcomes.path={path2}"])
    assert "moon_base" in gauntlet_inputs_of(cfg).resolved.added


def test_an_outcome_file_declares_where_its_evidence_came_from(tmp_path):
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    table = outcome_table(strata)
    labels = {"safety_critical": "REPLAYED", "nominal": "SIMULATED"}
    table["data_label"] = table["stratum"].map(labels).fillna("COUNTERFACTUAL")
    path = tmp_path / "labelled.csv"
    table.to_csv(path, index=False)
    cfg = compose_config(["strata=small", "outcomes=file", f"outcomes.path={path}"])
    inputs = gauntlet_inputs_of(cfg)
    result = run_gauntlet(
        inputs.settings, inputs.strata, {}, inputs.source, ArrayCache(tmp_path, enabled=False), LINEAGE
    ).to_json()
    got = {s["stratum"]: s["data_label"] for s in result["strata"]}
    assert got["safety_critical"] == "REPLAYED" and got["nominal"] == "SIMULATED"
    assert set(got.values()) == {"REPLAYED", "SIMULATED", "COUNTERFACTUAL"}
    assert not result["recommendation"]["demonstration"]
    # Without the column, nothing is taken from the strata config (whose safety_critical says
    # COUNTERFACTUAL and historical_regressions REPLAYED): the label is undeclared, and the
    # recommendation says what is missing.
    table.drop(columns="data_label").to_csv(path, index=False)
    inputs = gauntlet_inputs_of(cfg)
    result = run_gauntlet(
        inputs.settings, inputs.strata, {}, inputs.source, ArrayCache(tmp_path, enabled=False), LINEAGE
    ).to_json()
    assert {s["data_label"] for s in result["strata"]} == {"UNDECLARED"}
    assert any("declares no data_label" in r for r in result["recommendation"]["review_reasons"])
    assert result["recommendation"]["recommendation"] != "LAUNCH"
