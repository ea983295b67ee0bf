"""An episode's sandbox with a warm pytest: `python -m pytest` and `pytest` served by forking, not started.

An episode runs `python -m pytest` again and again (the agent's sweeps, `run_tests`), and each cold run
spends about 0.2 s of its 0.24 s starting the interpreter and importing pytest. `EpisodeSandbox` keeps,
from the episode's first command that names pytest (which waits up to `READY_S` for it) to its end, one
more sandbox beside its commands: the same mounts and workspace, running `warm_server.py`, which has
imported pytest and waits on a socket. Each command still runs as before, in a
sandbox of its own, with two differences: the runtime's interpreter is covered by `warm_shim.py`, which
hands `python -m pytest ...` and the `pytest` script to the warm parent (anything else execs the real
interpreter), and /tmp is a directory of the episode shared with the warm parent's sandbox, emptied
before every command. The parent forks a child that joins the command's cgroups, takes the shim's
descriptors, environment, working directory, umask and rlimits, and runs pytest as `__main__`; the shim
forwards signals and exits as the child did.

Each guarantee of a command, and how it is kept for a warm run (`sandbox/__init__.py` has the summary):

- Limits: the child joins the command's cgroups (pids, memory: the cgroup.procs descriptors go from the
  host to the parent over a channel no command can reach) and takes the shim's rlimits; wall time and
  output are the command's own, its pipe and its deadline. The shim counts as one more process.
- Everything a command started is killed when it returns: after the command's sandbox and cgroup, the
  parent kills every process of its own pid namespace but itself (`end`), and drops requests not yet
  served, before the last output is read.
- No state between commands but the workspace: the parent runs no command code (each run is a fresh
  fork of the same image), is not dumpable (no ptrace, no /proc/PID/mem), and /tmp is emptied before
  each command. A run goes cold (the shim execs the real interpreter) wherever a warm one could start
  differently: another interpreter, interpreter options, a startup variable (PYTHON*, LC_*, LANG, HOME,
  TZ) that differs, a working directory outside /workspace, more than 64 descriptors, rlimits above the
  parent's, or a file under /workspace or /tmp named like a module the parent has imported (`inspect.py`
  would shadow the library's in a cold run, not in a warm one).

What differs, beyond time: process ids and the pid namespace a run sees (the parent's); System V IPC
objects live in the parent's namespace for the episode; /tmp is on disk (counted in `disk_mb`, not
bounded by `memory_mb`); `sys.orig_argv[0]` is the interpreter's path, not the name typed; memory the
parent had already touched (pytest's modules) is charged to the parent, not to the command; the run's
stack starts a few frames deeper than a cold one's (only a recursion limit of a few dozen can tell); the
objects the parent made before serving are frozen out of the garbage collector (`gc.freeze()`: pytest's
collections at the end of a session skip them; `gc.get_freeze_count()` is not 0).

`EpisodeSandbox.open()` returns None where the warm parent cannot run (the fallback backend), and callers use
the plain sandbox then; `HarnessConfig.warm_pytest = False` (`[rollout] warm_pytest`, `flywheel eval
--cold-pytest`) turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence, Set
from pathlib import Path

from flywheel.protocols import Limits, RunResult, Sandbox
from flywheel.sandbox.bwrap import BwrapSandbox, bwrap_argv
from flywheel.sandbox.cgroups import RunCgroup
from flywheel.sandbox.common import check_request
from flywheel.sandbox.layout import base_env, host_layout
from flywheel.sandbox.workspaces import new_workspace

HERE = Path(__file__).parent
SERVER, SHIM = HERE / "warm_server.py", HERE / "warm_shim.py"
RUN = "/run/flywheel"  # the socket and the real interpreter, as the shim finds them
SERVER_AT = "/run/flywheel-warm-server.py"
END_S = 10.0  # the longest the parent may take to clear a command's processes
READY_S = 1.0  # a command waits this long for a parent still starting, then runs cold
START_S = 120.0  # a parent not listening after this long is given up


class EpisodeSandbox:
    """One workspace's commands with a warm pytest parent, for one episode; `close()` ends it."""

    def __init__(self, sandbox: BwrapSandbox, workspace: Path):
        self.sandbox, self.workspace = sandbox, Path(workspace).resolve()
        self.dir = new_workspace("episode-")  # in the process's own directory: swept if it is killed
        self.tmp, self.run_dir = self.dir / "tmp", self.dir / "run"
        self.tmp.mkdir()
        self.tmp.chmod(0o1777)
        self.run_dir.mkdir()
        (self.run_dir / "python").touch()  # where the real interpreter is mounted
        self.shim = self.dir / "shim"
        shutil.copyfile(SHIM, self.shim)
        self.shim.chmod(0o755)  # executable whatever the installed package's modes
        self.proc: subprocess.Popen | None = None
        self.ctl: socket.socket | None = None
        self.ended = True
        self.warm_runs = self.cold_runs = 0  # pytest runs the parent served, and those it sent cold
        self.ready = False
        self.broken: str | None = None  # why the parent was given up (the rest of the episode runs cold)

    @classmethod
    def open(cls, sandbox: Sandbox, workspace: Path) -> EpisodeSandbox | None:
        """The episode's sandbox (None where the backend has no warm parent). The parent starts with the
        first command that names pytest: an episode that never runs it does not pay for one."""
        return cls(sandbox, workspace) if isinstance(sandbox, BwrapSandbox) else None

    def run(
        self,
        argv: Sequence[str],
        *,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        """`sandbox.run(workspace, argv, ...)`, with warm pytest runs."""
        workspace = check_request(self.workspace, argv, None, None)
        limits = limits or Limits()
        if self.broken is None and self.proc is None:
            if not any("pytest" in a for a in argv):
                return self.sandbox.start(workspace, argv, limits, env, {}, {})
            self._start()
        if not self.ready and self.broken is None:
            self._wait_ready()
        if not self.ready:  # given up, or still starting (then the next command looks again)
            return self.sandbox.start(workspace, argv, limits, env, {}, {})
        empty_tmp(self.tmp, tmp_skeleton())
        return self.sandbox.start(workspace, argv, limits, env, {}, {}, self)

    def overlay(self) -> list[tuple[Path, Path]]:
        """A command's extra mounts, in order: the socket's directory, the real interpreter inside it, and
        the shim over each of the runtime's interpreter binaries."""
        real = Path(os.path.realpath(sys.executable))
        return [
            (self.run_dir, Path(RUN)),
            (real, Path(RUN) / "python"),
            *((self.shim, i) for i in interpreters()),
        ]

    def _start(self) -> None:
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        layout = host_layout()
        cmd = bwrap_argv(
            [sys.executable, SERVER_AT, str(child.fileno())],
            workspace=self.workspace,
            layout=layout,
            env=base_env(layout.path, "/tmp"),
            tmp_mb=0,
            extra_ro={SERVER: Path(SERVER_AT)},
            extra_rw={self.run_dir: Path(RUN)},
            as_root=os.geteuid() == 0,
            tmp_dir=self.tmp,
        )
        try:
            with open(self.dir / "server.log", "wb") as log:
                self.proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=[child.fileno()]
                )
        except OSError as e:
            self.broken = f"the warm parent could not start: {e}"
        finally:
            child.close()
        self.ctl, self.started = host, time.monotonic()

    def _wait_ready(self) -> None:
        """Up to READY_S for the parent to listen (it imports pytest first: about one cold run's time; much
        longer when a pool's episodes all start together); given up after START_S, or if it died."""
        assert self.ctl is not None and self.proc is not None
        try:
            self.ctl.settimeout(READY_S)
            self.ready = self.ctl.recv(64) == b"ready"
        except TimeoutError:
            if time.monotonic() - self.started > START_S:
                self._give_up(f"the warm parent did not start in {START_S:.0f} s")
        except OSError as e:
            self._give_up(f"the warm parent did not start: {e}")
        finally:
            if self.ctl is not None:
                self.ctl.settimeout(END_S)
        if not self.ready and self.proc is not None and self.proc.poll() is not None:
            last = (self.dir / "server.log").read_text(errors="replace").strip().splitlines()[-1:]
            self._give_up(f"the warm parent exited ({self.proc.returncode}) before it listened: {last}")

    def begin(self, cgroup: RunCgroup) -> None:
        """Before a command: its cgroups, for the runs it hands over."""
        fds = [os.open(f, os.O_WRONLY | os.O_CLOEXEC) for f in cgroup.procs_files]
        try:
            self._call(b"begin", fds)
        finally:
            for fd in fds:
                os.close(fd)
        self.ended = False

    def end(self) -> None:
        """After a command (idempotent): its warm runs and everything they started are gone."""
        if self.ended:
            return
        self.ended = True
        reply = self._call(b"end")
        if reply is not None and reply.startswith(b"ok "):
            warm, cold = reply[3:].split()
            self.warm_runs += int(warm)
            self.cold_runs += int(cold)
        elif self.broken is None:
            self._give_up(f"the warm parent did not clear a command: {reply!r}")

    def _call(self, msg: bytes, fds: Sequence[int] = ()) -> bytes | None:
        if self.broken is not None or self.ctl is None:
            return None
        try:
            socket.send_fds(self.ctl, [msg], list(fds))
            return self.ctl.recv(64)
        except OSError as e:
            self._give_up(f"the warm parent stopped answering: {e}")
            return None

    def _give_up(self, why: str) -> None:
        self.broken = why
        self._stop()

    def _stop(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self._stop()
        self.proc, self.ctl = None, None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EpisodeSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.cache
def interpreters() -> list[Path]:
    """The runtime's interpreter binaries that `python`, `python3`, ... lead to (the shim covers them)."""
    names = [sys.executable, *Path(sys.prefix, "bin").glob("python*")]
    return sorted({Path(os.path.realpath(n)) for n in names if os.path.isfile(n)})


@functools.cache
def tmp_skeleton() -> frozenset[str]:
    """Paths under /tmp (relative) that the layout mounts on: bwrap made them, they stay."""
    keep: set[str] = set()
    for _, _, dest in host_layout().mounts:
        rel = Path(dest).relative_to("/tmp") if dest.startswith("/tmp/") else None
        while rel is not None and str(rel) != ".":
            keep.add(str(rel))
            rel = rel.parent
    return frozenset(keep)


def empty_tmp(tmp: Path, keep: Set[str], rel: str = "") -> None:
    """Remove everything under `tmp` but the mount points in `keep` and the directories above them."""
    with os.scandir(tmp / rel if rel else tmp) as entries:
        for entry in list(entries):
            name = f"{rel}/{entry.name}" if rel else entry.name
            if name in keep:
                if not any(k.startswith(name + "/") for k in keep):
                    continue  # the mount point itself: a runtime, bound on top in every sandbox
                empty_tmp(tmp, keep, name)
            elif entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=_force)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _force(func, path, _exc) -> None:  # noqa: ANN001
    """rmtree's error handler: make the parent writable and retry once (a command's chmod 000)."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
    with contextlib.suppress(OSError):
        func(path)
