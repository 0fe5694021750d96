"""The embedded default from an empty cache: dataset build time, training time, and held-out
closed-loop success per task for the trained policy beside the scripted expert.

    python benchmarks/builtin_policy.py [--episodes N]
    python benchmarks/builtin_policy.py --recipe baseline --episodes 40   # the rollout gauntlet's baseline

--recipe names one of the rollout gauntlet's built-in policies (conf/outcomes/rollout.yaml,
`policies`): its data and train overrides are applied to the default config. --cache-dir reuses a
cache (e.g. the one the rollout gauntlet trained in); the timings then exclude what was cached.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchlib import REPO, compose_default, markdown_table, write_figures
from vlaeval.artifacts import atomic_write_json
from vlaeval.policy.builtin import PolicySpec, obtain_policy, prepare_data
from vlaeval.rollouts.engine import evaluate_closed_loop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=10, help="held-out episodes per task")
    parser.add_argument(
        "--recipe", default=None, help="a built-in policy of outcomes=rollout: baseline, equivalent, worse"
    )
    parser.add_argument("--cache-dir", default=None, help="an existing cache folder (default: a fresh one)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = "builtin_policy" if args.recipe is None else f"builtin_policy_{args.recipe}"
    out = args.out or REPO / "benchmarks" / "results" / f"{name}.json"
    with tempfile.TemporaryDirectory() as fresh:
        cache = args.cache_dir or fresh
        cfg = compose_default([f"paths.cache_dir={cache}", f"evaluate.episodes_per_task={args.episodes}"])
        if args.recipe is not None:
            from omegaconf import OmegaConf, open_dict

            recipe = compose_default(["outcomes=rollout"]).outcomes.policies[args.recipe]
            with open_dict(cfg):
                for section in ("data", "train"):
                    cfg[section] = OmegaConf.merge(cfg[section], recipe.get(section) or {})
        started = time.perf_counter()
        data = prepare_data(cfg.data, str(cfg.paths.cache_dir))
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        handle = obtain_policy(PolicySpec.of(cfg), cfg.checkpoint, str(cfg.paths.cache_dir), data)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        evaluation = evaluate_closed_loop(
            data.bind(handle.model, cfg.flow), data.demonstrations.tasks, cfg.evaluate, cfg.rollout
        ).to_json()  # the result.json layout
        eval_s = time.perf_counter() - started
    manifest = data.demonstrations.manifest
    print(
        f"dataset: {manifest['episodes']} episodes, {manifest['steps']} steps, {len(manifest['tasks'])} tasks, "
        f"expert success in the demonstrations {manifest['expert_success_rate']:.2f}: built in {build_s:.1f} s"
    )
    print(
        f"training: {handle.sidecar['metrics']['steps']} steps, final loss {handle.sidecar['metrics']['final_loss']:.4f}: "
        f"{train_s:.1f} s"
    )
    print(f"closed-loop evaluation ({args.episodes} held-out episodes per task): {eval_s:.1f} s")
    for task, row in evaluation["per_task"].items():
        print(f"  {task:22s} policy {row['policy_success_rate']:.2f}   expert {row['expert_success_rate']:.2f}")
    print(
        f"  {'all':22s} policy {evaluation['policy_success_rate']:.2f}   expert {evaluation['expert_success_rate']:.2f}"
    )
    rows = [
        (task, f"{row['policy_success_rate']:.2f}", f"{row['expert_success_rate']:.2f}", row["episodes"])
        for task, row in evaluation["per_task"].items()
    ]
    rows.append(("all", f"{evaluation['policy_success_rate']:.2f}", f"{evaluation['expert_success_rate']:.2f}", ""))
    write_figures(
        name,
        f"The built-in policy{'' if args.recipe is None else f' ({args.recipe} recipe)'}: cost and held-out success",
        "python benchmarks/builtin_policy.py"
        + ("" if args.recipe is None else f" --recipe {args.recipe}")
        + f" --episodes {args.episodes}",
        f"From an empty cache: the dataset ({manifest['episodes']:,} episodes, {manifest['steps']:,} steps, "
        f"{len(manifest['tasks'])} tasks, expert success in the demonstrations {manifest['expert_success_rate']:.2f}) "
        f"recorded in {build_s:.0f} s; {handle.sidecar['metrics']['steps']:,} training steps (final loss "
        f"{handle.sidecar['metrics']['final_loss']:.4f}) in {train_s:.0f} s; the closed-loop evaluation on held-out "
        f"scenes in {eval_s:.0f} s, beside the scripted expert on the same episodes.\n\n"
        + markdown_table(["task", "policy success", "expert success", "episodes"], rows),
        one_seed=True,
    )
    atomic_write_json(
        out,
        {
            "recipe": args.recipe,
            "dataset_build_seconds": build_s,
            "train_seconds": train_s,
            "eval_seconds": eval_s,
            "dataset": manifest,
            "train": handle.sidecar["metrics"],
            "evaluation": evaluation,
        },
    )


if __name__ == "__main__":
    main()
