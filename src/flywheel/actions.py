"""Agent actions: the public tool schema and the compact tagged text format, as pure functions.

Chat models behind an OpenAI-compatible API call the tools natively (`TOOLS` is sent as function tools).
In-process models write one tagged action per turn, a format a tiny model can learn:

    <run_tests/>
    <view path="roman.py" start="1" end="40"/>
    <shell>grep -n "def " roman.py</shell>
    <edit path="roman.py">
    <old>
        if n > 3999:
    </old>
    <new>
        if n >= 4000:
    </new>
    </edit>
    <submit/>

Text before the action is allowed (a thought); only the first action in a turn is executed.

Fusion's lead has one tool more, `delegate` (`<delegate>INSTRUCTION</delegate>`, or a native `delegate`
call with an `instruction`): it is in `LEAD_TOOLS`, never in `TOOLS`, and the parsers accept it only when
given the lead's names (`LEAD_TOOL_NAMES`), so a plain agent neither sees nor may call it.

The format is what the models (the scripted teachers write it, servers translate it) and the harness (which
parses and executes it) both speak, so it lives below both, beside the tasks and the sandbox.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command in the repository (no network). Output is truncated.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The bash command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "view",
            "description": "Show a file with numbered lines, optionally only lines start..end (1-based).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "start": {"type": "integer"},
                    "end": {"type": "integer"},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Replace the exact, unique text `old` with `new` in a file; an empty `old` creates the file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old": {"type": "string"},
                    "new": {"type": "string"},
                },
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the repository's tests and show the result.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit the repository as it is now; ends the attempt.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
DELEGATE: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "delegate",
        "description": "Hand work to your sidekick, an engineer with its own tools in this same repository; "
        "its report (its diff, the tests it ran, how it ended, its last message) comes back.",
        "parameters": {
            "type": "object",
            "properties": {"instruction": {"type": "string", "description": "What the sidekick should do."}},
            "required": ["instruction"],
        },
    },
}
LEAD_TOOLS: list[dict[str, Any]] = [*TOOLS, DELEGATE]  # Fusion's lead: every tool, plus `delegate`
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
LEAD_TOOL_NAMES = tuple(t["function"]["name"] for t in LEAD_TOOLS)
REQUIRED = {t["function"]["name"]: t["function"]["parameters"].get("required", []) for t in LEAD_TOOLS}
STOP = ["</shell>", "</edit>", "/>"]  # a tagged action ends with one of these
DELEGATE_STOP = "</delegate>"  # what ends a tagged delegation (the lead stops on it too)
_BODY = {"shell": "command", "delegate": "instruction"}  # tags whose body is their one argument


@dataclass(frozen=True)
class Action:
    name: str
    args: dict[str, Any] = field(default_factory=dict)


class FormatError(ValueError):
    """The model's output holds no well-formed action; the message is shown to the model."""


@lru_cache(maxsize=8)
def _opening(names: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(rf"<({'|'.join(names)})\b([^>]*?)(/?)>", re.S)


_ATTR = re.compile(r'(\w+)\s*=\s*"([^"]*)"')
_OLD_NEW = re.compile(r"<old>(.*?)</old>\s*<new>(.*?)</new>", re.S)


def _trim(text: str) -> str:
    """Drop the one newline that follows an opening tag and the one before a closing tag."""
    if text.startswith("\n"):
        text = text[1:]
    return text[:-1] if text.endswith("\n") else text


def parse_tagged(text: str, names: tuple[str, ...] = TOOL_NAMES) -> Action:
    """The first tagged action in `text` among the tools `names` (`TOOL_NAMES` or `LEAD_TOOL_NAMES`);
    raises FormatError saying what is wrong."""
    m = _opening(names).search(text)
    if not m:
        raise FormatError(f"no action found: write one of {', '.join(f'<{n}>' for n in names)}")
    name, attrs, self_closing = m.group(1), dict(_ATTR.findall(m.group(2))), bool(m.group(3))
    rest = text[m.end() :]
    if name in ("run_tests", "submit"):
        return Action(name)
    if name == "view":
        if "path" not in attrs:
            raise FormatError('<view> needs a path: <view path="file.py"/>')
        args: dict[str, Any] = {"path": attrs["path"]}
        for key in ("start", "end"):
            if key in attrs:
                if not attrs[key].strip().isdigit():
                    raise FormatError(f"<view> {key} must be a line number, got {attrs[key]!r}")
                args[key] = int(attrs[key])
        return Action("view", args)
    if self_closing:
        raise FormatError(f"<{name}> needs a body and a closing </{name}>")
    close = rest.find(f"</{name}>")
    if close < 0:
        raise FormatError(f"<{name}> is not closed with </{name}>")
    body = rest[:close]
    if name in _BODY:
        if not body.strip():
            raise FormatError(f"<{name}> is empty")
        return Action(name, {_BODY[name]: body.strip()})
    if "path" not in attrs:
        raise FormatError('<edit> needs a path: <edit path="file.py">')
    on = _OLD_NEW.search(body)
    if not on:
        raise FormatError("<edit> needs <old>...</old> then <new>...</new>")
    return Action("edit", {"path": attrs["path"], "old": _trim(on.group(1)), "new": _trim(on.group(2))})


def restore_stop(text: str, stops: list[str] = STOP, names: tuple[str, ...] = TOOL_NAMES) -> str:
    """`text` with the stop string that ended it put back, when that makes it a well-formed action.

    A sampler that stops on a stop string leaves it out of the text (the OpenAI convention), so
    `<run_tests/>` arrives as `<run_tests`; the harness restores what the model actually wrote.
    """
    for candidate in (text, *(text + s for s in sorted(stops, key=len))):  # "/>" before "</shell>"
        try:
            parse_tagged(candidate, names)
        except FormatError:
            continue
        return candidate
    return text


def render_tagged(action: Action) -> str:
    """The tagged text of `action` (parse_tagged(render_tagged(a)) == a)."""
    a = action.args
    if action.name in ("run_tests", "submit"):
        return f"<{action.name}/>"
    if action.name == "view":
        span = "".join(f' {k}="{a[k]}"' for k in ("start", "end") if k in a)
        return f'<view path="{a["path"]}"{span}/>'
    if action.name in _BODY:
        return f"<{action.name}>{a[_BODY[action.name]]}</{action.name}>"
    return f'<edit path="{a["path"]}">\n<old>\n{a["old"]}\n</old>\n<new>\n{a["new"]}\n</new>\n</edit>'


def parse_native(call: dict[str, Any], names: tuple[str, ...] = TOOL_NAMES) -> Action:
    """An action from a native tool call {"name", "arguments"} among the tools `names`; raises FormatError
    on bad calls."""
    name, args = call.get("name"), call.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError:
            raise FormatError(f"arguments of {name} are not valid JSON") from None
    if name not in names:
        raise FormatError(f"unknown tool {name!r}: use one of {', '.join(names)}")
    if not isinstance(args, dict):
        raise FormatError(f"arguments of {name} must be a JSON object")
    missing = [k for k in REQUIRED[name] if k not in args]
    if missing:
        raise FormatError(f"{name} needs argument(s) {', '.join(missing)}")
    for key in ("start", "end"):
        if key in args and not isinstance(args[key], int):
            raise FormatError(f"view {key} must be an integer")
    return Action(str(name), dict(args))
