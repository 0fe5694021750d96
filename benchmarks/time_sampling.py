"""Which signal should the adaptive flow-time sampler track? Measured on the built-in policy's own
per-sample gradients: the second-moment ratio (against drawing flow time from the training
distribution) of flow-time proposals built from exact per-sample gradient norms (the oracle), from
the per-sample loss and from its square -- built on some draws, judged on others -- and of the
proposal the adaptive sampler itself arrived at in a training run.

    python benchmarks/time_sampling.py [--cache-dir .cache/vlaeval]

Per policy (the default checkpoint, 3,000 steps, and an early one, 300 steps): every anchor's exact
per-sample squared gradient norm (all parameters) and loss under `--build` flow draws each (the
proposals are built from these) and `--judge` other draws (they are judged on these only), then
M_q / M_uniform per proposal (vlaeval.audit.proposals.per_sample_second_moment) and the share of
the uniform second moment in each tenth of the noise level. Results in
benchmarks/results/time_sampling.json, docs/figures/time_sampling.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Dict, List

import numpy as np
from omegaconf import OmegaConf

from benchlib import REPO, default_policy, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.audit.proposals import Proposal, per_sample_second_moment, time_bin, time_bin_probabilities
from vlaeval.policy.builtin import PolicySpec, build_model
from vlaeval.policy.training import train_policy
from vlaeval.residual.ablation import AnchorGradients, anchor_gradients

POLICIES = {"default (3,000 steps)": [], "early (300 steps)": ["train.steps=300"]}
SIGNALS = ("oracle: exact gradient norms", "loss", "squared loss")


def gradients(policy: Any, anchors: Any, role: str, draws: int) -> AnchorGradients:
    keys = [("time-sampling-bench", role, k) for k in range(draws)]
    return anchor_gradients(policy, anchors, trainable="all", draw_keys=keys, batch_size=1024)


def built_proposals(build: AnchorGradients, bins: int, floor: float) -> Dict[str, np.ndarray]:
    n = build.sq_norms.shape[1]
    q = np.full(n, 1.0 / n)
    signals = {SIGNALS[0]: build.sq_norms, SIGNALS[1]: build.losses, SIGNALS[2]: build.losses**2}
    return {name: time_bin_probabilities(s, build.u, q, bins=bins, alpha=floor) for name, s in signals.items()}


def ratio(judge: AnchorGradients, p: np.ndarray) -> float:
    n = judge.sq_norms.shape[1]
    uniform = per_sample_second_moment(judge.sq_norms, judge.u, Proposal("uniform", np.full(n, 1.0 / n)))
    return per_sample_second_moment(judge.sq_norms, judge.u, Proposal("p", np.full(n, 1.0 / n), p)) / uniform


def noise_tenths(judge: AnchorGradients) -> List[float]:
    """The share of the uniform second moment in each tenth of the quantile level (noise rising with u)."""
    k = time_bin(judge.u, 10).ravel()
    per = np.bincount(k, weights=judge.sq_norms.ravel(), minlength=10)
    return (per / per.sum()).tolist()


def adaptive_run(cfg: Any, data: Any, bins: int, floor: float) -> Dict[str, Any]:
    """Train the same recipe from its initialisation with train.time_sampling=adaptive; its policy and
    the sampler's final probabilities."""
    train = OmegaConf.merge(
        cfg.train, {"time_sampling": "adaptive", "time_bins": bins, "time_floor": floor, "log_every": 100}
    )
    spec = PolicySpec(cfg.model, cfg.data, cfg.flow, train)
    model = build_model(spec, data)
    metrics = train_policy(data.bind(model, cfg.flow), data.anchors, train)
    assert metrics.time_sampling is not None, "trained with the adaptive sampler"
    return {
        "policy": data.bind(model, cfg.flow),
        "probabilities": np.asarray(metrics.time_sampling["probabilities"]),
    }


def measure(args: argparse.Namespace) -> List[Dict[str, Any]]:
    rows = []
    extra = [f"paths.cache_dir={args.cache_dir}"] if args.cache_dir else []
    for label, overrides in POLICIES.items():
        started = time.perf_counter()
        cfg, data, handle = default_policy([*overrides, *extra])
        policy = data.bind(handle.model, cfg.flow)
        build = gradients(policy, data.anchors, "build", args.build)
        judge = gradients(policy, data.anchors, "judge", args.judge)
        row: Dict[str, Any] = {"policy": label, "anchors": len(data.anchors), "settings": []}
        for bins, floor in args.settings:
            proposals = built_proposals(build, bins, floor)
            ratios = {name: ratio(judge, p) for name, p in proposals.items()}
            run = adaptive_run(cfg, data, bins, floor)
            own = gradients(run["policy"], data.anchors, "judge", args.judge)
            oracle_own = built_proposals(gradients(run["policy"], data.anchors, "build", args.build), bins, floor)
            ratios["the sampler's own p (loss), on its own run"] = ratio(own, run["probabilities"])
            ratios["oracle, on that run"] = ratio(own, oracle_own[SIGNALS[0]])
            row["settings"].append({"bins": bins, "floor": floor, "ratios": ratios})
        row["noise_tenths"] = noise_tenths(judge)
        row["seconds"] = time.perf_counter() - started
        print(row, flush=True)
        rows.append(row)
    return rows


def figures_body(rows: List[Dict[str, Any]], args: Dict[str, Any]) -> str:
    names = list(rows[0]["settings"][0]["ratios"])
    table = markdown_table(
        ["policy", "bins, floor", *names],
        [
            (r["policy"], f"{s['bins']}, {s['floor']}", *(f"{s['ratios'][n]:.3f}" for n in names))
            for r in rows
            for s in r["settings"]
        ],
    )
    tenths = markdown_table(
        ["policy", *(f"{10 * k}-{10 * k + 10}%" for k in range(10))],
        [(r["policy"], *(f"{x:.1%}" for x in r["noise_tenths"])) for r in rows],
    )
    return (
        f"Every anchor of the built-in data ({rows[0]['anchors']:,}), exact per-sample gradient norms over all "
        f"parameters; proposals built on {args['build']} flow draws per anchor and judged on {args['judge']} others. "
        "Each cell is the minibatch gradient's per-sample second moment under that flow-time proposal divided by "
        "the training distribution's (uniform anchors in both; lower is better, 1 is no gain). The last two "
        "columns train the same recipe from its initialisation with `train.time_sampling=adaptive` "
        "(`time_signal=loss`) and judge, on that run's final policy, the probabilities the sampler ended with "
        "and the oracle built from that policy's own gradients.\n\n"
        + table
        + "\n\nWhere the noise is: the share of the uniform second moment in each tenth of the noise level "
        "(the quantile level u of the training distribution; 0-10% is the least noisy):\n\n" + tenths
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None, help="the built-in checkpoints' cache (default: the config's)")
    parser.add_argument("--build", type=int, default=8)
    parser.add_argument("--judge", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "time_sampling.json"))
    args = parser.parse_args()
    args.settings = [(16, 0.2), (10, 0.1)]
    rows = measure(args)
    atomic_write_json(args.out, {"rows": rows, "build": args.build, "judge": args.judge})
    write_figures(
        "time_sampling",
        "Adaptive flow-time sampling: which signal",
        "python benchmarks/time_sampling.py",
        figures_body(rows, {"build": args.build, "judge": args.judge}),
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
