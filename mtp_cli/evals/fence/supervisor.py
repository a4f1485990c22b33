"""The fence's trusted supervisor, run by the harness as `python -I -S -c <this file's text>`, as the
sandbox user: it reads its job (JSON) on stdin, builds the fence (namespaces and a trusted init with a
minimal root, or seccomp and resource limits alone), runs the untrusted program, and reports JSON lines on
fd `report_fd`: {"kill_pid", "ticks"}, {"running"} (the untrusted program starts next), then
{"result", "how"}; or {"setup_failed"} when a trusted step failed. It imports nothing of mtp_cli (inside
the fence there is none) and is never imported: `mtp_cli.evals.sandbox` reads it as text."""
import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import sys
import time

job = json.loads(sys.stdin.readline())
REPORT = job["report_fd"]
RESULT_BYTES = 1 << 20  # the most of the child's result kept; the rest is drained and dropped
TIME_LIMIT = "killed at the time limit"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MACHINE = os.uname().machine
SYS = {"x86_64": {"pivot_root": 155, "clone": 56, "fork": 57, "vfork": 58, "ptrace": 101, "unshare": 272,
                  "setns": 308, "socket": 41, "socketpair": 53, "shmget": 29, "shmat": 30, "semget": 64,
                  "msgget": 68, "memfd_create": 319, "io_uring_setup": 425, "memfd_secret": 447, "io_setup": 206,
                  "add_key": 248, "request_key": 249, "keyctl": 250, "prlimit64": 302, "arch": 0xC000003E},
       "aarch64": {"pivot_root": 41, "clone": 220, "ptrace": 117, "unshare": 97, "setns": 268, "socket": 198,
                   "socketpair": 199, "shmget": 194, "shmat": 196, "semget": 190, "msgget": 186,
                   "memfd_create": 279, "io_uring_setup": 425, "memfd_secret": 447, "io_setup": 0,
                   "add_key": 217, "request_key": 218, "keyctl": 219, "prlimit64": 261,
                   "arch": 0xC00000B7}}.get(MACHINE)
OUTPUT_BYTES = 1 << 12  # the tail of the child's own output (fds 1 and 2) kept for the report
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
AF_UNIX, CLONE_THREAD = 1, 0x10000

def report(**fields):
    data = (json.dumps(fields) + "\n").encode()
    while data:
        data = data[os.write(REPORT, data):]

def fail(what, err=None):
    err = ctypes.get_errno() if err is None else err
    report(setup_failed=f"{what}: {os.strerror(err)}")
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
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])

def mount(source, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else s.encode()
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
                    fail(f"replicate {path}", 18)
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
                fail(f"replicate {path}", 18)
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
          f"size={limits['work_bytes']},nr_inodes={limits['work_files']},mode=700")
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
          ("io_uring_setup", 1), ("io_setup", 1), ("add_key", 1), ("request_key", 1), ("keyctl", 1))

def seccomp_program(pid):
    """BPF: no new processes (clone without CLONE_THREAD, fork, vfork; clone3 reports ENOSYS so that
    glibc falls back to clone for threads), no ptrace, unshare or setns; no memory outside the address
    space (SysV IPC, memfds; io_uring, which would also open sockets unfiltered); no AIO contexts (a
    machine-wide count, fs.aio-max-nr); no keys or keyrings; no limits of another process (prlimit64 only
    on pid 0 or `pid`, the process itself); sockets of AF_UNIX only. Other ABIs are killed. The kernel
    reads these int arguments from the low 32 bits, which is what the filter tests."""
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
    prog += [(jeq, 0, 5, SYS["prlimit64"]), (ld, 0, 0, 16), (jeq, 2, 0, 0), (jeq, 1, 0, pid),
             (ret, 0, 0, errno_ | 1), (ret, 0, 0, allow)]
    return prog + [(ret, 0, 0, allow)]

def install_seccomp():
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]
    insns = seccomp_program(os.getpid())
    array = (Insn * len(insns))(*[Insn(*i) for i in insns])
    ok(libc.prctl(22, 2, ctypes.byref(Prog(len(insns), array)), 0, 0), "seccomp filter")  # PR_SET_SECCOMP

def place(fds):
    """Give each descriptor of {number: fd} that number, whatever numbers they have now."""
    moved = {number: fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for number, fd in fds.items()}
    for number, fd in moved.items():
        os.dup2(fd, number)

def untrusted(job_r, output_w, result_w, start_w):
    """In the forked child: the last trusted steps, then exec the untrusted program. Its stdout and stderr
    are a pipe that its parent drains (never a file of the host's, which fallocate could grow past
    RLIMIT_FSIZE or fcntl make unreadable to the harness)."""
    global REPORT
    os.setsid()  # its own session and process group: no group signal of its reaches a trusted process
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_DFL)
    place({0: job_r, 1: output_w, 2: output_w, 3: result_w, 4: start_w, 5: REPORT})
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
        report(setup_failed=f"{what}: {exc!r}")
        os._exit(127)

def start():
    """Fork the untrusted child: (its pid, its task's pipe, its output's pipe, its result's pipe, its start
    signal's pipe)."""
    job_r, job_w = os.pipe()
    output_r, output_w = os.pipe()
    result_r, result_w = os.pipe()
    start_r, start_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        or_fail("starting the untrusted child", untrusted, job_r, output_w, result_w, start_w)
    for fd in (job_r, output_w, result_w, start_w):
        os.close(fd)
    return pid, job_w, output_r, result_r, start_r

def drain(fd, kept, limit, tail=False):
    """Add what `fd` holds now to `kept`: its first `limit` bytes, or with `tail` its last ones (the rest is
    read and dropped, so that the writer is never blocked); a few reads at most. False at end of file."""
    for _ in range(16):
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        if tail:
            kept += chunk[-limit:]
            del kept[:max(0, len(kept) - limit)]
        else:
            kept += chunk[:max(0, limit - len(kept))]
    return True

def collect(output_r, result_r, start_r, pid):
    """(What the child writes on its result pipe, the tail of its output, whether it was killed at the time
    limit), once it has exited (not once the pipes close: without seccomp something it forked may hold
    them open). The time limit runs from the byte on `start_r`, written just before the tests start."""
    pipes = {result_r: (bytearray(), RESULT_BYTES + 1, False), output_r: (bytearray(), OUTPUT_BYTES, True)}
    for fd in pipes:
        os.set_blocking(fd, False)
    try:
        exited = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): no time limit here, the harness's holds
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        killed = False
    else:
        try:
            killed = watch(pipes, start_r, pid, exited)
        finally:
            os.close(exited)
    for fd, (kept, limit, tail) in pipes.items():
        drain(fd, kept, limit, tail)  # what was written just before the end still counts
    return pipes[result_r][0], pipes[output_r][0], killed

def watch(pipes, start_r, pid, exited):
    """Drain `pipes` ({fd: (kept, limit, tail)}) until the child exits (its pidfd `exited`), or kill it at
    the time limit: True if it was killed."""
    watched, deadline = [*pipes, start_r, exited], None
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            kill(pid)
            return True
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = select.select(watched, [], [], wait)[0]
        if start_r in ready:
            if os.read(start_r, 1) and job["time_limit_s"] is not None:
                deadline = time.monotonic() + job["time_limit_s"]
            watched.remove(start_r)
        for fd in pipes:
            if fd in ready and not drain(fd, *pipes[fd]):
                watched.remove(fd)
        if exited in ready:
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
    """(The child's result, why there is none): only a JSON string is read, so nesting is no concern, and
    only RESULT_BYTES of it. It must start with the job's nonce, which the checked program got on its stdin
    and holds only in a local: writing "passed" on the result pipe is not enough to forge a pass. The
    nonce alone means no result."""
    if len(kept) > RESULT_BYTES:
        return None, f"its result was over {RESULT_BYTES} bytes"
    text = bytes(kept).strip()
    if not text:
        return None, None
    try:
        result = json.loads(text) if text[:1] == b'"' else None
    except ValueError:
        result = None
    if not isinstance(result, str):
        return None, "its result was not a JSON string"
    if not result.startswith(job["nonce"]):
        return None, "its result did not start with the check's nonce"
    return result.removeprefix(job["nonce"]) or None, None

def ended(pid, killed):
    """How the child ended, from its zombie (not reaped: that keeps its pid from reuse)."""
    if killed:
        return TIME_LIMIT
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    return f"exit status {info.si_status}" if info.si_code == 1 else f"killed by signal {info.si_status}"

def supervise(pid, job_w, output_r, result_r, start_r):
    """Give the child its task, wait for it, report its result and the tail of its output. Nothing the
    child does makes this raise or report a setup failure: any error here is reported as the end of a
    check without a result."""
    output = b""
    try:
        try:
            os.write(job_w, (json.dumps(job["task"]) + "\n").encode())
        except OSError:
            pass
        os.close(job_w)
        kept, output, killed = collect(output_r, result_r, start_r, pid)
        result, why = parse_result(kept)
        how = ended(pid, killed) + ("" if why is None else "; " + why)
    except BaseException as exc:
        result, how = None, f"supervisor error: {exc!r}"
        kill(pid)
    report(result=result, how=how, output=bytes(output).decode("utf-8", "replace"))

IGNORED = ignore_signals()
# A fresh anonymous session keyring, before anything forks: the harness's own (a login's, a unit's) is not
# the check's to read, fill or revoke. Where keys are refused altogether (ENOSYS, EPERM) there is none to share.
if SYS is not None and libc.syscall(SYS["keyctl"], 1, None) < 0 and ctypes.get_errno() not in (1, 38):
    fail("joining a new session keyring")  # KEYCTL_JOIN_SESSION_KEYRING with no name: a new anonymous one
if job["namespaces"]:
    flags = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000  # USER NS PID NET IPC UTS
    uid, gid = os.geteuid(), os.getegid()
    ok(libc.unshare(flags), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
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
