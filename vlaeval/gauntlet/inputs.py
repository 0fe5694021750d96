"""Everything a gauntlet (or its plan) needs before the first cluster: typed settings, the outcome
source, the strata it will evaluate, and each stratum's scenario plan -- every check a one-line
error, before any work."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from vlaeval.choices import ClusterOrder, TestMode
from vlaeval.config import Component, GauntletConfig, SourceJobSettings, StratumConfig
from vlaeval.errors import UserInputError, first_line, require
from vlaeval.gauntlet.constants import OrderSeed, cluster_size_bounds, run_order_seed
from vlaeval.gauntlet.outcomes import PlantedEffect
from vlaeval.gauntlet.planning import GauntletPlan, StratumPlan, plan_gauntlet, stratum_plans
from vlaeval.gauntlet.scheduler import asked_of, validate_gauntlet
from vlaeval.gauntlet.sources import STRATA_FROM_CONFIG, CheckedSource, RunContext, checked_source
from vlaeval.gauntlet.strata import ResolvedStrata, resolve_strata


@dataclass
class GauntletInputs:
    settings: GauntletConfig
    configured: Dict[str, StratumConfig]
    effects: Dict[str, Any]  # per stratum: a success-rate difference or a degradation mapping
    source: CheckedSource
    resolved: ResolvedStrata
    plans: Dict[str, StratumPlan]
    order: OrderSeed  # the run's cluster-order seed (drawn fresh for rollouts: recorded, replayed)
    hold_required: bool = True  # an absent required stratum needs review (False: a preset never chosen)

    @property
    def strata(self) -> Dict[str, StratumConfig]:
        return self.resolved.strata

    @property
    def required_absent(self) -> List[str]:
        held = self.hold_required and asked_of(self.settings).launch  # a comparison is not held for strata
        return [name for name in self.resolved.absent if self.configured[name].required and held]

    def plan(self) -> GauntletPlan:
        """The planner's simulation of every stratum at `gauntlet.assumed_effect` (job=plan, pre-flight)."""
        return plan_gauntlet(
            self.settings,
            self.strata,
            assumed_effect=self.settings.assumed_effect,
            replications=self.settings.plan_replications,
            plans=self.plans,
        )


def build_source(outcomes: Component, context: Optional[RunContext] = None) -> CheckedSource:
    """The outcome source the `outcomes` group names (`_target_` and its arguments); a source whose
    constructor takes `context` (outcomes=rollout) gets the run's config sections through it."""
    require(
        "path" not in outcomes.keys() or not OmegaConf.is_missing(outcomes, "path"),
        "outcomes=file needs a file: add outcomes.path=<file.csv|file.parquet>",
    )
    extra = {"context": context} if context is not None and accepts_context(outcomes) else {}
    try:
        # _recursive_=False: scenario families and policy recipes are plain mappings, not components.
        source = instantiate(outcomes, _recursive_=False, **extra)
    except InstantiationException as error:
        # Hydra wraps the source's own one-line input errors; show them as they are.
        if isinstance(error.__cause__, UserInputError):
            raise error.__cause__ from None
        raise UserInputError(
            f"outcomes._target_={outcomes._target_} could not be built ({first_line(error)})"
        ) from None
    return checked_source(source)  # the protocol, checked once, before any work


def run_context(cfg: SourceJobSettings) -> Optional[RunContext]:
    """The run's config sections a source that runs policies needs (outcomes=rollout); None for a
    source whose constructor takes no `context` (its job is then not given those sections)."""
    if not accepts_context(cfg.outcomes):
        return None
    assert cfg.model is not None and cfg.data is not None and cfg.flow is not None and cfg.train is not None
    assert cfg.rollout is not None and cfg.simulator is not None  # given with the others: vlaeval.jobs.job_sections
    return RunContext(
        model=cfg.model,
        data=cfg.data,
        flow=cfg.flow,
        train=cfg.train,
        tracking=cfg.tracking,
        rollout=cfg.rollout,
        simulator=cfg.simulator,
        cache_dir=str(cfg.paths.cache_dir),
    )


def accepts_context(outcomes: Component) -> bool:
    """Whether the outcome source takes the run's context (it runs policies: outcomes=rollout); a
    group without a `_target_` builds no source and takes none."""
    import inspect

    from vlaeval.components import import_target

    if "_target_" not in outcomes:
        return False
    target = import_target(str(outcomes._target_), "outcomes")
    try:
        return "context" in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def planted_effects(effects: Mapping[str, Any]) -> Dict[str, PlantedEffect]:
    """effects.<stratum>: a number (a success-rate difference, synthetic outcomes) or a mapping (a
    degradation of the candidate, rollouts); each source checks that it can plant what it is given."""
    out: Dict[str, PlantedEffect] = {}
    for key, value in effects.items():
        name = str(key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        if isinstance(value, Mapping):
            out[name] = {str(k): v for k, v in value.items()}
        else:
            try:
                out[name] = float(value)
            except (TypeError, ValueError):
                raise UserInputError(
                    f"effects.{name}={repr(value)} is neither a success-rate difference (a number) nor a "
                    "degradation (a mapping such as {action_noise: 0.5})"
                ) from None
    return out


def gauntlet_inputs(
    gauntlet: GauntletConfig,
    strata: Mapping[str, StratumConfig],
    effects: Mapping[str, Any],
    outcomes: Component,
    context: Optional[RunContext] = None,
    replay_order_seed: Optional[int] = None,
    strata_chosen: bool = True,
) -> GauntletInputs:
    """Validate the gauntlet settings, strata, effects and outcome source, reconcile their strata,
    read the plans, check each stratum's clusters against its declared size bounds and fix the
    cluster-order seed (the config sections `gauntlet`, `strata`, `effects`, `outcomes`; `context`:
    the run's config, for sources that run policies; `replay_order_seed`: job=reproduce's replay of
    an earlier run's fresh seed; `strata_chosen`: the user chose the strata (a preset or a setting
    under strata), so a required stratum an outcome file lacks holds the recommendation; a preset
    left at its default describes the synthetic source and does not)."""
    # Copies: what the run adds (a source's batch size) goes into its inputs, never into its config.
    settings = dataclasses.replace(gauntlet)
    configured = {str(name): dataclasses.replace(stratum) for name, stratum in strata.items()}
    planted = planted_effects(effects)
    source = build_source(outcomes, context)
    validate_gauntlet(settings, configured, planted)
    source.validate(configured, planted)
    source_notices = source.notices()
    if source.traits.batch_units:  # a source of expensive units asks for small batches
        settings.batch_units = source.traits.batch_units
        source_notices.append(
            f"batches of {settings.batch_units} units (outcomes.batch_units): each unit is a rollout pair, "
            "so the test looks often; gauntlet.batch_units does not apply"
        )
    described = source.describe()
    where = (
        f"outcome file {described['path']}"
        if described.get("kind") == "file"
        else f"the {described.get('kind')} source"
    )
    hold_required = strata_chosen or not source.traits.holds_outcomes
    resolved = resolve_strata(
        settings,
        configured,
        source.available_strata(),
        source_name=where,
        strata_from="config" if source.traits.strata_from == STRATA_FROM_CONFIG else "source",
        labels_from_source=source.labels_strata,
        hold_required=hold_required,
    )
    resolved.notices[:0] = source_notices
    check_order(settings, source)
    name_versions(settings, source)
    plans = stratum_plans(source, settings, resolved.strata, planted)
    resolved.notices += horizon_notices(settings, plans)
    for name, plan in plans.items():  # a missing declaration or a cluster outside one: refused now
        cluster_size_bounds(
            name,
            resolved.strata[name],
            plan.cluster_sizes,
            estimand=settings.estimand,
            plan_fixed_in_advance=not source.traits.holds_outcomes,
        )
    order = run_order_seed(settings, source, replay=replay_order_seed)
    return GauntletInputs(settings, configured, planted, source, resolved, plans, order, hold_required)


def strata_chosen() -> bool:
    """Whether the user chose the strata on the command line (a preset or a setting under strata): a
    preset left at its default describes the synthetic source, so its required strata do not hold an
    outcome file's recommendation (vlaeval.gauntlet.strata.resolve_strata)."""
    from vlaeval.tracking import hydra_runtime, override_key

    return any(override_key(o).split(".")[0] == "strata" for o in hydra_runtime().overrides)


def check_order(settings: GauntletConfig, source: CheckedSource) -> None:
    """An outcome file's order is the file's: the exact test decides it order-free, so a declared order
    (as_given) would only let the file choose the order the certificate rests on -- a null file sorted
    best scene first PASSes every time; test_mode=horizon tests a stream in its order, which a file has
    only where the user declares it."""
    if not source.traits.holds_outcomes:
        return
    declared = settings.cluster_order == ClusterOrder.as_given
    require(
        not (declared and settings.test_mode == TestMode.exact),
        "gauntlet.cluster_order=as_given on an outcome file: the exact test decides a file order-free (every "
        "order's evidence averaged), so a declared order only lets the file's row order choose the certificate; "
        "remove the setting, or test the file as a stream in its recorded order with gauntlet.test_mode=horizon",
    )
    require(
        declared or settings.test_mode != TestMode.horizon,
        "gauntlet.test_mode=horizon tests a stream in its order, and an outcome file has none: leave "
        "test_mode=exact (a file is decided order-free), or declare the file's order random before seeing it with "
        "gauntlet.cluster_order=as_given",
    )


def horizon_notices(settings: GauntletConfig, plans: Mapping[str, StratumPlan]) -> List[str]:
    """test_mode=horizon on clusters of several trials: valid, but each cluster's mean is rounded to one
    step, which keeps little of what a low-variance mean says -- say so before the run."""
    if settings.test_mode != TestMode.horizon:
        return []
    several = [name for name, plan in plans.items() if int(plan.cluster_sizes.max(initial=1)) > 1]
    if not several:
        return []
    return [
        f"gauntlet.test_mode=horizon on clusters of several trials ({', '.join(several)}): each cluster's paired "
        "difference is rounded to one step, which stays exact but keeps little of what a cluster's mean says; the "
        "horizon test is built for single-trial streams (STEP's setting), the anytime test (test_mode=exact) uses "
        "every cluster's mean"
    ]


def name_versions(settings: GauntletConfig, source: CheckedSource) -> None:
    """The versions compared: the config's, else the source's own names, else the roles -- never made up."""
    named = source.versions()
    if not settings.baseline_version:
        settings.baseline_version = named[0] if named and named[0] else "baseline"
    if not settings.candidate_version:
        settings.candidate_version = named[1] if named and named[1] else "candidate"
