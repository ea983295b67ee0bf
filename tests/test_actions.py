import pytest

from flywheel.actions import (
    TOOL_NAMES,
    TOOLS,
    Action,
    FormatError,
    parse_native,
    parse_tagged,
    render_tagged,
)


@pytest.mark.parametrize(
    "action",
    [
        Action("run_tests"),
        Action("submit"),
        Action("view", {"path": "pkg/a.py"}),
        Action("view", {"path": "a.py", "start": 3, "end": 9}),
        Action("shell", {"command": "grep -n 'def ' a.py | head"}),
        Action("edit", {"path": "a.py", "old": "    if x > 1:\n", "new": "    if x >= 1:\n"}),
        Action("edit", {"path": "new.py", "old": "", "new": "print('hi')"}),
    ],
)
def test_render_parse_round_trip(action):
    assert parse_tagged(render_tagged(action)) == action


def test_thought_before_the_action_is_allowed_and_first_action_wins():
    text = 'The bound looks wrong.\n<view path="a.py" start="1" end="5"/>\n<submit/>'
    assert parse_tagged(text) == Action("view", {"path": "a.py", "start": 1, "end": 5})


@pytest.mark.parametrize(
    "text,message",
    [
        ("I think the bug is in line 3.", "no action found"),
        ("<view/>", "needs a path"),
        ('<view path="a.py" start="x"/>', "line number"),
        ("<shell>ls", "not closed"),
        ("<shell>   </shell>", "empty"),
        ('<edit path="a.py"><new>x</new></edit>', "<old>"),
        ("<edit><old>a</old><new>b</new></edit>", "needs a path"),
        ('<edit path="a.py"/>', "needs a body"),
    ],
)
def test_malformed_actions_say_what_is_wrong(text, message):
    with pytest.raises(FormatError, match=message):
        parse_tagged(text)


def test_native_calls_parse_and_validate():
    assert parse_native({"name": "shell", "arguments": '{"command": "ls"}'}) == Action(
        "shell", {"command": "ls"}
    )
    assert parse_native({"name": "run_tests", "arguments": {}}) == Action("run_tests")
    for bad, msg in [
        ({"name": "rm", "arguments": {}}, "unknown tool"),
        ({"name": "shell", "arguments": "{oops"}, "not valid JSON"),
        ({"name": "edit", "arguments": {"path": "a"}}, "needs argument"),
        ({"name": "view", "arguments": {"path": "a", "start": "1"}}, "integer"),
        ({"name": "shell", "arguments": None}, "JSON object"),
    ]:
        with pytest.raises(FormatError, match=msg):
            parse_native(bad)


def test_tool_schema_names_are_the_public_ones():
    assert TOOL_NAMES == ("shell", "view", "edit", "run_tests", "submit")
    assert all(t["type"] == "function" and "parameters" in t["function"] for t in TOOLS)


def test_restore_stop_puts_back_the_stop_string_the_sampler_cut():
    from flywheel.actions import restore_stop

    assert restore_stop("<run_tests") == "<run_tests/>"
    assert restore_stop("<shell>ls -la") == "<shell>ls -la</shell>"
    assert restore_stop('<edit path="a.py">\n<old>\nx\n</old>\n<new>\ny\n</new>\n').endswith("</edit>")
    assert restore_stop("<submit/>") == "<submit/>"  # already whole
    assert restore_stop("no action here") == "no action here"
