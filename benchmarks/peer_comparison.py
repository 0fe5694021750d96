"""vlaeval's paired tests against the field's published peers, in one process, on the same sequences.

"Is my policy better?" with a budget of n_max = 200 paired trials, alpha = 0.05 per direction: STEP
(Snyder et al., RSS 2025) at its shipped n_max 200 policy (and its 500 one past the horizon), SAVI,
Lai's test and a batch Barnard test, all from `sequentialized-barnard-tests` 0.0.9 on the package
index -- called as a measured peer, never copied (its licence is non-commercial: `make bench` installs
it, nothing in vlaeval imports it) -- beside vlaeval's anytime test (the default mixture bet, and the
blend bet it replaced) and its horizon test (test_mode=horizon, a 200-trial design).

1. Power within 200 trials and E[trials] (the mean of min(stopping trial, 200)) at the paper's pairs
   and a grid p0 in {.1, .3, .5, .7, .9} x gap in {.05, .1, .2, .3, .5}, independent arms.
2. Type-I at the boundary p0 = p1: independent arms at five rates, and within-pair dependence
   (negative -0.13 as in the peer's own hardware data, arms that never both succeed, positive): one-sided
   false "better", and two-sided (either direction; bound 2 alpha = .10).
3. Past the horizon: a user who goes on -- STEP switched to its 500 policy, or restarted on trials
   201-400; vlaeval's anytime test looking to 5,000 trials; the horizon test restarted (not valid).

Every method sees the same sequences; a rate has its two-sided 95% Clopper-Pearson interval.
SAVI steps cost ~1.5 ms each and scipy's Barnard test ~50 ms per distinct pair of sums, so they run on
fewer sequences (their intervals say how many).

    python benchmarks/peer_comparison.py            # the committed record (docs/figures/peer_comparison.md)
    python benchmarks/peer_comparison.py --quick    # 1,000 sequences per point
"""

from __future__ import annotations

import argparse
import json
import time
from functools import lru_cache
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import numpy as np
from scipy.stats import norm

from benchlib import REPO, markdown_table, rate, show, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.seqtest.eprocess import log_wealth_paths, size_adaptive_cap
from vlaeval.seqtest.horizon import NEVER_REJECTS, HorizonDesign, synthesise

ALPHA, N_MAX = 0.05, 200
PAPER = [(0.5, 0.6), (0.3, 0.4), (0.7, 0.8), (0.1, 0.2), (0.9, 0.95), (0.40, 0.564), (0.0, 0.03)]
GRID = [(p0, round(p0 + g, 3)) for p0 in (0.1, 0.3, 0.5, 0.7, 0.9) for g in (0.05, 0.1, 0.2, 0.3, 0.5) if p0 + g <= 1]
POINTS = list(dict.fromkeys(PAPER + GRID))
NULLS: Dict[str, Tuple[float, float]] = {  # name -> (success rate of both arms, within-pair correlation)
    "independent p = .1": (0.1, 0.0),
    "independent p = .3": (0.3, 0.0),
    "independent p = .5": (0.5, 0.0),
    "independent p = .7": (0.7, 0.0),
    "independent p = .9": (0.9, 0.0),
    "p = .5, correlation -0.13": (0.5, -0.13),
    "p = .5, never both succeed": (0.5, -1.0),
    "p = .5, correlation +0.5": (0.5, 0.5),
    "p = .2, correlation +0.5": (0.2, 0.5),
}
Outcome = Tuple[np.ndarray, np.ndarray]  # (decided: bool (R,), stopping trial: int (R,), n_max where undecided)


def pairs(p0: float, p1: float, corr: float, reps: int, trials: int, seed: Sequence[int]) -> np.ndarray:
    """(reps, trials, 2) baseline and candidate successes with a within-pair correlation (a Gaussian
    copula; corr = -1 at p = .5: the arms never both succeed)."""
    rng = np.random.default_rng(list(seed))
    g = rng.standard_normal((reps, trials, 2))
    g[..., 1] = corr * g[..., 0] + np.sqrt(max(0.0, 1 - corr * corr)) * g[..., 1]
    return np.stack([g[..., 0] < norm.ppf(p0), g[..., 1] < norm.ppf(p1)], axis=-1)


# ------------------------------------------------------------------------------------ the peers
def peer_stepwise(make: Callable[[], Any], data: np.ndarray, horizon: int, both: bool = False) -> Outcome:
    """Step a peer's test through each sequence (a fresh reset each); decided where it accepts the
    alternative (or, `both`, either direction)."""
    from sequentialized_barnard_tests import Decision

    test = make()
    decided = np.zeros(data.shape[0], bool)
    at = np.full(data.shape[0], horizon)
    for r in range(data.shape[0]):
        test.reset()
        for i in range(horizon):
            d = test.step(int(data[r, i, 0]), int(data[r, i, 1])).decision
            if d == Decision.AcceptAlternative or (both and d == Decision.AcceptNull):
                decided[r], at[r] = True, i + 1
                break
    return decided, at


def step_test(n_max: int = N_MAX, mirrored: bool = False) -> Callable[[], Any]:
    from sequentialized_barnard_tests import Hypothesis, MirroredStepTest, StepTest

    cls = MirroredStepTest if mirrored else StepTest
    return lambda: cls(Hypothesis.P0LessThanP1, n_max, ALPHA, random_seed=7)


def lai_test() -> Any:
    from sequentialized_barnard_tests import Hypothesis, LaiTest

    return LaiTest(Hypothesis.P0LessThanP1, N_MAX, ALPHA)


def savi_test() -> Any:
    from sequentialized_barnard_tests import Hypothesis, SaviTest

    return SaviTest(Hypothesis.P0LessThanP1, ALPHA)


@lru_cache(maxsize=None)
def barnard_rejects(x: int, y: int, n: int) -> bool:
    """The peer's batch Barnard test at one look after n trials: a function of the two sums only, so
    it is called once per (x, y)."""
    from sequentialized_barnard_tests import Decision
    from sequentialized_barnard_tests.base import Hypothesis
    from sequentialized_barnard_tests.batch import BarnardExactTest

    a = np.r_[np.ones(x), np.zeros(n - x)]
    b = np.r_[np.ones(y), np.zeros(n - y)]
    return BarnardExactTest(Hypothesis.P0LessThanP1, ALPHA).run_on_sequence(a, b).decision == Decision.AcceptAlternative


def barnard(data: np.ndarray) -> Outcome:
    sums = data[:, :N_MAX].sum(axis=1)
    decided = np.array([barnard_rejects(int(x), int(y), N_MAX) for x, y in sums])
    return decided, np.full(data.shape[0], N_MAX)


# ------------------------------------------------------------------------------------ vlaeval
def anytime(rule: str, data: np.ndarray, horizon: int, both: bool = False) -> Outcome:
    """vlaeval's exact anytime test on single-trial clusters at margin 0 (the size-adaptive cap of one
    trial, 0.8), a look after every trial; `both`: either side at alpha."""
    d = data[:, :horizon, 1].astype(np.float64) - data[:, :horizon, 0]
    decided = np.zeros(d.shape[0], bool)
    at = np.full(d.shape[0], horizon)
    sides = [(d, "upper")] + ([(d, "lower")] if both else [])
    for x, side in sides:
        for lo in range(0, d.shape[0], 500):  # bounded memory at 5,000 trials
            lw = log_wealth_paths(x[lo : lo + 500], 0.0, side, rule=rule, cap_fraction=float(size_adaptive_cap(1)))
            hit = lw >= np.log(1 / ALPHA)
            first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, horizon)
            chunk = slice(lo, lo + 500)
            at[chunk] = np.where(hit.any(axis=1), np.minimum(at[chunk], first), at[chunk])
            decided[chunk] |= hit.any(axis=1)
    return decided, at


def horizon_test(design: HorizonDesign, data: np.ndarray, both: bool = False, offset: int = 0) -> Outcome:
    """test_mode=horizon's walk (single trials at margin 0: no rounding) on trials offset..offset+N."""
    d = data[:, offset : offset + design.horizon, 1].astype(np.int64) - data[:, offset : offset + design.horizon, 0]
    t = np.arange(1, d.shape[1] + 1)
    decided = np.zeros(d.shape[0], bool)
    at = np.full(d.shape[0], design.horizon)
    for sign in (1, -1) if both else (1,):
        k = np.cumsum(d != 0, axis=1)
        n = np.cumsum(sign * d > 0, axis=1)
        hit = n >= design.boundary[t[None, :], k]
        first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, design.horizon)
        at = np.where(hit.any(axis=1), np.minimum(at, first), at)
        decided |= hit.any(axis=1)
    return decided, at


# ------------------------------------------------------------------------------------ sections
def methods(design: HorizonDesign, savi_reps: int, only: str = "") -> Dict[str, Callable[[np.ndarray], Outcome]]:
    """Every method by name (`only`: those whose name starts with it)."""
    batch_reps = 5 * savi_reps  # scipy's Barnard test costs ~50 ms per distinct pair of sums
    every: Dict[str, Callable[[np.ndarray], Outcome]] = {
        "STEP (n_max 200)": lambda data: peer_stepwise(step_test(), data, N_MAX),
        "Lai (n_max 200)": lambda data: peer_stepwise(lai_test, data, N_MAX),
        "SAVI": lambda data: peer_stepwise(savi_test, data[:savi_reps], N_MAX),
        "Barnard (batch, one look at 200)": lambda data: barnard(data[:batch_reps]),
        "vlaeval anytime (mixture, default)": lambda data: anytime("mixture", data, N_MAX),
        "vlaeval anytime (blend, before)": lambda data: anytime("blend", data, N_MAX),
        "vlaeval horizon (200)": lambda data: horizon_test(design, data),
    }
    return {name: run for name, run in every.items() if name.startswith(only)}


def power_section(
    design: HorizonDesign, reps: int, savi_reps: int, only: str = ""
) -> Dict[str, Dict[Tuple[float, float], Any]]:
    out: Dict[str, Dict[Tuple[float, float], Any]] = {}
    for p0, p1 in POINTS:
        data = pairs(p0, p1, 0.0, reps, N_MAX, [1, int(p0 * 1000), int(p1 * 1000)])
        for name, run in methods(design, savi_reps, only).items():
            started = time.perf_counter()
            decided, at = run(data)
            out.setdefault(name, {})[(p0, p1)] = {
                "power": rate(int(decided.sum()), decided.size),
                "trials": float(at.mean()),
                "trials_sd": float(at.std(ddof=1) / np.sqrt(at.size)),
                "s": time.perf_counter() - started,
            }
        print(f"  ({p0}, {p1}) done", flush=True)
    return out


TWO_SIDED = {
    "STEP mirrored (two-sided)": lambda design, data: peer_stepwise(step_test(mirrored=True), data, N_MAX, both=True),
    "vlaeval anytime (two-sided)": lambda design, data: anytime("mixture", data, N_MAX, both=True),
    "vlaeval horizon (two-sided)": lambda design, data: horizon_test(design, data, both=True),
}


def type_i_section(design: HorizonDesign, reps: int, savi_reps: int, only: str = "") -> Dict[str, Dict[str, Any]]:
    """Per null, each method's false-decision rate: one-sided, then two-sided."""
    out: Dict[str, Dict[str, Any]] = {}
    for name, (p, corr) in NULLS.items():
        data = pairs(p, p, corr, reps, N_MAX, [2, len(name), int(round(abs(corr) * 100)), int(corr < 0)])
        runs = {m: lambda data, run=run: run(data) for m, run in methods(design, savi_reps, only).items()}
        runs |= {m: lambda data, run=run: run(design, data) for m, run in TWO_SIDED.items() if m.startswith(only)}
        for method, run in runs.items():
            hits = run(data)[0]
            out.setdefault(name, {})[method] = rate(int(hits.sum()), hits.size)
        print(f"  null {name} done", flush=True)
    return out


def past_horizon_section(design: HorizonDesign, reps: int) -> List[List[str]]:
    """Going on past n_max = 200 at p0 = p1 = .5 (independent, and correlation -0.13), two-sided."""
    rows = []
    for name, corr in (("independent p = .5", 0.0), ("p = .5, correlation -0.13", -0.13)):
        data = pairs(0.5, 0.5, corr, reps, 5000, [3, int(round(abs(corr) * 100)), int(corr < 0)])
        step200, _ = peer_stepwise(step_test(mirrored=True), data, N_MAX, both=True)
        step500, _ = peer_stepwise(step_test(500, mirrored=True), data, 500, both=True)
        restart, _ = peer_stepwise(step_test(mirrored=True), data[:, N_MAX:], N_MAX, both=True)
        keep, _ = anytime("mixture", data, 5000, both=True)
        first, _ = horizon_test(design, data, both=True)
        again, _ = horizon_test(design, data, both=True, offset=N_MAX)
        cells = {
            "STEP 200, then its 500 policy": step200 | step500,
            "STEP 200, then restarted on trials 201-400": step200 | restart,
            "vlaeval anytime, looking to 5,000 trials": keep,
            "vlaeval horizon 200, then restarted on 201-400 (not valid)": first | again,
        }
        for method, hits in cells.items():
            rows.append([name, method, show(rate(int(hits.sum()), hits.size))])
        print(f"  past the horizon, {name} done", flush=True)
    return rows


def summary(power: Mapping[str, Mapping[Tuple[float, float], Any]]) -> Tuple[List[List[str]], List[List[str]]]:
    step = power["STEP (n_max 200)"]
    rows = []
    for name, by_point in power.items():
        ratios = [by_point[p]["trials"] / step[p]["trials"] for p in POINTS]
        rows.append([name, f"{np.exp(np.mean(np.log(ratios))):.3f}", f"{min(ratios):.2f}-{max(ratios):.2f}"])
    blend = power["vlaeval anytime (blend, before)"]
    mixture = power["vlaeval anytime (mixture, default)"]
    rows.append(
        [
            "vlaeval anytime: mixture / blend",
            f"{np.exp(np.mean([np.log(mixture[p]['trials'] / blend[p]['trials']) for p in GRID])):.3f} (grid)",
            "",
        ]
    )
    horizon = power["vlaeval horizon (200)"]
    wins = []
    for p in POINTS:
        s, h = step[p], horizon[p]
        power_ok = h["power"]["high"] >= s["power"]["low"]
        trials_ok = h["trials"] <= 1.02 * s["trials"]
        best_power = max(power, key=lambda m: power[m][p]["power"]["rate"])
        best_trials = min(power, key=lambda m: power[m][p]["trials"])
        wins.append(
            [
                f"({p[0]:g}, {p[1]:g})",
                f"{s['power']['rate']:.3f} / {s['trials']:.1f}",
                f"{h['power']['rate']:.3f} / {h['trials']:.1f}",
                "yes" if power_ok and trials_ok else ("power" if not power_ok else "trials") + " short",
                best_power,
                best_trials,
            ]
        )
    return rows, wins


def render(
    power: Any, type_i: Dict[str, Dict[str, Any]], past: List[List[str]], reps: int, savi_reps: int, seconds: float
) -> str:
    names = list(power)
    tables = []
    for metric, fmt in (("power", lambda c: show(c["power"])), ("E[trials]", lambda c: f"{c['trials']:.1f}")):
        rows = [[f"({p[0]:g}, {p[1]:g})"] + [fmt(power[m][p]) for m in names] for p in POINTS]
        tables.append(f"### {metric} within {N_MAX} trials\n\n" + markdown_table(["(p0, p1)", *names], rows))
    ratio_rows, wins = summary(power)
    columns = [*names, *TWO_SIDED]
    type_i_rows = [[null, *(show(by_method[m]) for m in columns)] for null, by_method in type_i.items()]
    return f"""
{reps:,} sequences per point for every method but SAVI ({savi_reps:,}) and Barnard ({5 * savi_reps:,}); n_max = {N_MAX}, alpha = {ALPHA} per direction;
independent arms unless the null says otherwise; {seconds / 60:.0f} min in all.

## 1. Power and expected trials

{tables[0]}

{tables[1]}

Geometric mean of E[trials] over the {len(POINTS)} points, relative to STEP (and the range):

{markdown_table(["method", "E[trials] / STEP", "range"], ratio_rows)}

Where each method wins, and the horizon test against STEP (power within its interval or above, and
E[trials] at most 1.02 x STEP's):

{markdown_table(["(p0, p1)", "STEP power / E", "horizon power / E", "horizon meets STEP", "most power", "fewest trials"], wins)}

## 2. Type-I at the boundary (false "better", one-sided; either direction, two-sided)

{markdown_table(["null", *columns], type_i_rows)}

## 3. Past the horizon (two-sided, bound 2 alpha = 0.10)

{markdown_table(["null", "what the user does", "any false decision"], past)}
"""


RESULTS = REPO / "benchmarks" / "results" / "peer_comparison.json"


def sections(args: argparse.Namespace, design: HorizonDesign, reps: int, savi_reps: int) -> Dict[str, Any]:
    """Each section's figures, saved to benchmarks/results/ as it finishes (an hour of peers' stepping
    is not lost to a later section's failure); --resume reuses the sections a run with the same
    settings already saved."""
    key = {"reps": reps, "savi_reps": savi_reps}
    saved: Dict[str, Any] = json.loads(RESULTS.read_text()) if args.resume and RESULTS.exists() else {}
    if saved.get("key") != key:
        saved = {"key": key}
    if args.refresh_vlaeval and "power" in saved:
        # The peers' columns kept (the same sequences: the same seeds), vlaeval's measured again.
        fresh = power_section(design, reps, savi_reps, only="vlaeval")
        saved["power"] |= {name: [[list(p), cell] for p, cell in cells.items()] for name, cells in fresh.items()}
        if "type_i" in saved:
            for null, by_method in type_i_section(design, reps, savi_reps, only="vlaeval").items():
                saved["type_i"][null] |= by_method
        saved.pop("past", None)  # its peers cost a minute: measured again whole
        atomic_write_json(RESULTS, saved)
    steps: Dict[str, Callable[[], Any]] = {
        "power": lambda: {
            name: [[list(p), cell] for p, cell in by_point.items()]
            for name, by_point in power_section(design, reps, savi_reps).items()
        },
        "type_i": lambda: type_i_section(design, reps, savi_reps),
        "past": lambda: past_horizon_section(design, max(reps // 5, 1000)),
    }
    for name, run in steps.items():
        if name not in saved:
            saved[name] = run()
            atomic_write_json(RESULTS, saved)
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 sequences per point")
    parser.add_argument("--resume", action="store_true", help="reuse the sections benchmarks/results/ already holds")
    parser.add_argument(
        "--refresh-vlaeval",
        action="store_true",
        help="with --resume: measure vlaeval's columns again on the same sequences, keep the peers'",
    )
    parser.add_argument("--no-figures", action="store_true", help="print, do not write docs/figures")
    args = parser.parse_args()
    reps = 1000 if args.quick else 10_000
    savi_reps = 50 if args.quick else 100
    started = time.perf_counter()
    design = synthesise(N_MAX, ALPHA)
    print(f"horizon design: certified size {design.size.bound:.4f} ({time.perf_counter() - started:.0f} s)", flush=True)
    assert design.boundary[1:, :].min() >= 0 and NEVER_REJECTS > N_MAX
    saved = sections(args, design, reps, savi_reps)
    power = {name: {tuple(p): cell for p, cell in cells} for name, cells in saved["power"].items()}
    body = render(power, saved["type_i"], saved["past"], reps, savi_reps, time.perf_counter() - started)
    print(body)
    if not args.no_figures:
        command = "python benchmarks/peer_comparison.py" + (" --quick" if args.quick else "")
        print(write_figures("peer_comparison", "vlaeval against STEP, SAVI, Lai and Barnard", command, body))


if __name__ == "__main__":
    main()
