"""job=gauntlet: may this candidate policy replace the baseline?

Validate the strata, effects and outcome source; evaluate the strata in safety-first priority
order, each stopped by its anytime-valid e-process; react to halts, regressions and critical
passes; recommend LAUNCH / DO_NOT_LAUNCH / NEEDS_REVIEW with lineage; save the result, plot the
e-processes, log everything to MLflow, print the strata table.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from vlaeval import console
from vlaeval.config import UserInputError, require, to_plain
from vlaeval.gauntlet.cache import ArrayCache
from vlaeval.gauntlet.lineage import build_lineage
from vlaeval.provenance import code_version
from vlaeval.gauntlet.planning import plan_gauntlet
from vlaeval.gauntlet.plots import plot_trajectories
from vlaeval.gauntlet.recommendation import LAUNCH
from vlaeval.gauntlet.scheduler import BatchProgress, run_gauntlet, validate_gauntlet
from vlaeval.jobs.common import now_ms, output_dir, publish, typed
from vlaeval.seqtest import DECISION_PASS, DECISION_REGRESSION
from vlaeval.tracking import config_sha256

JOB = "gauntlet"


def build_source(cfg: DictConfig) -> Any:
    require(not OmegaConf.is_missing(cfg.outcomes, "path"),
            "outcomes=file needs a file: add outcomes.path=<file.csv|file.parquet>")
    try:
        return instantiate(cfg.outcomes)
    except InstantiationException as error:
        # Hydra wraps the source's own one-line input errors; show them as they are.
        if isinstance(error.__cause__, UserInputError):
            raise error.__cause__ from None
        raise UserInputError(f"outcomes._target_={cfg.outcomes._target_} could not be built "
                             f"({str(error).splitlines()[0]})") from None


def run(cfg: DictConfig) -> Dict[str, Any]:
    started_ms = now_ms()
    settings = typed(cfg.gauntlet)
    strata = {name: typed(node) for name, node in cfg.strata.items()}
    effects = {str(k): float(v) for k, v in cfg.effects.items()}
    source = build_source(cfg)
    validate_gauntlet(settings, strata, effects)
    source.validate(strata, effects)
    preflight = run_preflight(settings, strata)

    plain = to_plain(cfg)
    code = code_version()
    lineage = build_lineage(
        candidate_version=settings.candidate_version, baseline_version=settings.baseline_version,
        data_source=source.describe(), seeds={"gauntlet": settings.seed},
        config_sha256=config_sha256(plain), require_clean_code=settings.require_clean_code)
    cache = ArrayCache(cfg.paths.cache_dir, enabled=settings.use_cache, namespace="gauntlet-units")

    with console.unit_progress("gauntlet", settings.budget_units) as update:
        def on_batch(p: BatchProgress) -> None:
            update(completed=p.units_evaluated_total, description=f"{p.stratum} [{p.decision}]")

        result = run_gauntlet(settings, strata, effects, source, cache, lineage, on_batch=on_batch)
    result["gauntlet_id"] = f"gauntlet-{lineage['config_sha256'][:12]}"
    result["preflight"] = preflight
    for path in result["cache"]["corrupt_entries"]:
        console.print_error(f"corrupt cache entry {path} was detected and recomputed")

    plots = [plot_trajectories(result, output_dir(cfg) / "gauntlet_trajectories.png")] if settings.plot else []
    metrics, checks, tags, history = tracking_view(result)
    result = publish(cfg, JOB, result, started_ms=started_ms, run_name=result["gauntlet_id"],
                     metrics=metrics, checks=checks, tags=tags, history=history, plots=plots, code=code)
    print_summary(result)
    return result


def run_preflight(settings: Any, strata: Dict[str, Any]) -> Dict[str, Any] | None:
    """The planner before any unit is spent: warnings printed (or, with preflight=error, refused)."""
    if settings.preflight == "off":
        return None
    plan = plan_gauntlet(settings, strata, assumed_effect=settings.assumed_effect,
                         replications=settings.plan_replications)
    if plan["warnings"] and settings.preflight == "error":
        raise UserInputError(f"pre-flight: {plan['warnings'][0]} (or set gauntlet.preflight=warn)")
    for line in plan["warnings"]:
        console.print_error(f"pre-flight warning: {line}")
    return plan


def tracking_view(result: Dict[str, Any]) -> Tuple[Dict[str, float], Dict[str, bool], Dict[str, Any], Dict[str, List]]:
    """Metrics, gate checks, tags and per-batch metric history of a gauntlet result."""
    scale, rec = result["scale"], result["recommendation"]
    metrics: Dict[str, Any] = {
        "scale.units_evaluated": scale["units_evaluated"],
        "scale.units_saved": scale["units_saved"],
        "scale.budget_remaining": scale["budget_remaining"],
        "cache.hits": result["cache"]["hits"],
        "cache.misses": result["cache"]["misses"],
        "cache.corrupt_recomputed": result["cache"]["corrupt_recomputed"],
        "timing.wall_s": result["timing"]["wall_s"],
        "timing.units_per_second": result["timing"]["units_per_second"],
        "halted": float(result["halted"]),
        "launch": float(rec["recommendation"] == LAUNCH),
    }
    history: Dict[str, List] = {}
    tags: Dict[str, Any] = {
        "recommendation": rec["recommendation"],
        "halted": str(result["halted"]).lower(),
        "gauntlet.processed_order": ",".join(result["processed_order"]),
        "gauntlet.id": result["gauntlet_id"],
        "gauntlet.test_mode": result["test_mode"],
        "gauntlet.alarm_alpha": f"{result['multiplicity']['alarm_alpha']:.6g}",
    }
    if result.get("preflight") is not None:
        metrics["preflight.ok"] = float(result["preflight"]["ok"])
        metrics["preflight.expected_units"] = result["preflight"]["expected_units"]
    for s in result["strata"]:
        key = f"stratum.{s['stratum']}"
        cs = s["confidence_sequence"]
        metrics.update({
            f"{key}.units_evaluated": s["units_evaluated"],
            f"{key}.delta_estimate": s["delta_estimate"],
            f"{key}.cs_lower": cs["lower"],
            f"{key}.cs_upper": cs["upper"],
            f"{key}.decision_pass": float(s["decision"] == DECISION_PASS),
            f"{key}.decision_regression": float(s["decision"] == DECISION_REGRESSION),
        })
        tags[f"{key}.decision"] = s["decision"]
        for series in ("e_value_regression", "e_value_pass", "delta_estimate", "cs_lower", "cs_upper"):
            points = [(p["batch"], p[series]) for p in s["trajectory"] if p[series] is not None]
            if points:  # the asymptotic mode has no e-values
                history[f"{key}.{series}"] = points
    evaluated = {s["stratum"] for s in result["strata"]}
    checks = {
        "no_catastrophic_halt": not result["halted"],
        "lineage_valid": result["lineage_valid"],
        "no_stratum_regression": all(s["decision"] != DECISION_REGRESSION for s in result["strata"]),
        "all_strata_evaluated": not result["not_evaluated"] and evaluated == set(result["priority_order"]),
        "all_strata_pass": all(s["decision"] == DECISION_PASS for s in result["strata"]),
        "replayed_data_evaluated": "REPLAYED" in rec["data_labels"],
    }
    return metrics, checks, tags, history


def evalue(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def print_summary(result: Dict[str, Any]) -> None:
    cs_title = f"{1 - result['strata'][0]['alpha']:.0%} CS" if result["strata"] else "CS"
    if result["test_mode"] != "exact":
        cs_title += " (ASYMPTOTIC)"
    rows = []
    for s in result["strata"]:
        cs = s["confidence_sequence"]
        rows.append((s["priority"], s["stratum"], s["data_label"], f"{s['planted_effect']:+.3f}", s["decision"],
                     f"{s['units_evaluated']}/{s['unit_limit']}", s["units_saved_by_early_stop"],
                     f"{s['delta_estimate']:+.4f}" if s["delta_estimate"] is not None else "-",
                     f"[{cs['lower']:+.3f}, {cs['upper']:+.3f}]",
                     evalue(s["e_value_regression"]), evalue(s["e_value_pass"]), s["cache"]))
    for name in result["not_evaluated"]:
        rows.append(("", name, "", "", "not evaluated", "", "", "", "", "", "", ""))
    console.show(console.table(
        f"Launch gauntlet {result['candidate_version']} vs {result['baseline_version']}"
        + ("" if result["test_mode"] == "exact" else "  [ASYMPTOTIC test mode: not exact]"),
        ["#", "stratum", "data", "planted", "decision", "units", "saved", "delta", cs_title, "e(reg)", "e(pass)", "cache"],
        rows))
    for e in result["events"]:
        console.show(f"  {e['event']}: {e['detail']}")
    rec = result["recommendation"]
    console.show(f"recommendation: {console.styled(rec['recommendation'])}   "
                 f"units evaluated {result['scale']['units_evaluated']} of {result['scale']['total_units_defined']}   "
                 f"lineage {'valid' if result['lineage_valid'] else 'INVALID'}")
    for line in rec["blockers"]:
        console.show(f"  blocker: {line}")
    for line in rec["review_reasons"]:
        console.show(f"  review: {line}")
    if result.get("result_path"):
        console.show(f"result: {result['result_path']}" +
                     (f"   mlflow run: {result['mlflow_run_id']}" if result.get("mlflow_run_id") else ""))
