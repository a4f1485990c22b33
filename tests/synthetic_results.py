"""A results folder written from planted numbers, in the stored formats the report reads (eval.json
with per-item files, specbench.json), written through their typed schemas (mtp_cli/base/result_docs.py), so
the report's statistics can be checked against values known in advance. Nothing here trains or evaluates."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np

from mtp_cli.base.result_docs import EvalDoc, SpecbenchDoc, write_eval, write_spec

COMMIT = "c0ffee" + "0" * 34
VARIANTS = {"ntp": "ntp", "seq-d1": "sequential"}
N_ITEMS = {"humaneval": 40, "gsm8k": 30, "heldout": 25}
MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 4, "ffn_hidden": 88, "context": 64, "vocab_size": 256}
CUT = {"prompts_cut": 12, "prompt_cut_tokens_max": 40, "prompt_cut_tokens_mean": 20.5, "prompts_over_context": 12}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def per_item_values(variant: str, seed: int, task: str, shift: float, seed_offsets: dict) -> np.ndarray:
    """The planted per-item values of one run: item difficulty (shared) + objective shift + seed offset + noise."""
    difficulty = np.random.default_rng(100 + len(task)).gamma(4.0, 0.4, N_ITEMS[task]) + 0.5
    noise = np.random.default_rng(zlib.crc32(f"{variant}/{seed}/{task}".encode())).normal(0, 0.02, N_ITEMS[task])
    return difficulty + (shift if variant != "ntp" else 0.0) + seed_offsets[variant][seed] + noise


def make_results(root: Path, seeds=(0, 1), shift: float = -0.05, seed_offsets: dict | None = None,
                 degenerate: float = 0.9, per_item: bool = True) -> Path:
    """Write results/<synth> with runs ntp and seq-d1 for `seeds`; returns the folder."""
    seed_offsets = seed_offsets or {"ntp": {s: 0.03 * (-1) ** s * (s + 1) for s in seeds},
                                    "seq-d1": {s: 0.02 * (-1) ** (s + 1) * (s + 1) for s in seeds}}
    folder = root / "synth"
    (folder / "runs").mkdir(parents=True)
    recipe = {"description": "planted numbers", "seeds": list(seeds),
              "variants": [{"name": "ntp"}, {"name": "seq-d1", "mtp": {"objective": "sequential", "depth": 1}}],
              "model": MODEL, "train": {"steps": 10, "batch_size": 4},
              "eval": {"tasks": ["humaneval", "gsm8k", "heldout"]}, "specbench": {"batch_sizes": [1]}}
    (folder / "recipe.lock.json").write_text(json.dumps({"recipe_name": "synth", "fingerprint": "f00d",
                                                         "source": "synth.toml", "recipe": recipe}))
    for variant, objective in VARIANTS.items():
        for seed in seeds:
            run = folder / "runs" / f"{variant}-s{seed}"
            run.mkdir()
            (run / "ablate.json").write_text(json.dumps({"variant": variant, "seed": seed}))
            (run / "run.json").write_text(json.dumps({
                "status": "done", "objective": objective, "step": 10, "git_commit": COMMIT,
                "recipe": {"mtp": {"depth": 1, "lambda": 0.3, "mtp_input": "post-norm"},
                           "train": {"batch_size": 4, "seed": seed}, "model": dict(MODEL)},
                "lambda": 0.3, "params": {"trunk": 1000, "mtp": 0 if objective == "ntp" else 200}}))
            results = _eval(run, variant, seed, shift, seed_offsets, per_item)
            write_eval(run / "eval.json", EvalDoc(run=str(run), step=10, objective=objective, export=None, context=64,
                                                  tasks=list(results), limits={t: None for t in results}, seconds={},
                                                  hardware={}, git_commit=COMMIT, results=results))
            write_spec(run / "specbench.json", SpecbenchDoc(**_spec(variant, seed, degenerate)))
    return folder


def _eval(run: Path, variant: str, seed: int, shift: float, offsets: dict, per_item: bool) -> dict:
    he = per_item_values(variant, seed, "humaneval", shift, offsets)
    gs = per_item_values(variant, seed, "gsm8k", shift / 2, offsets)
    ho = per_item_values(variant, seed, "heldout", shift, offsets) + 3.0
    tokens, n_bytes = 64, 180
    _write_jsonl(run / "eval_humaneval_samples.jsonl", [
        {"task_id": f"HumanEval/{i}", "completion": "", "gold_bpb": v, "gold_bits": v * 100, "gold_bytes": 100,
         "prompt_tokens": 80, "prompt_cut_tokens": 16} for i, v in enumerate(he)])
    _write_jsonl(run / "eval_gsm8k_gold.jsonl", [
        {"doc_id": i, "gold_bpb": v, "gold_bits": v * 50, "gold_bytes": 50, "prompt_tokens": 70, "prompt_cut_tokens": 6}
        for i, v in enumerate(gs)])
    _write_jsonl(run / "eval_heldout_windows.jsonl", [
        {"window": i, "loss": v, "tokens": tokens, "bytes": n_bytes} for i, v in enumerate(ho)])
    items = {"humaneval": "eval_humaneval_samples.jsonl", "gsm8k": "eval_gsm8k_gold.jsonl"}
    passes = 3 + seed
    return {
        "humaneval": {"n": len(he), "pass@1": passes / len(he), "pass@1_ci95": [0.01, 0.2], "gold_bpb": he.mean(),
                      "gold_bpb_ci95": [he.mean() - 0.1, he.mean() + 0.1], "gold_n": len(he), "context": 64,
                      **({"items_path": items["humaneval"]} if per_item else {}), **CUT},
        "gsm8k": {"n": len(gs), "exact_match,strict-match": 0.1, "exact_match,strict-match_ci95": [0.03, 0.25],
                  "exact_match,flexible-extract": 0.1, "exact_match,flexible-extract_ci95": [0.03, 0.25],
                  "gold_bpb": gs.mean(), "gold_bpb_ci95": [gs.mean() - 0.1, gs.mean() + 0.1], "gold_n": len(gs),
                  "context": 64, "prompts_cut": 0, "prompt_cut_tokens_max": 0, "prompt_cut_tokens_mean": 0.0,
                  "prompts_over_context": 0, **({"items_path": items["gsm8k"]} if per_item else {})},
        "heldout": {"loss": ho.mean(), "loss_ci95": [ho.mean() - 0.1, ho.mean() + 0.1],
                    "bpb": ho.mean() * tokens / math.log(2) / n_bytes, "n": tokens * len(ho),
                    **({"windows_path": "eval_heldout_windows.jsonl"} if per_item else {})},
    }


def per_prompt(seed: int, rate: float) -> list[dict]:
    drafted = [12, 10, 14, 8, 16, 12]
    return [{"accepted": round(d * min(1.0, rate + 0.1 * ((i + seed) % 3 - 1))), "drafted": d, "steps": d}
            for i, d in enumerate(drafted)]


def _condition(name: str, source: str, seed: int, rate: float, mtp: bool, degenerate: float) -> dict:
    rows = per_prompt(seed, rate)
    acc, drafted = sum(p["accepted"] for p in rows), sum(p["drafted"] for p in rows)
    methods = {"greedy": {"tokens_per_s": 100.0, "speedup": 1.0, "lossless": True}}
    if mtp:
        methods["mtp"] = {"tokens_per_s": 120.0, "speedup": 1.2, "speedup_ci95": [1.1, 1.3], "lossless": True,
                          "acceptance_rate": acc / drafted, "acceptance_rate_ci95": [acc / drafted - 0.05, acc / drafted + 0.05],
                          "mean_acceptance_length": 1 + acc / drafted, "per_position_acceptance": [acc / drafted],
                          "per_prompt": rows, "ideal_speedup": 1.4, "t_forward_step_s": 0.002 + 0.0002 * seed,
                          "t_verify_by_k_s": {"1": 0.0022 + 0.0002 * seed}, "t_draft_s": 0.0008}
    return {"name": name, "prompts": {"source": source, "count": len(rows)}, "temperature": 0.0,
            "results": {"1": methods}, "summary": {}, "skipped": {},
            "text": {"degenerate_share": degenerate, "whitespace_share": degenerate / 3, "n_outputs": len(rows)}}


def _spec(variant: str, seed: int, degenerate: float) -> dict:
    mtp = variant != "ntp"
    return {"run": variant, "step": 10, "objective": VARIANTS[variant], "depth": 1 if mtp else None, "heads": None,
            "mtp_input": "post-norm" if mtp else None, "max_new_tokens": 16, "batch_sizes": [1], "repeats": 1,
            "interval": "planted", "acceptance_interval": "planted", "params": {}, "no_mtp_reason": None, "peers": {},
            "environment": {}, "git_commit": COMMIT, "draft_len": 1, "primary": "heldout-greedy",
            "draft_vocab": {"size": 256, "vocab_size": 1024, "training_share": 0.8} if mtp else None,
            "conditions": [_condition("heldout-greedy", "heldout", seed, 0.6, mtp, degenerate),
                           _condition("humaneval-greedy", "humaneval", seed, 0.3, mtp, 0.1)]}
