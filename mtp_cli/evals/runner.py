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
from dataclasses import dataclass
from pathlib import Path

from mtp_cli.base import env, outputs, paths, ui
from mtp_cli.base.errors import UserError
from mtp_cli.base.result_docs import EvalDoc, write_eval
from mtp_cli.base.run_files import EVAL_JSON
from mtp_cli.base.tables import Table
from mtp_cli.config.recipe import EVAL_TASKS, EvalConfig, MTPConfig, Runtime, load_recipe, resolve_recipe_path
from mtp_cli.data import tokenizer as toklib
from mtp_cli.decode import context as ctxlib
from mtp_cli.evals import gsm8k, heldout, humaneval, humaneval_tasks, sandbox
from mtp_cli.evals.lm import MTPLM
from mtp_cli.model import MTPModel, pretrained
from mtp_cli.model.checkpoint import LoadedRun, load_run
from mtp_cli.model.hf import ensure_export, load_export
from mtp_cli.model.weight_format import use_weights


def parse_tasks(tasks: str | Sequence[str]) -> list[str]:
    """`--tasks humaneval,heldout` as a list (unknown names are `EvalConfig.validate`'s to refuse)."""
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    return list(dict.fromkeys(names))


def parse_limits(text: str | None, tasks: Sequence[str]) -> dict[str, int]:
    """`--limit 50` (every task) or `--limit humaneval=0,gsm8k=200` (per task) as `EvalConfig.limits`."""
    if text is None or not str(text).strip():
        return {}
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) == 1 and "=" not in parts[0]:
        parts = [f"{t}={parts[0]}" for t in tasks]
    limits: dict[str, int] = {}
    for part in parts:
        task, _, value = (p.strip() for p in part.partition("="))
        if not task or not value.lstrip("-").isdigit():
            raise UserError(f"--limit {text}: expected N or task=N[,task=N], got {part!r}")
        limits[task] = int(value)
    return limits


def samples_path(json_path: Path, task: str, kind: str = "samples") -> Path:
    return json_path.with_name(f"{json_path.stem}_{task}_{kind}.jsonl")


def write_rows(path: Path, rows) -> str:
    """One JSON object per line; returns the file name (items paths are relative to the JSON's folder)."""
    path.write_text("".join(json.dumps(r, default=float) + "\n" for r in rows))
    return path.name


def hf_json_path(source: str) -> Path:
    """Where `mtp eval --hf SOURCE` writes by default: runs/hf/<source, '/' as '--'>/eval.json (like every
    command's default output, under runs/, never the committed results/)."""
    return Path("runs") / "hf" / str(source).strip("/").replace("/", "--") / EVAL_JSON


def hf_run(source: str, recipe=None):
    """A checkpoint we did not train, as a run: its trunk (no modules), its tokenizer, and a recipe whose
    [data] (default: the quick recipe's) gives the held-out validation split, tokenized by the checkpoint."""
    pretrained.locate(source, flag="--hf")
    r = load_recipe(recipe or "quick")
    r.train.init_from, r.train.freeze_trunk, r.mtp = str(source), False, MTPConfig()
    src = pretrained.resolve_recipe(r, pretrained.given_model_keys(resolve_recipe_path(recipe)) if recipe else set())
    model = MTPModel(r.model, r.mtp)
    pretrained.init_model(model, src)
    return LoadedRun(src.path, r, model.eval(), toklib.load(src.path), 0), src


@dataclass
class _Subject:
    """What an eval scores: the full run (held-out loss reads its MTP modules too) and the trunk with its
    tokenizer that generates (the run's export, or the Hugging Face checkpoint's own trunk)."""

    run: LoadedRun
    source: object | None  # pretrained.Source for --hf, else None
    export_dir: Path | None = None
    trunk: object | None = None
    tokenizer: object | None = None

    def lm(self, cfg: EvalConfig, rt: Runtime, **more):
        return MTPLM(trunk=self.trunk, tokenizer=self.tokenizer, truncate=cfg.truncate, compile=rt.compile, **more)


def run_eval(run_dir: str | Path | None, cfg: EvalConfig, rt: Runtime | None = None, *, hf: str | None = None,
             recipe: str | None = None, text: str | Path | None = None, json_path: str | Path | None = None,
             show_progress: bool = True) -> dict:
    """Evaluate one run, or with `hf` a Hugging Face checkpoint (folder, Hub id, .gguf or short name;
    `recipe` gives its held-out data), as `cfg` says, on `rt`'s device; writes and returns the eval JSON
    document. `cfg.gsm8k_data` is a folder (or "hub") as `paths.gsm8k_folder` reads it; a None
    `cfg.gsm8k_fewshot` takes the recipe's eval.gsm8k_fewshot, lowered to the largest count whose prompts
    fit the trained context. Every input is checked before any model work."""
    rt = rt or Runtime()
    if not cfg.tasks:
        raise UserError(f"no eval task given; choose from {', '.join(EVAL_TASKS)}")
    cfg.validate()
    rt.validate()
    if (run_dir is None) == (hf is None):
        raise UserError("give a run folder or --hf SOURCE (one of them)")
    device = env.use_runtime(rt)
    subject = _load_subject(run_dir, hf, recipe, device)  # a missing or broken run is the first thing to report
    gsm8k_dir = _preflight(cfg, subject.run, text)
    run_dir = subject.run.run_dir
    json_path = outputs.file(Path(json_path) if json_path else hf_json_path(hf) if hf else run_dir / EVAL_JSON, "--json")
    for task in cfg.tasks:
        outputs.file(samples_path(json_path, task, "windows" if task == "heldout" else "samples"), "--json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    _load_trunk(subject, cfg, device)
    for model in {id(m): m for m in (subject.run.model, subject.trunk) if m is not None}.values():
        use_weights(model, rt.dtype)
    fewshot = _check_contexts(subject, cfg, rt, gsm8k_dir)
    results: dict = {}
    seconds: dict = {}
    with ui.progress(disable=not show_progress) as progress:
        for task in cfg.tasks:
            t0 = time.perf_counter()
            if task == "heldout":
                results[task] = _heldout(subject.run, cfg, text, json_path, progress)
            elif task == "humaneval":
                results[task] = humaneval.run(subject.trunk, subject.tokenizer, samples_path(json_path, task),
                                              cfg.limit(task), cfg.samples, cfg.temperature, progress=progress,
                                              truncate=cfg.truncate, compile=rt.compile,
                                              prompt_style=cfg.humaneval_prompt, generate=cfg.generate)
            else:
                results[task] = _gsm8k(subject, cfg, rt, gsm8k_dir, fewshot, json_path, progress)
            seconds[task] = round(time.perf_counter() - t0, 2)
    doc = EvalDoc(run=subject.source.name if subject.source else str(run_dir), step=subject.run.step,
                  objective=subject.run.model.objective, hf=subject.source.record() if subject.source else None,
                  export=paths.portable(subject.export_dir) if subject.export_dir else None,
                  context=subject.run.recipe.model.context, tasks=list(cfg.tasks),
                  limits={task: cfg.limit(task) for task in cfg.tasks}, seconds=seconds, hardware=env.hardware(),
                  git_commit=env.git_commit(), results=results, dtype=rt.dtype)
    return write_eval(json_path, doc) | {"json_path": str(json_path)}


def _load_subject(run_dir, hf: str | None, recipe: str | None, device) -> _Subject:
    if hf is not None:
        run, source = hf_run(hf, recipe)
        run.model.to(device)
        return _Subject(run, source)
    return _Subject(load_run(Path(run_dir), device), None)


def _preflight(cfg: EvalConfig, run: LoadedRun, text) -> Path | None:
    """Checks that need no model work; returns the GSM8K folder (None: the hub)."""
    gsm8k_dir = None
    if "humaneval" in cfg.tasks:
        sandbox.detect()  # fails here, not after generating, where no fence can be built
    if "gsm8k" in cfg.tasks:
        gsm8k_dir = gsm8k.preflight(paths.gsm8k_folder(cfg.gsm8k_data))
    if text is not None:
        if not Path(text).is_file():
            raise UserError(f"--text {text}: no such file")
        heldout.text_tokens(text, run.tokenizer, run.recipe.model.context)
    return gsm8k_dir


def _load_trunk(subject: _Subject, cfg: EvalConfig, device) -> None:
    """The generating trunk: the --hf checkpoint's own, or the run's export (made or refreshed here)."""
    if subject.source is not None:
        subject.export_dir, subject.trunk, subject.tokenizer = (subject.source.path, subject.run.model.trunk,
                                                                 subject.run.tokenizer)
    elif {"humaneval", "gsm8k"} & set(cfg.tasks):
        subject.export_dir = ensure_export(subject.run.run_dir)
        trunk, subject.tokenizer = load_export(subject.export_dir)
        subject.trunk = trunk.to(device)


def _check_contexts(subject: _Subject, cfg: EvalConfig, rt: Runtime, gsm8k_dir: Path | None) -> int | None:
    """GSM8K's shot count (see `run_eval`); with truncate off, refusals come before any model work."""
    fewshot = cfg.gsm8k_fewshot
    if "gsm8k" in cfg.tasks and fewshot is None:
        fewshot = gsm8k.fitting_fewshot(MTPLM(trunk=subject.trunk, tokenizer=subject.tokenizer), cfg.limit("gsm8k"), gsm8k_dir,
                                        subject.run.recipe.eval.gsm8k_fewshot or 0)
    if "humaneval" in cfg.tasks and cfg.humaneval_prompt == "instruct":
        humaneval_tasks.check_chat_template(subject.tokenizer)
    if "humaneval" in cfg.tasks:
        humaneval.check_context(subject.trunk, subject.tokenizer, cfg.limit("humaneval"), truncate=cfg.truncate,
                                prompt_style=cfg.humaneval_prompt)
    if "gsm8k" in cfg.tasks:
        gsm8k.check_context(subject.lm(cfg, rt), cfg.limit("gsm8k"), gsm8k_dir, fewshot)
    return fewshot


def _heldout(run: LoadedRun, cfg: EvalConfig, text, json_path: Path, progress) -> dict:
    result = heldout.report(run, cfg.limit("heldout"), text, progress)
    windows_path = write_rows(samples_path(json_path, "heldout", "windows"), result.pop("windows"))
    if "text" in result:
        result["text"].pop("windows")
    return result | {"windows_path": windows_path, "items_path": windows_path}


def _gsm8k(subject: _Subject, cfg: EvalConfig, rt: Runtime, gsm8k_dir, fewshot: int, json_path: Path,
           progress) -> dict:
    lm = subject.lm(cfg, rt, progress=progress)
    lm.score_description = "gsm8k: score gold answers"
    result = gsm8k.run(lm, cfg.limit("gsm8k"), gsm8k_dir, num_fewshot=fewshot, generate=cfg.generate)
    path = samples_path(json_path, "gsm8k")
    write_rows(path, result.pop("samples"))
    gold = result.pop("gold")
    context = subject.trunk.cfg.context
    gold_cut = ctxlib.summary([r["prompt_cut_tokens"] for r in gold], [r["prompt_tokens"] for r in gold], context)
    return result | {
        "samples_path": str(path), "items_path": write_rows(samples_path(json_path, "gsm8k", "gold"), gold),
        "max_gen_toks": max(lm.gen_budgets, default=None),
        **ctxlib.summary(lm.prompt_cuts, lm.prompt_lengths, context),
        **{f"gold_{k}": gold_cut[k] for k in ("prompts_cut", "prompt_cut_tokens_max", "prompt_cut_tokens_mean")}}


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

    rows = []
    res = doc["results"]
    if "humaneval" in res:
        h = res["humaneval"]
        for key in (k for k in h if k.startswith("pass@") and "_" not in k):
            rows.append(["humaneval", key, f"{h[key]:.3f}", _ci(h[f"{key}_ci95"]), str(h["n"])])
        _gold_and_cuts(rows, "humaneval", h)
    if "gsm8k" in res:
        g = res["gsm8k"]
        for key in (k for k in ("exact_match,strict-match", "exact_match,flexible-extract") if k in g):
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
    by = f", {doc['harness']}" if doc.get("harness", "mtp") != "mtp" else ""
    return Table(f"{doc['run']} (step {doc['step']}, {doc['objective']}{by}) — trunk only, MTP modules discarded",
                 ["task", "metric", "value", "95% CI", "n"], rows)
