"""Episode workspaces a killed process leaves behind are swept by the next process; a living process's are
not. Real processes in a private temp dir (`TMPDIR`), never the machine's own /tmp."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HOLDER = """
import time
from flywheel.sandbox.workspaces import new_workspace
ws = new_workspace()
(ws / "repo").mkdir()
(ws / "repo" / "a.py").write_text("x = 1\\n")
print(ws, flush=True)
time.sleep(600)
"""
SWEEPER = "from flywheel.sandbox.workspaces import new_workspace; print(new_workspace())"
FORKER = """
import os
from flywheel.sandbox.workspaces import new_workspace
print(new_workspace(), flush=True)
if os.fork() == 0:
    print(new_workspace(), flush=True)
    os._exit(0)
os.wait()
print(new_workspace(), flush=True)
"""


def env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp)}


@pytest.fixture
def holder(tmp_path):
    """A living process holding one workspace (with a file in it); yields the process and the workspace."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env(tmp_path)
    )
    ws = Path(proc.stdout.readline().strip())
    yield proc, ws
    proc.kill()
    proc.wait()
    proc.stdout.close()


def run(tmp: Path, code: str) -> list[Path]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(tmp), check=True
    )
    return [Path(line) for line in out.stdout.split()]


def test_a_workspace_is_made_in_its_process_own_locked_directory(holder, tmp_path):
    _, ws = holder
    assert ws.parent.parent == tmp_path and ws.name.startswith("ep-")
    assert ws.parent.name.startswith("flywheel-episodes-") and (ws.parent / ".lock").is_file()


def test_a_killed_process_workspaces_are_swept_by_the_next_process(holder, tmp_path):
    proc, ws = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (ws / "repo" / "a.py").is_file()
    [own] = run(tmp_path, SWEEPER)
    assert not ws.parent.exists()
    assert own.parent.parent == tmp_path


def test_a_living_process_workspaces_are_left_alone(holder, tmp_path):
    _, ws = holder
    run(tmp_path, SWEEPER)
    assert (ws / "repo" / "a.py").read_text() == "x = 1\n"


def test_a_forked_child_gets_its_own_directory_and_its_parent_keeps_its(tmp_path):
    before, child, after = run(tmp_path, FORKER)
    assert child.parent != before.parent and after.parent == before.parent
    assert before.is_dir() and after.is_dir()  # the child's sweep left its living parent's directory


def old(path: Path, age_s: float) -> Path:
    """A directory with a file in it, last changed `age_s` ago."""
    (path / "repo").mkdir(parents=True)
    (path / "repo" / "a.py").write_text("x = 1\n")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_a_directory_never_locked_is_swept_only_once_it_is_old(tmp_path):
    stale = old(tmp_path / "flywheel-episodes-1-stale", 11 * 60)
    young = old(tmp_path / "flywheel-episodes-2-young", 60)
    run(tmp_path, SWEEPER)
    assert not stale.exists() and young.is_dir()


def test_a_legacy_workspace_is_swept_only_once_it_is_a_day_old(tmp_path):
    stale = old(tmp_path / "flywheel-ep-stale", 25 * 3600)
    fresh = old(tmp_path / "flywheel-ep-fresh", 3600)
    other = old(tmp_path / "someone-elses", 25 * 3600)
    run(tmp_path, SWEEPER)
    assert not stale.exists() and fresh.is_dir() and other.is_dir()


SCRATCH = """
from flywheel.sandbox.workspaces import temporary_workspace
with temporary_workspace("qa-") as tmp:
    (tmp / "repo").mkdir()
    print(tmp, flush=True)
try:
    with temporary_workspace("solve-") as tmp:
        print(tmp, flush=True)
        raise RuntimeError
except RuntimeError:
    pass
"""


def test_a_temporary_workspace_is_in_the_process_directory_and_gone_after_its_block(tmp_path):
    first, second = run(tmp_path, SCRATCH)
    assert first.name.startswith("qa-") and second.name.startswith("solve-")
    assert first.parent == second.parent and first.parent.name.startswith("flywheel-episodes-")
    assert not first.exists() and not second.exists()  # removed on the way out, an exception too
