"""Which strata a gauntlet evaluates, in which order, and at what alarm level (pure functions).

The configured strata (`strata` group) describe what a team expects; an outcome source may hold
other ones. `resolve_strata` reconciles the two before any work: strata the source lacks are
*absent* (reported, not evaluated; they need review only if the config marks them `required`),
strata only the source holds are evaluated with documented defaults (priority after every
configured one, no related strata, no halt) and a notice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Sequence

from vlaeval.choices import AlarmFwer
from vlaeval.config import GauntletConfig, StratumConfig
from vlaeval.errors import UserInputError


@dataclass
class ResolvedStrata:
    strata: Dict[str, StratumConfig]  # what is evaluated
    absent: List[str] = field(default_factory=list)  # configured, not in the source
    added: List[str] = field(default_factory=list)  # in the source, not configured (defaults)
    notices: List[str] = field(default_factory=list)  # one line each, printed and saved


def priority_order(strata: Mapping[str, StratumConfig]) -> List[str]:
    return sorted(strata, key=lambda name: (strata[name].priority, name))


def resolve_strata(
    settings: GauntletConfig,
    configured: Mapping[str, StratumConfig],
    available: Optional[Sequence[str]],
    *,
    source_name: str = "the outcome source",
    strata_from: str = "source",
) -> ResolvedStrata:
    """Reconcile the configured strata with those `available` in the source (None: the source can
    produce any configured stratum). strata_from="config" refuses a stratum the config lacks."""
    if available is None:
        return ResolvedStrata(dict(configured))
    present = list(dict.fromkeys(str(name) for name in available))
    absent = [name for name in configured if name not in present]
    added = [name for name in present if name not in configured]
    if added and strata_from == "config":
        raise UserInputError(
            f"{source_name} holds stratum {added[0]!r}, which is not configured; known strata: "
            f"{', '.join(configured)} (add strata.{added[0]} or use outcomes.strata=file)"
        )
    resolved = {name: spec for name, spec in configured.items() if name in present}
    last = max((spec.priority for spec in configured.values()), default=0)
    notices: List[str] = []
    for offset, name in enumerate(added, start=1):
        resolved[name] = replace(StratumConfig(), priority=last + offset, related=[])
        notices.append(
            f"stratum {name!r} is in {source_name} but not configured: evaluated with the defaults "
            f"(priority {last + offset}, data label {resolved[name].data_label.value}, no related strata, "
            f"no halt); configure strata.{name} to change them"
        )
    for name in absent:
        need = "required: needs review" if configured[name].required else "not required"
        notices.append(f"stratum {name!r} is configured but absent from {source_name}: not evaluated ({need})")
    for role in ("critical_stratum", "nominal_stratum"):
        name = getattr(settings, role)
        if name and name in absent:
            notices.append(f"gauntlet.{role}={name!r} is absent from {source_name}: its rule does not apply")
    if not resolved:
        raise UserInputError(
            f"{source_name} holds none of the configured strata ({', '.join(configured)}); "
            "check the file's stratum column"
        )
    return ResolvedStrata(resolved, absent, added, notices)


def alarm_count(strata: Mapping[str, StratumConfig]) -> int:
    """Alarms the family-wise error covers: one REGRESSION alarm per stratum plus one catastrophic
    halt per halting stratum."""
    return len(strata) + sum(1 for spec in strata.values() if spec.catastrophic_halt)


def alarm_alpha(settings: GauntletConfig, strata: Mapping[str, StratumConfig]) -> float:
    """Level of each alarm: alpha / (K + H) with the Bonferroni split over the K REGRESSION alarms
    and the H catastrophic halts, so the chance of any false alarm stays <= alpha; alpha each
    without it. A halt is decided at min(alpha / 2, this level) (see the sequential test)."""
    return settings.alpha / alarm_count(strata) if settings.alarm_fwer == AlarmFwer.bonferroni else settings.alpha
