"""Fusion through the real harness, sandbox and grader: the scripted lead with real and fake sidekicks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from flywheel.actions import (
    LEAD_TOOL_NAMES,
    TOOLS,
    Action,
    FormatError,
    parse_native,
    parse_tagged,
    render_tagged,
)
from flywheel.fusion import Fusion, FusionConfig, sidekick_report, take_overs
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, pricing_for, run_episodes
from flywheel.models.scripted import ScriptedModel
from flywheel.models.scripted_lead import ScriptedLead, plan_text
from flywheel.protocols import Completion
from flywheel.record import Trajectory
from flywheel.sandbox import get_sandbox
from flywheel.verify import default_grader


class FakeModel:
    """Answers every request with `reply(request)`; counts the requests."""

    def __init__(self, reply, name="fake"):
        self.reply, self.name, self.native_tools, self.calls = reply, name, False, 0

    def generate(self, requests):
        self.calls += len(requests)
        return [self.reply(r) for r in requests]


class Broken:
    name, native_tools = "broken", False

    def generate(self, requests):
        raise RuntimeError("the backend fell over")


def submits(r):
    return Completion("<submit/>", prompt_tokens=50, completion_tokens=3)


class Graded:
    """The shared grader, counting its calls."""

    def __init__(self):
        self.inner, self.calls = default_grader(get_sandbox()), 0

    def __call__(self, task, workspace, trajectory):
        self.calls += 1
        return self.inner(task, workspace, trajectory)


def fuse(task, sidekick, effort="medium", action_format="auto", **config):
    grader = Graded()
    cfg = HarnessConfig(action_format=action_format)
    fusion = Fusion(sidekick, HarnessConfig(action_format=action_format), FusionConfig(**config))
    [record] = fusion.rollout(ScriptedLead(), [EpisodeSpec(task, get_effort(effort))], cfg, grader=grader)
    return record, grader.calls


def tools_of(record):
    return [t["name"] for t in record.turns if t["role"] == "tool"]


@pytest.mark.parametrize("action_format", ["tagged", "native"])
def test_one_delegation_solves_the_clamp_task(clamp_task, action_format):
    record, graded = fuse(clamp_task, ScriptedModel(), action_format=action_format)
    assert record.success and record.ending == "submitted" and graded == 1
    assert tools_of(record) == ["view", "delegate", "run_tests", "submit"]
    report = next(t["text"] for t in record.turns if t.get("name") == "delegate")
    assert "-    if x >= hi + 1:" in report and "+    if x > hi:" in report  # the sidekick's diff reached it
    assert "ended with submitted" in report and "ran the tests 2 time(s)" in report
    assert report.endswith(
        "tests: fixed 1, broken 0, still failing 0; passing after the change: 1\nreview: approve"
    )
    [side] = record.sidekick
    assert side.id == f"{record.id}/sidekick1" and side.model == "scripted" and side.verdict is None
    assert tools_of(side) == ["run_tests", "view", "edit", "run_tests", "submit"]
    assert "Your lead asks:\nIn mathx.py, in `clamp`, line 5 is wrong" in side.turns[1]["text"]
    f = record.fusion
    assert f["delegations"] == 1 and f["take_overs"] == 0 and f["lead"] == "scripted-lead"
    assert f["lead_cost"] > 0 and f["sidekick_cost"] == side.cost > 0
    assert record.cost == pytest.approx(f["lead_cost"] + f["sidekick_cost"])
    back = Trajectory.from_json(json.loads(json.dumps(record.to_json())))
    assert back.to_json() == record.to_json() and back.sidekick[0].turns == side.turns


def test_a_sidekick_that_fixes_nothing_is_corrected_once_then_the_lead_takes_over(clamp_task):
    sidekick = FakeModel(submits)
    record, graded = fuse(clamp_task, sidekick)
    assert record.success and graded == 1
    assert tools_of(record) == [
        "view", "delegate", "run_tests", "delegate", "run_tests", "edit", "run_tests", "submit"
    ]  # fmt: skip
    assert record.fusion["delegations"] == 2 and record.fusion["take_overs"] == 1
    assert "(no changes)" in next(t["text"] for t in record.turns if t.get("name") == "delegate")
    assert "look again" in record.sidekick[1].turns[1]["text"] and sidekick.calls == 2
    assert [s.id.rsplit("/", 1)[1] for s in record.sidekick] == ["sidekick1", "sidekick2"]


HONEST = '    """Clamp x into [lo, hi]."""\n'
GAMED = HONEST + "    if x == 5.5:\n        return 5\n"


class GamesThenUndoes:
    """A sidekick whose first delegation special-cases the failing test's input and whose second takes
    that out again."""

    name, native_tools = "gamer", False

    def __init__(self):
        self.episodes = 0

    def generate(self, requests):
        return [self.one(r) for r in requests]

    def one(self, r):
        if not any(m["role"] == "assistant" for m in r.messages):
            self.episodes += 1
            old, new = (HONEST, GAMED) if self.episodes == 1 else (GAMED, HONEST)
            edit = Action("edit", {"path": "mathx.py", "old": old, "new": new})
            return Completion(render_tagged(edit), prompt_tokens=50, completion_tokens=20)
        return submits(r)


def test_the_review_in_the_report_stops_the_lead_submitting_a_gamed_change(clamp_task):
    record, graded = fuse(clamp_task, GamesThenUndoes())
    first, second = (t["text"] for t in record.turns if t.get("name") == "delegate")
    assert "tests: fixed 1, broken 0, still failing 0" in first  # the special case passes the test
    assert (
        first.rstrip().splitlines()[-1]
        == "review: request changes (special_cases_test_literals at mathx.py:3)"
    )
    assert second.rstrip().splitlines()[-1] == "review: approve" and "still failing 1" in second
    # no tests run on the gamed report: a correction at once; the tests after the second, then a take-over
    assert tools_of(record) == ["view", "delegate", "delegate", "run_tests", "edit", "run_tests", "submit"]
    assert record.success and graded == 1 and record.fusion["take_overs"] == 1
    # without the review, the lead runs the tests on the gamed change, they pass, and it submits it
    record, _ = fuse(clamp_task, GamesThenUndoes(), review=False)
    assert tools_of(record) == ["view", "delegate", "run_tests", "submit"] and not record.success


def test_without_the_review_the_report_is_the_sidekicks_alone(clamp_task):
    record, _ = fuse(clamp_task, ScriptedModel(), review=False)
    report = next(t["text"] for t in record.turns if t.get("name") == "delegate")
    assert "review" not in report.lower() and record.success
    assert tools_of(record) == ["view", "delegate", "run_tests", "submit"]


class Batches(FakeModel):
    """Submits at once; keeps the size of each batch it was asked for and the threads that asked."""

    def __init__(self):
        super().__init__(submits)
        self.sizes, self.threads = [], set()

    def generate(self, requests):
        self.sizes.append(len(requests))
        self.threads.add(threading.get_ident())
        return super().generate(requests)


def test_concurrent_lead_episodes_delegate_in_one_batch_from_one_thread(clamp_task):
    sidekick = Batches()
    fusion = Fusion(sidekick, HarnessConfig(), FusionConfig(gather_s=2.0))
    specs = [EpisodeSpec(clamp_task, get_effort("medium"), seed=s) for s in range(4)]
    records = fusion.rollout(ScriptedLead(), specs, HarnessConfig(), concurrency=4)
    assert all(r.success and r.fusion["delegations"] == 2 for r in records)  # corrected once, then took over
    assert sidekick.sizes == [4, 4] and len(sidekick.threads) == 1
    assert [len(r.sidekick) for r in records] == [2, 2, 2, 2]
    assert all(s.id.startswith(r.id) for r in records for s in r.sidekick)


@pytest.mark.parametrize(
    "sidekick,why",
    [
        (
            FakeModel(lambda r: Completion("", finish_reason="error", error="server down")),
            "model_error (server down)",
        ),
        (Broken(), "the sidekick crashed: RuntimeError('the backend fell over')"),
    ],
)
def test_a_sidekick_whose_model_fails_is_a_tool_result(clamp_task, sidekick, why):
    record, _ = fuse(clamp_task, sidekick)
    assert record.infra_failure is None and record.success  # the lead took over
    assert why in next(t["text"] for t in record.turns if t.get("name") == "delegate")
    assert [s.infra_failure for s in record.sidekick] == ["model_server", "model_server"]


def test_a_sidekick_out_of_budget_reports_its_ending(clamp_task):
    looks = FakeModel(lambda r: Completion('<view path="mathx.py"/>', prompt_tokens=9, completion_tokens=4))
    record, _ = fuse(clamp_task, looks, sidekick_effort="medium", max_delegations=1)
    assert record.success and record.sidekick[0].ending == "turn_limit"
    delegations = [t for t in record.turns if t.get("name") == "delegate"]
    assert "ended with turn_limit after 10 turns" in delegations[0]["text"]
    assert delegations[1]["text"].startswith("error: no delegations left") and not delegations[1]["ok"]


def test_a_plain_agent_cannot_delegate_and_the_lead_alone_solves(clamp_task):
    with pytest.raises(FormatError, match="no action found"):
        parse_tagged("<delegate>fix it</delegate>")
    with pytest.raises(FormatError, match="unknown tool"):
        parse_native({"name": "delegate", "arguments": {"instruction": "x"}})
    assert "delegate" not in {t["function"]["name"] for t in TOOLS}
    action = Action("delegate", {"instruction": "fix clamp"})
    assert parse_tagged(render_tagged(action), LEAD_TOOL_NAMES) == action
    lead = ScriptedLead()
    [record] = run_episodes([EpisodeSpec(clamp_task, get_effort("medium"))], lead, concurrency=1)
    assert record.success and tools_of(record) == ["view", "edit", "run_tests", "submit"]
    assert record.sidekick is None and "sidekick" not in record.to_json()
    assert pricing_for("scripted-lead").completion_per_m > pricing_for("scripted").completion_per_m


def test_report_and_counts_are_pure():
    side = Trajectory("t/medium/s0/0/sidekick1", "t", "medium", ending="submitted", n_turns=2, turns=[
        {"role": "tool", "name": "run_tests", "text": "exit code 1\nFAILED", "ok": True},
        {"role": "assistant", "text": "", "tool_calls": [{"name": "submit", "arguments": {}}]},
    ])  # fmt: skip
    text = sidekick_report(side, "", 1)
    assert "(no changes)" in text and "exit code 1\nFAILED" in text and "submit {}" in text
    turns = [
        {"role": "tool", "name": n, "ok": True} for n in ("edit", "delegate", "edit", "edit", "delegate")
    ]
    assert take_overs(turns) == 1
    shell = [{"role": "tool", "name": "delegate", "ok": True}, {"role": "tool", "name": "shell", "ok": True}]
    assert take_overs(shell) == 0 and take_overs([shell[0], {**shell[1], "edited": True}]) == 1  # a sweep


def test_the_plan_names_file_function_and_change(clamp_task):
    plan = plan_text(str(clamp_task.root))
    assert "mathx.py" in plan and "`clamp`" in plan and "`if x >= hi + 1:`" in plan and "`if x > hi:`" in plan


def flywheel(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "flywheel", *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def test_eval_runs_fusion_through_the_cli(clamp_task, tmp_path):
    out = tmp_path / "run"
    suite = clamp_task.root.parent
    r = flywheel("eval", "--lead", "scripted-lead", "--sidekick", "scripted", "--suite", suite, "--out", out)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["delegations_per_attempt"] == 1.0
    assert summary["take_overs_per_attempt"] == 0.0
    assert summary["mean_cost"] == pytest.approx(summary["mean_lead_cost"] + summary["mean_sidekick_cost"])
    for args, fragment in [
        (["--lead", "scripted-lead"], "--lead and --sidekick"),
        (["--lead", "scripted-lead", "--sidekick", "nope"], "unknown model 'nope'"),
        (["--model", "scripted", "--lead", "scripted-lead", "--sidekick", "scripted"], "give --model, or"),
    ]:
        r = flywheel("eval", "--suite", suite, "--out", tmp_path / "bad", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and fragment in lines[0], r.stderr


def test_compare_runs_lead_sidekick_and_pair_into_one_table_and_report(clamp_task, tmp_path):
    from flywheel.report import collect

    out, suite = tmp_path / "cmp", clamp_task.root.parent
    r = flywheel(
        "eval",
        "--compare",
        "--lead",
        "scripted-lead",
        "--sidekick",
        "scripted",
        "--suite",
        suite,
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    head, *lines = r.stdout.strip().splitlines()
    assert "success (95% CI)" in head and [line.split()[0] for line in lines] == ["lead", "sidekick", "pair"]
    rows = {row["policy"]: row for row in json.loads((out / "compare.json").read_text())["policies"]}
    assert all(rows[p]["success_rate"] == 1.0 for p in rows)
    assert rows["pair"]["delegations"] == 1.0 and rows["lead"]["delegations"] == 0.0
    assert rows["pair"]["mean_cost"] == pytest.approx(
        rows["pair"]["lead_cost"] + rows["pair"]["sidekick_cost"]
    )
    assert rows["lead"]["lead_cost"] == rows["lead"]["mean_cost"] and rows["sidekick"]["lead_cost"] == 0.0
    for name in ("lead", "sidekick", "pair"):
        assert (out / name / "summary.json").is_file()
    assert {name for name, _ in collect([out]).points} == {"lead", "sidekick", "pair"}
    page = tmp_path / "report.html"
    assert flywheel("report", out, "--out", page).returncode == 0 and page.stat().st_size > 0
    r = flywheel("eval", "--compare", "--model", "scripted", "--suite", suite, "--out", tmp_path / "bad")
    assert r.returncode == 2 and "--compare needs --lead and --sidekick" in r.stderr
