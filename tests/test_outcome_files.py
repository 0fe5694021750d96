"""outcomes=file: CSV and Parquet paired outcomes, schema-checked before any work."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import compose_config, typed_gauntlet
from reliability import record_outcome
from vlaeval.config import UserInputError
from vlaeval.gauntlet import ArrayCache, FileOutcomes, SyntheticOutcomes, run_gauntlet, validate_gauntlet
from vlaeval.gauntlet.outcomes import OutcomeRequest, synthetic_paired_outcomes


def outcome_table(strata, seed=11, shuffle_clusters=False):
    """Real paired outcomes for every stratum, as a user would export them."""
    rows = []
    for name, spec in strata.items():
        o = synthetic_paired_outcomes(name, spec, 0.0, seed)
        cluster = np.repeat(np.arange(o.cluster_sizes.size), o.cluster_sizes)
        rows.append(pd.DataFrame({
            "stratum": name, "scenario_id": [f"{name}-{i}" for i in range(o.units)],
            "cluster_id": [f"scene-{c}" for c in cluster],
            "baseline": o.baseline.astype(int), "candidate": o.candidate.astype(int)}))
    table = pd.concat(rows, ignore_index=True)
    if shuffle_clusters:
        table = table.sample(frac=1.0, random_state=0).reset_index(drop=True)
    return table


@pytest.fixture
def small():
    return typed_gauntlet(compose_config(["strata=small"]))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_file_gauntlet_matches_the_same_outcomes_in_memory(tmp_path, small, suffix):
    settings, strata, _ = small
    path = tmp_path / f"outcomes{suffix}"
    table = outcome_table(strata)
    table.to_csv(path, index=False) if suffix == ".csv" else table.to_parquet(path, index=False)
    source = FileOutcomes(str(path))
    validate_gauntlet(settings, strata, {})
    source.validate(strata, {})
    cache = ArrayCache(tmp_path, enabled=False)
    result = run_gauntlet(settings, strata, {}, source, cache, {"valid": True, "problems": []})
    assert source.describe()["sha256"] and source.describe()["kind"] == "file"
    for s in result["strata"]:
        expected = synthetic_paired_outcomes(s["stratum"], strata[s["stratum"]], 0.0, 11)
        assert s["units_available"] == expected.units
        assert s["cache"] == "file"
    in_memory = run_gauntlet(settings, strata, {}, SyntheticOutcomes(), cache, {"valid": True, "problems": []})
    strip = lambda r: [{k: v for k, v in s.items() if k != "cache"} for s in r["strata"]]  # noqa: E731
    assert strip(result) == strip(in_memory)
    assert result["processed_order"] == in_memory["processed_order"]


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


@pytest.mark.parametrize("mutate,needle", [
    (lambda t: t.drop(columns=["cluster_id"]), "lacks column(s) cluster_id"),
    (lambda t: t.assign(candidate=t["candidate"].where(t.index != 5, 2)), "candidate=2 in row 5 is not a 0/1 outcome"),
    (lambda t: t.assign(baseline=t["baseline"].astype(object).where(t.index != 3, "yes")), "baseline='yes' in row 3 is not a 0/1 outcome"),
    (lambda t: t.assign(scenario_id=t["scenario_id"].where(t.index != 7, t["scenario_id"][0])), "appears more than once"),
    (lambda t: t.assign(stratum=t["stratum"].where(t.index != 9, "moon_base")), "unknown stratum 'moon_base'"),
    (lambda t: t.iloc[:0], "has no rows"),
])
def test_bad_outcome_files_are_one_line_errors(tmp_path, small, mutate, needle):
    _, strata, _ = small
    path = _write(tmp_path, mutate(outcome_table(strata)))
    with pytest.raises(UserInputError) as info:
        FileOutcomes(path).validate(strata, {})
    assert needle in str(info.value) and "\n" not in str(info.value)
    record_outcome("outcome files", needle, f"refused before any unit is read: `{info.value}`", kind="bad input")


def test_file_source_refuses_planted_effects_and_missing_paths(tmp_path, small):
    _, strata, _ = small
    path = _write(tmp_path, outcome_table(strata), "ok.csv")
    with pytest.raises(UserInputError, match="effects can only be planted"):
        FileOutcomes(path).validate(strata, {"nominal": -0.1})
    with pytest.raises(UserInputError, match="does not exist"):
        FileOutcomes(str(tmp_path / "missing.csv")).validate(strata, {})
    with pytest.raises(UserInputError, match="outcomes.path"):
        FileOutcomes(None)
