"""model=smolvlm_vla's held-out success after its benchmark recipe, beside tiny_vla_vision's: the
VLM-backbone VLA trained on the default camera demonstrations (data=metaworld_vision, the two
cameras tiny_vla_vision's best arm reads) and evaluated on the held-out scenes, with the same probes
(camera blanked, another task's instruction) on the very same episodes; the audit's scoring in
anchors/s on the trained policy.

    python benchmarks/vlm_vla_success.py [--steps 6000] [--episodes 10] [--cache-dir DIR]

tiny_vla_vision's row is read from benchmarks/results/vision_policy.json (benchmarks/vision_policy.py:
the same demonstrations, held-out episodes and probes; 24,000 steps of its best recipe), not re-run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from benchlib import REPO, compose_default, markdown_table, scoring_anchors_per_second, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.data.anchors import draw
from vlaeval.policy.builtin import PolicySpec, obtain_policy, prepare_data
from vlaeval.rollouts.engine import evaluate_closed_loop

CONDITIONS = {
    "camera blanked": {"perturbation": {"blank_camera": True}},
    "another task's instruction": {"instructions": "other_task"},
}
VISION_RESULTS = REPO / "benchmarks" / "results" / "vision_policy.json"


def recipe(steps: int) -> List[str]:
    """smolvlm_vla's benchmark recipe: the training recipe tiny_vla_vision's best arm used (warmup,
    clipping, EMA -- the config's defaults -- and 4 flow draws per anchor, so the VLM encodes 64
    anchors per step of 256 pairs) on the same two cameras."""
    return [
        "model=smolvlm_vla",
        f"train.steps={steps}",
        "train.draws_per_anchor=4",
        "data.cameras=[corner,corner4]",
        "model.cameras=[observation.images.corner,observation.images.corner4]",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--episodes", type=int, default=10, help="held-out episodes per task")
    parser.add_argument("--anchors", type=int, default=64, help="anchors timed for scoring")
    parser.add_argument("--cache-dir", default=None, help="an existing cache folder (default: a fresh one)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vlm_vla_success.json")
    parser.add_argument("--render", action="store_true", help="write the figures page from --out's saved results")
    args = parser.parse_args()
    if args.render:
        publish(json.loads(args.out.read_text()), args)
        return
    conditions = "{" + ",".join(f"c{k}:{flow_yaml(v)}" for k, v in enumerate(CONDITIONS.values())) + "}"
    with tempfile.TemporaryDirectory() as fresh:
        cache = args.cache_dir or fresh
        cfg = compose_default(
            [
                f"paths.cache_dir={cache}",
                "data=metaworld_vision",
                f"evaluate.episodes_per_task={args.episodes}",
                f"+evaluate.conditions={conditions}",
                *recipe(args.steps),
            ]
        )
        data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
        started = time.perf_counter()
        handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        evaluation = evaluate_closed_loop(
            data.bind(handle.model, cfg.flow), data.demonstrations.tasks, cfg.evaluate, cfg.rollout
        ).to_json()
        eval_s = time.perf_counter() - started
        index, _ = draw(data.anchors, args.anchors, 0)
        scoring = scoring_anchors_per_second(cfg, data.bind(handle.model, cfg.flow), data.anchors, index)
    measured = json.loads(VISION_RESULTS.read_text())
    vision = measured["vision"]
    out: Dict[str, Any] = {
        "recipe": recipe(args.steps),
        "train_seconds": train_s,
        "eval_seconds": eval_s,
        "parameters": sum(p.numel() for p in handle.model.parameters()),
        "train": handle.sidecar["metrics"],
        "evaluation": evaluation,
        "scoring_anchors_per_second": scoring,
        "tiny_vla_vision": {"recipe": vision["recipe"], "evaluation": vision["evaluation"]},
        "tiny_vla_state_success": measured["state"]["evaluation"]["policy_success_rate"],
    }
    atomic_write_json(args.out, out)
    publish(out, args)


def publish(out: Dict[str, Any], args: Any) -> None:
    """The figures page of `out` (measured now, or read back with --render)."""
    body = figures_body(out, args)
    path = write_figures(
        "vlm_vla_success",
        "The VLM-backbone VLA's held-out success beside tiny_vla_vision's",
        f"python benchmarks/vlm_vla_success.py --steps {args.steps} --episodes {args.episodes}",
        body,
        one_seed=True,
    )
    print(body)
    print(f"figures: {path}")


def flow_yaml(value: Any) -> str:
    """A condition as a Hydra override's value (flow-style YAML)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{flow_yaml(v)}" for k, v in value.items()) + "}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def figures_body(out: Dict[str, Any], args: Any) -> str:
    mine, theirs = out["evaluation"], out["tiny_vla_vision"]["evaluation"]
    tasks = list(mine["per_task"])
    rows = [
        (task, f"{mine['per_task'][task]['policy_success_rate']:.2f}",
         f"{theirs['per_task'][task]['policy_success_rate']:.2f}",
         f"{mine['per_task'][task]['expert_success_rate']:.2f}", mine["per_task"][task]["episodes"])
        for task in tasks
    ]  # fmt: skip
    rows.append(
        ("all", f"{mine['policy_success_rate']:.2f}", f"{theirs['policy_success_rate']:.2f}",
         f"{mine['expert_success_rate']:.2f}", len(mine["episodes"]))
    )  # fmt: skip
    probes = [
        (name, f"{c['policy_success_rate']:.2f}", f"{theirs['conditions'].get(key, {}).get('policy_success_rate', float('nan')):.2f}")
        for (name, c), key in zip(zip(CONDITIONS, mine["conditions"].values()), ("c0", "c1"))
    ]  # fmt: skip
    train = out["train"]
    return "\n\n".join(
        [
            f"smolvlm_vla ({out['parameters']:,} parameters) trained {train['steps']:,} steps "
            f"({out['train_seconds'] / 60:.1f} min on this CPU, final loss {train['final_loss']:.4f}; overrides "
            f"`{' '.join(out['recipe'])}`) and evaluated on {args.episodes} held-out episodes per task "
            f"({out['eval_seconds']:.0f} s); tiny_vla_vision after its best recipe (24,000 steps; "
            "[vision_policy.md](vision_policy.md)) on the same episodes:",
            markdown_table(["task", "smolvlm_vla", "tiny_vla_vision", "expert", "episodes"], rows),
            "The same episodes with the cameras blanked and with another task's instruction:",
            markdown_table(["condition", "smolvlm_vla", "tiny_vla_vision"], probes),
            "What the two read differs: smolvlm_vla's state token reads the whole observation, the object's and "
            "the goal's positions included (as the state policy tiny_vla does: "
            f"{out['tiny_vla_state_success']:.2f} on these episodes in vision_policy.md), while tiny_vla_vision "
            "reads the hand and gripper and must find the rest in the images. With its cameras blanked the "
            f"VLA's success falls only to {mine['conditions']['c0']['policy_success_rate']:.2f} (from "
            f"{mine['policy_success_rate']:.2f}): most of it comes from the state, not from what it sees. Its "
            "instruction it does read: another task's drops it to "
            f"{mine['conditions']['c1']['policy_success_rate']:.2f}.",
            f"The audit's scoring (its default estimator) on the trained VLA: {out['scoring_anchors_per_second']:.1f} anchors/s.",
        ]
    )


if __name__ == "__main__":
    main()
