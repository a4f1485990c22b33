"""`mtp specbench`: measured end-to-end latency of MTP self-speculative decoding against our own plain
greedy decoder and Hugging Face peers on the exported trunk — every figure timed, every output checked.

Per batch size the methods take turns prompt by prompt (the order rotated by prompt and repeat, so a slow
spell on a shared machine hits all of them on the same prompt) after one warm-up call each, in R timed
repeats; speed-ups are geometric means over prompts × repeats with an interval over both (speedup.py),
other timings medians over repeats with percentile-bootstrap intervals. Methods:
- greedy: `generate`, our KV-cache decoder (the reference output and the baseline for speedups);
- mtp: `speculative_generate` with the run's own modules (absent for an NTP run: nothing to draft with);
- hf_generate: `LlamaForCausalLM.generate`, greedy, on the same weights;
- hf_prompt_lookup: its prompt-lookup decoding (batch size 1 only, a transformers restriction);
- hf_assisted: its draft-model speculative decoding with `--draft RUN`'s trunk (batch size 1 only);
- llamacpp_greedy, llamacpp_prompt_lookup: llama.cpp on the run's GGUF source, its own quantized weights
  (batch size 1, temperature 0; llamacpp.py), where the run starts from one and llama-cpp-python is installed;
- aa_control: the baseline's decoder again, as if another method (its true speed-up is 1: the intervals' check);
- hf_mtp: its own MTP self-speculative decoding (`generate(use_mtp=True)`) with the run's module, exported
  with `--with-mtp` into a scratch folder (batch size 1 only): our MTP ÷ this is the engine's cost, the
  drafter held fixed.
Every timed call's seconds, tokens and token ids go to `specbench_raw.jsonl` beside the JSON (`raw.py`), from
which `mtp specbench --recheck` recomputes the speed-ups and the lossless verdict.
Every method's output is compared with greedy's on every prompt (`lossless`); where they differ the
first differing position and our trunk's top-2 logit gap there say whether a near-tie explains it.
Ideal MTP speedup, from forward parts timed side by side: MAL · T_step / (T_verify + T_draft).

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

import contextlib
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from mtp_cli.base import env, outputs, ui
from mtp_cli.base.errors import UserError
from mtp_cli.base.result_docs import SpecbenchDoc, write_spec
from mtp_cli.base.run_files import EXPORT_INFO
from mtp_cli.bench.costs import add_forward_costs
from mtp_cli.bench.draft_select import choose_draft_len, choose_draft_width, tuning_prompts
from mtp_cli.bench.forward_cost import weight_floor
from mtp_cli.bench.llamacpp import LLAMACPP_METHODS, llamacpp_runners
from mtp_cli.bench.measure import measure, summarise
from mtp_cli.bench.raw import raw_rows, write_raw
from mtp_cli.bench.runners import applicable, hf_model, hf_mtp_model, methods_for, weight_bytes
from mtp_cli.bench.schema import JSON_NAME, condition_entry, header, headline
from mtp_cli.config.conditions import HELDOUT, Condition, plan_conditions
from mtp_cli.config.recipe import Runtime, SpecbenchConfig
from mtp_cli.data import tokenizer as toklib
from mtp_cli.data.prompts import HELDOUT_PROMPT_TOKENS, heldout_prompts, load_prompts
from mtp_cli.decode.degeneracy import text_stats
from mtp_cli.decode.draft_vocab import draft_vocabulary
from mtp_cli.decode.engine import CPU_COMPILE_PAYS_AT, default_compile
from mtp_cli.decode.speculative import draft_len_for
from mtp_cli.model.checkpoint import load_run
from mtp_cli.model.weight_format import use_weights

__all__ = ["JSON_NAME", "planned_tokens", "run_specbench"]


def run_specbench(run_dir, cfg: SpecbenchConfig, rt: Runtime | None = None, *, draft_run=None, gsm8k_data=None,
                  json_path=None, show_progress: bool = True) -> dict:
    """Benchmark one run as `cfg` says (every prompt source × temperature; `cfg.primary` the headline
    condition; `cfg.peers` = "primary" times the Hugging Face peers there only, "none" nowhere) on `rt`'s device, with its
    threads for the benchmark's length and its torch.compile switch for our decoders; writes the report
    to `json_path` (default `<run>/specbench.json`) and returns it. `draft_run`: a smaller NTP run with
    the same tokenizer, for HF assisted generation; `gsm8k_data`: where `--prompts gsm8k` reads."""
    rt = rt or Runtime()
    cfg.validate()
    rt.validate()
    json_path = outputs.file(Path(json_path) if json_path else Path(run_dir) / JSON_NAME, "--json")
    conditions, primary = plan_conditions(cfg.prompts, cfg.temperatures, cfg.primary)
    saved = torch.get_num_threads()
    try:
        device = env.use_runtime(rt).type
        compile, why = _compile_choice(rt.compile, device, planned_tokens(cfg, len(conditions)))
        with _fresh_compiler(compile), tempfile.TemporaryDirectory(prefix="mtp-specbench-") as scratch:
            return _specbench(run_dir, cfg, conditions, primary, device, compile, draft_run, json_path,
                              show_progress, gsm8k_data, Path(scratch), rt.dtype, why)
    finally:
        torch.set_num_threads(saved)


SMALLEST_PROMPT_SET = 164  # HumanEval's problems: the fewest prompts a source gives with --limit 0


def planned_tokens(cfg: SpecbenchConfig, n_conditions: int) -> int:
    """Tokens our decoders (greedy and MTP) will decode: every condition, prompt (`limit`, or at least a
    HumanEval's worth) and batch size, the warm-up and each repeat."""
    prompts = cfg.limit or SMALLEST_PROMPT_SET
    return 2 * n_conditions * prompts * len(set(cfg.batch_sizes)) * cfg.max_new_tokens * (cfg.repeats + 1)


def _compile_choice(asked: bool | None, device: str, tokens: int) -> tuple[bool, str]:
    """Whether our decoders are compiled, and why (recorded in the report's environment)."""
    if asked is not None:
        return asked, "--compile" if asked else "--no-compile"
    compile = default_compile(device, tokens)
    if device == "cuda":
        return compile, "default on CUDA"
    verdict = "at least" if compile else "under"
    return compile, f"default on CPU: {tokens:,} planned tokens, {verdict} the {CPU_COMPILE_PAYS_AT:,} where compiling pays"


@contextlib.contextmanager
def _fresh_compiler(compile: bool):
    """Compiled decoders start from empty dynamo caches and never fall back to eager silently. Every engine's
    compiled step shares one code object, whose cache dynamo caps (`recompile_limit`, 8): graphs compiled
    earlier in the process (`mtp ablate` benchmarks its runs one after another) would fill it, and past
    the cap a call runs eager without a word, timing an eager decoder as a compiled one."""
    if not compile:
        yield
        return
    import torch._dynamo  # compiling only

    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        try:
            yield
        except torch._dynamo.exc.FailOnRecompileLimitHit as e:
            raise RuntimeError(f"torch.compile reached its recompile limit while decoding, so the timings would "
                               f"be of eager code; nothing was written ({e})") from e


def _specbench(run_dir, cfg: SpecbenchConfig, conditions: list[Condition], primary: str, device: str, compile: bool,
               draft_run, json_path, show_progress, gsm8k_data, scratch: Path, dtype: str,
               compile_why: str) -> dict:
    batch_sizes, limit, max_new_tokens, repeats = sorted(set(cfg.batch_sizes)), cfg.limit or None, cfg.max_new_tokens, cfg.repeats
    run = load_run(run_dir, device)
    use_weights(run.model, dtype)  # every method decodes these weights: the peers are built from them (runners.py)
    prompt_sets: dict[str, tuple[list[list[int]], dict]] = {}
    for source in dict.fromkeys(c.source for c in conditions):  # all inputs are checked before anything is timed
        prompt_sets[source] = _prompt_ids(run, source, limit, max_new_tokens, gsm8k_data)
    fewest = min(len(ids) for ids, _ in prompt_sets.values())
    if batch_sizes[-1] > fewest:
        raise UserError(f"--batch-sizes {batch_sizes[-1]}: more than the {fewest} prompts timed "
                        f"({min(prompt_sets, key=lambda s: len(prompt_sets[s][0]))}, --limit {cfg.limit}); "
                        "a batch holds at most every prompt")
    draft = _load_draft(draft_run, run, device) if draft_run else None
    model = run.model
    lens = [draft_len_for(model, j) for j in cfg.draft_lens] if cfg.draft_lens and model.n_extra else None
    k = draft_len_for(model, cfg.draft_len) if model.n_extra else None
    vocab, vocab_info = draft_vocabulary(run, cfg.draft_vocab) if k else (None, None)
    floor = weight_floor(model.trunk)
    selection = None
    head = next(c for c in conditions if c.name == primary)
    if lens:
        tuning = _tuning_set(run, head.source, prompt_sets, max_new_tokens, gsm8k_data, "draft_lens", "k")
        with ui.progress(transient=True, disable=not show_progress) as bar:
            task = bar.add_task("choosing the draft length", total=2 * (len(lens) + 1), info="")
            selection = choose_draft_len(model, lens, tuning, head.source, head.temperature, max_new_tokens,
                                         run.tokenizer.eos_token_id, compile, vocab, device,
                                         lambda m: bar.update(task, advance=1, info=m))
        k = selection["chosen"]
    width, width_selection = cfg.draft_width, None
    if cfg.draft_widths and k and device == "cuda" and compile:
        width_selection = {"chosen": 1, "skipped": "CUDA graphs decode with fixed shapes, not the one-row fused loop "
                                                   "that verifies trees"}
    elif cfg.draft_widths and k and k != 1:
        if not lens:
            raise UserError(f"specbench.draft_widths: tree widths need one draft per step, but k = {k}; "
                            "use --draft-len 1")
        width_selection = {"chosen": 1, "skipped": f"k = {k} was chosen: a tree verifies candidates for one draft"}
    elif cfg.draft_widths and k:
        tuning = _tuning_set(run, head.source, prompt_sets, max_new_tokens, gsm8k_data, "draft_widths", "the width")
        with ui.progress(transient=True, disable=not show_progress) as bar:
            task = bar.add_task("choosing the tree width", total=2 * (len(cfg.draft_widths) + 1), info="")
            width_selection = choose_draft_width(model, sorted(set(cfg.draft_widths)), tuning, head.source,
                                                 max_new_tokens, run.tokenizer.eos_token_id, compile, vocab, device,
                                                 lambda m: bar.update(task, advance=1, info=m))
        width = width_selection["chosen"]
    elif width > 1 and k and k != 1:
        raise UserError(f"specbench.draft_width {width} verifies candidates for one draft, but k = {k}; "
                        "use --draft-len 1")
    hf = hf_model(run) if cfg.peers != "none" else None
    hf_draft = hf_model(draft) if draft is not None and hf is not None else None
    hf_mtp = hf_mtp_model(run_dir, run, scratch / "export-mtp") if hf is not None and k else (None, "no peers")
    llama = llamacpp_runners(run, max_new_tokens, device) if cfg.peers != "none" else ({}, {}, {})
    def peers_left_out(c: Condition) -> str | None:
        return None if cfg.peers == "all" or (cfg.peers == "primary" and c.name == primary) else cfg.peers

    plans = [(c, *methods_for(c, run, hf, hf_draft, max_new_tokens, k, compile, peers_left_out(c), vocab, width,
                              hf_mtp, llama[:2])) for c in conditions]

    report = header(run, max_new_tokens, batch_sizes, repeats, k, draft, primary)
    report["draft_vocab"] = vocab_info
    report["draft_len_selection"], report["weight_floor"] = selection, floor
    report["draft_width"], report["draft_width_selection"] = (width if k else None), width_selection
    report["environment"]["compile"] = compile
    report["environment"]["compile_why"] = compile_why
    report["peers"]["llamacpp"] = llama[2] or None
    if hf_mtp[0] is not None:
        info = json.loads((scratch / "export-mtp" / EXPORT_INFO).read_text())
        report["peers"]["hf_mtp"] = {"num_mtp_layers": info["mtp_layers"], "differences": info["mtp_differences"]}
    n_tasks = sum(len(applicable(runners, bs)) * (repeats + 1) for _, runners, _ in plans for bs in batch_sizes)
    raw = []
    with ui.progress(transient=True, disable=not show_progress) as bar:
        task = bar.add_task("specbench", total=n_tasks, info="")
        for condition, runners, skipped in plans:
            ids, prompt_info = prompt_sets[condition.source]
            entry = condition_entry(condition, prompt_info)
            for bs in batch_sizes:
                active = applicable(runners, bs)
                entry["skipped"][str(bs)] = skipped | {m: "transformers supports it at batch size 1 only"
                                                       for m in runners if m not in active}
                tallies = measure(active, ids, bs, repeats, device,
                                   lambda m, c=condition.name, b=bs: bar.update(task, advance=1, info=f"{c} bs {b} {m}"))
                raw += raw_rows(condition.name, bs, tallies)
                entry["results"][str(bs)] = summarise(tallies, model, ids, condition, run.tokenizer, bs)
                for name in set(LLAMACPP_METHODS) & set(entry["results"][str(bs)]):
                    entry["results"][str(bs)][name]["label"] += f" ({llama[2]['weights']})"
                base = entry["results"][str(bs)][condition.baseline]
                base["step_over_floor"] = base["t_step_s"] / floor["floor_s"]
                if "mtp" in entry["results"][str(bs)]:  # the tree runs where the fused loop does
                    mtp = entry["results"][str(bs)]["mtp"]
                    mtp["draft_width"] = width if mtp["fused"] else 1
                add_forward_costs(entry["results"][str(bs)], model, ids[:bs], k, compile, condition.baseline, vocab)
                entry["summary"][str(bs)] = headline(entry["results"][str(bs)], condition.baseline)
                if bs == batch_sizes[0]:  # the reference text: our plain decoder, smallest batch size
                    entry["text"] = text_stats(tallies[condition.baseline][0].outputs, run.tokenizer)
            report["conditions"].append(entry)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    written = write_spec(json_path, SpecbenchDoc(**report))
    write_raw(json_path, raw)
    return written


def _tuning_set(run, source: str, prompt_sets: dict, max_new_tokens: int, gsm8k_data, setting: str,
                what: str) -> list[list[int]]:
    """The prompts of `source` a draft setting is chosen on: ones the benchmark does not time."""
    tuning = tuning_prompts(_prompt_ids(run, source, None, max_new_tokens, gsm8k_data)[0], prompt_sets[source][0])
    if not tuning:
        raise UserError(f"specbench.{setting}: every {source} prompt is timed, none is left to choose {what} on; "
                        "lower specbench.limit")
    return tuning


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
    draft.model.to(run.model.trunk.embed_tokens.weight.dtype)
    if toklib.fingerprint(draft.tokenizer) != toklib.fingerprint(run.tokenizer) \
            or draft.recipe.model.vocab_size != run.recipe.model.vocab_size:
        raise UserError(f"draft run {draft_run} uses another tokenizer than {run.run_dir}: "
                        "a draft model must share the target's vocabulary")
    if weight_bytes(draft.model.trunk) >= weight_bytes(run.model.trunk):
        ui.console.print(f"[yellow]warning:[/yellow] draft run {draft_run} is not smaller than the target's trunk")
    return draft
