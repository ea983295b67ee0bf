"""Difficulty curation: pass rates from trajectory records, selection, and the real curate run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.harness.actions import Action, render_tagged
from flywheel.models import get_model
from flywheel.protocols import Completion
from flywheel.tasks import load_suite, task_toml, write_task
from flywheel.tasks.curate import curate, histogram, pass_rates, select
from flywheel.tasks.patch import make_patch

GOOD = "def double(x):\n    return 2 * x\n"
BUGGY = "def double(x):\n    return 2 + x\n"
TESTS = "from mathx import double\n\n\ndef test_double():\n    assert double(5) == 10\n\n\ndef test_zero():\n    assert double(0) == 0\n"


def rec(task_id: str, success: bool, version: int = 0) -> dict:
    return {"task_id": task_id, "success": success, "policy_version": version}


def test_pass_rates_count_successes_and_attempts():
    records = [rec("a", True), rec("a", False), rec("b", False), rec("a", True, 3), rec("c", True, 4)]
    assert pass_rates(records) == {"a": (2, 3), "b": (0, 1), "c": (1, 1)}
    assert pass_rates(records, min_policy_version=3) == {"a": (1, 1), "c": (1, 1)}
    assert pass_rates([]) == {}


def test_select_keeps_occasional_successes_and_unmeasured_tasks():
    rates = {"never": (0, 8), "once": (1, 8), "half": (4, 8), "most": (6, 8), "always": (8, 8)}
    assert select(rates, 0.75) == ["half", "most", "once"]
    assert select(rates, 0.5) == ["half", "once"]
    assert select(rates, 1.0) == ["always", "half", "most", "once"]
    pool = ["new", "always", "once", "never"]
    assert select(rates, 0.75, task_ids=pool) == ["new", "once"]  # never attempted: eligible, in pool order
    assert select(rates, 0.75, task_ids=pool, min_attempts=16) == pool  # nothing measured well enough yet
    assert select(rates, 0.75, p_min=0.2) == ["half", "most"]
    for bad in ((0.0, 0.0), (1.5, 0.0), (0.5, 0.5)):
        with pytest.raises(FlywheelError):
            select(rates, bad[0], p_min=bad[1])


def test_recuration_drops_mastered_tasks_and_lets_waiting_ones_back():
    early = [rec("t1", s, 0) for s in (True, False, False, False)] + [rec("t2", False, 0)] * 4
    later = [rec("t1", True, 5)] * 4  # the policy now always solves t1; t2 was not attempted again
    records = early + later
    assert select(pass_rates(early), 0.75, task_ids=["t1", "t2"]) == ["t1"]  # t2 never solved: it waits
    assert select(pass_rates(records), 0.75, task_ids=["t1", "t2"]) == ["t1"]  # 5 of 8 over all time
    # re-curating over recent attempts only: t1 is mastered and drops out, t2 is unmeasured and comes back
    assert select(pass_rates(records, min_policy_version=5), 0.75, task_ids=["t1", "t2"]) == ["t2"]


def test_histogram_bins_and_extremes():
    h = histogram({"a": (0, 4), "b": (1, 4), "c": (4, 4), "d": (2, 4), "e": (0, 0)}, bins=4)
    assert h["edges"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert h["counts"] == [1, 1, 1, 1]  # 0, 0.25, 0.5, and 1.0 in the closed last bin
    assert (h["never_solved"], h["always_solved"], h["not_attempted"]) == (1, 1, 1)


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
