"""Where training draws flow time: the training distribution itself, or an adaptive proposal over its
quantile level that spends the minibatch where the gradient is noisiest.

Flow time is drawn through its quantile level u (t = FlowConvention.time_quantile(u)), as the audit's
proposals are (vlaeval/audit/proposals.py): u uniform is the training distribution. The adaptive
sampler splits u into K equal-probability bins, draws bin k with probability p_k and u uniformly
inside it, and weights the sample's loss by rho(u) = (1 / K) / p_k, so that the expected weighted
loss -- and its gradient -- is the training objective's, whatever p is:

    E_p[rho(u) l(t(u))] = sum_k p_k (1 / K) / p_k E[l | k] = E_uniform[l(t(u))].

p is a function of earlier steps only (refreshed after each step), so each step's weighted gradient
is unbiased given the past.

Which p: the minibatch gradient's second moment is sum_k (1 / K)^2 E[||g||^2 | k] / p_k, smallest at
p_k proportional to sqrt(E[||g||^2 | k]) (vlaeval.audit.proposals.time_bin_probabilities). Per-sample
gradient norms cost extra passes; the per-sample loss is free. For the squared velocity error the
gradient with respect to the velocity has ||d l / d v||^2 = 4 l / entries, so E[||g||^2 | k] tracks
E[l | k] as far as the network's Jacobian is alike across flow times (`signal=loss`); Improved DDPM
tracks E[l^2 | k] instead (`signal=squared_loss`). benchmarks/time_sampling.py measures both against
the proposal built from exact per-sample gradient norms. Each bin keeps an exponential moving average
of its signal; p mixes sqrt of it with a uniform floor, so no bin's weight exceeds 1 / floor and every
bin keeps being measured. Until every bin has been seen and `warmup_steps` have passed, p is uniform.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import numpy as np

from vlaeval.audit.proposals import time_bin
from vlaeval.choices import TimeSampling, TimeSignal
from vlaeval.errors import require, require_at_least


@dataclass
class AdaptiveTimeSampler:
    """Flow-time quantile levels over `bins` equal-probability bins, with their importance weights.

    bins: K >= 2. decay: the moving average's weight on the past, in [0, 1). floor: the uniform
    mixing in (0, 1] (1 is uniform sampling). warmup_steps: steps of uniform sampling first.
    signal: what each bin tracks (TimeSignal).
    """

    bins: int
    decay: float
    floor: float
    warmup_steps: int
    signal: TimeSignal = TimeSignal.loss
    steps: int = 0
    average: np.ndarray = field(init=False)
    seen: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.signal = TimeSignal.parse(self.signal, "train.time_signal")
        self.average = np.zeros(int(self.bins))
        self.seen = np.zeros(int(self.bins), dtype=bool)

    def probabilities(self) -> np.ndarray:
        """p over the bins for the next draw, shape (K,): positive, summing to 1."""
        k = int(self.bins)
        root = np.sqrt(np.maximum(self.average, 0.0))
        if self.steps < self.warmup_steps or not self.seen.all() or root.sum() <= 0.0:
            return np.full(k, 1.0 / k)
        p = (1.0 - self.floor) * root / root.sum() + self.floor / k
        return p / p.sum()

    def draw(self, rng: np.random.Generator, size: int) -> Tuple[np.ndarray, np.ndarray]:
        """`size` quantile levels u in [0, 1) and their weights rho(u) = (1 / K) / p_k(u)."""
        p = self.probabilities()
        chosen = rng.choice(p.size, size=int(size), p=p)
        u = (chosen + rng.random(int(size))) / p.size
        return u, (1.0 / p.size) / p[chosen]

    def update(self, u: np.ndarray, losses: np.ndarray, anchor_weights: Optional[np.ndarray] = None) -> None:
        """Fold one step's per-sample losses (unweighted by rho) into each bin's average.

        anchor_weights: the anchor part of each sample's importance weight, when anchors are drawn
        from a proposal too: the second moment the flow-time proposal should minimise is that of
        w_anchor * g, so the signal is scaled by w_anchor^2 (w_anchor^4 for squared_loss).
        """
        x = np.asarray(losses, dtype=np.float64)
        if anchor_weights is not None:
            x = x * np.asarray(anchor_weights, dtype=np.float64) ** 2
        if self.signal == TimeSignal.squared_loss:
            x = x**2
        k = time_bin(u, int(self.bins))
        counts = np.bincount(k, minlength=int(self.bins))
        sums = np.bincount(k, weights=x, minlength=int(self.bins))
        hit = counts > 0
        fresh = hit & ~self.seen
        self.average[fresh] = sums[fresh] / counts[fresh]
        old = hit & self.seen
        self.average[old] = self.decay * self.average[old] + (1.0 - self.decay) * (sums[old] / counts[old])
        self.seen |= hit
        self.steps += 1

    def describe(self) -> Dict[str, Any]:
        p = self.probabilities()
        return {
            "sampling": "adaptive",
            "signal": str(self.signal),
            "bins": int(self.bins),
            "probabilities": p.tolist(),
            "max_weight": float((1.0 / p.size) / p.min()),
        }


def time_sampler(train: Any) -> Optional[AdaptiveTimeSampler]:
    """The train section's adaptive sampler, or None for the training distribution itself."""
    if TimeSampling.parse(train.time_sampling, "train.time_sampling") == TimeSampling.uniform:
        return None
    return adaptive_time_sampler(train)


def adaptive_time_sampler(train: Any) -> AdaptiveTimeSampler:
    """A fresh sampler with the train section's train.time_* settings, whatever train.time_sampling says
    (the ablation's adaptive proposals use it)."""
    return AdaptiveTimeSampler(
        bins=int(train.time_bins),
        decay=float(train.time_decay),
        floor=float(train.time_floor),
        warmup_steps=int(train.time_warmup_steps),
        signal=TimeSignal.parse(train.time_signal, "train.time_signal"),
    )


def validate_time_sampling(train: Any) -> None:
    """One-line errors for the adaptive sampler's settings when train.time_sampling uses it."""
    if TimeSampling.parse(train.time_sampling, "train.time_sampling") == TimeSampling.adaptive:
        validate_sampler_settings(train)


def validate_sampler_settings(train: Any) -> None:
    """One-line errors for the adaptive sampler's settings (train.time_*), before any work."""
    require_at_least("train.time_bins", train.time_bins, 2)
    require(0.0 <= float(train.time_decay) < 1.0, f"train.time_decay={train.time_decay} must be in [0, 1)")
    require(
        0.0 < float(train.time_floor) <= 1.0,
        f"train.time_floor={train.time_floor} must be in (0, 1]: the uniform share that bounds each weight by "
        "1 / floor",
    )
    require_at_least("train.time_warmup_steps", train.time_warmup_steps, 0)
