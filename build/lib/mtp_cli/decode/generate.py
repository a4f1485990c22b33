"""Plain autoregressive decoding of the trunk on the decode engine (`engine.py`, static KV cache):
batched, ragged prompts, greedy or sampled (temperature / top-p), stop sequences. The decoder
`mtp generate` and the evals use, and the baseline speculative decoding must reproduce token for
token.

Ragged prompts are right-padded for one prefill; each row then continues from its own length
(the cache masks and overwrites its padding). Finished rows leave the batch once a quarter of it
has finished (compacting the cache costs about one step, so it is not done for every row); until
then they ride along, their tokens discarded and no random numbers drawn for them, so the output
is the same as dropping each row the moment it finishes. Compiled (`compile=True`), finished rows ride
along to the end: one batch shape, so the compiled step never recompiles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mtp_cli.decode.engine import Engine, engine_for
from mtp_cli.decode.timing import NO_TIMER
from mtp_cli.model.trunk import Trunk

StopFn = Callable[[int, list[int]], bool]  # (row index, generated ids so far) -> stop?
COMPACT_AT = 0.75  # drop finished rows from the batch once at most this fraction is still live


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution (fp32) for temperature > 0, with nucleus (top-p) truncation."""
    p = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = p.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        p = torch.zeros_like(p).scatter(-1, order, sorted_p)
        p = p / p.sum(-1, keepdim=True)
    return p


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) logits -> (B,) token ids: argmax when temperature == 0, else a sample."""
    if temperature <= 0:
        return logits.argmax(-1)
    return torch.multinomial(probs_from_logits(logits, temperature, top_p), 1, generator=generator).squeeze(-1)


def stop_on_strings(tokenizer, stops: Sequence[str], eos_id: int | None = None) -> StopFn:
    """A StopFn that fires when the decoded completion contains any stop string (or ends with EOS).

    Checked after every token, so a new occurrence must end in the newest token: decoding the last
    max(len(stop)) + 1 tokens is enough (every token decodes to at least one character)."""
    window = max((len(s) for s in stops), default=0) + 1
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decode = (lambda ids: backend.decode(ids, skip_special_tokens=False)) if backend is not None else tokenizer.decode

    def fn(_row: int, ids: list[int]) -> bool:
        if eos_id is not None and ids and ids[-1] == eos_id:
            return True
        if not stops:
            return False
        text = decode(ids[-window:])
        return any(s in text for s in stops)
    return fn


def prefill(engine: Engine, prompts: Sequence[Sequence[int]], capacity: int, pad_id: int = 0):
    """Run all prompts through the trunk at once (eager). Returns (cache, last-position logits (B, V),
    hidden (B, L, d), the last layer's input (B, L, d))."""
    device = engine.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    if int(lengths.min()) < 1:
        raise ValueError("every prompt needs at least one token")
    width = int(lengths.max())
    idx = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        idx[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    cache = engine.new_cache(len(prompts), capacity)
    hidden, shared = engine.forward(idx, cache, static=False)
    cache.rollback(lengths)
    last = hidden[torch.arange(len(prompts), device=device), lengths - 1]
    return cache, engine.head(last), hidden, shared


def cache_capacity(engine: Engine, needed: int) -> int:
    """Exactly what the call needs; with fixed-shape graphs (`engine.static`), the model's context (or
    more when needed), so every call of that batch size reuses one compiled shape."""
    return max(needed, engine.cfg.context) if engine.static else needed


@torch.no_grad()
def generate(trunk: Trunk, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, stop: StopFn | None = None, eos_id: int | None = None,
             generator: torch.Generator | None = None, compile: bool | None = None, timer=None) -> list[list[int]]:
    """Completions (new token ids only) for each prompt. Stops a row at EOS, at `stop`, or at the limit.
    `compile` runs the 1-token step compiled (None: the device's default); `timer` times the phases
    prefill / step."""
    if not prompts:
        return []
    engine, timer = engine_for(trunk, compile=compile), timer or NO_TIMER
    needed = max(len(p) for p in prompts) + max_new_tokens + 1
    with timer("prefill"):
        cache, logits, _, _ = prefill(engine, prompts, cache_capacity(engine, needed), pad_id=eos_id or 0)
    outputs: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))  # original row index of each batch row
    live = list(range(len(prompts)))  # batch rows still generating
    compact_at = 0.0 if engine.static else COMPACT_AT  # fixed-shape graphs: one batch shape, no recompilation
    for step in range(max_new_tokens):
        if len(live) == len(active):
            tokens = next_token(logits, temperature, top_p, generator)
            picked = tokens.tolist()
        else:
            tokens = torch.full((len(active),), eos_id or 0, dtype=torch.long, device=logits.device)
            live_rows = torch.tensor(live, device=logits.device)
            tokens[live_rows] = next_token(logits[live_rows], temperature, top_p, generator)
            picked = tokens[live_rows].tolist()
        still = []
        for row, tok in zip(live, picked):
            i = active[row]
            outputs[i].append(tok)
            done = (eos_id is not None and tok == eos_id) or (stop is not None and stop(i, outputs[i]))
            if not done:
                still.append(row)
        live = still
        if not live or step + 1 >= max_new_tokens:
            break
        if len(live) <= compact_at * len(active):
            rows = torch.tensor(live, device=tokens.device)
            cache.select(rows)
            tokens = tokens[rows]
            active = [active[r] for r in live]
            live = list(range(len(active)))
        with timer("step"):
            logits = engine.step(tokens[:, None], cache)[0][:, -1]
    return outputs
