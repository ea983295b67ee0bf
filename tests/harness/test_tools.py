"""The `edit` tool on a real workspace: exact replacement, and the indentation-shifted fallback; what counts
as an edit."""

from __future__ import annotations

import pytest

from flywheel.actions import Action
from flywheel.harness.tools import Tools, reindented_edit

SOURCE = "def f(x):\n    if x > 1:\n        return x\n    return 0\n\n\ndef g(x):\n    return 0\n"


@pytest.fixture
def tools(clamp_task, tmp_path):
    (tmp_path / "a.py").write_text(SOURCE)
    return Tools(clamp_task, tmp_path, sandbox=None)


def edit(tools, old, new):
    return tools.execute(Action("edit", {"path": "a.py", "old": old, "new": new}))


def test_an_exact_unique_old_text_is_replaced(tools, tmp_path):
    r = edit(tools, "    if x > 1:\n", "    if x >= 1:\n")
    assert r.edited and r.text == "edited a.py at line 2"
    assert (tmp_path / "a.py").read_text() == SOURCE.replace("x > 1", "x >= 1")


def test_an_old_text_that_is_missing_or_repeated_changes_nothing(tools, tmp_path):
    assert edit(tools, "if y:\n", "").text == "error: the old text was not found in a.py"
    assert (
        edit(tools, "    return 0\n", "").text
        == "error: the old text was found 2 times; make it unique in a.py"
    )
    assert (tmp_path / "a.py").read_text() == SOURCE


def test_an_old_text_with_other_indentation_is_matched_and_new_is_shifted_alike(tools, tmp_path):
    r = edit(
        tools, "        if x > 1:\n            return x\n\n", "        if x >= 1:\n            return x + 1\n"
    )
    assert r.edited and r.text.startswith(
        "edited a.py at line 2 (the old text matched with other indentation)"
    )
    assert (tmp_path / "a.py").read_text() == SOURCE.replace("x > 1", "x >= 1").replace(
        "return x\n", "return x + 1\n"
    )
    r = edit(tools, "if x >= 1:\n", "if x > 2:\n")  # shifted the other way: indentation added to new
    assert r.edited and "    if x > 2:\n" in (tmp_path / "a.py").read_text()


def test_the_fallback_needs_one_match_and_one_shift():
    assert reindented_edit(SOURCE, "  return 0\n", "") is None  # two runs match
    assert reindented_edit(SOURCE, "  if x > 1:\n  return x\n", "") is None  # shifts 2 and 6 differ
    assert reindented_edit(SOURCE, "\n\n", "x") is None  # nothing but blank lines
    assert reindented_edit(SOURCE, "  if x > 1:\n", "") == (SOURCE.replace("    if x > 1:\n", ""), 2)


def test_a_shell_command_that_writes_a_file_is_an_edit_and_test_caches_are_not(clamp_task, tmp_path):
    from flywheel.sandbox import get_sandbox

    (tmp_path / "a.py").write_text(SOURCE)
    tools = Tools(clamp_task, tmp_path, sandbox=get_sandbox())
    shell = lambda command: tools.execute(Action("shell", {"command": command}))  # noqa: E731
    assert not shell("cat a.py").edited
    assert not shell("mkdir -p __pycache__ .pytest_cache && touch __pycache__/a.pyc .pytest_cache/x").edited
    r = shell("sed -i 's/x > 1/x >= 1/' a.py")
    assert r.edited and (tmp_path / "a.py").read_text() == SOURCE.replace("x > 1", "x >= 1")


def test_run_tests_reads_the_same_on_every_run(clamp_task, tmp_path):
    """pytest's summary line carries its wall time; run_tests leaves it out, so an episode can repeat."""
    import shutil

    from flywheel.sandbox import get_sandbox

    shutil.copytree(clamp_task.repo, tmp_path / "ws")
    tools = Tools(clamp_task, tmp_path / "ws", sandbox=get_sandbox())
    first, second = (tools.execute(Action("run_tests")).text for _ in range(2))
    assert first == second
    summary = first.splitlines()[-1]
    assert "failed" in summary and " in " not in summary and not summary.endswith("s")


def test_a_call_no_file_system_can_take_is_refused_not_raised(clamp_task, tmp_path):
    from flywheel.sandbox import get_sandbox

    (tmp_path / "a.py").write_text(SOURCE)
    tools = Tools(clamp_task, tmp_path, sandbox=get_sandbox())
    for action in (
        Action("view", {"path": "a\0.py"}),
        Action("shell", {"command": "cat a.py\0"}),
        Action("edit", {"path": "a.py", "old": "x\0", "new": ""}),
    ):
        r = tools.execute(action)
        assert not r.ok and r.text == f"error: the {action.name} call holds a NUL byte"
    for action in (
        Action("view", {"path": "x" * 300 + ".py"}),
        Action("edit", {"path": "d/" + "x" * 300, "old": "", "new": "1"}),
    ):
        r = tools.execute(action)
        assert not r.ok and r.text.endswith("is longer than 255 bytes"), r.text
    for action in (
        Action("view", {"path": "a.py/b.py"}),
        Action("edit", {"path": "a.py/b.py", "old": "", "new": "1"}),
    ):
        r = tools.execute(action)  # a file taken for a directory
        assert not r.ok and r.text.startswith("error: "), r.text
    assert (tmp_path / "a.py").read_text() == SOURCE and not (tmp_path / "d").exists()


class RaisingSandbox:
    name = "raising"

    def __init__(self, exc: Exception):
        self.exc = exc

    def run(self, workspace, argv, **kw):
        raise self.exc


@pytest.mark.parametrize("exc", [OSError("no bwrap"), RuntimeError("cgroup gone")])
def test_a_sandbox_that_raises_is_a_sandbox_error_not_the_commands_output(clamp_task, tmp_path, exc):
    tools = Tools(clamp_task, tmp_path, sandbox=RaisingSandbox(exc))
    for action in (Action("shell", {"command": "ls"}), Action("run_tests")):
        r = tools.execute(action)
        assert not r.ok and r.sandbox_error == f"{type(exc).__name__}: {exc}"
        assert str(exc) not in r.text  # nothing the model could take for the command's output
