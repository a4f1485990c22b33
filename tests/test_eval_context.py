"""Evals stay inside the trained context (cut by lm-eval's rule and counted, or refused), gold-answer
bits per byte match a direct `transformers` computation, GSM8K gold requests are lm-eval's own, and
the per-item files add up to the reported figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import cli_in_process

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import EvalConfig
from mtp_cli.decode import context as ctxlib
from mtp_cli.decode.batching import encode, generate_ids
from mtp_cli.evals import gsm8k, humaneval, runner
from mtp_cli.model import hf
from mtp_cli.model.checkpoint import load_run

pytestmark = pytest.mark.usefixtures("single_thread")

GSM8K_DATA = Path(__file__).resolve().parent / "data" / "gsm8k"
needs_data = pytest.mark.skipif(not (GSM8K_DATA / "test.jsonl").is_file(), reason=f"no GSM8K data at {GSM8K_DATA}")


def test_prompts_longer_than_the_context_are_cut_and_counted(tiny_runs, tmp_path):
    """Trained at context 64, HumanEval prompts (100+ tokens) keep their rightmost 64 - 16 tokens."""
    run = load_run(tiny_runs["ntp"])
    trunk, tok = run.model.trunk, run.tokenizer
    assert trunk.cfg.context == 64
    result = humaneval.run(trunk, tok, tmp_path / "s.jsonl", limit=2, max_new_tokens=16)
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    problems = humaneval.load_problems(2)
    lengths = [len(encode(tok, p["prompt"])) for p in problems.values()]
    assert all(n > 64 for n in lengths)
    assert [r["prompt_tokens"] for r in rows] == lengths
    assert [r["prompt_cut_tokens"] for r in rows] == [n - (64 - 16) for n in lengths]
    assert result["context"] == 64 and result["prompts_cut"] == 2 == result["prompts_over_context"]
    assert result["prompt_cut_tokens_max"] == max(lengths) - 48
    assert result["prompt_cut_tokens_mean"] == pytest.approx(sum(lengths) / 2 - 48)
    # the completion is what the decoder gives for the cut prompt (HFLM's rule), not for the whole one
    first = encode(tok, problems["HumanEval/0"]["prompt"])
    (ids,) = generate_ids(trunk, tok, [first[-48:]], 16, stops=humaneval.STOP_SEQUENCES)
    assert rows[0]["completion"] == humaneval.truncate(tok.decode(ids, skip_special_tokens=True))
    # gold scoring keeps the rightmost context + 1 tokens of prompt + solution
    assert all(r["gold_prompt_cut_tokens"] == min(r["gold_prompt_tokens"] - 1,
                                                   r["gold_prompt_tokens"] + r["gold_tokens"] - 65) for r in rows)


def test_no_truncate_refuses_with_one_line_naming_the_flag(tiny_runs, tmp_path, capsys):
    run = load_run(tiny_runs["ntp"])
    with pytest.raises(UserError, match="--no-truncate"):
        humaneval.run(run.model.trunk, run.tokenizer, tmp_path / "s.jsonl", limit=1, max_new_tokens=16, truncate=False)
    assert not (tmp_path / "s.jsonl").exists()
    code, _out, err = cli_in_process("eval", tiny_runs["ntp"], "--tasks", "humaneval", "--limit", "1", "--no-truncate",
                                     "--json", tmp_path / "e.json", capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--no-truncate" in lines[0] and "context 64" in lines[0], err
    assert not (tmp_path / "e.json").exists()


def test_cut_rules():
    assert ctxlib.generation_cut(100, 16, 64) == 52 and ctxlib.generation_cut(10, 16, 64) == 0
    assert ctxlib.scoring_cut(100, 10, 64) == 100 + 10 - 65 and ctxlib.scoring_cut(5, 10, 64) == 0
    assert ctxlib.scoring_cut(100, 200, 64) == 99  # one prompt token always predicts the first solution token
    assert ctxlib.generation_budget(256, 1024) == 256 and ctxlib.generation_budget(256, 64) == 32


def _direct_bits(model, whole: list[int], n_prompt: int) -> float:
    """Sum of -log2 p over whole[n_prompt:] from a plain transformers forward pass over all of `whole`."""
    with torch.no_grad():
        logits = model(torch.tensor([whole[:-1]])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    targets = torch.tensor(whole[n_prompt:])
    return float(-logp[n_prompt - 1:].gather(-1, targets[:, None]).sum()) / math.log(2)


def test_gold_bpb_matches_transformers_on_the_export(tiny_runs, tmp_path):
    """Per problem: (sum of -log2 p over the solution's tokens) / its UTF-8 bytes, from AutoModelForCausalLM
    on the export; uncut (context 1024) and cut (the tiny run at context 64: rightmost 65 tokens)."""
    from helpers import tiny_model_config
    from transformers import AutoModelForCausalLM

    from mtp_cli.model.trunk import Trunk, init_weights

    tok = load_run(tiny_runs["ntp"]).tokenizer
    torch.manual_seed(0)
    long_trunk = Trunk(tiny_model_config(context=1024))
    init_weights(long_trunk, 0.1)
    long_dir = tmp_path / "long"
    hf.trunk_to_hf(long_trunk, tok).save_pretrained(long_dir)
    tok.save_pretrained(long_dir)
    short_dir = hf.ensure_export(tiny_runs["ntp"])
    problems = humaneval.load_problems(12)
    for export, cut in ((long_dir, False), (short_dir, True)):
        trunk, tokenizer = hf.load_export(export)
        model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
        ours = humaneval.gold_scores(trunk, tokenizer, problems)
        checked = 0
        for task_id, p in problems.items():
            context = p["prompt"].rstrip()
            solution = p["prompt"][len(context):] + p["canonical_solution"]
            n_prompt = len(tokenizer(context).input_ids)
            whole = tokenizer(context + solution).input_ids
            if cut:
                if len(whole) - n_prompt >= 64:
                    continue  # scored in more than one window; the long export checks the arithmetic
                drop = max(0, len(whole) - 65)
                whole, n_prompt = whole[drop:], n_prompt - drop
                assert ours[task_id]["gold_prompt_cut_tokens"] == drop
            else:
                assert ours[task_id]["gold_prompt_cut_tokens"] == 0
            bits = _direct_bits(model, whole, n_prompt)
            n_bytes = len(solution.encode("utf-8"))
            assert ours[task_id]["gold_bytes"] == n_bytes and ours[task_id]["gold_tokens"] == len(whole) - n_prompt
            assert ours[task_id]["gold_bpb"] == pytest.approx(bits / n_bytes, abs=1e-4)
            checked += 1
        assert checked >= 3


@needs_data
def test_gsm8k_gold_requests_are_lm_evals_own(tmp_path):
    """Built by lm-eval's task machinery: the gold task's (context, continuation) per doc is the generative
    task's own prompt (same few-shot examples for the same seed) and " " + the reference answer."""
    for shots in (1, 3):
        manager, name = gsm8k.load_tasks(gsm8k.check_data(GSM8K_DATA), tmp_path)
        tasks = manager.load([name, gsm8k.GOLD_TASK])["tasks"]
        requests = {}
        for task_name, task in tasks.items():
            task.set_config(key="num_fewshot", value=shots)
            task.set_fewshot_seed(seed=0)
            task.build_all_requests(limit=4, rank=0, world_size=1)
            requests[task_name] = {i.doc_id: (i.args, i.doc) for i in task.instances}
        gen, gold = requests[name], requests[gsm8k.GOLD_TASK]
        assert sorted(gen) == sorted(gold) == [0, 1, 2, 3]
        for doc_id, ((context, _gen_kwargs), doc) in gen.items():
            assert gold[doc_id][0] == (context, " " + doc["answer"])
            assert context.count("Question:") == shots + 1 and context.endswith("Answer:")


@needs_data
def test_run_eval_writes_the_contract(tiny_runs, tmp_path):
    """eval.json's gold / context / items keys, and per-item files that add up to the reported figures."""
    json_path = tmp_path / "eval.json"
    cfg = EvalConfig(limits={"humaneval": 2, "gsm8k": 2, "heldout": 3}, gsm8k_data=str(GSM8K_DATA), gsm8k_fewshot=1)
    runner.run_eval(tiny_runs["ntp"], cfg, json_path=json_path, show_progress=False)
    res = json.loads(json_path.read_text())["results"]
    h, g, ho = res["humaneval"], res["gsm8k"], res["heldout"]
    for task in (h, g):
        for key in ("gold_bpb", "gold_bpb_ci95", "gold_n", "context", "prompts_cut", "prompt_cut_tokens_max",
                    "prompt_cut_tokens_mean", "prompts_over_context", "items_path"):
            assert key in task, key
        assert task["gold_n"] == 2 and task["context"] == 64
    assert g["num_fewshot"] == 1
    he_rows = [json.loads(x) for x in (tmp_path / h["items_path"]).read_text().splitlines()]
    assert h["gold_bpb"] == pytest.approx(sum(r["gold_bpb"] for r in he_rows) / 2)
    gold_rows = [json.loads(x) for x in (tmp_path / g["items_path"]).read_text().splitlines()]
    assert g["items_path"] == "eval_gsm8k_gold.jsonl" and [r["doc_id"] for r in gold_rows] == [0, 1]
    for r in gold_rows:
        assert {"doc_id", "gold_bpb", "gold_bits", "gold_bytes", "prompt_tokens", "prompt_cut_tokens"} <= set(r)
        assert r["gold_bpb"] == pytest.approx(r["gold_bits"] / r["gold_bytes"])
    assert g["gold_bpb"] == pytest.approx(sum(r["gold_bpb"] for r in gold_rows) / 2)
    gen_rows = [json.loads(x) for x in Path(g["samples_path"]).read_text().splitlines()]
    assert [r["doc_id"] for r in gen_rows] == [0, 1] and all("prompt_cut_tokens" in r for r in gen_rows)
    assert [r["prompt_tokens"] for r in gen_rows] == [r["prompt_tokens"] for r in gold_rows]  # the same prompts
    # held-out: token-weighted mean of the window losses is the reported loss; bytes add up
    assert ho["windows_path"] == ho["items_path"] == "eval_heldout_windows.jsonl"
    windows = [json.loads(x) for x in (tmp_path / ho["windows_path"]).read_text().splitlines()]
    assert [w["window"] for w in windows] == [0, 1, 2] and all(w["tokens"] == 64 for w in windows)
    total = sum(w["tokens"] for w in windows)
    assert sum(w["loss"] * w["tokens"] for w in windows) / total == pytest.approx(ho["loss"], abs=1e-6)
    assert abs(sum(w["bytes"] for w in windows) - ho["n_bytes"]) <= 6  # a character split across windows
    assert ho["train_val"]["windows"] == 3 and ho["train_val"]["loss"] == pytest.approx(ho["loss"])


def test_heldout_train_val_is_the_training_logs_figure(tiny_runs):
    """`train_val` is the loss over the windows training validates on: its final val_loss."""
    from mtp_cli.evals import heldout

    run = load_run(tiny_runs["sequential"])
    final = json.loads((tiny_runs["sequential"] / "run.json").read_text())["final"]
    out = heldout.report(run)
    n = run.recipe.train.eval_batches * run.recipe.train.batch_size
    assert out["train_val"]["windows"] == min(n, out["n_windows"])
    assert out["train_val"]["loss"] == pytest.approx(final["val_loss"], abs=1e-5)


@needs_data
def test_gsm8k_no_truncate_refuses_before_generating(tiny_runs, tmp_path, capsys):
    """5-shot GSM8K prompts are far beyond context 64: refused in one line, no file written."""
    code, _out, err = cli_in_process("eval", tiny_runs["ntp"], "--tasks", "heldout,gsm8k", "--limit", "2",
                                     "--gsm8k-data", GSM8K_DATA, "--no-truncate", "--json", tmp_path / "e.json",
                                     "--gsm8k-fewshot", "5", capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "gsm8k (5-shot)" in lines[0] and "--no-truncate" in lines[0], err
    # without --gsm8k-fewshot the count drops to the largest that fits: none does at context 64, so 0-shot
    code, _out, err = cli_in_process("eval", tiny_runs["ntp"], "--tasks", "heldout,gsm8k", "--limit", "2",
                                     "--gsm8k-data", GSM8K_DATA, "--no-truncate", "--json", tmp_path / "e.json",
                                     capsys=capsys)
    assert code == 2 and "gsm8k (0-shot)" in err, err
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "e_heldout_windows.jsonl").exists()
    code, _out, err = cli_in_process("eval", tiny_runs["ntp"], "--tasks", "gsm8k", "--gsm8k-fewshot", "-1",
                                     "--gsm8k-data", GSM8K_DATA, capsys=capsys)
    assert code == 2 and "--gsm8k-fewshot" in err
