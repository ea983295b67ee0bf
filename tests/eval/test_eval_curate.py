"""Difficulty curation's attempts: a policy's pass rate per task, the kept suite, the report, the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.actions import Action, render_tagged
from flywheel.errors import FlywheelError
from flywheel.eval.curate import curate
from flywheel.models import get_model
from flywheel.protocols import Completion
from flywheel.tasks import load_suite, task_toml, write_task
from flywheel.tasks.patch import make_patch

GOOD = "def double(x):\n    return 2 * x\n"
BUGGY = "def double(x):\n    return 2 + x\n"
TESTS = "from mathx import double\n\n\ndef test_double():\n    assert double(5) == 10\n\n\ndef test_zero():\n    assert double(0) == 0\n"


class CoinModel:
    """The scripted oracle on even-numbered attempts; on odd ones, and on task `hard`, it submits at once."""

    name = "coin"
    native_tools = False

    def __init__(self):
        self.oracle = get_model("scripted")

    def generate(self, requests):
        out = []
        for r in requests:
            episode = str(r.meta.get("episode", ""))
            if episode.startswith("hard/") or int(episode.rsplit("/", 1)[-1]) % 2:
                out.append(Completion(render_tagged(Action("submit")), completion_tokens=3))
            else:
                out.extend(self.oracle.generate([r]))
        return out


def double_task(dest: Path, task_id: str):
    return write_task(
        dest,
        toml=task_toml(
            id=task_id,
            instruction="double(5) returns 7; it should be 10.",
            test_command="python -m pytest -q tests",
            fail_to_pass=["tests/test_mathx.py::test_double"],
            pass_to_pass=[],
            timeout_s=30,
        ),
        repo={"mathx.py": BUGGY, "tests/test_mathx.py": TESTS},
        hidden_tests={"tests/test_mathx.py": TESTS},
        solution_patch=make_patch({"mathx.py": BUGGY}, {"mathx.py": GOOD}),
    )


def test_curate_keeps_the_sometimes_solved_task(tmp_path):
    tasks = [double_task(tmp_path / "suite" / tid, tid) for tid in ("easy", "hard")]
    out = tmp_path / "cur"
    rep = curate(tasks, CoinModel(), out, k=2, p_max=0.75, concurrency=4)
    assert rep["rates"]["easy"] == {"successes": 1, "attempts": 2, "p": 0.5}
    assert rep["rates"]["hard"]["successes"] == 0
    assert rep["kept_ids"] == ["easy"] and rep["kept"] == 1 and rep["tasks"] == 2
    assert rep["histogram_before"]["never_solved"] == 1 and sum(rep["histogram_after"]["counts"]) == 1
    assert [t.id for t in load_suite(out / "tasks")] == ["easy"]
    assert json.loads((out / "report.json").read_text()) == rep
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 4
    assert (out / "pass_rates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(FlywheelError, match="exists"):
        curate(tasks, CoinModel(), out, k=1)


def test_curate_command_with_an_oracle(clamp_task, tmp_path):
    out = tmp_path / "cur"
    cmd = [
        sys.executable,
        "-m",
        "flywheel",
        "tasks",
        "curate",
        clamp_task.root.parent,
        "--model",
        "scripted-noisy",
        "--k",
        "2",
        "--out",
        out,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert (
        rep["rates"]["clamp-1"]["p"] == 1.0 and rep["kept"] == 0
    )  # the oracle always solves: nothing to learn
    assert rep["histogram_before"]["always_solved"] == 1 and "kept 0 of 1" in r.stdout
    r = subprocess.run(cmd[:-1] + [tmp_path / "x", "--p-max", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "p-max" in r.stderr and "Traceback" not in r.stderr
