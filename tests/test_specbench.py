"""`mtp specbench`: the report's shape on each kind of run, prompt sets, and bad input (one line, exit 2).
Tiny models and 1-2 repeats keep it fast; no assertion depends on timing."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import cli_in_process
import torch

from mtp_cli.checkpoint import CHECKPOINT, TOKENIZER
from mtp_cli.data import tokenizer as toklib
from mtp_cli.decode.bench import median_ci, run_specbench
from mtp_cli.decode.prompts import GSM8K_ENV, load_prompts
from mtp_cli.errors import UserError

pytestmark = pytest.mark.usefixtures("single_thread")
KEYS = ("lossless", "tokens_per_s", "tokens_per_s_ci", "speedup", "speedup_ci", "latency_s", "ttft_s", "tpot_s",
        "identical_prompts", "mismatches")
SPEC_KEYS = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance", "ideal_speedup",
             "ideal_speedup_ci", "drafted", "accepted", "steps", "t_verify_s", "t_draft_s", "t_prefill_s", "compile_s",
             "t_verify_by_k_s", "verify_over_step_by_k")


mtp = cli_in_process


def test_sequential_report(tiny_runs, tmp_path):
    report = run_specbench(tiny_runs["sequential"], limit=3, max_new_tokens=12, batch_sizes=(1, 2), repeats=2,
                           draft_len=3, draft_run=tiny_runs["ntp"], json_path=tmp_path / "s.json", show_progress=False)
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads(json.dumps(report))
    assert report["draft_len"] == 3 and report["no_mtp_reason"] is None
    assert set(report["results"]) == {"1", "2"}
    assert set(report["results"]["1"]) == {"greedy", "mtp", "hf_generate", "hf_prompt_lookup", "hf_assisted"}
    assert set(report["results"]["2"]) == {"greedy", "mtp", "hf_generate"}
    assert set(report["skipped"]["2"]) == {"hf_prompt_lookup", "hf_assisted"}
    for methods in report["results"].values():
        for e in methods.values():
            assert all(k in e for k in KEYS)
            assert e["tokens_per_s"] > 0 and e["speedup"] > 0
        m = methods["mtp"]
        assert all(k in m for k in SPEC_KEYS)
        assert m["lossless"] and m["identical_prompts"] == 3 and methods["greedy"]["lossless"]
        assert len(m["per_position_acceptance"]) == 3
        assert m["mean_acceptance_length"] == pytest.approx(1 + m["accepted"] / m["steps"])
        assert m["acceptance_rate"] == pytest.approx(m["accepted"] / m["drafted"])
    params = report["params"]
    assert params["mtp_bytes"] == 4 * params["mtp"] and params["draft_bytes"] == 4 * params["draft_params"]
    assert report["summary"]["1"]["mtp_lossless"] is True
    for bs in ("1", "2"):  # the measured parts: verify for k = 1..max(3, draft length), no compile when eager
        m, g = report["results"][bs]["mtp"], report["results"][bs]["greedy"]
        assert list(m["t_verify_by_k_s"]) == ["1", "2", "3"] and all(t > 0 for t in m["t_verify_by_k_s"].values())
        assert g["t_step_s"] > 0 and g["t_prefill_s"] > 0 and g["compile_s"] == m["compile_s"] == 0.0
    assert report["environment"]["compile"] is False
    from rich.console import Console
    from mtp_cli.decode.bench import render_table
    console = Console(width=250, record=True)
    console.print(render_table(report))
    text = " ".join(console.export_text().split())
    assert "bs 2 ms: step" in text and "verify k=1..3" in text


def test_parallel_report(tiny_runs, tmp_path):
    report = run_specbench(tiny_runs["parallel"], limit=2, max_new_tokens=10, repeats=1, json_path=tmp_path / "p.json",
                           show_progress=False)
    m = report["results"]["1"]["mtp"]
    assert report["draft_len"] == 2 and m["lossless"] and len(m["per_position_acceptance"]) == 2


def test_ntp_report_measures_baseline_and_peers_only(tiny_runs, tmp_path):
    run = tmp_path / "ntp"
    shutil.copytree(tiny_runs["ntp"], run)
    report = run_specbench(run, limit=2, max_new_tokens=8, repeats=1, show_progress=False)
    assert (run / "specbench.json").is_file()  # the default place
    assert set(report["results"]["1"]) == {"greedy", "hf_generate", "hf_prompt_lookup"}
    assert "no MTP modules" in report["no_mtp_reason"] and report["draft_len"] is None


def test_cli_prints_a_table_and_writes_json(tiny_runs, tmp_path, capsys):
    code, out, err = mtp("specbench", tiny_runs["sequential"], "--limit", 2, "--max-new-tokens", 8, "--repeats", 1,
                         "--batch-sizes", "1,2", "--json", tmp_path / "r.json", capsys=capsys)
    assert code == 0, err
    assert "mtp" in out and "hf_generate" in out and (tmp_path / "r.json").is_file()


def _bad(tiny_runs, tmp_path):
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_runs["ntp"], other)
    tok = toklib.train_bpe(["completely different text " * 50, "zebra quartz"], 300)
    shutil.rmtree(other / TOKENIZER)
    tok.save_pretrained(other / TOKENIZER)
    state = torch.load(other / CHECKPOINT, weights_only=True)
    state["tokenizer_fingerprint"] = toklib.fingerprint(tok)
    torch.save(state, other / CHECKPOINT)
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"text": "no prompt field"}\n')
    seq = tiny_runs["sequential"]
    return {
        "unknown prompt set": (["--prompts", "mbpp"], "unknown prompt set"),
        "batch size 0": (["--batch-sizes", "1,0"], "batch sizes must be"),
        "batch sizes not numbers": (["--batch-sizes", "one"], "--batch-sizes expects"),
        "draft with another tokenizer": (["--draft", other], "another tokenizer"),
        "gsm8k without data": (["--prompts", "gsm8k"], "--gsm8k-data"),
        "jsonl without prompt": (["--prompts", bad_jsonl], "no string field 'prompt'"),
        "repeats 0": (["--repeats", "0"], "--repeats must be >= 1"),
        "draft len too long for heads": (["--draft-len", "5"], None),
        "no room for the prompt": (["--max-new-tokens", "64"], "leaves no room for a prompt"),
        "missing run": (None, "run folder not found"),
    }, seq


def test_cli_bad_input_is_one_line_and_exit_2(tiny_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(GSM8K_ENV, raising=False)
    cases, seq = _bad(tiny_runs, tmp_path)
    for name, (args, message) in cases.items():
        if name == "draft len too long for heads":
            argv = ["specbench", tiny_runs["parallel"], "--draft-len", "5", "--max-new-tokens", "4"]
            message = "at most 2 tokens"
        elif args is None:
            argv = ["specbench", tmp_path / "nowhere"]
        else:
            argv = ["specbench", seq, "--limit", 1, "--max-new-tokens", 4, "--repeats", 1, "--threads", 1, *args]
        code, out, err = mtp(*argv, capsys=capsys)
        assert code == 2, (name, out, err)
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], (name, err)
    assert not (seq / "specbench.json").exists()


def test_prompt_sets(tmp_path, monkeypatch):
    humaneval = load_prompts("humaneval", 3)
    assert len(humaneval) == 3 and humaneval[0].startswith("from typing import List")
    lines = tmp_path / "p.txt"
    lines.write_text("first prompt\n\nsecond prompt\n")
    assert load_prompts(str(lines)) == ["first prompt", "second prompt"]
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a\\nb"}\n{"prompt": "c"}\n')
    assert load_prompts(str(jl), 1) == ["a\nb"]
    (tmp_path / "gsm").mkdir()
    (tmp_path / "gsm" / "test.jsonl").write_text('{"question": "2+2?", "answer": "4"}\n')
    assert load_prompts("gsm8k", gsm8k_data=tmp_path / "gsm") == ["Question: 2+2?\nAnswer:"]
    monkeypatch.setenv(GSM8K_ENV, str(tmp_path / "gsm"))
    assert load_prompts("gsm8k") == ["Question: 2+2?\nAnswer:"]
    monkeypatch.setenv(GSM8K_ENV, str(tmp_path / "nothing"))
    with pytest.raises(UserError, match="no GSM8K test split"):
        load_prompts("gsm8k")


def test_median_ci():
    med, (lo, hi) = median_ci([3.0, 1.0, 2.0, 5.0, 4.0])
    assert med == 3.0 and 1.0 <= lo <= med <= hi <= 5.0
    assert median_ci([2.0]) == (2.0, [2.0, 2.0])


def test_generate_speculative_prints_the_same_text(tiny_runs, capsys):
    args = ["generate", tiny_runs["sequential"], "--prompt", "def split(s):", "--max-new-tokens", 16]
    code, plain, _ = mtp(*args, capsys=capsys)
    code_spec, spec, err = mtp(*args, "--speculative", "--draft-len", 3, capsys=capsys)
    assert code == code_spec == 0 and plain == spec and "mean acceptance length" in err
    code, _, err = mtp("generate", tiny_runs["ntp"], "--prompt", "x", "--speculative", capsys=capsys)
    assert code == 2 and "no MTP modules" in err
    code, _, err = mtp("generate", tiny_runs["sequential"], "--prompt", "x", "--draft-len", 2, capsys=capsys)
    assert code == 2 and "--draft-len needs --speculative" in err
