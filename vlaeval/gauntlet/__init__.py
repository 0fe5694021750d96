"""The launch gauntlet: scheduler, outcome sources, cache, lineage and recommendation."""

from vlaeval.gauntlet.cache import ArrayCache
from vlaeval.gauntlet.outcomes import FileOutcomes, StratumOutcomes, SyntheticOutcomes
from vlaeval.gauntlet.recommendation import DO_NOT_LAUNCH, LAUNCH, NEEDS_REVIEW
from vlaeval.gauntlet.scheduler import priority_order, run_gauntlet, validate_gauntlet

__all__ = [
    "ArrayCache",
    "DO_NOT_LAUNCH",
    "FileOutcomes",
    "LAUNCH",
    "NEEDS_REVIEW",
    "StratumOutcomes",
    "SyntheticOutcomes",
    "priority_order",
    "run_gauntlet",
    "validate_gauntlet",
]
