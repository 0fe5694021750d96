"""The order-free test of outcomes that all exist (an outcome file), its continuation across versions
of a growing file, the evidence ledger, and the catastrophic label's own error rate (its level on the
attack designs: test_order_free_validity.py).

Every guarantee is attacked where it is weakest -- heterogeneous scenes, skewed and rare-event nulls,
unequal cluster sizes where the running-minimum cap binds, both sides, both estimands -- with a
negative control that must fail: keeping the best of the orders, restarting on each version, reading
"catastrophic" off the estimate at the stopping time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from helpers.configs import compose_config, typed_gauntlet
from helpers.order_free import ALPHA, DELTA, allowed, decide, heterogeneous_means
from vlaeval.config import UserInputError
from vlaeval.gauntlet import ArrayCache, FileOutcomes, StratumOutcomes, run_gauntlet
from vlaeval.gauntlet.ledger import Comparison, EvidenceLedger, cluster_keys
from vlaeval.gauntlet.result import Lineage
from vlaeval.seqtest import size_adaptive_cap
from vlaeval.seqtest.order_free import OrderFreeTest
from vlaeval.seqtest.simulation import (
    NEVER,
    exact_decision_times,
)
from vlaeval.seqtest.state import OrderFreeSettings, TestSettings

LINEAGE = Lineage(valid=True)


def test_keeping_the_best_of_the_orders_is_invalid_and_their_average_is_not():
    """The negative control: on heterogeneous files at the margin, PASS when any one of 16 orders'
    e-processes passes (what a user re-saving a file shopped for when its bytes chose the order) is
    far above alpha; the average over 16 orders is not."""
    reps, scenes = 200, 400
    x = heterogeneous_means(np.random.default_rng(33), reps, scenes, -DELTA)
    caps = np.concatenate(([size_adaptive_cap(1)], np.full(scenes - 1, size_adaptive_cap(8))))  # running minimum
    shopped = averaged = 0
    for i in range(reps):
        orders = np.stack([x[i][np.random.default_rng([i, b]).permutation(scenes)] for b in range(16)])
        shopped += bool(np.any(exact_decision_times(orders, DELTA, ALPHA, rule="blend", cap=caps)["pass"] < NEVER))
        averaged += decide(x[i], np.full(scenes, 8)) == "PASS"
    assert shopped / reps > allowed(reps), shopped  # fails the bound the average is held to
    assert averaged / reps <= allowed(reps), averaged


def test_the_decision_does_not_depend_on_the_order_the_clusters_come_in():
    rng = np.random.default_rng(4)
    x = heterogeneous_means(rng, 1, 200, 0.01)[0]
    sizes = rng.integers(4, 12, 200)
    snapshots = []
    for order in (np.arange(200), np.argsort(x), np.argsort(-x), rng.permutation(200)):
        test = OrderFreeTest(TestSettings(DELTA, ALPHA, catastrophic_delta=0.05))
        test.update(x[order], sizes[order])
        snapshots.append({k: v for k, v in test.state.to_json().items()})
    assert all(s == snapshots[0] for s in snapshots[1:])
    assert snapshots[0]["orders"] == 16 and snapshots[0]["blocks"][0]["clusters"] == 200


def growing_file(seed: int, scenes: int = 500) -> np.ndarray:
    return heterogeneous_means(np.random.default_rng([seed, 5]), 1, scenes, -DELTA)[0]


def test_re_running_on_a_growing_file_continues_the_evidence_and_holds_alpha():
    """100 scenes, then 50 more at a time up to 600, a look after each: the continued test's false PASS
    stays below alpha; restarting on each version in a new order (what a byte digest did) does not."""
    reps, versions = 150, list(range(100, 601, 50))
    caps = np.concatenate(([size_adaptive_cap(1)], np.full(versions[-1] - 1, size_adaptive_cap(8))))
    continued = restarted = 0
    for r in range(reps):
        x = growing_file(r, versions[-1])
        sizes = np.full(x.size, 8)
        test, start, passed = OrderFreeTest(TestSettings(DELTA, ALPHA)), 0, False
        for end in versions:
            test.update(x[start:end], sizes[start:end])
            start, passed = end, passed or test.state.decision == "PASS"
        continued += passed
        # Each version restarted in its own order: row k holds version k's clusters (then padding).
        rows = np.stack(
            [
                np.resize(x[:end][np.random.default_rng([r, k]).permutation(end)], x.size)
                for k, end in enumerate(versions)
            ]
        )
        times = exact_decision_times(rows, DELTA, ALPHA, rule="blend", cap=caps)["pass"]
        restarted += bool(np.any(times <= np.asarray(versions)))
    assert continued / reps <= allowed(reps), continued
    assert restarted / reps > allowed(reps), restarted  # fails the bound the continued test is held to
    assert test.state.looks == len(versions) and len(test.trajectory()["clusters"]) == len(versions)


# ----------------------------------------------------------------------------- the ledger, end to end
def scene_table(x: np.ndarray, first: int = 0, label: str = "scene") -> pd.DataFrame:
    """Paired rows of scenes of 8 whose cluster means are x (net differences as one-sided successes)."""
    net = np.rint(x * 8).astype(int)
    rows = []
    for c, k in enumerate(net):
        for p in range(8):
            rows.append(
                {
                    "stratum": "nominal",
                    "scenario_id": f"{label}-{first + c}-{p}",
                    "cluster_id": f"{label}-{first + c}",
                    "baseline": int(k < 0 or p >= abs(k)),
                    "candidate": int(k > 0 or p >= abs(k)),
                    "data_label": "REPLAYED",
                }
            )
    return pd.DataFrame(rows)


def nominal_run(path, ledger, run, **setting):
    settings, strata, _ = typed_gauntlet(compose_config(["gauntlet.preflight=off"]))
    settings = replace(settings, nominal_stratum="", critical_stratum="", **setting)
    strata = {"nominal": replace(strata["nominal"], priority=1)}
    source = FileOutcomes(str(path))
    source.validate(strata, {})
    result = run_gauntlet(settings, strata, {}, source, ArrayCache(path.parent, enabled=False), LINEAGE, ledger=ledger)
    if ledger is not None:
        ledger.record_result(result.strata, Comparison(result.baseline_version, result.candidate_version), run)
    return result.strata[0], result


def test_the_ledger_continues_repeats_and_refuses_to_continue(tmp_path):
    x = np.clip(np.round(growing_file(3, 300) * 8) / 8, -1, 1)
    ledger = EvidenceLedger(tmp_path / "ledger")
    first_table = scene_table(x[:200])
    first_table.to_csv(tmp_path / "v1.csv", index=False)
    first, _ = nominal_run(tmp_path / "v1.csv", ledger, "run-1")
    assert first.details["evidence"]["continuation"]["status"] == "new" and first.details["looks"] == 1
    # Version 2: 100 new scenes, the old ones re-exported with other ids and rows in another order.
    renamed = first_table.assign(
        cluster_id="v2-" + first_table["cluster_id"], scenario_id="v2-" + first_table["scenario_id"]
    )
    second_table = pd.concat([scene_table(x[200:], 200), renamed]).sample(frac=1.0, random_state=1)
    second_table.to_parquet(tmp_path / "v2.parquet", index=False)
    second, result = nominal_run(tmp_path / "v2.parquet", ledger, "run-2")
    continuation = second.details["evidence"]["continuation"]
    assert (
        continuation["status"] == "continues" and continuation["run"] == "run-1" and continuation["earlier_looks"] == 1
    )
    assert second.details["looks"] == 2 and [b["clusters"] for b in second.details["blocks"]] == [200, 100]
    # Exactly the test fed the two versions as two looks.
    direct = OrderFreeTest(TestSettings(DELTA, ALPHA, catastrophic_delta=None, alarm_alpha=second.alarm_alpha))
    direct.update(x[:200], np.full(200, 8))
    direct.update(x[200:], np.full(100, 8))
    assert second.e_value_pass == pytest.approx(direct.state.e_values.pass_, rel=1e-12)
    assert second.decision == direct.state.decision
    # The same file again: the same evidence, the same numbers, no new look.
    again, _ = nominal_run(tmp_path / "v2.parquet", ledger, "run-3")
    assert again.details["evidence"]["continuation"]["status"] == "repeats"
    assert (again.e_value_pass, again.decision, again.details["looks"]) == (second.e_value_pass, second.decision, 2)
    # Scenes of the earlier test dropped from the file: not a continuation, and the recommendation says so.
    second_table[~second_table["cluster_id"].isin([f"v2-scene-{c}" for c in range(30)])].to_csv(
        tmp_path / "v3.csv", index=False
    )
    dropped, result = nominal_run(tmp_path / "v3.csv", ledger, "run-4")
    assert dropped.details["evidence"]["continuation"]["status"] == "cannot_continue"
    assert any("clusters are missing here" in r for r in result.recommendation.review_reasons)
    assert result.recommendation.recommendation != "LAUNCH"
    # Other settings on the same evidence: a restart, said as such.
    other, result = nominal_run(tmp_path / "v2.parquet", ledger, "run-5", margin_delta=0.03)
    assert other.details["evidence"]["continuation"]["status"] == "cannot_continue"
    assert any("under other test settings" in r for r in result.recommendation.review_reasons)
    # No ledger: every run starts afresh.
    fresh, _ = nominal_run(tmp_path / "v2.parquet", None, "unused")
    assert fresh.details["looks"] == 1


def paired_scenes(rng, scenes: int, first: int = 0, size: int = 8, delta: float = -DELTA) -> pd.DataFrame:
    """Heterogeneous REPLAYED scenes at the PASS null: base rates U(0.35, 0.85), the candidate's effect
    delta +- 0.10 per scene, paired units (a shared draw, 10% of candidate units drawn afresh)."""
    p = np.repeat(rng.uniform(0.35, 0.85, scenes), size)
    effect = np.repeat(delta + 0.10 * rng.choice([-1.0, 1.0], scenes), size)
    u = rng.random(p.size)
    fresh = np.where(rng.random(p.size) < 0.1, rng.random(p.size), u)
    scene = np.repeat(np.arange(first, first + scenes), size)
    return pd.DataFrame(
        {
            "stratum": "nominal",
            "scenario_id": [f"scene-{c}-{i % size}" for i, c in enumerate(scene)],
            "cluster_id": [f"scene-{c}" for c in scene],
            "baseline": (u < p).astype(int),
            "candidate": (fresh < p + effect).astype(int),
            "data_label": "REPLAYED",
        }
    )


def test_a_look_that_re_appends_the_files_own_scenes_is_flagged_and_never_launches(tmp_path):
    """Issue 50: re-appending a file's scenes under new ids 'continued' as new evidence (LAUNCH 5/100 and
    6/100 of files that had not PASSed). Copies -- the whole file again, or 100 of its scenes -- now read as
    a look that repeats the earlier ones (review, never LAUNCH); 100 fresh scenes appended are a
    continuation as before."""
    flagged = {"whole file again": 0, "100 of its scenes again": 0, "100 fresh scenes": 0}
    reps = 10
    for r in range(reps):
        rng = np.random.default_rng([r, 50, 1])
        table = paired_scenes(rng, 300)
        for what in flagged:
            folder = tmp_path / f"{r}-{what.replace(' ', '_')}"
            folder.mkdir()
            ledger = EvidenceLedger(folder / "ledger")
            table.to_csv(folder / "v1.csv", index=False)
            nominal_run(folder / "v1.csv", ledger, "run-1")
            if what == "100 fresh scenes":
                added = paired_scenes(rng, 100, first=300)
            else:
                again = (
                    table
                    if what == "whole file again"
                    else table[table["cluster_id"].isin(table["cluster_id"].unique()[:100])]
                )
                added = again.assign(
                    cluster_id="again-" + again["cluster_id"], scenario_id="again-" + again["scenario_id"]
                )
            pd.concat([table, added]).to_csv(folder / "v2.csv", index=False)
            second, result = nominal_run(folder / "v2.csv", ledger, "run-2")
            status = second.details["evidence"]["continuation"]["status"]
            flagged[what] += status == "copies"
            if status == "copies":
                assert result.recommendation.recommendation != "LAUNCH"
                assert any(
                    "repeat outcome patterns of the earlier looks" in x for x in result.recommendation.review_reasons
                )
            else:
                assert status == "continues"
    assert flagged["whole file again"] == reps and flagged["100 of its scenes again"] == reps, flagged
    assert flagged["100 fresh scenes"] == 0, flagged


def test_cluster_keys_are_multisets_of_paired_outcomes():
    baseline = np.array([1, 1, 0, 0, 1, 0], dtype=bool)
    candidate = np.array([1, 0, 1, 0, 0, 1], dtype=bool)
    keys = cluster_keys(baseline, candidate, np.array([4, 2]))
    assert keys == ["1/1/1/1", "0/1/1/0"]
    assert cluster_keys(baseline[[1, 0, 3, 2, 5, 4]], candidate[[1, 0, 3, 2, 5, 4]], np.array([4, 2])) == keys


UNNAMED_COMPARISON = Comparison("baseline", "candidate")


def test_a_damaged_ledger_entry_is_no_evidence(tmp_path):
    ledger = EvidenceLedger(tmp_path)
    folder = ledger._stratum_folder("nominal", UNNAMED_COMPARISON)
    folder.mkdir(parents=True)
    (folder / "broken.json").write_text("{not json")
    assert ledger.find("nominal", UNNAMED_COMPARISON, "f", ["1/0/0/7"] * 3).status == "new"


# ----------------------------------------------------------------------------- the catastrophic label
class Stream:
    """One generated halting stratum as a stream (its plan fixed before any outcome)."""

    holds_outcomes = False

    def __init__(self, baseline: np.ndarray, candidate: np.ndarray, sizes: np.ndarray) -> None:
        self.outcomes = StratumOutcomes(baseline, candidate, sizes)

    def describe(self):
        return {"kind": "memory", "sha256": "stream"}

    def validate(self, strata, effects):
        return None

    def available_strata(self):
        return None

    def cluster_sizes(self, request):
        return self.outcomes.cluster_sizes

    def load(self, request, cache):
        return self.outcomes, "memory"


def heterogeneous_units(rng: np.random.Generator, scenes: int, size: int, delta: float):
    p = rng.uniform(0.35, 0.85, scenes)
    effect = delta + 0.10 * rng.choice([-1.0, 1.0], scenes)
    cluster = np.repeat(np.arange(scenes), size)
    u = rng.random(cluster.size)
    fresh = np.where(rng.random(cluster.size) < 0.1, rng.random(cluster.size), u)
    return u < p[cluster], fresh < (p + effect)[cluster]


def test_catastrophic_is_decided_on_the_halts_own_bound_not_the_stopped_estimate():
    """Delta = -0.04 (the catastrophic margin is -0.05) on heterogeneous scenes in batches of 4
    scenes: the halt, read off the halt's confidence bound -- the stratum sampling on after its
    REGRESSION until that bound decides -- is false at most at its level; read off the estimate at
    the REGRESSION's stopping time (the prototype's rule, from the same runs) it is not."""
    settings, strata, _ = typed_gauntlet(compose_config(["gauntlet.preflight=off"]))
    settings = replace(settings, batch_units=80, nominal_stratum="", critical_stratum="")
    spec = replace(strata["safety_critical"], priority=1, units=12000, cluster_size=20)
    reps = 120
    halted = estimate_rule = regressions = 0
    for r in range(reps):
        b, c = heterogeneous_units(np.random.default_rng([r, 9]), 600, 20, -0.04)
        result = run_gauntlet(
            replace(settings, seed=r), {"safety_critical": spec}, {}, Stream(b, c, np.full(600, 20)),
            ArrayCache("/none", enabled=False), LINEAGE,
        )  # fmt: skip
        s = result.strata[0]
        halted += result.halted
        regressions += s.decision == "REGRESSION"
        # The prototype's rule read the estimate where the REGRESSION stopped the stratum; the stratum now
        # samples on for its halt question, so that estimate is the trajectory's at the decision.
        at_decision = s.trajectory["delta_estimate"][s.decided_at_cluster - 1] if s.decided_at_cluster else 0.0
        estimate_rule += s.decision == "REGRESSION" and at_decision < -0.05
    assert regressions > reps / 2  # a true REGRESSION, mostly certified
    assert halted / reps <= allowed(reps, 0.025), halted
    assert estimate_rule / reps > allowed(reps), estimate_rule


def test_order_seed_on_a_file_is_refused_but_orders_must_be_positive(tmp_path):
    scene_table(np.zeros(20)).to_csv(tmp_path / "f.csv", index=False)
    with pytest.raises(UserInputError, match="cannot be set for outcomes that all exist"):
        nominal_run(tmp_path / "f.csv", None, "x", order_seed=3)
    from vlaeval.gauntlet.scheduler import validate_gauntlet

    settings, strata, _ = typed_gauntlet(compose_config([]))
    with pytest.raises(UserInputError, match=r"^gauntlet.orders=0 must be >= 1"):
        validate_gauntlet(replace(settings, orders=0), strata, {})


def test_a_file_bets_for_its_known_size_and_certifies_more_of_the_same_files():
    """Issue 50, finding 5: a file's size is known before its first cluster, so each order bets the
    fixed-horizon plug-in and stops at min(4, orders)/alpha. On the same 150 heterogeneous files of 240
    scenes of 8 at Delta = 0 (PASS true), it certifies PASS on more of them than the test before (each
    order betting the mixture, stopped at 16/alpha: the negative control) -- 0.264 -> 0.362 on 500 files
    in benchmarks/certified_decisions.py, section 7; 35 -> 50 of these 150
    -- and on the same files at the margin (Delta = -delta) its false PASS stays within alpha."""
    rng = np.random.default_rng([50, 5])
    before = OrderFreeSettings(bet_rule="mixture", fixed_horizon=False, stop_factor=16.0)
    sizes = np.full(240, 8)

    def passes(x: np.ndarray, mode: OrderFreeSettings) -> int:
        return sum(OrderFreeTest(TestSettings(DELTA, ALPHA), mode).update(row, sizes).decision == "PASS" for row in x)

    better = heterogeneous_means(rng, 150, 240, 0.0)
    now, then = passes(better, OrderFreeSettings()), passes(better, before)
    assert now - then >= 8, (now, then)
    null = heterogeneous_means(rng, 150, 240, -DELTA)
    assert passes(null, OrderFreeSettings()) / 150 <= allowed(150)
