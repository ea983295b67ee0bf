"""Any OpenAI-compatible chat server as a `Model`: vLLM, SGLang, Ollama, llama.cpp, `flywheel serve`.

`OpenAIModel.generate` sends each `Request` as one `chat.completions` call through the official `openai`
client, many at once on a thread pool (the server batches them). Messages go out exactly as the harness
wrote them, assistant `tool_calls` and `tool` messages included; `Request.tools` go out as function tools
with `tool_choice="auto"`.

Mapping a response to a `Completion` is a pure function (`to_completion`), as is mapping a failure
(`error_completion`), so both are tested without a server:

- `finish_reason` "tool_calls" becomes "stop" (the calls are in `tool_calls`); "length" stays "length".
- A server that refuses the prompt as longer than its context (HTTP 400 with "maximum context length",
  `context_length_exceeded`, …) gives `finish_reason="context"`, so the harness can compact and go on.
- Tool-call arguments are parsed into a dict; arguments that are not valid JSON are kept as text under
  `arguments_raw` with `arguments=None`, so the harness answers with a format error instead of guessing.
- Every other failure (an HTTP error after the client's retries, a timeout, a refused connection after
  our own retries) is `Completion(error=..., finish_reason="error")`: a bad rollout is data, not a crash.

Retries are two bounded layers. The client retries 408/409/429/5xx and transport errors `max_retries`
times with its own short backoff. On top of that, a refused or dropped connection is retried
`connect_retries` more times with a longer exponential backoff (`retry_backoff_s`, doubling): it rides
out an inference server that restarts to load new weights. Timeouts are not retried on top: the client
has already retried them, and each costs a full `timeout_s`.

Two options serve the harness. `native_tools` says whether the harness should offer tools natively (off
by default: a vLLM started without a tool-call parser refuses `tools`; the tagged text format works with
every server); a spec turns it on with `openai:NAME?tools=native` (`load_openai_model`), and
`flywheel eval --action-format native` overrides it either way. `send_meta` sends `Request.meta` (task directory, episode id) in the non-standard body
field `flywheel_meta`, which `flywheel serve` passes on to its model: the scripted oracle needs it to act.

Training on what a server generated (`logprobs`, off by default; `openai:NAME?logprobs=true`, and the
loop's `http` backend turns it on): each request asks for `logprobs: true` (and `return_token_ids: true`,
vLLM's switch for the ids), and when the response carries the sampled tokens' ids (the non-standard
`choices[i].token_ids`), their log-probs (`choices[i].logprobs.content`) and the prompt's ids
(`prompt_token_ids`), as `flywheel serve` and vLLM return them, the `Completion` holds them
(`token_ids`, `logprobs`, `prompt_ids`), so the trainer replays the turn. A response that lacks any of
the three, or whose ids and log-probs differ in length, gives a turn without them (recorded, not
trained). The top-p kept sets are never sent: the trainer rebuilds them from its own distribution
(`flywheel.rl.objective.rebuild_kept_mask`, which says what that costs). The non-standard top-level
`policy_version` that `flywheel serve --follow` reports becomes `Completion.policy_version`, whether or
not log-probs were asked for.

What is not covered: streaming, `n > 1` (the harness asks for one message per request), and log-probs of
servers that return them after their own sampling processors rather than before (see the README's notes
on vLLM and SGLang).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qsl

import openai

from flywheel.errors import FlywheelError
from flywheel.models.openai_fields import META_FIELD
from flywheel.protocols import Completion, Request

PLACEHOLDER_KEY = "sk-local"  # local servers accept any key; the client refuses to start without one

_FINISH = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "function_call": "stop",
    "context": "context",
}
_CONTEXT_ERROR = re.compile(
    r"context[_ ]length|maximum context|context size|context window|prompt is too long|too many tokens", re.I
)


@dataclass(frozen=True)
class OpenAIConfig:
    """How `OpenAIModel` reaches its server."""

    base_url: str | None = None  # e.g. http://127.0.0.1:8000/v1; None: $OPENAI_BASE_URL or the default
    api_key: str | None = None  # None: $OPENAI_API_KEY, else PLACEHOLDER_KEY
    concurrency: int = 8  # requests in flight at once
    timeout_s: float = 120.0  # per HTTP attempt
    max_retries: int = 2  # the client's own retries (408/409/429/5xx, transport errors)
    connect_retries: int = 3  # our retries of refused/dropped connections, on top of the client's
    retry_backoff_s: float = 1.0  # first wait before one of our retries; doubles each time
    native_tools: bool = False  # tell the harness to offer tools natively (the server must parse tool calls)
    send_meta: bool = False  # send Request.meta as the body field "flywheel_meta" (read by `flywheel serve`)
    logprobs: bool = False  # ask for the sampled tokens' ids and log-probs, and record them for training


# ------------------------------------------------------------------------------------ pure functions


def request_kwargs(
    model: str, req: Request, send_meta: bool = False, logprobs: bool = False
) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create` for one request."""
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": req.messages,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
    }
    if req.stop:
        kwargs["stop"] = list(req.stop)
    if req.seed is not None:
        kwargs["seed"] = req.seed
    if req.tools:
        kwargs["tools"] = [function_tool(t) for t in req.tools]
        kwargs["tool_choice"] = "auto"
    extra: dict[str, Any] = {}
    if send_meta and req.meta:
        extra[META_FIELD] = req.meta
    if logprobs:
        kwargs["logprobs"] = True
        extra["return_token_ids"] = True
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """`tool` as an OpenAI function tool; a bare {"name", "parameters", …} schema is wrapped."""
    return tool if "type" in tool else {"type": "function", "function": tool}


def parse_tool_call(call_id: str | None, name: str | None, arguments: str | None) -> dict[str, Any]:
    """A native call {"id", "name", "arguments"}; unparsable arguments are kept under "arguments_raw"."""
    text = arguments or ""
    try:
        parsed = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {"id": call_id, "name": name, "arguments": None, "arguments_raw": text}
    return {"id": call_id, "name": name, "arguments": parsed}


def _tool_calls(message: Any) -> list[dict[str, Any]]:
    calls = []
    for tc in getattr(message, "tool_calls", None) or []:
        fn = getattr(tc, "function", None)
        if fn is not None:
            calls.append(parse_tool_call(tc.id, fn.name, fn.arguments))
        else:  # a custom (free-text) tool call: its input is not JSON by design
            custom = getattr(tc, "custom", None)
            calls.append(
                {
                    "id": tc.id,
                    "name": getattr(custom, "name", None),
                    "arguments": None,
                    "arguments_raw": getattr(custom, "input", ""),
                }
            )
    return calls


def to_completion(response: Any) -> Completion:
    """A `Completion` from a `ChatCompletion` response (first choice)."""
    usage = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    choices = getattr(response, "choices", None) or []
    if not choices:
        return Completion(
            "",
            finish_reason="error",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            error="server returned no choices",
        )
    choice = choices[0]
    return Completion(
        text=choice.message.content or "",
        finish_reason=_FINISH.get(choice.finish_reason or "stop", "stop"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        tool_calls=_tool_calls(choice.message),
        **sampled(response, choice),
        policy_version=_int_or_none(_extra(response).get("policy_version")),
    )


def sampled(response: Any, choice: Any) -> dict[str, Any]:
    """`prompt_ids`, `token_ids` and `logprobs` of a response that carries all three consistently, else {}."""
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    token_ids, prompt_ids = _extra(choice).get("token_ids"), _extra(response).get("prompt_token_ids")
    if not content or not isinstance(token_ids, list) or not isinstance(prompt_ids, list):
        return {}
    logprobs = [float(t.logprob) for t in content]
    if len(logprobs) != len(token_ids) or not prompt_ids:
        return {}
    return {
        "prompt_ids": [int(i) for i in prompt_ids],
        "token_ids": [int(i) for i in token_ids],
        "logprobs": logprobs,
    }


def _extra(obj: Any) -> dict[str, Any]:
    """The fields of a response object beyond the OpenAI schema (pydantic's `model_extra`)."""
    return getattr(obj, "model_extra", None) or {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_context_error(status: int | None, code: Any, message: str) -> bool:
    """Whether an HTTP error says the prompt does not fit the model's context."""
    if code == "context_length_exceeded":
        return True
    return status in (400, 413, 422) and bool(_CONTEXT_ERROR.search(message))


def error_completion(exc: BaseException, timeout_s: float) -> Completion:
    """The `Completion` that stands for a failed request."""
    if isinstance(exc, openai.APIStatusError):
        message = _status_message(exc)
        if is_context_error(exc.status_code, getattr(exc, "code", None), message):
            return Completion("", finish_reason="context")
        return Completion("", finish_reason="error", error=f"HTTP {exc.status_code}: {message}")
    if isinstance(exc, openai.APITimeoutError):
        return Completion("", finish_reason="error", error=f"timeout: no response within {timeout_s:g} s")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return Completion("", finish_reason="error", error=f"connection error: {cause}")
    return Completion("", finish_reason="error", error=f"{type(exc).__name__}: {exc}")


def _status_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(exc.message)


# ----------------------------------------------------------------------------------------- the model


class OpenAIModel:
    """A `Model` served over the OpenAI chat-completions API."""

    def __init__(self, model: str, config: OpenAIConfig | None = None):
        self.model = model
        self.name = f"openai:{model}"
        self.config = cfg = config or OpenAIConfig()
        self.native_tools = cfg.native_tools
        self.base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.client = openai.OpenAI(
            api_key=cfg.api_key or os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_KEY,
            base_url=self.base_url,
            timeout=cfg.timeout_s,
            max_retries=cfg.max_retries,
        )

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if len(requests) <= 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def close(self) -> None:
        self.client.close()

    def _one(self, req: Request) -> Completion:
        try:
            kwargs = request_kwargs(self.model, req, self.config.send_meta, self.config.logprobs)
            return to_completion(self._create(kwargs))
        except Exception as e:  # a failed request is data: the episode records the error
            return error_completion(e, self.config.timeout_s)

    def _create(self, kwargs: dict[str, Any]) -> Any:
        cfg, attempt = self.config, 0
        while True:
            try:
                return self.client.chat.completions.create(**kwargs)
            except openai.APITimeoutError:
                raise
            except openai.APIConnectionError:
                if attempt >= cfg.connect_retries:
                    raise
                time.sleep(cfg.retry_backoff_s * 2**attempt)
                attempt += 1


def load_openai_model(spec: str, base_url: str | None = None, **opts: Any) -> OpenAIModel:
    """`openai:<model-name>[?key=value&...]` as an `OpenAIModel`; `opts` and the query are `OpenAIConfig` fields.

    The query lets a config file say what a command line would: `openai:NAME?tools=native` offers the
    tools natively (`tools=tagged`: the text format), and any other field is given by its name
    (`?send_meta=true&concurrency=16`). Keyword options win over the query.
    """
    name, _, query = spec.removeprefix("openai:").partition("?")
    if not spec.startswith("openai:") or not name.strip():
        raise FlywheelError(f"bad model spec '{spec}': use openai:<model-name>")
    opts = {**spec_options(query), **opts}
    known = {f.name for f in fields(OpenAIConfig)} - {"base_url"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise FlywheelError(f"unknown option(s) for openai models: {', '.join(unknown)}")
    url = base_url or os.environ.get("OPENAI_BASE_URL")
    if url and not re.match(r"https?://", url):
        raise FlywheelError(f"bad base URL '{url}': it must start with http:// or https://")
    return OpenAIModel(name, OpenAIConfig(base_url=url, **opts))


def spec_options(query: str) -> dict[str, Any]:
    """The `OpenAIConfig` fields a spec's query sets (`tools=native|tagged` is `native_tools`)."""
    types = {f.name: f.type for f in fields(OpenAIConfig)}
    out: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise FlywheelError(f"bad options {query!r} for openai models: use ?key=value&key=value") from None
    for key, value in pairs:
        if key == "tools":
            if value not in ("native", "tagged"):
                raise FlywheelError(f"bad option tools={value!r} for openai models: use native or tagged")
            out["native_tools"] = value == "native"
        elif key in types:
            out[key] = _option(key, value, str(types[key]))
        else:
            raise FlywheelError(f"unknown option {key!r} for openai models")
    return out


def _option(key: str, value: str, kind: str) -> Any:
    try:
        if kind.startswith("bool"):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("1", "true", "yes")
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except ValueError:
        raise FlywheelError(f"bad value {value!r} for option {key} of openai models") from None
    return value
