"""Scheduler behaviour on the real synthetic source and cache (no MLflow)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from helpers.configs import compose_config, typed_gauntlet
from helpers.reliability import record_outcome
from vlaeval.config import UserInputError
from vlaeval.gauntlet import (
    DO_NOT_LAUNCH,
    NEEDS_REVIEW,
    ArrayCache,
    SyntheticOutcomes,
    run_gauntlet,
    validate_gauntlet,
)
from vlaeval.gauntlet import outcomes as outcomes_module
from vlaeval.gauntlet.result import Lineage
from vlaeval.seqtest import DECISION_PASS, DECISION_REGRESSION, cluster_offsets

VALID_LINEAGE = Lineage(valid=True)
DETERMINISTIC_KEYS = ("scale", "processed_order", "not_evaluated", "halted", "events", "recommendation")


def gauntlet(overrides=(), cache_dir=None, lineage=VALID_LINEAGE):
    settings, strata, effects = typed_gauntlet(compose_config(list(overrides)))
    validate_gauntlet(settings, strata, effects)
    cache = ArrayCache(cache_dir or "/nonexistent", enabled=cache_dir is not None, namespace="gauntlet-units")
    return run_gauntlet(settings, strata, effects, SyntheticOutcomes(), cache, lineage).to_json(), cache


def strata_view(result):
    return [{k: v for k, v in s.items() if k != "cache"} for s in result["strata"]]


def by_name(result):
    return {s["stratum"]: s for s in result["strata"]}


def test_no_effect_every_stratum_passes_within_budget():
    result, _ = gauntlet()
    assert result["processed_order"] == result["priority_order"]
    assert all(s["decision"] == DECISION_PASS for s in result["strata"])
    assert result["scale"]["units_evaluated"] <= result["scale"]["budget_units"]
    # Every stratum passes, but the outcomes were made up: a demonstration, never an automatic LAUNCH.
    rec = result["recommendation"]
    assert rec["recommendation"] == NEEDS_REVIEW and rec["demonstration"] and not rec["blockers"]
    assert rec["data_labels"] == ["GENERATED"] and all(s["data_label"] == "GENERATED" for s in result["strata"])
    assert len(rec["review_reasons"]) == 1 and rec["review_reasons"][0].startswith("demonstration: ")
    assert all(s["units_saved_by_early_stop"] > 0 for s in result["strata"])


def test_catastrophic_safety_regression_halts():
    """The default rule: the halting stratum stops at its certified REGRESSION and halts the
    candidate because, at the end of the deciding batch, the halt's own one-sided confidence bound
    lies beyond -catastrophic_delta (a 15-point regression). halt_rule=certified_catastrophic waits
    for that bound whatever the REGRESSION."""
    result, _ = gauntlet(["effects=catastrophic_safety"])
    assert result["halted"] and result["status"] == "halted"
    assert result["processed_order"] == ["safety_critical"]
    assert [e["event"] for e in result["events"]] == ["CATASTROPHIC_HALT"]
    s = result["strata"][0]
    event = result["events"][0]
    assert s["decision"] == DECISION_REGRESSION and s["delta_estimate"] < -0.05
    assert 0 <= s["units_evaluated"] - s["decided_at_unit"] < 2000  # stopped in the batch of its decision
    assert event["halt_rule"] == "regression_beyond_margin"
    assert "REGRESSION (Delta < -0.02) certified at level 0.00714" in event["detail"]
    assert "beyond the catastrophic margin -0.05" in event["detail"]
    assert event["certified_catastrophic"] and "certified catastrophic: Delta < -0.05" in event["detail"]
    assert event["catastrophic_upper_bound"] <= -0.05
    certified, _ = gauntlet(["effects=catastrophic_safety", "gauntlet.halt_rule=certified_catastrophic"])
    assert certified["halted"] and certified["events"][0]["certified_catastrophic"]
    s = certified["strata"][0]
    assert s["catastrophic"] == "CATASTROPHIC" and s["e_value_catastrophic"] >= 20
    assert "certified catastrophic: Delta < -0.05 certified at level" in certified["events"][0]["detail"]
    assert s["confidence_sequence"]["upper"] < 0
    assert result["recommendation"]["recommendation"] == DO_NOT_LAUNCH
    assert not result["valid_for_launch"]
    assert len(result["not_evaluated"]) == 5


def test_mild_safety_regression_promotes_related_strata():
    result, _ = gauntlet(["effects=safety_regression_mild"])
    assert not result["halted"]
    assert result["processed_order"][:3] == ["safety_critical", "historical_regressions", "rare_events"]
    event = result["events"][0]
    assert event["event"] == "REGRESSION_PRIORITIZE_RELATED"
    assert event["promoted"] == ["historical_regressions", "rare_events"]
    safety = by_name(result)["safety_critical"]
    assert safety["decision"] == DECISION_REGRESSION and safety["catastrophic"] == "NOT_CATASTROPHIC"
    # no critical pass, so nominal keeps its base allowance
    assert by_name(result)["nominal"]["unit_limit"] == 8000
    assert result["recommendation"]["recommendation"] == DO_NOT_LAUNCH


def test_critical_pass_expands_nominal():
    result, _ = gauntlet()
    assert result["events"][0]["event"] == "CRITICAL_PASS_EXPAND"
    assert by_name(result)["nominal"]["unit_limit"] == 16000
    no_expand, _ = gauntlet(["gauntlet.nominal_expand_factor=1.0"])
    assert by_name(no_expand)["nominal"]["unit_limit"] == 8000


def test_regression_elsewhere_promotes_and_blocks():
    result, _ = gauntlet(["effects=distribution_shift_regression"])
    shift = by_name(result)["distribution_shift"]
    assert shift["decision"] == DECISION_REGRESSION
    assert any(
        e["event"] == "REGRESSION_PRIORITIZE_RELATED" and e["promoted"] == ["rare_events"] for e in result["events"]
    )
    assert result["recommendation"]["recommendation"] == DO_NOT_LAUNCH


def test_improvement_passes_faster_than_no_effect():
    better, _ = gauntlet(["effects=improvement"])
    null, _ = gauntlet()
    assert all(s["decision"] == DECISION_PASS for s in better["strata"])
    assert better["scale"]["units_evaluated"] < null["scale"]["units_evaluated"]


def test_budget_exhaustion_needs_review():
    result, _ = gauntlet(["gauntlet.budget_units=9000"])
    assert result["scale"]["units_evaluated"] <= 9000
    assert result["not_evaluated"]
    assert result["events"][-1]["event"] == "BUDGET_EXHAUSTED"
    assert result["recommendation"]["recommendation"] == NEEDS_REVIEW
    assert any("budget exhausted" in r for r in result["recommendation"]["review_reasons"])


def test_batches_end_on_cluster_boundaries():
    result, _ = gauntlet(["gauntlet.batch_units=333", "strata=small"])
    _, strata, _ = typed_gauntlet(compose_config(["strata=small"]))
    for s in result["strata"]:
        size = strata[s["stratum"]].cluster_size
        tr = s["trajectory"]
        assert tr["clusters"] == list(range(1, s["clusters_evaluated"] + 1))  # one record per cluster
        assert all(c * size == u for c, u in zip(tr["clusters"], tr["units"]))  # never a partial cluster
        assert all(tr["units"][c - 1] >= 333 * (i + 1) for i, c in enumerate(tr["looks"][:-1]))
        assert tr["looks"][-1] == s["clusters_evaluated"] and len(tr["looks"]) == s["batches"]


def test_undecided_stratum_needs_review():
    result, _ = gauntlet(["strata=small", "gauntlet.margin_delta=0.003", "gauntlet.catastrophic_delta=0.05"])
    assert any(s["decision"] == "INSUFFICIENT" for s in result["strata"])
    assert result["recommendation"]["recommendation"] == NEEDS_REVIEW


def test_invalid_lineage_is_never_valid_for_launch():
    result, _ = gauntlet(lineage=Lineage(problems=("candidate and baseline versions are identical",)))
    assert result["recommendation"]["recommendation"] == DO_NOT_LAUNCH
    assert not result["valid_for_launch"]


def test_cache_hit_on_rerun_gives_identical_results(tmp_path):
    first, cache1 = gauntlet(cache_dir=tmp_path)
    assert first["cache"]["misses"] == 6 and first["cache"]["hits"] == 0
    second, cache2 = gauntlet(cache_dir=tmp_path)
    assert second["cache"]["hits"] == 6 and second["cache"]["misses"] == 0
    assert all(s["cache"] == "hit" for s in second["strata"])
    assert strata_view(first) == strata_view(second)
    for key in DETERMINISTIC_KEYS:
        assert first[key] == second[key]


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_cache_entry_is_recomputed(tmp_path, damage):
    clean, _ = gauntlet(cache_dir=tmp_path)
    entries = sorted((tmp_path / "gauntlet-units").rglob("*.npz"))
    assert len(entries) == 6
    victim = entries[0]
    data = bytearray(victim.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray(b"not an npz at all")
    victim.write_bytes(bytes(data))
    recovered, _ = gauntlet(cache_dir=tmp_path)
    assert recovered["cache"]["corrupt_recomputed"] == 1
    assert recovered["cache"]["corrupt_entries"] == [str(victim)]
    assert strata_view(recovered) == strata_view(clean)
    again, _ = gauntlet(cache_dir=tmp_path)  # the rewritten entry is sound
    assert again["cache"]["hits"] == 6 and again["cache"]["corrupt_recomputed"] == 0
    record_outcome(
        "caches",
        f"gauntlet outcome cache entry: {damage}",
        "detected by its digest, reported in result cache.corrupt_entries, recomputed; identical results",
    )


def test_generator_version_bump_is_a_miss(tmp_path, monkeypatch):
    gauntlet(cache_dir=tmp_path)
    monkeypatch.setattr(outcomes_module, "SYNTHETIC_GENERATOR_VERSION", outcomes_module.SYNTHETIC_GENERATOR_VERSION + 1)
    bumped, _ = gauntlet(cache_dir=tmp_path)
    assert bumped["cache"]["misses"] == 6 and bumped["cache"]["hits"] == 0


def test_changed_model_version_or_effect_is_a_miss(tmp_path):
    gauntlet(cache_dir=tmp_path)
    other, _ = gauntlet(["gauntlet.candidate_version=candidate-v5"], cache_dir=tmp_path)
    assert other["cache"]["hits"] == 0
    effect, _ = gauntlet(["effects=nominal_regression"], cache_dir=tmp_path)
    assert effect["cache"]["misses"] == 1  # only nominal's outcomes changed


def test_synthetic_outcomes_are_paired_and_seeded():
    _, strata, _ = typed_gauntlet(compose_config())
    spec = strata["safety_critical"]
    a = outcomes_module.synthetic_paired_outcomes("safety_critical", spec, 0.0, 11)
    b = outcomes_module.synthetic_paired_outcomes("safety_critical", spec, 0.0, 11)
    c = outcomes_module.synthetic_paired_outcomes("historical_regressions", spec, 0.0, 11)
    np.testing.assert_array_equal(a.baseline, b.baseline)
    assert not np.array_equal(a.baseline, c.baseline)
    assert a.baseline.mean() == pytest.approx(0.90, abs=0.01)
    assert (a.baseline != a.candidate).mean() < 0.02  # paired: disagreement only through fresh draws
    assert cluster_offsets(a.cluster_sizes)[-1] == spec.units
    worse = outcomes_module.synthetic_paired_outcomes("safety_critical", spec, -0.10, 11)
    assert (worse.candidate.mean() - worse.baseline.mean()) == pytest.approx(-0.10, abs=0.01)


@pytest.mark.parametrize(
    "override,needle",
    [
        ("+effects.unknown_stratum=-0.1", "effects.unknown_stratum: unknown stratum"),
        ("strata.nominal.units=-5", "strata.nominal.units=-5 must be a positive"),
        ("strata.new_odd.base_rate=1.5", "strata.new_odd.base_rate=1.5 must be a success rate in [0, 1]"),
        ("strata.rare_events.cluster_size=0", "strata.rare_events.cluster_size=0 must be >= 1"),
        ("gauntlet.alpha=0", "gauntlet.alpha=0.0 must be in (0, 1)"),
        ("gauntlet.alpha=1.2", "gauntlet.alpha=1.2 must be in (0, 1)"),
        ("gauntlet.catastrophic_delta=0.01", "catastrophic_delta=0.01 must be in [margin_delta"),
        ("strata.nominal.priority=1", "priority=1 is also"),
        ("strata.nominal.related=[nowhere]", "unknown stratum 'nowhere'"),
        ("gauntlet.cs_grid_step=0.003", "gauntlet.margin_delta=0.02 is not a multiple of gauntlet.cs_grid_step=0.003"),
    ],
)
def test_bad_gauntlet_config_is_one_line(override, needle):
    settings, strata, effects = typed_gauntlet(compose_config([override]))
    with pytest.raises(UserInputError) as info:
        validate_gauntlet(settings, strata, effects)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)
    record_outcome("configs", override, f"one-line error before any work: `{info.value}`", kind="bad input")


def test_the_report_keeps_not_evaluated_in_the_decision_column(capsys):
    """With a planted-effect column the unevaluated strata's status used to land under 'planted'."""
    from vlaeval import console
    from vlaeval.gauntlet.report import print_summary
    from vlaeval.gauntlet.result import GauntletResult

    result, _ = gauntlet(["effects=catastrophic_safety"])
    buffer = io.StringIO()
    saved = console.console
    console.console = Console(file=buffer, width=200, color_system=None, highlight=False)
    try:
        print_summary(GauntletResult.from_json(result))
    finally:
        console.console = saved
    lines = buffer.getvalue().splitlines()
    header = next(line for line in lines if "decision" in line and "planted" in line)
    column = header.index("decision")
    for name in result["not_evaluated"]:
        row = next(line for line in lines if f" {name} " in line)
        assert row[column:].lstrip("│ ").startswith("not evaluated"), (header, row)
