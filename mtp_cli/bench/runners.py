"""The methods specbench times, each a `Runner` (a batch of prompts in, outputs and time to first token
out): our plain decoder, our MTP self-speculative decoder, and the Hugging Face peers on the same weights."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mtp_cli.base.errors import UserError
from mtp_cli.bench.llamacpp import LLAMACPP_METHODS
from mtp_cli.config.conditions import Condition
from mtp_cli.decode.generate import generate
from mtp_cli.decode.speculative import Drafter, SpecStats, make_drafter, speculative_generate
from mtp_cli.decode.timing import PhaseTimer
from mtp_cli.model.hf import export_run, generation_config, to_hf_model
from mtp_cli.model.hf_mtp import enable_mtp
from mtp_cli.model.weight_format import use_weights, weight_format

PROMPT_LOOKUP_TOKENS = 10  # the value transformers' documentation uses


SAMPLED_SKIP = "measured at temperature 0 only, to keep the benchmark's cost down"


PEERS_SKIP = {"primary": "peers timed in the primary condition only (--peers primary)",
              "none": "peers not timed (--peers none): they run the trunk alone, the same for every drafter of one trunk"}


SAMPLE_SEED = 0


AA_METHOD = "aa_control"  # the baseline's decoder timed a second time as if another method: its speed-up is 1


@dataclass
class Tally:
    """One method over all prompts in one repeat."""
    walls: list[float] = field(default_factory=list)  # per batch
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    tokens: int = 0
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    stats: SpecStats | None = None
    per_batch: list[SpecStats] = field(default_factory=list)  # MTP draft counts of each batch, in order
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / sum(self.walls)


Runner = Callable[[list[list[int]], Tally], tuple[list[list[int]], float]]  # batch -> (outputs, TTFT)


def weight_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


BATCH_ONE_PEERS = ("hf_prompt_lookup", "hf_assisted", "hf_mtp",  # transformers' assisted decoding: one row
                   *LLAMACPP_METHODS)  # llama-cpp-python's generate: one sequence


def applicable(runners: dict, bs: int) -> dict:
    return {m: r for m, r in runners.items() if bs == 1 or m not in BATCH_ONE_PEERS}


def methods_for(condition: Condition, run, hf, hf_draft, max_new_tokens: int, k: int | None,
             compile: bool, peers_left_out: str | None = None, vocab: torch.Tensor | None = None,
             width: int = 1, hf_mtp=(None, "no MTP module"), llamacpp=({}, {})) -> tuple[dict, dict]:
    """The methods measured in one condition, and {method: why not} for the peers left out (all of them where
    `peers_left_out` names the reason, a key of PEERS_SKIP). `width`: MTP's tree width where it applies
    (one row, greedy; `speculative_generate`). `hf_mtp`: (transformers model that decodes with the run's
    own module, or None; why not), from `hf_mtp_model`. `llamacpp`: ({method: runner}, {method: why not}) from
    `llamacpp.llamacpp_runners`, timed at temperature 0 where the peers are."""
    model, tokenizer, eos, t = run.model, run.tokenizer, run.tokenizer.eos_token_id, condition.temperature
    runners = {condition.baseline: ours_plain(model, max_new_tokens, eos, compile, t),
               AA_METHOD: ours_plain(model, max_new_tokens, eos, compile, t)}
    if k:
        runners["mtp"] = ours_mtp(make_drafter(model, k, compile=compile, draft_vocab=vocab, width=width),
                                  max_new_tokens, eos, t)
    peers = {"hf_prompt_lookup": (hf, {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS})}
    if hf_draft is not None:
        peers["hf_assisted"] = (hf, {"assistant_model": hf_draft})
    mtp_model, no_mtp = hf_mtp
    skipped = {} if mtp_model is not None or not k else {"hf_mtp": no_mtp}
    if mtp_model is not None:
        peers["hf_mtp"] = (mtp_model, {"use_mtp": True})
    llama, no_llama = llamacpp
    if peers_left_out:
        return runners, {name: PEERS_SKIP[peers_left_out]
                         for name in ["hf_generate", *peers, *skipped, *LLAMACPP_METHODS]}
    runners["hf_generate"] = _hf_runner(hf, tokenizer, max_new_tokens, {}, t)
    if t > 0:
        return runners, {name: SAMPLED_SKIP for name in [*peers, *LLAMACPP_METHODS]} | skipped
    return runners | {name: _hf_runner(model, tokenizer, max_new_tokens, extra, t)
                      for name, (model, extra) in peers.items()} | llama, skipped | no_llama


def _generator(device, temperature: float, first_prompt: int) -> torch.Generator | None:
    """Sampling's random numbers: one stream per batch, seeded by its first prompt's index."""
    return torch.Generator(device).manual_seed(SAMPLE_SEED + first_prompt) if temperature > 0 else None


def ours_plain(model, max_new_tokens: int, eos: int, compile: bool, temperature: float = 0.0) -> Runner:
    def run(batch, tally):
        before = tally.timer.total["prefill"]
        gen = _generator(model.trunk.embed_tokens.weight.device, temperature, len(tally.outputs))
        out = generate(model.trunk, batch, max_new_tokens, temperature=temperature, eos_id=eos, generator=gen,
                       compile=compile, timer=tally.timer)
        return out, tally.timer.total["prefill"] - before
    return run


def ours_mtp(drafter: Drafter, max_new_tokens: int, eos: int, temperature: float = 0.0) -> Runner:
    def run(batch, tally):
        tally.stats, stats = tally.stats or SpecStats(drafter.k), SpecStats(drafter.k)
        before = tally.timer.total["prefill"]
        gen = _generator(drafter.engine.device, temperature, len(tally.outputs))
        out = speculative_generate(drafter, batch, max_new_tokens, temperature=temperature, eos_id=eos,
                                   generator=gen, stats=stats, timer=tally.timer)
        tally.stats.merge(stats)
        tally.per_batch.append(stats)
        return out, tally.timer.total["prefill"] - before
    return run


def hf_model(run):
    from transformers.utils import logging as hf_logging  # transformers: seconds of start-up, only on this path


    hf_logging.set_verbosity_error()
    w = run.model.trunk.embed_tokens.weight
    model = to_hf_model(run).to(device=w.device, dtype=w.dtype)  # the run's weights at the benchmark's dtype
    model.generation_config = generation_config(run.tokenizer)
    return model


def hf_mtp_model(run_dir, run, folder: Path):
    """transformers' own MTP self-speculative decoding with the run's module: the run exported with it into
    `folder` (`mtp export --with-mtp`) and loaded as a user loads it (`hf_mtp.enable_mtp`). Returns (model,
    None), or (None, why not) where transformers cannot express the module (`hf_mtp.check_exportable`)."""
    from transformers import AutoModelForCausalLM  # transformers: seconds of start-up, only on this path

    try:
        export_run(run_dir, folder, with_mtp=True)
    except UserError as exc:
        return None, str(exc).removeprefix("--with-mtp: ")
    w = run.model.trunk.embed_tokens.weight
    model = AutoModelForCausalLM.from_pretrained(folder).to(device=w.device).eval()
    use_weights(model, weight_format(run.model))  # int8: the same layers quantized alike, from the same fp32 weights
    model.config.dtype = model.dtype  # generate(use_mtp=True) loads its MTP layer at this dtype on every call
    enable_mtp(model)
    model.generation_config = generation_config(run.tokenizer)
    return model, None


class _FirstToken:
    """A transformers streamer (duck-typed: `put`, `end`) that notes when the first generated token
    arrives; its first `put` is the prompt."""

    def __init__(self):
        self.puts, self.at = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def _hf_runner(hf, tokenizer, max_new_tokens: int, extra: dict, temperature: float = 0.0) -> Runner:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    # pure temperature sampling, as ours does: no top-k (transformers' default is 50) and no nucleus
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 \
        else {"do_sample": False}

    def run(batch, tally):
        width = max(len(p) for p in batch)
        idx = torch.full((len(batch), width), pad, dtype=torch.long, device=hf.device)
        mask = torch.zeros_like(idx)
        for i, p in enumerate(batch):  # left padding, as decoder-only generation needs
            idx[i, width - len(p):] = torch.tensor(p, device=hf.device)
            mask[i, width - len(p):] = 1
        if temperature > 0:
            torch.manual_seed(SAMPLE_SEED + len(tally.outputs))  # transformers samples from the global generator
        clock, t0 = _FirstToken(), time.perf_counter()
        with torch.no_grad():
            out = hf.generate(input_ids=idx, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=eos,
                              pad_token_id=pad, streamer=clock, **sampling, **extra)
        ttft = (clock.at or time.perf_counter()) - t0
        rows = []
        for row in out[:, width:].tolist():
            rows.append(row[: row.index(eos) + 1] if eos in row else row)
        return rows, ttft
    return run
