"""Writing a file or a directory whole or not at all: build it beside its place, then rename it there.

`building(dest)` yields a fresh temporary directory beside `dest`; when the block ends without an error the
directory replaces `dest` (an old `dest` is removed first), and when it raises the temporary directory is
removed and `dest` is left as it was. `writing(dest)` does the same for one file. A reader therefore sees
the old `dest` or the new one, never half of one.

What is covered: an error or an interrupt (any exception, `KeyboardInterrupt` included) inside the block
leaves no temporary behind and `dest` untouched; the rename is `os.replace`, atomic on one filesystem, and
the temporary is a sibling of `dest`, so it is on the same filesystem.
What is not covered: durability across a power loss (nothing is fsynced here; a caller that needs it
syncs inside the block); a process killed outright (SIGKILL) leaves its temporary, named
`.<dest name>.tmp-<random>`, for the caller to sweep; replacing a directory `dest` that already exists is
two steps (remove, then rename), so a crash between them leaves no `dest` at all.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """Where flywheel keeps what it builds once: `$FLYWHEEL_CACHE`, else `$XDG_CACHE_HOME/flywheel`, else
    `~/.cache/flywheel`."""
    if os.environ.get("FLYWHEEL_CACHE"):
        return Path(os.environ["FLYWHEEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flywheel"


def _prefix(dest: Path) -> str:
    return f".{dest.name}.tmp-"


@contextmanager
def building(dest: Path | str) -> Iterator[Path]:
    """A new directory beside `dest` to build in; it replaces `dest` when the block succeeds, else is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(dest), dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def writing(dest: Path | str) -> Iterator[Path]:
    """A new empty file beside `dest` to write; it replaces `dest` when the block succeeds, else is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=_prefix(dest), dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
