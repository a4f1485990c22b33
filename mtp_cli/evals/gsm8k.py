"""GSM8K through lm-eval: `simple_evaluate`, 5-shot, strict-match and flexible-extract.

Online, it is lm-eval's stock `gsm8k` task (hub dataset `openai/gsm8k`). Offline (the default: the
repository's `data/gsm8k`, or `--gsm8k-data DIR`) it runs the same task from DIR/train.jsonl and DIR/test.jsonl through the shipped YAML
(`tasks/gsm8k_local.yaml`, which `include`s the stock one), rendered into a temporary folder and
loaded with `TaskManager(include_path=...)`. Each score carries n and a Wilson 95% interval from
lm-eval's own per-document results, next to lm-eval's standard error.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import socket
import tempfile
from pathlib import Path

import datasets
import lm_eval
from lm_eval.tasks import TaskManager

from mtp_cli import paths
from mtp_cli.errors import UserError
from mtp_cli import stats

LOCAL_YAML = Path(__file__).parent / "tasks" / "gsm8k_local.yaml"
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
        raise UserError(f"GSM8K folder {data_dir} lacks {' and '.join(missing)} (expected the openai/grade-school-math JSONL files)")
    return data_dir


def render_task(data_dir: Path, into: Path) -> Path:
    """Write the local task YAML with its __UPPERCASE__ fields filled in; returns its folder."""
    text = LOCAL_YAML.read_text()
    for key, value in {"__LM_EVAL_GSM8K_YAML__": STOCK_YAML, "__GSM8K_TRAIN__": data_dir / "train.jsonl",
                       "__GSM8K_TEST__": data_dir / "test.jsonl"}.items():
        text = text.replace(key, json.dumps(str(value)))
    (into / "gsm8k_local.yaml").write_text(text)
    return into


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub_reachable(timeout: float = 3.0) -> bool:
    from urllib.parse import urlparse

    from huggingface_hub import constants

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
        from lm_eval.tasks._yaml_loader import load_yaml

        stock = load_yaml(STOCK_YAML, resolve_func=False)
        try:
            datasets.load_dataset_builder(stock["dataset_path"], stock.get("dataset_name"))
        except Exception as exc:
            raise UserError(f"GSM8K: offline and {stock['dataset_path']} is not in the local cache "
                            f"({type(exc).__name__}); {hint}") from None
    elif not _hub_reachable():
        raise UserError(f"GSM8K: the Hugging Face hub is unreachable (offline?); {hint}")
    return None


def run(lm, limit: int | None = None, data_dir: str | Path | None = None, seed: int = 0) -> dict:
    """Evaluate an lm-eval LM object on GSM8K. Returns the `results.gsm8k` entry."""
    data_dir = preflight(data_dir)
    with tempfile.TemporaryDirectory(prefix="mtp-gsm8k-task-") as tmp:
        if data_dir is not None:
            task_dir = str(render_task(data_dir, Path(tmp)))
            manager, task = TaskManager(include_path=task_dir, include_defaults=False), "gsm8k_local"
        else:
            manager, task = TaskManager(), "gsm8k"
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        datasets.disable_progress_bars()
        try:
            with _quiet_request_bar():
                out = lm_eval.simple_evaluate(model=lm, tasks=[task], num_fewshot=NUM_FEWSHOT, limit=limit,
                                              task_manager=manager, log_samples=True, random_seed=seed,
                                              numpy_random_seed=seed, torch_random_seed=seed,
                                              fewshot_random_seed=seed)
        except (ConnectionError, OSError) as exc:
            if data_dir is None:
                raise UserError(f"could not load openai/gsm8k from the hub or its cache ({type(exc).__name__}); "
                                "pass --gsm8k-data DIR to run from local files") from None
            raise
    return summarize(out, task) | {"task": task, "data": paths.shown(data_dir) if data_dir else "hub:openai/gsm8k"}


@contextlib.contextmanager
def _quiet_request_bar():
    """lm-eval draws a tqdm bar while it builds the requests (in lm_eval.api.task); our Rich progress
    view already shows the generation, so that bar is switched off for the call."""
    import lm_eval.api.task as task_module

    original = getattr(task_module, "tqdm", None)
    if original is None:
        yield
        return
    task_module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        task_module.tqdm = original


def summarize(out: dict, task: str) -> dict:
    """lm-eval's scores plus n and Wilson intervals recomputed from its per-document results."""
    scores = out["results"][task]
    per_doc: dict[str, list[float]] = {}
    for sample in out["samples"][task]:
        per_doc.setdefault(f"exact_match,{sample['filter']}", []).append(float(sample["exact_match"]))
    result: dict = {"num_fewshot": NUM_FEWSHOT, "version": out.get("versions", {}).get(task)}
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
