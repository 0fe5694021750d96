"""Which strata a gauntlet evaluates, in which order, and at what alarm level (pure functions).

The configured strata (`strata` group) describe what a team expects; an outcome source may hold
other ones. `resolve_strata` reconciles the two before any work: strata the source lacks are
*absent* (reported, not evaluated; they need review only if the config marks them `required`),
strata only the source holds are evaluated with documented defaults (priority after every
configured one, no related strata, no halt) and a notice -- unless the name is one or two edits
from a configured stratum (`distribution_shfit`, `nomnal`): a typo would move evidence out of a
safety stratum, so it is refused with "did you mean" unless `gauntlet.accept_new_strata` names it.
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


TYPO_EDITS = 2  # a source stratum this close to a configured one is taken for a typo


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and transpositions of neighbours turning a into b
    (optimal string alignment: `shfit` is one edit from `shift`)."""
    previous2: List[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], previous2[j - 2] + 1)
        previous2, previous = previous, row
    return previous[len(b)]


def likely_typo(name: str, configured: Sequence[str]) -> Optional[str]:
    """The configured stratum `name` is one or two edits from (the nearest), or None."""
    near = sorted((edit_distance(name, known), known) for known in configured if known != name)
    return near[0][1] if near and near[0][0] <= TYPO_EDITS else None


def priority_order(strata: Mapping[str, StratumConfig]) -> List[str]:
    return sorted(strata, key=lambda name: (strata[name].priority, name))


def resolve_strata(
    settings: GauntletConfig,
    configured: Mapping[str, StratumConfig],
    available: Optional[Sequence[str]],
    *,
    source_name: str = "the outcome source",
    strata_from: str = "source",
    labels_from_source: bool = False,
    hold_required: bool = True,
) -> ResolvedStrata:
    """Reconcile the configured strata with those `available` in the source (None: the source can
    produce any configured stratum). strata_from="config" refuses a stratum the config lacks;
    `labels_from_source`: the source declares each stratum's data label (an outcome file);
    `hold_required`: an absent `required` stratum needs review (False: the strata are a preset the user
    never chose for this source, so its `required` flags describe another source)."""
    if available is None:
        return ResolvedStrata(dict(configured))
    present = list(dict.fromkeys(str(name) for name in available))
    absent = [name for name in configured if name not in present]
    added = [name for name in present if name not in configured]
    for name in added:
        typo_of = likely_typo(name, list(configured))
        if typo_of is not None and name not in settings.accept_new_strata:
            raise UserInputError(
                f"{source_name} holds stratum {name!r}: did you mean {typo_of!r}? Fix the name in the source, "
                f"or accept it as a new stratum with gauntlet.accept_new_strata=[{name}]"
            )
    if added and strata_from == "config":
        raise UserInputError(
            f"{source_name} holds stratum {added[0]!r}, which is not configured; known strata: "
            f"{', '.join(configured)} (add strata.{added[0]} or use outcomes.strata=file)"
        )
    resolved = {name: spec for name, spec in configured.items() if name in present}
    last = max((spec.priority for spec in configured.values()), default=0)
    for offset, name in enumerate(added, start=1):
        resolved[name] = replace(StratumConfig(), priority=last + offset, related=[])
    notices = added_notices(resolved, added, last, source_name, labels_from_source)
    notices += absent_notices(settings, configured, absent, source_name, hold_required)
    if not resolved:
        raise UserInputError(
            f"{source_name} holds none of the configured strata ({', '.join(configured)}); "
            "check the file's stratum column"
        )
    return ResolvedStrata(resolved, absent, added, notices)


def added_notices(
    resolved: Mapping[str, StratumConfig], added: Sequence[str], last: int, source_name: str, labels_from_source: bool
) -> List[str]:
    """A line for each stratum only the source holds: the defaults it is evaluated with."""
    notices = []
    for offset, name in enumerate(added, start=1):
        label = (
            f"the data label {source_name} declares"
            if labels_from_source
            else f"data label {resolved[name].data_label.value}"
        )
        notices.append(
            f"stratum {name!r} is in {source_name} but not configured: evaluated with the defaults "
            f"(priority {last + offset}, {label}, no related strata, no halt); configure strata.{name} to change them"
        )
    return notices


def absent_notices(
    settings: GauntletConfig,
    configured: Mapping[str, StratumConfig],
    absent: Sequence[str],
    source_name: str,
    hold_required: bool,
) -> List[str]:
    """One line for the configured strata the source lacks (which hold the recommendation, which a
    preset the user never chose does not), one for the scheduler's roles among them."""
    notices = []
    if absent:
        held = [name for name in absent if configured[name].required and hold_required]
        waived = [name for name in absent if configured[name].required and not hold_required]
        parts = [f"configured strata absent from {source_name}, not evaluated: {', '.join(absent)}"]
        if held:
            parts.append(f"required (strata.<name>.required), so the recommendation needs review: {', '.join(held)}")
        if waived:
            parts.append(
                f"{', '.join(waived)} is required by the strata preset you did not choose for this source, so it does "
                f"not hold it (to require it, choose the strata: strata=<preset> or strata.{waived[0]}.required=true)"
            )
        notices.append("; ".join(parts))
    roles = [f"gauntlet.{role}={getattr(settings, role)!r}" for role in ("critical_stratum", "nominal_stratum")
             if getattr(settings, role) and getattr(settings, role) in absent]  # fmt: skip
    if roles:
        notices.append(f"{' and '.join(roles)} absent from {source_name}: their rules do not apply")
    return notices


def alarm_count(strata: Mapping[str, StratumConfig]) -> int:
    """Alarms the family-wise error covers: one REGRESSION alarm per stratum plus one catastrophic
    halt per halting stratum."""
    return len(strata) + sum(1 for spec in strata.values() if spec.catastrophic_halt)


def alarm_alpha(settings: GauntletConfig, strata: Mapping[str, StratumConfig]) -> float:
    """Level of each alarm: alpha / (K + H) with the Bonferroni split over the K REGRESSION alarms
    and the H catastrophic halts, so the chance of any false alarm stays <= alpha; alpha each
    without it. A halt is decided at min(alpha / 2, this level) (see the sequential test)."""
    return settings.alpha / alarm_count(strata) if settings.alarm_fwer == AlarmFwer.bonferroni else settings.alpha
