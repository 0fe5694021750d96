"""outcomes=file: CSV and Parquet paired outcomes, schema-checked before any work."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from helpers.configs import compose_config, gauntlet_inputs_of, typed_gauntlet
from helpers.outcomes import outcome_table
from helpers.reliability import record_outcome
from vlaeval.config import UserInputError
from vlaeval.gauntlet import ArrayCache, FileOutcomes, SyntheticOutcomes, run_gauntlet, validate_gauntlet
from vlaeval.gauntlet.outcomes import OutcomeRequest, synthetic_paired_outcomes
from vlaeval.gauntlet.result import Lineage


@pytest.fixture
def small():
    return typed_gauntlet(compose_config(["strata=small"]))


class HeldSynthetic(SyntheticOutcomes):
    """The synthetic generator's outcomes held as a file holds them (all exist before the test)."""

    holds_outcomes = True
    data_label = None  # type: ignore[assignment]  # a file's units carry no source-wide label


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_file_gauntlet_matches_the_same_outcomes_in_memory(tmp_path, small, suffix):
    """A file and the same outcomes held in memory get the same order-free decisions, figures and
    records: nothing about the file (its bytes, format, ids) enters the test."""
    settings, strata, _ = small
    path = tmp_path / f"outcomes{suffix}"
    table = outcome_table(strata)
    table.to_csv(path, index=False) if suffix == ".csv" else table.to_parquet(path, index=False)
    source = FileOutcomes(str(path))
    validate_gauntlet(settings, strata, {})
    source.validate(strata, {})
    cache = ArrayCache(tmp_path, enabled=False)
    result = run_gauntlet(settings, strata, {}, source, cache, Lineage(valid=True)).to_json()
    assert source.describe()["sha256"] and source.describe()["kind"] == "file"
    for s in result["strata"]:
        expected = synthetic_paired_outcomes(s["stratum"], strata[s["stratum"]], 0.0, 11)
        assert s["units_available"] == expected.units
        assert s["cache"] == "file"
    in_memory = run_gauntlet(settings, strata, {}, HeldSynthetic(), cache, Lineage(valid=True)).to_json()
    labels = ("cache", "data_label")  # where the outcomes came from
    strip = lambda r: [{k: v for k, v in s.items() if k not in labels} for s in r["strata"]]  # noqa: E731
    assert strip(result) == strip(in_memory)
    assert {s["data_label"] for s in result["strata"]} == {"UNDECLARED"}  # the file names no data_label
    assert result["processed_order"] == in_memory["processed_order"]
    assert {s["cluster_order"]["mode"] for s in result["strata"]} == {"order_free"}
    assert any(s["decision"] == "PASS" for s in result["strata"])


def test_shuffled_rows_are_regrouped_by_cluster(tmp_path, small):
    _, strata, _ = small
    path = tmp_path / "shuffled.csv"
    outcome_table(strata, shuffle_clusters=True).to_csv(path, index=False)
    source = FileOutcomes(str(path))
    source.validate(strata, {})
    loaded, _ = source.load(OutcomeRequest("nominal", strata["nominal"], 0.0, 11, "b", "c"), None)
    assert loaded.units == strata["nominal"].units
    assert np.all(loaded.cluster_sizes == strata["nominal"].cluster_size)  # whole clusters again


def _write(tmp_path, table, name="bad.csv"):
    path = tmp_path / name
    table.to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda t: t.drop(columns=["cluster_id"]), "lacks column(s) cluster_id"),
        (
            lambda t: t.assign(candidate=t["candidate"].where(t.index != 5, 2)),
            "candidate=2 on line 7 is not a 0/1 outcome",
        ),
        (
            lambda t: t.assign(baseline=t["baseline"].astype(object).where(t.index != 3, "yes")),
            "baseline='yes' on line 5 is not a 0/1 outcome",
        ),
        (
            lambda t: t.assign(scenario_id=t["scenario_id"].where(t.index != 7, t["scenario_id"][0])),
            "appears more than once",
        ),
        (lambda t: t.assign(stratum=t["stratum"].where(t.index != 9, "moon_base")), "unknown stratum 'moon_base'"),
        (lambda t: t.iloc[:0], "has no rows"),
    ],
)
def test_bad_outcome_files_are_one_line_errors(tmp_path, small, mutate, needle):
    _, strata, _ = small
    path = _write(tmp_path, mutate(outcome_table(strata)))
    with pytest.raises(UserInputError) as info:
        FileOutcomes(path, strata="config").validate(strata, {})
    assert needle in str(info.value) and "\n" not in str(info.value)
    record_outcome("outcome files", needle, f"refused before any unit is read: `{info.value}`", kind="bad input")


def test_an_error_names_the_line_an_editor_shows(tmp_path, small):
    """A CSV's line numbers (the header is line 1); a Parquet table's rows, counted from 0."""
    _, strata, _ = small
    table = outcome_table(strata)
    path = _write(tmp_path, table.assign(candidate=table["candidate"].astype(object).where(table.index != 41, "x")))
    with pytest.raises(UserInputError, match=r"candidate='x' on line (\d+) ") as info:
        FileOutcomes(path).validate(strata, {})
    line = int(re.search(r"on line (\d+)", str(info.value)).group(1))
    assert open(path).read().splitlines()[line - 1].endswith(",x")
    empty = _write(tmp_path, table.assign(cluster_id=table["cluster_id"].where(table.index != 12, None)), "empty.csv")
    with pytest.raises(UserInputError, match="column cluster_id is empty on line 14;"):
        FileOutcomes(empty).validate(strata, {})
    parquet = tmp_path / "bad.parquet"
    table.assign(baseline=table["baseline"].where(table.index != 5, 7)).to_parquet(parquet, index=False)
    with pytest.raises(UserInputError, match=r"baseline=7 in row 5 \(counting from 0\) is not a 0/1 outcome"):
        FileOutcomes(str(parquet)).validate(strata, {})


def test_file_source_refuses_planted_effects_and_missing_paths(tmp_path, small):
    _, strata, _ = small
    path = _write(tmp_path, outcome_table(strata), "ok.csv")
    with pytest.raises(UserInputError, match="effects can only be planted"):
        FileOutcomes(path).validate(strata, {"nominal": -0.1})
    with pytest.raises(UserInputError, match="does not exist"):
        FileOutcomes(str(tmp_path / "missing.csv")).validate(strata, {})
    with pytest.raises(UserInputError, match="outcomes.path"):
        FileOutcomes(None)


# ----------------------------------------------------------------------------- the file's strata
def _run_file(workdir, table, *extra):
    from helpers.processes import run_main

    path = workdir / "outcomes.csv"
    table.to_csv(path, index=False)
    proc = run_main(
        ["job=gauntlet", "outcomes=file", f"outcomes.path={path}", "tracking=disabled", "gauntlet.plot=false", *extra],
        workdir,
    )
    result = None
    if proc.returncode == 0:
        import json

        result = json.loads(sorted((workdir / "outputs").glob("*_gauntlet/result.json"))[-1].read_text())  # the newest
    return proc, result


def test_a_file_with_four_strata_runs_with_no_overrides(workdir, small):
    """The file holds four strata (one the config does not know); the default config holds six. No
    traceback and no overrides: absent strata are reported in one line, the unknown one is
    evaluated with documented defaults, scale counts the file's units; the preset's required
    safety_critical holds the recommendation only when the strata were chosen (strata=default)."""
    _, strata, _ = small
    table = outcome_table(strata)
    table = table[table["stratum"].isin(["historical_regressions", "new_odd", "nominal"])]
    extra = table[table["stratum"] == "new_odd"].assign(
        stratum="night_driving", scenario_id=lambda t: "night-" + t["scenario_id"]
    )
    proc, result = _run_file(workdir, pd.concat([table, extra]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())
    assert (
        "configured strata absent from outcome file" in out
        and "safety_critical, distribution_shift, rare_events" in out
    )
    assert "notice: stratum 'night_driving' is in outcome file" in out
    assert "gauntlet.critical_stratum='safety_critical'" in out and "their rules do not apply" in out
    assert sorted(result["absent_strata"]) == ["distribution_shift", "rare_events", "safety_critical"]
    night = next(s for s in result["strata"] if s["stratum"] == "night_driving")
    assert night["priority"] == 4 and result["processed_order"][-1] == "night_driving"  # after every configured one
    assert result["scale"]["total_units_defined"] == len(table) + len(extra)
    assert result["scale"]["units_saved"] == len(table) + len(extra) - result["scale"]["units_evaluated"]
    # The order-free records (one per look: a file has no order within it) in the NPZ beside
    # result.json, the same values in the JSON.
    arrays = np.load(next((workdir / "outputs").glob("*_gauntlet/trajectories.npz")))
    for s in result["strata"]:
        record = s["trajectory"]
        assert record["per_cluster_file"] == "trajectories.npz" and record["at_batch_ends"]["looks"] == [
            s["clusters_evaluated"]
        ]
        assert arrays[f"{s['stratum']}/clusters"].tolist() == [s["clusters_evaluated"]]
        np.testing.assert_allclose(arrays[f"{s['stratum']}/cs_upper"], record["at_batch_ends"]["cs_upper"])
        assert record["at_batch_ends"]["cs_upper"] == [s["confidence_sequence"]["upper"]]
    assert "decided at" in proc.stdout
    rec = result["recommendation"]
    # safety_critical is required by the default preset, which this run did not choose: not held.
    assert not [r for r in rec["review_reasons"] if "absent" in r] and result["required_absent"] == []
    proc, result = _run_file(workdir, pd.concat([table, extra]), "strata=default")
    rec = result["recommendation"]  # chosen: its absence needs review; the others do not
    assert rec["recommendation"] == "NEEDS_REVIEW"
    assert [r for r in rec["review_reasons"] if "absent" in r] == [
        "safety_critical: required (strata.safety_critical.required) but absent from the outcome source"
    ]


def _file_inputs(tmp_path, table, *extra):
    """What job=gauntlet builds before any work, in-process, for this table as an outcome file."""

    path = tmp_path / "outcomes.csv"
    table.to_csv(path, index=False)
    cfg = compose_config(["outcomes=file", f"outcomes.path={path}", *extra])
    return gauntlet_inputs_of(cfg)


def test_absent_strata_that_are_not_required_do_not_block_launch(tmp_path, small):
    _, strata, _ = small
    table = outcome_table(strata)
    table["data_label"] = np.where(table["stratum"] == "historical_regressions", "REPLAYED", "SIMULATED")
    inputs = _file_inputs(
        tmp_path, table[table["stratum"].isin(["safety_critical", "historical_regressions", "nominal"])]
    )
    assert sorted(inputs.resolved.absent) == ["distribution_shift", "new_odd", "rare_events"]
    assert inputs.required_absent == []
    result = run_gauntlet(
        inputs.settings,
        inputs.strata,
        {},
        inputs.source,
        ArrayCache(tmp_path, enabled=False),
        Lineage(valid=True),
        absent=inputs.resolved.absent,
        required_absent=inputs.required_absent,
    ).to_json()
    assert result["recommendation"]["recommendation"] == "LAUNCH", result["recommendation"]
    assert result["absent_strata"] == inputs.resolved.absent


def test_strata_from_config_refuses_a_stratum_the_config_lacks(tmp_path, small):
    _, strata, _ = small
    table = outcome_table(strata).assign(stratum="moon_base")
    with pytest.raises(UserInputError, match="unknown stratum 'moon_base'.*outcomes.strata=file"):
        _file_inputs(tmp_path, table, "outcomes.strata=config")
    inputs = _file_inputs(tmp_path, table)  # strata from the file: none of them configured
    assert list(inputs.strata) == ["moon_base"] and inputs.resolved.added == ["moon_base"]
    assert inputs.strata["moon_base"].priority == 7 and inputs.strata["moon_base"].related == []
    assert inputs.required_absent == ["safety_critical"]


def test_the_planner_reads_the_files_clusters_and_says_what_a_stratum_would_need(workdir, small):
    """job=plan outcomes=file plans the file's own clusters; a stratum too small to decide gets the
    clusters it would need at its observed effect."""
    from helpers.processes import run_main

    _, strata, _ = small
    table = outcome_table(strata)
    few = table[table["stratum"] == "rare_events"]
    few = few[few["cluster_id"].isin(few["cluster_id"].unique()[:30])]  # 30 clusters: too few to decide
    table = pd.concat([table[table["stratum"] == "nominal"], few])
    path = workdir / "outcomes.csv"
    table.to_csv(path, index=False)
    proc = run_main(["job=plan", "outcomes=file", f"outcomes.path={path}", "tracking=disabled"], workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    plan = json.loads(next((workdir / "outputs").glob("*_plan/result.json")).read_text())["plan"]
    rows = {r["stratum"]: r for r in plan["strata"]}
    assert rows["rare_events"]["clusters_available"] == 30 and rows["rare_events"]["unit_limit"] == 300
    assert rows["nominal"]["clusters_available"] == 200
    assert rows["rare_events"]["decision_probability_within_limit"] < 0.1
    needed = rows["rare_events"]["clusters_needed_at_observed_effect"]
    assert 60 < needed < 20_000
    assert any(w.startswith("rare_events:") and "at its observed effect" in w for w in plan["warnings"])
    assert "+0.0" in proc.stdout and "observed" in proc.stdout  # the extra columns are shown


def test_a_stratum_read_in_one_batch_is_recorded_cluster_by_cluster(tmp_path):
    """384 units (48 scenes of 8) in one 2000-unit batch of a file declared to be in random order
    (cluster_order=as_given, a stream): the record, the confidence sequence and the decision point
    are per cluster, not one point per batch."""
    from vlaeval.config import StratumConfig

    spec = StratumConfig(units=384, base_rate=0.9, cluster_size=8, catastrophic_halt=False)
    o = synthetic_paired_outcomes("distribution_shift", spec, -0.30, 5)
    cluster = np.repeat(np.arange(48), 8)
    table = pd.DataFrame(
        {
            "stratum": "distribution_shift",
            "scenario_id": [f"s{i}" for i in range(384)],
            "cluster_id": [f"scene-{c}" for c in cluster],
            "baseline": o.baseline.astype(int),
            "candidate": o.candidate.astype(int),
        }
    )
    path = tmp_path / "one_batch.csv"
    table.to_csv(path, index=False)
    settings, strata, _ = typed_gauntlet(compose_config(["gauntlet.preflight=off"]))
    source = FileOutcomes(str(path))
    source.validate(strata, {})
    # Declared random (as_given): the file is a stream in its own order, tested cluster by cluster.
    settings = replace(settings, cluster_order="as_given")
    result = run_gauntlet(
        settings,
        {"distribution_shift": strata["distribution_shift"]},
        {},
        source,
        ArrayCache(tmp_path, enabled=False),
        Lineage(valid=True),
    ).to_json()
    s = result["strata"][0]
    tr = s["trajectory"]
    assert s["batches"] == 1 and len(tr["clusters"]) == 48 and tr["looks"] == [48]
    assert s["decision"] == "REGRESSION" and 1 <= s["decided_at_cluster"] < 48
    assert s["decided_at_unit"] == 8 * s["decided_at_cluster"]
    assert tr["e_value_regression"][s["decided_at_cluster"] - 1] >= 1 / s["alarm_alpha"]
    assert tr["e_value_regression"][s["decided_at_cluster"] - 2] < 1 / s["alarm_alpha"]
    assert s["decision_wealth"] == pytest.approx(tr["e_value_regression"][s["decided_at_cluster"] - 1])
    lower, upper = np.array(tr["cs_lower"]), np.array(tr["cs_upper"])
    assert np.all(np.diff(lower) >= 0) and np.all(np.diff(upper) <= 0)  # running intersection, per cluster
    assert len(set(upper.tolist())) > 5  # the interval moves cluster by cluster
    from vlaeval.gauntlet.plots import plot_trajectories
    from vlaeval.gauntlet.result import GauntletResult

    assert plot_trajectories(GauntletResult.from_json(result), tmp_path / "one_batch.png").stat().st_size > 10_000


# ----------------------------------------------------------------------------- success rates
def test_success_rate_interval_is_wilson_without_clustering_and_wider_with_it():
    from scipy.stats import binomtest

    from vlaeval.seqtest.units import success_rate_interval

    # Independent units (clusters of 1): the plain Wilson interval, up to the C / (C - 1) small-sample
    # factor of the cluster-robust variance.
    wins = np.r_[np.ones(83), np.zeros(17)]
    plain = success_rate_interval(wins, np.ones(100))
    wilson = binomtest(83, 100).proportion_ci(0.95, method="wilson")
    assert plain.design_effect == pytest.approx(100 / 99)
    # The critical value is Student's t with C - 1 = 99 df (1.984), not the normal's 1.960.
    assert plain.lower == pytest.approx(wilson.low, rel=5e-3) and plain.upper == pytest.approx(wilson.high, rel=5e-3)
    assert plain.lower < wilson.low and plain.upper > wilson.high
    many = success_rate_interval(np.r_[np.ones(8300), np.zeros(1700)], np.ones(10_000))
    big = binomtest(8300, 10_000).proportion_ci(0.95, method="wilson")
    assert many.lower == pytest.approx(big.low, abs=3e-6) and many.upper == pytest.approx(big.high, abs=3e-6)
    # Whole scenes succeed or fail together: the interval widens by the design effect.
    scenes = success_rate_interval(np.r_[np.full(8, 10.0), np.full(2, 0.0)], np.full(10, 10))
    assert scenes.rate == pytest.approx(0.8) and scenes.design_effect > 5
    assert scenes.upper - scenes.lower > 2 * (plain.upper - plain.lower) * 0.9
    empty = success_rate_interval(np.zeros(0), np.zeros(0))
    assert empty.rate is None


def test_success_rate_interval_covers_with_correlated_scenes():
    """Coverage over 2000 simulated strata of 40 scenes x 8 scenarios with a scene effect (ICC about
    0.1): the cluster-robust interval covers about 95%; the unit-level Wilson interval undercovers."""
    from scipy.stats import beta as beta_dist

    from vlaeval.seqtest.units import success_rate_interval

    rng = np.random.default_rng(12)
    reps, scenes, size, truth = 2000, 40, 8, 0.8
    a = truth * 9.0
    p_scene = rng.beta(a, 9.0 - a, size=(reps, scenes))  # mean 0.8, scene-to-scene spread
    wins = rng.binomial(size, p_scene).astype(float)
    robust = plain = 0
    for r in range(reps):
        ci = success_rate_interval(wins[r], np.full(scenes, size))
        robust += ci.lower <= truth <= ci.upper
        unit = success_rate_interval(
            np.repeat([1.0, 0.0], [int(wins[r].sum()), scenes * size - int(wins[r].sum())]), np.ones(scenes * size)
        )
        plain += unit.lower <= truth <= unit.upper
    assert robust / reps > 0.93, robust / reps
    assert plain / reps < 0.90, plain / reps
    del beta_dist


def test_the_paired_outcome_writer_quotes_ids_that_hold_commas_and_quotes(tmp_path):
    """A scene id with a comma (or a quote) used to split its row into extra columns."""
    from vlaeval.rollouts.evaluation import write_paired_outcomes

    rows = [
        {
            "stratum": "nominal",
            "scenario_id": f'pick, "place"/{i}',
            "cluster_id": f"scene, {i // 2}",
            "baseline": True,
            "candidate": i % 3 != 0,
        }
        for i in range(6)
    ]
    path = write_paired_outcomes(rows, tmp_path / "paired.csv", extra_columns=())
    table = pd.read_csv(path)
    assert list(table["cluster_id"]) == [r["cluster_id"] for r in rows]
    assert list(table["scenario_id"]) == [r["scenario_id"] for r in rows]
    source = FileOutcomes(str(path))
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    source.validate(strata, {})
    loaded, _ = source.load(OutcomeRequest("nominal", strata["nominal"], 0.0, 11, "b", "c"), None)
    assert loaded.cluster_sizes.tolist() == [2, 2, 2] and loaded.candidate.tolist() == [r["candidate"] for r in rows]


def test_a_rerun_on_an_extended_file_continues_the_recorded_evidence(tmp_path, small):
    """Through the CLI, as a user re-runs a nightly file that grew: the second run names the run it
    continues and tests the new scenes as one more look; the ledger lives under paths.cache_dir."""
    _, strata, _ = small
    workdir = tmp_path / "work"
    workdir.mkdir()
    table = outcome_table(strata)
    table = table[table["stratum"] == "nominal"]
    first = table[table["cluster_id"].str[6:].astype(int) < 30]
    proc, result = _run_file(workdir, first, "gauntlet.nominal_stratum=''", "gauntlet.critical_stratum=''")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert result["strata"][0]["evidence"]["continuation"]["status"] == "new"
    ledger = workdir / ".cache" / "vlaeval" / "gauntlet-ledger"
    assert len(list(ledger.rglob("*.json"))) == 1
    proc, result = _run_file(workdir, table, "gauntlet.nominal_stratum=''", "gauntlet.critical_stratum=''")
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = result["strata"][0]
    assert s["evidence"]["continuation"]["status"] == "continues" and s["looks"] == 2
    said = " ".join(proc.stdout.split())  # the console folds long lines
    assert "nominal: continues run " in said and "its 30 clusters in its 1 look(s), then 170 new ones" in said
    proc, result = _run_file(
        workdir, table, "gauntlet.nominal_stratum=''", "gauntlet.critical_stratum=''", "gauntlet.evidence_ledger=false"
    )
    assert result["strata"][0]["looks"] == 1 and "continues run" not in proc.stdout
