"""`scripted-sweep-lead` through the real harness, sandbox and grader on toybugs held-out tasks: alone it is
`scripted-sweep`; as Fusion's lead it delegates the search, reviews, corrects once, then sweeps itself."""

from __future__ import annotations

import pytest

from flywheel.actions import Action
from flywheel.fusion import Fusion
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, pricing_for, run_episodes
from flywheel.models import get_model
from flywheel.models.scripted import ScriptedModel, sweep_command
from flywheel.models.sweep_lead import (
    CORRECTION,
    DELEGATION,
    RUN,
    SUBMIT,
    SweepLead,
    lead_action,
    summary_text,
    trail,
)
from flywheel.protocols import Completion, Request
from flywheel.sandbox import get_sandbox
from flywheel.tasks import load_suite
from flywheel.tasks.patch import parse_patch
from flywheel.verify import default_grader

# toybugs-ledger-0002's bug is `if account not in self.balances:`; the sweep for ` not in ` -> ` in `
# fixes it. At medium effort (4 sweeps) scripted-sweep's order for the episode of seed 0 holds that sweep,
# for seed 3 it does not: one attempt it solves and one it does not.
SOLVED, UNSOLVED = 0, 3
FIX_SWEEP = sweep_command(" not in ", " in ", "python -m pytest -q tests")


@pytest.fixture(scope="module")
def heldout():
    return {t.id: t for t in load_suite("toybugs", split="heldout")}


@pytest.fixture(scope="module")
def ledger(heldout):
    return heldout["toybugs-ledger-0002"]


def specs(task, *seeds, effort="medium", **budgets):
    return [EpisodeSpec(task, get_effort(effort, **budgets), seed=s) for s in seeds]


@pytest.fixture(scope="module")
def sweeper(ledger):
    """scripted-sweep's own records on the ledger task (tagged), by seed."""
    records = run_episodes(specs(ledger, SOLVED, UNSOLVED), ScriptedModel(sweep=True), concurrency=2)
    return {r.id.split("/")[2]: r for r in records}


def actions(record):
    return [(t["name"], t.get("arguments")) for t in record.turns if t["role"] == "tool"]


def tools_of(record):
    return [t["name"] for t in record.turns if t["role"] == "tool"]


def instructions(record):
    return [args["instruction"] for name, args in actions(record) if name == "delegate"]


class Graded:
    """The shared grader, counting its calls."""

    def __init__(self):
        self.inner, self.calls = default_grader(get_sandbox()), 0

    def __call__(self, task, workspace, trajectory):
        self.calls += 1
        return self.inner(task, workspace, trajectory)


class Submits:
    """A sidekick that submits at once, having changed nothing."""

    name, native_tools = "submits", False

    def generate(self, requests):
        return [Completion("<submit/>", prompt_tokens=50, completion_tokens=3) for _ in requests]


def fix_lines(task):
    """The text the reference fix writes: its added lines, stripped."""
    return [
        ln[1:].strip()
        for fp in parse_patch(task.solution_patch)
        for _, b in fp.hunks
        for ln in b
        if ln[0] == "+"
    ]


def test_alone_it_takes_scripted_sweeps_actions(ledger, sweeper):
    records = run_episodes(specs(ledger, SOLVED, UNSOLVED), SweepLead(), concurrency=2)
    for record in records:
        own = sweeper[record.id.split("/")[2]]
        assert actions(record) == actions(own) and record.success == own.success
        assert record.model == "scripted-sweep-lead" and own.model == "scripted-sweep"
        assert record.cost > own.cost  # the same tokens at a frontier model's rates
    assert {r.id.split("/")[2]: r.success for r in records} == {"s0": True, "s3": False}
    [native] = run_episodes(specs(ledger, SOLVED), SweepLead(), cfg=HarnessConfig(action_format="native"))
    assert actions(native) == actions(sweeper["s0"]) and native.success
    assert any((args or {}).get("command") == FIX_SWEEP for _, args in actions(native))


@pytest.mark.parametrize(
    ("action_format", "ids"),
    [
        ("tagged", ["toybugs-ledger-0002", "toybugs-ledger-0003", "toybugs-ledger-0007"]),
        ("native", ["toybugs-ledger-0007"]),
    ],
)
def test_with_a_real_sidekick_it_delegates_reviews_and_submits(heldout, action_format, ids):
    tasks = [heldout[i] for i in ids]
    grader, cfg = Graded(), HarnessConfig(action_format=action_format)
    fusion = Fusion(ScriptedModel(), HarnessConfig(action_format=action_format))
    records = fusion.rollout(SweepLead(), [s for t in tasks for s in specs(t, 0)], cfg, grader=grader)
    assert grader.calls == len(tasks) and [r.task_id for r in records] == ids
    for record, task in zip(records, tasks, strict=True):
        assert record.success and record.ending == "submitted" and record.verdict is not None
        assert tools_of(record) == ["delegate", "run_tests", "submit"]
        assert instructions(record) == [DELEGATION]
        assert not any(line in DELEGATION for line in fix_lines(task))
        [side] = record.sidekick
        assert f"Your lead asks:\n{DELEGATION}" in side.turns[1]["text"] and side.model == "scripted"
        f = record.fusion
        assert f["lead"] == "scripted-sweep-lead" and f["delegations"] == 1 and f["lead_cost"] > 0


def test_with_a_failing_sidekick_it_corrects_once_then_sweeps_itself(ledger, sweeper):
    grader = Graded()
    records = Fusion(Submits()).rollout(
        SweepLead(), specs(ledger, SOLVED, UNSOLVED), HarnessConfig(), concurrency=2, grader=grader
    )
    assert grader.calls == 2
    for record in records:
        own = sweeper[record.id.split("/")[2]]
        sweeps = [a for a in actions(own) if a[0] == "shell" and "T;=" in a[1]["command"]]
        assert actions(record)[:4] == [
            ("delegate", {"instruction": DELEGATION}), ("run_tests", {}),
            ("delegate", {"instruction": CORRECTION}), ("run_tests", {}),
        ]  # fmt: skip
        assert actions(record)[4:] == [*sweeps, ("submit", {})]  # its own sweeps, in scripted-sweep's order
        assert record.success == own.success and record.fusion["delegations"] == 2
        assert f"Your lead asks:\n{CORRECTION}" in record.sidekick[1].turns[1]["text"]
        assert not any(line in i for i in instructions(record) for line in fix_lines(ledger))
    assert [r.success for r in records] == [True, False]  # sorted by id: s0, s3


def test_a_summary_restarts_it_where_it_was(ledger):
    lead = SweepLead()
    lead.max_context = 1500  # small enough that the harness asks for a summary after the second review
    cfg = HarnessConfig(compaction="summary")
    [record] = Fusion(Submits()).rollout(lead, specs(ledger, SOLVED, max_turns=20), cfg)
    restarts = [t["text"] for t in record.turns if t.get("name") == "compaction"]
    assert restarts and set(restarts) == {"summary"}
    assert [n for n in tools_of(record) if n != "compaction"] == [
        "delegate", "run_tests", "delegate", "run_tests", "shell", "shell", "shell", "shell", "submit"
    ]  # fmt: skip
    assert record.success


def test_its_steps_and_summary_are_pure():
    takeover = [Action("shell", {"command": "sweep 1"}), Action("shell", {"command": "sweep 2"}), SUBMIT]
    d, failing, passing = ("delegate", ""), ("run_tests", "failing"), ("run_tests", "passing")
    assert lead_action([], takeover) == Action("delegate", {"instruction": DELEGATION})
    assert lead_action([d], takeover) == RUN
    assert lead_action([d, passing], takeover) == SUBMIT
    assert lead_action([d, failing], takeover) == Action("delegate", {"instruction": CORRECTION})
    assert lead_action([d, failing, d, failing], takeover) == takeover[0]
    assert lead_action([d, failing, d, failing, ("shell", "")], takeover) == takeover[1]
    assert lead_action([d, failing, d, failing, ("shell", "fixed")], takeover) == SUBMIT
    assert lead_action([d, failing, d, failing, ("shell", ""), ("shell", "")], takeover) == SUBMIT
    steps = [d, failing, d, failing, ("shell", "fixed")]
    text = summary_text("t", steps)
    assert text.endswith("Steps done: 5.")
    messages = [
        {"role": "system", "content": "..."},
        {"role": "user", "content": "the task"},
        {"role": "user", "content": f"Your summary of the work so far: {text}\n\nThe output: exit code 0"},
    ]
    assert trail(messages) == steps
    messages += [{"role": "assistant", "content": "<submit/>"}]
    assert trail(messages) == [*steps, ("submit", "")]


def test_it_is_named_seeded_and_priced_as_a_frontier_lead():
    lead = get_model("scripted-sweep-lead", seed=3)
    assert isinstance(lead, SweepLead) and lead.seed == 3 and lead.alone.seed == 3
    assert pricing_for("scripted-sweep-lead") == pricing_for("scripted-lead") != pricing_for("scripted")
    [c] = lead.generate([Request(messages=[{"role": "user", "content": "a task"}])])
    assert c.finish_reason == "error" and "task_dir" in c.error
