"""A served model's text as the tool calls its client offered (pure functions; `flywheel serve` uses them).

Our models write actions as text: the tagged format (`actions.parse_tagged`) or, as chat models do, a fenced
shell block (```bash ... ```). A client that offers `tools` (mini-swe-agent offers one `bash` tool; our
own harness offers `actions.TOOLS`) expects OpenAI `tool_calls` back, so `text_tool_calls` turns the first
action in the text into a call of a tool the client offered:

- an action whose name the client offers is called by that name, with the same arguments;
- otherwise its shell equivalent goes to the client's shell tool (`shell`, else `bash`): `shell` is the
  command itself, `view` is `cat -n FILE` (cut to start..end with sed), `run_tests` is `python -m pytest
  -q` (a client's test command is not known), `edit` is a short Python script that replaces the unique
  `old` text (and fails, saying why, when it is not found exactly once), `submit` is `echo
  COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, the line a bash-only agent (mini-swe-agent) reads as "done";
- `delegate` has no shell equivalent: without a same-named tool it stays text.

Text with no parsable action, or whose action the client cannot be called with, stays plain content.
The text before the action (the model's thought) is kept as the message's content. A model whose chat
template defines its own call syntax (Qwen's `<tool_call>`, ...) has its calls read by
`flywheel.models.chat_formats` first; this translation is for the rest.
"""

from __future__ import annotations

import re
from typing import Any

from flywheel.actions import LEAD_TOOL_NAMES, Action, FormatError, parse_tagged

SHELL_TOOLS = ("shell", "bash")  # the client tools that take a shell command, preferred first
TEST_COMMAND = "python -m pytest -q"  # run_tests without a run_tests tool: the client's command is unknown
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # submit without a submit tool
_FENCE = re.compile(r"```(?:bash|sh|shell|console)?[ \t]*\n(.*?)```", re.S)
_TAG = re.compile(rf"<({'|'.join(LEAD_TOOL_NAMES)})\b")
_EDIT = """python - <<'FLYWHEEL_EDIT'
import pathlib, sys
p, old, new = pathlib.Path({path!r}), {old!r}, {new!r}
text = p.read_text() if p.exists() else ""
if not old:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(new)
elif text.count(old) != 1:
    sys.exit(f"edit: the old text occurs {{text.count(old)}} times in {{p}}, not once")
else:
    p.write_text(text.replace(old, new))
FLYWHEEL_EDIT"""


def offered_tools(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The function tools a request offers: name -> parameters schema."""
    out = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn.get("parameters") or {}
    return out


def parse_text_action(text: str) -> tuple[Action, str] | None:
    """The first action in `text` (tagged, else a fenced shell block) and the text before it; None if none."""
    try:
        action = parse_tagged(text, LEAD_TOOL_NAMES)
    except FormatError:
        action = None
    if action is not None:
        m = _TAG.search(text)
        return action, text[: m.start()] if m else ""
    fence = _FENCE.search(text)
    if fence and fence.group(1).strip():
        return Action("shell", {"command": fence.group(1).strip()}), text[: fence.start()]
    return None


def shell_command(action: Action) -> str | None:
    """The shell command that does what `action` does, or None when there is none."""
    a = action.args
    if action.name == "shell":
        return str(a["command"])
    if action.name == "view":
        command = f"cat -n {_quote(a['path'])}"
        if "start" in a or "end" in a:
            command += f" | sed -n '{a.get('start', 1)},{a.get('end', '$')}p'"
        return command
    if action.name == "run_tests":
        return TEST_COMMAND
    if action.name == "submit":
        return SUBMIT_COMMAND
    if action.name == "edit":
        return _EDIT.format(path=a["path"], old=a["old"], new=a["new"])
    return None


def action_call(action: Action, tools: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """`action` as a call {"name", "arguments"} of one of `tools` (`offered_tools`), or None."""
    if action.name in tools:
        return {"name": action.name, "arguments": dict(action.args)}
    shell = next((n for n in SHELL_TOOLS if n in tools), None)
    command = shell_command(action)
    if shell is None or command is None:
        return None
    return {"name": shell, "arguments": {_command_field(tools[shell]): command}}


def text_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls): the first action in `text` as a call of an offered tool, or (text, [])."""
    offered = offered_tools(tools)
    found = parse_text_action(text) if offered else None
    call = action_call(found[0], offered) if found else None
    if found is None or call is None:
        return text, []
    return found[1].strip(), [call]


def _command_field(parameters: dict[str, Any]) -> str:
    """The argument that holds the command: "command" when the schema has it, else its one string field."""
    props = parameters.get("properties") or {}
    if "command" in props or not props:
        return "command"
    strings = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]
    return strings[0] if strings else "command"


def _quote(path: str) -> str:
    return path if re.fullmatch(r"[\w./-]+", path) else "'" + path.replace("'", "'\\''") + "'"
