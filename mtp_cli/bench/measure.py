"""Timing the methods and summarising the timings: repeats interleaved prompt by prompt after a warm-up,
paired speed-ups with intervals over prompts and repeats (speedup.py), medians of the other timings with
percentile-bootstrap intervals over repeats, every output checked against the plain decoder's, and the
MTP draft counts with the acceptance interval over prompts."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from mtp_cli.base.result_docs import ci_key
from mtp_cli.base.stats import median_ci, ratio_ci
from mtp_cli.bench.raw import raw_rows
from mtp_cli.bench.runners import AA_METHOD, Tally
from mtp_cli.bench.speedup import paired_speedups
from mtp_cli.config.conditions import Condition
from mtp_cli.decode.degeneracy import text_stats
from mtp_cli.decode.speculative import SpecStats
from mtp_cli.decode.timing import PhaseTimer

LABELS = {"greedy": "ours, plain greedy", "mtp": "ours, MTP self-speculative", "hf_generate": "HF generate (greedy)",
          "hf_prompt_lookup": "HF prompt lookup", "hf_assisted": "HF assisted (draft model)",
          "hf_mtp": "HF MTP (generate use_mtp, the run's module)",
          "sample": "ours, plain sampling", AA_METHOD: "A/A control: the baseline timed again as a method",
          "llamacpp_greedy": "llama.cpp greedy, the GGUF's own weights",
          "llamacpp_prompt_lookup": "llama.cpp prompt lookup, the GGUF's own weights"}


SAMPLED_LABELS = {"mtp": "ours, MTP speculative sampling", "hf_generate": "HF generate (sampling)"}


def measure(runners: dict, ids: list[list[int]], bs: int, repeats: int, device: str, tick) -> dict[str, list[Tally]]:
    """Every method on every batch in each of `repeats` repeats, after one warm-up call each. The methods take
    turns batch by batch (the order rotated by repeat and batch), so that a slow spell of a shared machine
    falls on all of them for the same prompts; a method's Tally for one repeat gathers its batches in order."""
    batches = [ids[i:i + bs] for i in range(0, len(ids), bs)]
    names = list(runners)
    for name in names:  # warm-up: allocator, lazy initialisation, caches
        runners[name](batches[0], Tally(timer=PhaseTimer(device)))
        tick(name)
    tallies: dict[str, list[Tally]] = {name: [Tally(timer=PhaseTimer(device)) for _ in range(repeats)]
                                       for name in names}
    for r in range(repeats):
        for b, batch in enumerate(batches):
            turn = (r + b) % len(names)
            for name in names[turn:] + names[:turn]:
                tally = tallies[name][r]
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
        for name in names:
            tick(name)
    return tallies


def _put(entry: dict, key: str, values: Sequence[float]) -> None:
    entry[key], entry[ci_key(key)] = median_ci(values)


def summarise(tallies: dict[str, list[Tally]], model, ids: list[list[int]], condition: Condition, tokenizer,
               bs: int) -> dict:
    base = tallies[condition.baseline]
    base_rows = raw_rows("", bs, {condition.baseline: base})
    reference = base[0].outputs
    sampled = condition.temperature > 0
    results = {}
    for name, runs in tallies.items():
        label = SAMPLED_LABELS.get(name, LABELS[name]) if sampled else LABELS[name]
        e: dict = {"label": label, "tokens": runs[0].tokens}
        _put(e, "tokens_per_s", [t.tokens_per_s for t in runs])
        e.update(paired_speedups(raw_rows("", bs, {name: runs}), base_rows))
        _put(e, "latency_s", [float(np.mean(t.walls)) for t in runs])
        _put(e, "ttft_s", [float(np.mean(t.ttfts)) for t in runs])
        _put(e, "tpot_s", [float(np.nanmean(t.tpots)) for t in runs])
        if sampled:  # samples differ token for token; speculative sampling is lossless in distribution only
            e.update({"lossless": None, "identical_prompts": None, "mismatches": []})
        else:
            differing = next((t for t in runs if t.outputs != reference), runs[0])  # every repeat is checked
            e.update(_lossless(model, ids, reference, differing.outputs))
        stats = text_stats(runs[0].outputs, tokenizer)
        e.update(degenerate_share=stats["degenerate_share"], whitespace_share=stats["whitespace_share"])
        if name == "llamacpp_prompt_lookup" and "llamacpp_greedy" in tallies:  # its own greedy is its reference
            own = tallies["llamacpp_greedy"][0].outputs
            e["identical_to_llamacpp_greedy"] = sum(a == b for a, b in zip(own, runs[0].outputs))
        if name in (condition.baseline, "mtp"):
            e["t_prefill_s"] = median_ci([t.timer.mean("prefill") for t in runs])[0]
        if name == condition.baseline:
            e["t_step_s"] = median_ci([t.timer.mean("step") for t in runs])[0]
        if name == "mtp":
            e.update(_spec_entry(runs))
            e.update(_acceptance_by_unit(runs[0].per_batch, bs))
        results[name] = e
    return results


def _acceptance_by_unit(per_batch: list[SpecStats], bs: int) -> dict:
    """Draft counts per prompt (per batch when batches hold several prompts), with the steps whose drafts
    1..i+1 were all accepted (`accepted_at`, vLLM's per-position counts), and the bootstrap interval of the
    acceptance rate over them."""
    units = [{"accepted": s.accepted, "drafted": s.drafted, "steps": s.steps, "accepted_at": list(s.accepted_at)}
             for s in per_batch]
    ci = ratio_ci([u["accepted"] for u in units], [u["drafted"] for u in units])
    return {ci_key("acceptance_rate"): ci, ("per_prompt" if bs == 1 else "per_batch"): units}


def _spec_entry(runs: list[Tally]) -> dict:
    stats = runs[0].stats
    e = stats.to_dict()
    parts = {"t_verify_s": [], "t_draft_s": [], "t_verify_draft_s": [], "t_other_s": []}
    fused = runs[0].timer.count["verify_draft"] > 0  # one row, greedy: verify and draft are one call
    for t in runs:
        if fused:
            verify, draft = t.timer.mean("verify_draft"), 0.0
        else:
            verify, draft = t.timer.mean("verify"), t.timer.mean("draft") or 0.0
            parts["t_verify_s"].append(verify)
            parts["t_draft_s"].append(draft)
        steps = t.timer.count["verify_draft" if fused else "verify"]
        other = sum(t.walls) - sum(t.timer.total[p] for p in ("prefill", "draft0", "draft", "verify", "verify_draft"))
        parts["t_verify_draft_s"].append(verify + draft)
        parts["t_other_s"].append(other / steps)
    e["fused"] = fused
    for key, values in parts.items():
        e[key] = median_ci(values)[0] if values else None
    e["t_draft0_s"] = median_ci([t.timer.mean("draft0") for t in runs])[0]
    return e


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
