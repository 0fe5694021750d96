"""Datasets with stable sampling traces: built-in Meta-World demonstrations and their anchors."""

from vlaeval.data.anchors import AnchorSet, build_anchors, sample_order
from vlaeval.data.demonstrations import Demonstrations
from vlaeval.data.metaworld import MetaWorldDemonstrations, load_or_build_demonstrations

__all__ = [
    "AnchorSet",
    "Demonstrations",
    "MetaWorldDemonstrations",
    "build_anchors",
    "load_or_build_demonstrations",
    "sample_order",
]
