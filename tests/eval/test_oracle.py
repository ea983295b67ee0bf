"""The scripted oracle solves the built-in suites through the real harness, sandbox and grader.

A task the oracle cannot solve is a broken task (its reference solution does not pass its own hidden
tests through the tools) or a broken harness; either way the suite's numbers would be wrong. The default
run checks a handful of tasks spread over each suite; the slow run checks every task of toybugs held-out
and of humaneval.
"""

from __future__ import annotations

import pytest

from flywheel.eval import summarize
from flywheel.harness import EpisodeSpec, get_effort, run_episodes
from flywheel.models.scripted import ScriptedModel
from flywheel.record import Trajectory
from flywheel.tasks import load_suite

SUITES = [("toybugs", "heldout"), ("humaneval", None)]
HANDFUL = 3


def spread(tasks: list, n: int) -> list:
    """`n` tasks evenly spaced over the suite (first and last included), so each run sees varied tasks."""
    if n >= len(tasks):
        return tasks
    return [tasks[round(i * (len(tasks) - 1) / (n - 1))] for i in range(n)]


def solve_all(tasks: list, concurrency: int) -> list[Trajectory]:
    specs = [EpisodeSpec(t, get_effort("medium")) for t in tasks]
    return run_episodes(specs, ScriptedModel(), concurrency=concurrency)


def assert_all_solved(tasks: list, records: list[Trajectory]) -> None:
    assert len(records) == len(tasks)
    failed = [(r.task_id, r.ending, r.error, r.verdict and r.verdict.error) for r in records if not r.success]
    assert failed == []
    summary = summarize(records)
    assert summary["success_rate"] == 1.0 and summary["cheats"] == 0
    assert summary["endings"] == {"submitted": len(tasks)}
    assert {r.task_id for r in records} == {t.id for t in tasks}


@pytest.mark.parametrize("suite,split", SUITES)
def test_oracle_solves_a_handful_of_each_suite(suite, split):
    tasks = spread(load_suite(suite, split=split), HANDFUL)
    assert len(tasks) == HANDFUL
    assert_all_solved(tasks, solve_all(tasks, concurrency=HANDFUL))


@pytest.mark.slow
@pytest.mark.parametrize("suite,split", SUITES)
def test_oracle_solves_every_task(suite, split):
    tasks = load_suite(suite, split=split)
    assert len(tasks) >= 100
    assert_all_solved(tasks, solve_all(tasks, concurrency=8))
