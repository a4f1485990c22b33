"""`mtp specbench`: measured end-to-end latency of MTP self-speculative decoding against our own plain
greedy decoder and Hugging Face peers on the exported trunk — every figure timed, every output checked.

Per batch size the methods run interleaved (the order rotates each repeat, so a slow spell on a
shared machine hits all of them) after one warm-up pass: R timed repeats over the same prompts,
reported as medians with 95% percentile-bootstrap intervals over repeats. Methods:
- greedy: `generate`, our KV-cache decoder (the reference output and the baseline for speedups);
- mtp: `speculative_generate` with the run's own modules (absent for an NTP run: nothing to draft with);
- hf_generate: `LlamaForCausalLM.generate`, greedy, on the same weights;
- hf_prompt_lookup: its prompt-lookup decoding (batch size 1 only, a transformers restriction);
- hf_assisted: its draft-model speculative decoding with `--draft RUN`'s trunk (batch size 1 only).
Every method's output is compared with greedy's on every prompt (`lossless`); where they differ the
first differing position and our trunk's top-2 logit gap there say whether a near-tie explains it.
Ideal MTP speedup, from measured parts: MAL · T_step / (T_verify + T_draft).

Conditions: every prompt source (`--prompts humaneval,heldout`) × temperature (`--temperatures 0,0.8`)
is measured as above. At temperature > 0 the baseline is our plain sampling (`sample`), MTP runs
speculative sampling (lossless in distribution, not token for token, so `lossless` is None) and
the HF peer samples too; every batch is seeded by its first prompt's index, so repeats decode the
same text. `primary` names the condition the headline comes from. Each row says what text it timed
(`degenerate_share`, `whitespace_share`: decode/degeneracy.py), each condition's `text` does so for
the reference (our plain decoder at the smallest batch size), and MTP rows carry per-prompt
(batch size 1; per-batch above) draft counts and a bootstrap interval of the acceptance rate over them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mtp_cli import env, outputs, ui
from mtp_cli.bench.forward_cost import forward_costs
from mtp_cli.checkpoint import load_run
from mtp_cli.conditions import HELDOUT, Condition, plan_conditions
from mtp_cli.data import tokenizer as toklib
from mtp_cli.data.prompts import HELDOUT_PROMPT_TOKENS, heldout_prompts, load_prompts
from mtp_cli.decode.degeneracy import text_stats
from mtp_cli.decode.draft_vocab import draft_vocabulary
from mtp_cli.decode.engine import default_compile, engine_for
from mtp_cli.decode.generate import generate
from mtp_cli.decode.speculative import SpecStats, draft_len_for, make_drafter, speculative_generate
from mtp_cli.decode.timing import PhaseTimer
from mtp_cli.errors import UserError
from mtp_cli.files import write_json
from mtp_cli.stats import median_ci, ratio_ci

JSON_NAME = "specbench.json"
PROMPT_LOOKUP_TOKENS = 10  # the value transformers' documentation uses
INTERVAL = "95% percentile-bootstrap interval of the median over repeats"
LABELS = {"greedy": "ours, plain greedy", "mtp": "ours, MTP self-speculative", "hf_generate": "HF generate (greedy)",
          "hf_prompt_lookup": "HF prompt lookup", "hf_assisted": "HF assisted (draft model)",
          "sample": "ours, plain sampling"}
SAMPLED_LABELS = {"mtp": "ours, MTP speculative sampling", "hf_generate": "HF generate (sampling)"}
SAMPLED_SKIP = "measured at temperature 0 only, to keep the benchmark's cost down"
PRIMARY_ONLY_SKIP = "peers timed in the primary condition only (--peers primary)"
PEER_SCOPES = ("all", "primary")
SAMPLE_SEED = 0
ACCEPTANCE_INTERVAL = ("95% percentile bootstrap of accepted/drafted (ratio of sums) over prompts (batch size 1) "
                       "or batches (larger batch sizes), first timed repeat")


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


def run_specbench(run_dir, prompts: str | Sequence[str] = "humaneval", limit: int | None = 20,
                  max_new_tokens: int = 128, batch_sizes: Sequence[int] = (1,), repeats: int = 5,
                  draft_len: int | None = None, draft_run=None, json_path=None, show_progress: bool = True,
                  gsm8k_data=None, threads: int | None = None, temperatures: Sequence[float] = (0.0,),
                  primary: str | None = None, compile: bool | None = None, peers: str = "all",
                  draft_vocab: int | None = None) -> dict:
    """Benchmark one run on every prompt source (comma-separated or a list) × temperature; writes the
    report to `json_path` (default `<run>/specbench.json`) and returns it. `primary` names the headline
    condition (default: the first); `peers` = "primary" times the Hugging Face peers in that condition only.
    `threads` sets torch's intra-op threads (default: as they are); `compile` our decoders'
    torch.compile switch (None: the device's default); `draft_vocab` how many of the most frequent
    training tokens the MTP modules draft from (None: a quarter of the vocabulary; 0: all of it)."""
    batch_sizes = _check_args(limit, max_new_tokens, batch_sizes, repeats)
    json_path = outputs.file(Path(json_path) if json_path else Path(run_dir) / JSON_NAME, "--json")
    conditions, primary = plan_conditions(prompts, temperatures, primary)
    if peers not in PEER_SCOPES:
        raise UserError(f"--peers must be one of {', '.join(PEER_SCOPES)}, got {peers!r}")
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be >= 1, got {threads}")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads or saved)
    try:
        return _specbench(run_dir, conditions, primary, limit, max_new_tokens, batch_sizes, repeats, draft_len,
                          draft_run, json_path, show_progress, gsm8k_data, compile, peers, draft_vocab)
    finally:
        torch.set_num_threads(saved)


def _specbench(run_dir, conditions: list[Condition], primary: str, limit, max_new_tokens, batch_sizes, repeats,
               draft_len, draft_run, json_path, show_progress, gsm8k_data, compile, peers="all",
               draft_vocab: int | None = None) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    compile = default_compile(device) if compile is None else compile
    run = load_run(run_dir, device)
    prompt_sets: dict[str, tuple[list[list[int]], dict]] = {}
    for source in dict.fromkeys(c.source for c in conditions):  # all inputs are checked before anything is timed
        prompt_sets[source] = _prompt_ids(run, source, limit, max_new_tokens, gsm8k_data)
    draft = _load_draft(draft_run, run, device) if draft_run else None
    model = run.model
    k = draft_len_for(model, draft_len) if model.n_extra else None
    vocab, vocab_info = draft_vocabulary(run, draft_vocab) if k else (None, None)
    hf = _hf_model(run)
    hf_draft = _hf_model(draft) if draft is not None else None
    plans = [(c, *_runners(c, run, hf, hf_draft, max_new_tokens, k, compile, peers == "all" or c.name == primary,
                           vocab)) for c in conditions]

    report = _header(run, max_new_tokens, batch_sizes, repeats, k, draft, primary)
    report["draft_vocab"] = vocab_info
    report["environment"]["compile"] = compile
    n_tasks = sum(len(_applicable(runners, bs)) * (repeats + 1) for _, runners, _ in plans for bs in batch_sizes)
    with ui.progress(transient=True, disable=not show_progress) as bar:
        task = bar.add_task("specbench", total=n_tasks, info="")
        for condition, runners, skipped in plans:
            ids, prompt_info = prompt_sets[condition.source]
            entry = _condition_entry(condition, prompt_info)
            for bs in batch_sizes:
                active = _applicable(runners, bs)
                entry["skipped"][str(bs)] = skipped | {m: "transformers supports it at batch size 1 only"
                                                       for m in runners if m not in active}
                tallies = _measure(active, ids, bs, repeats, device,
                                   lambda m, c=condition.name, b=bs: bar.update(task, advance=1, info=f"{c} bs {b} {m}"))
                entry["results"][str(bs)] = _summarise(tallies, model, ids, condition, run.tokenizer, bs)
                _add_forward_costs(entry["results"][str(bs)], model, ids[:bs], k, compile, condition.baseline, vocab)
                entry["summary"][str(bs)] = _headline(entry["results"][str(bs)], condition.baseline)
                if bs == batch_sizes[0]:  # the reference text: our plain decoder, smallest batch size
                    entry["text"] = text_stats(tallies[condition.baseline][0].outputs, run.tokenizer)
            report["conditions"].append(entry)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(json_path, report)
    return report


# ---- inputs ---------------------------------------------------------------------------------------
def _check_args(limit, max_new_tokens, batch_sizes, repeats) -> list[int]:
    sizes = list(batch_sizes)
    if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
        raise UserError(f"batch sizes must be integers >= 1, got {sizes}")
    for name, value in (("--limit", limit if limit is not None else 1), ("--max-new-tokens", max_new_tokens),
                        ("--repeats", repeats)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    return sorted(set(sizes))


def _prompt_ids(run, source: str, limit, max_new_tokens: int, gsm8k_data) -> tuple[list[list[int]], dict]:
    """One source's prompts as token ids, cut from the left so that prompt plus completion fit the
    model's context. Text prompts use the tokenizer's own convention (as the evals do); heldout
    prompts are the validation split's own token ids (as the trunk saw text in training)."""
    context = run.recipe.model.context
    keep = context - max_new_tokens
    if keep < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's context of "
                        f"{context} tokens; use fewer than {context}")
    origin = None
    if source == HELDOUT:
        full, origin = heldout_prompts(run, limit, min(HELDOUT_PROMPT_TOKENS, keep))
    else:
        full = [run.tokenizer(t).input_ids for t in load_prompts(source, limit, gsm8k_data)]
    if any(not x for x in full):
        raise UserError("a prompt encodes to zero tokens; remove empty prompts")
    ids = [x[-keep:] for x in full]
    info = {"source": source, "count": len(ids), "mean_tokens": float(np.mean([len(x) for x in ids])),
            "max_tokens": max(len(x) for x in ids), "truncated": sum(len(x) > keep for x in full),
            "kept_tokens": keep}
    return ids, info | ({"documents": origin} if origin else {})


def _load_draft(draft_run, run, device):
    draft = load_run(draft_run, device)
    if toklib.fingerprint(draft.tokenizer) != toklib.fingerprint(run.tokenizer) \
            or draft.recipe.model.vocab_size != run.recipe.model.vocab_size:
        raise UserError(f"draft run {draft_run} uses another tokenizer than {run.run_dir}: "
                        "a draft model must share the target's vocabulary")
    if _bytes(draft.model.trunk) >= _bytes(run.model.trunk):
        ui.console.print(f"[yellow]warning:[/yellow] draft run {draft_run} is not smaller than the target's trunk")
    return draft


def _bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _applicable(runners: dict, bs: int) -> dict:
    return {m: r for m, r in runners.items() if bs == 1 or m not in ("hf_prompt_lookup", "hf_assisted")}


# ---- the methods ----------------------------------------------------------------------------------
def _runners(condition: Condition, run, hf, hf_draft, max_new_tokens: int, k: int | None,
             compile: bool, with_peers: bool = True, vocab: torch.Tensor | None = None) -> tuple[dict, dict]:
    """The methods measured in one condition, and {method: why not} for the peers left out."""
    model, tokenizer, eos, t = run.model, run.tokenizer, run.tokenizer.eos_token_id, condition.temperature
    runners = {condition.baseline: _ours_plain(model, max_new_tokens, eos, compile, t)}
    if k:
        runners["mtp"] = _ours_mtp(model, max_new_tokens, eos, k, compile, t, vocab)
    peers = {"hf_prompt_lookup": {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}}
    if hf_draft is not None:
        peers["hf_assisted"] = {"assistant_model": hf_draft}
    if not with_peers:
        return runners, {name: PRIMARY_ONLY_SKIP for name in ["hf_generate", *peers]}
    runners["hf_generate"] = _hf_runner(hf, tokenizer, max_new_tokens, {}, t)
    if t > 0:
        return runners, {name: SAMPLED_SKIP for name in peers}
    return runners | {name: _hf_runner(hf, tokenizer, max_new_tokens, extra, t) for name, extra in peers.items()}, {}


def _generator(device, temperature: float, first_prompt: int) -> torch.Generator | None:
    """Sampling's random numbers: one stream per batch, seeded by its first prompt's index."""
    return torch.Generator(device).manual_seed(SAMPLE_SEED + first_prompt) if temperature > 0 else None


def _ours_plain(model, max_new_tokens: int, eos: int, compile: bool, temperature: float = 0.0) -> Runner:
    def run(batch, tally):
        before = tally.timer.total["prefill"]
        gen = _generator(model.trunk.embed_tokens.weight.device, temperature, len(tally.outputs))
        out = generate(model.trunk, batch, max_new_tokens, temperature=temperature, eos_id=eos, generator=gen,
                       compile=compile, timer=tally.timer)
        return out, tally.timer.total["prefill"] - before
    return run


def _ours_mtp(model, max_new_tokens: int, eos: int, k: int, compile: bool, temperature: float = 0.0,
             vocab: torch.Tensor | None = None) -> Runner:
    def run(batch, tally):
        tally.stats, stats = tally.stats or SpecStats(k), SpecStats(k)
        before = tally.timer.total["prefill"]
        gen = _generator(model.trunk.embed_tokens.weight.device, temperature, len(tally.outputs))
        out = speculative_generate(model, batch, max_new_tokens, draft_len=k, temperature=temperature, eos_id=eos,
                                   generator=gen, stats=stats, timer=tally.timer, compile=compile, draft_vocab=vocab)
        tally.stats.merge(stats)
        tally.per_batch.append(stats)
        return out, tally.timer.total["prefill"] - before
    return run


def _hf_model(run):
    from transformers.utils import logging as hf_logging

    from mtp_cli.model.hf import generation_config, to_hf_model

    hf_logging.set_verbosity_error()
    model = to_hf_model(run).to(run.model.trunk.embed_tokens.weight.device)
    model.generation_config = generation_config(run.tokenizer)
    return model


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


# ---- measuring ------------------------------------------------------------------------------------
def _measure(runners: dict, ids: list[list[int]], bs: int, repeats: int, device: str, tick) -> dict[str, list[Tally]]:
    batches = [ids[i:i + bs] for i in range(0, len(ids), bs)]
    names = list(runners)
    for name in names:  # warm-up: allocator, lazy initialisation, caches
        runners[name](batches[0], Tally(timer=PhaseTimer(device)))
        tick(name)
    tallies: dict[str, list[Tally]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            tally = Tally(timer=PhaseTimer(device))
            for batch in batches:
                t0 = time.perf_counter()
                out, ttft = runners[name](batch, tally)
                if device == "cuda":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - t0
                n = max(len(o) for o in out)
                tally.walls.append(wall)
                tally.ttfts.append(ttft)
                tally.tpots.append((wall - ttft) / (n - 1) if n > 1 else float("nan"))
                tally.tokens += sum(len(o) for o in out)
                tally.outputs.extend(out)
            tallies[name].append(tally)
            tick(name)
    return tallies


def _put(entry: dict, key: str, values: Sequence[float]) -> None:
    entry[key], entry[key + "_ci"] = median_ci(values)


def _summarise(tallies: dict[str, list[Tally]], model, ids: list[list[int]], condition: Condition, tokenizer,
               bs: int) -> dict:
    base = tallies[condition.baseline]
    reference = base[0].outputs
    sampled = condition.temperature > 0
    results = {}
    for name, runs in tallies.items():
        label = SAMPLED_LABELS.get(name, LABELS[name]) if sampled else LABELS[name]
        e: dict = {"label": label, "tokens": runs[0].tokens}
        _put(e, "tokens_per_s", [t.tokens_per_s for t in runs])
        _put(e, "speedup", [t.tokens_per_s / b.tokens_per_s for t, b in zip(runs, base)])
        _put(e, "latency_s", [float(np.mean(t.walls)) for t in runs])
        _put(e, "ttft_s", [float(np.mean(t.ttfts)) for t in runs])
        _put(e, "tpot_s", [float(np.nanmean(t.tpots)) for t in runs])
        if sampled:  # samples differ token for token; speculative sampling is lossless in distribution only
            e.update({"lossless": None, "identical_prompts": None, "mismatches": []})
        else:
            e.update(_lossless(model, ids, reference, runs[0].outputs))
        stats = text_stats(runs[0].outputs, tokenizer)
        e.update(degenerate_share=stats["degenerate_share"], whitespace_share=stats["whitespace_share"])
        if name in (condition.baseline, "mtp"):
            e["t_prefill_s"] = median_ci([t.timer.mean("prefill") for t in runs])[0]
        if name == condition.baseline:
            e["t_step_s"] = median_ci([t.timer.mean("step") for t in runs])[0]
        if name == "mtp":
            e.update(_spec_entry(runs, base))
            e.update(_acceptance_by_unit(runs[0].per_batch, bs))
        results[name] = e
    return results


def _acceptance_by_unit(per_batch: list[SpecStats], bs: int) -> dict:
    """Draft counts per prompt (per batch when batches hold several prompts) and the bootstrap interval
    of the acceptance rate over them."""
    units = [{"accepted": s.accepted, "drafted": s.drafted, "steps": s.steps} for s in per_batch]
    ci = ratio_ci([u["accepted"] for u in units], [u["drafted"] for u in units])
    return {"acceptance_rate_ci": ci, ("per_prompt" if bs == 1 else "per_batch"): units}


def _spec_entry(runs: list[Tally], base: list[Tally]) -> dict:
    stats = runs[0].stats
    e = stats.to_dict()
    mal = stats.mean_acceptance_length
    ideal, parts = [], {"t_verify_s": [], "t_draft_s": [], "t_verify_draft_s": [], "t_other_s": []}
    fused = runs[0].timer.count["verify_draft"] > 0  # one row, greedy: verify and draft are one call
    for t, b in zip(runs, base):
        if fused:
            verify, draft = t.timer.mean("verify_draft"), 0.0
        else:
            verify, draft = t.timer.mean("verify"), t.timer.mean("draft") or 0.0
            parts["t_verify_s"].append(verify)
            parts["t_draft_s"].append(draft)
        ideal.append(mal * b.timer.mean("step") / (verify + draft))
        steps = t.timer.count["verify_draft" if fused else "verify"]
        other = sum(t.walls) - sum(t.timer.total[p] for p in ("prefill", "draft0", "draft", "verify", "verify_draft"))
        parts["t_verify_draft_s"].append(verify + draft)
        parts["t_other_s"].append(other / steps)
    _put(e, "ideal_speedup", ideal)
    e["fused"] = fused
    for key, values in parts.items():
        e[key] = median_ci(values)[0] if values else None
    e["t_draft0_s"] = median_ci([t.timer.mean("draft0") for t in runs])[0]
    _put(e, "speedup_over_ideal", [t.tokens_per_s / b.tokens_per_s / i for t, b, i in zip(runs, base, ideal)])
    return e


VERIFY_WIDTHS_UP_TO = 3  # t_verify is measured for k = 1..max(3, the draft length)


def _add_forward_costs(results: dict, model, prompts: list[list[int]], k: int | None, compile: bool,
                       baseline: str = "greedy", draft_vocab: torch.Tensor | None = None) -> None:
    """Beside the end-to-end phase means: the one-time compile cost of our decoders (`compile_s`, in
    their warm-up), and the trunk forward at fixed widths on these prompts (`t_forward_by_width_s`:
    width 1 is the plain step, width k+1 verifies k drafts; `t_verify_by_k_s` and its ratio to the
    step for k = 1..max(3, k)); one row, greedy, also the fused verify-and-draft call
    (`t_forward_verify_draft_s`) and the draft's share of it, beyond verifying (`t_draft_s`)."""
    greedy_engine = engine_for(model.trunk, compile=compile)
    results[baseline]["compile_s"] = greedy_engine.compile_s
    if "mtp" not in results:
        return
    engine = engine_for(model.trunk, model, compile=compile)
    results["mtp"]["compile_s"] = engine.compile_s
    ks = range(1, max(VERIFY_WIDTHS_UP_TO, k) + 1)
    fused = None
    if results["mtp"].get("fused"):  # one row, greedy: the verify-and-draft call the loop ran, timed alike
        fused = lambda capacity: make_drafter(model, k, 1, capacity + 2 * k + 2, compile, draft_vocab)  # noqa: E731
    costs = forward_costs(engine, prompts, [1, *(j + 1 for j in ks)], fused=fused)
    results["mtp"]["t_forward_step_s"] = costs[1]
    if fused is not None:  # the draft's share of the fused call: beyond verifying at width k+1
        results["mtp"]["t_forward_verify_draft_s"] = costs["fused"]
        results["mtp"]["t_draft_s"] = costs["fused"] - costs[k + 1]
    results["mtp"]["t_verify_by_k_s"] = {str(j): costs[j + 1] for j in ks}
    results["mtp"]["verify_over_step_by_k"] = {str(j): costs[j + 1] / costs[1] for j in ks}


def _lossless(model, ids, reference: list[list[int]], outputs: list[list[int]]) -> dict:
    mismatches = []
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        if ref != out:
            pos = next((j for j, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
            mismatches.append({"prompt": i, "position": pos, "top2_logit_gap": _top2_gap(model, ids[i] + ref[:pos]),
                               "expected": ref[pos] if pos < len(ref) else None,
                               "got": out[pos] if pos < len(out) else None})
    return {"lossless": not mismatches, "identical_prompts": len(reference) - len(mismatches),
            "mismatches": mismatches}


@torch.no_grad()
def _top2_gap(model, context: list[int]) -> float:
    device = model.trunk.embed_tokens.weight.device
    top = model.trunk(torch.tensor([context], device=device))[0, -1].topk(2).values
    return float(top[0] - top[1])


# ---- the report -----------------------------------------------------------------------------------
def _header(run, max_new_tokens, batch_sizes, repeats, k, draft, primary: str) -> dict:
    import transformers

    model = run.model
    params = {"trunk": model.param_counts()["trunk"], "mtp": model.param_counts()["mtp"],
              "mtp_bytes": _bytes(model.mtp)}
    if draft is not None:
        params.update({"draft_run": str(draft.run_dir), "draft_params": draft.model.param_counts()["trunk"],
                       "draft_bytes": _bytes(draft.model.trunk)})
    no_mtp = None
    if not k:
        no_mtp = (f"objective {model.objective!r} trains no MTP modules, so there is nothing to draft with: "
                  "only the baseline and the Hugging Face peers are measured")
    return {
        "schema": 2, "run": str(run.run_dir), "step": run.step, "objective": model.objective,
        "depth": model.mtp_cfg.depth if model.objective == "sequential" else None,
        "heads": model.mtp_cfg.heads if model.objective == "parallel" else None,
        "mtp_input": model.mtp_cfg.mtp_input if model.objective == "sequential" else None,
        "draft_len": k, "max_new_tokens": max_new_tokens,
        "batch_sizes": batch_sizes, "repeats": repeats, "interval": INTERVAL,
        "acceptance_interval": ACCEPTANCE_INTERVAL, "params": params,
        "no_mtp_reason": no_mtp,
        "peers": {"hf_prompt_lookup": {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS},
                  "hf_assisted": {"draft_run": str(draft.run_dir)} if draft is not None else None},
        "environment": {"device": str(model.trunk.embed_tokens.weight.device), "threads": torch.get_num_threads(),
                        "torch": torch.__version__, "transformers": transformers.__version__,
                        "dtype": str(model.trunk.embed_tokens.weight.dtype).removeprefix("torch.")},
        "git_commit": env.git_commit(), "primary": primary, "conditions": [],
    }


def _condition_entry(condition: Condition, prompt_info: dict) -> dict:
    return {"name": condition.name, "prompts": prompt_info, "temperature": condition.temperature,
            "baseline": condition.baseline, "results": {}, "summary": {}, "skipped": {}, "text": {}}


def _headline(results: dict, baseline: str = "greedy") -> dict:
    """Speedups are over `baseline` (our plain decoder); the keys keep their schema-1 names in every condition."""
    out = {}
    if "hf_generate" in results:  # the reciprocal of hf_generate's speedup: paired per repeat, median and interval
        hf = results["hf_generate"]
        out["greedy_over_hf_generate"] = 1 / hf["speedup"]
        out["greedy_over_hf_generate_ci"] = [1 / hf["speedup_ci"][1], 1 / hf["speedup_ci"][0]]
    if "mtp" in results:
        m = results["mtp"]
        out.update({"mtp_speedup": m["speedup"], "mtp_speedup_ci": m["speedup_ci"],
                    "mtp_ideal_speedup": m["ideal_speedup"], "mtp_speedup_over_ideal": m["speedup_over_ideal"],
                    "mtp_lossless": m["lossless"], "mtp_acceptance_rate": m["acceptance_rate"],
                    "mtp_acceptance_rate_ci": m["acceptance_rate_ci"]})
    out["baseline_degenerate_share"] = results[baseline]["degenerate_share"]
    return out


def render_table(report: dict):
    """The report as tables, one per condition: a row per batch size and method. "degen" is the share of
    the method's generated tokens inside a repetition loop, "exact" whether its output equals plain
    greedy's on every prompt (else how many; "-" when sampling). Latency and the other intervals are in
    the JSON."""
    from rich.console import Group

    params = report["params"]
    notes = [f"MTP modules: {params['mtp_bytes'] / 1e6:.2f} MB of extra weights"] if params["mtp"] else []
    dv = report.get("draft_vocab")
    if dv and dv["size"] < dv["vocab_size"]:
        notes.append(f"drafts from the {dv['size']} most frequent training tokens of {dv['vocab_size']} "
                     f"({dv['training_share']:.0%} of training tokens; the trunk verifies over all)")
    if "draft_bytes" in params:
        notes.append(f"draft model ({params['draft_run']}): {params['draft_bytes'] / 1e6:.2f} MB")
    tables = [_condition_table(report, c) for c in report["conditions"]]
    tables[-1].notes += notes
    return Group(*tables)


def _condition_table(report: dict, condition: dict):
    from mtp_cli.tables import Table

    p, text = condition["prompts"], condition["text"]
    primary = " (primary)" if condition["name"] == report["primary"] else ""
    rows = []
    for bs, methods in condition["results"].items():
        for name, e in methods.items():
            lo, hi = e["speedup_ci"]
            acc = _fmt(e.get("acceptance_rate"), "{:.0%}")
            if acc and e["acceptance_rate_ci"][0] is not None:
                acc += " [{:.0%}-{:.0%}]".format(*e["acceptance_rate_ci"])
            exact = "-" if e["lossless"] is None else "yes" if e["lossless"] else \
                f"{e['identical_prompts']}/{e['identical_prompts'] + len(e['mismatches'])}"
            rows.append([
                str(bs), name, f"{e['tokens_per_s']:.0f}", f"{e['speedup']:.2f} [{lo:.2f}-{hi:.2f}]",
                _fmt(e.get("ideal_speedup"), "{:.2f}"), acc, _fmt(e.get("degenerate_share"), "{:.0%}"),
                _fmt(e.get("mean_acceptance_length"), "{:.2f}"), f"{e['ttft_s'] * 1e3:.1f}", f"{e['tpot_s'] * 1e3:.2f}",
                exact])
    parts = _parts_notes(condition)
    caption = (f"text timed ({condition['baseline']}, batch size {report['batch_sizes'][0]}): "
               f"{_fmt(text.get('degenerate_share'), '{:.0%}')} of tokens in repetition loops, "
               f"{_fmt(text.get('whitespace_share'), '{:.0%}')} of outputs blank")
    return Table(f"specbench {report['run']} {condition['name']}{primary}: {p['source']} x{p['count']}, "
                 f"T={condition['temperature']:g}, {report['max_new_tokens']} new tokens, median of {report['repeats']}",
                 ["batch size", "method", "tokens/s", "speedup [95%]", "ideal speedup", "acceptance [95%]",
                  "degenerate", "MAL", "TTFT ms", "TPOT ms", "identical to greedy"], rows, [caption, *parts],
                 short={"batch size": "bs", "tokens/s": "tok/s", "ideal speedup": "ideal", "acceptance [95%]": "acc",
                        "degenerate": "degen", "identical to greedy": "exact"})


def _parts_notes(condition: dict) -> list[str]:
    """The measured parts of our decoders per batch size, in ms (compile in s)."""
    notes = []
    for bs, methods in condition["results"].items():
        g, m = methods.get(condition["baseline"], {}), methods.get("mtp")
        parts = [f"step {_fmt(g.get('t_step_s'), '{:.2f}', 1e3)}", f"prefill {_fmt(g.get('t_prefill_s'), '{:.1f}', 1e3)}"]
        if m:
            verify = "/".join(_fmt(v, "{:.2f}", 1e3) for v in m.get("t_verify_by_k_s", {}).values())
            parts += [f"verify k=1..{len(m.get('t_verify_by_k_s', {}))} {verify}",
                      f"draft {_fmt(m.get('t_draft_s'), '{:.2f}', 1e3)}"]
            if m.get("fused"):
                parts.append(f"verify+draft in one call {_fmt(m.get('t_forward_verify_draft_s'), '{:.2f}', 1e3)}")
        compiled = sum(e.get("compile_s") or 0.0 for e in methods.values())
        parts.append(f"compile {compiled:.1f} s")
        notes.append(f"bs {bs} ms: " + ", ".join(parts))
    return notes


def _fmt(value, fmt: str, scale: float = 1.0) -> str:
    return "" if value is None else fmt.format(value * scale)
