"""job=gauntlet: may this candidate policy replace the baseline?

Validate the strata, effects and outcome source and reconcile the strata the source holds with the
configured ones; plan every stratum (pre-flight); for a source that runs policies, load or train
them (their digests become the versions); evaluate the strata in safety-first priority order,
clusters in a seeded random order, each stopped by its sequential test; react to halts,
regressions and critical passes (an outcome file's strata are tested order-free, continuing the
evidence an earlier run recorded in the ledger); recommend LAUNCH / DO_NOT_LAUNCH / NEEDS_REVIEW with lineage;
for rollouts, write the paired outcomes and record the candidate's failures in the registry; save
the result, plot the e-processes, log everything to MLflow, print the strata table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from vlaeval import console
from vlaeval.artifacts import atomic_write_npz
from vlaeval.config import ClusterOrder, OutcomeJobSettings, ReproduceConfig, UserInputError, to_plain
from vlaeval.gauntlet.cache import ArrayCache
from vlaeval.gauntlet.inputs import GauntletInputs, gauntlet_inputs, run_context, strata_chosen
from vlaeval.gauntlet.ledger import Comparison, EvidenceLedger
from vlaeval.gauntlet.lineage import build_lineage
from vlaeval.gauntlet.plots import plot_trajectories
from vlaeval.gauntlet.question import CONCLUSION_EXIT_CODES
from vlaeval.gauntlet.recommendation import DO_NOT_LAUNCH, LAUNCH, NEEDS_REVIEW
from vlaeval.gauntlet.report import print_summary
from vlaeval.gauntlet.result import GauntletPlan, GauntletResult, Lineage, RolloutsRecord
from vlaeval.gauntlet.scheduler import BatchProgress, HorizonDesigns, asked_of, run_gauntlet
from vlaeval.gauntlet.sources import RecordsEpisodes
from vlaeval.provenance import code_version
from vlaeval.runs import RESULT_FILE, JobResult, RunReport, now_ms, output_dir, publish
from vlaeval.seqtest import MODE_EXACT
from vlaeval.seqtest.horizon import HORIZON_DESIGN_VERSION, HorizonDesign, certify, synthesise
from vlaeval.store import get_or_build
from vlaeval.tracking import config_sha256

JOB = "gauntlet"
VIDEO_FOLDER = "videos"  # regression videos, in the run folder and under the MLflow run's artifacts
# gauntlet.exit_code_from_recommendation: a launch's recommendation, or a comparison's conclusion.
RECOMMENDATION_EXIT_CODES = {LAUNCH: 0, NEEDS_REVIEW: 10, DO_NOT_LAUNCH: 11, **CONCLUSION_EXIT_CODES}
COMPONENTS = ("outcomes",)  # `_target_` groups checked against their signatures before run()
TRAJECTORY_FILE = "trajectories.npz"
PAIRED_OUTCOMES_FILE = "paired_outcomes.csv"  # rollout gauntlets: outcomes=file reads it
LEDGER_FOLDER = "gauntlet-ledger"  # under paths.cache_dir: each file stratum's tested evidence
# The tracking store's copy: a tracked run tags each stratum whose evidence it recorded; the newest
# LEDGER_RUNS such runs of a comparison's stratum are read back (each holds every look before it).
LEDGER_TAG, LEDGER_TAG_VALUE, LEDGER_RUNS = "vlaeval.ledger", "recorded", 200


@dataclass(frozen=True, kw_only=True)
class GauntletJobConfig(OutcomeJobSettings):
    """The sections job=gauntlet reads (vlaeval.config.JobSettings): all it is given, logs and digests."""

    reproduce: ReproduceConfig


def run(cfg: GauntletJobConfig) -> JobResult[GauntletResult]:
    started_ms = now_ms()
    inputs = gauntlet_inputs(
        cfg.gauntlet,
        cfg.strata,
        cfg.effects,
        cfg.outcomes,
        run_context(cfg),
        cfg.reproduce.replay_order_seed,
        strata_chosen=strata_chosen(),
    )
    settings = inputs.settings
    for line in inputs.resolved.notices:
        console.show(f"notice: {line}")
    preflight = run_preflight(inputs)
    prepare_policies(inputs)

    code = code_version()
    order_seed, order_statement = cluster_order(inputs)
    lineage = build_lineage(
        candidate_version=settings.candidate_version,
        baseline_version=settings.baseline_version,
        data_source=inputs.source.describe(),
        seeds={"gauntlet": settings.seed, "cluster_order": order_seed},
        cluster_order=order_statement,
        config_sha256=config_sha256(to_plain(cfg)),
        require_clean_code=settings.require_clean_code,
    )
    cache = ArrayCache(cfg.paths.cache_dir, enabled=settings.use_cache, namespace="gauntlet-units")
    ledger = shared_evidence(cfg, inputs) if settings.evidence_ledger else None
    out = output_dir(cfg)
    designs = stored_designs(str(cfg.paths.cache_dir))
    result, videos = evaluate_strata(inputs, cache, lineage, ledger, out, designs)
    extra: List[Tuple[Path, Optional[str]]] = []
    rollouts = None
    if inputs.source.records_episodes:
        rollouts = record_rollouts(inputs.source.episodes(), result, out, videos)
        extra.append((Path(rollouts.paired_outcomes), None))
    result = result.with_job_record(preflight=preflight, notices=inputs.resolved.notices, rollouts=rollouts)
    for path in result.cache.corrupt_entries:
        console.print_error(f"corrupt cache entry {path} was detected and recomputed")

    plots = [plot_trajectories(result, out / "gauntlet_trajectories.png")] if settings.plot else []
    view = result.tracking_view()
    trajectories, result = save_trajectories(result, out / TRAJECTORY_FILE)
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"{'gauntlet' if result.recommendation.launch else 'comparison'} "
            f"{settings.candidate_version} vs {settings.baseline_version}",
            metrics=view.metrics,
            checks=view.checks,
            tags={**view.tags, **(ledger_tags(result) if ledger is not None else {})},
            history=view.history,
            plots=plots,
            code=code,
            artifacts=[(trajectories, None), *extra, *((v, VIDEO_FOLDER) for v in videos)],
        ),
    )
    if ledger is not None:  # after the result is saved: what this run tested, for the runs that continue it
        ledger.record_result(result.strata, Comparison(result.baseline_version, result.candidate_version), str(out))
    print_summary(result, published)
    if result.rollouts is not None:
        print_rollouts(result.rollouts)
    exit_code = RECOMMENDATION_EXIT_CODES[result.recommendation.recommendation]
    return JobResult(result, published, exit_code if settings.exit_code_from_recommendation else 0)


def shared_evidence(cfg: GauntletJobConfig, inputs: GauntletInputs) -> EvidenceLedger:
    """The evidence ledger under paths.cache_dir, with what the tracking store holds of this comparison's
    strata copied into it first: a CI workspace starts with a fresh cache, and the store is what its
    runs share (vlaeval/gauntlet/ledger.py, "Where evidence lives"). Each run that recorded a stratum's
    evidence carries the tag vlaeval.ledger.<key>; its result.json holds the evidence. A store that
    cannot be read is said, and the local ledger alone is consulted; with none read (that, or tracking
    off) a first test's PASS is reviewed (ledger.UNTRACKED)."""
    folder = Path(cfg.paths.cache_dir) / LEDGER_FOLDER
    if not inputs.source.traits.holds_outcomes:
        return EvidenceLedger(folder)
    if not cfg.tracking.enabled:
        return EvidenceLedger(folder, untracked=True)
    from vlaeval.tracking import TrackingError
    from vlaeval.tracking.store import run_store

    store = run_store(cfg.tracking)
    ledger = EvidenceLedger(folder, shared=store.uri)
    comparison = Comparison(inputs.settings.baseline_version, inputs.settings.candidate_version)
    try:
        for name in inputs.strata:
            tag = {f"tags.{LEDGER_TAG}.{EvidenceLedger.key(name, comparison)}": LEDGER_TAG_VALUE}
            for run in store.runs(JOB, LEDGER_RUNS, tag):
                data = store.read_json(run, RESULT_FILE)
                if data is None:
                    continue
                earlier = GauntletResult.from_json(data)
                found = Comparison(earlier.baseline_version, earlier.candidate_version)
                # The run's folder, as the workspace that ran it recorded it (the same entry, not a copy).
                label = run.tags.get("hydra.output_dir") or f"tracked run {run.run_id}"
                ledger.record_result(earlier.strata, found, label)
    except (TrackingError, OSError, ValueError, KeyError) as error:
        console.print_warning(
            f"the tracking store {store.uri} could not be read for earlier evidence ({error}); only the local "
            f"evidence ledger {folder} is consulted"
        )
        return EvidenceLedger(folder, untracked=True)
    return ledger


def ledger_tags(result: GauntletResult) -> Dict[str, str]:
    """vlaeval.ledger.<key> for each stratum whose tested evidence this run recorded (shared_evidence)."""
    comparison = Comparison(result.baseline_version, result.candidate_version)
    return {
        f"{LEDGER_TAG}.{EvidenceLedger.key(s.stratum, comparison)}": LEDGER_TAG_VALUE
        for s in result.strata
        if s.details.get("evidence")
    }


def stored_designs(cache_dir: str) -> HorizonDesigns:
    """test_mode=horizon's certified boundaries, synthesised once per (horizon, level) and kept in the
    content-addressed store (a design of 200 clusters takes ~30 s; each is re-certified when read)."""
    from vlaeval.artifacts import atomic_write_npz, sha256_json

    def design(horizon: int, level: float) -> HorizonDesign:
        key = sha256_json(
            {"kind": "horizon-design", "version": HORIZON_DESIGN_VERSION, "horizon": horizon, "level": level}
        )

        def read(folder: Path) -> HorizonDesign:
            with np.load(folder / "design.npz") as arrays:
                found = HorizonDesign.from_arrays(dict(arrays))
            size, _ = certify(found.boundary)  # a stored boundary is trusted only once re-certified
            if found.horizon != horizon or found.alpha != level or size.bound > level:
                raise ValueError("the stored design is not the one asked for, or its size exceeds its level")
            return found

        def build(folder: Path) -> HorizonDesign:
            console.show(f"synthesising the horizon test's boundary for {horizon} clusters at level {level:.3g}")
            made = synthesise(horizon, level)
            atomic_write_npz(folder / "design.npz", made.to_arrays())
            return made

        value, _ = get_or_build(cache_dir, "horizon-designs", key, ["design.npz"], read, build)
        return value

    return design


def cluster_order(inputs: GauntletInputs) -> Tuple[Optional[int], str]:
    """The run's cluster-order seed (None: no order is drawn) and what the lineage says of the order."""
    settings = inputs.settings
    shuffled = settings.cluster_order == ClusterOrder.shuffled
    if shuffled and inputs.source.traits.holds_outcomes and settings.test_mode == MODE_EXACT:
        return None, (
            f"order-free: the average over {settings.orders} fixed orders of each order's e-value, seeded from "
            "each stratum's clusters (their canonical digest)"
        )
    if shuffled:
        return (
            inputs.order.seed,
            f"shuffled: a random permutation of each stratum's clusters, seed from {inputs.order.basis}",
        )
    return None, "as_given: the source's order, declared random by the user (gauntlet.cluster_order=as_given)"


def print_rollouts(r: RolloutsRecord) -> None:
    """What the rollouts cost and saved, where their pairs and new failures went."""
    console.show(
        f"rollouts: {r.cost.episodes_run:,} run, {r.cost.episodes_from_cache:,} from the cache; "
        f"{r.episode_pairs_evaluated:,} episode pairs of {r.episode_pairs_full_evaluation:,} a full "
        f"evaluation runs ({r.rollouts_saved_by_early_stop:,} rollouts saved by early stopping); "
        f"{r.registry_entries_added} new scenarios in the failure registry {r.registry}"
    )
    console.show(f"paired outcomes (outcomes=file reads them): {r.paired_outcomes}")


def prepare_policies(inputs: GauntletInputs) -> None:
    """A source that runs policies loads or trains them now; their digests become the versions."""
    if not inputs.source.prepares_policies:
        return
    settings = inputs.settings
    with console.unit_progress("loading the baseline and the candidate", 1) as update:
        versions = inputs.source.prepare(
            lambda what, done, total: update(completed=done, total=total, description=what)
        )
    if versions is not None:
        settings.baseline_version, settings.candidate_version = versions
    console.show(f"baseline {settings.baseline_version}, candidate {settings.candidate_version}")


def evaluate_strata(
    inputs: GauntletInputs,
    cache: ArrayCache,
    lineage: Lineage,
    ledger: Optional[EvidenceLedger],
    out: Path,
    designs: Optional[HorizonDesigns] = None,
) -> Tuple[GauntletResult, List[Path]]:
    """The strata in priority order, a progress bar each; then, while the source still holds its
    policies, the videos gauntlet.videos asks for (into out/videos). The source is closed however it ends."""

    asked = asked_of(inputs.settings)
    try:
        with console.strata_progress() as update:

            def on_batch(p: BatchProgress) -> None:
                e = p.e_values
                wealth = (
                    f", e(reg) {e.regression:.3g}, e(pass) {e.pass_:.3g}"
                    if e.regression is not None and e.pass_ is not None
                    else ""
                )
                update(
                    p.stratum,
                    p.units_in_stratum,
                    p.unit_limit,
                    f"{p.clusters} clusters{wealth} [{asked.answer(p.decision)}]",
                    p.final,
                )

            result = run_gauntlet(
                inputs.settings,
                inputs.strata,
                inputs.effects,
                inputs.source,
                cache,
                lineage,
                absent=inputs.resolved.absent,
                required_absent=inputs.required_absent,
                on_batch=on_batch,
                order_seed=inputs.order,
                ledger=ledger,
                designs=designs,
            )
        videos = inputs.source.film(out / VIDEO_FOLDER, inputs.settings.videos)
        if videos:
            console.show(f"{len(videos)} regression video(s), baseline | candidate: {out / VIDEO_FOLDER}")
    finally:
        inputs.source.close()  # e.g. a Ray instance the rollouts started
    return result, videos


def record_rollouts(source: RecordsEpisodes, result: GauntletResult, out: Path, videos: List[Path]) -> RolloutsRecord:
    """After a rollout gauntlet: every episode pair produced as a paired-outcome file (outcomes=file
    re-analyses it without new rollouts), the candidate's failures added to the failure registry,
    and what the rollouts cost."""
    from vlaeval.rollouts.scenarios import write_paired_outcomes

    path = write_paired_outcomes(source.paired_outcomes_table(), out / PAIRED_OUTCOMES_FILE)
    added = source.registry.record(source.failures())
    full, pairs = result.scale.total_units_defined, result.scale.units_evaluated
    return RolloutsRecord(
        cost=source.stats(),
        paired_outcomes=str(path),
        registry=str(source.registry.path),
        registry_entries_added=added,
        episode_pairs_evaluated=pairs,
        episode_pairs_full_evaluation=full,
        rollouts_saved_by_early_stop=2 * (full - pairs),
        videos=tuple(str(v) for v in videos),
    )


def save_trajectories(result: GauntletResult, path: Path) -> Tuple[Path, GauntletResult]:
    """Every stratum's per-cluster record as arrays in a compressed NPZ (`<stratum>/<series>`; a
    10M-unit gauntlet holds 400k clusters, too many for JSON); the result returned keeps the record
    at each batch's end and the file's name."""
    arrays: Dict[str, np.ndarray] = {}
    summarised = []
    for s in result.strata:
        trajectory = s.trajectory
        ends = s.look_ends()
        arrays.update({f"{s.stratum}/{series}": np.asarray(values) for series, values in trajectory.items()})
        summary: Dict[str, Any] = {
            "per_cluster_file": path.name,
            "clusters": len(trajectory.get("clusters", [])),
            "at_batch_ends": {
                series: [values[i] for i in ends] for series, values in trajectory.items() if series != "looks"
            }
            | {"looks": list(trajectory["looks"])},
        }
        summarised.append(dataclasses.replace(s, trajectory=summary))
    return atomic_write_npz(path, arrays), dataclasses.replace(result, strata=tuple(summarised))


def run_preflight(inputs: GauntletInputs) -> GauntletPlan | None:
    """The planner before any unit is spent: warnings printed (or, with preflight=error, refused)."""
    settings = inputs.settings
    if settings.preflight == "off":
        return None
    plan = inputs.plan()
    if plan.warnings and settings.preflight == "error":
        raise UserInputError(f"pre-flight: {plan.warnings[0]} (or set gauntlet.preflight=warn)")
    for line in plan.warnings:
        console.print_warning(f"pre-flight: {line}")
    return plan
