"""The warm pytest (`flywheel.sandbox.warm`) is invisible but in time: a differential test.

One episode's worth of commands runs twice, in two copies of the same workspace: each command cold, through
`BwrapSandbox.run`, and warm, through an `EpisodeSandbox`; every command must give the same exit code,
timeout flag and output, byte for byte but for what differs between two cold runs as well (pytest's
reported durations, as `run_tests` strips them, and object addresses). The commands cover passing,
failing and erroring tests, collection and usage errors, `-x`, `-k`, `-q`, `-p no:...`, environment
variables, working directories, stdin, descriptors, umask, edits of the code under test, tests that edit
`sys.modules` and `sys.path`, /tmp, exits and signals, a timeout, a fork storm, an output flood, and the
runs that must go cold (a module that would shadow the library's, a startup variable). 55 commands for
each of four ways to call pytest: 220 in all, the first way's by default, the rest with `-m slow`.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from flywheel.protocols import Limits
from flywheel.sandbox.bwrap import BwrapSandbox, bwrap_works
from flywheel.sandbox.warm import EpisodeSandbox, empty_tmp

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="the warm pytest needs the bwrap backend")

FILES = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "tests/test_calc.py": """
        from calc import add

        def test_add():
            assert add(1, 2) == 3

        def test_zero():
            assert add(0, 0) == 0
    """,
    "tests/test_warn.py": """
        import warnings

        def test_warns():
            warnings.warn("careful", UserWarning)
    """,
    "tests/test_err.py": """
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("fixture failed")

        def test_uses(broken):
            pass
    """,
    "tests/test_print.py": """
        import sys

        def test_talks():
            for i in range(5):
                print("out", i)
                print("err", i, file=sys.stderr)
            sys.stdout.flush()
            print("last out")
            assert False, "shown with its captured output"
    """,
    "tests/test_env.py": """
        import os

        def test_env():
            print("FOO", os.environ.get("FOO"), "HASHSEED", os.environ.get("PYTHONHASHSEED"))
    """,
    "tests/test_stdin.py": """
        import sys

        def test_reads():
            print("stdin:", repr(sys.stdin.read()))
    """,
    "tests/test_state.py": """
        import os, sys

        def test_state():
            print("argv", sys.argv[1:], "path0", sys.path[0], "exe", sys.executable)
            print("flags", sys.flags.dont_write_bytecode, sys.flags.isolated, sys.flags.no_site)
            print("main", sys.modules["__main__"].__name__, getattr(sys.modules["__main__"], "__file__", None))
            print("streams", sys.__stdout__.encoding, sys.__stdout__.errors, sys.__stderr__.errors,
                  sys.__stdin__.mode, sys.__stdout__.line_buffering, sys.__stderr__.line_buffering)
            print("cwd", os.getcwd(), "tmp", sorted(os.listdir("/tmp")) == sorted(os.listdir("/tmp")))
    """,
    "mods/test_mods.py": """
        import sys

        def test_edit_modules():
            sys.modules["json"] = None
            sys.path.insert(0, "/nowhere")
            sys.setrecursionlimit(5000)
    """,
    "mods/test_after.py": """
        import sys

        def test_after():
            import json
            print("json", json.dumps([1]), "nowhere" in sys.path, sys.getrecursionlimit())
    """,
    "broken/test_syntax.py": "def test_x(:\n    pass\n",
    "broken/test_import.py": "import not_a_module_anywhere\n",
    "empty/notes.txt": "nothing to collect\n",
    "slow/test_sleep.py": """
        import time

        def test_sleeps():
            print("sleeping", flush=True)
            time.sleep(60)
    """,
    "storm/test_storm.py": """
        import os, time

        def test_storm():
            kids = []
            try:
                for _ in range(500):
                    pid = os.fork()
                    if pid == 0:
                        time.sleep(30)
                        os._exit(0)
                    kids.append(pid)
                print("unlimited")
            except OSError:
                print("limited")
    """,
    "flood/test_flood.py": """
        import sys

        def test_flood():
            for i in range(100000):
                print("line", i)
            print("tail", file=sys.stderr)
    """,
    "exits/test_exit.py": """
        import os

        def test_exit():
            print("leaving", flush=True)
            os._exit(7)
    """,
    "sig/test_sig.py": """
        import os, signal

        def test_signal():
            os.kill(os.getpid(), signal.SIGTERM)
    """,
    "kbd/test_kbd.py": """
        def test_interrupt():
            raise KeyboardInterrupt
    """,
    "exitconf/conftest.py": "raise SystemExit(3)\n",
    "exitconf/test_a.py": "def test_a():\n    pass\n",
    "tmpread/test_tmp.py": """
        def test_reads_tmp():
            print(open("/tmp/a").read())
    """,
    "tmpwrite/test_tmpw.py": """
        def test_writes_tmp(tmp_path):
            open("/tmp/b", "w").write("from the test")
            print(tmp_path.name)
    """,
    "fds/test_fd3.py": """
        import os

        def test_fd3():
            os.write(3, b"to fd 3\\n")
    """,
    "umask/test_umask.py": """
        import os

        def test_umask():
            mask = os.umask(0)
            print("umask", oct(mask))
    """,
    "threads/test_thread.py": """
        import atexit, threading, time

        def late():
            time.sleep(0.2)
            print("thread done", flush=True)

        def test_thread():
            atexit.register(print, "atexit ran")
            threading.Thread(target=late).start()
    """,
}

SCENARIOS = [
    "{pt} -q tests/test_calc.py",
    "{pt} -q tests/test_calc.py -k zero",
    "{pt} -x tests/test_calc.py",
    "{pt} -q -k 'not zero' tests/test_calc.py",
    "{pt} tests/test_calc.py -rA",
    "{pt} -q -p no:cacheprovider tests/test_calc.py",
    "{pt} -q --tb=line tests/test_calc.py",
    "{pt} -q --tb=no tests/test_calc.py; echo rc=$?",
    "{pt} -q tests/test_warn.py",
    "{pt} -q -p no:warnings tests/test_warn.py",
    "{pt} -q -W error tests/test_warn.py",
    "{pt} -q tests/test_err.py",
    "{pt} -q broken",
    "{pt} -q broken/test_import.py",
    "{pt} -q empty; echo rc=$?",
    "{pt} --no-such-option",
    "{pt} -q no_such_file.py",
    "{pt} --version",
    "{pt} --co -q tests/test_calc.py",
    "{pt} -q -s tests/test_print.py",
    "{pt} -q tests/test_print.py",
    "FOO=bar {pt} -q -s tests/test_env.py",
    "PYTHONHASHSEED=0 {pt} -q -s tests/test_env.py",
    "cd tests && {pt} -q test_calc.py",
    "cd tests && {pt} -q -s ../tests/test_state.py",
    "{pt} -q -s tests/test_state.py",
    "echo hello | {pt} -q -s tests/test_stdin.py",
    "{pt} -q -s tests/test_stdin.py < /dev/null",
    "sed -i 's/a - b/a + b/' calc.py && {pt} -q tests/test_calc.py",
    'for i in 1 2 3; do sed -i "s/return .*/return a + b + $i - 1/" calc.py; {pt} -q tests/test_calc.py; done',
    "sed -i 's/return .*/return a + b/' calc.py && {pt} -q tests/test_calc.py",
    "{pt} -q mods/test_mods.py; {pt} -q -s mods/test_after.py",
    "{pt} -q -s mods/test_mods.py mods/test_after.py",
    "{pt} -q slow/test_sleep.py",
    "timeout 1 {pt} -q slow/test_sleep.py; echo rc=$?",
    "timeout -s KILL 1 {pt} -q slow/test_sleep.py; echo rc=$?",
    "{pt} -q -s storm/test_storm.py",
    "{pt} -q -s flood/test_flood.py",
    "{pt} -q -s exits/test_exit.py; echo rc=$?",
    "{pt} -q -s sig/test_sig.py; echo rc=$?",
    "{pt} -q kbd/test_kbd.py",
    "{pt} -q exitconf; echo rc=$?",
    "echo data > /tmp/a && {pt} -q -s tmpread/test_tmp.py",
    "{pt} -q -s tmpwrite/test_tmpw.py && cat /tmp/b",
    "ls -a /tmp; cat /tmp/b",
    "{pt} -q -s fds/test_fd3.py 3>&1",
    "umask 077 && {pt} -q -s umask/test_umask.py",
    "{pt} -q tests/test_calc.py -k zero & wait; echo done",
    "{pt} -q -s threads/test_thread.py",
    "cp calc.py inspect.py && {pt} -q tests/test_calc.py; rm inspect.py",
    "PYTHONPATH=. {pt} -q tests/test_calc.py",
    "{pt} -q -p calc tests/test_calc.py",
    "python -c 'import sys; print(sys.executable, sys.prefix, sys.argv)'",
    "cd /tmp && {pt} -q /workspace/tests/test_calc.py",
    "{pt} -q tests",
]
RUNNERS = ["python -m pytest", "pytest", "python3 -m pytest", "python3.11 -m pytest"]
# What differs between two cold runs too: pytest's durations (as run_tests strips them), object addresses.
NOISE = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?| at 0x[0-9a-f]+|0x[0-9a-f]{6,}")
LIMITS = Limits(timeout_s=4, output_bytes=16_384)


def make_workspace(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


@pytest.mark.parametrize(
    "runner", [RUNNERS[0], *(pytest.param(r, marks=pytest.mark.slow) for r in RUNNERS[1:])]
)
def test_warm_runs_match_cold_ones(tmp_path: Path, runner: str) -> None:
    sandbox = BwrapSandbox()
    cold_ws, warm_ws = make_workspace(tmp_path / "cold"), make_workspace(tmp_path / "warm")
    with EpisodeSandbox.open(sandbox, warm_ws) as episode:
        for scenario in SCENARIOS:
            command = ["bash", "-c", scenario.format(pt=runner)]
            cold = sandbox.run(cold_ws, command, limits=LIMITS)
            warm = episode.run(command, limits=LIMITS)
            assert (warm.exit_code, warm.timed_out) == (cold.exit_code, cold.timed_out), scenario
            assert NOISE.sub("", warm.output) == NOISE.sub("", cold.output), scenario
        assert episode.broken is None
        # the runs that must go cold did (shadowing, startup variables), and most others were warm
        assert episode.cold_runs >= 3
        assert episode.warm_runs >= 50


def test_a_command_leaves_nothing_for_the_next(tmp_path: Path) -> None:
    """Processes a warm run started are gone when its command returns; /tmp is emptied between commands."""
    ws = make_workspace(tmp_path / "ws")
    (ws / "daemon").mkdir()
    (ws / "daemon" / "test_daemon.py").write_text(
        "import os, subprocess\n\ndef test_daemon():\n"
        "    subprocess.Popen(['setsid', 'sleep', '300'])\n"
        "    open('/tmp/left', 'w').write('x')\n"
    )
    with EpisodeSandbox.open(BwrapSandbox(), ws) as episode:
        first = episode.run(["bash", "-c", "python -m pytest -q daemon"], limits=LIMITS)
        assert first.exit_code == 0, first.output
        look = ["bash", "-c", "ls /tmp; ps -eo comm | grep -c sleep"]
        after = episode.run(look, limits=LIMITS)
        cold = BwrapSandbox().run(ws, look, limits=LIMITS)  # /tmp holds a runtime that lives under /tmp
        assert after.output == cold.output and after.output.split()[-1] == "0"
        assert episode.warm_runs == 1


def test_the_parent_killed_by_a_command_costs_only_time(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws")
    (ws / "killer").mkdir()
    (ws / "killer" / "test_kill.py").write_text(
        "import os, signal\n\ndef test_kill():\n    os.kill(os.getppid(), signal.SIGKILL)\n"
    )
    with EpisodeSandbox.open(BwrapSandbox(), ws) as episode:
        episode.run(["bash", "-c", "python -m pytest -q killer"], limits=LIMITS)
        again = episode.run(["bash", "-c", "python -m pytest -q tests/test_calc.py -k zero"], limits=LIMITS)
        assert again.exit_code == 0 and "1 passed" in again.output


def test_empty_tmp_keeps_the_runtime_mount_points(tmp_path: Path) -> None:
    (tmp_path / "checkout" / ".venv").mkdir(parents=True)
    (tmp_path / "checkout" / "stray").write_text("x")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "f").write_text("x")
    (tmp_path / "locked").chmod(0)
    (tmp_path / "file").write_text("x")
    empty_tmp(tmp_path, {"checkout", "checkout/.venv"})
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "checkout",
        "checkout/.venv",
    ]


def test_the_fallback_backend_has_no_warm_parent(tmp_path: Path) -> None:
    from flywheel.sandbox.fallback import FallbackSandbox

    assert EpisodeSandbox.open(FallbackSandbox(), tmp_path) is None
    shutil.rmtree(tmp_path, ignore_errors=True)
