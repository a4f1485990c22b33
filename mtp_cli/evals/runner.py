"""`mtp eval`: HumanEval, GSM8K and held-out loss for one run, into one JSON file.

HumanEval and GSM8K score the run's Hugging Face export (`<run>/export`, made or refreshed from
the checkpoint), read back into our trunk: the MTP modules are gone by construction. Held-out loss
reads the full run, since it also reports each MTP depth/head. `mtp ablate` calls `run_eval`.

The JSON (default `<run>/eval.json`):
    schema, run, step, objective, export, tasks, limits, seconds, hardware, git_commit,
    results: {humaneval: {pass@1, pass@1_ci95, n, samples_path, ...},
              gsm8k: {"exact_match,strict-match", "exact_match,flexible-extract", their _ci95, n, ...},
              heldout: {loss, loss_ci95, bpb, bpb_ci95, top1, n, extra: [per depth/head], text?: {...}}}
The README documents every key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from mtp_cli import env, ui
from mtp_cli.checkpoint import load_run, write_json
from mtp_cli.config import EVAL_TASKS
from mtp_cli.errors import UserError

SCHEMA = 1


def parse_tasks(tasks: str | Sequence[str]) -> list[str]:
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    unknown = [t for t in names if t not in EVAL_TASKS]
    if unknown or not names:
        raise UserError(f"unknown eval task {', '.join(unknown) or '(none given)'}; choose from {', '.join(EVAL_TASKS)}")
    return list(dict.fromkeys(names))


def parse_limits(limit: int | dict[str, int] | None, tasks: list[str]) -> dict[str, int | None]:
    """One limit for every task, or a per-task table (0 or missing = all)."""
    table = limit if isinstance(limit, dict) else {t: limit for t in tasks}
    out = {}
    for task in tasks:
        n = table.get(task)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise UserError(f"--limit must be a whole number >= 0, got {n!r}")
        out[task] = n or None
    return out


def samples_path(json_path: Path, task: str) -> Path:
    return json_path.with_name(f"{json_path.stem}_{task}_samples.jsonl")


def run_eval(run_dir, tasks=("humaneval", "gsm8k", "heldout"), limit=None, gsm8k_data=None, samples=1,
             temperature=0.0, text=None, json_path=None, show_progress=True, compile=None) -> dict:
    """Evaluate one run; writes and returns the eval JSON document. `compile`: the decoder's
    torch.compile switch (None: the device's default)."""
    from mtp_cli.evals import gsm8k, heldout, humaneval, sandbox
    from mtp_cli.evals.lm import MTPLM
    from mtp_cli.model.hf import ensure_export, load_export

    tasks = parse_tasks(tasks)
    limits = parse_limits(limit, tasks)
    run_dir = Path(run_dir)
    run = load_run(run_dir)  # a missing or broken run is the first thing to report
    if "humaneval" in tasks:
        humaneval.check_decoding(samples, temperature)
        sandbox.detect()  # fails here, not after generating, where no fence can be built
    if "gsm8k" in tasks:
        gsm8k_data = gsm8k.preflight(gsm8k_data)
    if text is not None and not Path(text).is_file():
        raise UserError(f"--text {text}: no such file")
    json_path = Path(json_path) if json_path else run_dir / "eval.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    export_dir, trunk, tokenizer = None, None, None
    if {"humaneval", "gsm8k"} & set(tasks):
        export_dir = ensure_export(run_dir)
        trunk, tokenizer = load_export(export_dir)
    results: dict = {}
    seconds: dict = {}
    with ui.progress(disable=not show_progress) as progress:
        for task in tasks:
            t0 = time.perf_counter()
            if task == "heldout":
                results[task] = heldout.report(run, limits[task], text, progress)
            elif task == "humaneval":
                results[task] = humaneval.run(trunk, tokenizer, samples_path(json_path, task), limits[task], samples,
                                              temperature, progress=progress, compile=compile)
            else:
                lm = MTPLM(trunk=trunk, tokenizer=tokenizer, progress=progress, compile=compile)
                result = gsm8k.run(lm, limits[task], gsm8k_data)
                path = samples_path(json_path, task)
                path.write_text("".join(json.dumps(s, default=float) + "\n" for s in result.pop("samples")))
                over = sum(n > trunk.cfg.context for n in lm.prompt_lengths)
                results[task] = result | {"samples_path": str(path), "prompts_over_context": over,
                                          "prompt_tokens_max": max(lm.prompt_lengths, default=0)}
            seconds[task] = round(time.perf_counter() - t0, 2)
    doc = {"schema": SCHEMA, "run": str(run_dir), "step": run.step, "objective": run.model.objective,
           "export": str(export_dir) if export_dir else None, "context": run.recipe.model.context, "tasks": tasks, "limits": limits,
           "seconds": seconds, "hardware": env.hardware(), "git_commit": env.git_commit(), "results": results}
    write_json(json_path, doc)
    doc["json_path"] = str(json_path)
    return doc


def _ci(lo_hi) -> str:
    return f"[{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if lo_hi else "-"


def results_table(doc: dict):
    """A Rich table of the headline numbers of an eval document."""
    from rich.table import Table

    table = Table(title=f"{doc['run']} (step {doc['step']}, {doc['objective']}) — trunk only, MTP modules discarded")
    for name, justify in (("task", "left"), ("metric", "left"), ("value", "right"), ("95% CI", "right"),
                          ("n", "right")):
        table.add_column(name, justify=justify)
    res = doc["results"]
    if "humaneval" in res:
        h = res["humaneval"]
        for key in (k for k in h if k.startswith("pass@") and "_" not in k):
            table.add_row("humaneval", key, f"{h[key]:.3f}", _ci(h[f"{key}_ci95"]), str(h["n"]))
    if "gsm8k" in res:
        g = res["gsm8k"]
        for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
            table.add_row("gsm8k", key.split(",")[1], f"{g[key]:.3f}", _ci(g[f"{key}_ci95"]), str(g["n"]))
    if "heldout" in res:
        for label, h in (("heldout", res["heldout"]), ("text", res["heldout"].get("text"))):
            if not h:
                continue
            table.add_row(label, "loss (nats/token)", f"{h['loss']:.4f}", _ci(h["loss_ci95"]), f"{h['n']:,}")
            table.add_row(label, "bits per byte", f"{h['bpb']:.4f}", _ci(h["bpb_ci95"]), f"{h['n_bytes']:,} B")
            table.add_row(label, "top-1", f"{h['top1']:.3f}", "", f"{h['n']:,}")
            for e in h["extra"]:
                table.add_row(label, f"{e['name']} ({e['predicts']}) loss / top-1 / agree",
                              f"{e['loss']:.3f} / {e['top1']:.3f} / {e['agree']:.3f}", "", f"{e['n']:,}")
    return table
