"""`mtp specbench`: the report's shape on each kind of run, conditions (prompt sources × temperatures),
prompt sets (heldout: the validation split only), and bad input (one line, exit 2). Tiny models and
1-2 repeats keep it fast; no assertion depends on timing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import REPO, cli_in_process

from mtp_cli.base.errors import UserError
from mtp_cli.base.stats import median_ci, ratio_ci
from mtp_cli.bench.render import render_table
from mtp_cli.bench.run import run_specbench
from mtp_cli.config.recipe import Runtime, SpecbenchConfig
from mtp_cli.data import shards
from mtp_cli.data import tokenizer as toklib
from mtp_cli.data.prompts import GSM8K_ENV, cut_windows, heldout_prompts, load_prompts
from mtp_cli.model.checkpoint import CHECKPOINT, TOKENIZER, load_run

pytestmark = pytest.mark.usefixtures("single_thread")
LLAMACPP = ("llamacpp_greedy", "llamacpp_prompt_lookup")
KEYS = ("lossless", "tokens_per_s", "tokens_per_s_ci95", "speedup", "speedup_ci95", "tpot_speedup", "tpot_speedup_ci95",
        "latency_s", "ttft_s", "tpot_s", "identical_prompts", "mismatches")
SPEC_KEYS = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance", "ideal_speedup",
             "ideal_speedup_ci95", "drafted", "accepted", "steps", "t_verify_s", "t_draft_s", "t_prefill_s", "compile_s",
             "t_verify_by_k_s", "verify_over_step_by_k")


mtp = cli_in_process


def only(report: dict) -> dict:
    """The one condition of a single-condition report."""
    (condition,) = report["conditions"]
    return condition


def test_sequential_report(tiny_runs, tmp_path):
    cfg = SpecbenchConfig(limit=3, max_new_tokens=12, batch_sizes=[1, 2], repeats=2, draft_len=3)
    report = run_specbench(tiny_runs["sequential"], cfg, draft_run=tiny_runs["ntp"], json_path=tmp_path / "s.json",
                           show_progress=False)
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads(json.dumps(report))
    assert report["draft_len"] == 3 and report["no_mtp_reason"] is None
    assert report["schema"] == 3 and report["primary"] == "humaneval-greedy"
    cond = only(report)
    assert cond["name"] == "humaneval-greedy" and cond["temperature"] == 0 and cond["prompts"]["count"] == 3
    assert set(cond["results"]) == {"1", "2"}
    assert set(cond["results"]["1"]) == {"greedy", "aa_control", "mtp", "hf_generate", "hf_prompt_lookup", "hf_assisted"}
    assert set(cond["results"]["2"]) == {"greedy", "aa_control", "mtp", "hf_generate"}
    assert set(cond["skipped"]["2"]) == {"hf_prompt_lookup", "hf_assisted", "hf_mtp", *LLAMACPP}
    assert "does not start from a GGUF file" in cond["skipped"]["1"]["llamacpp_greedy"]
    assert "this run has 2" in cond["skipped"]["1"]["hf_mtp"]  # transformers' MTP layer cannot chain ours
    for methods in cond["results"].values():
        for e in methods.values():
            assert all(k in e for k in KEYS)
            assert e["tokens_per_s"] > 0 and e["speedup"] > 0
            for key in ("speedup", "tpot_speedup"):  # the crossed prompt × repeat interval holds its point
                lo, hi = e[f"{key}_ci95"]
                assert lo <= e[key] <= hi
        assert methods["greedy"]["speedup"] == 1.0 and methods["greedy"]["speedup_ci95"] == [1.0, 1.0]
        aa = methods["aa_control"]  # the baseline's decoder again: same text, a speed-up whose interval holds 1
        assert aa["lossless"] and aa["speedup"] != 1.0
        m = methods["mtp"]
        assert all(k in m for k in SPEC_KEYS)
        assert m["lossless"] and m["identical_prompts"] == 3 and methods["greedy"]["lossless"]
        assert len(m["per_position_acceptance"]) == 3
        assert m["mean_acceptance_length"] == pytest.approx(1 + m["accepted"] / m["steps"])
        assert m["acceptance_rate"] == pytest.approx(m["accepted"] / m["drafted"])
    params = report["params"]
    assert params["mtp_bytes"] == 4 * params["mtp"] and params["draft_bytes"] == 4 * params["draft_params"]
    assert cond["summary"]["1"]["mtp_lossless"] is True
    for bs in ("1", "2"):  # the measured parts: verify for k = 1..max(4, draft length), no compile when eager
        m, g = cond["results"][bs]["mtp"], cond["results"][bs]["greedy"]
        assert g["step_over_floor"] == pytest.approx(g["t_step_s"] / report["weight_floor"]["floor_s"])
        assert list(m["t_verify_by_k_s"]) == ["1", "2", "3", "4"] and all(t > 0 for t in m["t_verify_by_k_s"].values())
        assert g["t_step_s"] > 0 and g["t_prefill_s"] > 0 and g["compile_s"] == m["compile_s"] == 0.0
        assert m["fused"] is False and m["t_verify_draft_s"] == pytest.approx(m["t_verify_s"] + m["t_draft_s"])
        # the ideal from the forward parts timed side by side: the step and verifying k = 3 drafts, plus drafting
        ideal = m["mean_acceptance_length"] * m["t_forward_step_s"] / (m["t_verify_by_k_s"]["3"] + m["t_draft_s"])
        assert m["ideal_speedup"] == pytest.approx(ideal) and m["speedup_over_ideal"] == pytest.approx(m["speedup"] / ideal)
        # the loops' cost beyond their forwards: decode time per token (per speculative step) over the parts alone
        assert g["loop_over_forward"] == pytest.approx(g["tpot_s"] / m["t_forward_step_s"])
        assert m["loop_over_parts"] == pytest.approx((m["t_verify_draft_s"] + m["t_other_s"])
                                                     / (m["t_verify_by_k_s"]["3"] + m["t_draft_s"]))
    assert report["environment"]["compile"] is False
    assert report["environment"]["compile_why"].startswith("default on CPU")  # too few tokens planned to pay
    assert re.fullmatch(r"[0-9a-f]{40}", report["git_commit"])  # the report credits the code that measured it
    from rich.console import Console

    from mtp_cli.bench.render import render_table
    console = Console(width=250, record=True)
    console.print(render_table(report))
    text = " ".join(console.export_text().split())
    assert "bs 2 ms: step" in text and "verify k=1..4" in text and "weight-streaming floor" in text
    floor = report["weight_floor"]  # a tied embedding is read whole by the unembedding: every parameter counts
    assert floor["weight_bytes"] == 4 * params["trunk"] and floor["read_bytes_per_s"] > 0
    assert report["draft_len_selection"] is None


def test_draft_length_is_chosen_on_prompts_it_does_not_time(tiny_runs, tmp_path):
    cfg = SpecbenchConfig(limit=3, max_new_tokens=8, repeats=1, draft_lens=[1, 3, 2], peers="primary")
    report = run_specbench(tiny_runs["sequential"], cfg, json_path=tmp_path / "s.json", show_progress=False)
    sel = report["draft_len_selection"]
    assert sel["candidates"] == [1, 3, 2] and set(sel["by_k"]) == {"1", "2", "3"} and sel["prompts"] == 8
    assert "over_shorter_ci95" not in sel["by_k"]["1"] and len(sel["by_k"]["3"]["over_shorter_ci95"]) == 2
    assert report["draft_len"] == sel["chosen"] and only(report)["results"]["1"]["mtp"]["lossless"]
    for k, row in sel["by_k"].items():
        assert len(row["acceptance_at"]) == int(k) and row["speedup"] > 0
    from mtp_cli.bench.draft_select import tuning_prompts
    everything = [[i] for i in range(20)]
    assert tuning_prompts(everything, everything[:4], 4) == [[4], [8], [12], [16]]
    for bad, needle in ((dict(draft_lens=[0]), "integers >= 1"), (dict(draft_lens=[2], draft_len=2), "not both"),
                        (dict(draft_lens=[2], limit=0), "limit")):
        with pytest.raises(UserError, match=needle):
            SpecbenchConfig(**bad).validate()


def test_tree_width_is_chosen_on_untimed_prompts_and_timed_where_the_fused_loop_runs(tiny_runs, tmp_path):
    """`draft_widths` at k = 1: every width timed on the tuning prompts, the chosen one recorded and run by
    the MTP row at batch size 1 greedy (lossless); skipped, with its reason, when draft_lens chose k > 1."""
    cfg = SpecbenchConfig(limit=3, max_new_tokens=8, repeats=1, draft_len=1, draft_widths=[1, 3], peers="primary")
    report = run_specbench(tiny_runs["sequential"], cfg, json_path=tmp_path / "s.json", show_progress=False)
    sel = report["draft_width_selection"]
    assert sel["candidates"] == [1, 3] and set(sel["by_width"]) == {"1", "3"} and sel["temperature"] == 0
    assert report["draft_width"] == sel["chosen"] and report["draft_len"] == 1
    mtp = only(report)["results"]["1"]["mtp"]
    assert mtp["lossless"] and mtp["draft_width"] == sel["chosen"] and mtp["t_forward_verify_draft_s"] > 0
    skipped = run_specbench(tiny_runs["sequential"], SpecbenchConfig(limit=3, max_new_tokens=8, repeats=1,
                                                                     draft_lens=[2], draft_widths=[1, 2],
                                                                     peers="primary"),
                            json_path=tmp_path / "t.json", show_progress=False)
    assert skipped["draft_width_selection"]["chosen"] == 1 and "k = 2" in skipped["draft_width_selection"]["skipped"]
    assert only(skipped)["results"]["1"]["mtp"]["draft_width"] == 1
    for bad, needle in ((dict(draft_width=0), "integer >= 1"), (dict(draft_width=2, draft_widths=[2]), "not both"),
                        (dict(draft_widths=[2], limit=0), "limit"), (dict(draft_width=2, draft_len=3), "draft_len 1"),
                        (dict(draft_widths=[0]), "integers >= 1"), (dict(draft_width=2, draft_lens=[1, 2]), "draft_widths"),
                        (dict(draft_lens=[1, 2, 3, 4], draft_widths=[1, 2, 3]), "at most 6")):
        with pytest.raises(UserError, match=needle):
            SpecbenchConfig(**bad).validate()


def test_a_longer_draft_is_chosen_only_where_it_is_faster_beyond_the_noise():
    """8 prompts, one pass each: k = 2 4% faster on average but within the prompt-to-prompt noise stays
    k = 1; k = 3 faster on every prompt replaces it; the comparison is with the current choice."""
    from mtp_cli.bench.draft_select import pick_draft_len
    from mtp_cli.bench.runners import Tally

    def tally(speeds: list[float]) -> Tally:  # tokens/s on each of 8 prompts of 32 tokens
        return Tally(walls=[32 / v for v in speeds], outputs=[[0] * 32] * len(speeds), tokens=32 * len(speeds))

    base = [30.0, 24.0, 33.0, 28.0, 35.0, 26.0, 31.0, 29.0]
    wobble = [1.25, 0.85, 1.2, 0.9, 1.1, 0.95, 1.0, 1.07]  # 4% faster on the whole, not on every prompt
    runs = {1: tally(base), 2: tally([v * w for v, w in zip(base, wobble)]), 3: tally([v * 0.8 for v in base])}
    chosen, over = pick_draft_len([3, 2, 1], runs)
    assert chosen == 1 and set(over) == {2, 3} and over[2][0] < 1 < over[2][1] and over[3][1] < 1
    runs[3] = tally([v * 1.1 for v in base])  # 10% faster on every prompt
    assert pick_draft_len([1, 2, 3], runs)[0] == 3


def test_parallel_report(tiny_runs, tmp_path):
    report = run_specbench(tiny_runs["parallel"], SpecbenchConfig(limit=2, max_new_tokens=10, repeats=1),
                           json_path=tmp_path / "p.json", show_progress=False)
    m = only(report)["results"]["1"]["mtp"]
    assert report["draft_len"] == 2 and m["lossless"] and len(m["per_position_acceptance"]) == 2
    # one row, greedy: verification and drafting ran as one call, timed in the loop and alone
    assert m["fused"] is True and m["t_verify_s"] is None and m["t_verify_draft_s"] > 0
    assert m["t_draft_s"] == pytest.approx(m["t_forward_verify_draft_s"] - m["t_verify_by_k_s"]["2"])
    assert m["ideal_speedup"] == pytest.approx(m["mean_acceptance_length"] * m["t_forward_step_s"]
                                               / m["t_forward_verify_draft_s"])


def test_ntp_report_measures_baseline_and_peers_only(tiny_runs, tmp_path):
    run = tmp_path / "ntp"
    shutil.copytree(tiny_runs["ntp"], run)
    report = run_specbench(run, SpecbenchConfig(limit=2, max_new_tokens=8, repeats=1), show_progress=False)
    assert (run / "specbench.json").is_file()  # the default place
    assert set(only(report)["results"]["1"]) == {"greedy", "aa_control", "hf_generate", "hf_prompt_lookup"}
    assert "no MTP modules" in report["no_mtp_reason"] and report["draft_len"] is None


def test_cli_prints_a_table_and_writes_json(tiny_runs, tmp_path, capsys):
    code, out, err = mtp("specbench", tiny_runs["sequential"], "--limit", 2, "--max-new-tokens", 8, "--repeats", 1,
                         "--batch-sizes", "1,2", "--temperatures", "0,0.8", "--primary", "humaneval-t0.8",
                         "--json", tmp_path / "r.json", capsys=capsys)
    assert code == 0, err
    assert "mtp" in out and "hf_generate" in out and "(primary)" in out and "repetition" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["primary"] == "humaneval-t0.8" and [c["name"] for c in report["conditions"]] == [
        "humaneval-greedy", "humaneval-t0.8"]


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
        "unknown prompt set among several": (["--prompts", "humaneval,mbpp"], "unknown prompt set"),
        "negative temperature": (["--temperatures", "0,-1"], "temperatures must be finite numbers >= 0"),
        "temperature not a number": (["--temperatures", "hot"], "--temperatures expects"),
        "primary not measured": (["--primary", "heldout-greedy"], "primary condition 'heldout-greedy' is not measured"),
        "batch size 0": (["--batch-sizes", "1,0"], "(--batch-sizes) must be"),
        "batch sizes not numbers": (["--batch-sizes", "one"], "--batch-sizes expects"),
        "draft with another tokenizer": (["--draft", other], "another tokenizer"),
        "gsm8k without data": (["--prompts", "gsm8k", "--gsm8k-data", tmp_path / "no-gsm8k"], "no GSM8K test split"),
        "gsm8k prompts from the hub": (["--prompts", "gsm8k", "--gsm8k-data", "hub"], "not the hub"),
        "jsonl without prompt": (["--prompts", bad_jsonl], "no string field 'prompt'"),
        "repeats 0": (["--repeats", "0"], "(--repeats) must be >= 1"),
        "unknown peers scope": (["--peers", "some"], "(--peers) must be one of"),
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
    code, _, err = mtp("generate", tiny_runs["sequential"], "--prompt", "x", "--draft-vocab", 64, capsys=capsys)
    assert code == 2 and "--draft-vocab needs --speculative" in err
    code, _, err = mtp("generate", tiny_runs["sequential"], "--prompt", "x", "--speculative", "--draft-vocab", -1,
                       capsys=capsys)
    assert code == 2 and "--draft-vocab must be >= 0" in err
    code, same, _ = mtp(*args, "--speculative", "--draft-vocab", 64, capsys=capsys)
    assert code == 0 and same == plain


# ---- schema 2: conditions, heldout prompts, the text timed, acceptance per prompt ------------------
def _contains(tokens: np.ndarray, window: list[int]) -> bool:
    if len(tokens) < len(window):
        return False
    view = np.lib.stride_tricks.sliding_window_view(np.asarray(tokens, dtype=np.int64), len(window))
    return bool((view == np.asarray(window)).all(1).any())


def test_heldout_prompts_come_from_validation_documents_only(tiny_runs):
    run = load_run(tiny_runs["sequential"])
    data = shards.prepare(run.recipe.data, run.recipe.model.vocab_size)
    eos = run.tokenizer.eos_token_id
    prompts, origin = heldout_prompts(run, 5, 20)
    assert len(prompts) == 5 and all(len(p) == 20 for p in prompts) and "validation split" in origin
    assert len({tuple(p) for p in prompts}) == 5 and all(eos not in p for p in prompts)  # distinct, inside a document
    for p in prompts:
        assert _contains(data.val, p) and not _contains(data.train, p)
    assert heldout_prompts(run, 5, 20)[0] == prompts  # deterministic
    every = heldout_prompts(run, None, 20)[0]
    assert len(every) > 5 and all(p in every for p in prompts)


def test_cut_windows_spreads_over_documents():
    eos = 0
    tokens = np.array([1, 2, 3, 4, 5, 0, 6, 7, 0, 8, 9, 10, 11, 0, 12, 13, 14])  # the last document has no EOS
    assert cut_windows(tokens, eos, 2, None) == [[1, 2], [3, 4], [6, 7], [8, 9], [10, 11], [12, 13]]
    assert cut_windows(tokens, eos, 2, 3) == [[1, 2], [6, 7], [10, 11]]  # windows 0, 2, 4 of 6
    assert cut_windows(tokens, eos, 4, None) == [[1, 2, 3, 4], [8, 9, 10, 11]]
    with pytest.raises(UserError, match="no document of 6 tokens"):
        cut_windows(tokens, eos, 6, None)


def test_conditions_report(tiny_runs, tmp_path):
    cfg = SpecbenchConfig(prompts="heldout", temperatures=[0, 0.8], limit=4, max_new_tokens=12, batch_sizes=[1, 2],
                          repeats=1)
    report = run_specbench(tiny_runs["sequential"], cfg, draft_run=tiny_runs["ntp"], json_path=tmp_path / "c.json",
                           show_progress=False)
    assert json.loads((tmp_path / "c.json").read_text()) == json.loads(json.dumps(report))
    assert report["schema"] == 3 and report["primary"] == "heldout-greedy" and "results" not in report
    vocab = report["draft_vocab"]  # the default: a quarter of the vocabulary, the most frequent training tokens
    assert vocab["size"] == vocab["vocab_size"] // 4 and 0.25 < vocab["training_share"] < 1
    greedy, sampled = report["conditions"]
    assert [greedy["name"], sampled["name"]] == ["heldout-greedy", "heldout-t0.8"]
    assert greedy["temperature"] == 0 and sampled["temperature"] == 0.8
    assert greedy["prompts"]["source"] == "heldout" and greedy["prompts"]["count"] == 4
    assert greedy["prompts"]["mean_tokens"] == 64 - 12  # the room the context leaves (< 128)

    g1 = greedy["results"]["1"]
    assert set(g1) == {"greedy", "aa_control", "mtp", "hf_generate", "hf_prompt_lookup", "hf_assisted"}
    assert all(e["lossless"] for e in g1.values()) and greedy["summary"]["1"]["mtp_lossless"] is True

    s1 = sampled["results"]["1"]
    assert set(s1) == set(sampled["results"]["2"]) == {"sample", "aa_control", "mtp", "hf_generate"}
    assert set(sampled["skipped"]["1"]) == {"hf_prompt_lookup", "hf_assisted", "hf_mtp", *LLAMACPP}
    assert s1["mtp"]["lossless"] is None and s1["mtp"]["label"] == "ours, MTP speculative sampling"
    assert all(e["tokens"] > 0 for e in s1.values())

    for cond in (greedy, sampled):
        text = cond["text"]
        assert text["n_outputs"] == 4 and 0 <= text["degenerate_share"] <= 1 and 0 <= text["whitespace_share"] <= 1
        assert text["degenerate_share"] == cond["results"]["1"][cond["baseline"]]["degenerate_share"]
        for bs, methods in cond["results"].items():
            for e in methods.values():
                assert 0 <= e["degenerate_share"] <= 1 and 0 <= e["whitespace_share"] <= 1
            m = methods["mtp"]
            units = m["per_prompt"] if bs == "1" else m["per_batch"]
            assert len(units) == (4 if bs == "1" else 2)
            for key in ("accepted", "drafted", "steps"):
                assert sum(u[key] for u in units) == m[key]
            per_position = [sum(u["accepted_at"][i] for u in units) / m["steps"] for i in range(m["draft_len"])]
            assert per_position == pytest.approx(m["per_position_acceptance"])  # the per-unit counts add up
            lo, hi = m["acceptance_rate_ci95"]
            assert lo <= m["acceptance_rate"] <= hi
    # greedy text is the same at either batch size, so its statistics are too
    assert greedy["results"]["2"]["greedy"]["degenerate_share"] == greedy["text"]["degenerate_share"]

    table = render_table(report)
    from rich.console import Console
    console = Console(width=250, record=True)
    console.print(table)
    out = console.export_text()
    assert "heldout-greedy (primary)" in out and "heldout-t0.8" in out and "degen" in out


def test_ratio_ci():
    lo, hi = ratio_ci([1, 2, 3, 4], [4, 4, 4, 4])
    assert lo <= 10 / 16 <= hi and 0.25 <= lo < hi <= 1.0
    assert ratio_ci([3, 3], [4, 4]) == [0.75, 0.75]
    assert ratio_ci([0], [0]) == [None, None]


def test_results_read_one_schema_and_the_migration_rewrites_the_old_one(tiny_runs, tmp_path):
    from mtp_cli.results import folder as results

    old = tmp_path / "schema1"  # a specbench.json as the first committed results wrote it: refused, with the way out
    old.mkdir()
    shutil.copy(REPO / "tests" / "data" / "specbench_schema1.json", old / "specbench.json")
    with pytest.raises(UserError, match="schema 1, this mtp reads schema 3; rewrite it"):
        results.RunFolder(old).spec  # noqa: B018

    run = tmp_path / "seq"
    shutil.copytree(tiny_runs["sequential"], run)
    cfg = SpecbenchConfig(prompts="humaneval,heldout", limit=2, max_new_tokens=8, repeats=1, primary="heldout-greedy",
                          peers="primary")
    report = run_specbench(run, cfg, show_progress=False)
    folder = results.RunFolder(run)
    primary = results.spec_condition(folder.spec)
    assert primary["name"] == "heldout-greedy" and report["conditions"][1] == primary
    for key in ("acceptance_rate", "speedup", "degenerate_share"):
        assert results.spec_value(1, results.MTP_METHOD, key)(folder) == primary["results"]["1"]["mtp"][key]
    humaneval = results.spec_condition(folder.spec, "humaneval-greedy")
    assert humaneval["prompts"]["source"] == "humaneval" and results.spec_condition(folder.spec, "nope") == {}
    # --peers primary: the Hugging Face peers are timed in the primary condition only, and say so elsewhere
    assert {"hf_generate", "hf_prompt_lookup"} <= set(primary["results"]["1"])
    assert set(humaneval["results"]["1"]) == {"greedy", "aa_control", "mtp"}
    assert "primary condition only" in humaneval["skipped"]["1"]["hf_generate"]
    # --peers none: no peer anywhere, each left out with its reason; the MTP row is measured as before
    bare = run_specbench(run, SpecbenchConfig(prompts="humaneval", limit=2, max_new_tokens=8, repeats=1, peers="none"),
                         json_path=tmp_path / "bare.json", show_progress=False)
    row = bare["conditions"][0]
    assert set(row["results"]["1"]) == {"greedy", "aa_control", "mtp"} and row["results"]["1"]["mtp"]["lossless"]
    assert set(row["skipped"]["1"]) == {"hf_generate", "hf_prompt_lookup", "hf_mtp", *LLAMACPP}
    assert all("--peers none" in why for why in row["skipped"]["1"].values())
    # schema 2 spelled intervals `_ci`: the migration renames them and changes nothing else
    v2 = tmp_path / "v2.json"

    def spelled_v2(value):
        if isinstance(value, dict):
            return {k.removesuffix("95") if k.endswith("_ci95") else k: spelled_v2(v) for k, v in value.items()}
        return [spelled_v2(v) for v in value] if isinstance(value, list) else value

    stored = json.loads((run / "specbench.json").read_text())
    v2.write_text(json.dumps(spelled_v2(stored) | {"schema": 2}))
    assert any(k.endswith("_ci") for k in spelled_v2(primary["results"]["1"]["mtp"]))
    proc = subprocess.run([sys.executable, REPO / "scripts" / "migrate_specbench_v3.py", v2], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(v2.read_text()) == stored


def test_recipe_specbench_section():
    from mtp_cli.config.recipe import SpecbenchConfig, from_dict, load_recipe

    quick = load_recipe("quick").specbench
    assert quick.primary == "heldout-greedy" and quick.limit >= 32 and "heldout" in quick.prompts
    assert any(t > 0 for t in quick.temperatures)
    section = {"prompts": ["heldout", "humaneval"], "temperatures": [0, 0.8], "primary": "humaneval-t0.8"}
    from_dict(SpecbenchConfig, section).validate()
    with pytest.raises(UserError, match="primary condition 'heldout-t1' is not measured"):
        from_dict(SpecbenchConfig, section | {"primary": "heldout-t1"}).validate()
    with pytest.raises(UserError, match="temperatures must be"):
        from_dict(SpecbenchConfig, section | {"temperatures": [-0.5]}).validate()


def test_each_benchmark_compiles_afresh_and_never_times_eager_code_as_compiled(tiny_runs, tmp_path, monkeypatch):
    """Every engine's compiled step shares one code object, whose cache dynamo caps (`recompile_limit`): past
    it a call runs eager without a word. With the cap at 1, the second of two benchmarks in one process
    (as `mtp ablate` runs them) still compiles its decoder (a fresh cache); one that needs more graphs
    than the cap allows stops with an error instead of timing eager code."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    cfg, rt = SpecbenchConfig(limit=1, max_new_tokens=6, repeats=1), Runtime(compile=True)
    for name in ("first", "second"):
        report = run_specbench(tiny_runs["ntp"], cfg, rt, json_path=tmp_path / f"{name}.json", show_progress=False)
        assert only(report)["results"]["1"]["greedy"]["compile_s"] > 0, name  # 0: no graph was built, it ran eager
    with pytest.raises(RuntimeError, match="recompile limit"):  # its greedy and MTP engines: two graphs
        run_specbench(tiny_runs["sequential"], cfg, rt, json_path=tmp_path / "mtp.json", show_progress=False)
    assert not (tmp_path / "mtp.json").exists()


def test_transformers_mtp_decoding_is_a_peer_with_the_runs_own_module(tmp_path):
    """A D=1 run: `hf_mtp` (generate(use_mtp=True) on the run exported --with-mtp) is timed at batch size 1,
    lossless like every method, and left out at 2 (transformers' assisted decoding takes one row)."""
    from helpers import tiny_recipe

    from mtp_cli.train.loop import train

    train(tiny_recipe("sequential", steps=4, depth=1, lambda_=0.3), tmp_path / "d1", show_progress=False)
    cfg = SpecbenchConfig(prompts="heldout", limit=2, max_new_tokens=8, batch_sizes=[1, 2], repeats=1)
    report = run_specbench(tmp_path / "d1", cfg, json_path=tmp_path / "s.json", show_progress=False)
    cond = only(report)
    row = cond["results"]["1"]["hf_mtp"]
    assert row["lossless"] is True and row["label"].startswith("HF MTP") and row["tokens"] > 0
    assert "hf_mtp" in cond["skipped"]["2"] and "hf_mtp" not in cond["results"]["2"]
    assert report["peers"]["hf_mtp"] == {"num_mtp_layers": 1, "differences": []}


def test_the_raw_data_recomputes_every_speedup_and_lossless_verdict(tiny_runs, tmp_path):
    """specbench_raw.jsonl keeps each timed call's seconds, tokens and token ids; `--recheck` gives back the
    stored figures from it (exit 0). Controls: one raw wall time doubled, or one output token changed, is
    caught (exit 1, the figure named)."""
    from helpers import run_cli

    from mtp_cli.bench.raw import raw_path, recheck

    cfg = SpecbenchConfig(prompts="heldout", temperatures=[0, 0.8], limit=2, max_new_tokens=8, batch_sizes=[1, 2],
                          repeats=2, peers="none")
    path = tmp_path / "specbench.json"
    run_specbench(tiny_runs["sequential"], cfg, json_path=path, show_progress=False)
    rows = [json.loads(line) for line in raw_path(path).read_text().splitlines()]
    assert {(r["condition"], r["batch_size"], r["method"]) for r in rows} >= {("heldout-greedy", 1, "mtp"),
                                                                             ("heldout-t0.8", 2, "sample")}
    assert all(len(r["seconds"]) == len(r["tokens"]) and sum(r["tokens"]) == sum(map(len, r["outputs"])) for r in rows)
    assert recheck(path) == []
    done = run_cli("specbench", tiny_runs["sequential"], "--recheck", "--json", path)
    assert done.returncode == 0 and "recomputed" in done.stdout
    original = raw_path(path).read_text()
    for tamper, expect in (("seconds", "tokens_per_s"), ("outputs", "lossless")):
        changed = [dict(r) for r in rows]
        row = next(r for r in changed if r["condition"] == "heldout-greedy" and r["method"] == "mtp"
                   and r["batch_size"] == 1 and r["repeat"] == 0)
        if tamper == "seconds":
            row["seconds"] = [2 * s for s in row["seconds"]]
        else:
            row["outputs"] = [[(o[0] + 1) % 512, *o[1:]] for o in row["outputs"]]
        raw_path(path).write_text("".join(json.dumps(r) + "\n" for r in changed))
        problems = recheck(path)
        assert any(expect in p and "heldout-greedy bs 1 mtp" in p for p in problems), problems
        done = run_cli("specbench", tiny_runs["sequential"], "--recheck", "--json", path)
        assert done.returncode == 1 and "mismatch:" in done.stdout
        raw_path(path).write_text(original)


def test_methods_take_turns_prompt_by_prompt_in_a_rotating_order():
    """Each repeat runs every method on a prompt before the next prompt, the order rotated by prompt and repeat,
    so a slow spell of a shared machine lands on every method for the same prompt."""
    from mtp_cli.bench.measure import measure

    calls = []

    def runner(name):
        def run(batch, tally):
            calls.append((name, batch[0][0]))
            return [[1, 2, 3]], 0.0
        return run

    tallies = measure({m: runner(m) for m in "abc"}, [[0], [1], [2], [3]], 1, 2, "cpu", lambda m: None)
    timed = calls[3:]  # after one warm-up call each
    assert [p for _, p in timed] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3] * 2
    firsts = [timed[i][0] for i in range(0, len(timed), 3)]
    assert firsts == ["a", "b", "c", "a", "b", "c", "a", "b"]
    assert all(len(t) == 2 and all(len(r.walls) == 4 and r.tokens == 12 for r in t) for t in tallies.values())


def test_bf16_weights_decode_losslessly_against_greedy_at_the_same_dtype(tiny_runs, tmp_path):
    """--dtype bf16: every method (ours and the HF peer) decodes bf16 weights; MTP's output equals plain greedy's
    at that dtype, token for token; the file says which dtype it timed."""
    cfg = SpecbenchConfig(limit=3, max_new_tokens=10, repeats=1, draft_len=2)
    report = run_specbench(tiny_runs["sequential"], cfg, Runtime(dtype="bf16"), json_path=tmp_path / "s.json",
                           show_progress=False)
    assert report["environment"]["dtype"] == "bfloat16"
    methods = only(report)["results"]["1"]
    assert methods["mtp"]["lossless"] and methods["aa_control"]["lossless"]
    fp32 = run_specbench(tiny_runs["sequential"], cfg, json_path=tmp_path / "f.json", show_progress=False)
    assert fp32["environment"]["dtype"] == "float32"
    assert report["weight_floor"]["weight_bytes"] * 2 == fp32["weight_floor"]["weight_bytes"]
    with pytest.raises(UserError, match="unknown dtype"):
        run_specbench(tiny_runs["sequential"], cfg, Runtime(dtype="int4"), json_path=tmp_path / "x.json",
                      show_progress=False)


def test_int8_weights_decode_losslessly_and_count_a_byte_per_quantized_weight(tiny_runs, tmp_path):
    """--dtype int8: MTP's output equals plain greedy's at int8 token for token, the HF peer decodes the same
    (dequantized) weights, and the weight floor reads a byte per quantized weight plus its scales (fewer bytes
    than bf16's, more than half of them: the embedding and norms stay bf16)."""
    cfg = SpecbenchConfig(limit=3, max_new_tokens=10, repeats=1, draft_len=2)
    report = run_specbench(tiny_runs["sequential"], cfg, Runtime(dtype="int8"), json_path=tmp_path / "i.json",
                           show_progress=False)
    assert report["environment"]["dtype"] == "int8"
    methods = only(report)["results"]["1"]
    assert methods["mtp"]["lossless"] and methods["aa_control"]["lossless"]
    bf16 = run_specbench(tiny_runs["sequential"], cfg, Runtime(dtype="bf16"), json_path=tmp_path / "b.json",
                         show_progress=False)
    int8_bytes, bf16_bytes = report["weight_floor"]["weight_bytes"], bf16["weight_floor"]["weight_bytes"]
    assert bf16_bytes / 2 < int8_bytes < bf16_bytes


def test_cpu_compiles_by_default_only_where_it_pays():
    """CUDA always compiles; CPU compiles when the tokens a benchmark plans pass the break-even's threshold,
    and an explicit --compile/--no-compile wins either way."""
    from mtp_cli.bench.run import _compile_choice, planned_tokens
    from mtp_cli.config.recipe import SpecbenchConfig
    from mtp_cli.decode.engine import CPU_COMPILE_PAYS_AT, default_compile

    assert default_compile("cuda") and not default_compile("cpu")
    assert default_compile("cpu", CPU_COMPILE_PAYS_AT) and not default_compile("cpu", CPU_COMPILE_PAYS_AT - 1)
    small = SpecbenchConfig(prompts="humaneval", limit=4, max_new_tokens=16, repeats=1)
    assert planned_tokens(small, 1) == 2 * 4 * 16 * 2  # greedy and MTP, warm-up and one repeat
    assert planned_tokens(SpecbenchConfig(prompts="humaneval", limit=0), 1) >= 2 * 164 * 128
    assert _compile_choice(None, "cpu", planned_tokens(small, 1))[0] is False
    big = planned_tokens(SpecbenchConfig(prompts="humaneval", limit=20, max_new_tokens=128, repeats=5), 1)
    compile, why = _compile_choice(None, "cpu", big)
    assert compile and f"{big:,} planned tokens" in why
    assert _compile_choice(False, "cpu", big) == (False, "--no-compile")
    assert _compile_choice(True, "cpu", 1) == (True, "--compile")
    assert _compile_choice(None, "cuda", 1) == (True, "default on CUDA")


def test_llamacpp_probe_reports_a_failing_engine_in_one_line(tmp_path):
    """specbench probes llama.cpp in a child process before timing it (a build for instructions this kernel
    does not enable dies of SIGILL, which would end the benchmark): a file it cannot decode gives one line
    of reason, whether llama-cpp-python is installed (it cannot load the file) or not (the import fails)."""
    from mtp_cli.bench.llamacpp import probe

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    why = probe(bad)
    assert why is not None and why.startswith("llama.cpp failed a one-token probe") and "\n" not in why
