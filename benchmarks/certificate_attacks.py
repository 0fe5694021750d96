"""A certificate that cannot be bought (issue 33): the review's attacks on outcome files, through real
CSV/Parquet files, FileOutcomes and run_gauntlet, with Clopper-Pearson intervals (alpha = 0.05, delta = 0.02).

1. The shopper: every file re-saved ten meaning-preserving ways (a trailing newline, rows shuffled, ids
   renamed, Parquet, an unrelated column, columns reordered, true/false, CRLF, ...); the shopper keeps the
   first PASS. Also ten values of gauntlet.order_seed on the same file.
2. Re-run until PASS on a growing file: 100 scenes, then 50 more at a time up to 600, re-run after each.
3. The duplicate notice: how often it fires on clean files with 2% broken scenes (with only the required
   columns, with per-scene episode seeds 0..7, with unique episode timestamps) and on files with planted
   copies (with a timestamp column, with only the required columns).
4. False "catastrophic": the halting stratum at Delta = -0.03 and -0.04 (catastrophic margin -0.05) on
   heterogeneous scenes (+-10 points), 600 scenes of 20, batches of 4, 16, 48 clusters and the default.
5. Success-rate interval coverage (nominal 95%) near the ceiling, on few scenes, unequal sizes and the
   synthetic design.
6. The ledger lost (issue 50): after a non-PASS on a null file, drop the 20 worst scenes and run again
   with the ledger off, in a fresh workspace (untracked, or tracked to the first run's store), or under
   a renamed stratum: how often it PASSes and how often it LAUNCHes.
7. Re-appended copies (issue 50): a null file that did not PASS, then the whole file again under new
   ids, or 50 of its scenes more per re-run: how often any version LAUNCHes.

Every scene's candidate effect is Delta + 0.10 or Delta - 0.10 (equally likely): the scene distribution's
mean is Delta, while any one file is off by chance, which is what re-testing shops for.

    python benchmarks/certificate_attacks.py            # the committed record (docs/figures/certificate_attacks.md)
    python benchmarks/certificate_attacks.py --quick    # fewer files
    python benchmarks/certificate_attacks.py --label before --no-figures   # on an older checkout, for comparison
"""

from __future__ import annotations

import argparse
import inspect
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import pandas as pd

from benchlib import REPO, markdown_table, rate, show, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.choices import DataLabel, Preflight, StratumKind
from vlaeval.config import GauntletConfig, StratumConfig
from vlaeval.errors import UserInputError
from vlaeval.gauntlet import ArrayCache, StratumOutcomes, run_gauntlet
from vlaeval.gauntlet.outcomes import FileOutcomes
from vlaeval.gauntlet.result import Lineage
from vlaeval.seqtest.units import success_rate_interval

ALPHA, DELTA = 0.05, 0.02
LINEAGE = Lineage(valid=True)
SCENE_EFFECT = 0.10


def has_ledger() -> bool:
    return "ledger" in inspect.signature(run_gauntlet).parameters


# ----------------------------------------------------------------------------- files
def scene_units(
    rng: np.random.Generator, scenes: int, size: int | np.ndarray, delta: float, broken: float = 0.0, stray: float = 0.0
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Paired unit outcomes of `scenes` heterogeneous scenes: (baseline, candidate, cluster index, true
    baseline rate per unit). Scene base rates ~ U(0.35, 0.85), the candidate's effect Delta +- 0.10; a
    shared uniform pairs the two policies (10% of candidate units draw afresh). `broken`: the share of
    scenes where both fail every time; `stray`: independent failures of both on top."""
    sizes = np.broadcast_to(np.asarray(size, dtype=np.int64), (scenes,))
    cluster = np.repeat(np.arange(scenes), sizes)
    p_base = rng.uniform(0.35, 0.85, scenes)
    effect = delta + SCENE_EFFECT * rng.choice([-1.0, 1.0], scenes)
    u = rng.random(cluster.size)
    fresh = np.where(rng.random(cluster.size) < 0.1, rng.random(cluster.size), u)
    baseline = u < p_base[cluster]
    candidate = fresh < (p_base + effect)[cluster]
    if broken:
        dead = (rng.random(scenes) < broken)[cluster]
        baseline &= ~dead
        candidate &= ~dead
    if stray:
        lost = rng.random(cluster.size) < stray
        baseline &= ~lost
        candidate &= ~lost
    return baseline, candidate, cluster, p_base[cluster]


def table_of(
    baseline: np.ndarray, candidate: np.ndarray, cluster: np.ndarray, stratum: str = "nominal"
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "stratum": stratum,
            "scenario_id": [f"{stratum}-{i}" for i in range(cluster.size)],
            "cluster_id": [f"scene-{c}" for c in cluster],
            "baseline": baseline.astype(int),
            "candidate": candidate.astype(int),
        }
    )


def resaves(table: pd.DataFrame, rng: np.random.Generator, folder: Path) -> List[Path]:
    """Ten meaning-preserving saves of one table."""
    out: List[Path] = []

    def csv(name: str, frame: pd.DataFrame, newline: str = "\n", trailing: str = "") -> None:
        path = folder / f"{name}.csv"
        path.write_bytes((frame.to_csv(index=False, lineterminator=newline) + trailing).encode())
        out.append(path)

    shuffled = table.sample(frac=1.0, random_state=int(rng.integers(1 << 31))).reset_index(drop=True)
    renamed = table.assign(
        scenario_id="run7-" + table["scenario_id"], cluster_id="task-variant-" + table["cluster_id"].str[6:]
    )
    csv("as_exported", table)
    csv("trailing_newline", table, trailing="\n")
    csv("rows_shuffled", shuffled)
    csv("ids_renamed", renamed)
    parquet = folder / "as_parquet.parquet"
    table.to_parquet(parquet, index=False)
    out.append(parquet)
    csv("extra_column", table.assign(exported_by="nightly"))
    csv("columns_reordered", table[list(table.columns)[::-1]])
    csv("true_false", table.assign(baseline=table["baseline"].astype(bool), candidate=table["candidate"].astype(bool)))
    csv("crlf", table, newline="\r\n")
    both = folder / "shuffled_renamed.parquet"
    renamed.sample(frac=1.0, random_state=int(rng.integers(1 << 31))).to_parquet(both, index=False)
    out.append(both)
    return out


def nominal_settings() -> Tuple[GauntletConfig, Dict[str, StratumConfig]]:
    settings = GauntletConfig(
        budget_units=10**9, nominal_stratum="", critical_stratum="", preflight=Preflight.off, plot=False
    )
    return settings, {"nominal": StratumConfig(priority=1, units=1, cluster_size=8, data_label=DataLabel.REPLAYED)}


def file_result(path: Path, settings: GauntletConfig, strata: Dict[str, StratumConfig], ledger: Any = None) -> Any:
    """The gauntlet's result on a file, recorded in `ledger` afterwards as job=gauntlet does (None: no
    ledger); raises UserInputError where the file is refused."""
    source = FileOutcomes(str(path))
    source.validate(strata, {})
    kwargs = {"ledger": ledger} if ledger is not None else {}
    result = run_gauntlet(settings, strata, {}, source, ArrayCache("/none", enabled=False), LINEAGE, **kwargs)
    if ledger is not None:  # what job=gauntlet does after saving its result: the next run continues it
        try:
            from vlaeval.gauntlet.ledger import Comparison  # type: ignore[attr-defined,unused-ignore]

            ledger.record_result(
                result.strata, Comparison(result.baseline_version, result.candidate_version), str(path)
            )
        except ImportError:  # an older commit (--before): entries keyed by stratum alone
            ledger.record_result(result.strata, str(path))
    return result


def file_decision(
    path: Path, settings: GauntletConfig, strata: Dict[str, StratumConfig], ledger: Any = None
) -> Optional[str]:
    """The nominal stratum's decision on a file (None: refused)."""
    try:
        return str(file_result(path, settings, strata, ledger).strata[0].decision)
    except UserInputError:
        return None


def make_ledger(folder: Path) -> Any:
    from vlaeval.gauntlet.ledger import EvidenceLedger  # type: ignore[import-not-found,unused-ignore]

    return EvidenceLedger(folder)


def null_file(
    tmp: str, seed: int, section: int, f: int, scenes: int
) -> Tuple[np.random.Generator, np.ndarray, np.ndarray, np.ndarray, Path]:
    """File f of a section: its generator, a null file's units at Delta = -delta (baseline, candidate,
    cluster) and an empty folder of its own under `tmp`."""
    rng = np.random.default_rng([seed, section, f])
    b, c, cluster, _ = scene_units(rng, scenes, 8, -DELTA)
    folder = Path(tmp) / f"file{f}"
    folder.mkdir()
    return rng, b, c, cluster, folder


def shopper(files: int, seed: int, scenes: int = 240) -> Dict[str, Any]:
    settings, strata = nominal_settings()
    first = any_of_ten = seed_shopper = refused = 0
    distinct_decisions = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in range(files):
            rng, b, c, cluster, folder = null_file(tmp, seed, 1, f, scenes)
            decisions = [file_decision(p, settings, strata) for p in resaves(table_of(b, c, cluster), rng, folder)]
            first += decisions[0] == "PASS"
            any_of_ten += any(d == "PASS" for d in decisions)
            distinct_decisions += len(set(decisions)) > 1
            by_seed = [
                file_decision(folder / "as_exported.csv", replace(settings, order_seed=k), strata) for k in range(10)
            ]
            refused += all(d is None for d in by_seed)
            seed_shopper += any(d == "PASS" for d in by_seed)
    return {
        "files": files,
        "scenes": scenes,
        "one_run": rate(first, files),
        "keep_first_pass_of_10_resaves": rate(any_of_ten, files),
        "files_whose_resaves_disagree": rate(distinct_decisions, files),
        "keep_first_pass_of_10_order_seeds": rate(seed_shopper, files),
        "order_seed_refused": rate(refused, files),
    }


def growing(reps: int, seed: int) -> Dict[str, Any]:
    settings, strata = nominal_settings()
    sizes = list(range(100, 601, 50))
    until_pass = full_file = 0
    looks_to_pass: List[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(reps):
            rng = np.random.default_rng([seed, 2, r])
            b, c, cluster, _ = scene_units(rng, sizes[-1], 8, -DELTA)
            table = table_of(b, c, cluster)
            ledger = make_ledger(Path(tmp) / f"ledger{r}") if has_ledger() else None
            passed = False
            for k, n in enumerate(sizes):
                path = Path(tmp) / f"v{r}_{n}.csv"
                table[cluster < n].to_csv(path, index=False)
                if file_decision(path, settings, strata, ledger) == "PASS":
                    passed = True
                    looks_to_pass.append(k + 1)
                    break
            until_pass += passed
            path = Path(tmp) / f"v{r}_full.csv"
            table.to_csv(path, index=False)
            full_file += file_decision(path, settings, strata) == "PASS"
            for leftover in Path(tmp).glob(f"v{r}_*.csv"):
                leftover.unlink()
    return {
        "reps": reps,
        "versions": sizes,
        "ledger": has_ledger(),
        "rerun_until_pass": rate(until_pass, reps),
        "one_run_on_full_file": rate(full_file, reps),
        "median_versions_to_false_pass": float(np.median(looks_to_pass)) if looks_to_pass else None,
    }


def file_recommendation(
    path: Path, settings: GauntletConfig, strata: Dict[str, StratumConfig], ledger: Any
) -> Tuple[str, str]:
    """(decision, recommendation) of a file's one stratum, recorded in `ledger` (None: the ledger is off)."""
    result = file_result(path, settings, strata, ledger)
    return result.strata[0].decision, result.recommendation.recommendation


# Where the drop-20 attack's second run looks for the first run's evidence (issue 50, finding 1).
LEDGER_LOST = (
    "ledger off (gauntlet.evidence_ledger=false)",
    "fresh workspace, untracked",
    "fresh workspace, no store known (a library caller's ledger: the behaviour before)",
    "fresh workspace tracked to the store the first run was tracked to",
    "same cache, the stratum renamed",
)


def ledger_lost(files: int, seed: int, scenes: int = 300, dropped: int = 20) -> Dict[str, Any]:
    """Null files (Delta = -delta); after a first run that did not PASS, drop the `dropped` scenes where
    the candidate did worst and run again where the first run's evidence may be lost: how often the second
    run PASSes, how often it LAUNCHes."""
    from vlaeval.gauntlet.ledger import EvidenceLedger

    settings, strata = nominal_settings()
    renamed_strata = {"nominal_v2": strata["nominal"]}
    counts = {case: {"pass": 0, "launch": 0, "reviewed": 0} for case in LEDGER_LOST}
    eligible = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in range(files):
            _, b, c, cluster, folder = null_file(tmp, seed, 6, f, scenes)
            table = table_of(b, c, cluster).assign(data_label="REPLAYED")  # real outcomes: a launch is possible
            table.to_csv(folder / "full.csv", index=False)
            first = EvidenceLedger(folder / "workspace-1")
            if file_recommendation(folder / "full.csv", settings, strata, first)[0] == "PASS":
                continue
            eligible += 1
            gap = (table["candidate"] - table["baseline"]).groupby(table["cluster_id"]).mean()
            kept = table[~table["cluster_id"].isin(gap.nsmallest(dropped).index)]
            kept.to_csv(folder / "dropped.csv", index=False)
            kept.assign(stratum="nominal_v2").to_csv(folder / "renamed.csv", index=False)
            store = EvidenceLedger(folder / "workspace-3", shared="the shared store")
            for entry in (folder / "workspace-1").glob("*/*.json"):  # what shared_evidence copies in
                target = folder / "workspace-3" / entry.parent.name / entry.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(entry.read_bytes())
            dropped_file = (folder / "dropped.csv", strata)
            runs = {
                LEDGER_LOST[0]: (*dropped_file, replace(settings, evidence_ledger=False), None),
                LEDGER_LOST[1]: (*dropped_file, settings, EvidenceLedger(folder / "ws-2", untracked=True)),
                LEDGER_LOST[2]: (*dropped_file, settings, EvidenceLedger(folder / "ws-4")),
                LEDGER_LOST[3]: (*dropped_file, settings, store),
                LEDGER_LOST[4]: (folder / "renamed.csv", renamed_strata, settings, first),
            }
            for case, (path, run_strata, run_settings, ledger) in runs.items():
                decision, recommendation = file_recommendation(path, run_settings, run_strata, ledger)
                counts[case]["pass"] += decision == "PASS"
                counts[case]["launch"] += recommendation == "LAUNCH"
                counts[case]["reviewed"] += decision == "PASS" and recommendation != "LAUNCH"
    return {
        "files": files,
        "scenes": scenes,
        "dropped": dropped,
        "first_run_not_pass": eligible,
        "cases": [{"case": case, **{k: rate(v, eligible) for k, v in counts[case].items()}} for case in LEDGER_LOST],
    }


def copies(files: int, seed: int, scenes: int = 300, reruns: int = 4) -> Dict[str, Any]:
    """Null files that did not PASS, then re-appended under new ids -- the whole file once, or 50 of its
    scenes per re-run (up to `reruns`) -- each version re-run through the ledger: how often any LAUNCHes."""
    from vlaeval.gauntlet.ledger import EvidenceLedger

    settings, strata = nominal_settings()
    launched = {"the whole file again": 0, "50 of its scenes again, per re-run": 0}
    eligible = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in range(files):
            _, b, c, cluster, folder = null_file(tmp, seed, 7, f, scenes)
            table = table_of(b, c, cluster).assign(data_label="REPLAYED")
            table.to_csv(folder / "v0.csv", index=False)
            ledgers = {what: EvidenceLedger(folder / f"ledger{i}") for i, what in enumerate(launched)}
            first = [file_recommendation(folder / "v0.csv", settings, strata, ledger)[0] for ledger in ledgers.values()]
            if "PASS" in first:
                continue
            eligible += 1
            for what, ledger in ledgers.items():
                grown, scene_ids = table, table["cluster_id"].unique()
                for k in range(1 if what.startswith("the whole") else reruns):
                    again = (
                        table
                        if what.startswith("the whole")
                        else table[table["cluster_id"].isin(scene_ids[50 * k : 50 * (k + 1)])]
                    )
                    grown = pd.concat(
                        [
                            grown,
                            again.assign(
                                cluster_id=f"again{k}-" + again["cluster_id"],
                                scenario_id=f"again{k}-" + again["scenario_id"],
                            ),
                        ]
                    )
                    path = folder / f"{what[:5]}{k}.csv"
                    grown.to_csv(path, index=False)
                    if file_recommendation(path, settings, strata, ledger)[1] == "LAUNCH":
                        launched[what] += 1
                        break
    return {"files": files, "scenes": scenes, "first_run_not_pass": eligible,
            "cases": [{"case": what, "launch": rate(n, eligible)} for what, n in launched.items()]}  # fmt: skip


def duplicates(files: int, seed: int, scenes: int = 48) -> List[Dict[str, Any]]:
    strata = {"nominal": StratumConfig(priority=1, units=1, cluster_size=8)}

    def notice_rate(make: Callable[[np.random.Generator], pd.DataFrame]) -> Dict[str, float]:
        fired = 0
        with tempfile.TemporaryDirectory() as tmp:
            for f in range(files):
                path = Path(tmp) / f"f{f}.csv"
                make(np.random.default_rng([seed, 3, f])).to_csv(path, index=False)
                source = FileOutcomes(str(path))
                source.validate(strata, {})
                fired += any("repeat" in line for line in source.notices())
        return rate(fired, files)

    def clean(rng: np.random.Generator, extra: Optional[str] = None) -> pd.DataFrame:
        b, c, cluster, _ = scene_units(rng, scenes, 8, 0.0, broken=0.02)
        b |= False
        table = table_of(b, c, cluster)
        position = np.arange(cluster.size) % 8
        if extra == "seed":
            table["seed"] = position
        if extra == "timestamp":
            table["timestamp"] = rng.permutation(10**6)[: cluster.size] + 1_700_000_000
        return table

    def copied(rng: np.random.Generator, extra: Optional[str]) -> pd.DataFrame:
        table = clean(rng, extra)
        copies = rng.choice(scenes, 3, replace=False)
        extra_rows = table[table["cluster_id"].isin([f"scene-{c}" for c in copies])].copy()
        extra_rows["cluster_id"] = "copy-" + extra_rows["cluster_id"]
        extra_rows["scenario_id"] = "copy-" + extra_rows["scenario_id"]
        return pd.concat([table, extra_rows], ignore_index=True)

    return [
        {"file": "clean, 2% broken scenes, required columns only", "notice": notice_rate(lambda r: clean(r))},
        {
            "file": "clean, 2% broken scenes, episode seeds 0..7 per scene",
            "notice": notice_rate(lambda r: clean(r, "seed")),
        },
        {"file": "clean, 2% broken scenes, unique timestamps", "notice": notice_rate(lambda r: clean(r, "timestamp"))},
        {"file": "3 scenes exported twice, unique timestamps", "notice": notice_rate(lambda r: copied(r, "timestamp"))},
        {"file": "3 scenes exported twice, required columns only", "notice": notice_rate(lambda r: copied(r, None))},
    ]


# ----------------------------------------------------------------------------- halts
class StreamSource:
    """Paired outcomes of one generated stratum, as a stream (its plan is fixed before any outcome)."""

    holds_outcomes = False

    def __init__(self, baseline: np.ndarray, candidate: np.ndarray, sizes: np.ndarray) -> None:
        self.outcomes = StratumOutcomes(baseline, candidate, sizes)

    def describe(self) -> Dict[str, Any]:
        return {"kind": "memory", "sha256": "stream"}

    def validate(self, strata: Any, effects: Any) -> None:
        return None

    def available_strata(self) -> Optional[List[str]]:
        return None

    def cluster_sizes(self, request: Any) -> np.ndarray:
        return self.outcomes.cluster_sizes

    def load(self, request: Any, cache: Any) -> Tuple[StratumOutcomes, str]:
        return self.outcomes, "memory"


def false_catastrophic(reps: int, seed: int) -> List[Dict[str, Any]]:
    spec = StratumConfig(priority=1, units=12000, cluster_size=20, catastrophic_halt=True, kind=StratumKind.safety)
    rows = []
    for effect in (-0.03, -0.04):
        draws = [
            scene_units(np.random.default_rng([seed, 4, int(-effect * 100), r]), 600, 20, effect) for r in range(reps)
        ]
        for batch in (4, 16, 48, None):
            settings = GauntletConfig(
                budget_units=10**9, nominal_stratum="", critical_stratum="", preflight=Preflight.off, plot=False,
                batch_units=2000 if batch is None else 20 * batch,
            )  # fmt: skip
            halted = regression = 0
            for r, (b, c, _, _) in enumerate(draws):
                s = replace(settings, seed=r)
                result = run_gauntlet(
                    s, {"safety_critical": spec}, {}, StreamSource(b, c, np.full(600, 20)),
                    ArrayCache("/none", enabled=False), LINEAGE,
                )  # fmt: skip
                halted += result.halted
                regression += result.strata[0].decision == "REGRESSION"
            rows.append(
                {
                    "effect": effect,
                    "batch": "default (2,000 units)" if batch is None else f"{batch} clusters",
                    "regression": rate(regression, reps),
                    "false_catastrophic": rate(halted, reps),
                }
            )
    return rows


# ----------------------------------------------------------------------------- intervals
def coverage(reps: int, seed: int) -> List[Dict[str, Any]]:
    designs: Dict[str, Callable[[np.random.Generator], Tuple[np.ndarray, np.ndarray, float]]] = {}

    def ceiling(
        scenes: int, size: int, broken: float, stray: float
    ) -> Callable[..., Tuple[np.ndarray, np.ndarray, float]]:
        def draw(rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, float]:
            dead = rng.random(scenes) < broken
            lost = rng.random((scenes, size)) < stray
            ok = ~dead[:, None] & ~lost
            return ok.sum(axis=1), np.full(scenes, size), (1 - broken) * (1 - stray)

        return draw

    def heterogeneous(
        scenes: int, sizes: Optional[Tuple[int, int]]
    ) -> Callable[..., Tuple[np.ndarray, np.ndarray, float]]:
        def draw(rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, float]:
            n = np.full(scenes, 8) if sizes is None else rng.integers(sizes[0], sizes[1] + 1, scenes)
            p = rng.uniform(0.35, 0.85, scenes)
            return rng.binomial(n, p), n, 0.6

        return draw

    def synthetic(rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, float]:
        from vlaeval.gauntlet.outcomes import synthetic_paired_outcomes

        spec = StratumConfig(units=2000, base_rate=0.9, cluster_size=20)
        o = synthetic_paired_outcomes("nominal", spec, 0.0, int(rng.integers(1 << 31)))
        base, _ = o.cluster_successes()
        return base, o.cluster_sizes, 0.9

    designs["48 x 8, 2% broken + 0.5% stray"] = ceiling(48, 8, 0.02, 0.005)
    designs["48 x 8, 4% broken + 1% stray"] = ceiling(48, 8, 0.04, 0.01)
    designs["48 x 8, 2% broken"] = ceiling(48, 8, 0.02, 0.0)
    designs["12 x 8, 2% broken + 0.5% stray"] = ceiling(12, 8, 0.02, 0.005)
    designs["6 x 8 heterogeneous (few scenes)"] = heterogeneous(6, None)
    designs["48 scenes of 2..30, heterogeneous"] = heterogeneous(48, (2, 30))
    designs["synthetic 100 x 20, base 0.9"] = synthetic
    rows = []
    for name, draw in designs.items():
        rng = np.random.default_rng([seed, 5, len(name)])
        covered, widths = 0, []
        # The true rate of a scene distribution: the ceiling designs' (1 - broken)(1 - stray); the
        # heterogeneous ones' mean of U(0.35, 0.85); the synthetic generator's base rate (clipped scenes
        # move it by less than 0.001).
        for _ in range(reps):
            s, n, truth = draw(rng)
            interval = success_rate_interval(s, n)
            covered += interval.covers(truth)
            widths.append(interval.width)
        rows.append({"design": name, "coverage": rate(covered, reps), "mean_width": float(np.mean(widths))})
    return rows


# ----------------------------------------------------------------------------- report
def markdown(r: Mapping[str, Any], before: Optional[Mapping[str, Any]] = None) -> str:
    """The page; with `before` (this script's record on an older commit: --before), a column each."""
    b = before or {}
    then = f"before ({b.get('commit', 'older commit')})"

    def pair(section: str, pick: Callable[[Any], str], index: Any = None) -> List[str]:
        old = b.get(section)
        if old is None:
            return []
        return [pick(old if index is None else old[index])]

    head = [then] if b else []
    out = []
    s = r["shopper"]
    out.append(f"## 1. The shopper ({s['files']} files of {s['scenes']} scenes x 8 at Delta = -0.02)\n")
    rows = [
        ("one run on the file as exported", "one_run"),
        ("the first PASS of 10 meaning-preserving re-saves", "keep_first_pass_of_10_resaves"),
        ("the first PASS of gauntlet.order_seed=0..9", "keep_first_pass_of_10_order_seeds"),
        ("files whose ten re-saves do not all get the same decision", "files_whose_resaves_disagree"),
        ("files on which gauntlet.order_seed is refused", "order_seed_refused"),
    ]
    out.append(
        markdown_table(
            ["what the user keeps", *head, "now"],
            [[label, *pair("shopper", lambda o: show(o[key])), show(s[key])] for label, key in rows],  # noqa: B023
        )
    )
    g = r["growing"]
    out.append(f"\n## 2. Re-run until PASS on a growing file ({g['reps']} files, 100 to 600 scenes by 50)\n")
    out.append(
        markdown_table(
            ["false PASS", *head, "now"],
            [
                [
                    "re-run after every 50 scenes until PASS (now: the ledger continues the evidence)",
                    *pair("growing", lambda o: show(o["rerun_until_pass"])),
                    show(g["rerun_until_pass"]),
                ],
                [
                    "one run on the 600-scene file",
                    *pair("growing", lambda o: show(o["one_run_on_full_file"])),
                    show(g["one_run_on_full_file"]),
                ],
            ],
        )  # fmt: skip
    )
    out.append("\n## 3. The duplicate notice (48 scenes x 8)\n")
    out.append(
        markdown_table(
            ["file", *head, "notice fires now"],
            [
                [d["file"], *pair("duplicates", lambda o: show(o["notice"]), i), show(d["notice"])]
                for i, d in enumerate(r["duplicates"])
            ],
        )
    )
    out.append(
        "\n## 4. False catastrophic halts (600 scenes of 20, +-10-point scene effects, catastrophic margin -0.05)\n"
    )
    out.append(
        markdown_table(
            ["true Delta", "batch", "REGRESSION (true)", *[f"halted as catastrophic, {then}"] * bool(b), "halted now"],
            [
                [
                    f"{x['effect']:+.2f}",
                    x["batch"],
                    show(x["regression"]),
                    *pair("halts", lambda o: show(o["false_catastrophic"]), i),
                    show(x["false_catastrophic"]),
                ]
                for i, x in enumerate(r["halts"])
            ],
        )  # fmt: skip
    )
    out.append("\n## 5. Success-rate interval coverage (nominal 95%)\n")
    out.append(
        markdown_table(
            ["design", *[f"coverage {then}"] * bool(b), "coverage now", "mean width now"],
            [
                [
                    x["design"],
                    *pair("coverage", lambda o: show(o["coverage"]), i),
                    show(x["coverage"]),
                    f"{x['mean_width']:.3f}",
                ]
                for i, x in enumerate(r["coverage"])
            ],
        )  # fmt: skip
    )
    if "ledger_lost" in r:
        lost = r["ledger_lost"]
        out.append(
            f"\n## 6. The ledger lost: drop the {lost['dropped']} worst scenes after a non-PASS ({lost['files']} null "
            f"files of {lost['scenes']} scenes x 8, Delta = -0.02; {lost['first_run_not_pass']} did not PASS first)\n"
        )
        out.append(
            markdown_table(
                ["where the second run looks", "PASS", "LAUNCH", "PASS sent to review"],
                [[x["case"], show(x["pass"]), show(x["launch"]), show(x["reviewed"])] for x in lost["cases"]],
            )
        )
        out.append(
            "\nIssue 50's review measured LAUNCH 50/199 = 0.251 [0.193, 0.317] where the ledger was lost. The "
            "tracked case copies the first run's entries into a fresh ledger, as job=gauntlet's shared_evidence "
            "does from the tracking store (tests/test_ledger_comparisons.py runs it through MLflow)."
        )
    if "copies" in r:
        cp = r["copies"]
        out.append(
            f"\n## 7. Re-appended copies ({cp['files']} null files of {cp['scenes']} scenes x 8, "
            f"{cp['first_run_not_pass']} did not PASS first; each version re-run through the ledger)\n"
        )
        out.append(
            markdown_table(
                ["what is re-appended under new ids", "any version LAUNCHes"],
                [[x["case"], show(x["launch"])] for x in cp["cases"]],
            )
        )
        out.append(
            "\nIssue 50's review measured LAUNCH 5/100 (the whole file again) and 6/100 (50 copies per re-run) "
            "before a new look that repeats the earlier looks' clusters was flagged (copied_look)."
        )
    out.append(
        f"\nWall time {r['wall_s']:.0f} s"
        + (f"; the before column is this script run on {b.get('commit')}." if b else ".")
    )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--label", default="after")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument(
        "--only", nargs="*", default=None, help="sections: shopper growing duplicates halts coverage ledger_lost"
    )
    parser.add_argument(
        "--before",
        default=str(REPO / "benchmarks" / "records" / "certificate_attacks_9f79e0d.json"),
        help="this script's record on an older commit (run there with --label before --no-figures), shown beside",
    )
    args = parser.parse_args()
    n = 40 if args.quick else 200
    started = time.perf_counter()
    sections: Dict[str, Callable[[], Any]] = {
        "shopper": lambda: shopper(n, args.seed),
        "growing": lambda: growing(n if args.quick else 300, args.seed),
        "duplicates": lambda: duplicates(n, args.seed),
        "halts": lambda: false_catastrophic(n // 2 if args.quick else 200, args.seed),
        "coverage": lambda: coverage(10 * n, args.seed),
        "ledger_lost": lambda: ledger_lost(n, args.seed),
        "copies": lambda: copies(n // 2, args.seed),
    }
    out = REPO / "benchmarks" / "results"
    saved = out / f"certificate_attacks_{args.label}.json"
    # --only re-measures some sections and keeps the others' last figures (the page shows them all).
    results: Dict[str, Any] = json.loads(saved.read_text()) if args.only and saved.exists() else {}
    results["label"] = args.label
    for name, section in sections.items():
        if args.only is None or name in args.only:
            t = time.perf_counter()
            results[name] = section()
            print(f"{name}: {time.perf_counter() - t:.0f} s\n{json.dumps(results[name], indent=1)}", flush=True)
    results["wall_s"] = time.perf_counter() - started + (results.get("wall_s", 0.0) if args.only else 0.0)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(saved, results)
    if all(name in results for name in sections):
        before_path = Path(args.before)
        report = markdown(results, json.loads(before_path.read_text()) if before_path.exists() else None)
        print(report)
        if not args.no_figures and not args.quick:
            write_figures(
                "certificate_attacks",
                "A certificate that cannot be bought: the attacks on outcome files",
                "python benchmarks/certificate_attacks.py",
                report,
            )


if __name__ == "__main__":
    main()
