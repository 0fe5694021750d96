"""How many intra-op threads a model's work gets: all the process's cores for work that is large
per call (the vision policy's convolutions, ~10 GFLOP a training step), one for small work (the
MLP and transformer policies, under 1 GFLOP a step), where splitting a matrix product across
threads buys little. Measured in benchmarks/vision_speed.py, idle and under a competing load: on a
busy machine the small policies train 2-76x faster than with two spinning threads (most of it from
OpenMP's passive wait, vlaeval/__init__.py); idle, one thread is 0.6-0.75x of two spinning ones."""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

import torch

SMALL_WORK_GFLOP = 2.0  # below this per call: one thread (the trade-off is measured, see the docstring)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a Slurm allocation, a container's share)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def threads_for(gflop: float, requested: int = 0) -> int:
    """`requested` when given (> 0), else 1 for work below SMALL_WORK_GFLOP per call and every
    available core above it."""
    if requested > 0:
        return int(requested)
    return 1 if gflop < SMALL_WORK_GFLOP else available_cores()


def gflop_of(work: Callable[[], object]) -> float:
    """The floating-point work of one call of `work` (forward and backward, as it runs), in GFLOP."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        work()
    return counter.get_total_flops() / 1e9


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` inside, restored on exit."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(before)
