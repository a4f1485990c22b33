"""GSM8K through lm-eval: the local task is the stock task on local files, our lm-eval model class
agrees with HFLM on the export, and missing data is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import random_export_dir

from mtp_cli.base.errors import UserError
from mtp_cli.data import gsm8k_format
from mtp_cli.evals import gsm8k
from mtp_cli.evals.lm import MTPLM
from mtp_cli.model import hf

pytestmark = pytest.mark.usefixtures("single_thread")

GSM8K_DATA = Path(__file__).resolve().parent / "data" / "gsm8k"  # a bundled slice of GSM8K
needs_data = pytest.mark.skipif(not (GSM8K_DATA / "test.jsonl").is_file(), reason=f"no GSM8K data at {GSM8K_DATA}")


@pytest.fixture(scope="module")
def random_export(tiny_runs, tmp_path_factory) -> Path:
    """A trunk with large random weights (varied, tie-free greedy output) exported for HFLM."""
    return random_export_dir(tiny_runs["ntp"], tmp_path_factory.mktemp("random-export"))


@pytest.fixture(scope="module")
def random_export_320(tiny_runs, tmp_path_factory) -> Path:
    """The same at context 320: room for lm-eval's 256 new tokens after a cut prompt (HFLM asserts that)."""
    return random_export_dir(tiny_runs["ntp"], tmp_path_factory.mktemp("random-export"), context=320)


@needs_data
def test_local_task_is_the_stock_task_on_local_files(tmp_path):
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    gsm8k.render_task(GSM8K_DATA, tmp_path)
    local = load_yaml(tmp_path / "gsm8k_local.yaml", resolve_func=False)
    stock = load_yaml(gsm8k.STOCK_YAML, resolve_func=False)
    differs = {k for k in set(local) | set(stock) if local.get(k) != stock.get(k)}
    assert differs == {"task", "tag", "dataset_path", "dataset_name", "dataset_kwargs"}
    assert local["dataset_path"] == "json"
    task = TaskManager(include_path=str(tmp_path), include_defaults=False).load(["gsm8k_local"])["tasks"]["gsm8k_local"]
    doc = next(iter(task.test_docs()))
    assert task.doc_to_text(doc) == f"Question: {doc['question']}\nAnswer:"
    # specbench's GSM8K prompts, GSM8K training documents and self-distillation prompts read the same YAML
    assert all(gsm8k_format.prompt(d["question"]) == task.doc_to_text(d) for d in list(task.test_docs())[:20])
    shot = next(iter(task.training_docs()))
    assert gsm8k_format.document(shot["question"], shot["answer"]) == (
        task.doc_to_text(shot) + task.config.target_delimiter + task.doc_to_target(shot))
    rows = lambda name: sum(1 for line in (GSM8K_DATA / name).read_text().splitlines() if line.strip())  # noqa: E731
    assert len(task.test_docs()) == rows("test.jsonl") and len(task.training_docs()) == rows("train.jsonl")


@needs_data
def test_ours_agrees_with_hflm_on_the_export(random_export_320):
    """Same cut prompts, same completions, same scores, same gold-answer likelihoods as lm-eval's HFLM at
    max_length = the trained context (every 5-shot prompt is cut to its rightmost 320 - 256 tokens)."""
    from lm_eval.models.huggingface import HFLM

    trunk, tok = hf.load_export(random_export_320)
    lm = MTPLM(trunk=trunk, tokenizer=tok)
    ours = gsm8k.run(lm, limit=3, data_dir=GSM8K_DATA)
    theirs = gsm8k.run(HFLM(pretrained=str(random_export_320), max_length=320, batch_size=3, device="cpu",
                            dtype="float32"), limit=3, data_dir=GSM8K_DATA)
    assert [s["response"] for s in ours["samples"]] == [s["response"] for s in theirs["samples"]]
    assert len({s["response"] for s in ours["samples"]}) == 3 and all(s["response"].strip() for s in ours["samples"])
    for key in gsm8k.METRICS:
        assert ours[key] == theirs[key]
    assert all(s["prompt_cut_tokens"] == s["prompt_tokens"] - (320 - 256) > 0 for s in ours["samples"])
    assert [g["doc_id"] for g in ours["gold"]] == [g["doc_id"] for g in theirs["gold"]] == [0, 1, 2]
    for a, b in zip(ours["gold"], theirs["gold"]):
        assert a["gold_bits"] == pytest.approx(b["gold_bits"], rel=1e-4) and a["gold_bytes"] == b["gold_bytes"]
        assert a["prompt_cut_tokens"] == a["prompt_tokens"] + a["gold_tokens"] - 321 > 0


def test_loglikelihoods_agree_with_hflm(random_export):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    trunk, tok = hf.load_export(random_export)
    ours = MTPLM(trunk=trunk, tokenizer=tok)
    theirs = HFLM(pretrained=str(random_export), batch_size=2, device="cpu", dtype="float32")
    pairs = [("def f(x):", "\n    return x"), ("import os", " and sys"), ("", "hello world")]
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    for (a, ga), (b, gb) in zip(ours.loglikelihood(reqs), theirs.loglikelihood(reqs)):
        assert a == pytest.approx(b, abs=1e-3) and ga == gb
    text = "class Template:\n    pattern = r'x'\n" * 5  # longer than the 64-token context: rolling windows
    rolling = [Instance("loglikelihood_rolling", {}, (text,), 0)]
    assert ours.loglikelihood_rolling(rolling)[0] == pytest.approx(theirs.loglikelihood_rolling(rolling)[0], abs=1e-2)


def test_missing_or_incomplete_data_is_a_user_error(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="train.jsonl and test.jsonl"):
        gsm8k.check_data(tmp_path)
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(UserError, match="test.jsonl"):
        gsm8k.preflight(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(gsm8k, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UserError, match="--gsm8k-data"):
        gsm8k.preflight(None)


def test_lm_eval_request_bar_is_off_only_during_the_call():
    import lm_eval.api.task as task_module

    from mtp_cli.evals import gsm8k

    original = task_module.tqdm
    with gsm8k._quiet_request_bar():
        assert task_module.tqdm([1, 2]).disable
    assert task_module.tqdm is original
