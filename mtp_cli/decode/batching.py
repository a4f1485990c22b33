"""Text in, text out over many prompts: tokenize, batch by length, decode with `generate`.

Prompts are sorted by token length (longest first, so the largest batch comes first and padding
in each prefill is small) and decoded in chunks; results come back in the caller's order. The
evals (HumanEval, the lm-eval model class) and `mtp generate` all go through here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from mtp_cli.base import env
from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import Runtime
from mtp_cli.decode.context import generation_budget, generation_cut
from mtp_cli.decode.draft_vocab import draft_vocabulary
from mtp_cli.decode.generate import generate, stop_on_strings
from mtp_cli.decode.speculative import SpecStats, make_drafter, speculative_generate
from mtp_cli.model.checkpoint import load_run
from mtp_cli.model.weight_format import use_weights

BATCH_SIZE = 64


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt, with the tokenizer's own special-token convention (as lm-eval's HFLM), except
    that a text which already starts with the BOS token (a chat template's output) gets no second one, as HFLM."""
    bos = getattr(tokenizer, "bos_token", None)
    return tokenizer(text, add_special_tokens=not (bos and text.startswith(bos))).input_ids


@torch.no_grad()
def generate_ids(trunk, tokenizer, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, stops: Sequence[str] = (), generator: torch.Generator | None = None,
                 batch_size: int = BATCH_SIZE, progress=None, description: str = "generate",
                 compile: bool | None = None) -> list[list[int]]:
    """New token ids per prompt (EOS included when reached), stopping at any of `stops`. `compile`:
    `generate`'s (None: the device's default)."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    eos = tokenizer.eos_token_id
    stop = stop_on_strings(tokenizer, list(stops), eos)
    task = progress.add_task(description, total=len(prompts), info="") if progress is not None else None
    out: list[list[int] | None] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ids = generate(trunk, [prompts[i] for i in chunk], max_new_tokens, temperature=temperature, top_p=top_p,
                       stop=stop, eos_id=eos, generator=generator, compile=compile)
        for i, completion in zip(chunk, ids):
            out[i] = completion
        if progress is not None:
            progress.advance(task, len(chunk))
    return out  # type: ignore[return-value]


def complete(run_dir, prompt: str, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, speculative: bool = False, draft_len: int | None = None,
             draft_vocab: int | None = None, rt: Runtime | None = None) -> dict:
    """`mtp generate`: one completion from a run's trunk, on `rt`'s device. {'text', 'tokens', 'seconds'},
    plus the drafting counters under 'speculative' when the run's MTP modules draft (greedy: the same text)."""
    rt = rt or Runtime()
    rt.validate()
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0) or not 0 < top_p <= 1:
        raise UserError(f"need a finite --temperature >= 0 and 0 < --top-p <= 1, got {temperature} and {top_p}")
    if not 0 <= seed < 2**63:
        raise UserError(f"--seed must be in [0, 2**63), got {seed}")
    run = load_run(run_dir, env.use_runtime(rt))
    use_weights(run.model, rt.dtype)
    compile = rt.compile
    ids = encode(run.tokenizer, prompt)
    if not ids:
        raise UserError("--prompt is empty")
    context, asked = run.recipe.model.context, max_new_tokens
    max_new_tokens = generation_budget(max_new_tokens, context)  # lm-eval's rules, as the evals apply them
    cut = generation_cut(len(ids), max_new_tokens, context)
    ids = ids[cut:]
    if draft_len is not None and not speculative:
        raise UserError("--draft-len needs --speculative")
    if draft_vocab is not None and not speculative:
        raise UserError("--draft-vocab needs --speculative")
    generator = torch.Generator(run.model.trunk.embed_tokens.weight.device).manual_seed(seed)
    t0 = time.perf_counter()
    if speculative:
        vocab, _ = draft_vocabulary(run, draft_vocab)
        drafter = make_drafter(run.model, draft_len, compile=compile, draft_vocab=vocab)
        stats = SpecStats(drafter.k)
        (out,) = speculative_generate(drafter, [ids], max_new_tokens, temperature=temperature, top_p=top_p,
                                      eos_id=run.tokenizer.eos_token_id, generator=generator, stats=stats)
    else:
        (out,) = generate_ids(run.model.trunk, run.tokenizer, [ids], max_new_tokens, temperature=temperature,
                              top_p=top_p, generator=generator, compile=compile)
    seconds = time.perf_counter() - t0
    result = {"text": run.tokenizer.decode(out, skip_special_tokens=True), "tokens": len(out), "seconds": seconds,
              "prompt_tokens": len(ids) + cut, "prompt_cut": cut, "context": context,
              "max_new_tokens": max_new_tokens, "max_new_tokens_asked": asked}
    if speculative:
        result["speculative"] = stats.to_dict()
    return result
