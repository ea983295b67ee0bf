"""The OpenAI chat-completions format as pure functions: request bodies in, responses and chunks out.

- `parse_chat_request` turns a body into the `Request`s it asks for (one per `n`) and `parse_answer` into
  how it wants the answer (`Answer`: streamed or whole, with usage, with log-probs); both raise
  `ApiError(400)` for a field that is missing or mistyped.
- Completions become OpenAI JSON in `chat_response`: `choices[i].message` with `content` and
  `tool_calls` (ids, JSON-string arguments), `finish_reason` "tool_calls" when the model called tools,
  and `usage`. When the request offers `tools` and the model wrote its calls as text, `served` reads them
  first: in the call syntax of the served model's chat template (`flywheel.models.chat_formats`: Qwen's
  `<tool_call>`, Llama 3's JSON, Mistral's `[TOOL_CALLS]`), else an action (tagged, or a fenced shell
  block) as a call of an offered tool (`toolcalls`). A malformed call comes back as plain content, the
  model's text as it wrote it, as vLLM's parsers answer one.
- `stream_chunks` derives the `chat.completion.chunk`s that stream an answer from its `chat_response`
  object, so both agree; `settled` is the part of a growing answer that a live stream may send now.
- `"logprobs": true`: `choices[i].logprobs.content` (token, logprob) and the non-standard
  `choices[i].token_ids` / `prompt_token_ids`, when the model returns them (the torch engine does). The
  non-standard `logprobs_mode` ("processed" or "raw", `flywheel.serve.logprobs`) chooses whose log-probs
  they are; without it, the server's (`ServerConfig.logprobs_mode`, "processed" by default). The
  version of the weights that generated a completion is the non-standard top-level field
  `policy_version` (in each stream chunk too).

Errors are OpenAI error JSON, `{"error": {"message", "type", "param", "code"}}` (`ApiError`): 400 for a
body that is not JSON or misses/mistypes a field, and for a prompt longer than the model's context (code
`context_length_exceeded`, as vLLM answers; a Completion with `finish_reason="context"` and nothing
generated); 404 for unknown paths; 413 for a body over `max_body_bytes`; 500 when the model raises or
returns `Completion.error` (clients retry 5xx); 503 once the server is shutting down.

The non-standard field `flywheel_meta` (an object; `flywheel.models.openai_fields.META_FIELD`) becomes
`Request.meta`, for models that need episode context (the scripted oracle).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flywheel.models.chat_formats import CallSyntax
from flywheel.models.openai_fields import LOGPROBS_MODE_FIELD, LOGPROBS_MODES, META_FIELD
from flywheel.models.toolcalls import text_tool_calls
from flywheel.protocols import Completion, Request

ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An error answered as OpenAI error JSON with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# ------------------------------------------------------------------------------- parsing (pure)


def parse_chat_request(body: Any, max_n: int = 16) -> list[Request]:
    """The `Request`s (one per `n`) that a chat-completions body asks for; raises ApiError(400)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    tools = _tools(body.get("tools"))
    if body.get("tool_choice") == "none":
        tools = None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    req = Request(
        messages=[_message(m, i) for i, m in enumerate(_list(body.get("messages"), "messages"))],
        max_tokens=_number(max_tokens, "max_tokens", 512, lo=1, integer=True),
        temperature=float(_number(body.get("temperature"), "temperature", 1.0, lo=0.0)),
        top_p=float(_number(body.get("top_p"), "top_p", 1.0, lo=0.0, hi=1.0)),
        stop=_stop(body.get("stop")),
        tools=tools,
        seed=_number(body.get("seed"), "seed", None, integer=True),
        meta=_meta(body.get(META_FIELD)),
    )
    if req.top_p <= 0:
        raise bad_request("'top_p' must be greater than 0", "top_p")
    n = _number(body.get("n"), "n", 1, lo=1, hi=max_n, integer=True)
    seeds = [None if req.seed is None else req.seed + i for i in range(n)]
    return [req] if n == 1 else [dataclasses.replace(req, seed=s) for s in seeds]


@dataclass(frozen=True)
class Answer:
    """How a request wants its answer: streamed or whole, with or without log-probs."""

    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with `usage`
    logprobs: bool = False
    logprobs_mode: str | None = None  # one of LOGPROBS_MODES; None: the server's


def parse_answer(body: dict[str, Any]) -> Answer:
    """The `Answer` a chat-completions body asks for; raises ApiError(400)."""
    for param in ("stream", "logprobs"):
        if body.get(param) is not None and not isinstance(body[param], bool):
            raise bad_request(f"'{param}' must be a boolean", param)
    _number(body.get("top_logprobs"), "top_logprobs", 0, lo=0, hi=20, integer=True)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    mode = body.get(LOGPROBS_MODE_FIELD)
    if mode is not None and mode not in LOGPROBS_MODES:
        modes = " or ".join(f"'{m}'" for m in LOGPROBS_MODES)
        raise bad_request(f"'{LOGPROBS_MODE_FIELD}' must be {modes}", LOGPROBS_MODE_FIELD)
    stream, usage = bool(body.get("stream")), bool(options.get("include_usage"))
    return Answer(stream, usage, bool(body.get("logprobs")), mode)


def _list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise bad_request(f"'{param}' must be a non-empty list", param)
    return value


def _message(m: Any, i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise bad_request(f"{param} must be an object with a role ({', '.join(ROLES)})", param)
    out = dict(m)
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text is understood
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise bad_request(f"{param}.content: only text content parts are supported", f"{param}.content")
        out["content"] = "".join(str(p.get("text", "")) for p in content)
    elif content is not None and not isinstance(content, str):
        raise bad_request(
            f"{param}.content must be a string, a list of text parts or null", f"{param}.content"
        )
    return out


def _meta(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"'{META_FIELD}' must be an object", META_FIELD)
    return dict(value)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise bad_request("'tools' must be a list of tool objects", "tools")
    return value


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise bad_request("'stop' must be a string or a list of strings", "stop")


def _number(
    value: Any,
    param: str,
    default: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    integer: bool = False,
) -> Any:
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise bad_request(f"'{param}' must be {'an integer' if integer else 'a number'}", param)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_request(f"'{param}' must be {bounds}", param)
    return value


# ----------------------------------------------------------------------------- responses (pure)


def tool_call_json(call: dict[str, Any], index: int) -> dict[str, Any]:
    """One native call {"id"?, "name", "arguments" | "arguments_raw"} as an OpenAI tool call."""
    args = call.get("arguments")
    if args is None and "arguments_raw" in call:
        text = str(call["arguments_raw"])
    else:
        text = args if isinstance(args, str) else json.dumps(args if args is not None else {})
    call_id = call.get("id") or f"call_{uuid.uuid4().hex[:16]}_{index}"
    return {"id": call_id, "type": "function", "function": {"name": call.get("name"), "arguments": text}}


def _finish(c: Completion) -> str:
    if c.tool_calls:
        return "tool_calls"
    return "length" if c.finish_reason in ("length", "context") else "stop"


def check_completions(completions: Sequence[Completion]) -> None:
    """Raise the ApiError a failed completion stands for (500 model error, 400 context exceeded)."""
    for c in completions:
        if c.error or c.finish_reason == "error":
            raise ApiError(500, f"model error: {c.error or 'unknown error'}", kind="server_error")
    for c in completions:
        if c.finish_reason == "context" and not (c.completion_tokens or c.text or c.tool_calls):
            raise bad_request(
                f"This model's maximum context length is exceeded by the prompt ({c.prompt_tokens} tokens): "
                "shorten the messages",
                "messages",
                "context_length_exceeded",
            )


def served(c: Completion, tools: list[dict[str, Any]] | None, syntax: CallSyntax | None = None) -> Completion:
    """`c` as the client sees it: calls in its text, in the model's own `syntax` (from its chat template) or
    as an action (`toolcalls`), become tool calls; a malformed call leaves the text as plain content."""
    if not tools:
        return c
    if any(t.get("error") for t in c.tool_calls):  # the engine read a malformed call: the text stays
        return dataclasses.replace(c, tool_calls=[])
    if c.tool_calls:
        return c
    found = syntax.parse(c.text) if syntax is not None else None
    if found is not None and (found.calls or found.error):
        return dataclasses.replace(c, text=found.content, tool_calls=found.calls)
    content, calls = text_tool_calls(c.text, tools)
    return dataclasses.replace(c, text=content, tool_calls=calls) if calls else c


def logprobs_json(c: Completion, decode: Callable[[int], str] | None = None) -> dict[str, Any] | None:
    """OpenAI `choices[i].logprobs` for the sampled tokens (no alternatives); None when the model gave none."""
    if c.logprobs is None or c.token_ids is None:
        return None
    content = []
    for token_id, logprob in zip(c.token_ids, c.logprobs, strict=False):
        token = decode(token_id) if decode else str(token_id)
        content.append(
            {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
        )
    return {"content": content}


def chat_response(
    model_name: str,
    completions: Sequence[Completion],
    *,
    created: int | None = None,
    response_id: str | None = None,
    logprobs: bool = False,
    decode: Callable[[int], str] | None = None,
) -> dict[str, Any]:
    """The OpenAI `chat.completion` object for the completions of one request.

    With `logprobs`, each choice also carries the generated token ids (`token_ids`, non-standard, as vLLM
    returns them) and the response the prompt's (`prompt_token_ids`), when the model gave them.
    """
    choices = []
    for i, c in enumerate(completions):
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        if c.tool_calls:
            message["content"] = c.text or None
            message["tool_calls"] = [tool_call_json(t, j) for j, t in enumerate(c.tool_calls)]
        choice = {"index": i, "message": message, "finish_reason": _finish(c), "logprobs": None}
        if logprobs:
            choice["logprobs"] = logprobs_json(c, decode)
            if c.token_ids is not None:
                choice["token_ids"] = list(c.token_ids)
        choices.append(choice)
    prompt = completions[0].prompt_tokens if completions else 0
    generated = sum(c.completion_tokens for c in completions)
    response = {
        "id": response_id or f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "total_tokens": prompt + generated,
        },
    }
    if logprobs and completions and completions[0].prompt_ids is not None:
        response["prompt_token_ids"] = list(completions[0].prompt_ids)
    if completions and completions[0].policy_version is not None:
        response["policy_version"] = completions[0].policy_version
    return response


def stream_chunks(response: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """A `chat.completion` as the `chat.completion.chunk`s that stream it, in order (without `[DONE]`).

    Per choice: a chunk with the role, the content in pieces of a word, each tool call as OpenAI streams
    one (id, name and empty arguments, then the arguments in pieces), and a last chunk with the
    finish reason (and the log-probs and token ids, when asked for). Then, with `include_usage`, a chunk
    with no choices and the usage.
    """
    head = {k: response[k] for k in ("id", "created", "model", "policy_version") if k in response}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    chunks = []
    for choice in response["choices"]:
        i, message = choice["index"], choice["message"]
        chunks.append(chunk(i, {"role": "assistant", "content": ""}))
        chunks += [chunk(i, {"content": piece}) for piece in _pieces(message.get("content") or "")]
        for j, call in enumerate(message.get("tool_calls") or []):
            fn = call["function"]
            start = {"index": j, "id": call["id"], "type": "function"}
            chunks.append(
                chunk(i, {"tool_calls": [{**start, "function": {"name": fn["name"], "arguments": ""}}]})
            )
            for piece in _pieces(fn["arguments"]):
                chunks.append(chunk(i, {"tool_calls": [{"index": j, "function": {"arguments": piece}}]}))
        extra = {k: choice[k] for k in ("logprobs", "token_ids") if k in choice}
        chunks.append(chunk(i, {}, choice["finish_reason"], **extra))
    if include_usage:
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": response["usage"]})
    return chunks


def settled(text: str, stops: Sequence[str]) -> str:
    """The part of a growing answer that can be sent: cut at a stop string it holds, and without a tail
    that may yet become one, or that ends in an incomplete character (decoded as U+FFFD)."""
    text = text.rstrip("\ufffd")
    for stop in stops:
        if stop and stop in text:
            text = text[: text.index(stop)]
    tail = max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)
    return text[: len(text) - tail]


def _pieces(text: str) -> list[str]:
    """`text` in pieces of one word and the space after it ("".join gives `text` back)."""
    return [p for p in re.findall(r"\S*\s*", text) if p]


def models_response(model_name: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "flywheel"}],
    }
