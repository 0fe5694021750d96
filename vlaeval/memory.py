"""Peak memory of one piece of work, not of the whole process (which includes training, recording
and everything before): CUDA's peak counters are reset at the start; on the CPU a thread samples the
process's resident set while the work runs (Linux /proc; elsewhere the process maximum, labelled)."""

from __future__ import annotations

import os
import resource
import sys
import threading
from typing import Any, Dict, Optional

SAMPLE_EVERY_S = 0.005


def current_rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PeakMemory:
    """with PeakMemory(device) as peak: ...; then peak.report() -> dict for the result JSON."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = str(device)
        self._peak = 0
        self._before: Optional[int] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "PeakMemory":
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats()
        self._before = current_rss_bytes()
        if self._before is not None:
            self._peak = self._before
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            rss = current_rss_bytes()
            if rss is not None and rss > self._peak:
                self._peak = rss

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        rss = current_rss_bytes()
        if rss is not None:
            self._peak = max(self._peak, rss)

    def report(self) -> Dict[str, Any]:
        if self.device.startswith("cuda"):
            import torch

            return {
                "kind": "cuda",
                "scope": "this work (peak counters reset at its start)",
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            }
        if self._before is not None:
            return {
                "kind": "process_rss",
                "scope": "sampled while this work ran",
                "peak_rss_bytes": int(self._peak),
                "rss_before_bytes": int(self._before),
                "peak_rss_increase_bytes": int(self._peak - self._before),
            }
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {
            "kind": "process_rss",
            "scope": "process lifetime maximum (no /proc on this system)",
            "peak_rss_bytes": int(rss if sys.platform == "darwin" else rss * 1024),
        }
