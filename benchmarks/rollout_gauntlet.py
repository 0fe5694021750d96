"""The default rollout gauntlet, measured: the built-in baseline against the worse and the equivalent
built-in candidates on the default scenario families (`python main.py job=gauntlet outcomes=rollout`), then a
rerun served from the per-episode cache. Every run goes through the CLI in its own process, on one
cache folder, so the figures are what a user sees.

    python benchmarks/rollout_gauntlet.py [--cache-dir /tmp/vlaeval-rollout-bench] [--extra key=value ...]

1. worse candidate: the failure registry starts empty, the gauntlet fills it;
2. equivalent candidate: replays that registry (historical_regressions), reuses every baseline
   episode already run;
3. the equivalent run again on the same registry snapshot: served from the cache.
Per run: decisions per stratum, episode pairs evaluated against a full evaluation's, rollouts run and
from the cache, wall time. Results in benchmarks/results/rollout_gauntlet.json.

    python benchmarks/rollout_gauntlet.py --vision [--runs NAME ...]

The gauntlet of a policy that sees and reads (`model=tiny_vla_vision strata=vision outcomes=rollout_vision`,
its built-in policies trained on rendered demonstrations on first use): the worse candidate on the default
families, which a safety halt may end before the visual and language strata; then the worse candidate on
those five strata alone (each on held-out scenes 25-34), that run again from the cache (filming the
episodes that decide), and the equivalent candidate on them (the A/A run); the first run stops at a
budget of 300 episode pairs (rendered rollouts cost ~1 s a pair on 2 cores). Results in
benchmarks/results/rollout_gauntlet_vision.json, docs/figures/rollout_gauntlet_vision.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

from benchlib import REPO, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json

# The strata that change what a policy sees or is told (strata=vision); the vision benchmark's second run
# keeps only these, on a few held-out scenes per variant family, so that a safety halt cannot hide them.
FIRST_BUDGET = 300
VIDEOS = 2  # side-by-side videos of the deciding episodes, filmed by the rerun
SEEN_AND_READ_SCENES = 10
SEEN_AND_READ = ["camera_pose", "occlusion", "visual_shift", "paraphrase", "unseen_phrasing"]
VISION = ["model=tiny_vla_vision", "strata=vision", "outcomes=rollout_vision"]
NOT_SEEN_OR_READ = [
    "safety_critical",
    "historical_regressions",
    "new_odd",
    "distribution_shift",
    "rare_events",
    "nominal",
]


def gauntlet(cache: Path, name: str, overrides: List[str], outcomes: str = "outcomes=rollout") -> Dict[str, Any]:
    out = cache.parent / "runs" / name
    shutil.rmtree(out, ignore_errors=True)  # a run folder of an earlier benchmark is replaced
    env = {**os.environ, "VLAEVAL_CACHE_DIR": str(cache), "MPLBACKEND": "Agg"}
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "main.py"),
            "job=gauntlet",
            outcomes,
            "tracking=disabled",
            # One cluster order for every run, so the rerun asks for the very same episodes (a rollout
            # gauntlet otherwise draws a fresh order seed per run).
            "gauntlet.order_seed=11",
            *overrides,
            f"hydra.run.dir={out}",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    r = result["rollouts"]
    row = {
        "run": name,
        "baseline": result["baseline_version"],
        "candidate": result["candidate_version"],
        "recommendation": result["recommendation"]["recommendation"],
        "halted": result["halted"],
        "strata": {
            s["stratum"]: {
                "decision": s["decision"],
                "episode_pairs": s["units_evaluated"],
                "of": s["units_available"],
                "baseline_success": s["success_rates"]["baseline"]["rate"],
                "candidate_success": s["success_rates"]["candidate"]["rate"],
            }
            for s in result["strata"]
        },
        "not_evaluated": result["not_evaluated"],
        "absent": result.get("absent_strata", []),
        "episode_pairs_evaluated": r["episode_pairs_evaluated"],
        "episode_pairs_full_evaluation": r["episode_pairs_full_evaluation"],
        "rollouts_run": r["episodes_run"],
        "rollouts_from_cache": r["episodes_from_cache"],
        "rollouts_saved_by_early_stop": r["rollouts_saved_by_early_stop"],
        "registry_entries_added": r["registry_entries_added"],
        "registry_replayed": result["lineage"]["data_source"]["registry_entries_replayed"],
        "env_steps_per_s": r["env_steps_per_s"],
        "videos": [Path(v).name for v in r.get("videos", [])],
        "wall_s": wall,
    }
    print(json.dumps(row, indent=1), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/vlaeval-rollout-bench/cache"))
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for every run")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default benchmarks/results/<page>.json)")
    parser.add_argument("--vision", action="store_true", help="the vision-language policy's gauntlet instead")
    parser.add_argument(
        "--runs", nargs="*", default=None, choices=VISION_RUNS, help="--vision: re-measure these runs, keep the others"
    )
    parser.add_argument(
        "--page-only",
        action="store_true",
        help="rewrite docs/figures/rollout_gauntlet.md from --out, measuring nothing",
    )
    args = parser.parse_args()
    page = "rollout_gauntlet_vision" if args.vision else "rollout_gauntlet"
    out = args.out or REPO / "benchmarks" / "results" / f"{page}.json"
    if args.page_only:
        saved = json.loads(out.read_text())
        write_page(page, saved["runs"], saved.get("extra_overrides", []))
        return
    if args.vision:
        saved = json.loads(out.read_text()) if args.runs and out.exists() else {}
        runs = vision_runs(args.cache_dir, args.extra, args.runs or VISION_RUNS, saved, out)
        write_page(page, runs, args.extra)
        print(f"wrote {out}")
        return
    cache = args.cache_dir
    registry = cache / "vlaeval_failure_registry.jsonl"
    worse = gauntlet(cache, "worse", [*args.extra])
    # The equivalent candidate and its rerun replay the same registry snapshot (the one the worse
    # candidate left), each on its own copy: both runs ask for the very same episodes.
    snapshots = [cache.parent / f"registry-{k}.jsonl" for k in (1, 2)]
    for snapshot in snapshots:
        shutil.copyfile(registry, snapshot)
    equivalent = gauntlet(
        cache, "equivalent", ["outcomes.candidate=builtin:equivalent", f"outcomes.registry={snapshots[0]}", *args.extra]
    )
    rerun = gauntlet(
        cache,
        "equivalent-rerun",
        ["outcomes.candidate=builtin:equivalent", f"outcomes.registry={snapshots[1]}", *args.extra],
    )
    atomic_write_json(out, {"runs": [worse, equivalent, rerun], "extra_overrides": args.extra})
    write_page(page, [worse, equivalent, rerun])
    print(f"wrote {out}")


VISION_RUNS = (
    "worse",
    "worse-seen-and-read",
    "worse-seen-and-read-rerun",
    "equivalent-seen-and-read",
    "equivalent-clean",
)
CLEAN_SCENES = 5  # held-out scenes per variant family and task of the clean run


def vision_runs(cache: Path, extra: List[str], names: Sequence[str], saved: Dict[str, Any], out: Path) -> List[Any]:
    """The worse candidate on the vision gauntlet's default families; then on the five families that
    change what the policies see or are told alone, and that run again (served from the cache, filming
    the episodes that decide); then the equivalent candidate on those families (the A/A run: the same
    recipe, another training seed). `names` re-measures some runs, keeping the others' last rows;
    each row is saved as soon as its run ends."""
    outcomes, model_and_strata = VISION[2], VISION[:2]
    # Rendered rollouts cost ~1-2 s an episode pair on 2 cores: the first run stops at a budget of
    # FIRST_BUDGET pairs (gauntlet.budget_units; the strata left are reported not evaluated), the
    # others have SEEN_AND_READ_SCENES held-out scenes per variant family and task.
    only = [f"~outcomes.scenarios.{name}" for name in NOT_SEEN_OR_READ]
    only += [f"outcomes.scenarios.{name}.variants=[25,{25 + SEEN_AND_READ_SCENES}]" for name in SEEN_AND_READ]
    overrides = {
        "worse": [f"gauntlet.budget_units={FIRST_BUDGET}"],
        "worse-seen-and-read": only,
        "worse-seen-and-read-rerun": [*only, f"gauntlet.videos={VIDEOS}"],
        # The A/A run: the same recipe, another training seed (the very same checkpoint would be
        # refused by the lineage check, and would only replay the baseline's own episodes).
        "equivalent-seen-and-read": [*only, "outcomes.candidate=builtin:equivalent"],
        # Both policies' clean success: held-out scenes of their training families, nothing changed
        # (distribution_shift alone), the A/A pair again.
        "equivalent-clean": [
            *(
                f"~outcomes.scenarios.{name}"
                for name in [*NOT_SEEN_OR_READ, *SEEN_AND_READ]
                if name != "distribution_shift"
            ),
            f"outcomes.scenarios.distribution_shift.variants=[25,{25 + CLEAN_SCENES}]",
            "outcomes.candidate=builtin:equivalent",
        ],
    }
    rows = {r["run"]: r for r in saved.get("runs", [])}
    for name in names:
        rows[name] = gauntlet(cache, name, [*model_and_strata, *overrides[name], *extra], outcomes)
        atomic_write_json(out, {"runs": [rows[n] for n in VISION_RUNS if n in rows], "extra_overrides": extra})
    return [rows[n] for n in VISION_RUNS if n in rows]


def write_page(page: str, runs: List[Dict[str, Any]], extra: Sequence[str] = ()) -> None:
    if page == "rollout_gauntlet":
        title, command, lead = "The default rollout gauntlet", "python benchmarks/rollout_gauntlet.py", DEFAULT_LEAD
    else:
        title, command, lead = (
            "The rollout gauntlet of a policy that sees and reads",
            "python benchmarks/rollout_gauntlet.py --vision",
            VISION_LEAD,
        )
    if extra:
        lead += " Overrides for every run: " + " ".join(f"`{x}`" for x in extra) + "."
    write_figures(page, title, command, lead + "\n\n" + figures_body(runs), one_seed=True)


DEFAULT_LEAD = (
    "The built-in baseline against the `worse` and the `equivalent` built-in candidates on the default "
    "scenario families, then the equivalent run again, served from the per-episode cache; one fixed "
    "order seed for every run."
)
VISION_LEAD = (
    "`job=gauntlet model=tiny_vla_vision strata=vision outcomes=rollout_vision`: the built-in vision-language "
    "baseline (the deployable recipe: 900 demonstrations rendered from the corner camera at 64x64 with the goal "
    "drawn as a 4 cm marker, 24k steps of 64 anchors with 4 flow draws each, its image features also taught "
    "where the object and goal are (`model.locate`), "
    "unless the overrides below say otherwise) against the `worse` built-in candidate (45 demonstrations, 1,500 "
    "steps). First on every default family, up to a budget of 300 episode pairs, "
    "in priority order; then on the five families that change what the policies see or are told alone "
    "(held-out scenes 25-34 of variant families 0 and 2), so that a halt on an earlier stratum cannot hide "
    "them; then that run again, served from the per-episode cache and filming the episodes that decide "
    "(side-by-side MP4s in the run folder's videos/); then the `equivalent` candidate on those families (the "
    "A/A run: the same recipe, another training seed; it must not be blocked); last, both on clean held-out "
    f"scenes (distribution_shift alone, scenes 25-{24 + CLEAN_SCENES}: the baseline's clean success). One fixed "
    "order seed for every run. The baseline success column is the baseline's success on each family."
)


def figures_body(runs: List[Dict[str, Any]]) -> str:
    """Per run: the recommendation, rollouts run and from the cache, wall time; per stratum the decision
    and the episode pairs it took."""
    summary = markdown_table(
        [
            "run",
            "recommendation",
            "halted",
            "episode pairs (of a full evaluation)",
            "rollouts run",
            "from cache",
            "wall",
        ],
        [
            (
                r["run"],
                r["recommendation"],
                "yes" if r["halted"] else "no",
                f"{r['episode_pairs_evaluated']:,} ({r['episode_pairs_full_evaluation']:,})",
                f"{r['rollouts_run']:,}",
                f"{r['rollouts_from_cache']:,}",
                f"{r['wall_s']:.0f} s",
            )
            for r in runs
        ],
    )
    strata = markdown_table(
        ["run", "stratum", "decision", "episode pairs", "baseline success", "candidate success"],
        [
            (
                r["run"],
                name,
                s["decision"],
                f"{s['episode_pairs']:,} of {s['of']:,}",
                f"{s['baseline_success']:.3f}",
                f"{s['candidate_success']:.3f}",
            )
            for r in runs
            for name, s in r["strata"].items()
        ],
    )
    videos = [f"`{r['run']}/videos/{v}`" for r in runs for v in r.get("videos", [])]
    filmed = ("\n\nVideos (baseline | candidate, same scene and seed): " + ", ".join(videos) + ".") if videos else ""
    return summary + "\n\n" + strata + filmed


if __name__ == "__main__":
    main()
