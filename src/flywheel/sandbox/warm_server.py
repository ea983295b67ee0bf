"""The warm pytest parent of one episode: runs inside the episode's sandbox, on the standard library and pytest.

Started once per episode by `flywheel.sandbox.warm.WarmSession` (see its docstring for what is kept per
command), it imports pytest, listens on `SOCKET` and serves each request of the shim (`warm_shim.py`, the
sandbox's `python`) by forking a child that becomes the command's interpreter: the child joins the
command's cgroups, checks that a cold interpreter would have started the same way (else the shim execs
the real one), takes the shim's file descriptors, environment, working directory, umask and rlimits, and
runs `python -m pytest ...` or the `pytest` script as `__main__`, exiting as the interpreter would. The
parent itself never runs the command's code, so nothing a command does reaches the next one but through
the workspace.

The host drives it over an inherited SOCK_SEQPACKET (`argv[1]`): `begin` with the command's
`cgroup.procs` descriptors, `end` after the command has returned: every process of the sandbox but this
one and its init is killed, pending requests are dropped, and the reply is `ok W C`: the runs of the
command served warm, and those sent cold (each reason is written to stderr). It says `ready` once it
listens.
"""

import builtins
import contextlib
import ctypes
import gc
import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import time

import _pytest.config
import pytest  # noqa: F401  (the point of this process: a fork finds it imported)

for _name in _pytest.config.default_plugins:  # what every run imports before it collects
    with contextlib.suppress(ImportError):
        importlib.import_module(f"_pytest.{_name}")

SOCKET = "/run/flywheel/warm.sock"
ROOTS = ("/workspace", "/tmp")  # where a module could shadow one this process has imported
MAX_ENTRIES = 20000  # more files than this under ROOTS: not scanned, the run goes cold
MAX_FDS = 64
HIGH_FD = 1000  # where a child parks the received descriptors before it numbers them
PR_SET_DUMPABLE = 4
# What a cold interpreter reads from its environment while starting: a request that differs goes cold.
STARTUP_KEYS = ("HOME", "LANG", "LANGUAGE", "TZ")
STARTUP_PREFIXES = ("PYTHON", "LC_")


def startup_env(env):
    return {k: v for k, v in env.items() if k in STARTUP_KEYS or k.startswith(STARTUP_PREFIXES)}


IMPORTED = frozenset(name.partition(".")[0] for name in sys.modules)
START_ENV = startup_env(os.environ)
BIN = os.path.dirname(sys.executable)
with open("/proc/self/mountinfo") as _f:  # a bind of the same file system is no st_dev change
    MOUNTS = frozenset(line.split()[4] for line in _f)
STREAMS = (sys.stdin, sys.stdout, sys.stderr)  # kept alive in children: their collection would close 0-2


def main():
    ctl = socket.socket(fileno=int(sys.argv[1]))
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/PID/mem from the commands
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(SOCKET)
    srv.listen(64)
    gc.collect()
    gc.freeze()  # what is imported now is never scanned again: each child's collections skip it
    ctl.send(b"ready")
    Server(srv, ctl).loop()


class Server:
    def __init__(self, srv, ctl):
        self.srv, self.ctl = srv, ctl
        self.sel = selectors.DefaultSelector()
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(srv, selectors.EVENT_READ, "accept")
        self.sel.register(ctl, selectors.EVENT_READ, "control")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")
        self.cgroups = []  # the current command's cgroup.procs descriptors
        self.children = {}  # pid -> the shim's connection
        self.pending = set()  # accepted connections whose request is not read yet
        self.warm = self.cold = 0

    def loop(self):
        while True:
            for key, _ in self.sel.select():
                kind = key.data
                if kind == "accept":
                    with contextlib.suppress(OSError):
                        conn, _ = self.srv.accept()
                        self.pending.add(conn)
                        self.sel.register(conn, selectors.EVENT_READ, "request")
                elif kind == "request":
                    self.request(key.fileobj)
                elif kind == "shim":
                    self.from_shim(key.fileobj)
                elif kind == "child":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 512)
                    self.reap()
                elif not self.control():
                    return

    def control(self):
        try:
            msg, fds, _, _ = socket.recv_fds(self.ctl, 64, 8)
        except OSError:
            return False
        if not msg:
            return False
        if msg == b"begin":
            self.close_cgroups()
            self.cgroups, self.warm, self.cold = fds, 0, 0
            self.ctl.send(b"ok")
        elif msg == b"end":
            for fd in fds:
                os.close(fd)
            killed = kill_the_rest()
            self.reap()
            for conn in [*self.pending, *self.children.values()]:
                self.drop(conn)
            self.drain_backlog()
            self.children.clear()
            self.close_cgroups()
            self.ctl.send(f"ok {self.warm} {self.cold}".encode() if killed else b"stuck")
        return True

    def close_cgroups(self):
        for fd in self.cgroups:
            os.close(fd)
        self.cgroups = []

    def drop(self, conn):
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        self.pending.discard(conn)
        conn.close()

    def drain_backlog(self):
        """Close connections still queued: their senders are gone, and no request outlives its command."""
        self.srv.setblocking(False)
        try:
            while True:
                conn, _ = self.srv.accept()
                conn.close()
        except OSError:
            pass
        finally:
            self.srv.setblocking(True)

    def request(self, conn):
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, MAX_FDS)
        except OSError:
            msg, fds = b"", []
        self.sel.unregister(conn)
        self.pending.discard(conn)
        try:
            req = json.loads(msg) if msg else None
            why = cold_reason(req, len(fds)) if req else "no request"
        except Exception as e:  # noqa: BLE001  (a malformed request: the cold interpreter decides)
            req, why = None, f"{type(e).__name__}: {e}"
        if why:
            self.cold += 1
            print(f"cold: {why}", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                conn.send(b"cold " + why.encode()[:200])
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            self.become_child(conn)
            run_child(conn, req, fds)  # never returns
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.sel.register(conn, selectors.EVENT_READ, "shim")

    def become_child(self, conn):
        """In the fork: join the command's cgroups and let go of everything of the parent's."""
        for fd in self.cgroups:
            with contextlib.suppress(OSError):
                os.write(fd, b"0")
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.sel.close()
        os.close(self.wake_r)
        for other in [*self.pending, *self.children.values()]:
            other.close()
        self.srv.close()
        self.ctl.close()

    def from_shim(self, conn):
        """A signal the shim forwards (`sig N`), or its end: the child goes with it, as a cold one would."""
        pid = next((p for p, c in self.children.items() if c is conn), None)
        try:
            msg = conn.recv(64)
        except OSError:
            msg = b""
        if pid is None:
            return self.drop(conn)
        if msg.startswith(b"sig "):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(pid, int(msg[4:]))
        elif not msg:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.sel.unregister(conn)

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.warm += 1
            if os.WIFSIGNALED(status):
                reply = f"signal {os.WTERMSIG(status)}"
            else:
                reply = f"exit {os.waitstatus_to_exitcode(status)}"
            with contextlib.suppress(OSError):
                conn.send(reply.encode())
            self.drop(conn)


def kill_the_rest(wait_s=5.0):
    """SIGKILL every process of this pid namespace but init and this one, until none is left."""
    me, deadline = os.getpid(), time.monotonic() + wait_s
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not [p for p in _pids() if p not in (1, me) and not _zombie(p)]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def _pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def cold_reason(req, received):
    """Why a cold interpreter could start otherwise than this one has (None: it could not)."""
    if os.path.dirname(req["argv0"]) != BIN:
        return "another interpreter"
    if startup_env(req["env"]) != START_ENV:
        return "the environment changes how the interpreter starts"
    if len(req["fds"]) != received or any(fd >= HIGH_FD for fd in req["fds"]):
        return "descriptors lost"
    cwd = req["cwd"]
    if not (cwd == ROOTS[0] or cwd.startswith(ROOTS[0] + "/")) or not os.path.isdir(cwd):
        return "working directory outside the workspace"
    import resource

    for name, (_soft, hard) in req["rlimits"].items():
        _, mine = resource.getrlimit(getattr(resource, name))
        if mine != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > mine):
            return f"{name} is above this process's"
    clash = shadowing_names() & IMPORTED
    if clash:
        return f"the workspace may shadow {sorted(clash)[0]}"
    return None


def run_child(conn, req, fds):
    """In the fork: take the command's limits and process state, run its pytest, exit as it would."""
    conn.send(b"warm")
    conn.close()
    take_process_state(req, fds)
    os._exit(run_main(req))


def take_process_state(req, fds):
    """Descriptors, environment, working directory and umask of the command's interpreter."""
    high = [fcntl_dupfd(fd, HIGH_FD) for fd in fds]
    for fd in _open_fds():
        if fd not in high:
            with contextlib.suppress(OSError):
                os.close(fd)
    for src, dest in zip(high, req["fds"], strict=True):
        os.dup2(src, dest)
    for fd in high:
        os.close(fd)
    import resource

    for name, limit in req["rlimits"].items():
        resource.setrlimit(getattr(resource, name), tuple(limit))
    os.umask(req["umask"])
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    open_streams(set(req["fds"]))


def fcntl_dupfd(fd, lowest):
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, lowest)


def _open_fds():
    return [int(fd) for fd in os.listdir("/proc/self/fd")]


def shadowing_names():
    """Names under ROOTS that an import could find before the library's own module of that name."""
    names, seen = set(), 0
    for root in ROOTS:
        for path, dirs, files in os.walk(root):
            seen += len(dirs) + len(files)
            if seen > MAX_ENTRIES:
                return {"(too many files to scan)"} | IMPORTED
            # a mount point under /tmp is the runtime (a checkout there): the same in a cold run
            dirs[:] = [d for d in dirs if d != "__pycache__" and os.path.join(path, d) not in MOUNTS]
            names.update(dirs)
            names.update(f.partition(".")[0] for f in files if f.endswith((".py", ".pyc", ".so", ".pth")))
    return names


def open_streams(fds):
    """sys.stdin/stdout/stderr as the interpreter makes them at start-up, on descriptors 0-2."""
    made = []
    for fd, old, mode, name in (
        (0, STREAMS[0], "r", "<stdin>"),
        (1, STREAMS[1], "w", "<stdout>"),
        (2, STREAMS[2], "w", "<stderr>"),
    ):
        if fd not in fds:
            made.append(None)
            continue
        buf = open(fd, mode + "b", closefd=False)  # noqa: SIM115  (the run's stream, for its life)
        buf.raw.name = name
        line = os.isatty(fd) or (fd == 2 and old is not None and old.line_buffering)
        encoding = old.encoding if old is not None else "utf-8"
        errors = old.errors if old is not None else "strict"
        text = io.TextIOWrapper(buf, encoding, errors, newline="\n", line_buffering=line)
        text.mode = mode
        made.append(text)
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


def run_main(req):
    """Run the request's pytest as `__main__`, then finalize as `Py_RunMain` does; the exit status."""
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    args = req["args"]
    sys.orig_argv = [req["argv0"], *args]
    sys.executable = os.path.abspath(req["argv0"])  # python3.11 or python3 rather than this process's name
    code, interrupted = 0, False
    try:
        if args[:2] == ["-m", "pytest"]:
            sys.argv = ["-m", *args[2:]]
            sys.path[0] = req["cwd"]
            runpy._run_module_as_main("pytest", alter_argv=True)
        else:
            script = args[0]
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            run_script(main, script)
    except SystemExit as e:
        code = exit_status(e)
    except BaseException as e:  # noqa: BLE001  (what the interpreter prints and exits 1 on)
        interrupted = isinstance(e, KeyboardInterrupt)
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the traceback a cold interpreter prints starts below this file's frames
        sys.excepthook(type(e), e, tb)
        code = 1
    code = finalize(code)
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code & 0xFF


def run_script(main, path):
    from importlib.machinery import SourceFileLoader

    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path))
    main.__dict__.update(__builtins__=builtins, __spec__=None, __package__=None)
    exec(code, main.__dict__)


def exit_status(e):
    value = e.code
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{value}\n")
    return 1


def finalize(code):
    """Threads joined, atexit handlers run, stdout and stderr flushed: the interpreter's own exit."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or stream.closed:
            continue
        try:
            stream.flush()
        except Exception as e:  # noqa: BLE001
            if stream is sys.stdout:
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"Exception ignored in: {stream!r}\n{type(e).__name__}: {e}\n")
                    sys.stderr.flush()
                code = 120
    return code


if __name__ == "__main__":
    main()
