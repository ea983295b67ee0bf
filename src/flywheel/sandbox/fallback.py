"""The fallback backend, for hosts without a working bwrap: `unshare -n`, cgroups or rlimits, a session.

It gives what needs no mount namespace: no network (the command runs under `unshare -n` in a network
namespace with not even a loopback interface up, where the host permits it; probed once), the same
limits as the bwrap backend (per-run cgroup or rlimits, see `limits.py`), output capture, and cleanup
(the command leads its own session; its process group and its cgroup are killed when it ends).

It cannot hide the host file system: the command runs in the workspace on the host, with HOME and TMPDIR
in a fresh temporary directory removed afterwards. Sandbox paths are emulated by rewriting: an argument
or environment value that starts with `/workspace` or with a sandbox path of `extra_ro`/`extra_rw` (also
after a leading `--opt=`) is rewritten to the host path, so the grader's `/grader/runner.py` runs here
too. Read-only extra mounts are not enforced. A workspace holding `.git` is refused, since its history
could not be hidden.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from flywheel.protocols import WORKSPACE, Environment, Limits, RunResult
from flywheel.sandbox.cgroups import create_cgroup
from flywheel.sandbox.common import SandboxError, check_request
from flywheel.sandbox.disk import DiskBudget
from flywheel.sandbox.envs import command_setup
from flywheel.sandbox.layout import base_env, host_layout
from flywheel.sandbox.limits import launcher, rlimits
from flywheel.sandbox.supervise import run_supervised

MB = 1024 * 1024


@functools.cache
def unshare_net() -> list[str]:
    """The prefix that puts a command in a new network namespace here, or [] if the host refuses it."""
    exe = shutil.which("unshare")
    if exe is None:
        return []
    try:
        ok = subprocess.run([exe, "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return [exe, "-n", "--"] if ok else []


def rewrite(value: str, mapping: Mapping[str, str]) -> str:
    """`value` with a leading sandbox path (whole, or after `--opt=`) replaced by its host path."""
    prefix, sep, rest = value.partition("=") if value.startswith("-") else ("", "", value)
    for dest, host in mapping.items():
        if rest == dest or rest.startswith(dest.rstrip("/") + "/"):
            return prefix + sep + host + rest[len(dest) :]
    return value


def path_mapping(workspace: Path, extra: Mapping[Path, Path]) -> dict[str, str]:
    """Sandbox path -> host path, longest sandbox path first so that nested mounts win."""
    pairs = {
        WORKSPACE: str(workspace),
        **{str(dest): str(Path(src).resolve()) for src, dest in extra.items()},
    }
    return dict(sorted(pairs.items(), key=lambda kv: -len(kv[0])))


class FallbackSandbox:
    """Sandbox backend without a mount namespace (see the module docstring for what it lacks)."""

    name = "fallback"

    def __init__(self, use_cgroups: bool = True) -> None:
        self.use_cgroups = use_cgroups  # False: rlimits only, as on a host without writable cgroups

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
        """`Sandbox.run`; `network=True` is the build mode of `envs.py` (no `unshare -n`)."""
        limits = limits or Limits()
        workspace = check_request(workspace, argv, extra_ro, extra_rw)
        if (workspace / ".git").exists() or (workspace / ".git").is_symlink():
            raise SandboxError(f"{workspace}: workspace holds .git, which the fallback sandbox cannot hide")
        if environment is not None and environment.workdir != WORKSPACE:
            raise SandboxError(
                f"the fallback sandbox cannot show the workspace at {environment.workdir} (only at {WORKSPACE})"
            )
        env_mounts, env_vars = command_setup(environment, host_layout().path)
        mapping = path_mapping(workspace, {**env_mounts, **(extra_ro or {}), **(extra_rw or {})})
        cmd = [*([] if network else unshare_net()), *(rewrite(a, mapping) for a in argv)]
        cgroup = create_cgroup(limits, 0, self.use_cgroups)
        with tempfile.TemporaryDirectory(prefix="flywheel-sandbox-home-", ignore_cleanup_errors=True) as home:
            user_env = {k: rewrite(v, mapping) for k, v in {**env_vars, **(env or {})}.items()}
            full_env = {**base_env(host_layout().path, home), **user_env}
            try:
                full = launcher(cmd, cgroup, rlimits(limits, cgroup))
                disk = DiskBudget([workspace, *(extra_rw or {})], limits.disk_mb * MB)
                return run_supervised(
                    full, cwd=workspace, env=full_env, limits=limits, cgroup=cgroup, disk=disk
                )
            finally:
                cgroup.remove()
