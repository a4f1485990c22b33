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


def forward_costs(engine, prompts, widths, rounds: int = 6, block: int = 4, fused=None) -> dict:
    """Median seconds of one trunk forward plus unembedding at each width (1: the plain step; k+1:
    verifying k drafts), on the cache of these prompts, rolled back after every call so each width
    sees the same context; with `fused` (a function of the cache capacity returning a one-row drafter
    `FusedGreedyStep` serves), also its fused verify-and-draft call at width k+1, under the key "fused".
    Each round times every width in turn, `block` calls after one untimed call: the widths share a
    slow spell on a shared machine, and each is timed warm, as a decoding loop runs it (a compiled
    engine's graphs each hold their own frozen weights, so calls that alternate widths would read two
    copies). The first round warms up (and compiles)."""
    from mtp_cli.decode.generate import cache_capacity, prefill
    from mtp_cli.decode.speculative import fused_input, fused_verify_and_draft

    device = engine.device
    parts = [*widths, "fused"] if fused is not None else list(widths)
    times: dict = {part: [] for part in parts}

    def call(part) -> None:
        if part == "fused":
            fused_verify_and_draft(drafter, inputs["fused"], cache)
        else:
            engine.step(inputs[part], cache)
        cache.rollback(lengths)

    with torch.no_grad():
        needed = max(len(p) for p in prompts) + max(widths) + 1
        cache, logits, _, _ = prefill(engine, prompts, cache_capacity(engine, needed))
        lengths = cache.lengths.clone()
        drafter = fused(cache.capacity) if fused is not None else None
        inputs = {width: logits.argmax(-1)[:, None].expand(-1, width).contiguous() for width in widths}
        if drafter is not None:
            inputs["fused"] = fused_input(logits.argmax(-1)[:, None].expand(-1, drafter.k + 1))
        for i in range(rounds + 1):
            for part in parts:
                call(part)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(block):
                    call(part)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i:
                    times[part].append((time.perf_counter() - t0) / block)
    return {part: sorted(t)[len(t) // 2] for part, t in times.items()}
