"""Each model's own tool-call syntax, read off its chat template (pure functions; the engine and serve use them).

A chat model that calls tools writes its calls as text in a syntax its chat template defines, and reads
its history back in that syntax through the same template. `syntax_of(template)` finds which of the
families' syntaxes a template defines, by what the template's text says:

| name | the template holds | an assistant turn that calls a tool |
| --- | --- | --- |
| `mistral` | `[TOOL_CALLS]` | `[TOOL_CALLS] [{"name": "view", "arguments": {...}}]` (Mistral v0.3) |
| `hermes` | `<tool_call>` | `<tool_call>\\n{"name": "view", "arguments": {...}}\\n</tool_call>` (Qwen2.5, Qwen3) |
| `llama3_json` | `"parameters"` and `ipython` | `{"name": "view", "parameters": {...}}` alone in the turn (Llama 3.1, 3.2) |

A template that also holds `<think>` (Qwen3) opens turns with `<think>...</think>`: calls are read only
after its end, and a turn whose reasoning is not closed calls nothing. Each syntax has a writer (the text
a model writes for some calls, which is what its template renders for them in the history: tests check
one against the other) and a parser (model text -> `Parsed`: the text before the calls and the calls,
`{"name", "arguments"}`, with the model's `"id"` where it wrote one). Several calls in a turn are written
and read as the family does: one `<tool_call>` block each, `; `-separated objects, one JSON list. The
text before `<tool_call>` blocks is kept less the one newline that the template writes back before them,
so a turn renders back as the model wrote it; Llama 3's calls stand alone in their turn, and Llama's and
Mistral's templates render no text beside a call.

A call that was begun and is malformed (not JSON, not an object, without a name, with arguments that are
not an object) is `Parsed.error`, a message for the model; the whole turn then calls nothing, as vLLM's
parsers read one. Which tools exist is not the parser's business: the harness answers an unknown tool
(`flywheel.actions.parse_native`), a server returns the call as written.

The engine (`flywheel.models.torch_engine`) calls two hooks. `chat_messages` gives the template the
OpenAI wire messages the way templates read them (`function.arguments` as an object, not its JSON text;
a Mistral template's nine-character call ids). `completion_calls` turns a completion's text into its
native calls when the request offers tools and the template defines a syntax; a malformed call becomes
one call `{"name": None, "arguments": None, "arguments_raw": TEXT, "error": WHY}`, with the whole text
kept as the content, so the harness shows WHY to the model as a format error and a server returns the
text as plain content. A template without a syntax (or no template) changes nothing: no calls, as before.

What is not covered: Mistral's later `[TOOL_CALLS]NAME[ARGS]{...}` form (Mistral tokenizers v11 on),
Llama's built-in tools (`<|python_tag|>` code), and templates that define calls some other way (Gemma 2
and 3 define none).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Parsed:
    """What a model's text says: the text before its calls, the calls, or what is wrong with a call."""

    content: str  # the text before the calls (as the template renders it back); all of it without calls
    calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments"} (+ "id")
    error: str | None = None  # a call was begun and is malformed: what to tell the model
    raw: str = ""  # the malformed call's text


@dataclass(frozen=True)
class CallSyntax:
    """One family's call syntax: how its template is recognised, written and read."""

    name: str
    example: str  # the call's shape, shown to a model that wrote a malformed one
    write_calls: Callable[[str, Sequence[dict[str, Any]]], str]
    parse_text: Callable[[str], Parsed]
    think: bool = False  # turns may open with <think>...</think> (Qwen3): calls are read after it

    def write(self, content: str, calls: Sequence[dict[str, Any]]) -> str:
        """The assistant turn's text for `content` followed by `calls` ({"name", "arguments"})."""
        return self.write_calls(content, calls)

    def parse(self, text: str) -> Parsed:
        """`text`'s calls; with `think`, only those after the reasoning, and none while it is open."""
        start = 0
        if self.think:
            close = text.rfind(THINK_CLOSE)
            if close >= 0:
                start = close + len(THINK_CLOSE)
            elif THINK_OPEN in text:  # still reasoning: nothing is called yet
                return Parsed(text)
        found = self.parse_text(text[start:])
        if found.error:
            message = f"malformed tool call: {found.error}; write {self.example}"
            return Parsed(text, error=message, raw=found.raw)
        if not found.calls:
            return Parsed(text)
        return replace(found, content=text[:start] + found.content)


# ------------------------------------------------------------------------------- one call's JSON


def _call(obj: Any, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """A decoded call object as {"name", "arguments"(, "id")}, or what is wrong with it."""
    if not isinstance(obj, dict):
        return None, "a call is a JSON object with a name and arguments"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, "the call has no name"
    args = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # arguments written as their JSON text
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args or "{}")
    if not isinstance(args, dict):
        return None, f"the arguments of {name} are not a JSON object"
    call = {"name": name, "arguments": args}
    if isinstance(obj.get("id"), str):
        call["id"] = obj["id"]
    return call, None


def _decode(text: str, pos: int = 0) -> tuple[Any, int, str | None]:
    """The JSON value at `text[pos:]` (after blanks): (value, end, None), or (None, pos, what is wrong)."""
    pos = len(text) - len(text[pos:].lstrip())
    try:
        value, end = json.JSONDecoder().raw_decode(text, pos)
    except json.JSONDecodeError as e:
        return None, pos, f"not valid JSON ({e.msg} at character {e.pos - pos})"
    return value, end, None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # as templates' `tojson` writes it


# ------------------------------------------------------------------------------------- the syntaxes

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)


def write_hermes(content: str, calls: Sequence[dict[str, Any]]) -> str:
    blocks = "\n".join(
        f"<tool_call>\n{_dumps({'name': c['name'], 'arguments': c.get('arguments') or {}})}\n</tool_call>"
        for c in calls
    )
    return f"{content}\n{blocks}" if content else blocks


def parse_hermes(text: str) -> Parsed:
    """`<tool_call>{json}</tool_call>` blocks (the last may be unclosed at the end of the text)."""
    first = text.find("<tool_call>")
    if first < 0:
        return Parsed(text)
    calls = []
    for m in _HERMES_BLOCK.finditer(text, first):
        body = m.group(1).strip()
        value, end, error = _decode(body)
        if error is None and body[end:].strip():
            error = "text after the call's JSON object"
        call, error = (None, error) if error else _call(value, "arguments")
        if call is None:
            return Parsed(text, error=error, raw=m.group(0))
        calls.append(call)
    return Parsed(text[:first].removesuffix("\n"), calls)  # the template puts the newline back


def write_llama3(content: str, calls: Sequence[dict[str, Any]]) -> str:
    """The JSON objects alone (the template drops a call turn's content), `; `-separated."""
    return "; ".join(_dumps({"name": c["name"], "parameters": c.get("arguments") or {}}) for c in calls)


def parse_llama3(text: str) -> Parsed:
    """A turn that is a JSON call (after `<|python_tag|>`, if the model wrote it), or several joined by `;`."""
    body = text.lstrip()
    body = body.removeprefix("<|python_tag|>").lstrip()
    if not body.startswith("{"):
        return Parsed(text)
    calls, pos = [], 0
    while True:
        value, end, error = _decode(body, pos)
        call, error = (None, error) if error else _call(value, "parameters")
        if call is None:
            return Parsed(text, error=error, raw=body)
        calls.append(call)
        rest = body[end:].lstrip()
        if not rest.startswith(";"):
            return Parsed("", calls)
        pos = len(body) - len(rest) + 1


def write_mistral(content: str, calls: Sequence[dict[str, Any]]) -> str:
    items = [
        {"name": c["name"], "arguments": c.get("arguments") or {}, **({"id": c["id"]} if "id" in c else {})}
        for c in calls
    ]
    return f"{content}[TOOL_CALLS] {_dumps(items)}"


def parse_mistral(text: str) -> Parsed:
    """`[TOOL_CALLS]` and a JSON list of calls (one object is taken as a list of one)."""
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return Parsed(text)
    body = text[at + len("[TOOL_CALLS]") :]
    value, _, error = _decode(body)
    items = value if isinstance(value, list) else [value]
    if error is None and not items:
        error = "the list of calls is empty"
    calls = []
    for item in [] if error else items:
        call, error = _call(item, "arguments")
        if call is None:
            break
        calls.append(call)
    if error:
        return Parsed(text, error=error, raw=text[at:])
    return Parsed(text[:at], calls)


HERMES = CallSyntax(
    "hermes", '<tool_call>{"name": TOOL, "arguments": {...}}</tool_call>', write_hermes, parse_hermes
)
LLAMA3_JSON = CallSyntax(
    "llama3_json", '{"name": TOOL, "parameters": {...}} alone in your answer', write_llama3, parse_llama3
)
MISTRAL = CallSyntax(
    "mistral", '[TOOL_CALLS] [{"name": TOOL, "arguments": {...}}]', write_mistral, parse_mistral
)
SYNTAXES = {s.name: s for s in (MISTRAL, HERMES, LLAMA3_JSON)}

# what a template's text holds -> its syntax, the first that matches
DETECT: list[tuple[Callable[[str], bool], CallSyntax]] = [
    (lambda t: "[TOOL_CALLS]" in t, MISTRAL),
    (lambda t: "<tool_call>" in t, HERMES),
    (lambda t: '"parameters"' in t and "ipython" in t, LLAMA3_JSON),
]


@lru_cache(maxsize=32)
def _detect(text: str) -> CallSyntax | None:
    syntax = next((s for test, s in DETECT if test(text)), None)
    return replace(syntax, think=True) if syntax is not None and THINK_OPEN in text else syntax


def syntax_of(template: str | dict[str, str] | None) -> CallSyntax | None:
    """The call syntax a chat template defines (a dict of named templates: any of them), or None."""
    if isinstance(template, dict):
        template = "\n".join(str(t) for t in template.values())
    return _detect(template) if template else None


def tokenizer_syntax(tokenizer: Any) -> CallSyntax | None:
    """The call syntax of a tokenizer's chat template, or None (no template, or one without calls)."""
    return syntax_of(getattr(tokenizer, "chat_template", None))


# --------------------------------------------------------------------------- the engine's two hooks


def chat_messages(tokenizer: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI wire messages as chat templates read them: each call's `arguments` an object (templates write
    it with `tojson`) after its `name`, no empty `tool_calls`, and for a Mistral template nine-character
    call ids."""
    short = tokenizer_syntax(tokenizer) is MISTRAL
    return [_template_message(m, short) for m in messages]


def _template_message(m: dict[str, Any], short_ids: bool) -> dict[str, Any]:
    if "tool_calls" in m:
        m = dict(m)
        calls = m.pop("tool_calls")
        if calls:
            m["tool_calls"] = [_template_call(c, short_ids) for c in calls]
    if short_ids and isinstance(m.get("tool_call_id"), str):
        m = {**m, "tool_call_id": mistral_id(m["tool_call_id"])}
    return m


def _template_call(call: Any, short_ids: bool) -> Any:
    if not isinstance(call, dict):
        return call
    call = dict(call)
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            args = json.loads(fn["arguments"] or "{}")
        except json.JSONDecodeError:
            args = None
        if isinstance(args, dict):  # the name first, as models write it (a template may dump the object)
            call["function"] = {"name": fn.get("name"), "arguments": args, **fn} | {"arguments": args}
    if short_ids and isinstance(call.get("id"), str):
        call["id"] = mistral_id(call["id"])
    return call


def mistral_id(call_id: str) -> str:
    """A call id as Mistral templates require it (nine letters and digits): kept if it is one, else a
    stable digest, so a call and its result keep matching ids."""
    if re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
        return call_id
    return hashlib.sha1(call_id.encode()).hexdigest()[:9]


def completion_calls(
    tokenizer: Any,
    tools: list[dict[str, Any]] | None,
    text: str,
    token_ids: Sequence[int],
    stop: Sequence[str] = (),
) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls) of a completion whose request offered `tools`, in its template's syntax.

    The calls are read from the tokens decoded with their special tokens (a Mistral tokenizer's
    `[TOOL_CALLS]` is one), cut at the request's `stop` strings as `text` is; the content before them is
    kept without special tokens. Without tools or a syntax, or with no call: (`text`, []). A malformed
    call: (`text`, [{"name": None, "arguments": None, "arguments_raw", "error"}]).
    """
    syntax = tokenizer_syntax(tokenizer) if tools else None
    if syntax is None or not token_ids:
        return text, []
    raw = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    cuts = [i for i in (raw.find(s) for s in stop if s) if i >= 0]
    found = syntax.parse(raw[: min(cuts)] if cuts else raw)
    if found.error:
        return text, [malformed_call(found)]
    if not found.calls:
        return text, []
    return _without_specials(found.content, tokenizer), found.calls


def malformed_call(found: Parsed) -> dict[str, Any]:
    """The native call that stands for a malformed one: no name, no arguments, and why."""
    return {"name": None, "arguments": None, "arguments_raw": found.raw, "error": found.error}


def _without_specials(text: str, tokenizer: Any) -> str:
    for token in getattr(tokenizer, "all_special_tokens", []):
        text = text.replace(token, "")
    return text
