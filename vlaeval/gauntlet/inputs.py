"""Everything a gauntlet (or its plan) needs before the first cluster: typed settings, the outcome
source, the strata it will evaluate, and each stratum's scenario plan -- every check a one-line
error, before any work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from vlaeval.config import GauntletConfig, StratumConfig, UserInputError, require
from vlaeval.gauntlet.planning import StratumPlan, stratum_plans
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


def build_source(cfg: DictConfig) -> Any:
    require(not OmegaConf.is_missing(cfg.outcomes, "path"),
            "outcomes=file needs a file: add outcomes.path=<file.csv|file.parquet>")
    try:
        return instantiate(cfg.outcomes)
    except InstantiationException as error:
        # Hydra wraps the source's own one-line input errors; show them as they are.
        if isinstance(error.__cause__, UserInputError):
            raise error.__cause__ from None
        raise UserInputError(f"outcomes._target_={cfg.outcomes._target_} could not be built "
                             f"({str(error).splitlines()[0]})") from None


def gauntlet_inputs(cfg: DictConfig) -> GauntletInputs:
    """Validate the configuration and the outcome source, reconcile their strata, read the plans."""
    settings: GauntletConfig = OmegaConf.to_object(cfg.gauntlet)
    configured = {str(name): OmegaConf.to_object(node) for name, node in cfg.strata.items()}
    effects = {str(k): float(v) for k, v in cfg.effects.items()}
    source = build_source(cfg)
    validate_gauntlet(settings, configured, effects)
    source.validate(configured, effects)
    described = source.describe()
    where = f"outcome file {described['path']}" if described.get("kind") == "file" else f"the {described.get('kind')} source"
    resolved = resolve_strata(settings, configured, source.available_strata(), source_name=where,
                              strata_from="config" if getattr(source, "strata_from", "") == "config" else "source")
    return GauntletInputs(settings, configured, effects, source, resolved,
                          stratum_plans(source, settings, resolved.strata, effects))
