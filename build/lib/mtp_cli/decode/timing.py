"""Wall-clock time per decoding phase (prefill, step, draft, verify), for the ideal-speedup figure.

The decoders take an optional `PhaseTimer`; the benchmark reads its totals. On CUDA each phase
boundary synchronises the device, so a timed run is slower than an untimed one there; on CPU
the cost is one `perf_counter` pair per phase.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    @contextmanager
    def __call__(self, phase: str):
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.total[phase] += time.perf_counter() - t0
            self.count[phase] += 1

    def mean(self, phase: str) -> float | None:
        """Mean seconds per occurrence of a phase, None if it never ran."""
        n = self.count.get(phase, 0)
        return self.total[phase] / n if n else None


class _NoTimer:
    @contextmanager
    def __call__(self, phase: str):
        yield


NO_TIMER = _NoTimer()
