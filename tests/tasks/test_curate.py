"""Difficulty curation's pure parts: pass rates from trajectory records, selection, the histogram.

The curate run itself (a policy's attempts) is tested in tests/eval/test_eval_curate.py.
"""

from __future__ import annotations

import json

import pytest

from flywheel.errors import FlywheelError
from flywheel.record import Trajectory
from flywheel.tasks import load_suite
from flywheel.tasks.curate import histogram, pass_rates, select, write_curated


def rec(task_id: str, success: bool, version: int = 0) -> Trajectory:
    return Trajectory(f"{task_id}/medium/s0/0", task_id, "medium", success=success, policy_version=version)


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


def test_write_curated_keeps_the_selected_tasks_as_a_suite(clamp_task, tmp_path):
    out = tmp_path / "cur"
    records = [rec("clamp-1", True), rec("clamp-1", False)]
    rep = write_curated(out, [clamp_task], records, {"model": "m", "k": 2, "p_max": 0.75})
    assert rep["kept_ids"] == ["clamp-1"] and (rep["model"], rep["k"], rep["p_max"]) == ("m", 2, 0.75)
    assert list(rep)[:3] == ["model", "k", "p_max"]  # the settings open the report
    assert [t.id for t in load_suite(out / "tasks")] == ["clamp-1"]
    assert json.loads((out / "report.json").read_text()) == rep
    assert (
        write_curated(tmp_path / "none", [clamp_task], [rec("clamp-1", True)], {"p_max": 0.75})["kept"] == 0
    )
