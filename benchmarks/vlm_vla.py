"""model=smolvlm_vla, the VLM-backbone VLA: its parameter counts (VLM, expert), what reusing the
prefix's keys and values across denoising steps saves against recomputing the prefix at every step,
and training steps/s beside tiny_vla_vision on the same camera data, in the same process.

    python benchmarks/vlm_vla.py [--steps 10] [--batch 16] [--train-steps 20] [--model smolvlm_vla]

Each figure is a ratio against a baseline measured in the same process (this machine is noisy).
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any, Callable

import numpy as np
import torch

from benchlib import compose_default, markdown_table, write_figures
from vlaeval.policy.builtin import PolicySpec, build_model, prepare_data
from vlaeval.policy.training import train_policy
from vlaeval.policy.vlm_vla import VLMFlowVLA


def best_of(fn: Callable[[], Any], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10, help="denoising steps per action chunk")
    parser.add_argument("--batch", type=int, default=16, help="policy calls in one batch (episodes in lockstep)")
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--model", default="smolvlm_vla")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    cfg = compose_default(["data=tiny_vision", f"model={args.model}", "train.batch_size=32"])
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir), None)
    model = build_model(PolicySpec.of(cfg), data).eval()
    assert isinstance(model, VLMFlowVLA), f"model={args.model} is not a VLMFlowVLA"
    vlm = sum(p.numel() for p in model.vlm.parameters())
    expert = sum(p.numel() for p in model.trainable_parameters("action_head"))
    total = sum(p.numel() for p in model.parameters())

    batch = data.bind(model, cfg.flow).anchor_batch(data.anchors, np.arange(args.batch))
    noise = torch.randn(args.batch, model.horizon, model.action_dim, generator=torch.Generator().manual_seed(0))

    def integrate(reuse: bool) -> torch.Tensor:
        with torch.no_grad():
            prefix, x = model.encode(batch), noise.clone()
            for k in range(args.steps):
                t = torch.full((args.batch,), 1 - k / args.steps)
                x = x - model.velocity(prefix if reuse else model.encode(batch), x, t) / args.steps
        return x

    assert torch.equal(integrate(True), integrate(False))  # the same chunk either way
    reused, recomputed = best_of(lambda: integrate(True)), best_of(lambda: integrate(False))

    rows = []
    for name in (args.model, "tiny_vla_vision"):
        spec_cfg = compose_default(
            ["data=tiny_vision", f"model={name}", f"train.steps={args.train_steps}", "train.batch_size=32"]
        )
        built = build_model(PolicySpec.of(spec_cfg), data)
        run = train_policy(data.bind(copy.deepcopy(built), spec_cfg.flow), data.anchors, PolicySpec.of(spec_cfg).train)
        rows.append((name, sum(p.numel() for p in built.parameters()), args.train_steps / run.train_seconds))
    body = "\n\n".join(
        [
            markdown_table(
                ["part", "parameters"],
                [
                    ("VLM (Idefics3: vision tower, connector, Llama)", f"{vlm:,}"),
                    ("action expert", f"{expert:,}"),
                    ("whole policy", f"{total:,}"),
                ],
            ),  # fmt: skip
            markdown_table(
                ["action chunk of a batch", f"seconds ({args.batch} calls, {args.steps} steps)"],
                [
                    ("prefix once, keys/values reused", f"{reused:.4f}"),
                    ("prefix recomputed every step", f"{recomputed:.4f}"),
                    ("speed-up of the reuse", f"{recomputed / reused:.2f}x"),
                ],
            ),  # fmt: skip
            markdown_table(
                ["model", "parameters", "training steps/s (batch 32, CPU)"],
                [(n, f"{p:,}", f"{s:.2f}") for n, p, s in rows]
                + [("ratio", "", f"{rows[0][2] / rows[1][2]:.2f}x of tiny_vla_vision's")],
            ),
        ]
    )
    path = write_figures(
        "vlm_vla",
        "The VLM-backbone VLA (model=smolvlm_vla): size, prefix reuse, training speed",
        f"python benchmarks/vlm_vla.py --steps {args.steps} --batch {args.batch} --train-steps {args.train_steps}",
        body,
    )
    print(body)
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
