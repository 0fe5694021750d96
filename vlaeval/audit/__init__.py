"""Audit statistics (pure functions on arrays) and the gate."""

from vlaeval.audit.alignment import Alignment, alignment_audit
from vlaeval.audit.gate import gate_decision
from vlaeval.audit.statistics import (
    information_to_baseline_ratio,
    leave_one_out_robustness,
    proposal_distribution,
    repeatability,
)

__all__ = [
    "Alignment",
    "alignment_audit",
    "gate_decision",
    "information_to_baseline_ratio",
    "leave_one_out_robustness",
    "proposal_distribution",
    "repeatability",
]
