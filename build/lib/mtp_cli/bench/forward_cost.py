"""How long one trunk forward (plus unembedding) takes at each width: the plain step (1) and verifying
k drafts (k + 1), measured on a real cache, for the benchmark's verify-vs-step figures. Kept apart
from `timing` (which the decoders import) because it drives the decoders itself."""

from __future__ import annotations

import time

import torch

from mtp_cli.decode.generate import cache_capacity, prefill
from mtp_cli.decode.speculative import fused_input, fused_verify_and_draft


def forward_costs(engine, prompts, widths, rounds: int = 6, block: int = 4, fused=None) -> dict:
    """Median seconds of one trunk forward plus unembedding at each width (1: the plain step; k+1:
    verifying k drafts), on the cache of these prompts, rolled back after every call so each width
    sees the same context; with `fused` (a function of the cache capacity returning a one-row drafter
    `FusedGreedyStep` serves), also its fused verify-and-draft call at width k+1, under the key "fused".
    Each round times every width in turn, `block` calls after one untimed call: the widths share a
    slow spell on a shared machine, and each is timed warm, as a decoding loop runs it (a compiled
    engine's graphs each hold their own frozen weights, so calls that alternate widths would read two
    copies). The first round warms up (and compiles)."""
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
