"""The OpenAI client backend against a real HTTP server (flywheel.serve) on loopback."""

from __future__ import annotations

import socket
import threading

import openai
import pytest

from flywheel.errors import FlywheelError
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes
from flywheel.models.openai_backend import (
    OpenAIConfig,
    OpenAIModel,
    error_completion,
    function_tool,
    is_context_error,
    load_openai_model,
    parse_tool_call,
    request_kwargs,
)
from flywheel.models.scripted import ScriptedModel
from flywheel.protocols import Completion, Model, Request
from flywheel.serve import ModelServer, ServerConfig, serve_model

ECHO_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


class FakeModel:
    """Deterministic policy: echoes the last user/tool message, or calls the first tool with it.

    Special messages drive the failure paths: "raise" (generate raises), "fail" (Completion.error),
    "long" (prompt exceeds the context), "badjson" (tool call with invalid JSON arguments) and "wait"
    (blocks until `release` is set). Records every batch it is given.
    """

    name = "fake"

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.seen: list[Request] = []
        self.release = threading.Event()

    def generate(self, requests):
        self.batches.append(len(requests))
        self.seen.extend(requests)
        return [self._one(r) for r in requests]

    def _one(self, r: Request) -> Completion:
        last = [m for m in r.messages if m["role"] in ("user", "tool")][-1]["content"]
        prompt = sum(len(str(m.get("content") or "").split()) for m in r.messages)
        if last == "raise":
            raise RuntimeError("boom")
        if last == "fail":
            return Completion("", finish_reason="error", error="fake failure")
        if last == "long":
            return Completion("", finish_reason="context", prompt_tokens=prompt)
        if last == "wait":
            self.release.wait(10)
        if r.tools:
            name = r.tools[0]["function"]["name"]
            call = {"id": "call_7", "name": name, "arguments": {"text": last, "n": 2}}
            if last == "badjson":
                call = {"id": "call_7", "name": name, "arguments": None, "arguments_raw": '{"text": '}
            return Completion("", prompt_tokens=prompt, completion_tokens=5, tool_calls=[call])
        words = f"echo: {last}".split()[: r.max_tokens]
        finish = "length" if len(words) == r.max_tokens else "stop"
        return Completion(" ".join(words), finish, prompt_tokens=prompt, completion_tokens=len(words))


@pytest.fixture
def fake() -> FakeModel:
    return FakeModel()


@pytest.fixture
def server(fake):
    srv, _ = serve_model(fake, config=ServerConfig(batch_window_s=0.002))
    yield srv
    fake.release.set()
    srv.close()


def client(url: str, **cfg) -> OpenAIModel:
    opts = {"max_retries": 0, "connect_retries": 0, "timeout_s": 10.0, **cfg}
    return OpenAIModel("fake", OpenAIConfig(base_url=url, **opts))


def user(text: str, **kw) -> Request:
    return Request(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": text}], **kw
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------- round trips


def test_text_round_trip_with_usage_and_sampling_options(fake, server):
    model = client(server.url)
    assert isinstance(model, Model) and model.name == "openai:fake"
    req = user("hello there", temperature=0.5, top_p=0.9, max_tokens=7, stop=["\n\n"], seed=3)
    [c] = model.generate([req])
    assert c.error is None and c.text == "echo: hello there" and c.finish_reason == "stop"
    assert (c.prompt_tokens, c.completion_tokens) == (4, 3)
    got = fake.seen[-1]
    assert (got.temperature, got.top_p, got.max_tokens, got.stop, got.seed) == (0.5, 0.9, 7, ["\n\n"], 3)
    assert got.tools is None
    [cut] = model.generate([user("one two three", max_tokens=2)])
    assert cut.text == "echo: one" and cut.finish_reason == "length"


def test_tool_call_round_trip_parses_arguments(fake, server):
    [c] = client(server.url).generate([user("hi", tools=[ECHO_TOOL])])
    assert c.error is None and c.text == "" and c.finish_reason == "stop"
    assert c.tool_calls == [{"id": "call_7", "name": "echo", "arguments": {"text": "hi", "n": 2}}]
    assert fake.seen[-1].tools == [ECHO_TOOL]


def test_invalid_tool_arguments_are_kept_raw(server):
    [c] = client(server.url).generate([user("badjson", tools=[ECHO_TOOL])])
    assert c.error is None
    assert c.tool_calls == [{"id": "call_7", "name": "echo", "arguments": None, "arguments_raw": '{"text": '}]


def test_multi_turn_with_tool_messages(fake, server):
    messages = [
        {"role": "system", "content": "use tools"},
        {"role": "user", "content": "say hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text": "hi"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
    ]
    [c] = client(server.url).generate([Request(messages=messages)])
    assert c.error is None and c.text == "echo: hi"
    got = fake.seen[-1].messages
    assert got[2]["tool_calls"][0]["function"] == {"name": "echo", "arguments": '{"text": "hi"}'}
    assert got[3] == {"role": "tool", "tool_call_id": "call_1", "content": "hi"}


def test_concurrent_requests_are_batched(fake):
    srv, _ = serve_model(fake, config=ServerConfig(batch_window_s=1.0, max_batch=4))
    try:
        texts = [f"request {i}" for i in range(8)]
        out = client(srv.url, concurrency=8).generate([user(t) for t in texts])
    finally:
        srv.close()
    assert [c.text for c in out] == [f"echo: {t}" for t in texts]  # answers stay with their requests
    assert sum(fake.batches) == 8 and max(fake.batches) <= 4 and len(fake.batches) < 8


def test_context_overflow_is_context_not_error(server):
    [c] = client(server.url).generate([user("long")])
    assert c.finish_reason == "context" and c.error is None


def test_harness_episode_over_http_solves_a_task(clamp_task):
    """The whole rollout path: harness -> client -> HTTP -> server -> oracle, with native tool calls."""
    srv, _ = serve_model(ScriptedModel())
    try:
        model = client(srv.url, send_meta=True, native_tools=True)
        spec = EpisodeSpec(clamp_task, get_effort("medium"))
        [rec] = run_episodes([spec], model, cfg=HarnessConfig(action_format="auto"), concurrency=1)
    finally:
        srv.close()
    assert rec.ending == "submitted" and rec.success, rec.error
    assert [t["name"] for t in rec.turns if t["role"] == "tool"][-1] == "submit"
    assert rec.completion_tokens > 0 and any("tool_calls" in t for t in rec.turns)


# ----------------------------------------------------------------------------------------- failures


def test_server_errors_come_back_after_retries(fake, server):
    model = client(server.url, max_retries=1)
    [c] = model.generate([user("raise")])
    assert c.finish_reason == "error" and "HTTP 500" in c.error and "boom" in c.error
    assert fake.batches == [1, 1]  # the first attempt and the client's one retry
    [c] = client(server.url).generate([user("fail")])
    assert c.finish_reason == "error" and "fake failure" in c.error


def test_one_failure_does_not_spoil_the_others(server):
    out = client(server.url, concurrency=2).generate([user("fail"), user("fine")])
    assert out[0].error and out[1].error is None and out[1].text == "echo: fine"


def test_dead_server_is_an_error_not_an_exception():
    model = client(f"http://127.0.0.1:{free_port()}/v1", connect_retries=2, retry_backoff_s=0.01)
    [c] = model.generate([user("anyone?")])
    assert c.finish_reason == "error" and c.error.startswith("connection error")


def test_connection_retries_ride_out_a_late_server(fake):
    port = free_port()
    started: list[ModelServer] = []
    timer = threading.Timer(0.1, lambda: started.append(serve_model(fake, port=port)[0]))
    timer.start()
    try:
        model = client(f"http://127.0.0.1:{port}/v1", connect_retries=4, retry_backoff_s=0.25)
        [c] = model.generate([user("late")])
    finally:
        timer.join()
        started[0].close()
    assert c.error is None and c.text == "echo: late"


def test_timeout_is_an_error(fake, server):
    [c] = client(server.url, timeout_s=0.3).generate([user("wait")])
    fake.release.set()
    assert c.finish_reason == "error" and c.error.startswith("timeout")


# ------------------------------------------------------------------------------------ pure functions


def test_request_kwargs_and_tools():
    bare = {"name": "echo", "parameters": {"type": "object"}}
    kw = request_kwargs("m", Request(messages=[{"role": "user", "content": "x"}], tools=[bare]))
    assert kw["tools"] == [{"type": "function", "function": bare}] and kw["tool_choice"] == "auto"
    assert "stop" not in kw and "seed" not in kw and "extra_body" not in kw and kw["max_tokens"] == 512
    meta = Request(messages=[], meta={"episode": "e1"})
    assert request_kwargs("m", meta, send_meta=True)["extra_body"] == {"flywheel_meta": {"episode": "e1"}}
    assert "extra_body" not in request_kwargs("m", meta)
    assert function_tool(ECHO_TOOL) is ECHO_TOOL


def test_request_kwargs_ask_for_logprobs_and_token_ids():
    prompt = Request(messages=[{"role": "user", "content": "add"}], max_tokens=12, seed=3)
    kw = request_kwargs("m", prompt, logprobs=True)
    assert kw["logprobs"] is True and kw["extra_body"] == {"return_token_ids": True}
    assert "logprobs" not in request_kwargs("m", prompt)


def test_parse_tool_call():
    assert parse_tool_call("a", "view", '{"path": "x.py"}')["arguments"] == {"path": "x.py"}
    assert parse_tool_call("a", "submit", "")["arguments"] == {}
    assert parse_tool_call("a", "view", "{path}") == {
        "id": "a",
        "name": "view",
        "arguments": None,
        "arguments_raw": "{path}",
    }


@pytest.mark.parametrize(
    "status,code,message,expected",
    [
        (400, None, "This model's maximum context length is 2048 tokens. However, you requested 3000", True),
        (400, None, "The input (5000 tokens) is longer than the model's context length (4096 tokens).", True),
        (400, None, "the request exceeds the available context size, try increasing it", True),
        (400, "context_length_exceeded", "too long", True),
        (400, None, "messages[0] must have a role", False),
        (500, None, "maximum context length reached while decoding", False),
    ],
)
def test_is_context_error(status, code, message, expected):
    assert is_context_error(status, code, message) is expected


def test_error_completion_of_any_exception():
    c = error_completion(ValueError("odd"), 1.0)
    assert c.finish_reason == "error" and c.error == "ValueError: odd"
    assert issubclass(openai.APITimeoutError, openai.APIConnectionError)  # why timeouts are checked first


def test_load_openai_model(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    m = load_openai_model("openai:qwen", concurrency=3)
    assert m.name == "openai:qwen" and m.base_url == "http://127.0.0.1:9/v1" and m.config.concurrency == 3
    assert load_openai_model("openai:qwen", base_url="http://h:1/v1").base_url == "http://h:1/v1"
    for spec, opts, fragment in [
        ("openai:", {}, "openai:<model-name>"),
        ("openai:x", {"temperature": 1}, "unknown option"),
        ("openai:x", {"base_url": "localhost:8000"}, "http://"),
    ]:
        with pytest.raises(FlywheelError, match=fragment):
            load_openai_model(spec, **opts)


def test_spec_options_turn_on_native_tools():
    m = load_openai_model("openai:qwen?tools=native&concurrency=4&send_meta=true", base_url="http://h:1/v1")
    assert m.model == "qwen" and m.native_tools and m.config.concurrency == 4 and m.config.send_meta
    assert not load_openai_model("openai:qwen?tools=tagged", base_url="http://h:1/v1").native_tools
    for spec, fragment in [
        ("openai:x?tools=yes", "native or tagged"),
        ("openai:x?nope=1", "unknown option"),
        ("openai:x?concurrency=many", "bad value"),
        ("openai:x?junk", "key=value"),
    ]:
        with pytest.raises(FlywheelError, match=fragment):
            load_openai_model(spec, base_url="http://h:1/v1")


class ClampPlayer:
    """Plays the clamp task's three-step plan (edit, run_tests, submit) as tool calls, when tools are offered;
    answers in plain words when they are not. Records whether each request carried tools."""

    name = "clamp-player"
    PLAN = [
        ("edit", {"path": "mathx.py", "old": "if x >= hi + 1:", "new": "if x > hi:"}),
        ("run_tests", {}),
        ("submit", {}),
    ]

    def __init__(self) -> None:
        self.offered: list[bool] = []

    def generate(self, requests):
        out = []
        for r in requests:
            self.offered.append(bool(r.tools))
            step = sum(1 for m in r.messages if m["role"] == "tool")
            if not r.tools or step >= len(self.PLAN):
                out.append(Completion("I would call a tool, but none is offered.", completion_tokens=9))
                continue
            name, args = self.PLAN[step]
            out.append(Completion("", completion_tokens=5, tool_calls=[{"name": name, "arguments": args}]))
        return out


@pytest.mark.parametrize("spec, flag", [("openai:player", "native"), ("openai:player?tools=native", "auto")])
def test_eval_over_http_with_native_actions_solves_clamp(clamp_task, tmp_path, spec, flag):
    """`flywheel eval --action-format native` (or a spec that says so) offers the tools a chat model calls."""
    import json
    import subprocess
    import sys

    player = ClampPlayer()
    srv, _ = serve_model(player)
    try:
        args = ["--suite", clamp_task.root, "--model", spec, "--base-url", srv.url, "--action-format", flag]
        r = subprocess.run(
            [sys.executable, "-m", "flywheel", "eval", *map(str, args), "--out", tmp_path / "run"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        srv.close()
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["n"] == 1 and summary["successes"] == 1, summary
    assert player.offered and all(player.offered)
