"""The importance-sampling ablation, measured: does the audit's predicted second-moment ratio show
up in the training run it is about? And, over several settings, the calibration of the gate.

    python benchmarks/ablation.py                      # the default ablation (job=ablation)
    python benchmarks/ablation.py --calibration        # audit + ablation over several settings
    python benchmarks/ablation.py --positive-control   # audit + ablation where anchor sampling must pay

Every run goes through the CLI in its own process (tracking off) on one cache folder. The default
ablation: the built-in checkpoint, every proposal, 5 seeds x 500 steps, closed-loop success.
Calibration: for each setting (estimator, proposal power, a checkpoint from early, middle or late
training, a task mix) job=residual_audit, then job=ablation on its result with the uniform and
residual proposals (3 seeds, no closed loop): predicted vs realized ratio, gate pass vs realized
gain. The positive control: data=metaworld_jittery (a tenth of the episodes recorded by a jittery
operator), job=residual_audit, then the default ablation on that audit's result. Results in
benchmarks/results/ablation.json, ablation_calibration.json and ablation_positive_control.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from benchlib import REPO, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json

# Each setting audits its own anchors: a gradient epoch of its own (gradients.epoch draws another 64
# anchors), so no two settings share anchors or a gradient artifact and their prediction errors are
# independent -- before, six of the eleven shared the default checkpoint's epoch-0 anchors.
SETTINGS = {
    "default (sobol, gamma 1/2)": [],
    "estimator iid": ["estimator=iid"],
    "gamma 1/4": ["audit.proposal_power=0.25"],
    "gamma 1": ["audit.proposal_power=1.0"],
    "early checkpoint (500 steps)": ["train.steps=500"],
    "middle checkpoint (1500 steps)": ["train.steps=1500"],
    "three easy tasks": ["data.tasks=[reach-v3,push-v3,pick-place-v3]"],
    # Settings meant to land near the gate's 0.98 threshold, where a gate can be wrong either way: a
    # flatter proposal (alpha 1/2: half uniform), a steeper one (gamma 3/4), and the default twice more.
    "alpha 1/2": ["audit.alpha=0.5"],
    "gamma 3/4": ["audit.proposal_power=0.75"],
    "default, anchor set 2": [],
    "default, anchor set 3": [],
    # The positive control: a tenth of the episodes from a jittery operator (data=metaworld_jittery),
    # where anchor sampling must pay -- a setting clearly worth it, which the gate must pass.
    "jittery operators (positive control)": ["data=metaworld_jittery"],
}
CALIBRATION = {label: [*overrides, f"gradients.epoch={k}"] for k, (label, overrides) in enumerate(SETTINGS.items())}
# A failed gate's ablation runs too: the calibration is how often the gate's verdict was right.
CALIBRATION_ABLATION = [
    "ablation.proposals=[uniform,residual]",
    "ablation.seeds=[0,1,2]",
    "ablation.evaluate=false",
    "ablation.allow_failed_gate=true",
]


def main_py(job: str, overrides: List[str], out: Path, cache: Path) -> Dict[str, Any]:
    marker = out / "benchmark_wall_seconds.json"
    if marker.exists() and (out / "result.json").exists():  # finished before: a rerun resumes
        result = json.loads((out / "result.json").read_text())
        result["benchmark_wall_seconds"] = float(json.loads(marker.read_text()))
        return result
    env = {**os.environ, "VLAEVAL_CACHE_DIR": str(cache), "MPLBACKEND": "Agg"}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(REPO / "main.py"), f"job={job}", "tracking=disabled", *overrides, f"hydra.run.dir={out}"],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode not in (0, 1):  # an audit whose gate fails exits 1 and is still a result
        raise SystemExit(f"{job} {overrides} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    result["benchmark_wall_seconds"] = time.perf_counter() - started
    atomic_write_json(marker, result["benchmark_wall_seconds"])
    return result


def table(result: Dict[str, Any]) -> Dict[str, Any]:
    last = str(result["settings"]["measure_steps"][-1])
    rows = {}
    for name, row in result["summary"].items():
        rows[name] = {
            "ratio_step_0": row["realized_ratio"]["0"],
            f"ratio_step_{last}": row["realized_ratio"][last],
            "gain_is_real": row["gain_is_real"],
            "minibatch_variance_ratio_final": row.get("minibatch_variance_ratio", {}).get(last),
            "final_heldout_loss": row.get("final_heldout_loss"),
            "heldout_loss_minus_uniform": row.get("heldout_loss_minus_uniform"),
            "success_rate": row.get("success_rate"),
            "seconds_per_run": row["wall_seconds"],
        }
    return {
        "predicted_ratio": result["prediction"]["predicted_ratio"],
        "prediction": result["prediction"],
        "base_success": result.get("base_success", {}) and result["base_success"]["success_rate"],
        "score": result["score"],
        "proposals": {k: {kk: vv for kk, vv in v.items() if kk != "name"} for k, v in result["proposals"].items()},
        "table": rows,
        "wall_seconds": result["benchmark_wall_seconds"],
    }


def calibration(cache: Path, runs: Path, extra: List[str]) -> Dict[str, Any]:
    rows = {}
    for label, overrides in CALIBRATION.items():
        slug = "".join(c if c.isalnum() else "-" for c in label)
        audit = main_py("residual_audit", [*overrides, *extra, "audit.plot=false"], runs / f"audit-{slug}", cache)
        ablation = main_py(
            "ablation",
            [
                *overrides,
                *extra,
                *CALIBRATION_ABLATION,
                f"ablation.audit_result={runs / f'audit-{slug}' / 'result.json'}",
                "ablation.plot=false",
            ],
            runs / f"ablation-{slug}",
            cache,
        )
        summary = ablation["summary"]["residual"]
        last = str(ablation["settings"]["measure_steps"][-1])
        verdict = audit["gate"].get("verdict") or {}
        rows[label] = {
            "overrides": overrides,
            "verdict": verdict.get("verdict"),
            "verdict_interval": [verdict.get("low"), verdict.get("high")],
            "anchors_needed": verdict.get("anchors_needed"),
            "break_even_ratio": verdict.get("break_even_ratio"),
            "gate_status": audit["gate"]["status"],
            "gate_pass": bool(audit["gate"]["eligible_for_500_step_ablation"]),
            "failed_checks": sorted(k for k, ok in audit["gate"]["checks"].items() if not ok),
            "predicted_ratio": summary["predicted_ratio"],
            "realized_ratio_step_0": summary["realized_ratio"]["0"],
            f"realized_ratio_step_{last}": summary["realized_ratio"][last],
            "gain_is_real": summary["gain_is_real"],
            "prediction_vs_realized": summary.get("prediction_vs_realized"),
            "heldout_loss_minus_uniform": summary.get("heldout_loss_minus_uniform"),
            "wall_seconds": audit["benchmark_wall_seconds"] + ablation["benchmark_wall_seconds"],
        }
        print(json.dumps({label: rows[label]}, indent=1), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=str(REPO / ".cache" / "vlaeval"))
    parser.add_argument("--runs-dir", default="/tmp/vlaeval-ablation-bench")
    parser.add_argument("--calibration", action="store_true")
    parser.add_argument("--positive-control", action="store_true", help="data=metaworld_jittery: audit, then ablation")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides added to every run")
    args = parser.parse_args()
    cache, runs = Path(args.cache_dir), Path(args.runs_dir)
    results = REPO / "benchmarks" / "results"
    if args.calibration:
        settings = calibration(cache, runs, args.extra)
        out: Dict[str, Any] = {"settings": settings, "ablation_overrides": CALIBRATION_ABLATION}
        atomic_write_json(results / "ablation_calibration.json", out)
        write_figures(
            "ablation_calibration",
            "Calibrating the audit's gate",
            "python benchmarks/ablation.py --calibration",
            calibration_body(settings),
        )
    elif args.positive_control:
        control = ["data=metaworld_jittery", *args.extra]
        audit = main_py("residual_audit", [*control, "audit.plot=false"], runs / "control-audit", cache)
        ablation = main_py(
            "ablation",
            [*control, f"ablation.audit_result={runs / 'control-audit' / 'result.json'}"],
            runs / "control-ablation",
            cache,
        )
        out = {**table(ablation), "gate": audit["gate"], "audit_wall_seconds": audit["benchmark_wall_seconds"]}
        atomic_write_json(results / "ablation_positive_control.json", out)
        write_figures(
            "ablation_positive_control",
            "The gate's positive control: where anchor sampling must pay",
            "python benchmarks/ablation.py --positive-control",
            positive_control_body(out),
        )
    else:
        out = table(main_py("ablation", args.extra, runs / "default", cache))
        atomic_write_json(results / "ablation.json", out)
        write_figures(
            "ablation", "The importance-sampling ablation", "python benchmarks/ablation.py", ablation_body(out)
        )
    print(json.dumps(out, indent=1))


def interval(value: Any) -> str:
    """A seed interval {mean, low, high} as "mean [low, high]"; a number as itself; None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, dict):
        return f"{value['mean']:.3f} [{value['low']:.3f}, {value['high']:.3f}]"
    return f"{value:.3f}"


def ablation_body(out: Dict[str, Any]) -> str:
    last = next(k for k in next(iter(out["table"].values())) if k.startswith("ratio_step_") and k != "ratio_step_0")
    rows = [
        (
            name,
            interval(row["ratio_step_0"]),
            interval(row[last]),
            interval(row["minibatch_variance_ratio_final"]),
            interval(row["heldout_loss_minus_uniform"]),
            interval(row["success_rate"]),
            f"{row['seconds_per_run'] if not isinstance(row['seconds_per_run'], dict) else row['seconds_per_run']['mean']:.0f} s",
        )
        for name, row in out["table"].items()
    ]
    header = ["proposal", "realized ratio, step 0", last.replace("ratio_", "").replace("_", " "),
              "minibatch variance ratio", "held-out loss - uniform", "closed-loop success", "time per run"]  # fmt: skip
    return (
        "`job=ablation` with the defaults: the built-in checkpoint, every proposal, fine-tuned over several seeds; "
        "each figure is the mean over seeds with its 95% interval across seeds. The audit predicted a ratio of "
        f"{out['predicted_ratio']:.3f} for the residual proposal; the whole benchmark took "
        f"{out['wall_seconds']:.0f} s.\n\n" + markdown_table(header, rows)
    )


def positive_control_body(out: Dict[str, Any]) -> str:
    gate, verdict = out["gate"], out["gate"]["verdict"]
    failed = sorted(k for k, ok in gate["checks"].items() if not ok)
    pays = verdict.get("pays_for_its_scoring")
    return (
        "`data=metaworld_jittery`: the default demonstrations with a tenth of the episodes recorded by a jittery "
        "operator (their commands carry Gaussian noise of SD 3 in action units, which no policy can learn), the "
        "built-in policy trained on them as usual. `job=residual_audit` on that policy (64 anchors), then "
        "`job=ablation` on that audit's result with every proposal and five seeds.\n\n"
        f"The gate: **{'PASS' if gate['pass'] else 'FAIL'}** ({', '.join(failed) or 'every check passed'}); the "
        f"ratio's verdict **{verdict['verdict']}**, {verdict['ratio']:.3f} [{verdict['low']:.3f}, "
        f"{verdict['high']:.3f}] against {verdict['threshold']}; the break-even ratio r* = "
        f"{verdict['break_even_ratio']:.3f} (scoring {verdict['scoring_gflop']:,.0f} GFLOP against a "
        f"{verdict['training_gflop']:,.0f}-GFLOP training run): "
        + ("the proposal pays for its scoring." if pays else "not shown to pay for its scoring at this run length.")
        + f" The audit took {out['audit_wall_seconds']:.0f} s.\n\n"
        + ablation_body(out)
    )


def gate_error_rates(settings: Dict[str, Any], threshold: float = 0.98) -> Dict[str, Any]:
    """The gate's verdicts against what training realized at the audited parameters (step 0): a
    setting is clearly worth it when its realized interval lies below the threshold, clearly not
    when it lies above; a pass on a clearly-not is a false pass, a fail on a clearly-worth-it a false
    fail; settings whose interval straddles the threshold are counted apart."""
    good = {k for k, r in settings.items() if r["realized_ratio_step_0"]["high"] < threshold}
    bad = {k for k, r in settings.items() if r["realized_ratio_step_0"]["low"] > threshold}
    passed = {k for k, r in settings.items() if r["gate_pass"]}
    return {
        "threshold": threshold,
        "settings": len(settings),
        "passes": len(passed),
        "false_passes": sorted(passed & bad),
        "clearly_not_worth_it": len(bad),
        "false_fails": sorted(good - passed),
        "clearly_worth_it": len(good),
        "straddling": sorted(set(settings) - good - bad),
    }


def verdict_errors(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The three-way verdicts against the realized ratio at step 0 (its interval across seeds): a PASS
    is wrong when the realized interval lies above the threshold, a FAIL when it lies below; an
    UNDECIDED is never wrong, and is counted with the anchors it asked for."""
    wrong, counts = [], {"PASS": 0, "FAIL": 0, "UNDECIDED": 0}
    for label, row in settings.items():
        verdict, realized = row.get("verdict"), row["realized_ratio_step_0"]
        threshold = row.get("verdict_threshold", 0.98)
        if verdict in counts:
            counts[verdict] += 1
        if (verdict == "PASS" and realized["low"] > threshold) or (verdict == "FAIL" and realized["high"] < threshold):
            wrong.append(label)
    return {"counts": counts, "wrong": wrong}


def verdict_cell(row: Dict[str, Any]) -> str:
    low, high = row.get("verdict_interval") or (None, None)
    if row.get("verdict") is None or low is None:
        return "—"
    needed = f", {row['anchors_needed']} anchors would decide" if row.get("anchors_needed") else ""
    return f"{row['verdict']} [{low:.3f}, {high:.3f}]{needed}"


def predicted_with_error(row: Dict[str, Any]) -> str:
    sd = ((row.get("prediction_vs_realized") or {}).get("0") or {}).get("prediction_sd")
    return interval(row["predicted_ratio"]) + ("" if sd is None else f" ± {sd:.3f}")


def agreement(row: Dict[str, Any]) -> str:
    """The step-0 comparison of prediction and realization as two estimates with errors."""
    at_0 = (row.get("prediction_vs_realized") or {}).get("0")
    if not at_0:
        return "—"
    verdict = "consistent" if at_0["consistent"] else "inconsistent"
    return f"{at_0['realized_minus_predicted']:+.3f} (t {at_0['t']:+.1f}, {verdict})"


def calibration_body(settings: Dict[str, Any]) -> str:
    last = next(
        k for k in next(iter(settings.values())) if k.startswith("realized_ratio_step_") and not k.endswith("_0")
    )
    rows = [
        (
            label,
            "PASS" if row["gate_pass"] else "FAIL (" + ", ".join(row["failed_checks"]) + ")",
            verdict_cell(row),
            "—" if row.get("break_even_ratio") is None else f"{row['break_even_ratio']:.2f}",
            predicted_with_error(row),
            interval(row["realized_ratio_step_0"]),
            agreement(row),
            interval(row[last]),
            "yes" if row["gain_is_real"] else "no",
            interval(row["heldout_loss_minus_uniform"]),
        )
        for label, row in settings.items()
    ]
    header = ["setting", "the seed's screen (point checks)", "three-way verdict [interval]", "break-even r*", "predicted ± bootstrap SD", "realized, step 0", "realized - predicted (t)",
              last.replace("realized_ratio_", "realized, ").replace("_", " "), "gain real", "held-out loss - uniform"]  # fmt: skip
    rates = gate_error_rates(settings)
    summary = (
        f"At the gate's threshold ({rates['threshold']}), against the realized ratio at step 0: "
        f"{len(rates['false_passes'])} false pass(es) among the {rates['clearly_not_worth_it']} setting(s) "
        f"clearly not worth it, {len(rates['false_fails'])} false fail(s) among the {rates['clearly_worth_it']} "
        f"clearly worth it ({rates['passes']} of {rates['settings']} passed); "
        f"{len(rates['straddling'])} straddle the threshold"
        + (f" ({', '.join(rates['straddling'])})" if rates["straddling"] else "")
        + "."
    )
    three_way = verdict_errors(settings)
    counts = three_way["counts"]
    summary += (
        f" The three-way verdict (PASS when the two-level bootstrap interval lies below the threshold, FAIL "
        f"above, UNDECIDED across it): {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['UNDECIDED']} "
        f"UNDECIDED; {len(three_way['wrong'])} wrong against the realized interval"
        + (f" ({', '.join(three_way['wrong'])})" if three_way["wrong"] else "")
        + "."
    )
    return (
        "Per setting, `job=residual_audit`, then `job=ablation ablation.audit_result=<it>` with the uniform and "
        "residual proposals: the gate's decisions beside the ratio it predicted and the ratio training realized. "
        "Every setting audits anchors of its own (its own `gradients.epoch`): no two share anchors or a gradient "
        "artifact, so their prediction errors are independent."
        "\n\n" + markdown_table(header, rows) + "\n\n" + summary
    )


if __name__ == "__main__":
    main()
