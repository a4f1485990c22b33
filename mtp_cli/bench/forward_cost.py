"""How long one trunk forward (plus unembedding) takes at each width: the plain step (1) and verifying
k drafts (k + 1), measured on a real cache, for the benchmark's verify-vs-step figures. Kept apart
from `timing` (which the decoders import) because it drives the decoders itself."""

from __future__ import annotations

import time

import torch

from mtp_cli.decode.generate import cache_capacity, prefill
from mtp_cli.decode.speculative import fused_input, fused_lead, fused_verify_and_draft
from mtp_cli.model.weight_format import int8_weight


def forward_costs(engine, prompts, widths, rounds: int = 6, block: int = 4, fused=None) -> dict:
    """Median seconds of one trunk forward plus unembedding at each width (1: the plain step; k+1:
    verifying k drafts), on the cache of these prompts, rolled back after every call so each width
    sees the same context; with `fused` (a function of the cache capacity returning a one-row drafter
    `FusedGreedyStep` serves), also its fused verify-and-draft call (width k+1, or 1 + a tree's width), under
    the key "fused".
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
            width = 1 + max(drafter.k, drafter.width)
            inputs["fused"] = fused_input(logits.argmax(-1)[:, None].expand(-1, width), fused_lead(drafter))
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


def streamed_bytes(trunk) -> int:
    """The bytes of weights one decoding step reads: every parameter, except an untied input embedding
    (a step reads only its rows for the new tokens); a tied one is read whole by the unembedding. An int8
    layer (model/weight_format.py) reads its int8 matrix and its scales."""
    skip = {id(trunk.embed_tokens.weight)} if trunk.lm_head is not None else set()
    int8 = {id(m.weight): int8_weight(m) for m in trunk.modules() if int8_weight(m) is not None}
    return sum(sum(t.numel() * t.element_size() for t in int8[id(p)]) if id(p) in int8 else p.numel() * p.element_size()
               for p in trunk.parameters() if id(p) not in skip)


def read_bandwidth(device, nbytes: int, rounds: int = 7) -> float:
    """Bytes per second that a sum over `nbytes` of fp32 (at most 1 GiB, at least 64 MiB: beyond any cache)
    reads at, on this device with its current threads: the median of `rounds` timed sums after one."""
    n = max(64 << 20, min(nbytes, 1 << 30)) // 4
    buffer = torch.ones(n, dtype=torch.float32, device=device)
    times = []
    for i in range(rounds + 1):
        if buffer.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        buffer.sum()
        if buffer.device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return n * 4 / sorted(times)[len(times) // 2]


def weight_floor(trunk) -> dict:
    """The weight-streaming floor of a decoding step: the bytes of weights it reads over the read
    bandwidth measured now; what a memory-bound step cannot beat."""
    nbytes = streamed_bytes(trunk)
    bandwidth = read_bandwidth(trunk.embed_tokens.weight.device, nbytes)
    return {"weight_bytes": nbytes, "read_bytes_per_s": bandwidth, "floor_s": nbytes / bandwidth,
            "how": "weights a step reads (all but an untied input embedding) / the median rate of a sum over "
                   "as many fp32 bytes, measured in this run with its threads"}
