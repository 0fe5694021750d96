"""Closed-loop evaluation in Meta-World: the policy and the scripted expert on the same held-out
episodes (scene variants the demonstrations never used)."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import torch

from vlaeval.artifacts import stable_seed
from vlaeval.data.metaworld import HELD_OUT_VARIANTS, EpisodeRunner, episode_plan
from vlaeval.policy.flow import sample_actions


def _run(runner: EpisodeRunner, task: str, variant: int, act, max_steps: int) -> bool:
    env, obs = runner.env(task, variant)
    queue: List[np.ndarray] = []
    for _ in range(max_steps):
        if not queue:
            queue = list(act(obs))
        obs, _, terminated, truncated, info = env.step(np.clip(queue.pop(0), -1.0, 1.0))
        if info.get("success"):
            return True
        if terminated or truncated:
            return False
    return False


def evaluate_closed_loop(
    model: torch.nn.Module, tasks: List[str], instruction_table: torch.Tensor, evaluate: Any, flow: Any, progress=None
) -> Dict[str, Any]:
    plan = episode_plan(tasks, int(evaluate.episodes_per_task), int(evaluate.seed), HELD_OUT_VARIANTS)
    runner = EpisodeRunner()
    per_task: Dict[str, Dict[str, List[bool]]] = {t: {"policy": [], "expert": []} for t in tasks}
    model.eval()
    try:
        for i, ep in enumerate(plan):
            task, task_index = ep["task"], ep["task_index"]
            generator = torch.Generator().manual_seed(stable_seed("rollout", ep["seed"]) % (2**63))
            instruction = instruction_table[task_index : task_index + 1]

            def policy_act(obs, instruction=instruction, generator=generator):
                batch = {"observation": torch.as_tensor(obs, dtype=torch.float32)[None], "instruction": instruction}
                with torch.no_grad():
                    chunk = sample_actions(model, model.encode(batch), int(flow.sampling_steps), generator, flow)[0]
                return chunk[: int(evaluate.execute_actions)].numpy()

            expert = runner.expert(task)
            per_task[task]["policy"].append(_run(runner, task, ep["variant"], policy_act, int(evaluate.max_steps)))
            per_task[task]["expert"].append(
                _run(
                    runner,
                    task,
                    ep["variant"],
                    lambda obs, expert=expert: [expert.get_action(obs)],
                    int(evaluate.max_steps),
                )
            )
            if progress is not None:
                progress(i + 1, len(plan), task)
    finally:
        runner.close()
    rows = {
        t: {
            "policy_success_rate": float(np.mean(v["policy"])),
            "expert_success_rate": float(np.mean(v["expert"])),
            "episodes": len(v["policy"]),
            "policy_successes": v["policy"],
            "expert_successes": v["expert"],
        }
        for t, v in per_task.items()
    }
    return {
        "per_task": rows,
        "policy_success_rate": float(np.mean([s for v in per_task.values() for s in v["policy"]])),
        "expert_success_rate": float(np.mean([s for v in per_task.values() for s in v["expert"]])),
        "held_out_variants": [HELD_OUT_VARIANTS.start, HELD_OUT_VARIANTS.stop],
    }
