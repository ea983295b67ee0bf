"""Any `Model` behind the OpenAI chat-completions API, on the standard library's HTTP server.

`flywheel serve` puts the in-process engine (or any backend) behind the same API that vLLM offers, so one
client (`openai_backend.OpenAIModel`, or any OpenAI SDK) talks to every inference pool, and tests get a
real HTTP server without new dependencies.

Design:

- `ThreadingHTTPServer` with HTTP/1.1 keep-alive: one thread per connection parses and validates the
  request (`parse_chat_request`, a pure function) and waits for its completions.
- A `Batcher` owns the model: a single worker thread takes the first waiting request, collects whatever
  else arrives within `batch_window_s` (or until `max_batch` requests), and calls `model.generate` once for
  them all. Requests that arrive while a batch is generating form the next batch. So the model sees large
  batches under load (what the torch engine needs for throughput) and `generate` is never called from two
  threads at once (the engine needs that too).
- Completions become OpenAI JSON in `chat_response` (pure): `choices[i].message` with `content` and
  `tool_calls` (ids, JSON-string arguments), `finish_reason` "tool_calls" when the model called tools,
  and `usage`. When the request offers `tools` and the model wrote its action as text (tagged, or a
  fenced shell block), `served` turns it into a call of an offered tool first (`toolcalls`).
- `"stream": true`: the whole answer is generated, then sent as server-sent events (`stream_chunks`, pure,
  derived from the `chat_response` object so both agree), in chunked transfer encoding (keep-alive stays).
- `"logprobs": true`: `choices[i].logprobs.content` (token, logprob) and the non-standard
  `choices[i].token_ids` / `prompt_token_ids`, when the model returns them (the torch engine does).

Endpoints: `GET /v1/models`, `GET /health`, `POST /v1/chat/completions` (also without the `/v1` prefix).

Errors are OpenAI error JSON, `{"error": {"message", "type", "param", "code"}}`: 400 for a body that is not
JSON or misses/mistypes a field, and for a prompt longer than the
model's context (code `context_length_exceeded`, as vLLM answers; a Completion with
`finish_reason="context"` and nothing generated); 404 for unknown paths; 413 for a body over
`max_body_bytes`; 500 when the model raises or returns `Completion.error` (clients retry 5xx).

Departures from the OpenAI API: a stream starts only when generation has ended (no token-by-token
latency gain), and a choice's log-probs come in its last chunk; `top_logprobs` lists are empty; `n` up to `max_n` (copies of the request in
the batch, seeds offset by the copy's index); a generation cut short by the context limit after it has
produced text ends with `finish_reason="length"`, the nearest standard value; the request's `model` field
is not checked (the server serves one model); the non-standard field `flywheel_meta` (an object) becomes
`Request.meta`, for models that need episode context (the scripted oracle).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from flywheel.models.toolcalls import text_tool_calls
from flywheel.protocols import Completion, Model, Request

log = logging.getLogger(__name__)

META_FIELD = "flywheel_meta"  # non-standard body field carrying Request.meta (episode context)
POLL_S = 0.05  # how often the serving loop checks for shutdown
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ServerConfig:
    """How the server batches and what it accepts."""

    batch_window_s: float = 0.005  # how long the first request of a batch waits for company
    max_batch: int = 64  # requests per `model.generate` call, at most
    max_body_bytes: int = 32 * 2**20  # larger request bodies are refused with 413
    max_n: int = 16  # completions per request, at most
    model_name: str | None = None  # the name the API reports; None: the model's `name`


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


def parse_answer(body: dict[str, Any]) -> Answer:
    """The `Answer` a chat-completions body asks for; raises ApiError(400)."""
    for param in ("stream", "logprobs"):
        if body.get(param) is not None and not isinstance(body[param], bool):
            raise bad_request(f"'{param}' must be a boolean", param)
    _number(body.get("top_logprobs"), "top_logprobs", 0, lo=0, hi=20, integer=True)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return Answer(bool(body.get("stream")), bool(options.get("include_usage")), bool(body.get("logprobs")))


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


def served(c: Completion, tools: list[dict[str, Any]] | None) -> Completion:
    """`c` as the client sees it: an action in its text becomes a call of an offered tool (`toolcalls`)."""
    if not tools or c.tool_calls:
        return c
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
    return response


def stream_chunks(response: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """A `chat.completion` as the `chat.completion.chunk`s that stream it, in order (without `[DONE]`).

    Per choice: a chunk with the role, the content in pieces of a word, each tool call as OpenAI streams
    one (id, name and empty arguments, then the arguments in pieces), and a last chunk with the
    finish reason (and the log-probs and token ids, when asked for). Then, with `include_usage`, a chunk
    with no choices and the usage.
    """
    head = {k: response[k] for k in ("id", "created", "model")}

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


def _pieces(text: str) -> list[str]:
    """`text` in pieces of one word and the space after it ("".join gives `text` back)."""
    return [p for p in re.findall(r"\S*\s*", text) if p]


def models_response(model_name: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "flywheel"}],
    }


# --------------------------------------------------------------------------------------- batching


class Batcher:
    """Owns a model: collects requests from many threads into batches for one `generate` call each.

    A request's `n` copies stay in one batch, so a batch may pass `max_batch` by the last request's copies.
    """

    def __init__(self, model: Model, window_s: float = 0.005, max_batch: int = 64):
        self.model, self.window_s, self.max_batch = model, window_s, max(1, max_batch)
        self._queue: queue.Queue[tuple[list[Request], Future] | None] = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()  # a job is queued before the stop mark, or refused
        self._worker = threading.Thread(target=self._loop, name="flywheel-batcher", daemon=True)
        self._worker.start()

    def submit(self, requests: list[Request]) -> list[Completion]:
        """Completions for `requests`, generated in some batch; raises what `generate` raised."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise ApiError(503, "the server is shutting down", kind="server_error")
            self._queue.put((requests, future))
        return future.result()

    def close(self) -> None:
        """Stop after the batch in progress; requests still waiting fail with 503."""
        with self._lock:
            self._closed = True
            self._queue.put(None)
        self._worker.join(timeout=5)

    def _loop(self) -> None:
        while (first := self._queue.get()) is not None:
            jobs, stop = self._collect(first)
            self._run(jobs)
            if stop:
                break
        self._fail_waiting()

    def _collect(
        self, first: tuple[list[Request], Future]
    ) -> tuple[list[tuple[list[Request], Future]], bool]:
        jobs, size = [first], len(first[0])
        deadline = time.monotonic() + self.window_s
        while size < self.max_batch:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            size += len(job[0])
        return jobs, False

    def _run(self, jobs: list[tuple[list[Request], Future]]) -> None:
        batch = [r for requests, _ in jobs for r in requests]
        try:
            completions = list(self.model.generate(batch))
            if len(completions) != len(batch):
                raise RuntimeError(f"model returned {len(completions)} completions for {len(batch)} requests")
        except Exception as e:
            log.exception("model.generate failed on a batch of %d", len(batch))
            for _, future in jobs:
                future.set_exception(
                    ApiError(500, f"model error: {type(e).__name__}: {e}", kind="server_error")
                )
            return
        at = 0
        for requests, future in jobs:
            future.set_result(completions[at : at + len(requests)])
            at += len(requests)

    def _fail_waiting(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job[1].set_exception(ApiError(503, "the server is shutting down", kind="server_error"))


# ------------------------------------------------------------------------------------------ HTTP


class ModelServer(ThreadingHTTPServer):
    """The HTTP server; `serve_model` starts one."""

    daemon_threads = True

    def __init__(
        self, model: Model, host: str = "127.0.0.1", port: int = 0, config: ServerConfig | None = None
    ):
        self.model, self.config = model, config or ServerConfig()
        self.model_name = self.config.model_name or model.name
        self.created = int(time.time())
        super().__init__((host, port), _Handler)
        self.batcher = Batcher(model, self.config.batch_window_s, self.config.max_batch)
        tokenizer = getattr(model, "tokenizer", None)  # the torch engine's: names the tokens of log-probs
        self.decode = (lambda i: tokenizer.decode([i])) if tokenizer is not None else None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """The base URL clients use, e.g. http://127.0.0.1:8000/v1."""
        host = self.server_address[0]
        return f"http://{host}:{self.port}/v1"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that dropped its keep-alive connection is routine, not a traceback on stderr."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)

    def close(self) -> None:
        """Stop serving (when `serve_forever` runs in another thread), free the port, stop the batcher."""
        self.shutdown()
        self.server_close()
        self.batcher.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ModelServer

    def do_GET(self) -> None:
        path = _route(self.path)
        if path == "/models":
            self._send(200, models_response(self.server.model_name, self.server.created))
        elif path == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._send_error(ApiError(404, f"unknown path {self.path}", param="path", code="not_found"))

    def do_POST(self) -> None:
        try:
            body = self._read_body()
            if _route(self.path) != "/chat/completions":
                raise ApiError(404, f"unknown path {self.path}", param="path", code="not_found")
            self._chat(body)
        except ApiError as e:
            self._send_error(e)
        except Exception as e:  # a bug, not bad input: answer 500 and keep serving
            log.exception("error while answering %s", self.path)
            self._send_error(ApiError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"))

    def _chat(self, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"the request body is not valid JSON: {e}") from None
        requests = parse_chat_request(body, self.server.config.max_n)
        answer = parse_answer(body)
        completions = self.server.batcher.submit(requests)
        check_completions(completions)
        completions = [served(c, requests[0].tools) for c in completions]
        response = chat_response(
            self.server.model_name, completions, logprobs=answer.logprobs, decode=self.server.decode
        )
        if answer.stream:
            self._send_events(stream_chunks(response, answer.include_usage))
        else:
            self._send(200, response)

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        try:
            n = int(length) if length is not None else -1
        except ValueError:
            n = -1
        if n < 0:
            self.close_connection = True
            raise bad_request("a request body with a valid Content-Length header is required")
        if n > self.server.config.max_body_bytes:
            self.close_connection = True
            raise ApiError(413, f"the request body is larger than {self.server.config.max_body_bytes} bytes")
        return self.rfile.read(n)

    def _send_error(self, e: ApiError) -> None:
        self._send(e.status, e.body())

    def _send(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. its timeout)
            self.close_connection = True

    def _send_events(self, chunks: list[dict[str, Any]]) -> None:
        """Server-sent events, one `data:` line per chunk and `data: [DONE]`, in chunked transfer encoding."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in [*(json.dumps(c) for c in chunks), "[DONE]"]:
                data = f"data: {event}\n\n".encode()
                self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _route(path: str) -> str:
    """The endpoint a request path names, with or without the /v1 prefix."""
    path = urlsplit(path).path.rstrip("/")
    return path.removeprefix("/v1") or "/"


def serve_model(
    model: Model, host: str = "127.0.0.1", port: int = 0, config: ServerConfig | None = None
) -> tuple[ModelServer, threading.Thread]:
    """Start serving `model` in a background thread; `server.port` is the bound port, `server.close()` stops."""
    server = ModelServer(model, host, port, config)
    thread = threading.Thread(
        target=server.serve_forever, args=(POLL_S,), name="flywheel-server", daemon=True
    )
    thread.start()
    return server, thread
