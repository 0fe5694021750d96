"""job=gauntlet: may this candidate policy replace the baseline?

Validate the strata, effects and outcome source and reconcile the strata the source holds with the
configured ones; plan every stratum (pre-flight); for a source that runs policies, load or train
them (their digests become the versions); evaluate the strata in safety-first priority order,
clusters in a seeded random order, each stopped by its sequential test; react to halts,
regressions and critical passes; recommend LAUNCH / DO_NOT_LAUNCH / NEEDS_REVIEW with lineage;
for rollouts, write the paired outcomes and record the candidate's failures in the registry; save
the result, plot the e-processes, log everything to MLflow, print the strata table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from omegaconf import DictConfig

from vlaeval import console
from vlaeval.artifacts import atomic_write_npz
from vlaeval.config import ClusterOrder, UserInputError, to_plain
from vlaeval.gauntlet.cache import ArrayCache
from vlaeval.gauntlet.inputs import GauntletInputs, gauntlet_inputs, run_context
from vlaeval.gauntlet.lineage import build_lineage
from vlaeval.gauntlet.plots import plot_trajectories
from vlaeval.gauntlet.recommendation import DO_NOT_LAUNCH, LAUNCH, NEEDS_REVIEW
from vlaeval.gauntlet.report import print_summary
from vlaeval.gauntlet.scheduler import BatchProgress, run_gauntlet
from vlaeval.gauntlet.sources import RecordsEpisodes
from vlaeval.provenance import code_version
from vlaeval.runs import RunReport, now_ms, output_dir, publish
from vlaeval.seqtest import DECISION_PASS, DECISION_REGRESSION
from vlaeval.tracking import config_sha256

JOB = "gauntlet"
# The config sections this job reads besides job, paths and tracking: the only ones it is given,
# logs and digests (vlaeval.jobs.dispatch).
READS = ("gauntlet", "strata", "effects", "outcomes", "reproduce")
RECOMMENDATION_EXIT_CODES = {LAUNCH: 0, NEEDS_REVIEW: 10, DO_NOT_LAUNCH: 11}  # gauntlet.exit_code_from_recommendation
COMPONENTS = ("outcomes",)  # `_target_` groups checked against their signatures before run()
TRAJECTORY_FILE = "trajectories.npz"
PAIRED_OUTCOMES_FILE = "paired_outcomes.csv"  # rollout gauntlets: outcomes=file reads it


def run(cfg: DictConfig) -> Dict[str, Any]:
    started_ms = now_ms()
    inputs = gauntlet_inputs(
        cfg.gauntlet, cfg.strata, cfg.effects, cfg.outcomes, run_context(cfg), cfg.reproduce.replay_order_seed
    )
    settings = inputs.settings
    for line in inputs.resolved.notices:
        console.show(f"notice: {line}")
    preflight = run_preflight(inputs)
    if inputs.source.prepares_policies:  # a source that runs policies: loaded or trained now, digests as versions
        with console.unit_progress("loading the baseline and the candidate", 1) as update:
            versions = inputs.source.prepare(
                lambda what, done, total: update(completed=done, total=total, description=what)
            )
            settings.baseline_version, settings.candidate_version = versions or (
                settings.baseline_version,
                settings.candidate_version,
            )
        console.show(f"baseline {settings.baseline_version}, candidate {settings.candidate_version}")

    plain = to_plain(cfg)
    code = code_version()
    shuffled = settings.cluster_order == ClusterOrder.shuffled
    lineage = build_lineage(
        candidate_version=settings.candidate_version,
        baseline_version=settings.baseline_version,
        data_source=inputs.source.describe(),
        seeds={"gauntlet": settings.seed, "cluster_order": inputs.order.seed if shuffled else None},
        cluster_order=f"shuffled: a random permutation of each stratum's clusters, seed from {inputs.order.basis}"
        if shuffled
        else "as_given: the source's order, declared random by the user (gauntlet.cluster_order=as_given)",
        config_sha256=config_sha256(plain),
        require_clean_code=settings.require_clean_code,
    )
    cache = ArrayCache(cfg.paths.cache_dir, enabled=settings.use_cache, namespace="gauntlet-units")

    with console.strata_progress() as update:

        def on_batch(p: BatchProgress) -> None:
            e = p.e_values or {}
            wealth = (
                f", e(reg) {e['e_value_regression']:.3g}, e(pass) {e['e_value_pass']:.3g}"
                if e.get("e_value_regression") is not None and e.get("e_value_pass") is not None
                else ""
            )
            detail = f"{p.clusters} clusters{wealth} [{p.decision}]"
            update(p.stratum, p.units_in_stratum, p.unit_limit, detail, p.final)

        try:
            result = run_gauntlet(
                settings,
                inputs.strata,
                inputs.effects,
                inputs.source,
                cache,
                lineage,
                absent=inputs.resolved.absent,
                required_absent=inputs.required_absent,
                on_batch=on_batch,
                order_seed=inputs.order,
            )
        finally:
            inputs.source.close()  # e.g. a Ray instance the rollouts started
    result["preflight"] = preflight
    result["notices"] = inputs.resolved.notices
    extra: List[Tuple[Path, Optional[str]]] = []
    if inputs.source.records_episodes:
        rollouts = record_rollouts(inputs.source.episodes(), result, output_dir(cfg))
        result["rollouts"] = rollouts
        extra.append((Path(rollouts["paired_outcomes"]), None))
    for path in result["cache"]["corrupt_entries"]:
        console.print_error(f"corrupt cache entry {path} was detected and recomputed")

    plots = [plot_trajectories(result, output_dir(cfg) / "gauntlet_trajectories.png")] if settings.plot else []
    metrics, checks, tags, history = tracking_view(result)
    trajectories = save_trajectories(result, output_dir(cfg) / TRAJECTORY_FILE)
    result = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result,
            started_ms=started_ms,
            run_name=f"gauntlet {settings.candidate_version} vs {settings.baseline_version}",
            metrics=metrics,
            checks=checks,
            tags=tags,
            history=history,
            plots=plots,
            code=code,
            artifacts=[(trajectories, None), *extra],
        ),
    )
    print_summary(result)
    if "rollouts" in result:
        r = result["rollouts"]
        console.show(
            f"rollouts: {r['episodes_run']:,} run, {r['episodes_from_cache']:,} from the cache; "
            f"{r['episode_pairs_evaluated']:,} episode pairs of {r['episode_pairs_full_evaluation']:,} a full "
            f"evaluation runs ({r['rollouts_saved_by_early_stop']:,} rollouts saved by early stopping); "
            f"{r['registry_entries_added']} new scenarios in the failure registry {r['registry']}"
        )
        console.show(f"paired outcomes (outcomes=file reads them): {r['paired_outcomes']}")
    if settings.exit_code_from_recommendation:
        result["exit_code"] = RECOMMENDATION_EXIT_CODES[result["recommendation"]["recommendation"]]
    return result


def record_rollouts(source: RecordsEpisodes, result: Dict[str, Any], out: Path) -> Dict[str, Any]:
    """After a rollout gauntlet: every episode pair produced as a paired-outcome file (outcomes=file
    re-analyses it without new rollouts), the candidate's failures added to the failure registry,
    and what the rollouts cost."""
    from vlaeval.rollouts.scenarios import write_paired_outcomes

    path = write_paired_outcomes(source.paired_outcomes_table(), out / PAIRED_OUTCOMES_FILE)
    added = source.registry.record(source.failures())
    full, pairs = result["scale"]["total_units_defined"], result["scale"]["units_evaluated"]
    return {
        **source.stats(),
        "paired_outcomes": str(path),
        "registry": str(source.registry.path),
        "registry_entries_added": added,
        "episode_pairs_evaluated": pairs,
        "episode_pairs_full_evaluation": full,
        "rollouts_saved_by_early_stop": 2 * (full - pairs),
    }


def save_trajectories(result: Dict[str, Any], path: Path) -> Path:
    """Every stratum's per-cluster record as arrays in a compressed NPZ (`<stratum>/<series>`; a
    10M-unit gauntlet holds 400k clusters, too many for JSON); result.json keeps the record at each
    batch's end and the file's name."""
    arrays: Dict[str, np.ndarray] = {}
    for s in result["strata"]:
        trajectory = s["trajectory"]
        ends = [clusters - 1 for clusters in trajectory["looks"]]
        arrays.update({f"{s['stratum']}/{series}": np.asarray(values) for series, values in trajectory.items()})
        s["trajectory"] = {
            "per_cluster_file": path.name,
            "clusters": len(trajectory.get("clusters", [])),
            "at_batch_ends": {
                series: [values[i] for i in ends] for series, values in trajectory.items() if series != "looks"
            }
            | {"looks": list(trajectory["looks"])},
        }
    return atomic_write_npz(path, arrays)


def run_preflight(inputs: GauntletInputs) -> Dict[str, Any] | None:
    """The planner before any unit is spent: warnings printed (or, with preflight=error, refused)."""
    settings = inputs.settings
    if settings.preflight == "off":
        return None
    plan = inputs.plan()
    if plan["warnings"] and settings.preflight == "error":
        raise UserInputError(f"pre-flight: {plan['warnings'][0]} (or set gauntlet.preflight=warn)")
    for line in plan["warnings"]:
        console.print_warning(f"pre-flight: {line}")
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
        "gauntlet.test_mode": result["test_mode"],
        "gauntlet.alarm_alpha": f"{result['multiplicity']['alarm_alpha']:.6g}",
    }
    if "order_seed" in result["cluster_order"]:  # job=reproduce replays a freshly drawn one
        tags["gauntlet.order_seed"] = str(result["cluster_order"]["order_seed"])
        tags["gauntlet.order_seed_basis"] = result["cluster_order"]["basis"]
    if "rollouts" in result:  # what the rollouts cost, and what early stopping saved
        r = result["rollouts"]
        for key in ("episodes_run", "episodes_from_cache", "rollouts_saved_by_early_stop", "env_steps_per_s"):
            metrics[f"rollouts.{key}"] = r[key]
        metrics["rollouts.registry_entries_added"] = r["registry_entries_added"]
    if result.get("preflight") is not None:
        metrics["preflight.ok"] = float(result["preflight"]["ok"])
        metrics["preflight.expected_units"] = result["preflight"]["expected_units"]
    for s in result["strata"]:
        key = f"stratum.{s['stratum']}"
        cs = s["confidence_sequence"]
        metrics.update(
            {
                f"{key}.units_evaluated": s["units_evaluated"],
                f"{key}.delta_estimate": s["delta_estimate"],
                f"{key}.cs_lower": cs["lower"],
                f"{key}.cs_upper": cs["upper"],
                f"{key}.decision_pass": float(s["decision"] == DECISION_PASS),
                f"{key}.decision_regression": float(s["decision"] == DECISION_REGRESSION),
                f"{key}.baseline_success_rate": s["success_rates"]["baseline"]["rate"],
                f"{key}.candidate_success_rate": s["success_rates"]["candidate"]["rate"],
            }
        )
        if s.get("catastrophic_bound") is not None:
            metrics[f"{key}.catastrophic_upper_bound"] = s["catastrophic_bound"]["upper"]
        tags[f"{key}.decision"] = s["decision"]
        if s["drift"]["z"] is not None:
            metrics[f"{key}.drift_z"] = s["drift"]["z"]
        # Metric history at each batch's end (step = batch); result.json keeps every cluster.
        trajectory = s["trajectory"]
        ends = [clusters - 1 for clusters in trajectory["looks"]]
        for series in ("e_value_regression", "e_value_pass", "delta_estimate", "cs_lower", "cs_upper"):
            if series in trajectory:  # the approximate modes have no e-values
                history[f"{key}.{series}"] = [(batch, trajectory[series][i]) for batch, i in enumerate(ends, start=1)]
    for name in result.get("absent_strata", []):
        tags[f"stratum.{name}.decision"] = "ABSENT"
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
