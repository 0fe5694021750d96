"""outcomes=rollout: the gauntlet runs two policies, episode by episode, only when its test asks.

The baseline and the candidate are checkpoints: a file (`outcomes.candidate=/path/model.pt`,
built with the run's model/data/flow config) or a built-in recipe (`builtin:<name>`, one of
`outcomes.policies`: overrides of the data and train sections, trained on first use and cached
like checkpoint=builtin). Their sha256 digests are the versions the lineage records.

Each stratum is a scenario family (`outcomes.scenarios.<stratum>`): Meta-World tasks, a range of
scene variants of one or more variant families, episodes per scene, a perturbation, and for safety strata a
monitored obstacle whose contact above a force is an unsafe event that fails the episode. A
cluster is one scene, a unit one episode; both policies run every episode with identical seeds
(the policy's sampling noise and the perturbation streams come from the episode seed, a stable
digest of stratum, scene and index). `replay: true` makes the family the failure registry's
scenarios (historical_regressions). `effects.<stratum>` plants a degradation (a perturbation) on
the candidate only, drawn from its own stream, so a planted regression is a real one.

Outcomes are cached per episode (vlaeval.rollouts.episode_cache); the gauntlet job writes every
episode produced as a paired-outcome file (outcomes=file reads it) and records the discordant
ones in the failure registry (vlaeval.gauntlet.registry).
"""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from vlaeval.artifacts import sha256_json, stable_seed
from vlaeval.config import StratumConfig, to_plain
from vlaeval.envs.episodes import NO_PERTURBATION, Episode, Perturbation
from vlaeval.errors import UserInputError, require, require_at_least, require_file
from vlaeval.gauntlet.outcomes import OutcomeRequest, StratumOutcomes
from vlaeval.gauntlet.registry import FailureRegistry, registry_path
from vlaeval.gauntlet.result import RolloutCost
from vlaeval.rollouts.outcomes import (
    EpisodeOutcome,
    EpisodeOutcomes,
    FailureEntry,
    OutcomeRow,
    PairedEpisode,
    PolicyIdentity,
)
from vlaeval.rollouts.scenarios import (
    BUILTIN_PREFIX,
    RolloutPolicy,
    ScenarioFamily,
    Scene,
    episode_from_spec,
    episode_spec,
)

if TYPE_CHECKING:
    from vlaeval.policy.builtin import PolicySpec

POLICY_SECTIONS = ("model", "data", "flow", "train")  # what a built-in policy's recipe may override


class RolloutOutcomes:
    """Paired outcomes from rolling out two checkpoints on scenario families, on demand."""

    holds_outcomes = False  # nothing exists before the test asks: the planner simulates
    produces_on_demand = True
    # Every unit is a simulator episode, whatever a stratum's configured label says: the lineage and
    # the recommendation must not present simulated evidence as replayed real-world data.
    data_label = "SIMULATED"

    def __init__(
        self,
        baseline: str = "builtin:baseline",
        candidate: str = "builtin:worse",
        policies: Any = None,
        scenarios: Any = None,
        execute_actions: int = 1,  # = EvaluateConfig (tests/test_config.py checks: components are parsed, not imported)
        max_steps: int = 150,
        batch_units: int = 48,
        registry: Optional[str] = None,
        use_cache: bool = True,
        context: Any = None,
    ) -> None:
        require(context is not None, "outcomes=rollout is built by the gauntlet job (it needs the run's config)")
        self.context = context
        self.references = {"baseline": str(baseline), "candidate": str(candidate)}
        self.simulator = str(context.simulator)  # where the episodes run: a registered simulator's name
        self.recipes: Dict[str, Any] = dict(policies or {})
        self.execute_actions, self.max_steps = int(execute_actions), int(max_steps)
        self.batch_units = int(batch_units)
        self.use_cache = bool(use_cache)
        require_at_least("outcomes.execute_actions", self.execute_actions, 1)
        require_at_least("outcomes.max_steps", self.max_steps, 1)
        require_at_least("outcomes.batch_units", self.batch_units, 1)
        require(scenarios, "outcomes.scenarios is empty; give each stratum a scenario family")
        default_tasks = [str(t) for t in (context.data.get("tasks") or [])]
        self.families = {str(k): ScenarioFamily.parse(str(k), v, default_tasks) for k, v in dict(scenarios).items()}
        self.registry = FailureRegistry(registry_path(registry, context.tracking, context.cache_dir))
        self.degradations: Dict[str, Perturbation] = {}
        self.policies: Dict[str, RolloutPolicy] = {}
        self.rows: List[PairedEpisode] = []  # every episode pair produced, in production order
        self._replayed: Optional[List[Dict[str, Any]]] = None
        self._scenes: Dict[str, List[Scene]] = {}
        self._built: set = set()  # strata whose scenes' benchmarks are built in this process
        self.timing = {"rollout_s": 0.0, "episodes_run": 0, "episodes_from_cache": 0, "env_steps": 0}
        from vlaeval.rollouts.evaluation import validate_rollout
        from vlaeval.rollouts.executors import make_executor

        # rollout.*: where the rollouts run (local processes or Ray) and how many at once; never what they give.
        validate_rollout(context.rollout)
        self.lockstep_group = int(context.rollout.lockstep_group)
        self.executor = make_executor(
            str(context.rollout.executor), int(context.rollout.workers), context.rollout.ray_address
        )

    # ------------------------------------------------------------------ checks before any work
    def validate(self, strata: Mapping[str, StratumConfig], effects: Mapping[str, Any]) -> None:
        for name, value in effects.items():
            require(
                isinstance(value, Mapping),
                f"effects.{name}={value} is a success-rate difference, which only synthetic outcomes can plant; "
                f"for rollouts plant a degradation of the candidate, e.g. effects.{name}={{action_noise: 0.5}}",
            )
            self.degradations[name] = Perturbation.parse(value, f"effects.{name}")
        known = set(self.sim.tasks())
        for stratum, family in self.families.items():
            for task in family.tasks:
                require(
                    task in known,
                    f"outcomes.scenarios.{stratum}.tasks: unknown {self.sim.name} task {task!r}; did you mean "
                    + ", ".join(difflib.get_close_matches(task, sorted(known), n=3, cutoff=0.0))
                    + "?",
                )
        for role, reference in self.references.items():
            if reference.startswith(BUILTIN_PREFIX):
                name = reference[len(BUILTIN_PREFIX) :]
                require(
                    name in self.recipes,
                    f"outcomes.{role}={reference}: no built-in policy {name!r}; "
                    f"known: {', '.join(BUILTIN_PREFIX + k for k in self.recipes)} (or give a checkpoint path)",
                )
                self._check_recipe(name)
            else:
                require_file(
                    reference,
                    f"outcomes.{role}={reference}",
                    f"give a checkpoint file or builtin:<name> ({', '.join(BUILTIN_PREFIX + k for k in self.recipes)})",
                )
        self._check_obstacles()  # last: it builds each safety task's scene (~2 s a task)

    def _recipe_sections(self, name: str) -> "PolicySpec":
        """The run's model, data, flow and train sections with built-in policy `name`'s overrides merged in."""
        from omegaconf import OmegaConf

        from vlaeval.policy.builtin import PolicySpec

        recipe = dict(self.recipes[name] or {})
        for key in recipe:
            require(
                key in POLICY_SECTIONS,
                f"outcomes.policies.{name}.{key} is not a policy section; use model, data, flow or train",
            )
        merged = {}
        for key in POLICY_SECTIONS:
            section = getattr(self.context, key)
            for setting in recipe.get(key) or {}:
                # A recipe written for another model (tiny_vla_vision's `locate` under model=smolvlm_vla):
                # named here, not as OmegaConf's merge error and its traceback.
                require(
                    setting in section,
                    f"outcomes.policies.{name}.{key}.{setting} is not a setting of this run's {key} section "
                    f"({getattr(OmegaConf.get_type(section), '__name__', key)}); "
                    f"drop it, or pick an outcomes preset written for this {key} (e.g. outcomes=rollout_vlm_small for "
                    "model=smolvlm_vla_small)",
                )
            merged[key] = OmegaConf.merge(section, recipe.get(key) or {})
        # flow and train back to their dataclasses, as the job's own config holds them
        return PolicySpec(
            merged["model"], merged["data"], OmegaConf.to_object(merged["flow"]), OmegaConf.to_object(merged["train"])
        )

    def _check_recipe(self, name: str) -> None:
        """The built-in policy's sections and training recipe, checked before any recording or
        training; an error names the recipe it came from."""
        from vlaeval.policy.training import validate_training_recipe

        train = self._recipe_sections(name).train
        try:
            validate_training_recipe(train)
        except UserInputError as error:
            raise UserInputError(f"outcomes.policies.{name}: {error}") from None

    def describe(self) -> Dict[str, Any]:
        policies = {
            role: {"reference": p.reference, "version": p.version, "sha256": p.sha256}
            for role, p in self.policies.items()
        }
        scenarios = {k: f.spec() for k, f in self.families.items()}
        controls = self.controls()
        return {
            "kind": "rollout",
            "policies": policies,
            "scenarios": scenarios,
            "controls": controls,
            "registry": str(self.registry.path),
            "registry_entries_replayed": len(self._replay_entries()),
            # What historical_regressions replayed: a re-run with another registry is told apart.
            "registry_replayed_sha256": sha256_json([e["id"] for e in self._replay_entries()]),
            "executor": self.executor.describe(),
            "sha256": sha256_json(
                {
                    "policies": {r: p["sha256"] for r, p in policies.items()},
                    "scenarios": scenarios,
                    "controls": controls,
                    "replayed": [e["id"] for e in self._replay_entries()],
                }
            ),
        }

    @property
    def sim(self) -> Any:
        """The simulator the episodes run in (vlaeval/envs/protocol.py), made once per process."""
        from vlaeval.envs import simulator

        return simulator(self.simulator)

    def controls(self) -> Dict[str, int]:
        """The rollout controls every episode's outcome depends on (its description, its cache key)."""
        return {"execute_actions": int(self.execute_actions), "max_steps": int(self.max_steps)}

    def _replay_entries(self) -> List[Dict[str, Any]]:
        if self._replayed is None:  # read once: the registry a gauntlet replays is the one it started with
            self._replayed = self.registry.entries() if any(f.replay for f in self.families.values()) else []
        return self._replayed

    def available_strata(self) -> List[str]:
        return [name for name, f in self.families.items() if not f.replay or self._replay_entries()]

    def notices(self) -> List[str]:
        empty = [name for name, f in self.families.items() if f.replay and not self._replay_entries()]
        return [
            f"the failure registry {self.registry.path} is empty: {name} has no scenario to replay yet "
            "(every rollout gauntlet records the episodes its candidate failed and the baseline passed)"
            for name in empty
        ]

    # ------------------------------------------------------------------ the scenario plan
    def scenes(self, stratum: str) -> List[Scene]:
        if stratum not in self._scenes:
            family = self.families[stratum]
            if family.replay:
                grouped: Dict[Tuple[str, int, int], List[Dict[str, Any]]] = {}
                for entry in self._replay_entries():
                    e = entry["episode"]
                    grouped.setdefault((e["task"], int(e.get("family", 0)), int(e["variant"])), []).append(dict(e))
                scenes = [Scene(t, f, v, tuple(specs)) for (t, f, v), specs in grouped.items()]
            else:
                scenes = []
                for task in family.tasks:
                    for family_seed in family.variant_families:
                        for variant in range(*family.variants):
                            scenes.append(self._scene(stratum, family, task, family_seed, variant))
            self._scenes[stratum] = scenes
        return self._scenes[stratum]

    def _scene(self, stratum: str, family: ScenarioFamily, task: str, family_seed: int, variant: int) -> Scene:
        """A scene and its episodes; each episode's seed is a stable digest of stratum, scene and index."""
        scene_id = f"{task}/family-{family_seed}/variant-{variant}"
        seeds = [stable_seed("rollout-scenario", stratum, scene_id, k) for k in range(family.episodes_per_scene)]
        episodes = tuple(
            episode_spec(
                Episode(
                    task,
                    0,
                    variant,
                    seed,
                    family=family_seed,
                    perturbation=family.perturbation,
                    unsafe_contact_force=family.unsafe_contact_force,
                    obstacle=family.obstacle,
                    instruction=family.instruction(task, seed, self.simulator),
                )
            )
            for seed in seeds
        )
        return Scene(task, family_seed, variant, episodes)

    def cluster_sizes(self, request: OutcomeRequest) -> np.ndarray:
        return np.array([len(s.episodes) for s in self.scenes(request.stratum)], dtype=np.int64)

    # ------------------------------------------------------------------ the policies
    def prepare(self, progress: Optional[Callable[[str, int, int], None]] = None) -> Tuple[str, str]:
        """Load or train both policies (progress(what, done, total) while recording demonstrations
        and training); returns the (baseline, candidate) versions: name @ the checkpoint's sha256."""
        for role, reference in self.references.items():
            self.policies[role] = self._load(role, reference, progress)
        return self.policies["baseline"].version, self.policies["candidate"].version

    def _load(
        self, role: str, reference: str, progress: Optional[Callable[[str, int, int], None]] = None
    ) -> RolloutPolicy:

        from vlaeval.config import CheckpointConfig
        from vlaeval.policy.builtin import PolicySpec, load_policy, obtain_policy, prepare_data

        ctx = self.context
        if reference.startswith(BUILTIN_PREFIX):
            spec = self._recipe_sections(reference[len(BUILTIN_PREFIX) :])
        else:
            spec = PolicySpec(ctx.model, ctx.data, ctx.flow, ctx.train)
        steps = int(spec.train.steps)
        data = prepare_data(
            spec.data,
            str(ctx.cache_dir),
            None
            if progress is None
            else (lambda done, total, task: progress(f"{role}: recording {task}", done, total)),
        )
        if reference.startswith(BUILTIN_PREFIX):
            handle = obtain_policy(
                spec,
                CheckpointConfig(),
                str(ctx.cache_dir),
                data,
                None
                if progress is None
                else (lambda step, loss: progress(f"{role}: training, loss {loss:.4f}", step, steps)),
            )
            label = reference[len(BUILTIN_PREFIX) :]
        else:
            handle = load_policy(spec, data, Path(reference))
            label = Path(reference).stem
        handle.model.eval()
        return RolloutPolicy(
            role,
            reference,
            f"{label}@{handle.sha256[:12]}",
            handle.sha256,
            data.bind(handle.model, spec.flow),
            spec.flow,
        )

    def _build_scenes(self, stratum: str) -> None:
        """Meta-World's benchmark of every (task, variant family) of the stratum, built here before
        its first rollout (~1 s each): local workers, forked again after new ones, inherit them
        instead of rebuilding them for every batch."""
        if stratum in self._built:
            return
        self._built.add(stratum)
        built = [self.sim.prepare(scene.task, scene.family) for scene in self.scenes(stratum)]
        if any(built):
            self.executor.restart_workers()  # a local pool re-forks on its next use; Ray workers build their own

    def _check_obstacles(self) -> None:
        for stratum, family in self.families.items():
            if family.unsafe_contact_force is None or family.replay:
                continue
            for task in family.tasks:
                require(
                    self.sim.has_bodies(task, family.variant_families[0], family.obstacle),
                    f"outcomes.scenarios.{stratum}: task {task} has no body named "
                    f"{', '.join(family.obstacle)} to monitor; use tasks whose scene has that obstacle "
                    "(reach-wall-v3, push-wall-v3, pick-place-wall-v3 have `wall`) or set obstacle=[...]",
                )

    # ------------------------------------------------------------------ producing outcomes
    def produce(self, request: OutcomeRequest, clusters: np.ndarray, cache: Any) -> Tuple[StratumOutcomes, str]:
        """Both policies' outcomes on the requested scenes (in that order), each episode from the
        per-episode cache or rolled out now."""
        from vlaeval.rollouts.episode_cache import EpisodeCache

        require(bool(self.policies), "RolloutOutcomes.prepare() must run before outcomes are produced")
        stratum = request.stratum
        self._build_scenes(stratum)
        scenes = [self.scenes(stratum)[int(c)] for c in np.asarray(clusters, dtype=np.int64)]
        specs = [spec for scene in scenes for spec in scene.episodes]
        episode_cache = EpisodeCache(self.context.cache_dir, enabled=self.use_cache)
        outcomes = self._outcomes(stratum, specs, episode_cache)
        self.timing["episodes_from_cache"] += episode_cache.hits
        self.timing["episodes_run"] += episode_cache.misses
        sizes = np.array([len(s.episodes) for s in scenes], dtype=np.int64)
        k = 0
        for scene in scenes:
            for spec in scene.episodes:
                self.rows.append(
                    PairedEpisode(
                        stratum=stratum,
                        # Unique across strata: a replayed registry entry is the very episode it
                        # was found as, in another stratum.
                        scenario_id=f"{stratum}:{scene.id}/seed-{spec['seed']}",
                        cluster_id=scene.id,
                        episode=spec,
                        baseline=outcomes["baseline"][k],
                        candidate=outcomes["candidate"][k],
                    )
                )
                k += 1
        status = "hit" if episode_cache.misses == 0 else ("miss" if episode_cache.hits == 0 else "partial")
        return StratumOutcomes(outcomes["baseline"].success, outcomes["candidate"].success, sizes), status

    def _outcomes(self, stratum: str, specs: Sequence[Mapping[str, Any]], cache: Any) -> Dict[str, EpisodeOutcomes]:
        """Per policy (baseline, candidate): the outcomes of the episodes `specs`, from the cache or
        rolled out now -- both policies' missing episodes in one executor call."""
        from vlaeval.rollouts.engine import RolloutJob, rollout_jobs
        from vlaeval.rollouts.episode_cache import episode_key

        tasks = sorted({str(s["task"]) for s in specs})
        keys: Dict[str, List[str]] = {}
        found: Dict[str, Dict[str, EpisodeOutcome]] = {}
        jobs, missing = [], []
        for role, policy in self.policies.items():
            degradation = self.degradations.get(stratum, NO_PERTURBATION) if role == "candidate" else NO_PERTURBATION
            episodes = [episode_from_spec(s, tasks.index(str(s["task"])), degradation) for s in specs]
            controls: Dict[str, Any] = {**self.controls(), "flow": to_plain(policy.flow)}
            if policy.bound.cameras:  # what its cameras show depends on the renderer
                controls["renderer"] = self.sim.renderer_version
            keys[role] = [episode_key(policy.sha256, e, controls, self.simulator) for e in episodes]
            found[role] = cache.get_many(keys[role])
            todo = [i for i, key in enumerate(keys[role]) if key not in found[role]]
            if todo:
                bound = policy.bound.for_instructions([self.sim.instruction(t) for t in tasks])
                jobs.append(RolloutJob(bound, [episodes[i] for i in todo], self.simulator))
                missing.append((role, todo))
        if jobs:
            started = time.perf_counter()
            ran = rollout_jobs(
                jobs,
                self.executor,
                execute_actions=self.execute_actions,
                max_steps=self.max_steps,
                group_size=self.lockstep_group,
            )
            self.timing["rollout_s"] += time.perf_counter() - started
            for (role, todo), out in zip(missing, ran):
                self.timing["env_steps"] += int(out.steps.sum())
                new = {keys[role][i]: out[j] for j, i in enumerate(todo)}
                cache.put_many((key, self.policies[role].sha256, outcome) for key, outcome in new.items())
                found[role].update(new)
        return {role: EpisodeOutcomes.of([found[role][key] for key in keys[role]]) for role in self.policies}

    # ------------------------------------------------------------------ after the gauntlet
    def close(self) -> None:
        """Release the executor (a Ray instance this run started is shut down)."""
        self.executor.close()

    def failures(self) -> List[FailureEntry]:
        """Registry entries: the produced episodes the candidate failed and the baseline passed."""
        who = {role: PolicyIdentity(p.version, p.sha256) for role, p in self.policies.items()}
        return [pair.failure(who["baseline"], who["candidate"]) for pair in self.rows if pair.discordant]

    def film(self, folder: Path, count: int, failures: Optional[Sequence[Mapping[str, Any]]] = None) -> List[Path]:
        """Side-by-side videos (baseline | candidate) of up to `count` of the episodes the candidate
        failed and the baseline passed -- this run's, or `failures` (registry entries of these two
        policies) -- the unsafe ones first, re-run from their seeds in this process
        (vlaeval/rollouts/videos.py), into `folder`. This run's are checked to re-run to their
        recorded outcomes; a registry entry's degradation (effects) was the gauntlet's, so its video
        shows what the policies do now."""
        from vlaeval.rollouts.videos import pick, regression_video, video_name

        written = []
        for failure in pick(self.failures() if failures is None else failures, count):
            spec, stratum = failure["episode"], str(failure["stratum"])
            task = str(spec["task"])
            degradation = self.degradations.get(stratum, NO_PERTURBATION)
            episodes = {
                "baseline": episode_from_spec(spec, 0, NO_PERTURBATION),
                "candidate": episode_from_spec(spec, 0, degradation),
            }
            bound = {role: p.bound.for_instructions([self.sim.instruction(task)]) for role, p in self.policies.items()}
            written.append(
                regression_video(
                    bound["baseline"],
                    bound["candidate"],
                    episodes,
                    folder / video_name(stratum, str(failure["scenario_id"])),
                    title=f"{stratum}: {task}, scene {spec.get('family', 0)}/{spec['variant']}, seed {spec['seed']}",
                    instruction=str(spec.get("instruction") or self.sim.instruction(task)),
                    execute_actions=self.execute_actions,
                    max_steps=self.max_steps,
                    simulator=self.simulator,
                    expected={"baseline": True, "candidate": False} if failures is None else None,
                )
            )
        return written

    def paired_outcomes_table(self) -> List[OutcomeRow]:
        """Every episode produced, as rows of the outcome-file format (plus unsafe and steps columns)."""
        return [pair.row() for pair in self.rows]

    def stats(self) -> RolloutCost:
        t = self.timing
        seconds = float(t["rollout_s"])
        return RolloutCost(
            rollout_s=seconds,
            episodes_run=int(t["episodes_run"]),
            episodes_from_cache=int(t["episodes_from_cache"]),
            env_steps=int(t["env_steps"]),
            episode_pairs_produced=len(self.rows),
            env_steps_per_s=t["env_steps"] / seconds if seconds else None,
            rollouts_per_s=t["episodes_run"] / seconds if seconds else None,
        )
