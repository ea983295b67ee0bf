"""What every backend checks before it starts anything, and the error it raises for bad requests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from flywheel.errors import FlywheelError


class SandboxError(FlywheelError):
    """A sandbox request is malformed (missing workspace, empty command, bad mount) or cannot be met."""


def check_request(
    workspace: Path,
    argv: Sequence[str],
    extra_ro: Mapping[Path, Path] | None,
    extra_rw: Mapping[Path, Path] | None,
) -> Path:
    """The workspace as an absolute path, after refusing what no backend can run."""
    ws = Path(workspace).resolve()
    if not ws.is_dir():
        raise SandboxError(f"{workspace}: workspace is not a directory")
    if not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise SandboxError("the command is empty (give a program and its arguments)")
    for src, dest in {**(extra_ro or {}), **(extra_rw or {})}.items():
        if not Path(src).exists():
            raise SandboxError(f"{src}: extra mount source does not exist")
        if not Path(dest).is_absolute() or Path(dest) == Path("/"):
            raise SandboxError(f"{dest}: a sandbox mount point must be an absolute path below /")
    return ws
