"""The FlowMatchingPolicy protocol, the built-in tiny VLA, flow-matching math and checkpoint I/O."""

from vlaeval.policy.protocol import FlowMatchingPolicy
from vlaeval.policy.tiny_vla import TinyVLA

__all__ = ["FlowMatchingPolicy", "TinyVLA"]
