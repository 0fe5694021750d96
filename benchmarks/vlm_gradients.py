"""Exact per-sample gradient norms through the VLM-backbone VLA (model=smolvlm_vla), from its test
size to SmolVLA's expert size: vlaeval's per-layer method (method=auto: the Gram form
<A A^T, G G^T> for each Linear over the chunk's tokens, closed forms for the norms) against the
per-sample autograd loop and Opacus 1.6's ghost-clipping norms, in the same process; exactness
against the loop; peak memory of each method in a fresh process. (torch.func's per-sample gradients,
method=functional, cannot vmap through transformers' causal-mask code: it branches on the mask's
values.)

    python benchmarks/vlm_gradients.py [--pairs 256] [--loop-pairs 16] [--large-pairs 32] [--device cuda]

Two sizes. The preset (model=smolvlm_vla, its action expert). SmolVLA's size: a tiny VLM (16
language-model layers of width 256; the expert has one layer per language-model layer) with a
full-size expert (width 1,200: ~110M parameters), randomly initialised -- a norm's cost does not
depend on the weights' values. Per-sample gradients of the expert are never formed by method=auto,
so its memory stays that of one backward pass whatever the parameter count; the loop holds one
gradient (4 bytes a parameter) and torch.func one per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import torch
from per_sample_gradients import chunked, opacus_norms

from benchlib import REPO, compose_default, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.memory import PeakMemory
from vlaeval.policy.builtin import PolicySpec, build_model, prepare_data
from vlaeval.policy.vlm_vla import VLMFlowVLA
from vlaeval.residual.gradients import PerSampleGradNorms, gradient_draws, only_trainable, shared_conditioning

# SmolVLA's sizes where they matter here: its expert (~100M parameters: hidden 720, 16 layers, a
# wider MLP) is matched in parameters by width 1,200 over 16 layers; the VLM is tiny (random, small).
LARGE: Dict[str, Any] = {
    "text_width": 256,
    "text_layers": 16,
    "text_heads": 4,
    "text_kv_heads": 2,
    "vision_width": 64,
    "vision_layers": 2,
    "vision_heads": 4,
    "expert_width": 1200,
}
METHODS = ("auto", "loop", "opacus_ghost")
DATA = ["data=tiny_vision", "train.batch_size=32"]


def model_of(size: str, device: str = "cpu") -> tuple:
    """(cfg, data, model) at `size`: "preset" (model=smolvlm_vla) or "large" (LARGE's sizes), on `device`."""
    cfg = compose_default([*DATA, "model=smolvlm_vla"])
    data = prepare_data(cfg.data, str(cfg.paths.cache_dir), None)
    if size == "preset":
        model = build_model(PolicySpec.of(cfg), data)
    else:
        torch.manual_seed(0)
        demos = data.demonstrations
        model = VLMFlowVLA(
            data.vocabulary,
            int(demos.observations.shape[1]),
            int(demos.actions.shape[1]),
            int(data.anchors.horizon),
            **LARGE,
        )
    return cfg, data, model.float().eval().to(device)


ANCHORS = 16  # distinct anchors in a batch of pairs: seeds x ANCHORS, seed-major, as the artifact's batches are


def pairs(cfg: Any, data: Any, model: Any, count: int, dtype: torch.dtype = torch.float32) -> tuple:
    """`count` (anchor, seed) pairs on the model's device: ANCHORS anchors, count / ANCHORS seeds."""
    device = str(next(model.parameters()).device)
    index = np.arange(count) % ANCHORS
    t, noise = gradient_draws(5000, count, data.anchors.horizon, data.anchors.target_actions.shape[-1], cfg.flow)
    batch = data.bind(model, cfg.flow, device).anchor_batch(data.anchors, index)
    batch = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in batch.items()}
    return batch, t.to(dtype).to(device), noise.to(dtype).to(device)


def method_fn(method: str, model: Any, parameters: List[torch.nn.Parameter], cfg: Any, data: Any) -> Callable:
    """(batch, t, noise) -> (squared norms, losses) by `method`; auto as the gradient artifact runs it,
    the prefix computed once per distinct anchor (residual/gradients.py: shared_conditioning)."""
    if method == "opacus_ghost":
        fn = opacus_norms(model, parameters, cfg.flow)
        assert fn is not None, "opacus is not importable"
        return fn
    norms = PerSampleGradNorms(model, parameters, cfg.flow, method)
    if method == "loop":
        return norms.loop
    policy = data.bind(model, cfg.flow, str(next(model.parameters()).device))

    def artifact_way(batch: Dict[str, torch.Tensor], t: torch.Tensor, noise: torch.Tensor) -> tuple:
        rows, conditioning = shared_conditioning(policy, data.anchors, np.arange(t.shape[0]) % ANCHORS)
        return norms(rows, t, noise, conditioning)

    return artifact_way


def timed(
    fn: Callable, batch: Dict[str, torch.Tensor], t: torch.Tensor, noise: torch.Tensor, chunk: int, repeats: int = 3
) -> tuple:
    """(squared norms, pairs/s) of the fastest of `repeats` calls after a warm-up call on the same
    shapes (the first call at a shape pays the kernels' set-up; the fastest is the least disturbed by
    the machine's other work)."""
    warm = min(chunk, t.shape[0])
    chunked(fn, {k: v[:warm] for k, v in batch.items()}, t[:warm], noise[:warm], chunk)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        sq = chunked(fn, batch, t, noise, chunk)
        seconds.append(time.perf_counter() - started)
    return sq, t.shape[0] / min(seconds)


def exactness(size: str, count: int) -> Dict[str, float]:
    """Max relative difference of auto's squared norms to the loop's: float64 at the preset, float32 at
    the large size (float64 copies of 110M parameters and their loop gradients double the memory)."""
    cfg, data, model = model_of(size)
    dtype = torch.float64 if size == "preset" else torch.float32
    model = model.to(dtype)
    batch, t, noise = pairs(cfg, data, model, count, dtype)
    out = {}
    for subset in ("action_head", "all") if size == "preset" else ("action_head",):
        with only_trainable(model, subset) as parameters:
            norms = PerSampleGradNorms(model, parameters, cfg.flow, "auto")
            fast, _ = norms(batch, t, noise)
            slow, _ = norms.loop(batch, t, noise)
        out[subset] = float(((fast - slow).abs() / slow.abs()).max())
    return out


def speed(size: str, counts: Dict[str, int], device: str) -> Dict[str, Any]:
    """Pairs/s of each method on the action expert, the loop on counts["loop"] pairs, the others on
    counts["batched"]."""
    cfg, data, model = model_of(size, device)
    out: Dict[str, Any] = {"parameters_expert": sum(p.numel() for p in model.trainable_parameters("action_head"))}
    out["parameters_vlm"] = sum(p.numel() for p in model.vlm.parameters())
    out["parameters_total"] = sum(p.numel() for p in model.parameters())
    batch, t, noise = pairs(cfg, data, model, counts["batched"])
    squares = {}
    with only_trainable(model, "action_head") as parameters:
        for method in METHODS:
            n = counts["loop"] if method == "loop" else counts["batched"]
            fn = method_fn(method, model, parameters, cfg, data)
            squares[method], rate = timed(fn, {k: v[:n] for k, v in batch.items()}, t[:n], noise[:n], counts["chunk"])
            out[method] = {"pairs": n, "pairs_per_second": rate}
            print(f"{size} {method}: {rate:.2f} pairs/s on {n} pairs", flush=True)
    reference = squares["loop"]  # the loop's pairs are the first of every method's
    for method in METHODS:
        if method != "loop":
            m = reference.shape[0]
            difference = (squares[method][:m] - reference).abs() / reference.abs()
            out[method]["max_relative_difference_to_loop"] = float(difference.max())
    return out


def memory_in_a_fresh_process(size: str, method: str, count: int, chunk: int, device: str) -> Dict[str, int]:
    """Peak RSS of one method in a new process (an allocator grown for another method would hide it):
    the increase over the built model and its pairs, and the process's whole peak."""
    command = [sys.executable, __file__, "--memory-child", f"{size}:{method}:{count}:{chunk}:{device}"]
    proc = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ.copy())
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_child(spec: str) -> None:
    size, method, count, chunk, device = spec.split(":")
    cfg, data, model = model_of(size, device)
    batch, t, noise = pairs(cfg, data, model, int(count))
    with only_trainable(model, "action_head") as parameters:
        fn = method_fn(method, model, parameters, cfg, data)
        with PeakMemory(device) as peak:
            chunked(fn, batch, t, noise, int(chunk))
    report = peak.report()
    if device == "cpu":
        print(json.dumps({"increase": int(report["peak_rss_increase_bytes"]), "peak": int(report["peak_rss_bytes"])}))
    else:  # CUDA's peak counters were reset at the start: the method's own peak over the model and pairs
        print(json.dumps({"increase": int(report["peak_allocated_bytes"]), "peak": int(report["peak_reserved_bytes"])}))


def figures_body(out: Dict[str, Any]) -> str:
    rows = []
    for size in ("preset", "large"):
        s = out["speed"][size]
        loop = s["loop"]["pairs_per_second"]
        for method in METHODS:
            if method not in s:
                continue
            memory = out["memory"][size].get(method)
            rows.append(
                (
                    size,
                    f"{s['parameters_expert']:,}",
                    method,
                    f"{s[method]['pairs_per_second']:.2f}",
                    f"{s[method]['pairs_per_second'] / loop:.1f}x",
                    f"{memory['increase'] / 2**20:,.0f}" if memory else "",
                    f"{memory['peak'] / 2**30:.2f}" if memory else "",
                    f"{s[method].get('max_relative_difference_to_loop', 0.0):.1e}" if method != "loop" else "",
                )
            )
    large = out["speed"]["large"]
    exact = out["exactness"]
    return "\n\n".join(
        [
            f"Sizes: the preset (model=smolvlm_vla) and SmolVLA's expert size: a tiny VLM "
            f"({large['parameters_vlm']:,} parameters: 16 language-model layers of width 256) conditioning an expert "
            f"of {large['parameters_expert']:,} parameters (width 1,200, 16 layers; {large['parameters_total']:,} in "
            "all). The norms cover the action expert (`gradients.trainable=action_head`); the VLM runs forward only.",
            markdown_table(
                [
                    "size",
                    "expert parameters",
                    "method",
                    "pairs/s",
                    "vs loop",
                    "peak RSS increase (MiB)",
                    "process peak (GiB)",
                    "max rel. diff to loop",
                ],
                rows,
            ),  # fmt: skip
            "Exactness against the per-sample loop: "
            + ", ".join(f"preset {k} {v:.1e} (float64)" for k, v in exact["preset"].items())
            + ", "
            + ", ".join(f"large {k} {v:.1e} (float32)" for k, v in exact["large"].items())
            + ".",
            f"Pairs: {ANCHORS} anchors x seeds, seed-major as the gradient artifact's batches are (auto runs as the "
            "artifact does: the VLM's prefix once per distinct anchor, the expert per pair; Opacus and the loop per "
            f"pair); {out['counts']['batched']} for the batched methods at the preset, {out['counts']['large']} at the "
            f"large size, {out['counts']['loop']} for the loop (the fastest of 3 calls after a warm-up, in the same process). "
            "Peak memory in a fresh process per method, over the same pairs (the loop: over its pairs). The loop holds "
            "a whole gradient (4 bytes a parameter); the Gram form's peak is one backward pass's activations and their "
            "output gradients, whatever the width of the weights. torch.func's per-sample gradients "
            "(gradients.method=functional) do not apply: vmap cannot pass transformers' causal-mask code.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=256, help="pairs timed for the batched methods at the preset")
    parser.add_argument("--large-pairs", type=int, default=32, help="pairs timed at SmolVLA's expert size")
    parser.add_argument("--loop-pairs", type=int, default=16, help="pairs timed for the loop")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (then peak memory is CUDA's allocated bytes)")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vlm_gradients.json")
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child)
        return
    counts = {"batched": args.pairs, "large": args.large_pairs, "loop": args.loop_pairs}
    out: Dict[str, Any] = {"counts": counts, "large_sizes": LARGE, "device": args.device}
    out["exactness"] = {"preset": exactness("preset", 6), "large": exactness("large", 4)}
    print(f"exactness: {out['exactness']}", flush=True)
    out["speed"] = {
        "preset": speed("preset", {"batched": args.pairs, "loop": args.loop_pairs, "chunk": args.pairs}, args.device),
        "large": speed(
            "large", {"batched": args.large_pairs, "loop": args.loop_pairs, "chunk": args.large_pairs}, args.device
        ),
    }
    out["memory"] = {"preset": {}, "large": {}}
    for size, n in (("preset", args.pairs), ("large", args.large_pairs)):
        for method in METHODS:
            count = args.loop_pairs if method == "loop" else n
            out["memory"][size][method] = memory_in_a_fresh_process(size, method, count, n, args.device)
            print(f"memory {size} {method}: {out['memory'][size][method]}", flush=True)
    atomic_write_json(args.out, out)
    command = (
        f"python benchmarks/vlm_gradients.py --pairs {args.pairs} --large-pairs {args.large_pairs} "
        f"--loop-pairs {args.loop_pairs} --device {args.device}"
    )
    body = figures_body(out)
    path = write_figures(
        "vlm_gradients",
        "Per-sample gradient norms through the VLM-backbone VLA, up to SmolVLA's expert size",
        command,
        body,
    )
    print(body)
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
