"""Training the policy with the flow-matching loss, deterministically on CPU."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from vlaeval.artifacts import stable_seed
from vlaeval.data.anchors import AnchorSet
from vlaeval.policy.bound import BoundPolicy
from vlaeval.policy.flow import FlowConvention


def flow_draws(
    rng: np.random.Generator, n: int, horizon: int, action_dim: int, flow: Any
) -> Tuple[torch.Tensor, torch.Tensor]:
    t = torch.from_numpy(FlowConvention.of(flow).sample_time(rng, n).astype(np.float32))
    noise = torch.from_numpy(rng.standard_normal((n, horizon, action_dim)).astype(np.float32))
    return t, noise


def train_policy(
    policy: BoundPolicy,
    anchors: AnchorSet,
    train: Any,
    progress: Optional[Callable[[int, float], None]] = None,
) -> Dict[str, Any]:
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(stable_seed("train", int(train.seed)))
    model = policy.model
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=float(train.learning_rate), weight_decay=float(train.weight_decay)
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(int(train.steps), 1))
    curve: List[Tuple[int, float]] = []
    window: List[float] = []
    started = time.perf_counter()
    model.train()
    for step in range(1, int(train.steps) + 1):
        index = rng.integers(0, len(anchors), size=int(train.batch_size))
        t, noise = flow_draws(rng, index.size, anchors.horizon, anchors.target_actions.shape[-1], policy.flow)
        loss = policy.losses(policy.anchor_batch(anchors, index), t, noise).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        window.append(loss.item())
        if step % int(train.log_every) == 0 or step == int(train.steps):
            curve.append((step, float(np.mean(window))))
            window.clear()
            if progress is not None:
                progress(step, curve[-1][1])
    model.eval()
    return {
        "loss_curve": curve,
        "final_loss": curve[-1][1] if curve else None,
        "train_seconds": time.perf_counter() - started,
        "steps": int(train.steps),
    }
