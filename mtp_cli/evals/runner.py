"""`mtp eval`: HumanEval, GSM8K and held-out loss for one run, into one JSON file.

HumanEval and GSM8K score the run's Hugging Face export (`<run>/export`, made or refreshed from
the checkpoint), read back into our trunk: the MTP modules are gone by construction. Held-out loss
reads the full run, since it also reports each MTP depth/head. `mtp ablate` calls `run_eval`.

The JSON (default `<run>/eval.json`):
    schema, run, step, objective, export, tasks, limits, seconds, hardware, git_commit,
    results: {humaneval: {pass@1, pass@1_ci95, n, samples_path, gold_bpb, gold_bpb_ci95, gold_n, ...},
              gsm8k: {"exact_match,strict-match", "exact_match,flexible-extract", their _ci95, n, num_fewshot,
                      gold_bpb, gold_bpb_ci95, gold_n, ...},
              heldout: {loss, loss_ci95, bpb, bpb_ci95, top1, n, train_val, extra: [per depth/head], text?: {...}}}
Every task also has `items_path` (its per-item file, relative to the JSON's folder: the HumanEval
samples, eval_gsm8k_gold.jsonl, eval_heldout_windows.jsonl), and the generative tasks the context
block of `context.summary` (context, prompts_cut, prompt_cut_tokens_max/_mean, prompts_over_context).
Nothing runs past the trained context: prompts are cut by lm-eval's rule, or, with `truncate=False`
(`--no-truncate`), an eval that would need a cut is refused. The README documents every key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from mtp_cli import env, outputs, ui
from mtp_cli.checkpoint import load_run
from mtp_cli.config import EVAL_TASKS
from mtp_cli.decode import context as ctxlib
from mtp_cli.errors import UserError
from mtp_cli.files import write_json

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


def samples_path(json_path: Path, task: str, kind: str = "samples") -> Path:
    return json_path.with_name(f"{json_path.stem}_{task}_{kind}.jsonl")


def write_rows(path: Path, rows) -> str:
    """One JSON object per line; returns the file name (items paths are relative to the JSON's folder)."""
    path.write_text("".join(json.dumps(r, default=float) + "\n" for r in rows))
    return path.name


def hf_json_path(source: str) -> Path:
    """Where `mtp eval --hf SOURCE` writes by default: results/hf/<source, '/' as '--'>/eval.json."""
    return Path("results") / "hf" / str(source).strip("/").replace("/", "--") / "eval.json"


def hf_run(source: str, recipe=None):
    """A checkpoint we did not train, as a run: its trunk (no modules), its tokenizer, and a recipe whose
    [data] (default: the quick recipe's) gives the held-out validation split, tokenized by the checkpoint."""
    from mtp_cli.checkpoint import LoadedRun
    from mtp_cli.config import MTPConfig, load_recipe, resolve_recipe_path
    from mtp_cli.data import tokenizer as toklib
    from mtp_cli.model import MTPModel, pretrained

    pretrained.locate(source, flag="--hf")
    r = load_recipe(recipe or "quick")
    r.train.init_from, r.train.freeze_trunk, r.mtp = str(source), False, MTPConfig()
    src = pretrained.resolve_recipe(r, pretrained.given_model_keys(resolve_recipe_path(recipe)) if recipe else set())
    model = MTPModel(r.model, r.mtp)
    pretrained.init_model(model, src)
    return LoadedRun(src.path, r, model.eval(), toklib.load(src.path), 0), src


def run_eval(run_dir=None, tasks=("humaneval", "gsm8k", "heldout"), limit=None, gsm8k_data=None, samples=1,
             temperature=0.0, text=None, json_path=None, show_progress=True, truncate=True,
             gsm8k_fewshot=None, hf=None, recipe=None, compile=None) -> dict:
    """Evaluate one run, or with `hf` a Hugging Face checkpoint (folder or Hub id; `recipe` gives its
    held-out data); writes and returns the eval JSON document. `truncate=False` refuses any eval that
    would need a prompt cut to stay inside the trained context; `gsm8k_fewshot` defaults to the recipe's
    eval.gsm8k_fewshot, lowered to the largest count whose prompts fit the trained context.
    `compile`: the decoder's torch.compile switch (None: the device's default)."""
    from mtp_cli.evals import gsm8k, heldout, humaneval, sandbox
    from mtp_cli.evals.lm import MTPLM
    from mtp_cli.model.hf import ensure_export, load_export

    tasks = parse_tasks(tasks)
    limits = parse_limits(limit, tasks)
    if (run_dir is None) == (hf is None):
        raise UserError("give a run folder or --hf SOURCE (one of them)")
    source = None
    if hf is not None:
        run, source = hf_run(hf, recipe)  # a missing or unsupported checkpoint is the first thing to report
        run_dir, json_path = run.run_dir, json_path or hf_json_path(hf)
    else:
        run_dir = Path(run_dir)
        run = load_run(run_dir)  # a missing or broken run is the first thing to report
    if "humaneval" in tasks:
        humaneval.check_decoding(samples, temperature)
        sandbox.detect()  # fails here, not after generating, where no fence can be built
    if "gsm8k" in tasks:
        if gsm8k_fewshot is not None:
            gsm8k.check_fewshot(gsm8k_fewshot)
        gsm8k_data = gsm8k.preflight(gsm8k_data)
    if text is not None:
        if not Path(text).is_file():
            raise UserError(f"--text {text}: no such file")
        heldout.text_tokens(text, run.tokenizer, run.recipe.model.context)
    json_path = outputs.file(Path(json_path) if json_path else run_dir / "eval.json", "--json")
    for task in tasks:
        outputs.file(samples_path(json_path, task, "windows" if task == "heldout" else "samples"), "--json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    export_dir, trunk, tokenizer = None, None, None
    if source is not None:
        export_dir, trunk, tokenizer = source.path, run.model.trunk, run.tokenizer
    elif {"humaneval", "gsm8k"} & set(tasks):
        export_dir = ensure_export(run_dir)
        trunk, tokenizer = load_export(export_dir)
    fewshot = gsm8k_fewshot
    if "gsm8k" in tasks and fewshot is None:  # the recipe's count, fewer where its prompts would not fit
        fewshot = gsm8k.fitting_fewshot(MTPLM(trunk=trunk, tokenizer=tokenizer), limits["gsm8k"], gsm8k_data,
                                        run.recipe.eval.gsm8k_fewshot)
    if "humaneval" in tasks:  # with truncate off, refusals come before any model work
        humaneval.check_context(trunk, tokenizer, limits["humaneval"], truncate=truncate)
    if "gsm8k" in tasks:
        gsm8k.check_context(MTPLM(trunk=trunk, tokenizer=tokenizer, truncate=truncate), limits["gsm8k"], gsm8k_data,
                            fewshot)
    results: dict = {}
    seconds: dict = {}
    with ui.progress(disable=not show_progress) as progress:
        for task in tasks:
            t0 = time.perf_counter()
            if task == "heldout":
                result = heldout.report(run, limits[task], text, progress)
                windows_path = write_rows(samples_path(json_path, task, "windows"), result.pop("windows"))
                if "text" in result:
                    result["text"].pop("windows")
                results[task] = result | {"windows_path": windows_path, "items_path": windows_path}
            elif task == "humaneval":
                results[task] = humaneval.run(trunk, tokenizer, samples_path(json_path, task), limits[task], samples,
                                              temperature, progress=progress, truncate=truncate,
                                              compile=compile)
            else:
                lm = MTPLM(trunk=trunk, tokenizer=tokenizer, progress=progress, truncate=truncate, compile=compile)
                lm.score_description = "gsm8k: score gold answers"
                result = gsm8k.run(lm, limits[task], gsm8k_data, num_fewshot=fewshot)
                path = samples_path(json_path, task)
                write_rows(path, result.pop("samples"))
                gold = result.pop("gold")
                gold_cut = ctxlib.summary([r["prompt_cut_tokens"] for r in gold], [r["prompt_tokens"] for r in gold],
                                          trunk.cfg.context)
                results[task] = result | {
                    "samples_path": str(path), "items_path": write_rows(samples_path(json_path, task, "gold"), gold),
                    "max_gen_toks": max(lm.gen_budgets, default=None),
                    **ctxlib.summary(lm.prompt_cuts, lm.prompt_lengths, trunk.cfg.context),
                    **{f"gold_{k}": gold_cut[k] for k in ("prompts_cut", "prompt_cut_tokens_max", "prompt_cut_tokens_mean")}}
            seconds[task] = round(time.perf_counter() - t0, 2)
    doc = {
        "schema": SCHEMA,
        "run": source.name if source else str(run_dir),
        "step": run.step,
        "objective": run.model.objective,
        **({"hf": source.record()} if source else {}),
        "export": str(export_dir) if export_dir else None,
        "context": run.recipe.model.context,
        "tasks": tasks,
        "limits": limits,
        "seconds": seconds,
        "hardware": env.hardware(),
        "git_commit": env.git_commit(),
        "results": results,
    }
    write_json(json_path, doc)
    doc["json_path"] = str(json_path)
    return doc


def _gold_and_cuts(rows: list, label: str, task: dict) -> None:
    if "gold_bpb" in task:
        rows.append([label, "gold bits/byte", f"{task['gold_bpb']:.4f}", _ci(task["gold_bpb_ci95"]), str(task["gold_n"])])
    if "prompts_cut" in task:
        rows.append([label, f"prompts cut to {task['context']} (max/mean)",
                     f"{task['prompts_cut']} ({task['prompt_cut_tokens_max']} / {task['prompt_cut_tokens_mean']:.0f})",
                     "", str(task["n"])])


def _ci(lo_hi) -> str:
    return f"[{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if lo_hi else "-"


def results_table(doc: dict):
    """A table of the headline numbers of an eval document."""
    from mtp_cli.tables import Table

    rows = []
    res = doc["results"]
    if "humaneval" in res:
        h = res["humaneval"]
        for key in (k for k in h if k.startswith("pass@") and "_" not in k):
            rows.append(["humaneval", key, f"{h[key]:.3f}", _ci(h[f"{key}_ci95"]), str(h["n"])])
        _gold_and_cuts(rows, "humaneval", h)
    if "gsm8k" in res:
        g = res["gsm8k"]
        for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
            rows.append(["gsm8k", key.split(",")[1], f"{g[key]:.3f}", _ci(g[f"{key}_ci95"]), str(g["n"])])
        _gold_and_cuts(rows, f"gsm8k ({g['num_fewshot']}-shot)", g)
    if "heldout" in res:
        for label, h in (("heldout", res["heldout"]), ("text", res["heldout"].get("text"))):
            if not h:
                continue
            rows.append([label, "loss (nats/token)", f"{h['loss']:.4f}", _ci(h["loss_ci95"]), f"{h['n']:,}"])
            rows.append([label, "bits per byte", f"{h['bpb']:.4f}", _ci(h["bpb_ci95"]), f"{h['n_bytes']:,} B"])
            rows.append([label, "top-1", f"{h['top1']:.3f}", "", f"{h['n']:,}"])
            if "train_val" in h:
                rows.append([label, f"loss, training's {h['train_val']['windows']} val windows",
                             f"{h['train_val']['loss']:.4f}", "", ""])
            for e in h["extra"]:
                rows.append([label, f"{e['name']} ({e['predicts']}) loss / top-1 / agree",
                             f"{e['loss']:.3f} / {e['top1']:.3f} / {e['agree']:.3f}", "", f"{e['n']:,}"])
    return Table(f"{doc['run']} (step {doc['step']}, {doc['objective']}) — trunk only, MTP modules discarded",
                 ["task", "metric", "value", "95% CI", "n"], rows)
