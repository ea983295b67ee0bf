"""The bubblewrap backend: a fresh mount, pid, network, ipc and uts namespace per command.

The sandbox's root is an empty read-only tmpfs holding only what `layout.host_layout()` names (system
directories, an /etc subset, the Python runtime, all read-only), a new /proc, a minimal /dev (null,
zero, urandom; /dev/shm is /tmp), a private tmpfs at /tmp (HOME and TMPDIR, at most memory_mb in size), the workspace read-write at /workspace (the
working directory; its `.git`, if any, covered by an empty read-only tmpfs) and the caller's extra
mounts. The network namespace holds only a loopback interface. Capabilities are dropped and
no_new_privs is set, so root inside cannot remount anything. The command runs under bwrap's reaper as
pid 1 of its own pid namespace: when it exits, the kernel kills whatever it left behind, and
`--die-with-parent` kills the namespace if flywheel itself dies.

`bwrap_argv` is a pure function of its inputs; `BwrapSandbox.run` adds the per-run cgroup and runs it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flywheel.protocols import WORKSPACE, Environment, Limits, RunResult
from flywheel.sandbox.cgroups import create_cgroup
from flywheel.sandbox.common import SandboxError, check_request
from flywheel.sandbox.disk import DiskBudget
from flywheel.sandbox.envs import command_setup
from flywheel.sandbox.layout import SYSTEM_PATH, Layout, base_env, host_layout
from flywheel.sandbox.limits import launcher, rlimits
from flywheel.sandbox.supervise import run_supervised

if TYPE_CHECKING:
    from flywheel.sandbox.warm import EpisodeSandbox

MB = 1024 * 1024
# A minimal /dev with three device nodes (bwrap's --dev mounts about ten, a millisecond each).
DEV = [
    *("--dev-bind", "/dev/null", "/dev/null", "--dev-bind", "/dev/zero", "/dev/zero"),
    *("--dev-bind", "/dev/urandom", "/dev/urandom", "--symlink", "urandom", "/dev/random"),
    *("--symlink", "/tmp", "/dev/shm", "--symlink", "/proc/self/fd", "/dev/fd"),
    *("--symlink", "/proc/self/fd/0", "/dev/stdin", "--symlink", "/proc/self/fd/1", "/dev/stdout"),
    *("--symlink", "/proc/self/fd/2", "/dev/stderr"),
]
OVERHEAD_PROCS = 2  # bwrap's monitor and its pid-1 reaper count against pids.max


def bwrap_argv(
    argv: Sequence[str],
    *,
    workspace: Path,
    layout: Layout,
    env: Mapping[str, str],
    tmp_mb: int,
    extra_ro: Mapping[Path, Path],
    extra_rw: Mapping[Path, Path],
    as_root: bool,
    tmp_dir: Path | None = None,
    overlay: Sequence[tuple[Path, Path]] = (),
    workdir: str = WORKSPACE,
    network: bool = False,
) -> list[str]:
    """The full bwrap command line that runs `argv` in the sandbox; /tmp is `tmp_dir` where one is given
    (an episode's shared /tmp, `warm.py`), else a fresh tmpfs of `tmp_mb`. `overlay`: read-only binds
    made last, in order (one source may cover several paths). The workspace is bound at `workdir`;
    `network` (environment builds only) keeps the host's network."""
    args = [bwrap_path(), *([] if network else ["--unshare-net"]), "--unshare-pid", "--unshare-ipc"]
    args += ["--unshare-uts"]
    args += ["--hostname", "sandbox", "--die-with-parent", "--new-session"]
    args += ["--cap-drop", "ALL"] if as_root else []
    # /tmp first, so a runtime that lives under /tmp (a checkout there) is bound on top of it
    fresh_tmp = ["--perms", "1777", "--size", str(tmp_mb * MB), "--tmpfs", "/tmp"]
    args += ["--proc", "/proc", *DEV, *(["--bind", str(tmp_dir), "/tmp"] if tmp_dir else fresh_tmp)]
    for kind, host, dest in layout.mounts:
        args += ["--symlink", host, dest] if kind == "symlink" else ["--ro-bind", host, dest]
    args += [a for hidden in layout.hidden for a in _empty_dir(hidden)]
    args += ["--bind", str(workspace), workdir, *_hide_git(workspace, workdir)]
    args += [a for src, dest in extra_ro.items() for a in ("--ro-bind", str(src), str(dest))]
    args += [a for src, dest in extra_rw.items() for a in ("--bind", str(src), str(dest))]
    args += [a for src, dest in overlay for a in ("--ro-bind", str(src), str(dest))]
    args += ["--remount-ro", "/", "--chdir", workdir, "--clearenv"]
    args += [a for key, value in env.items() for a in ("--setenv", key, value)]
    return [*args, "--", *argv]


def _empty_dir(path: str) -> list[str]:
    """Cover `path` with an empty tmpfs that nobody inside may write (capabilities are dropped)."""
    return ["--perms", "0555", "--tmpfs", path]


def _hide_git(workspace: Path, workdir: str) -> list[str]:
    git = workspace / ".git"
    if git.is_symlink():
        return []  # its target is a host path, which is not mounted: it dangles inside
    if git.is_dir():
        return _empty_dir(f"{workdir}/.git")
    if git.exists():
        return ["--ro-bind", "/dev/null", f"{workdir}/.git"]
    return []


@functools.cache
def bwrap_path() -> str:
    return shutil.which("bwrap") or "bwrap"


@functools.cache
def bwrap_works() -> bool:
    """Whether bwrap can create the namespaces this backend needs here (probed once per process)."""
    if shutil.which("bwrap") is None:
        return False
    probe = [
        bwrap_path(),
        "--unshare-net",
        "--unshare-pid",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "true",
    ]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class BwrapSandbox:
    """Sandbox backend on bubblewrap."""

    name = "bwrap"

    def __init__(self, use_cgroups: bool = True) -> None:
        self.use_cgroups = use_cgroups  # False: rlimits only, as on a host without writable cgroups
        if not bwrap_works():
            raise SandboxError("the bwrap sandbox is unavailable here (bwrap missing or namespaces refused)")

    def run(
        self,
        workspace: Path,
        argv: Sequence[str],
        *,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        extra_ro: Mapping[Path, Path] | None = None,
        extra_rw: Mapping[Path, Path] | None = None,
        environment: Environment | None = None,
        network: bool = False,
    ) -> RunResult:
        """`Sandbox.run`; `network=True` is the build mode of `envs.py`, the only caller that may use it."""
        workspace = check_request(workspace, argv, extra_ro, extra_rw)
        return self.start(
            workspace, argv, limits or Limits(), env, extra_ro or {}, extra_rw or {},
            environment=environment, network=network,
        )  # fmt: skip

    def start(
        self,
        workspace: Path,
        argv: Sequence[str],
        limits: Limits,
        env: Mapping[str, str] | None,
        extra_ro: Mapping[Path, Path],
        extra_rw: Mapping[Path, Path],
        episode: EpisodeSandbox | None = None,
        environment: Environment | None = None,
        network: bool = False,
    ) -> RunResult:
        """Run a checked request; with an `episode` (`warm.py`), under its shared /tmp and warm parent."""
        layout = host_layout()
        env_mounts, env_vars = command_setup(environment, layout.path)
        cmd = bwrap_argv(
            argv,
            workspace=workspace,
            layout=layout,
            env={**base_env(layout.path, "/tmp"), **env_vars, **(env or {})},
            tmp_mb=limits.memory_mb,
            extra_ro={**env_mounts, **extra_ro},
            extra_rw=extra_rw,
            as_root=os.geteuid() == 0,
            tmp_dir=episode.tmp if episode is not None else None,
            overlay=episode.overlay() if episode is not None else (),
            workdir=environment.workdir if environment is not None else WORKSPACE,
            network=network,
        )
        overhead = OVERHEAD_PROCS + (episode is not None)  # the shim waits beside a warm run
        cgroup = create_cgroup(limits, overhead, self.use_cgroups)
        try:
            full = launcher(cmd, cgroup, rlimits(limits, cgroup))
            disk = DiskBudget(
                [workspace, *extra_rw, *([episode.tmp] if episode else [])], limits.disk_mb * MB
            )
            env = {"PATH": SYSTEM_PATH}
            if episode is not None:
                episode.begin(cgroup)
            return run_supervised(
                full,
                cwd="/",
                env=env,
                limits=limits,
                cgroup=cgroup,
                disk=disk,
                also_kill=episode.end if episode is not None else None,
            )
        finally:
            if episode is not None:
                episode.end()
            cgroup.remove()
