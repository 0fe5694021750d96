"""`gauntlet.cluster_order=as_given` cannot sell a certificate (issue 50, finding 2): on an outcome file
the exact test needs no order, so a declared one is refused; where a file's order is declared for the
horizon test, no PASS in it launches, and a drift over the whole declared order sends any decision to
a human. The attack is a null file sorted best scene first, which PASSes in its declared order every
time (measured here, the negative control); it must never LAUNCH."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from helpers.configs import compose_config, typed_gauntlet
from helpers.outcomes import trial_file
from helpers.processes import run_main
from vlaeval.gauntlet import ArrayCache, FileOutcomes, run_gauntlet
from vlaeval.gauntlet.result import Lineage
from vlaeval.seqtest.horizon import synthesise

LINEAGE = Lineage(valid=True)
FILES = 30
TRIALS = 120  # single trials, the horizon test's own setting (a design of 120 clusters takes seconds)


@functools.cache
def design(horizon: int, level: float):
    return synthesise(horizon, level)


def null_files(folder, sort: bool):
    """Files at the PASS null, Delta = -0.02 (baseline 0.52, candidate 0.50, independent trials),
    sorted best pair first (candidate-only successes, then ties, then baseline-only) or as drawn;
    REPLAYED, so nothing but the order stands between a PASS and a LAUNCH."""
    rng = np.random.default_rng(50)
    paths = []
    for i in range(FILES):
        b = (rng.random(TRIALS) < 0.52).astype(int)
        c = (rng.random(TRIALS) < 0.50).astype(int)
        if sort:
            order = np.argsort(-(c - b), kind="stable")
            b, c = b[order], c[order]
        paths.append(trial_file(folder / f"null_{i}.csv", b, c, stratum="nominal", data_label="REPLAYED"))
    return paths


def run_file(path, tmp_path, *overrides):
    settings, strata, _ = typed_gauntlet(
        compose_config(
            [
                "gauntlet.test_mode=horizon",
                "gauntlet.cluster_order=as_given",
                "gauntlet.preflight=off",
                "gauntlet.nominal_stratum=",
                "gauntlet.critical_stratum=",
                *overrides,
            ]
        )
    )
    source = FileOutcomes(str(path))
    only = {"nominal": strata["nominal"]}
    source.validate(only, {})
    return run_gauntlet(settings, only, {}, source, ArrayCache(tmp_path, enabled=False), LINEAGE, designs=design)


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "as_drawn"])
def test_a_null_file_in_its_declared_order_never_launches(tmp_path, sort):
    results = [run_file(path, tmp_path) for path in null_files(tmp_path, sort)]
    passes = sum(r.strata[0].decision == "PASS" for r in results)
    launches = sum(r.recommendation.recommendation == "LAUNCH" for r in results)
    if sort:
        assert passes >= 0.9 * FILES  # the attack is real: the sorted order decides PASS
        # ... and its drift over the whole file is what the review says
        assert all(abs(r.strata[0].drift.z) > 3 for r in results)
        reasons = [" ".join(r.recommendation.review_reasons) for r in results if r.strata[0].decision == "PASS"]
        assert all("drifts" in reason for reason in reasons)
    else:
        assert passes <= 6  # at the null: a few PASSes at most (level 0.05, 30 files)
    assert launches == 0
    for r in results:
        if r.strata[0].decision == "PASS":
            assert r.recommendation.recommendation == "NEEDS_REVIEW"


def test_a_comparison_on_a_drifting_declared_order_is_undecided(tmp_path):
    """The same attack on 'is it better?': sorted, the horizon test says BETTER in the declared order;
    the drift over the whole file makes the stratum UNDECIDED, and the conclusion never BETTER."""
    for path in null_files(tmp_path, sort=True)[:10]:
        result = run_file(path, tmp_path, "gauntlet.question=superiority")
        assert result.recommendation.recommendation != "BETTER"
        assert any("drifts" in note for note in result.recommendation.review_reasons)


def test_a_declared_order_on_a_file_is_refused_for_the_exact_test(workdir, tmp_path):
    rng = np.random.default_rng(1)
    path = trial_file(tmp_path / "trials.csv", (rng.random(60) < 0.5).astype(int), (rng.random(60) < 0.5).astype(int))
    proc = run_main(
        [
            "job=gauntlet",
            "outcomes=file",
            f"outcomes.path={path}",
            "gauntlet.cluster_order=as_given",
            "tracking=disabled",
        ],
        workdir,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "order-free" in proc.stderr
    assert "gauntlet.test_mode=horizon" in proc.stderr
    assert not list(workdir.glob("outputs/*_gauntlet/result.json"))
