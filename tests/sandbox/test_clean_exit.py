"""Nothing of the sandbox outlives its process: a clean exit removes what it made in the temp dir (a
`multiprocessing` child's too, which skips `atexit`), and what a killed process left (its workspaces, its
warm pytest directory, its /etc copy, its run cgroup) goes at the next process's first sandbox run. Real
processes in a private temp dir (`TMPDIR`), the real bwrap where the host has it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.sandbox import available_backends
from flywheel.sandbox.cgroups import cgroup_host

RUN_ONE = """
import shutil
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.workspaces import new_workspace

def work():
    ws = new_workspace()
    assert get_sandbox().run(ws, ["true"]).exit_code == 0
    shutil.rmtree(ws)
"""
POOL_AND_MAIN = (
    RUN_ONE
    + """
if __name__ == "__main__":
    import multiprocessing as mp
    child = mp.get_context("forkserver").Process(target=work)
    child.start()
    child.join()
    assert child.exitcode == 0
    work()
"""
)
THREADS = (
    RUN_ONE
    + """
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda _: work(), range(8)))
import pathlib, tempfile
print(len(list(pathlib.Path(tempfile.gettempdir()).glob("flywheel-episodes-*/etc-*"))), flush=True)
"""
)
WARM_THEN_SLEEP = """
import sys, threading
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.warm import EpisodeSandbox
from flywheel.sandbox.workspaces import new_workspace
ws = new_workspace()
(ws / "test_a.py").write_text("def test_a():\\n    pass\\n")
episode = EpisodeSandbox.open(get_sandbox(), ws)
print(episode.run(["python", "-m", "pytest", "-q"]).exit_code, episode.dir, flush=True)
get_sandbox().run(ws, ["sleep", "600"])
"""


def run(tmp: Path, code: str) -> str:
    """Run `code` as a script (a forkserver child imports its `__main__` from the file) with TMPDIR `tmp`."""
    script = tmp.parent / "script.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp)}
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp"


def test_a_clean_exit_leaves_nothing_in_the_temp_dir_multiprocessing_children_included(tmp):
    run(tmp, POOL_AND_MAIN)
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("flywheel-")) == []


def test_threads_starting_their_first_sandbox_at_once_make_one_etc_copy(tmp):
    assert run(tmp, THREADS).split() == ["1"]


NEXT = {
    "runs_a_command": RUN_ONE + "work()\n",
    "sweeps": "from flywheel.sandbox import sweep_dead\nsweep_dead()\n",  # a supervisor after a kill
}


@pytest.mark.skipif("bwrap" not in available_backends(), reason="the warm parent needs bwrap")
@pytest.mark.parametrize("then", sorted(NEXT))
def test_what_a_killed_process_left_goes_with_the_next_process(tmp, then):
    """Killed as a sandboxed command starts, after a warm pytest run: its directory (workspace, warm pytest
    directory, /etc copy) and its run cgroup are there, then gone once another process has run one
    command (or called `sweep_dead()`), and no process of its sandbox is left (a command started just
    before bwrap's `--die-with-parent` took hold would run on: the next process kills it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WARM_THEN_SLEEP], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    code, episode_dir = proc.stdout.readline().split()
    assert code == "0" and Path(episode_dir).parent.parent == tmp
    host = cgroup_host()
    parents = [*host.v1.values(), *([host.v2] if host.v2 else [])]
    deadline = time.monotonic() + 30
    while not (cgroups := [c for p in parents for c in p.glob(f"flywheel-{proc.pid}-*")]) and parents:
        assert time.monotonic() < deadline, "the sleep's cgroup never appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    [left] = [p for p in tmp.iterdir() if p.name.startswith("flywheel-")]
    assert Path(episode_dir).is_dir() and any(p.name.startswith("etc-") for p in left.iterdir())
    run(tmp, NEXT[then])
    assert [p.name for p in tmp.iterdir() if p.name.startswith("flywheel-")] == []
    assert not any(c.exists() for c in cgroups)
    assert not bwrap_processes_naming(tmp)


def bwrap_processes_naming(path: Path) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if os.fsencode(str(path)) in cmdline and int(entry.name) != os.getpid():
                found.append(int(entry.name))
    return found
