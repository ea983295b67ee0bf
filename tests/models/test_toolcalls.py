"""A served model's text as the client's tool calls: pure functions, and the edit script run for real."""

from __future__ import annotations

import subprocess

from flywheel.actions import TOOLS, Action
from flywheel.models.toolcalls import action_call, offered_tools, parse_text_action, text_tool_calls

BASH = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def test_tagged_actions_map_to_same_named_tools_and_keep_the_thought():
    content, [call] = text_tool_calls('The bound is off. <view path="mathx.py" start="2"/>', TOOLS)
    assert content == "The bound is off." and call == {
        "name": "view",
        "arguments": {"path": "mathx.py", "start": 2},
    }
    assert text_tool_calls("<submit/>", TOOLS) == ("", [{"name": "submit", "arguments": {}}])


def test_a_bash_client_gets_shell_equivalents():
    tools = offered_tools(BASH)
    assert action_call(Action("shell", {"command": "ls"}), tools) == {
        "name": "bash",
        "arguments": {"command": "ls"},
    }
    view = action_call(Action("view", {"path": "a b.py", "start": 3, "end": 9}), tools)
    assert view["arguments"]["command"] == "cat -n 'a b.py' | sed -n '3,9p'"
    assert action_call(Action("run_tests"), tools)["arguments"]["command"] == "python -m pytest -q"
    submit = {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
    assert action_call(Action("submit"), tools) == submit  # mini-swe-agent's "done" line
    assert text_tool_calls("<submit/>", BASH) == ("", [submit])
    assert action_call(Action("delegate", {"instruction": "fix it"}), tools) is None  # stays text


def test_fenced_shell_blocks_and_plain_text():
    text = "Let me look.\n```bash\ngrep -n clamp mathx.py\n```\n"
    assert parse_text_action(text) == (
        Action("shell", {"command": "grep -n clamp mathx.py"}),
        "Let me look.\n",
    )
    assert text_tool_calls(text, BASH)[1] == [
        {"name": "bash", "arguments": {"command": "grep -n clamp mathx.py"}}
    ]
    assert text_tool_calls("Just an answer.", BASH) == ("Just an answer.", [])
    assert text_tool_calls("<shell>ls</shell>", None) == ("<shell>ls</shell>", [])  # no tools offered
    assert text_tool_calls("```python\nprint(1)\n```", BASH)[1] == []  # not a shell block


def test_the_edit_script_edits_once_or_fails(tmp_path):
    (tmp_path / "m.py").write_text("if x >= hi + 1:\n    pass\n")
    edit = Action("edit", {"path": "m.py", "old": "if x >= hi + 1:", "new": "if x > hi:"})
    command = action_call(edit, offered_tools(BASH))["arguments"]["command"]
    run = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "m.py").read_text() == "if x > hi:\n    pass\n"
    again = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode != 0 and "occurs 0 times" in again.stderr
