"""The question is the user's (gauntlet.question), and a lab's trial file reads as what it is: each
confusion issue 49 reproduced from the CLI on single-task, one-trial-per-row files, and the seed's
catastrophic example, which halts once its open halt question is answered."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from helpers.configs import compose_config, typed_gauntlet
from helpers.outcomes import trial_file
from helpers.processes import run_main
from vlaeval.gauntlet import ArrayCache, SyntheticOutcomes, run_gauntlet
from vlaeval.gauntlet.result import Lineage

LINEAGE = Lineage(valid=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A 50-trial single-task file, candidate 36 points better (as a lab writes it), and its mirror."""
    folder = tmp_path_factory.mktemp("lab")
    rng = np.random.default_rng(4)
    b = (rng.random(50) < 0.30).astype(int)
    c = (rng.random(50) < 0.66).astype(int)
    return trial_file(folder / "better.csv", b, c), trial_file(folder / "worse.csv", c, b)


def gauntlet(workdir, path, *extra):
    proc = run_main(
        ["job=gauntlet", "outcomes=file", f"outcomes.path={path}", "tracking=disabled", "gauntlet.plot=false", *extra],
        workdir,
    )
    result = None
    if proc.returncode in (0, 10, 11):
        result = json.loads(sorted((workdir / "outputs").glob("*_gauntlet/result.json"))[-1].read_text())
    return proc, result


def test_is_my_policy_better_in_one_command_and_the_mirror_says_the_opposite(workdir, lab):
    better, worse = lab
    proc, result = gauntlet(
        workdir, better, "gauntlet.question=superiority", "gauntlet.exit_code_from_recommendation=true"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = result["strata"][0]
    assert result["recommendation"]["recommendation"] == "BETTER" and s["answer"] == "BETTER"
    assert result["recommendation"]["kind"] == "comparison" and result["recommendation"]["blockers"] == []
    assert "Delta > +0.000 certified at level 0.05 (one-sided)" in s["certifies"]
    out = " ".join(proc.stdout.split())
    assert "Comparison:" in out and "conclusion: BETTER" in out
    assert "blocker" not in proc.stdout and "LAUNCH" not in proc.stdout
    proc, result = gauntlet(
        workdir, worse, "gauntlet.question=superiority", "gauntlet.exit_code_from_recommendation=true"
    )
    assert proc.returncode == 11 and result["recommendation"]["recommendation"] == "NOT_BETTER"
    assert "blocker" not in proc.stdout
    proc, result = gauntlet(workdir, worse, "gauntlet.question=two_sided")
    assert result["recommendation"]["recommendation"] == "WORSE" and result["strata"][0]["answer"] == "WORSE"


def test_margin_zero_points_to_the_question(workdir, lab):
    proc, _ = gauntlet(workdir, lab[0], "gauntlet.margin_delta=0")
    assert proc.returncode == 2
    assert "gauntlet.question=superiority" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (workdir / "outputs").exists() or not list((workdir / "outputs").glob("*_gauntlet/result.json"))


def test_a_lab_file_reads_as_what_it_is(workdir, lab):
    """One stratum the default strata do not name, no data_label, no versions: not held for the
    preset's safety stratum, the notices say what applies, the screen says which interval is which,
    what the e-values mean, where the recorded order would have stopped, and invents no names."""
    proc, result = gauntlet(workdir, lab[0])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = " ".join(proc.stdout.split())  # the console wraps long lines
    assert result["required_absent"] == []
    assert not any("safety_critical: required" in r for r in result["recommendation"]["review_reasons"])
    assert "does not hold it" in out and "strata.safety_critical.required=true" in out
    assert out.count("is configured but absent") == 0  # one line for the absent strata, not six
    assert "data label SIMULATED" not in out and "data label outcome file" in out
    assert "candidate-v4" not in out and "baseline-v3" not in out and "Launch gauntlet: candidate vs baseline" in out
    assert "two-sided" in out and "(one-sided)" in out
    assert "reads at most min(4, orders)/alpha" in out
    assert "read as a stream in the file's recorded order, the anytime test decided PASS after" in out
    assert result["strata"][0]["recorded_order_stream"]["decided_at_cluster"] < 50
    for wrong in ("median never units", "more clusters than can be simulated"):
        assert wrong not in out + " ".join(proc.stderr.split())


def test_a_required_stratum_holds_when_the_user_chose_the_strata(workdir, lab):
    proc, result = gauntlet(workdir, lab[0], "strata=default")
    assert result["recommendation"]["recommendation"] == "NEEDS_REVIEW"
    assert result["required_absent"] == ["safety_critical"]


def test_versions_come_from_the_file(workdir, tmp_path):
    rng = np.random.default_rng(5)
    b, c = (rng.random(60) < 0.4).astype(int), (rng.random(60) < 0.5).astype(int)
    path = trial_file(tmp_path / "named.csv", b, c, baseline_version="pi0-base", candidate_version="pi0-ft-7")
    proc, result = gauntlet(workdir, path, "gauntlet.question=two_sided")
    assert result["candidate_version"] == "pi0-ft-7" and result["baseline_version"] == "pi0-base"
    assert "Comparison: pi0-ft-7 vs pi0-base" in " ".join(proc.stdout.split())


def test_a_file_plan_says_what_its_observed_effect_decides(workdir, tmp_path):
    """3% against 0% over 400 single trials: the plan at the assumed effect and, beside it, what a
    stream like this file most likely decides at its own effect."""
    rng = np.random.default_rng(6)
    path = trial_file(tmp_path / "rare.csv", np.zeros(400, int), (rng.random(400) < 0.03).astype(int), stratum="grasp")
    proc = run_main(["job=plan", "outcomes=file", f"outcomes.path={path}", "tracking=disabled"], workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "decide)" in proc.stdout  # the share of resampled streams that decide, beside the likely outcome
    plan = json.loads(sorted((workdir / "outputs").glob("*_plan/result.json"))[-1].read_text())
    row = plan["plan"]["strata"][0]
    assert row["likely_outcome_at_observed_effect"] in ("PASS", "INSUFFICIENT")
    assert 0.0 <= row["decision_probability_at_observed_effect"] <= 1.0


def test_horizon_mode_on_a_file_needs_its_order_declared(workdir, lab):
    proc, _ = gauntlet(workdir, lab[0], "gauntlet.test_mode=horizon")
    assert proc.returncode == 2 and "gauntlet.cluster_order=as_given" in proc.stderr
    proc, result = gauntlet(
        workdir,
        lab[0],
        "gauntlet.test_mode=horizon",
        "gauntlet.cluster_order=as_given",
        "gauntlet.question=superiority",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = result["strata"][0]
    assert s["test_mode"] == "horizon" and s["answer"] == "BETTER" and s["horizon"] == 50
    assert s["decided_at_cluster"] < 50 and "not valid past its horizon" in s["valid_within"]


# ----------------------------------------------------------------------------- the halt question
def test_the_seeds_catastrophic_example_halts_once_its_halt_question_is_answered():
    """`+effects.safety_critical=-0.06` under the seed's settings (catastrophic 0.03, margin 0.005): the
    REGRESSION comes first with the halt question open; the stratum keeps sampling until the halt's own
    bound decides it, then halts. Under vlaeval's defaults (catastrophic 0.05) the question stays open
    to the stratum's limit: a plain REGRESSION, and the gauntlet goes on."""
    seed_settings = [
        "+effects.safety_critical=-0.06",
        "gauntlet.catastrophic_delta=0.03",
        "gauntlet.margin_delta=0.005",
    ]
    settings, strata, effects = typed_gauntlet(compose_config(seed_settings))
    result = run_gauntlet(settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False), LINEAGE)
    s = result.strata[0]
    assert result.halted and s.catastrophic == "CATASTROPHIC" and s.decision == "REGRESSION"
    assert s.decided_at_cluster < s.details["catastrophic_at_cluster"]  # sampled on after its REGRESSION
    assert result.events[0].event == "CATASTROPHIC_HALT"
    settings, strata, effects = typed_gauntlet(compose_config(["+effects.safety_critical=-0.06"]))
    result = run_gauntlet(settings, strata, effects, SyntheticOutcomes(), ArrayCache("/none", enabled=False), LINEAGE)
    s = result.strata[0]
    assert s.decision == "REGRESSION" and not result.halted
    assert s.catastrophic == "UNDECIDED" and s.units_evaluated == s.unit_limit
    assert result.processed_order[1:3] == ("historical_regressions", "rare_events")  # its related strata next


def test_sampling_on_for_the_halt_question_keeps_false_catastrophe_rare():
    """Delta = -0.04 against the catastrophic margin -0.05 (the last issue's attack): every certified
    REGRESSION now samples on until its halt question is decided -- more looks at the halt's bound,
    which is anytime-valid, so false 'catastrophic' stays within its level."""
    from vlaeval.choices import Preflight, StratumKind
    from vlaeval.config import GauntletConfig, StratumConfig

    spec = StratumConfig(priority=1, units=6000, cluster_size=20, catastrophic_halt=True, kind=StratumKind.safety)
    settings = GauntletConfig(
        budget_units=10**9,
        nominal_stratum="",
        critical_stratum="",
        preflight=Preflight.off,
        plot=False,
        batch_units=320,
    )
    reps, halted, regressions = 80, 0, 0
    for r in range(reps):
        result = run_gauntlet(
            replace(settings, seed=100 + r), {"safety_critical": spec}, {"safety_critical": -0.04}, SyntheticOutcomes(),
            ArrayCache("/none", enabled=False), LINEAGE,
        )  # fmt: skip
        halted += result.halted
        regressions += result.strata[0].decision == "REGRESSION"
    assert regressions > reps // 2  # the attack reaches the halt question
    lower = 0.0 if halted == 0 else float(beta_dist.ppf(0.05, halted, reps - halted + 1))
    assert lower <= 0.05, halted
