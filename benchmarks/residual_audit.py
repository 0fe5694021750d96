"""Residual audit benchmarks on the default trained policy and its 64-anchor gradient artifact.

    python benchmarks/residual_audit.py [--replicates R] [--skip-demo] [--proposal-only]

1. Estimator quality at equal action-head evaluations (4 seeds x M = 8 = 32 per anchor), over R
   replicate seed sets: bias against a 1024-sample iid reference, variance factor over iid,
   split-half repeatability, Spearman with the reference and with gradient RMS; iid with 128
   and 512 evaluations for comparison.
2. Proposal: the second-moment ratio for gamma = 1, 1/2 and a cross-fitted gamma, vs the oracle;
   and the residual against the training loss on equal footing -- each judged on gradient seeds
   its draws are independent of (cross-fitted seed halves) -- beside the inflated shared-draw
   figure, and the attainable (cross-fitted) oracle beside the in-sample one.
3. Throughput: anchors per second of cross-anchor batched scoring vs the prototype's one anchor at a
   time vs a naive loop that re-encodes the conditioning for every sample.
4. Demo: wall time of `python main.py job=residual_audit` from an empty cache and fully cached.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from benchlib import REPO, default_policy, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.audit.alignment import cross_fitted_baseline
from vlaeval.audit.statistics import (
    information_to_baseline_ratio,
    oracle_ratio,
    proposal_distribution,
)
from vlaeval.jobs.residual_audit import where_the_noise_is
from vlaeval.policy.flow import FlowConvention
from vlaeval.residual.artifact import cached_gradient_artifact, per_seed_values, recover_anchors
from vlaeval.residual.estimators import UNBIASED, draw_pairs, score_anchors


def ratio_for(scores, r, gamma, alpha=0.2, eps=0.1):
    return float(
        information_to_baseline_ratio(
            r, proposal_distribution(scores, alpha=alpha, percentile_epsilon=eps, proposal_power=gamma)
        )
    )


def cross_fitted_ratio(scores, r, grid, splits=200, seed=0):
    """Choose gamma on a random half of the anchors, evaluate the ratio on the other half."""
    rng = np.random.default_rng(seed)
    held_out, chosen = [], []
    for _ in range(splits):
        perm = rng.permutation(scores.size)
        a, b = perm[: scores.size // 2], perm[scores.size // 2 :]
        best = min(grid, key=lambda g: ratio_for(scores[a], r[a], g))
        chosen.append(best)
        held_out.append(ratio_for(scores[b], r[b], best) / ratio_for(scores[b], r[b], 0.0))  # relative to uniform on b
    return float(np.mean(held_out)), float(np.median(chosen))


def naive_loop(policy, anchors, index, seeds, m):
    """Re-encode the conditioning for every single (seed, sample) evaluation."""
    model, flow = policy.model, policy.flow
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    out = np.empty((len(seeds), index.size))
    draws = [draw_pairs("sobol", seed, index.size, m, chunk, flow) for seed in seeds]
    with torch.no_grad():
        for a, anchor in enumerate(index):
            batch = policy.anchor_batch(anchors, np.array([anchor]))
            for s in range(len(seeds)):
                t, noise = draws[s][0][a], draws[s][1][a]  # the same draws as the batched path
                total = 0.0
                for j in range(m):
                    tt = torch.tensor([t[j]], dtype=torch.float32)
                    nn_ = torch.from_numpy(noise[j : j + 1].astype(np.float32))
                    convention = FlowConvention.of(flow)
                    x_t = convention.noisy(batch["target_actions"], nn_, tt)
                    v = model.velocity(model.encode(batch), x_t, tt)
                    total += float(convention.per_sample_loss(v, batch["target_actions"], nn_, batch["target_mask"])[0])
                out[s, a] = total / m
    return out


def print_proposal(proposal, gamma_star, fair) -> None:
    print(
        f"2. proposal (default estimator's scores): ratio gamma=1 {proposal['gamma_1']:.3f}, gamma=1/2 "
        f"{proposal['gamma_half']:.3f}, cross-fitted {proposal['cross_fitted_relative_to_uniform']:.3f} "
        f"(median gamma {gamma_star}), in-sample oracle {proposal['oracle']:.3f}; reference score gamma=1 "
        f"{proposal['reference_score_gamma_1']:.3f}, gamma=1/2 {proposal['reference_score_gamma_half']:.3f}"
    )
    print(
        f"   on equal footing ({fair['seeds_per_half']} gradient seeds per half, two folds): residual rho "
        f"{fair['residual']['spearman']:.3f} ratio {fair['residual']['second_moment_ratio']:.3f}; training loss on "
        f"independent draws rho {fair['training_loss']['spearman']:.3f} ratio {fair['training_loss']['second_moment_ratio']:.3f}; "
        f"on shared draws (inflated) rho {fair['training_loss_shared_draws']['spearman']:.3f} ratio "
        f"{fair['training_loss_shared_draws']['second_moment_ratio']:.3f}; attainable oracle "
        f"{fair['attainable_oracle_ratio']:.3f}; residual - loss: rho {fair['spearman_difference']:+.3f} "
        f"{fair['spearman_difference_ci95']}, ratio {fair['second_moment_ratio_difference']:+.3f} "
        f"{fair['second_moment_ratio_difference_ci95']}; beats the loss: {fair['score_beats_training_loss']}"
    )


def estimator_body(rows, timing, demo, anchors: int, replicates: int) -> str:
    """The estimator table, the scoring throughput and the demo's wall time."""
    table = markdown_table(
        ["estimator (head evaluations per anchor)", "unbiased", "relative bias", "variance factor vs iid 32",
         "split-half repeatability", "Spearman with the reference", "Spearman with gradient RMS"],
        [
            (label, "yes" if row["unbiased"] else "**no**", f"{row['relative_bias']:+.3f}",
             f"{row['variance_factor_over_iid_32']:.2f}", f"{row['split_half_repeatability']:.3f}",
             f"{row['spearman_with_reference']:.3f}", f"{row['spearman_with_gradient_rms']:.3f}")
            for label, row in rows.items()
        ],
    )  # fmt: skip
    speed = markdown_table(["scoring", "anchors/s"], [(name, f"{value:,.1f}") for name, value in timing.items()])
    text = (
        f"The default audit's {anchors} anchors, {replicates} replicate seed sets per estimator; the reference is iid "
        "with 1,024 head evaluations per anchor. The variance factor is iid-with-32-evaluations' variance over "
        "the estimator's (above 1: less variance).\n\n" + table + "\n\nScoring throughput, the default settings and "
        "the prototype's, against one anchor at a time and a loop that re-encodes per sample:\n\n" + speed
    )
    if demo:
        text += "\n\n`make demo` wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in demo.items()) + "."
    return text


def write_proposal_figures(proposal, gamma_star, fair, anchors: int) -> None:
    """docs/figures/residual_audit_proposal.md: why gamma = 1/2 is the default proposal power."""
    rows = [
        ("residual, gamma = 1 (the raw score)", f"{proposal['gamma_1']:.3f}"),
        ("residual, gamma = 1/2 (the default)", f"{proposal['gamma_half']:.3f}"),
        (
            f"residual, cross-fitted gamma (median {gamma_star}), relative to uniform",
            f"{proposal['cross_fitted_relative_to_uniform']:.3f}",
        ),
        ("training loss on independent draws, gamma = 1/2", f"{fair['training_loss']['second_moment_ratio']:.3f}"),
        ("attainable oracle (built on one half of the gradient seeds)", f"{fair['attainable_oracle_ratio']:.3f}"),
        ("in-sample oracle", f"{proposal['oracle']:.3f}"),
    ]
    decomposition = proposal.get("noise_decomposition")
    noise = ""
    if decomposition is not None:
        shares, oracles = decomposition["variance_shares"], decomposition["oracle_ratios"]
        by_bin = decomposition["second_moment_by_time_bin"]
        noise = (
            "\n\n**Where the gradient's noise is** (the audit's `noise_decomposition`, "
            f"`vlaeval/audit/decomposition.py`): the {decomposition['draws']} draws x {decomposition['anchors']} anchors "
            f"of squared per-sample gradient norms in {decomposition['bins']} flow-time bins (equal probability "
            "under the training distribution). Share of their variance, and the second-moment ratio of the "
            "oracle proposal over each axis:\n\n"
            + markdown_table(
                ["part", "share of the variance", "oracle ratio over it"],
                [
                    ("anchor", f"{shares['anchor']:.3f}", ratio_or_dash(oracles["anchor"])),
                    ("flow time", f"{shares['flow_time']:.3f}", ratio_or_dash(oracles["flow_time"])),
                    (
                        "their interaction (its oracle: over both axes)",
                        f"{shares['interaction']:.3f}",
                        ratio_or_dash(oracles["anchor_and_flow_time"]),
                    ),
                    ("the rest (noise within a cell)", f"{shares['rest']:.3f}", "-"),
                ],
            )
            + "\n\nShare of the second moment per flow-time bin, from the lowest quantile level of flow time to "
            "the highest: " + ", ".join(f"{x:.3f}" for x in by_bin) + "."
        )
    write_figures(
        "residual_audit_proposal",
        "The audit's proposal: second-moment ratio against uniform sampling",
        "python benchmarks/residual_audit.py --proposal-only",
        f"The default audit's {anchors} anchors and gradient artifact, the default estimator's scores; the "
        "second moment of the importance-weighted gradient under each proposal, as a ratio to uniform "
        "sampling's (below 1: a better proposal).\n\n"
        + markdown_table(["proposal", "ratio to uniform"], rows)
        + "\n\nThe residual against the training loss on equal footing (`alignment.baseline_comparison`: "
        f"{fair['seeds_per_half']} gradient seeds per half, two folds, each score judged on the half its draws "
        "are independent of), and the loss on the very draws its gradient RMS came from:\n\n"
        + markdown_table(
            ["score", "Spearman with gradient RMS", "second-moment ratio"],
            [
                (label, f"{fair[key]['spearman']:.3f}", f"{fair[key]['second_moment_ratio']:.3f}")
                for label, key in (
                    ("residual", "residual"),
                    ("training loss, independent draws", "training_loss"),
                    ("training loss, shared draws (inflated)", "training_loss_shared_draws"),
                )
            ],
        )
        + f"\n\nResidual minus loss: Spearman {fair['spearman_difference']:+.3f} "
        f"[{fair['spearman_difference_ci95'][0]:+.3f}, {fair['spearman_difference_ci95'][1]:+.3f}], ratio "
        f"{fair['second_moment_ratio_difference']:+.3f} [{fair['second_moment_ratio_difference_ci95'][0]:+.3f}, "
        f"{fair['second_moment_ratio_difference_ci95'][1]:+.3f}] (95% paired bootstrap over anchors): "
        f"**{fair['verdict']}**." + noise,
    )


def ratio_or_dash(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicates", type=int, default=20)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument(
        "--proposal-only", action="store_true", help="section 2 only (no estimator replicates, timing, demo)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "residual_audit.json")
    args = parser.parse_args()
    cfg, data, handle = default_policy()
    metadata, artifact = cached_gradient_artifact(
        cfg.gradients, cfg.flow, str(cfg.device), str(cfg.paths.cache_dir), data, handle
    )
    index = recover_anchors(data.demonstrations, data.anchors, artifact, metadata["dataset_sha256"], metadata["path"])
    r = np.array([a["gradient_rms"] for a in artifact])
    policy = data.bind(handle.model, cfg.flow)
    score = lambda kind, seeds, m, batch=64: score_anchors(  # noqa: E731
        policy,
        data.anchors,
        index,
        kind=kind,
        seeds=seeds,
        samples_per_estimator=m,
        anchor_batch_size=batch,
    )

    reference = score("iid", list(range(90_000, 90_004)), 256).estimator_residuals.mean(axis=0)  # 1024 per anchor
    rows = {}
    configs = (
        (
            [(k, 8, 4) for k in ("iid", "midpoint_antithetic", "stratified", "sobol")]
            + [("iid", 32, 4), ("iid", 128, 4), ("sobol", 64, 4)]
        )
        if not args.proposal_only
        else []
    )
    for kind, m, n_seeds in configs:
        label = f"{kind} ({m * n_seeds} evals)"
        reps = [
            score(kind, list(range(1000 + 100 * i, 1000 + 100 * i + n_seeds)), m).estimator_residuals
            for i in range(args.replicates)
        ]
        means = np.array([x.mean(axis=0) for x in reps])  # (R, anchors)
        split = [spearmanr(x[: n_seeds // 2].mean(0), x[n_seeds // 2 :].mean(0)).statistic for x in reps]
        rows[label] = {
            "kind": kind,
            "unbiased": UNBIASED[kind],
            "head_evaluations_per_anchor": m * n_seeds,
            "relative_bias": float(np.mean((means.mean(axis=0) - reference) / reference)),
            "variance": means.var(axis=0, ddof=1),
            "split_half_repeatability": float(np.mean(split)),
            "spearman_with_reference": float(np.mean([spearmanr(x, reference).statistic for x in means])),
            "spearman_with_gradient_rms": float(np.mean([spearmanr(x, r).statistic for x in means])),
        }
    for row in rows.values():
        row["variance_factor_over_iid_32"] = float(np.mean(rows["iid (32 evals)"]["variance"] / row["variance"]))
    for row in rows.values():
        row.pop("variance")

    default_scores = score(
        str(cfg.estimator.kind), [int(s) for s in cfg.estimator.seeds], int(cfg.estimator.samples_per_estimator)
    ).estimator_residuals.mean(axis=0)
    grid = [round(g, 2) for g in np.arange(0.0, 1.55, 0.05)]
    cross, gamma_star = cross_fitted_ratio(default_scores, r, grid)
    proposal = {
        "gamma_1": ratio_for(default_scores, r, 1.0),
        "gamma_half": ratio_for(default_scores, r, 0.5),
        "cross_fitted_relative_to_uniform": cross,
        "cross_fitted_gamma_median": gamma_star,
        "oracle": oracle_ratio(r),
        "reference_score_gamma_1": ratio_for(reference, r, 1.0),
        "reference_score_gamma_half": ratio_for(reference, r, 0.5),
        "training_loss_shared_draws_gamma_half": ratio_for(
            np.array([a["mean_gradient_loss"] for a in artifact]), r, 0.5
        ),
    }
    per_seed_rms, per_seed_loss = per_seed_values(artifact)
    assert per_seed_rms is not None and per_seed_loss is not None, "vlaeval's own artifact carries per-seed values"
    fair = cross_fitted_baseline(
        default_scores,
        per_seed_rms,
        per_seed_loss,
        alpha=float(cfg.audit.alpha),
        percentile_epsilon=float(cfg.audit.percentile_epsilon),
        proposal_power=float(cfg.audit.proposal_power),
        bootstrap_seed=int(cfg.audit.permutation_seed),
    ).as_dict()
    proposal["baseline_comparison"] = fair
    decomposition = where_the_noise_is(cfg, artifact)
    proposal["noise_decomposition"] = None if decomposition is None else decomposition.as_dict()
    if args.proposal_only:
        print_proposal(proposal, gamma_star, fair)
        atomic_write_json(args.out.with_name("residual_audit_proposal.json"), {"proposal": proposal})
        write_proposal_figures(proposal, gamma_star, fair, len(r))
        return

    seeds4, m8 = [int(s) for s in cfg.estimator.seeds], int(cfg.estimator.samples_per_estimator)
    timing = {}
    for name, fn in (
        ("batched (64 anchors per pass)", lambda: score(str(cfg.estimator.kind), seeds4, m8, 64)),
        ("one anchor at a time (the prototype)", lambda: score(str(cfg.estimator.kind), seeds4, m8, 1)),
        (
            "naive: re-encode per sample",
            lambda: naive_loop(policy, data.anchors, index, seeds4, m8),
        ),
    ):
        fn()  # warm-up
        started = time.perf_counter()
        fn()
        timing[name] = index.size / (time.perf_counter() - started)
    # the prototype's own settings: 4 seeds x M = 8, where one anchor per pass is a batch of only 32
    for name, batch in (
        ("batched, prototype settings (M=8)", 64),
        ("one anchor at a time, prototype settings (M=8)", 1),
    ):
        score(str(cfg.estimator.kind), seeds4, 8, batch)
        started = time.perf_counter()
        score(str(cfg.estimator.kind), seeds4, 8, batch)
        timing[name] = index.size / (time.perf_counter() - started)
    demo = {}
    if not args.skip_demo:
        with tempfile.TemporaryDirectory() as tmp:
            env = {
                **os.environ,
                "VLAEVAL_CACHE_DIR": f"{tmp}/cache",
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
            }
            for label in ("cold (empty cache, new MLflow store)", "warm (everything cached)"):
                started = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, str(REPO / "main.py"), "job=residual_audit"],
                    cwd=tmp,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                demo[label] = time.perf_counter() - started
                assert proc.returncode == 0, proc.stderr[-2000:]

    print(
        f"1. estimator quality on {index.size} anchors, {args.replicates} replicate seed sets, "
        "reference = iid with 1024 evaluations per anchor"
    )
    print(
        f"   {'estimator':34s} {'unbiased':>8s} {'rel.bias':>9s} {'var.factor':>10s} {'split-half':>10s} "
        f"{'rho(ref)':>9s} {'rho(grad)':>9s}"
    )
    for label, row in rows.items():
        print(
            f"   {label:34s} {str(row['unbiased']):>8s} {row['relative_bias']:+9.3f} "
            f"{row['variance_factor_over_iid_32']:10.2f} {row['split_half_repeatability']:10.3f} "
            f"{row['spearman_with_reference']:9.3f} {row['spearman_with_gradient_rms']:9.3f}"
        )
    print_proposal(proposal, gamma_star, fair)
    t = timing
    print(
        f"3. throughput (anchors/s), default settings ({len(seeds4)} seeds x M={m8}): batched {t['batched (64 anchors per pass)']:.0f}, "
        f"one anchor at a time {t['one anchor at a time (the prototype)']:.0f} "
        f"({t['batched (64 anchors per pass)'] / t['one anchor at a time (the prototype)']:.1f}x), naive re-encode per sample "
        f"{t['naive: re-encode per sample']:.1f} ({t['batched (64 anchors per pass)'] / t['naive: re-encode per sample']:.0f}x); "
        f"prototype settings (M=8): batched {t['batched, prototype settings (M=8)']:.0f}, one anchor at a time "
        f"{t['one anchor at a time, prototype settings (M=8)']:.0f} "
        f"({t['batched, prototype settings (M=8)'] / t['one anchor at a time, prototype settings (M=8)']:.1f}x)"
    )
    if demo:
        print("4. demo wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in demo.items()))
    atomic_write_json(
        args.out,
        {"estimators": rows, "proposal": proposal, "throughput_anchors_per_second": timing, "demo_seconds": demo},
    )
    write_proposal_figures(proposal, gamma_star, fair, len(r))
    write_figures(
        "residual_audit",
        "The residual estimators: bias, variance, repeatability, throughput",
        "python benchmarks/residual_audit.py",
        estimator_body(rows, timing, demo, index.size, args.replicates),
    )


if __name__ == "__main__":
    main()
