"""The vision-language policy beside the state policy and the scripted expert: what the camera
costs to record, what training on pixels costs, held-out success, and whether the policy uses what
it sees and reads (success with its camera blanked, with another task's instruction, with
paraphrased and unseen phrasings -- on the very same episodes); then the audit's scoring and the
gradient artifact in anchors/s for both policies.

    python benchmarks/vision_policy.py [--episodes 10] [--cache-dir DIR] [--device cpu|cuda]

Both policies train on the same demonstrations (data=metaworld_vision: the default tasks with the
corner camera at 64x64); the state policy (model=tiny_vla) reads the whole state, object and goal
positions included, while the vision policy reads the hand and gripper and must find the rest in
the image.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from vision_ablations import BEST_VISION_ARM, arm_overrides

from benchlib import REPO, compose_default, markdown_table, scoring_anchors_per_second, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.data.anchors import draw
from vlaeval.policy.builtin import PolicySpec, obtain_policy, prepare_data
from vlaeval.residual.gradients import gradient_measurements
from vlaeval.rollouts.engine import evaluate_closed_loop

CONDITIONS = {
    "camera blanked": {"perturbation": {"blank_camera": True}},
    "another task's instruction": {"instructions": "other_task"},
    "paraphrased instruction": {"instructions": "paraphrase"},
    "unseen phrasing": {"instructions": "unseen"},
}
MODELS = {"vision": "tiny_vla_vision", "state": "tiny_vla"}
# The vision policy trains to the recipe that paid in vision_ablations.py (its BEST_VISION_ARM: two
# cameras, locate, standardised keypoints, warmup/clipping/EMA, 4 draws, 24k steps); the state
# policy to its own preset (3,000 steps).
STEPS = 3000


def anchors_per_second(cfg: Any, data: Any, policy: Any, anchors: int, device: str) -> Dict[str, float]:
    """Training steps/s (the train section's batch, 20 steps on a copy of the policy), the audit's
    scoring (its estimator settings) and the gradient artifact (128 of its seeds, all trainable
    parameters) on `anchors` anchors, in anchors/s -- measured here, whether the policy was cached or not."""
    import copy

    from omegaconf import OmegaConf

    from vlaeval.policy.training import train_policy

    train = OmegaConf.merge(cfg.train, {"steps": 20, "log_every": 20})
    metrics = train_policy(policy.with_model(copy.deepcopy(policy.model)), data.anchors, train)
    steps_per_second = 20 / float(metrics.train_seconds)
    index, _ = draw(data.anchors, anchors, 0)
    scoring = scoring_anchors_per_second(cfg, policy, data.anchors, index)
    g = cfg.gradients
    seeds = [int(s) for s in g.seeds][:128]
    started = time.perf_counter()
    gradient_measurements(
        policy, data.anchors, index, seeds=seeds, trainable="all", batch_size=int(g.batch_size), method="auto"
    )
    gradients = anchors / (time.perf_counter() - started)
    return {
        "train_steps_per_second": steps_per_second,
        "scoring_anchors_per_second": scoring,
        "gradient_anchors_per_second_128_seeds": gradients,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=10, help="held-out episodes per task")
    parser.add_argument("--anchors", type=int, default=64, help="anchors timed for scoring and gradients")
    parser.add_argument("--cache-dir", default=None, help="an existing cache folder (default: a fresh one)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vision_policy.json")
    args = parser.parse_args()
    conditions = "{" + ",".join(f"c{k}:{_yaml(v)}" for k, v in enumerate(CONDITIONS.values())) + "}"
    out: Dict[str, Any] = {"conditions": list(CONDITIONS)}
    with tempfile.TemporaryDirectory() as fresh:
        cache = args.cache_dir or fresh
        for role, model in MODELS.items():
            recipe = arm_overrides(BEST_VISION_ARM, STEPS) if role == "vision" else [f"model={model}"]
            cfg = compose_default(
                [
                    f"paths.cache_dir={cache}",
                    "data=metaworld_vision",
                    f"evaluate.episodes_per_task={args.episodes}",
                    f"+evaluate.conditions={conditions}",
                    *recipe,
                ]
            )
            started = time.perf_counter()
            data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
            build_s = time.perf_counter() - started
            started = time.perf_counter()
            handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
            train_s = time.perf_counter() - started
            policy = data.bind(handle.model, cfg.flow, device=args.device)
            started = time.perf_counter()
            evaluation = evaluate_closed_loop(
                data.bind(handle.model, cfg.flow), data.demonstrations.tasks, cfg.evaluate, cfg.rollout
            ).to_json()  # the result.json layout
            eval_s = time.perf_counter() - started
            speed = anchors_per_second(cfg, data, policy, args.anchors, args.device)
            out[role] = {
                "model": model,
                "dataset_build_seconds": build_s,
                "train_seconds": train_s,
                "eval_seconds": eval_s,
                "parameters": sum(p.numel() for p in handle.model.parameters()),
                "steps": int(cfg.train.steps),
                "recipe": recipe,
                "train": handle.sidecar["metrics"],
                "evaluation": evaluation,
                **speed,
            }
            print(
                f"{model}: built {build_s:.0f} s, trained {train_s:.0f} s (loss {handle.sidecar['metrics']['final_loss']:.4f}), "
                f"held-out success {evaluation['policy_success_rate']:.2f} (expert {evaluation['expert_success_rate']:.2f}); "
                + ", ".join(
                    f"{name} {c['policy_success_rate']:.2f}"
                    for name, c in zip(CONDITIONS, evaluation["conditions"].values())
                )
                + f"; scoring {speed['scoring_anchors_per_second']:.1f} anchors/s, "
                f"gradients {speed['gradient_anchors_per_second_128_seeds']:.2f} anchors/s"
            )
        manifest = data.demonstrations.manifest
    atomic_write_json(args.out, out)
    write_figures(
        "vision_policy",
        "The vision-language policy: sees, reads, and what it costs",
        _command(args),
        _body(out, manifest),
        one_seed=True,
    )


def _yaml(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_yaml(v)}" for k, v in value.items()) + "}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _command(args: Any) -> str:
    return f"python benchmarks/vision_policy.py --episodes {args.episodes}" + (
        "" if args.device == "cpu" else f" --device {args.device}"
    )


def _body(out: Dict[str, Any], manifest: Dict[str, Any]) -> str:
    vision, state = out["vision"], out["state"]
    tasks = list(vision["evaluation"]["per_task"])
    rows: List[Any] = [
        (
            task,
            f"{vision['evaluation']['per_task'][task]['policy_success_rate']:.2f}",
            f"{state['evaluation']['per_task'][task]['policy_success_rate']:.2f}",
            f"{vision['evaluation']['per_task'][task]['expert_success_rate']:.2f}",
            vision["evaluation"]["per_task"][task]["episodes"],
        )
        for task in tasks
    ]
    rows.append(
        (
            "all",
            f"{vision['evaluation']['policy_success_rate']:.2f}",
            f"{state['evaluation']['policy_success_rate']:.2f}",
            f"{vision['evaluation']['expert_success_rate']:.2f}",
            sum(r[-1] for r in rows),
        )
    )
    probes = [
        (
            "clean",
            f"{vision['evaluation']['policy_success_rate']:.2f}",
            "",
            f"{state['evaluation']['policy_success_rate']:.2f}",
            "",
        )
    ]
    for name, v, s in zip(
        out["conditions"], vision["evaluation"]["conditions"].values(), state["evaluation"]["conditions"].values()
    ):
        probes.append(
            (
                name,
                f"{v['policy_success_rate']:.2f}",
                f"{-v['drop']:+.2f}",
                f"{s['policy_success_rate']:.2f}",
                f"{-s['drop']:+.2f}",
            )
        )
    speed = [
        (
            role,
            f"{r['parameters']:,}",
            f"{r['train_steps_per_second']:.1f}",
            f"{r['scoring_anchors_per_second']:.1f}",
            f"{r['gradient_anchors_per_second_128_seeds']:.2f}",
        )
        for role, r in (("tiny_vla_vision", vision), ("tiny_vla (state)", state))
    ]
    return (
        f"Both policies trained on the same demonstrations ({manifest['episodes']} episodes, "
        f"{manifest['steps']:,} steps, {len(manifest['tasks'])} tasks, cameras rendered at 64x64 at every step): "
        f"the vision policy to the recipe that paid in vision_ablations.md (its `{BEST_VISION_ARM}` arm: "
        f"{vision['steps']:,} steps, overrides "
        f"`{' '.join(vision['recipe'])}`), the state policy to its preset ({state['steps']:,} steps). The vision policy "
        "reads the images, its instruction's words and the hand and gripper; the state policy the whole state "
        "(object and goal positions included) and a bag of words. Held-out scenes, the scripted expert on the "
        "same episodes:\n\n"
        + markdown_table(["task", "vision policy", "state policy", "expert", "episodes"], rows)
        + "\n\nThe same held-out episodes with what the policies see or are told changed (success, and its change "
        "from clean); the state policy reads no camera, so blanking it is its control:\n\n"
        + markdown_table(["condition", "vision", "change", "state", "change"], probes)
        + "\n\nCost on the CPU: training, the audit's scoring (the default estimator) and the gradient artifact "
        "(all trainable parameters, 128 seeds), in anchors/s:\n\n"
        + markdown_table(["policy", "parameters", "training steps/s", "scoring anchors/s", "gradient anchors/s"], speed)
    )


if __name__ == "__main__":
    main()
