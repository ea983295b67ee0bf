"""`scripted-search` and `scripted-sweep`: one-line repairs found by search, applied with real `sed` in a real shell."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.harness import EpisodeSpec, get_effort, run_episodes
from flywheel.models.scripted import (
    SEARCH_TRIES,
    SWEEP_LOOKS,
    SWEEP_PAIRS,
    SWEEP_TRIES,
    ScriptedModel,
    function_lines,
    repair_candidates,
    searched_function,
    sweep_command,
    sweep_plan,
    try_command,
)
from flywheel.sandbox import get_sandbox
from flywheel.tasks import task_toml, write_task
from flywheel.tasks.patch import make_patch

GOOD = '''def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def span(lo, hi):
    return hi - lo


def middle(s):
    return s[len(s) // 2]
'''
BUGGY = GOOD.replace("return hi - lo", "return hi + lo")
TESTS = """from mathx import clamp, span


def test_clamp_high():
    assert clamp(6, 0, 5) == 5


def test_span():
    assert span(2, 5) == 3
"""


def test_candidates_include_the_inverse_of_the_bug_and_undo_cleanly():
    lines = function_lines("clamp", BUGGY)
    assert searched_function("`clamp(6, 0, 5)` is wrong", BUGGY) == "clamp"
    assert lines == set(range(1, 16))  # the `def` line and 20 after it, clipped to the file
    candidates = repair_candidates(BUGGY, lines)
    assert (
        (11, " +", " -") in candidates
        and (3, " <", " <=") in candidates
        and (5, " x", " not x") in candidates
    )
    assert all(c[0] in lines for c in candidates)
    text = BUGGY.splitlines()
    for line, old, new in candidates:
        repaired = text[line - 1].replace(old, new, 1)
        assert repaired != text[line - 1] and repaired.replace(new, old, 1) == text[line - 1]


@pytest.mark.parametrize("candidate", [(15, "s[len(s)", "s[len(s)"), (5, " >", " >="), (15, " //", " *")])
@pytest.mark.parametrize("passes", [True, False])
def test_try_command_keeps_a_passing_repair_and_undoes_a_failing_one(tmp_path, candidate, passes):
    line, old, new = candidate
    if old == new:  # a repair with regex metacharacters on both sides
        old, new = "s[len(s) // 2]", "s[len(s) // 2 + 1]"
    (tmp_path / "mathx.py").write_text(BUGGY)
    command = try_command("*.py", line, old, new, "true" if passes else "false")
    r = get_sandbox().run(tmp_path, ["bash", "-c", command])  # with its own /tmp, as in an episode
    after = (tmp_path / "mathx.py").read_text()
    expected = BUGGY.splitlines(keepends=True)
    expected[line - 1] = expected[line - 1].replace(old, new, 1)
    assert r.exit_code == 0 and r.output == ("fixed\n" if passes else "")
    assert after == ("".join(expected) if passes else BUGGY)


def write_clamp_task(dest: Path, instruction: str):
    return write_task(
        dest,
        toml=task_toml(
            id=dest.name,
            instruction=instruction,
            test_command="python -m pytest -q tests",
            fail_to_pass=["tests/test_mathx.py::test_span"],
            pass_to_pass=["tests/test_mathx.py::test_clamp_high"],
            timeout_s=30,
            meta={"split": "train"},
        ),
        repo={"mathx.py": BUGGY, "tests/test_mathx.py": TESTS},
        hidden_tests={"tests/test_mathx.py": TESTS},
        solution_patch=make_patch({"mathx.py": BUGGY}, {"mathx.py": GOOD}),
    )


def test_searcher_finds_the_repair_through_the_real_harness(tmp_path):
    task = write_clamp_task(tmp_path / "clamp", "`span(2, 5)` returns 7 but it should return 3.")
    recs = run_episodes(
        [EpisodeSpec(task, get_effort("max"), seed=s) for s in range(2)],
        ScriptedModel(search=True),
        concurrency=2,
    )
    for rec in recs:
        tools = [t for t in rec.turns if t["role"] == "tool"]
        assert rec.success and rec.ending == "submitted" and rec.steps_to_first_edit == 2
        assert tools[0]["text"].startswith("exit code 0\n     1\tdef clamp(x, lo, hi):")
        assert tools[-2]["text"] == "exit code 0\nfixed" and tools[-1]["name"] == "submit"
        assert all(t["text"] == "exit code 0" for t in tools[1:-2])  # the wrong repairs, each undone


def test_searcher_gives_up_after_its_quota_when_no_repair_is_the_fix(tmp_path):
    task = write_clamp_task(
        tmp_path / "clamp", "`middle('abc')` crashes."
    )  # the function called is not the bug's
    rec = run_episodes([EpisodeSpec(task, get_effort("medium"))], ScriptedModel(search=True), concurrency=1)[
        0
    ]
    tools = [t["name"] for t in rec.turns if t["role"] == "tool"]
    assert SEARCH_TRIES["medium"] == 4  # and `middle` has four candidates: all are tried
    assert not rec.success and tools == ["shell"] * (1 + 4) + ["submit"]


# ----------------------------------------------------------------------------------- scripted-sweep


@pytest.mark.parametrize(
    ("old", "new", "fixes"), [(" + ", " - ", True), (" // ", " * ", False), (" is ", " is not ", False)]
)
def test_sweep_command_keeps_the_first_passing_repair_and_restores_the_module_otherwise(
    tmp_path, old, new, fixes
):
    (tmp_path / "mathx.py").write_text(BUGGY)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mathx.py").write_text(TESTS)
    command = sweep_command(old, new, "python -m pytest -q tests")
    r = get_sandbox().run(tmp_path, ["bash", "-c", command])  # real grep, sed and pytest, its own /tmp
    assert r.exit_code == 0 and r.output == ("fixed\n" if fixes else "")
    assert (tmp_path / "mathx.py").read_text() == (GOOD if fixes else BUGGY)  # `//` is swept, no test passes


@pytest.mark.parametrize(
    ("source", "call", "old", "new"),
    [
        ("def f(x):\n    return x * 2\n", "f(4) == 2", " * ", " / "),
        ("def f(s):\n    return s[len(s) - 1 + 1]\n", "f('abc') == 'c'", " + 1]", "]"),
    ],
)
def test_sweep_command_escapes_what_sed_would_read_as_regex(tmp_path, source, call, old, new):
    (tmp_path / "m.py").write_text(source)  # unescaped, ` * ` would match the indent first
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text(f"from m import f\n\n\ndef test_f():\n    assert {call}\n")
    r = get_sandbox().run(tmp_path, ["bash", "-c", sweep_command(old, new, "python -m pytest -q tests")])
    assert r.output == "fixed\n" and (tmp_path / "m.py").read_text() == source.replace(old, new)


def test_sweep_command_is_one_text_for_every_task_of_a_test_command():
    commands = {sweep_command(o, n, "python -m pytest -q tests") for o, n in SWEEP_PAIRS}
    assert len(commands) == len(SWEEP_PAIRS)  # one per inverse operator, no line and no name in any
    assert all("mathx" not in c and "clamp" not in c for c in commands)


def test_sweeper_needs_no_oracle_and_sweeps_its_quota_per_effort(tmp_path):
    task, other = tmp_path / "clamp", tmp_path / "other"
    for d in (task, other):
        write_clamp_task(d, "`span(2, 5)` returns 7 but it should return 3.")
    (other / "solution.patch").write_text(make_patch({"mathx.py": BUGGY}, {"mathx.py": BUGGY + "\n"}))
    for effort, tries in SWEEP_TRIES.items():
        for seed in range(5):
            plan = sweep_plan(str(task), effort, seed)
            assert plan == sweep_plan(str(other), effort, seed)  # the reference fix plays no part
            sweeps = [a for a in plan if "T;=" in a.args.get("command", "")]
            assert (
                len(sweeps) == tries == len({a.args["command"] for a in sweeps}) and plan[-1].name == "submit"
            )
            assert plan[: len(plan) - tries - 1] == [
                a for a in SWEEP_LOOKS if a in plan[: len(plan) - tries - 1]
            ]


def test_sweeper_submits_after_the_sweep_that_fixes_it_through_the_real_harness(tmp_path):
    task = write_clamp_task(tmp_path / "clamp", "`span(2, 5)` returns 7 but it should return 3.")
    recs = run_episodes(
        [EpisodeSpec(task, get_effort("max"), seed=s) for s in range(4)],
        ScriptedModel(sweep=True),
        concurrency=2,
    )
    fix = sweep_command(
        " + ", " - ", "python -m pytest -q tests"
    )  # 16 of the 23 sweeps: not always among them
    for rec in recs:
        calls = [t for t in rec.turns if t["role"] == "assistant"]
        tools = [t for t in rec.turns if t["role"] == "tool"]
        swept = any(fix in t["text"] for t in calls)
        assert rec.success == swept and rec.ending == "submitted" and rec.model == "scripted-sweep"
        assert tools[-1]["name"] == "submit" and (tools[-2]["text"] == "exit code 0\nfixed") == swept
        assert "fixed" not in "".join(t["text"] for t in tools[:-2])  # every other sweep restored the module
    assert any(r.success for r in recs)
