"""The residual audit's figures: score vs gradient RMS, permutation nulls, leave-one-out and the
per-anchor spread across estimator seeds; where the gradient's noise is; the ablation's."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlaeval.artifacts import atomic_write_bytes
from vlaeval.audit.alignment import Alignment
from vlaeval.audit.decomposition import NoiseDecomposition
from vlaeval.audit.result import AblationResult
from vlaeval.audit.statistics import LeaveOneOut


def plot_audit(
    score: np.ndarray,
    gradient_rms: np.ndarray,
    matrix: np.ndarray,
    alignment: Alignment,
    robustness: LeaveOneOut,
    path: Path,
) -> Path:
    """The audit's six panels; the permutation nulls come from `alignment` (alignment_audit with
    keep_null_distributions=True: they are plotted, never saved)."""
    null = alignment.random_permutation_control
    null_spearman = null.null_spearman if null.null_spearman is not None else np.array([])
    null_ratio = null.null_second_moment if null.null_second_moment is not None else np.array([])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    rho = alignment.spearman_residual_vs_gradient_rms
    ax[0, 0].loglog(score, gradient_rms, "o", markersize=4)
    ax[0, 0].set(xlabel="residual score", ylabel="gradient RMS", title=f"score vs gradient RMS (Spearman {rho:.3f})")
    ax[0, 1].hist(null_spearman, bins=60, color="grey")
    ax[0, 1].axvline(rho, color="red", label=f"observed {rho:.3f}")
    ax[0, 1].set(title="permutation null: Spearman", xlabel="Spearman")
    ax[0, 1].legend()
    ratio = alignment.proposal.information_to_baseline_ratio
    ax[0, 2].hist(null_ratio, bins=60, color="grey")
    ax[0, 2].axvline(ratio, color="red", label=f"observed {ratio:.3f}")
    ax[0, 2].axvline(alignment.proposal.oracle_ratio, color="green", linestyle="--", label="in-sample oracle")
    if alignment.proposal.attainable_oracle_ratio is not None:
        ax[0, 2].axvline(
            alignment.proposal.attainable_oracle_ratio,
            color="green",
            linestyle=":",
            label="attainable oracle (cross-fitted)",
        )
    ax[0, 2].set(title="permutation null: second-moment ratio", xlabel="ratio (1 = uniform)")
    ax[0, 2].legend()
    ax[1, 0].plot(robustness.spearman, ".")
    ax[1, 0].axhline(0, color="black", linewidth=1)
    ax[1, 0].set(title="leave-one-out Spearman", xlabel="anchor left out")
    ax[1, 1].plot(robustness.second_moment_ratios, ".")
    ax[1, 1].axhline(1, color="black", linewidth=1)
    ax[1, 1].set(title="leave-one-out second-moment ratio", xlabel="anchor left out")
    order = np.argsort(score)
    ax[1, 2].errorbar(np.arange(score.size), score[order], yerr=matrix.std(axis=0, ddof=1)[order], fmt=".", capsize=2)
    ax[1, 2].set(
        yscale="log",
        title="per-anchor spread across estimator seeds",
        xlabel="anchor (sorted by score)",
        ylabel="residual",
    )
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
    plt.close(fig)
    return path


def plot_ablation(result: AblationResult, path: Path) -> Path:
    """Left: held-out flow-matching loss along fine-tuning per proposal (mean and the range across
    seeds). Right: realized second-moment ratio per proposal at each measured step (mean and 95%
    interval across seeds) against the audit's prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(13, 5))
    names = list(result.summary)
    colors = {name: f"C{k}" for k, name in enumerate(names)}
    for name in names:
        curves = [r.heldout_loss for r in result.runs if r.proposal == name and r.heldout_loss]
        if curves:
            steps = np.array([s for s, _ in curves[0]])
            values = np.array([[v for _, v in c] for c in curves])
            ax[0].plot(steps, values.mean(axis=0), color=colors[name], label=name)
            ax[0].fill_between(steps, values.min(axis=0), values.max(axis=0), color=colors[name], alpha=0.2)
    ax[0].set(title="held-out flow-matching loss (band: range across seeds)", xlabel="fine-tuning step", ylabel="loss")
    if ax[0].has_data():
        ax[0].legend()
    offset = np.linspace(-0.25, 0.25, len(names)) if len(names) > 1 else np.zeros(1)
    measured = result.measure_steps
    for k, name in enumerate(names):
        cells = result.summary[name].realized_ratio
        mean = np.array([cells[str(s)]["mean"] for s in measured])
        low = np.array([cells[str(s)]["low"] for s in measured])
        high = np.array([cells[str(s)]["high"] for s in measured])
        x = np.arange(len(measured)) + offset[k]
        ax[1].errorbar(x, mean, yerr=[mean - low, high - mean], fmt="o", capsize=3, color=colors[name], label=name)
    ax[1].axhline(1.0, color="black", linewidth=1)
    ax[1].axhline(result.prediction.predicted_ratio, color="red", linestyle="--", label="audit's prediction (residual)")
    ax[1].set_xticks(np.arange(len(measured)), [str(s) for s in measured])
    ax[1].set(title="realized second-moment ratio vs uniform (95% across seeds)", xlabel="step", ylabel="ratio")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
    plt.close(fig)
    return path


def plot_noise_decomposition(decomposition: NoiseDecomposition, path: Path) -> Path:
    """Where the gradient's noise is: the uniform second moment's share per flow-time bin, and the
    variance shares with each axis's oracle ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    k = decomposition.bins
    ax[0].bar(np.arange(k), decomposition.second_moment_by_time_bin, color="tab:blue")
    ax[0].axhline(1.0 / k, color="grey", linestyle="--", label="uniform share")
    ax[0].set(
        xlabel="flow-time bin (equal probability under training; noise rises with the bin)",
        ylabel="share of the second moment",
        title="gradient second moment by flow time",
    )
    ax[0].legend()
    shares = decomposition.variance_shares
    oracles = decomposition.oracle_ratios
    names = ["anchor", "flow_time", "interaction", "rest"]
    ax[1].bar(names, [shares[n] for n in names], color=["tab:orange", "tab:blue", "tab:purple", "tab:grey"])
    note = "best proposal's ratio to uniform\n" + "\n".join(
        f"over {name.replace('_', ' ')}: {value:.3f}" for name, value in oracles.items() if value is not None
    )
    ax[1].text(0.98, 0.95, note, transform=ax[1].transAxes, ha="right", va="top", fontsize=9)
    ax[1].set(ylabel="share of Var(squared gradient norm)", title="what explains the per-sample gradient's size")
    fig.tight_layout()
    atomic_write_bytes(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
    plt.close(fig)
    return path
