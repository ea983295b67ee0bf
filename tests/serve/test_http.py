"""The OpenAI-compatible HTTP server as raw HTTP clients and the OpenAI SDK see it."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from flywheel.protocols import Completion, Request
from flywheel.serve import ServerConfig, serve_model


@pytest.fixture
def server(shout):
    srv, _ = serve_model(shout, config=ServerConfig(batch_window_s=0.002))
    yield srv
    srv.close()


def call(server, method: str, path: str, body: bytes | dict | None = None, conn=None):
    conn = conn or http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def chat(**body):
    return {"model": "shout", "messages": [{"role": "user", "content": "hi"}], **body}


def test_models_and_a_chat_completion(server):
    assert call(server, "GET", "/v1/models")[1]["data"][0]["id"] == "shout"
    status, r = call(server, "POST", "/v1/chat/completions", chat())
    assert status == 200 and r["object"] == "chat.completion" and r["model"] == "shout"
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "HI"}
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert r["id"].startswith("chatcmpl-") and isinstance(r["created"], int)


def test_tool_calls_are_openai_tool_calls(server):
    tools = [{"type": "function", "function": {"name": "shout", "parameters": {"type": "object"}}}]
    status, r = call(server, "POST", "/v1/chat/completions", chat(tools=tools))
    choice = r["choices"][0]
    assert status == 200 and choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [tc] = choice["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["id"].startswith("call_")
    assert tc["function"]["name"] == "shout" and json.loads(tc["function"]["arguments"]) == {"text": "hi"}


def test_keep_alive_and_n_choices(server, shout):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    call(server, "POST", "/v1/chat/completions", chat(), conn=conn)
    status, r = call(server, "POST", "/chat/completions", chat(n=3, seed=5), conn=conn)
    assert status == 200 and [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"]["completion_tokens"] == 6
    assert [q.seed for q in shout.batches[-1]] == [5, 6, 7]  # the copies went in one batch


@pytest.mark.parametrize(
    "body,status,param",
    [
        (b"{not json", 400, None),
        (chat(stream="yes"), 400, "stream"),
        (chat(logprobs=1), 400, "logprobs"),
        ({"model": "shout"}, 400, "messages"),
        (chat(messages=[{"content": "no role"}]), 400, "messages[0]"),
        (chat(temperature="hot"), 400, "temperature"),
        (chat(top_p=0), 400, "top_p"),
        (chat(max_tokens=0), 400, "max_tokens"),
        (chat(stop=[1]), 400, "stop"),
        (chat(n=100), 400, "n"),
    ],
)
def test_bad_requests_are_400_with_openai_errors(server, body, status, param):
    got, r = call(server, "POST", "/v1/chat/completions", body)
    assert got == status and r["error"]["type"] == "invalid_request_error" and r["error"]["param"] == param
    assert r["error"]["message"]


def test_a_stream_is_server_sent_events_ending_with_done(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(chat(stream=True, messages=[{"role": "user", "content": "hello there"}])),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    lines = [line for line in resp.read().decode().split("\n") if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "HELLO THERE"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert call(server, "POST", "/v1/chat/completions", chat(), conn=conn)[0] == 200  # still kept alive


def test_unknown_paths_are_404(server):
    assert call(server, "GET", "/v1/nothing")[0] == 404
    assert call(server, "POST", "/v1/completions", chat())[0] == 404


def test_model_errors_are_500(server):
    status, r = call(
        server, "POST", "/v1/chat/completions", chat(messages=[{"role": "user", "content": "raise"}])
    )
    assert status == 500 and r["error"]["type"] == "server_error" and "boom" in r["error"]["message"]
    assert call(server, "POST", "/v1/chat/completions", chat())[0] == 200  # and it keeps serving


def test_close_frees_the_port(shout):
    srv, thread = serve_model(shout)
    port = srv.port
    srv.close()
    thread.join(5)
    assert not thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/v1/models")


# ---------------------------------------------------------------------- real clients: the OpenAI SDK


class Tagged:
    """Writes one tagged action per turn after a thought, whatever the request offers (as our bases do)."""

    name = "tagged"

    def generate(self, requests):
        return [
            Completion('The bound is off by one. <view path="mathx.py"/>', completion_tokens=9)
            for _ in requests
        ]


@pytest.fixture
def sdk():
    openai = pytest.importorskip("openai")
    servers = []

    def start(model):
        srv, _ = serve_model(model, config=ServerConfig(batch_window_s=0.002))
        servers.append(srv)
        return openai.OpenAI(base_url=srv.url, api_key="sk-local", max_retries=0)

    yield start
    for srv in servers:
        srv.close()


def test_sdk_gets_tool_calls_from_tagged_text_and_the_same_answer_streamed(sdk):
    from flywheel.actions import TOOLS

    client = sdk(Tagged())
    ask = {"model": "tagged", "messages": [{"role": "user", "content": "fix clamp"}], "tools": TOOLS}
    whole = client.chat.completions.create(**ask)
    choice = whole.choices[0]
    [tc] = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and choice.message.content == "The bound is off by one."
    assert tc.function.name == "view" and json.loads(tc.function.arguments) == {"path": "mathx.py"}

    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == choice.message.content
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert calls[0].id.startswith("call_") and calls[0].function.name == "view"
    assert "".join(t.function.arguments or "" for t in calls) == tc.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == 9

    bash = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    [tc] = client.chat.completions.create(**{**ask, "tools": bash}).choices[0].message.tool_calls
    assert tc.function.name == "bash" and json.loads(tc.function.arguments) == {"command": "cat -n mathx.py"}
    plain = client.chat.completions.create(**{**ask, "tools": None}).choices[0].message
    assert plain.tool_calls is None and plain.content.endswith('<view path="mathx.py"/>')


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from flywheel.models.tiny import build_tiny_model
    from flywheel.models.torch_engine import load_torch_model

    texts = ["def add(a, b):\n    return a + b\n", '<run_tests/> <submit/> <view path="m.py"/>'] * 8
    path = build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", texts, vocab_size=300, hidden=32, layers=1, heads=2
    )
    return load_torch_model(f"hf:{path}", seed=0)


def test_sdk_logprobs_and_token_ids_from_the_torch_engine(sdk, engine):
    client = sdk(engine)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "add"}], "max_tokens": 12, "seed": 3}
    r = client.chat.completions.create(**ask, logprobs=True)
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens > 0
    assert all(t.logprob <= 0 and isinstance(t.token, str) for t in content)
    extra = choice.model_extra
    assert (
        len(extra["token_ids"]) == len(content)
        and len(r.model_extra["prompt_token_ids"]) == r.usage.prompt_tokens
    )
    assert [engine.tokenizer.decode([i]) for i in extra["token_ids"]] == [t.token for t in content]
    chunks = list(client.chat.completions.create(**ask, logprobs=True, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert [t.logprob for t in chunks[-1].choices[0].logprobs.content] == [t.logprob for t in content]
    assert client.chat.completions.create(**ask).choices[0].logprobs is None  # only when asked for


class Gated:
    """The engine, holding its batch after the first token until the test has read a streamed chunk."""

    def __init__(self, engine):
        self.engine, self.name, self.tokenizer = engine, "gated", engine.tokenizer
        self.read, self.waited = threading.Event(), []

    def generate(self, requests):
        for r in requests:
            if r.on_token is not None:
                r.on_token = self._gate(r.on_token)
        return self.engine.generate(requests)

    def _gate(self, send):
        def on_token(token):
            send(token)
            if not self.waited:
                self.waited.append(self.read.wait(timeout=60))

        return on_token


def test_a_stream_starts_while_the_engine_is_still_generating(sdk, engine):
    gated = Gated(engine)
    client = sdk(gated)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "add"}], "max_tokens": 12, "seed": 3}
    stream = iter(client.chat.completions.create(**ask, stream=True))
    first = next(stream)
    gated.read.set()
    rest = list(stream)
    assert first.choices[0].delta.role == "assistant"
    assert gated.waited == [True]  # read while the engine held its batch after the first token
    whole = client.chat.completions.create(**ask).choices[0]
    assert "".join(c.choices[0].delta.content or "" for c in rest) == whole.message.content
    assert rest[-1].choices[0].finish_reason == whole.finish_reason


def test_engine_hands_each_token_to_on_token_as_it_samples(engine):
    seen = []
    [c] = engine.generate(
        [Request([{"role": "user", "content": "add"}], max_tokens=12, seed=3, on_token=seen.append)]
    )
    assert seen == c.token_ids and seen
