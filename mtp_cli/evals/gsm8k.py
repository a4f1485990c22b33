"""GSM8K through lm-eval: `simple_evaluate`, k-shot (5 by default), strict-match and flexible-extract,
and the likelihood of the reference answers (`gold_bpb`).

Online, it is lm-eval's stock `gsm8k` task (hub dataset `openai/gsm8k`). Offline (the default: the
repository's `data/gsm8k`, or `--gsm8k-data DIR`) it runs the same task from DIR/train.jsonl and
DIR/test.jsonl through the shipped YAML
(`tasks/gsm8k_local.yaml`, which `include`s the stock one), rendered into a temporary folder and
loaded with `TaskManager(include_path=...)`. Each score carries n and a Wilson 95% interval from
lm-eval's own per-document results, next to lm-eval's standard error.

Gold answers: `tasks/gsm8k_gold.yaml` turns the same task into a loglikelihood task, evaluated in
the same `simple_evaluate` call, so lm-eval builds (few-shot prompt, " " + answer) requests from the
same few-shot docs. Per question: bits = -log2 p(answer tokens | prompt), bytes = UTF-8 bytes of the
scored continuation; `gold_bpb` is the mean over questions of bits / bytes, with a bootstrap interval.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import datasets
import lm_eval
import yaml
from lm_eval.tasks import TaskManager

from mtp_cli.base import paths, stats
from mtp_cli.base.errors import UserError
from mtp_cli.base.files import read_json_lines
from mtp_cli.decode import context as ctxlib
from mtp_cli.evals.lm import DEFAULT_MAX_GEN_TOKS, scored_continuation

LOCAL_YAML = Path(__file__).parent / "tasks" / "gsm8k_local.yaml"
GOLD_YAML = Path(__file__).parent / "tasks" / "gsm8k_gold.yaml"
GOLD_TASK = "gsm8k_gold"
STOCK_YAML = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
METRICS = ("exact_match,strict-match", "exact_match,flexible-extract")
NUM_FEWSHOT = 5


def check_data(data_dir: str | Path) -> Path:
    data_dir = Path(data_dir).expanduser().resolve()
    if not data_dir.is_dir():
        raise UserError(f"GSM8K folder {data_dir} does not exist (expected GSM8K's train.jsonl and test.jsonl; "
                        f"set it with {paths.gsm8k_source_hint()})")
    missing = [name for name in ("train.jsonl", "test.jsonl") if not (data_dir / name).is_file()]
    if missing:
        raise UserError(
            f"GSM8K folder {data_dir} lacks {' and '.join(missing)} (expected the openai/grade-school-math JSONL files)"
        )
    for name in ("train.jsonl", "test.jsonl"):  # a damaged file: one line here, not a traceback inside `datasets`
        read_json_lines(data_dir / name, ("question", "answer"))
    return data_dir


def _fill(template: Path, fields: dict, into: Path) -> Path:
    text = template.read_text()
    for key, value in fields.items():
        text = text.replace(key, json.dumps(str(value)))
    (into / template.name).write_text(text)
    return into / template.name


def render_task(data_dir: Path | None, into: Path) -> Path:
    """Write the task YAMLs with their __UPPERCASE__ fields filled in (the local task only with `data_dir`;
    the gold task on top of the local one, or of the stock one without); returns their folder."""
    base = STOCK_YAML
    if data_dir is not None:
        base = _fill(LOCAL_YAML, {"__LM_EVAL_GSM8K_YAML__": STOCK_YAML, "__GSM8K_TRAIN__": data_dir / "train.jsonl",
                                  "__GSM8K_TEST__": data_dir / "test.jsonl"}, into)
    _fill(GOLD_YAML, {"__GSM8K_BASE_YAML__": base}, into)
    return into


def load_tasks(data_dir: Path | None, into: Path) -> tuple[TaskManager, str]:
    """(task manager, generative task name) with the gold task loadable beside it."""
    task_dir = str(render_task(data_dir, into))
    if data_dir is not None:
        return TaskManager(include_path=task_dir, include_defaults=False), "gsm8k_local"
    return TaskManager(include_path=task_dir), "gsm8k"


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub_reachable(timeout: float = 3.0) -> bool:

    from huggingface_hub import constants  # only for sources on the Hub

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def preflight(data_dir: str | Path | None) -> Path | None:
    """Fail fast, before any model work: local data must be complete, the stock task needs the hub."""
    if data_dir is not None:
        return check_data(data_dir)
    hint = "pass --gsm8k-data DIR with train.jsonl and test.jsonl to run the same task from local files"
    if _offline():
        stock = yaml.safe_load(STOCK_YAML.read_text())  # plain YAML: no include or !function in the stock task
        try:
            datasets.load_dataset_builder(stock["dataset_path"], stock.get("dataset_name"))
        except Exception as exc:
            raise UserError(f"GSM8K: offline and {stock['dataset_path']} is not in the local cache "
                            f"({type(exc).__name__}); {hint}") from None
    elif not _hub_reachable():
        raise UserError(f"GSM8K: the Hugging Face hub is unreachable (offline?); {hint}")
    return None


def _prompt_cuts(lm, limit: int | None, data_dir: Path | None, num_fewshot: int, seed: int = 0) -> dict:
    """lm-eval's requests for both tasks (as `run` builds them), measured by the model class's own rules:
    the prompt lengths and the cut each would need, for the generation and the gold-answer scoring."""

    with tempfile.TemporaryDirectory(prefix="mtp-gsm8k-task-") as tmp:
        manager, name = load_tasks(data_dir, Path(tmp))
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        tasks = manager.load([name, GOLD_TASK])["tasks"]
        with _quiet_request_bar():
            for task in tasks.values():
                task.set_config(key="num_fewshot", value=num_fewshot)
                task.set_fewshot_seed(seed=seed)
                task.build_all_requests(limit=limit, rank=0, world_size=1)
        generate = [i.args for i in tasks[name].instances]
        gold = [lm.encode_pair(*i.args) for i in tasks[GOLD_TASK].instances]
    budget = ctxlib.generation_budget(int(generate[0][1].get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)), lm.max_length)
    lengths = [len(lm.tok_encode(context)) for context, _ in generate]
    return {"budget": budget, "lengths": lengths,
            "cuts": [ctxlib.generation_cut(n, budget, lm.max_length) for n in lengths],
            "gold_lengths": [len(c) for c, _ in gold],
            "gold_cuts": [ctxlib.scoring_cut(len(c), len(t), lm.max_length) for c, t in gold]}


def check_context(lm, limit: int | None, data_dir: Path | None, num_fewshot: int = NUM_FEWSHOT,
                  seed: int = 0) -> None:
    """With `lm.truncate` off, refuse before any model work if a prompt would need a cut."""

    if lm.truncate:
        return
    m = _prompt_cuts(lm, limit, data_dir, num_fewshot, seed)
    ctxlib.refuse(f"gsm8k ({num_fewshot}-shot)", m["cuts"], m["lengths"], lm.max_length, f"+ {m['budget']} new tokens")
    ctxlib.refuse(f"gsm8k gold ({num_fewshot}-shot)", m["gold_cuts"], m["gold_lengths"], lm.max_length,
                  "+ reference answer")


def fitting_fewshot(lm, limit: int | None, data_dir: Path | None, most: int, seed: int = 0) -> int:
    """The largest shot count <= `most` at which no prompt (generation or gold scoring) needs a cut;
    0 when even the zero-shot prompts do not fit (they are then cut, and counted)."""
    for k in range(most, 0, -1):
        m = _prompt_cuts(lm, limit, data_dir, k, seed)
        if not any(m["cuts"]) and not any(m["gold_cuts"]):
            return k
    return 0


def run(lm, limit: int | None = None, data_dir: str | Path | None = None, seed: int = 0,
        num_fewshot: int = NUM_FEWSHOT, gold: bool = True, generate: bool = True) -> dict:
    """Evaluate an lm-eval LM object on GSM8K (and the gold answers' likelihood). Returns the
    `results.gsm8k` entry, with per-question rows under "samples" and, with `gold`, "gold".
    Without `generate`, lm-eval runs the gold task alone: no exact match, "samples" empty."""
    if not (gold or generate):
        raise ValueError("gsm8k.run: nothing to evaluate (gold and generate both off)")
    data_dir = preflight(data_dir)
    if getattr(lm, "truncate", True) is False:
        check_context(lm, limit, data_dir, num_fewshot, seed)
    with tempfile.TemporaryDirectory(prefix="mtp-gsm8k-task-") as tmp:
        manager, task = load_tasks(data_dir, Path(tmp))
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        datasets.disable_progress_bars()
        try:
            with _quiet_request_bar():
                out = lm_eval.simple_evaluate(model=lm, tasks=([task] if generate else []) + ([GOLD_TASK] if gold else []),
                                              num_fewshot=num_fewshot, limit=limit, task_manager=manager,
                                              log_samples=True, random_seed=seed, numpy_random_seed=seed,
                                              torch_random_seed=seed, fewshot_random_seed=seed)
        except (ConnectionError, OSError) as exc:
            if data_dir is None:
                raise UserError(f"could not load openai/gsm8k from the hub or its cache ({type(exc).__name__}); "
                                "pass --gsm8k-data DIR to run from local files") from None
            raise
    records = getattr(lm, "records", {})
    if generate:
        result = summarize(out, task, num_fewshot)
        for row in result["samples"]:
            row.update(records.get((task, "generate", row["doc_id"]), {}))
    else:
        result = {"num_fewshot": num_fewshot, "generated": False, "samples": []}
    if gold:
        result |= summarize_gold(out, records, task)
    if not generate:
        result["n"] = result["gold_n"]
    return result | {"task": task, "data": paths.shown(data_dir) if data_dir else "hub:openai/gsm8k"}


def summarize_gold(out: dict, records: dict, generative_task: str) -> dict:
    """Per-question bits per byte of the reference answer, from lm-eval's own loglikelihood samples
    (checked to hold the very prompt the generative task sent for the same question)."""

    generated = generative_task in out["samples"]
    prompts = {s["doc_id"]: s["arguments"][0][0] for s in out["samples"][generative_task]} if generated else {}
    rows = []
    for sample in sorted(out["samples"][GOLD_TASK], key=lambda s: s["doc_id"]):
        (context, continuation), = [tuple(a) for a in sample["arguments"]]
        if generated and prompts.get(sample["doc_id"]) != context:
            raise RuntimeError(f"GSM8K doc {sample['doc_id']}: the gold request's prompt differs from the generative one")
        logprob, _greedy = sample["resps"][0][0]  # one request per doc, one response per request
        gold_bytes = len(scored_continuation(context, continuation).encode("utf-8"))
        bits = -float(logprob) / math.log(2)
        rows.append({"doc_id": int(sample["doc_id"]), "gold_bpb": bits / gold_bytes, "gold_bits": bits,
                     "gold_bytes": gold_bytes, **records.get((GOLD_TASK, "loglikelihood", int(sample["doc_id"])), {})})
    values = [r["gold_bpb"] for r in rows]
    return {"gold_bpb": sum(values) / len(values), "gold_bpb_ci95": list(stats.bootstrap_mean(values)),
            "gold_n": len(rows), "gold_ci_method": "bootstrap over questions", "gold": rows}


@contextlib.contextmanager
def _quiet_request_bar():
    """lm-eval draws a tqdm bar while it builds the requests (in lm_eval.api.task); our Rich progress
    view already shows the generation, so that bar is switched off for the call."""
    import lm_eval.api.task as task_module  # lm-eval: seconds of start-up, only on this path

    original = getattr(task_module, "tqdm", None)
    if original is None:
        yield
        return
    task_module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        task_module.tqdm = original


def summarize(out: dict, task: str, num_fewshot: int = NUM_FEWSHOT) -> dict:
    """lm-eval's scores plus n and Wilson intervals recomputed from its per-document results."""
    scores = out["results"][task]
    per_doc: dict[str, list[float]] = {}
    for sample in out["samples"][task]:
        per_doc.setdefault(f"exact_match,{sample['filter']}", []).append(float(sample["exact_match"]))
    result: dict = {"num_fewshot": num_fewshot, "version": out.get("versions", {}).get(task)}
    for metric in METRICS:
        values = per_doc[metric]
        mean = sum(values) / len(values)
        if abs(mean - scores[metric]) > 1e-9:
            raise RuntimeError(f"lm-eval's {metric} {scores[metric]} != mean of its samples {mean}")
        name, flt = metric.split(",")
        result[metric] = scores[metric]
        result[f"{metric}_ci95"] = list(stats.wilson(sum(values), len(values)))
        result[f"{name}_stderr,{flt}"] = scores.get(f"{name}_stderr,{flt}")
    result["n"] = len(per_doc[METRICS[0]])
    result["ci_method"] = "wilson"
    result["samples"] = [{"doc_id": s["doc_id"], "filter": s["filter"], "exact_match": s["exact_match"],
                          "target": s["target"], "response": s["resps"][0][0] if s["resps"] else None,
                          "extracted": s["filtered_resps"][0] if s["filtered_resps"] else None}
                         for s in out["samples"][task] if s["filter"] == "flexible-extract"]
    return result
