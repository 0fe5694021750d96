"""The evidence ledger knows whose evidence it holds and says when it had none (issue 50, finding 1).

Before: entries were keyed by a folder and a stratum name, so another candidate's independent file for
the same stratum in the same cache was "N of its M clusters are missing here; this test restarts" and
sent to review (100/100 files); and with the ledger off or empty nothing said no earlier evidence was
consulted. Each test runs job=gauntlet as a user does, two files through one paths.cache_dir."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from helpers.processes import run_main


def scenes_file(path, rng, scenes, size, base, effect, candidate, baseline="policy-v3", stratum="pick_place"):
    """Scenes of heterogeneous difficulty (+-10 points), the candidate `effect` points better, REPLAYED."""
    rate = np.clip(base + rng.uniform(-0.1, 0.1, scenes), 0.0, 1.0)
    p = np.repeat(rate, size)
    b = (rng.random(p.size) < p).astype(int)
    c = (rng.random(p.size) < np.clip(p + effect, 0.0, 1.0)).astype(int)
    pd.DataFrame(
        {
            "stratum": stratum,
            "scenario_id": [f"s{i}" for i in range(p.size)],
            "cluster_id": [f"scene-{i // size}" for i in range(p.size)],
            "baseline": b,
            "candidate": c,
            "baseline_version": baseline,
            "candidate_version": candidate,
            "data_label": "REPLAYED",
        }
    ).to_csv(path, index=False)
    return path


def gauntlet(workdir, path, cache, *extra, tracking=("tracking=disabled",)):
    proc = run_main(
        [
            "job=gauntlet",
            "outcomes=file",
            f"outcomes.path={path}",
            f"paths.cache_dir={cache}",
            *tracking,
            "gauntlet.plot=false",
            "gauntlet.preflight=off",
            *extra,
        ],
        workdir,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(sorted((workdir / "outputs").glob("*_gauntlet/result.json"))[-1].read_text())
    return proc, result


@pytest.mark.parametrize("scenes, size, base", [(300, 8, 0.6), (48, 8, 0.93)], ids=["300x8", "48x8-near-the-ceiling"])
def test_another_candidates_file_is_its_own_evidence(workdir, tmp_path, scenes, size, base):
    rng = np.random.default_rng(scenes)
    cache = tmp_path / "cache"
    v4 = scenes_file(tmp_path / "v4.csv", rng, scenes, size, base, 0.0, "policy-v4")
    v5 = scenes_file(tmp_path / "v5.csv", rng, scenes, size, base, 0.0, "policy-v5")
    _, first = gauntlet(workdir, v4, cache)
    assert first["strata"][0]["evidence"]["continuation"]["ledger"] == "nothing_recorded_untracked"
    proc, second = gauntlet(workdir, v5, cache)
    continuation = second["strata"][0]["evidence"]["continuation"]
    assert continuation["status"] == "new" and continuation["ledger"] == "nothing_recorded_untracked", continuation
    assert not any("missing here" in r or "restarts" in r for r in second["recommendation"]["review_reasons"])
    assert "missing here" not in proc.stdout
    # The same candidate's file again is the same comparison: the ledger holds it.
    _, again = gauntlet(workdir, v4, cache)
    assert again["strata"][0]["evidence"]["continuation"]["status"] == "repeats"


def test_a_run_that_consulted_no_earlier_evidence_says_so(workdir, tmp_path):
    """A fresh cache (a CI workspace) says no earlier test is recorded there. Untracked, nothing could
    remember a test run in another workspace, so its PASS is reviewed, the reason on the console; tracked
    to a store that holds nothing of it, a first test is a valid test. With the ledger off a PASS is not
    an automatic launch either."""
    rng = np.random.default_rng(7)
    path = scenes_file(tmp_path / "better.csv", rng, 300, 8, 0.5, 0.25, "policy-v4")
    proc, fresh = gauntlet(workdir, path, tmp_path / "ci-workspace")
    assert fresh["strata"][0]["decision"] == "PASS"
    assert fresh["strata"][0]["evidence"]["continuation"]["ledger"] == "nothing_recorded_untracked"
    assert fresh["recommendation"]["recommendation"] == "NEEDS_REVIEW"
    out = " ".join(proc.stdout.split())
    assert "no earlier test of this comparison's stratum is recorded in the evidence ledger" in out
    assert "no tracking store was read" in out
    from helpers.processes import sqlite_uri

    tracked = ("tracking=sqlite", f"tracking.uri={sqlite_uri(tmp_path / 'mlflow.db')}")
    _, first = gauntlet(workdir, path, tmp_path / "tracked-workspace", tracking=tracked)
    assert first["strata"][0]["evidence"]["continuation"]["ledger"] == "nothing_recorded"
    assert first["recommendation"]["recommendation"] == "LAUNCH"  # a first test the store would remember
    proc, off = gauntlet(workdir, path, tmp_path / "ci-workspace", "gauntlet.evidence_ledger=false")
    assert off["strata"][0]["decision"] == "PASS"
    assert off["strata"][0]["evidence"]["continuation"]["ledger"] == "off"
    assert off["recommendation"]["recommendation"] == "NEEDS_REVIEW"
    assert any("PASS with the evidence ledger is off" in r for r in off["recommendation"]["review_reasons"])
    assert "gauntlet.evidence_ledger=false" in " ".join(proc.stdout.split())


def drop_worst(path, out, scenes=20, stratum=None):
    """The file without its `scenes` scenes where the candidate did worst against the baseline (the
    attack: after a non-PASS, drop them and test again), optionally under another stratum name."""
    table = pd.read_csv(path)
    gap = (table["candidate"] - table["baseline"]).groupby(table["cluster_id"]).mean()
    kept = table[~table["cluster_id"].isin(gap.nsmallest(scenes).index)]
    if stratum is not None:
        kept = kept.assign(stratum=stratum)
    kept.to_csv(out, index=False)
    return out


def test_a_renamed_stratum_is_the_same_evidence(workdir, tmp_path):
    """The drop-20 attack under a new stratum name in the same cache: the ledger finds the clusters in
    the earlier test of "pick_place" (beyond what fresh scenes do) and the run cannot continue it, so it
    is reviewed, never launched. An independent file under the new name is its own evidence."""
    rng = np.random.default_rng(50)
    cache = tmp_path / "cache"
    path = scenes_file(tmp_path / "null.csv", rng, 300, 8, 0.6, -0.02, "policy-v4")
    _, first = gauntlet(workdir, path, cache)
    assert first["strata"][0]["decision"] != "PASS"
    renamed = drop_worst(path, tmp_path / "renamed.csv", stratum="pick_place_v2")
    proc, second = gauntlet(workdir, renamed, cache)
    continuation = second["strata"][0]["evidence"]["continuation"]
    assert continuation["status"] == "cannot_continue", continuation
    assert "as stratum 'pick_place'" in continuation["note"] and "renamed stratum or version" in continuation["note"]
    assert second["recommendation"]["recommendation"] != "LAUNCH"
    assert "renamed stratum or version" in " ".join(proc.stdout.split())
    fresh = scenes_file(tmp_path / "fresh.csv", rng, 280, 8, 0.6, -0.02, "policy-v4", stratum="pick_place_v3")
    _, own = gauntlet(workdir, fresh, cache)
    assert own["strata"][0]["evidence"]["continuation"]["status"] == "new"


def test_a_fresh_workspace_reads_the_evidence_its_tracking_store_holds(workdir, tmp_path):
    """Issue 50, finding 1: a CI workspace starts with a fresh paths.cache_dir, so dropping the worst
    scenes after a non-PASS was a first test there (0.251 of null files then LAUNCHed). Runs tracked to
    one store share their evidence: the second workspace finds the first's test of this comparison's
    stratum in the store and cannot continue it from a file that dropped 20 of its clusters."""
    from mlflow.tracking import MlflowClient

    from helpers.processes import sqlite_uri

    rng = np.random.default_rng(51)
    store = sqlite_uri(tmp_path / "mlflow.db")
    tracked = ("tracking=sqlite", f"tracking.uri={store}")
    path = scenes_file(tmp_path / "null.csv", rng, 300, 8, 0.6, -0.02, "policy-v4")
    _, first = gauntlet(workdir, path, tmp_path / "workspace-1", tracking=tracked)
    assert first["strata"][0]["decision"] != "PASS"
    note = first["strata"][0]["evidence"]["continuation"]["note"]
    assert "nor in the tracking store" in note, note
    runs = MlflowClient(tracking_uri=store).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=store).search_experiments()]
    )
    assert any(k.startswith("vlaeval.ledger.") for r in runs for k in r.data.tags)
    dropped = drop_worst(path, tmp_path / "dropped.csv")
    proc, second = gauntlet(workdir, dropped, tmp_path / "workspace-2", tracking=tracked)
    continuation = second["strata"][0]["evidence"]["continuation"]
    assert (
        continuation["status"] == "cannot_continue"
        and "20 of its 300 clusters are missing here" in continuation["note"]
    )
    assert second["recommendation"]["recommendation"] != "LAUNCH"
    # Untracked, the same attack in a third fresh workspace finds nothing, says where it did not look, and
    # whatever it decides is not a launch.
    proc, untracked = gauntlet(workdir, dropped, tmp_path / "workspace-3")
    assert "no tracking store was read" in untracked["strata"][0]["evidence"]["continuation"]["note"]
    assert untracked["recommendation"]["recommendation"] != "LAUNCH"
