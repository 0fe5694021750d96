"""Typed results: a gauntlet's result round-trips through result.json unchanged, and results saved
by earlier versions of vlaeval still read (job=gauntlet_history shows them)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from helpers.configs import REPO, compose_config, gauntlet_inputs_of
from vlaeval.gauntlet import ArrayCache, SyntheticOutcomes, run_gauntlet
from vlaeval.gauntlet.result import (
    CacheUse,
    GauntletPlan,
    GauntletResult,
    Lineage,
    RolloutCost,
    RolloutsRecord,
    StratumResult,
)
from vlaeval.records import JsonRecord

# result.json files written by earlier versions (the first gauntlet, and the one before typed results).
OLD_RESULTS = sorted((REPO / "tests" / "data").glob("gauntlet_result_*.json"))


@pytest.fixture(scope="module")
def halted():
    cfg = compose_config(["strata=small", "effects=catastrophic_safety"])
    inputs = gauntlet_inputs_of(cfg)
    return run_gauntlet(
        inputs.settings,
        inputs.strata,
        inputs.effects,
        SyntheticOutcomes(),
        ArrayCache("/none", enabled=False),
        Lineage(valid=True),
        order_seed=inputs.order,
    )


def test_a_result_round_trips_through_its_json(halted):
    data = json.loads(json.dumps(halted.to_json()))  # what result.json holds
    again = GauntletResult.from_json(data)
    assert again.to_json() == data
    assert again.recommendation == halted.recommendation and again.scale == halted.scale
    assert [s.decision for s in again.strata] == [s.decision for s in halted.strata]


def test_a_results_parts_are_typed_and_round_trip_with_what_the_job_adds(halted):
    """The pre-flight plan and the rollouts' record (added by job=gauntlet), the lineage, the cache's
    use and the multiplicity statement: typed in the result, the same JSON written and read back."""
    from vlaeval.gauntlet.planning import plan_gauntlet

    inputs = gauntlet_inputs_of(compose_config(["strata=small"]))
    plan = plan_gauntlet(inputs.settings, inputs.strata, assumed_effect=0.0, replications=20)
    cost = RolloutCost(1.5, 10, 2, 400, 6, 400 / 1.5, None)
    rollouts = RolloutsRecord(cost, "paired.csv", "registry.jsonl", 1, 6, 12, 12, ("video.mp4",))
    full = halted.with_job_record(preflight=plan, notices=["a notice"], rollouts=rollouts)
    data = json.loads(json.dumps(full.to_json()))
    assert data["rollouts"]["rollouts_per_s"] is None and data["rollouts"]["videos"] == ["video.mp4"]
    assert list(data["rollouts"])[:2] == ["rollout_s", "episodes_run"]  # the cost first, as it always was
    assert data["preflight"]["ok"] == plan.ok and data["lineage"]["valid"] is True
    again = GauntletResult.from_json(data)
    assert again.to_json() == data
    assert isinstance(again.preflight, GauntletPlan) and again.preflight.warnings == plan.warnings
    assert [r.stratum for r in again.preflight.strata] == [r.stratum for r in plan.strata]
    assert again.rollouts == rollouts and isinstance(again.cache, CacheUse) and again.lineage.valid
    assert again.multiplicity.alarm_alpha == halted.multiplicity.alarm_alpha
    view = full.tracking_view()
    assert view.metrics["rollouts.episodes_run"] == 10 and view.metrics["preflight.ok"] == float(plan.ok)


def test_a_json_record_writes_its_fields_in_order_and_reads_older_and_newer_files():
    from dataclasses import dataclass
    from typing import Optional

    @dataclass(frozen=True)
    class Row(JsonRecord):
        WRITTEN_WHEN_NONE = ("estimate",)

        name: str
        estimate: Optional[float] = None
        note: Optional[str] = None
        values: tuple = ()

    row = Row("a", values=(1, 2))
    assert list(row.to_json().items()) == [("name", "a"), ("estimate", None), ("values", [1, 2])]
    assert Row.from_json({"name": "a", "values": (1, 2), "added_later": 1}) == row  # a newer file's key
    assert Row.from_json({"name": "b"}) == Row("b")  # an older file without the later fields
    with pytest.raises(TypeError):
        Row.from_json({"estimate": 1.0})  # a required field missing is refused, not defaulted


def test_typed_fields_say_what_happened(halted):
    assert halted.halted and halted.status == "halted" and not halted.valid_for_launch
    assert halted.recommendation.recommendation == "DO_NOT_LAUNCH"
    [event] = [e for e in halted.events if e.event == "CATASTROPHIC_HALT"]
    safety = halted.stratum(event.stratum or "")
    assert safety.halting and safety.decision == "REGRESSION" and (safety.delta_estimate or 0) < -0.05
    assert safety.confidence_sequence.upper < 0 and event.figures["halt_rule"] == "regression_beyond_margin"
    assert halted.scale.units_evaluated == sum(s.units_evaluated for s in halted.strata)
    view = halted.tracking_view()
    assert view.checks["no_catastrophic_halt"] is False and view.tags["recommendation"] == "DO_NOT_LAUNCH"
    assert view.metrics[f"stratum.{safety.stratum}.units_evaluated"] == safety.units_evaluated
    with pytest.raises(KeyError, match="no stratum"):
        halted.stratum("nowhere")


@pytest.mark.parametrize("path", OLD_RESULTS, ids=lambda p: p.stem)
def test_results_saved_by_earlier_versions_still_read(path):
    from vlaeval import console
    from vlaeval.gauntlet.report import print_summary

    data = json.loads(path.read_text())
    result = GauntletResult.from_json(data)
    assert result.recommendation.recommendation == data["recommendation"]["recommendation"]
    assert result.scale.units_evaluated == data["scale"]["units_evaluated"]
    assert [s.decision for s in result.strata] == [s["decision"] for s in data["strata"]]
    assert all(isinstance(s, StratumResult) for s in result.strata)
    buffer = io.StringIO()
    saved = console.console
    console.console = Console(file=buffer, width=200, color_system=None, highlight=False)
    try:
        print_summary(result)
    finally:
        console.console = saved
    shown = buffer.getvalue()
    assert f"recommendation: {data['recommendation']['recommendation']}" in shown
    assert all(s["stratum"] in shown for s in data["strata"])


def test_there_are_old_results_to_read():
    assert len(OLD_RESULTS) >= 2


def test_an_audit_result_round_trips_and_reads_without_newer_figures():
    from vlaeval.audit.statistics import Repeatability

    rep = Repeatability(0.9, 0.001, 0.8, 0.001, 0.947, 0.01, 0.05, 0.75, 0.1, 0.09)
    assert Repeatability.from_json(rep.as_dict()) == rep
    older = {k: v for k, v in rep.as_dict().items() if k != "median_anchor_cv"}
    assert str(Repeatability.from_json(older).median_anchor_cv) == "nan"
