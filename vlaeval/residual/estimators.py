"""Frozen flow-matching residual estimators.

The residual of an anchor is the expected per-sample flow-matching loss of the frozen policy
under the training distribution of (t, eps). Each estimator draws M (t, eps) pairs per anchor and
estimator seed and averages the losses; they differ in how the pairs are drawn:

    iid                  plain Monte Carlo from the training distribution (unbiased baseline)
    midpoint_antithetic  the prototype's: M/2 fixed midpoint quantiles of the Beta time distribution,
                         each with an antithetic noise pair (eps, -eps). BIASED: fixed midpoints
                         never visit the high-loss ends of t; its low variance comes from fixing t
    stratified           randomly shifted stratification of t (one uniform draw per stratum of the
                         time CDF), iid noise: unbiased
    sobol                randomized QMC: scrambled Sobol' points (an aligned block of M per anchor)
                         through the time quantile and the normal quantile for the noise: unbiased

Scoring is batched across anchors: one conditioning encode per anchor, shared by all M x seeds
action-head evaluations, and the head evaluated for `anchor_batch_size` anchors at once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, TypedDict

import numpy as np
import torch
from scipy.stats import norm, qmc

from vlaeval.artifacts import stable_seed
from vlaeval.data.anchors import AnchorSet
from vlaeval.policy.bound import BoundPolicy
from vlaeval.policy.flow import FlowConvention
from vlaeval.policy.protocol import map_tensors, uses_loss_level

UNBIASED = {"iid": True, "midpoint_antithetic": False, "stratified": True, "sobol": True}
DESCRIPTIONS = {
    "iid": ["plain Monte Carlo over the training distribution of (t, eps)"],
    "midpoint_antithetic": [
        "deterministic midpoint stratification of Beta flow time (biased: fixed t)",
        "paired antithetic Gaussian noise",
    ],
    "stratified": ["randomly shifted stratification of the flow-time CDF (unbiased)", "iid Gaussian noise"],
    "sobol": ["scrambled Sobol' points for flow time and noise (randomized QMC, unbiased)"],
}


DRAW_BLOCK = 1024  # anchor rows per independent draw stream: a shard regenerates only its own blocks


def draw_pairs(
    kind: str, seed: int, anchors: int, m: int, chunk_shape: tuple, flow: Any, first_row: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(t of shape (anchors, m), noise of shape (anchors, m, *chunk_shape)) for one estimator seed,
    rows first_row .. first_row + anchors - 1 of the seed's draws: row i always gets the same
    draws, whatever the batching or the shard (rows come in blocks of DRAW_BLOCK, each block from
    its own stream, so a shard of a million anchors never draws the rows before it)."""
    first, k = int(first_row), int(anchors)
    blocks = range(first // DRAW_BLOCK, (first + k - 1) // DRAW_BLOCK + 1) if k > 0 else range(0)
    parts = [_block_draws(kind, int(seed), b, m, int(np.prod(chunk_shape))) for b in blocks]
    offset = first - (blocks[0] * DRAW_BLOCK if k > 0 else 0)
    u = np.concatenate([p[0] for p in parts])[offset : offset + k] if parts else np.empty((0, m))
    noise = np.concatenate([p[1] for p in parts])[offset : offset + k] if parts else np.empty((0, m, 1))
    return FlowConvention.of(flow).time_quantile(np.asarray(u)), noise.reshape(k, m, *chunk_shape)


def _block_draws(kind: str, seed: int, block: int, m: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantile levels u (DRAW_BLOCK, m) and noise (DRAW_BLOCK, m, d) of one block of rows."""
    key = ("residual", kind, seed) if block == 0 else ("residual", kind, seed, block)
    rng = np.random.default_rng(stable_seed(*key))
    k = DRAW_BLOCK
    if kind == "iid":
        u = rng.random((k, m))
        noise = rng.standard_normal((k, m, d))
    elif kind == "midpoint_antithetic":
        half = m // 2
        u = np.broadcast_to(np.repeat((np.arange(half) + 0.5) / half, 2), (k, m))
        eps = rng.standard_normal((k, half, 1, d))
        noise = np.concatenate([eps, -eps], axis=2).reshape(k, m, d)
    elif kind == "stratified":
        u = (np.arange(m)[None, :] + rng.random((k, m))) / m
        noise = rng.standard_normal((k, m, d))
    elif kind == "sobol":
        # One scrambled Sobol' sequence per block; row i takes the aligned block of m points
        # i*m .. (i+1)*m - 1, itself a scrambled net when m is a power of two. Every point is
        # uniform, so the estimate is unbiased, while each row stays balanced. bits=64: points at
        # full double precision (scipy's default of 30 bits leaves them on a 2^-30 lattice).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # balance warnings when m is not a power of two
            points = qmc.Sobol(d=d + 1, scramble=True, seed=rng, bits=64).random(k * m).reshape(k, m, d + 1)
        u = points[..., 0]
        noise = norm.ppf(np.clip(points[..., 1:], 1e-12, 1 - 1e-12))
    else:
        raise ValueError(f"unknown estimator kind {kind!r}; use one of {sorted(UNBIASED)}")
    return np.asarray(u), noise


@dataclass
class ResidualScores:
    estimator_residuals: np.ndarray  # (seeds, anchors): mean loss per estimator seed
    sample_losses: np.ndarray  # (seeds, anchors, M)
    time_values: np.ndarray  # (seeds, anchors, M)
    head_evaluations: int


def _per_draw(x: Any, seeds: int, samples: int) -> Any:
    """Rows of x (one per anchor; a tensor, or a nest of them: a batch, a conditioning) repeated for
    every (seed, sample) draw, seed-major: (s*b*m, ...)."""

    def rows(v: torch.Tensor) -> torch.Tensor:
        b = v.shape[0]
        return v[None, :, None].expand(seeds, b, samples, *v.shape[1:]).reshape(seeds * b * samples, *v.shape[1:])

    return map_tensors(rows, x)


@torch.no_grad()
def validate_estimator_config(e: Any) -> None:
    """The estimator section, checked before any work (the audit and the ablation score alike)."""
    from vlaeval.errors import require, require_at_least

    m = int(e.samples_per_estimator)
    require(m >= 2 and m % 2 == 0, f"estimator.samples_per_estimator={m} must be an even number >= 2")
    seeds = [int(s) for s in e.seeds]
    require(
        len(seeds) >= 4 and len(seeds) % 2 == 0,
        f"estimator.seeds has {len(seeds)} seeds; give an even number >= 4 (split-half repeatability)",
    )
    duplicated = sorted({s for s in seeds if seeds.count(s) > 1})
    require(not duplicated, f"estimator.seeds repeats {duplicated}; estimator seeds must be unique")
    require_at_least("estimator.anchor_batch_size", e.anchor_batch_size, 1)


class EstimatorArguments(TypedDict):
    """The estimator section as score_anchors' keyword arguments (mypy checks them against it)."""

    kind: str
    seeds: List[int]
    samples_per_estimator: int
    anchor_batch_size: int


def estimator_arguments(e: Any) -> EstimatorArguments:
    """score_anchors' keyword arguments from the estimator section (`cfg.estimator`)."""
    return {
        "kind": str(e.kind),
        "seeds": [int(s) for s in e.seeds],
        "samples_per_estimator": int(e.samples_per_estimator),
        "anchor_batch_size": int(e.anchor_batch_size),
    }


def score_anchors(
    policy: BoundPolicy,
    anchors: AnchorSet,
    anchor_index: np.ndarray,
    *,
    kind: str,
    seeds: Sequence[int],
    samples_per_estimator: int,
    anchor_batch_size: int,
    progress: Optional[Callable[[int, int], None]] = None,
    first_row: int = 0,
) -> ResidualScores:
    """Residuals of `anchor_index` under each estimator seed; the k-th anchor listed takes draw row
    first_row + k (job=score's shards pass their first anchor, so shards equal one whole run)."""
    model: Any = policy.model.eval()  # any module of the FlowMatchingPolicy protocol
    convention, device = policy.flow, policy.device
    s, m, k = len(seeds), int(samples_per_estimator), anchor_index.size
    chunk = (anchors.horizon, anchors.target_actions.shape[-1])
    draws = [draw_pairs(kind, seed, k, m, chunk, convention, first_row) for seed in seeds]
    t_all = torch.from_numpy(np.stack([d[0] for d in draws]).astype(np.float32))  # (s, k, m)
    noise_all = torch.from_numpy(np.stack([d[1] for d in draws]).astype(np.float32))  # (s, k, m, H, A)
    losses = np.empty((s, k, m))
    with torch.no_grad():  # scoring only: no graph is kept, whatever the parameters' requires_grad
        for start in range(0, k, int(anchor_batch_size)):
            stop = min(start + int(anchor_batch_size), k)
            b = stop - start
            batch = policy.anchor_batch(anchors, anchor_index[start:stop])
            t = t_all[:, start:stop].reshape(-1).to(device)
            noise = noise_all[:, start:stop].reshape(-1, *chunk).to(device)
            if uses_loss_level(model):  # the policy's own loss, on every draw's row
                loss = model.loss(_per_draw(batch, s, m), noise, t)
            else:
                conditioning = model.encode(batch)  # once per anchor, shared by all seeds and samples
                actions, mask = _per_draw(batch["target_actions"], s, m), _per_draw(batch["target_mask"], s, m)
                velocity = model.velocity(_per_draw(conditioning, s, m), convention.noisy(actions, noise, t), t)
                loss = convention.per_sample_loss(velocity, actions, noise, mask)
            losses[:, start:stop] = loss.reshape(s, b, m).double().cpu().numpy()
            if progress is not None:
                progress(stop, k)
    return ResidualScores(losses.mean(axis=2), losses, t_all.double().numpy(), head_evaluations=s * k * m)


COUNTED_ANCHORS = 64  # anchors whose scoring is counted; every anchor's scoring costs what any other's does


def scoring_gflop(policy: BoundPolicy, anchors: AnchorSet, arguments: EstimatorArguments) -> float:
    """The work of scoring every anchor of `anchors` once (the estimator's `arguments`), in GFLOP:
    counted on the first COUNTED_ANCHORS anchors' scoring and scaled to all of them."""
    from vlaeval.policy.threads import gflop_of

    counted = np.arange(min(len(anchors), COUNTED_ANCHORS))
    work = gflop_of(lambda: score_anchors(policy, anchors, counted, **arguments))
    return float(work * len(anchors) / counted.size)
