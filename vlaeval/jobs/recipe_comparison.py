"""job=recipe_comparison: is the candidate training recipe better than the baseline, over training seeds?

Type both recipes (recipes.baseline / recipes.candidate: overrides of the model, data, flow and train
sections) and build each one's model once, so a bad override fails before any training; then, seed
pair by seed pair (train.seed = recipes.first_seed + k) up to recipes.max_seeds: take each recipe's
checkpoint at that seed from the built-in cache slot (job=train, by any launcher, fills the same slot)
or train it there, evaluate both on the same episodes (evaluate.*, cached by checkpoint), and add the
pair's success difference to the test; stop at the first pair whose confidence sequence certifies
BETTER, WORSE or EQUIVALENT (within recipes.margin). With recipes.file, the seed pairs come from an
outcome file with a seed column instead, and the same test decides. Save the result (each recipe's
success per seed, per-task seed SD, the seed-spread matrices, the sequence, the planner's seed pairs
per effect size) and the seed pairs' outcome file; publish a run with a child per seed pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from vlaeval import console
from vlaeval.choices import CheckpointKind
from vlaeval.config import PolicyJobSettings, RecipesConfig
from vlaeval.errors import require
from vlaeval.policy.builtin import PolicyData, PolicySpec, build_model, checkpoint_key, obtain_policy, prepare_data
from vlaeval.policy.checkpoint import validate_checkpoint_config
from vlaeval.recipes.result import RecipeComparisonResult
from vlaeval.recipes.seeds import SeedPair, evaluate_checkpoint, read_seed_outcomes, write_seed_outcomes
from vlaeval.recipes.spec import Recipe
from vlaeval.rollouts.evaluation import validate_evaluate
from vlaeval.runs import JobResult, RunReport, now_ms, output_dir, publish
from vlaeval.seqtest.seeds import METHOD, UNDECIDED, SeedsNeeded, SeedTestState, plan_seeds, seed_test
from vlaeval.tracking.record import ChildRun

JOB = "recipe_comparison"
COMPONENTS = ("data", "model")  # `_target_` groups checked against their signatures before run()
SEED_OUTCOMES_FILE = "seed_outcomes.csv"
PLAN_SIMULATIONS = 4000


@dataclass(frozen=True, kw_only=True)
class RecipeComparisonJobConfig(PolicyJobSettings):
    """The sections job=recipe_comparison reads (vlaeval.config.JobSettings): the policy's sections
    (the base both recipes override) and recipes.*."""

    recipes: RecipesConfig


@dataclass(frozen=True)
class Arm:
    """A recipe bound to the run: its overrides and the data it trains on."""

    recipe: Recipe
    data: PolicyData

    def spec(self, base: PolicySpec, seed: int) -> PolicySpec:
        return self.recipe.spec(base, seed)


def run(cfg: RecipeComparisonJobConfig) -> JobResult[RecipeComparisonResult]:
    started_ms = now_ms()
    settings = cfg.recipes
    out = output_dir(cfg)
    pairs, test, source = seed_pairs_from_file(settings) if settings.file is not None else seed_pairs_trained(cfg)
    outcomes_path = write_seed_outcomes(pairs, out / SEED_OUTCOMES_FILE)
    last = test.path[-1]
    plan_sd = settings.plan_sd if settings.plan_sd is not None else (last.sd if len(pairs) >= 2 else None)
    plan = plan_for(settings, plan_sd) if plan_sd is not None and plan_sd > 0 else ()
    result = RecipeComparisonResult.of(
        source=source,
        names=(settings.baseline.name, settings.candidate.name),
        overrides=(settings.baseline.overrides, settings.candidate.overrides),
        pairs=pairs,
        test=test,
        method=METHOD,
        sd_floor=resolution(pairs),
        plan_sd=plan_sd,
        plan=plan,
        seed_outcomes=str(outcomes_path),
    )
    published = publish(
        cfg,
        RunReport(
            job=JOB,
            result=result.to_json(),
            started_ms=started_ms,
            run_name=f"recipes-{settings.candidate.name}-vs-{settings.baseline.name}",
            metrics=result.metrics(),
            checks={},
            tags={
                "recipes.decision": result.decision,
                "recipes.baseline": settings.baseline.name,
                "recipes.candidate": settings.candidate.name,
            },
            history={"recipes.difference": [(look.seeds, look.mean) for look in result.looks]},
            artifacts=[(outcomes_path, None)],
            children=[seed_child(result, pair) for pair in pairs],
        ),
    )
    print_comparison(result, settings.max_seeds)
    return JobResult(result, published)


def seed_pairs_from_file(settings: RecipesConfig) -> Tuple[Tuple[SeedPair, ...], SeedTestState, str]:
    """The seed pairs an outcome file holds, in ascending seed order, as far as the test reads them."""
    assert settings.file is not None
    pairs = read_seed_outcomes(settings.file)[: settings.max_seeds]
    test = tested(settings, pairs)
    return pairs[: len(test.path)], test, settings.file


def seed_pairs_trained(cfg: RecipeComparisonJobConfig) -> Tuple[Tuple[SeedPair, ...], SeedTestState, str]:
    """Both recipes bound and checked, the planner said (where recipes.plan_sd is given), then seed pairs
    trained and evaluated until the test decides."""
    validate_evaluate(cfg)
    validate_checkpoint_config(cfg.checkpoint)
    require(
        cfg.checkpoint.kind == CheckpointKind.builtin,
        "job=recipe_comparison trains each recipe's checkpoints (checkpoint=builtin); to compare checkpoints "
        "you already have, write their outcomes with a seed column and give recipes.file",
    )
    arms = bind_recipes(cfg)
    if cfg.recipes.plan_sd is not None:  # what the seeds will buy, said before the first one is trained
        print_plan(plan_for(cfg.recipes, cfg.recipes.plan_sd), cfg.recipes.max_seeds)
    pairs, test = run_seed_pairs(cfg, arms)
    return pairs, test, "trained"


def plan_for(settings: RecipesConfig, sd: float) -> Tuple[SeedsNeeded, ...]:
    """The planner's rows for recipes.plan_effects at seed-pair SD `sd`, under this comparison's test."""
    return plan_seeds(
        settings.plan_effects,
        sd,
        alpha=settings.alpha,
        margin=settings.margin,
        prior_scale=settings.prior_scale,
        max_seeds=settings.max_seeds,
        simulations=PLAN_SIMULATIONS,
    )


def bind_recipes(cfg: RecipeComparisonJobConfig) -> Tuple[Arm, Arm]:
    """Both recipes typed against the run's sections and their data loaded; each one's model built
    once, so an override its model or data refuses fails here, before any training."""
    base = PolicySpec.of(cfg)
    arms = []
    tasks: Optional[List[str]] = None
    for role, section in (("baseline", cfg.recipes.baseline), ("candidate", cfg.recipes.candidate)):
        recipe = Recipe(section.name, tuple(section.overrides), section.seed_offset)
        spec = recipe.spec(base, cfg.recipes.first_seed)
        data = prepare_data(spec.data, str(cfg.paths.cache_dir))
        build_model(spec, data)
        mine = list(data.demonstrations.tasks)
        require(
            tasks is None or mine == tasks,
            f"recipes.{role}'s data has tasks {mine}, the baseline's {tasks}; both recipes must be "
            "evaluated on the same tasks (leave data.tasks out of a recipe's overrides)",
        )
        tasks = mine
        arms.append(Arm(recipe, data))
    first = cfg.recipes.first_seed
    require(
        checkpoint_key(arms[0].spec(base, first), arms[0].data)
        != checkpoint_key(arms[1].spec(base, first), arms[1].data),
        "both recipes train one checkpoint (the same overrides at the same seeds); for an A/A of one recipe, train "
        "the candidate at other seeds (recipes.candidate.seed_offset=1000)",
    )
    return arms[0], arms[1]


def run_seed_pairs(cfg: RecipeComparisonJobConfig, arms: Tuple[Arm, Arm]) -> Tuple[Tuple[SeedPair, ...], SeedTestState]:
    """Seed pairs until the test decides or recipes.max_seeds have run."""
    settings = cfg.recipes
    base = PolicySpec.of(cfg)
    cache = str(cfg.paths.cache_dir)
    pairs: List[SeedPair] = []
    for k in range(settings.max_seeds):  # at least two: RecipesConfig checks it
        seed = settings.first_seed + k
        runs = []
        for arm in arms:
            spec = arm.spec(base, seed)
            with console.unit_progress(f"{arm.recipe.name} seed {seed}: training", int(spec.train.steps)) as update:
                handle = obtain_policy(
                    spec,
                    cfg.checkpoint,
                    cache,
                    arm.data,
                    progress=lambda step, loss: update(completed=step, description=f"loss {loss:.4f}"),
                )
            with console.unit_progress(f"{arm.recipe.name} seed {seed}: episodes", 1) as update:
                runs.append(
                    evaluate_checkpoint(
                        handle,
                        spec,
                        arm.data,
                        cfg.evaluate,
                        cfg.rollout,
                        cfg.simulator,
                        cache,
                        lambda done, total: update(completed=done, total=total),
                    )
                )
        pairs.append(SeedPair(seed, runs[0], runs[1]))
        test = tested(settings, pairs)
        look = test.path[-1]
        console.show(
            f"seed {seed}: {arms[0].recipe.name} {runs[0].success_rate:.3f}, {arms[1].recipe.name} "
            f"{runs[1].success_rate:.3f}; mean difference {look.mean:+.3f} over {look.seeds} pair(s) -> {test.decision}"
        )
        if test.decision != UNDECIDED:
            break
    return tuple(pairs), test


def tested(settings: RecipesConfig, pairs: Sequence[SeedPair]) -> SeedTestState:
    """The test over these seed pairs, in their order, as recipes.* sets it."""
    return seed_test(
        [p.difference for p in pairs],
        alpha=settings.alpha,
        margin=settings.margin,
        prior_scale=settings.prior_scale,
        resolution=resolution(pairs),
    )


def resolution(pairs: Sequence[SeedPair]) -> float:
    """One episode's worth of success on the smallest seed pair: the floor of the pairs' SD."""
    return 1.0 / min(len(p.baseline.success) for p in pairs)


def seed_child(result: RecipeComparisonResult, pair: SeedPair) -> ChildRun:
    """A seed pair's nested run: both recipes' success there (overall and per task) and the difference."""
    metrics = {
        "recipes.baseline.success": pair.baseline.success_rate,
        "recipes.candidate.success": pair.candidate.success_rate,
        "recipes.difference": pair.difference,
    }
    for name, evaluation in (("baseline", pair.baseline), ("candidate", pair.candidate)):
        metrics.update({f"recipes.{name}.success.{task}": v for task, v in evaluation.per_task().items()})
    return ChildRun(
        name=f"seed {pair.seed}",
        params={"recipes.seed": pair.seed},
        metrics=metrics,
        history={},
        tags={
            "recipes.seed": pair.seed,
            "recipes.baseline": result.baseline.name,
            "recipes.candidate": result.candidate.name,
            "recipes.baseline.checkpoint_sha256": pair.baseline.checkpoint_sha256 or None,
            "recipes.candidate.checkpoint_sha256": pair.candidate.checkpoint_sha256 or None,
        },
        result=pair.to_json(),
    )


def print_comparison(result: RecipeComparisonResult, max_seeds: int) -> None:
    b, c = result.baseline, result.candidate
    last = result.looks[-1]
    bounds = (
        f"[{last.low:+.3f}, {last.high:+.3f}]"
        if last.low is not None and last.high is not None
        else "(unbounded: too few seed pairs yet)"
    )
    console.show(f"recipe comparison ({result.source}): {c.name} vs {b.name} over {len(result.pairs)} seed pair(s)")
    for recipe in (b, c):
        sd = f"{recipe.sd:.3f}" if recipe.sd is not None else "n/a"
        per_seed = ", ".join(f"{x:.3f}" for x in recipe.success)
        console.show(f"  {recipe.name}: success {recipe.mean:.3f} (seed SD {sd}); per seed {per_seed}")
    at = f" at seed pair {result.decided_at}" if result.decided_at is not None else ""
    console.show(
        f"  difference {last.mean:+.3f}, {1 - result.alpha:.0%} confidence sequence {bounds}, margin +/-{result.margin:g}: "
        f"{result.decision}{at}"
    )
    print_plan(result.plan, max_seeds)
    console.show(f"  seed pairs' outcomes: {result.seed_outcomes}")


def print_plan(rows: Sequence[SeedsNeeded], max_seeds: int) -> None:
    for row in rows:
        seeds = (
            f"{row.seeds} seed pairs for 80% power" if row.seeds is not None else f"more than {max_seeds} seed pairs"
        )
        console.show(
            f"  planner: a difference of {row.effect:+.2f} at seed-pair SD {row.sd:.3f} needs {seeds} "
            f"(power at {max_seeds} pairs {row.power_at_max:.2f})"
        )
