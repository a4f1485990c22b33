"""`mtp eval` end to end (runner, JSON schema, held-out arithmetic) and the export/eval/generate CLI,
including its one-line errors with exit code 2."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import EVAL_TASKS, EvalConfig, Runtime
from mtp_cli.evals import heldout, runner
from mtp_cli.model.checkpoint import load_run

pytestmark = pytest.mark.usefixtures("single_thread")

REPO = Path(__file__).resolve().parents[1]
GSM8K_DATA = Path(__file__).resolve().parent / "data" / "gsm8k"  # a bundled slice of GSM8K


def cli(*args, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The real `mtp` entry point in a fresh process (one torch thread: tiny models, shared cores)."""
    return subprocess.run([sys.executable, "-m", "mtp_cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def mtp(*args, capsys, monkeypatch) -> subprocess.CompletedProcess:
    """`mtp_cli.cli.main` in this process (no start-up cost), as a CompletedProcess."""
    from mtp_cli.cli import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["mtp", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.skipif(not (GSM8K_DATA / "test.jsonl").is_file(), reason="no GSM8K data")
def test_run_eval_writes_the_documented_json(tiny_runs, tmp_path):
    json_path = tmp_path / "out" / "eval.json"
    text = tmp_path / "text.txt"
    text.write_text((REPO / "mtp_cli" / "base" / "stats.py").read_text())
    cfg = EvalConfig(limits={t: 2 for t in EVAL_TASKS}, gsm8k_data=str(GSM8K_DATA), gsm8k_fewshot=None)
    doc = runner.run_eval(tiny_runs["sequential"], cfg, text=text, json_path=json_path, show_progress=False)
    assert json.loads(json_path.read_text())["results"] == json.loads(json.dumps(doc["results"]))
    res = doc["results"]
    h, g, ho = res["humaneval"], res["gsm8k"], res["heldout"]
    assert h["n"] == 2 and 0 <= h["pass@1"] <= 1 and len(h["pass@1_ci95"]) == 2
    assert Path(h["samples_path"]).parent == json_path.parent and Path(h["samples_path"]).is_file()
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        assert 0 <= g[key] <= 1 and len(g[f"{key}_ci95"]) == 2
    assert g["n"] == 2 and Path(g["samples_path"]).is_file()
    assert ho["n"] == 2 * 64 and ho["loss_ci95"][0] <= ho["loss"] <= ho["loss_ci95"][1]
    assert [e["name"] for e in ho["extra"]] == ["depth 1", "depth 2"]
    assert ho["text"]["n_windows"] >= 1 and ho["text"]["source"] == str(text.resolve())
    export = Path(doc["export"])
    assert export == tiny_runs["sequential"] / "export" and (export / "model.safetensors").is_file()
    info = json.loads((export / "mtp_export.json").read_text())
    assert info["step"] == doc["step"] and info["mtp_params_discarded"] > 0
    assert doc["tasks"] == ["humaneval", "gsm8k", "heldout"] and set(doc["seconds"]) == set(doc["tasks"])


@pytest.mark.skipif(not (GSM8K_DATA / "test.jsonl").is_file(), reason="no GSM8K data")
def test_gold_only_scores_the_same_gold_answers_without_generating(tiny_runs, tmp_path):
    """eval.generate = false: HumanEval and GSM8K give the very gold bits/byte of the generating eval (the same
    prompts, the same answers), and no pass rate."""
    limits = {"humaneval": 3, "gsm8k": 3}
    docs = {gen: runner.run_eval(tiny_runs["ntp"], EvalConfig(tasks=["humaneval", "gsm8k"], limits=limits, generate=gen,
                                                              gsm8k_data=str(GSM8K_DATA), gsm8k_fewshot=1),
                                 json_path=tmp_path / f"{gen}" / "eval.json", show_progress=False)
            for gen in (True, False)}
    full, gold = docs[True]["results"], docs[False]["results"]
    for task in ("humaneval", "gsm8k"):
        assert gold[task]["gold_bpb"] == pytest.approx(full[task]["gold_bpb"], rel=1e-9)
        assert gold[task]["gold_n"] == gold[task]["n"] == 3 and gold[task]["generated"] is False
    assert "pass@1" not in gold["humaneval"] and "exact_match,strict-match" not in gold["gsm8k"]
    rows = [json.loads(line) for line in (tmp_path / "False" / gold["humaneval"]["items_path"]).read_text().splitlines()]
    assert [r["gold_bpb"] for r in rows] == pytest.approx(
        [json.loads(line)["gold_bpb"] for line in Path(full["humaneval"]["samples_path"]).read_text().splitlines()])
    assert runner.results_table(docs[False]).rows  # renders without pass rates

def test_heldout_bits_per_byte_is_loss_over_bytes(tiny_runs):
    run = load_run(tiny_runs["parallel"])
    ids = run.tokenizer("def f(x):\n    return x * 2\n" * 40, add_special_tokens=False).input_ids
    out = heldout.score_tokens(run.model, run.tokenizer, np.asarray(ids), limit=3)
    n_bytes = len(run.tokenizer.decode(ids[1:1 + 3 * 64]).encode())
    assert out["n"] == 3 * 64 and out["n_bytes"] == n_bytes
    assert out["bpb"] == pytest.approx(out["loss"] * out["n"] / math.log(2) / n_bytes)
    x = torch.tensor([ids[i * 64:(i + 1) * 64] for i in range(3)])
    y = torch.tensor([ids[i * 64 + 1:(i + 1) * 64 + 1] for i in range(3)])
    full = heldout.evaluate(run.model, [(x, y)])
    assert out["loss"] == pytest.approx(full["loss"]) and out["extra"][0]["agree"] == pytest.approx(full["agree_1"])
    assert [e["name"] for e in out["extra"]] == ["head 2", "head 3"]


def test_heldout_matches_the_training_validation_on_the_same_windows(tiny_runs):
    """`mtp eval`'s held-out numbers over training's validation windows equal what training logged."""
    run = load_run(tiny_runs["sequential"])
    final = json.loads((tiny_runs["sequential"] / "run.json").read_text())["final"]
    out = heldout.report(run, limit=run.recipe.train.eval_batches * run.recipe.train.batch_size)
    assert out["loss"] == pytest.approx(final["val_loss"], abs=1e-5)
    assert out["top1"] == pytest.approx(final["val_top1"], abs=1e-6)
    for e in out["extra"]:
        assert e["loss"] == pytest.approx(final[f"val_loss_{e['k']}"], abs=1e-5)
        assert e["agree"] == pytest.approx(final[f"val_agree_{e['k']}"], abs=1e-6)


def test_limits_and_tasks_are_validated():
    assert runner.parse_tasks("heldout, gsm8k,heldout") == ["heldout", "gsm8k"]
    with pytest.raises(UserError, match="unknown eval task 'mmlu'"):
        EvalConfig(tasks=runner.parse_tasks("heldout,mmlu")).validate()
    with pytest.raises(UserError, match="no eval task"):
        runner.run_eval("any", EvalConfig(tasks=runner.parse_tasks(" , ")))
    cfg = EvalConfig(tasks=["humaneval", "gsm8k", "heldout"], limits={"humaneval": 0, "gsm8k": 5})
    cfg.validate()
    assert [cfg.limit(t) for t in cfg.tasks] == [None, 5, None]
    with pytest.raises(UserError, match="--limit"):
        EvalConfig(tasks=["heldout"], limits={"heldout": -1}).validate()
    tasks = ["humaneval", "gsm8k"]
    assert runner.parse_limits("50", tasks) == {"humaneval": 50, "gsm8k": 50}
    assert runner.parse_limits("humaneval=0, gsm8k=200", tasks) == {"humaneval": 0, "gsm8k": 200}
    assert runner.parse_limits(None, tasks) == {}
    with pytest.raises(UserError, match="expected N or task=N"):
        runner.parse_limits("gsm8k=all", tasks)
    with pytest.raises(UserError, match="unknown task 'mbpp'"):
        EvalConfig(tasks=tasks, limits=runner.parse_limits("mbpp=3", tasks)).validate()
    for samples, temperature, message in ((0, 0.0, "--samples"), (1, -0.5, "--temperature"), (4, 0.0, "--temperature")):
        with pytest.raises(UserError, match=message):
            EvalConfig(samples=samples, temperature=temperature).validate()
    with pytest.raises(UserError, match="--device"):
        Runtime(device="tpu").validate()
    with pytest.raises(UserError, match="--threads must be >= 1"):
        Runtime(threads=0).validate()


def test_cli_export_generate_and_heldout_eval(tiny_runs, tmp_path):
    out = tmp_path / "hf"
    proc = cli("export", tiny_runs["ntp"], "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    proc = cli("generate", tiny_runs["ntp"], "--prompt", "def split(", "--max-new-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("def split(") and len(proc.stdout) > len("def split(\n")
    run = load_run(tiny_runs["ntp"])
    from helpers import generate_texts

    expected = generate_texts(run.model.trunk, run.tokenizer, ["def split("], 12)[0]
    assert proc.stdout == "def split(" + expected + "\n"
    json_path = tmp_path / "e.json"
    proc = cli("eval", tiny_runs["ntp"], "--tasks", "heldout", "--limit", "2", "--json", json_path)
    assert proc.returncode == 0, proc.stderr
    assert "loss (nats/token)" in proc.stdout
    assert json.loads(json_path.read_text())["results"]["heldout"]["n"] == 2 * 64


def test_cli_bad_input_is_one_line_and_exit_2(tiny_runs, tmp_path, capsys, monkeypatch):
    def run(*args):
        return mtp(*args, capsys=capsys, monkeypatch=monkeypatch)

    empty = tmp_path / "no-checkpoint"
    empty.mkdir()
    one_line_error(run("eval", empty, "--tasks", "heldout"), "no checkpoint")
    one_line_error(run("eval", empty, "--gsm8k-data", tmp_path / "nowhere"), "no checkpoint")  # the run first
    one_line_error(run("export", empty, "--out", tmp_path / "x"), "no checkpoint")
    one_line_error(run("generate", empty, "--prompt", "x"), "no checkpoint")
    one_line_error(run("eval", tmp_path / "missing", "--tasks", "heldout"), "not found")
    one_line_error(run("eval", tiny_runs["ntp"], "--tasks", "humaneval,mmlu"), "unknown eval task 'mmlu'")
    one_line_error(run("eval", tiny_runs["ntp"], "--tasks", "gsm8k", "--gsm8k-data", tmp_path), "train.jsonl")
    one_line_error(run("eval", tiny_runs["ntp"], "--tasks", "heldout", "--text", tmp_path / "nope.txt"), "--text")
    one_line_error(run("eval", tiny_runs["ntp"], "--tasks", "humaneval", "--samples", "4"), "--temperature")
    one_line_error(run("eval", tiny_runs["ntp"], "--harness", "lm-eval"), "give --hf SOURCE")
    one_line_error(run("eval", "--hf", tiny_runs["ntp"], "--harness", "lmeval"), "--harness must be mtp or lm-eval")
    one_line_error(run("eval", tiny_runs["ntp"], "--limit", "gsm8k=all"), "--limit gsm8k=all")

    # a tokenizer that is not the one the checkpoint was trained with
    from mtp_cli.data import tokenizer as toklib

    wrong = tmp_path / "wrong-tokenizer"
    shutil.copytree(tiny_runs["ntp"], wrong, ignore=shutil.ignore_patterns("export", "eval*"))
    shutil.rmtree(wrong / "tokenizer")
    toklib.train_bpe(["completely different text " * 50, "other words here"], 300).save_pretrained(wrong / "tokenizer")
    one_line_error(run("eval", wrong, "--tasks", "heldout"), "tokenizer")
    one_line_error(run("export", wrong, "--out", tmp_path / "y"), "tokenizer")


def test_cli_gsm8k_offline_without_data(tiny_runs, tmp_path):
    """The real entry point, offline (no hub, empty cache), asked for the hub's GSM8K: one line, exit 2."""
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    one_line_error(cli("eval", tiny_runs["ntp"], "--tasks", "gsm8k", "--gsm8k-data", "hub", "--json", tmp_path / "g.json",
                       env=offline), "--gsm8k-data")


def test_eval_and_generate_run_at_bf16(tiny_runs, tmp_path):
    """--dtype bf16: the held-out loss moves by rounding only, the file records the dtype, and `mtp generate`
    decodes the same bf16 weights as the library does."""
    cfg = EvalConfig(tasks=["heldout"], limits={"heldout": 3})
    fp32 = runner.run_eval(tiny_runs["ntp"], cfg, json_path=tmp_path / "f.json", show_progress=False)
    bf16 = runner.run_eval(tiny_runs["ntp"], cfg, Runtime(dtype="bf16"), json_path=tmp_path / "b.json",
                           show_progress=False)
    assert fp32["dtype"] == "fp32" and bf16["dtype"] == "bf16"
    a, b = fp32["results"]["heldout"]["loss"], bf16["results"]["heldout"]["loss"]
    assert a != b and abs(a - b) < 0.05 * a
    proc = cli("generate", tiny_runs["ntp"], "--prompt", "def split(", "--max-new-tokens", "12", "--dtype", "bf16")
    assert proc.returncode == 0, proc.stderr
    run = load_run(tiny_runs["ntp"])
    run.model.to(torch.bfloat16)
    from helpers import generate_texts

    assert proc.stdout == "def split(" + generate_texts(run.model.trunk, run.tokenizer, ["def split("], 12)[0] + "\n"


def test_eval_and_generate_run_at_int8(tiny_runs, tmp_path):
    """--dtype int8: the held-out loss is the int8 model's (not bf16's, not fp32's), within a few percent of
    fp32's, the file records it, and `mtp generate` decodes the same int8 weights as the library does."""
    from mtp_cli.model.weight_format import use_weights

    cfg = EvalConfig(tasks=["heldout"], limits={"heldout": 3})
    runs = {d: runner.run_eval(tiny_runs["ntp"], cfg, Runtime(dtype=d), json_path=tmp_path / f"{d}.json",
                               show_progress=False) for d in ("fp32", "bf16", "int8")}
    assert runs["int8"]["dtype"] == "int8"
    loss = {d: r["results"]["heldout"]["loss"] for d, r in runs.items()}
    assert loss["int8"] not in (loss["fp32"], loss["bf16"]) and abs(loss["int8"] - loss["fp32"]) < 0.05 * loss["fp32"]
    proc = cli("generate", tiny_runs["ntp"], "--prompt", "def split(", "--max-new-tokens", "12", "--dtype", "int8")
    assert proc.returncode == 0, proc.stderr
    run = load_run(tiny_runs["ntp"])
    use_weights(run.model, "int8")
    from helpers import generate_texts

    assert proc.stdout == "def split(" + generate_texts(run.model.trunk, run.tokenizer, ["def split("], 12)[0] + "\n"
