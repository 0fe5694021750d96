"""Everything a gauntlet (or its plan) needs before the first cluster: typed settings, the outcome
source, the strata it will evaluate, and each stratum's scenario plan -- every check a one-line
error, before any work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, cast

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from vlaeval.config import GauntletConfig, StratumConfig
from vlaeval.errors import UserInputError, first_line, require
from vlaeval.gauntlet.planning import StratumPlan, plan_gauntlet, stratum_plans
from vlaeval.gauntlet.scheduler import validate_gauntlet
from vlaeval.gauntlet.strata import ResolvedStrata, resolve_strata


@dataclass
class GauntletInputs:
    settings: GauntletConfig
    configured: Dict[str, StratumConfig]
    effects: Dict[str, float]
    source: Any
    resolved: ResolvedStrata
    plans: Dict[str, StratumPlan]

    @property
    def strata(self) -> Dict[str, StratumConfig]:
        return self.resolved.strata

    @property
    def required_absent(self) -> List[str]:
        return [name for name in self.resolved.absent if self.configured[name].required]

    def plan(self) -> Dict[str, Any]:
        """The planner's simulation of every stratum at `gauntlet.assumed_effect` (job=plan, pre-flight)."""
        return plan_gauntlet(
            self.settings,
            self.strata,
            assumed_effect=self.settings.assumed_effect,
            replications=self.settings.plan_replications,
            plans=self.plans,
        )


def build_source(outcomes: DictConfig) -> Any:
    """The outcome source the `outcomes` group names (`_target_` and its arguments)."""
    require(
        "path" not in outcomes.keys() or not OmegaConf.is_missing(outcomes, "path"),
        "outcomes=file needs a file: add outcomes.path=<file.csv|file.parquet>",
    )
    try:
        return instantiate(outcomes)
    except InstantiationException as error:
        # Hydra wraps the source's own one-line input errors; show them as they are.
        if isinstance(error.__cause__, UserInputError):
            raise error.__cause__ from None
        raise UserInputError(
            f"outcomes._target_={outcomes._target_} could not be built ({first_line(error)})"
        ) from None


def gauntlet_inputs(
    gauntlet: DictConfig, strata: DictConfig, effects: DictConfig, outcomes: DictConfig
) -> GauntletInputs:
    """Validate the gauntlet settings, strata, effects and outcome source, reconcile their strata,
    read the plans (the config sections `gauntlet`, `strata`, `effects`, `outcomes`)."""
    settings = cast(GauntletConfig, OmegaConf.to_object(gauntlet))
    configured = {str(name): cast(StratumConfig, OmegaConf.to_object(node)) for name, node in strata.items()}
    planted = {str(k): float(v) for k, v in effects.items()}
    source = build_source(outcomes)
    validate_gauntlet(settings, configured, planted)
    source.validate(configured, planted)
    described = source.describe()
    where = (
        f"outcome file {described['path']}"
        if described.get("kind") == "file"
        else f"the {described.get('kind')} source"
    )
    resolved = resolve_strata(
        settings,
        configured,
        source.available_strata(),
        source_name=where,
        strata_from="config" if getattr(source, "strata_from", None) == "config" else "source",
    )
    return GauntletInputs(
        settings, configured, planted, source, resolved, stratum_plans(source, settings, resolved.strata, planted)
    )
