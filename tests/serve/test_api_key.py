"""`flywheel serve --api-key`: a request without the bearer key gets 401 and nothing else, except a short
`GET /health`; real clients (raw HTTP, the OpenAI SDK, the `openai:` model) against the real server."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys

import pytest

from flywheel.errors import FlywheelError
from flywheel.models.openai_backend import OpenAIConfig, OpenAIModel
from flywheel.protocols import Request
from flywheel.serve import ServerConfig, serve_model
from flywheel.serve.auth import authorized, check_key, exposure_warning, is_loopback

KEY = "sk-test-0123456789"
UNAUTHORIZED = {
    "error": {
        "message": "a valid API key is required: send it as 'Authorization: Bearer KEY'",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


@pytest.fixture
def keyed(shout):
    srv, _ = serve_model(shout, config=ServerConfig(batch_window_s=0.002, api_key=KEY))
    yield srv
    srv.close()


def send(server, method: str, path: str, auth: str | None = None, body: dict | None = None, conn=None):
    """(status, headers, raw body) of one request, with `auth` as its Authorization header."""
    conn = conn or http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth is not None else {})}
    conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


CHAT = {"model": "shout", "messages": [{"role": "user", "content": "hi"}]}
ROUTES = [  # every route there is, and some there are not (which must not be told apart)
    ("GET", "/v1/models", None),
    ("GET", "/models", None),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/chat/completions", {**CHAT, "stream": True}),
    ("POST", "/v1/completions", {"model": "shout", "prompt": "hi"}),
    ("GET", "/v1/nothing", None),
    ("POST", "/v1/chat/completions", None),  # no body at all
    ("PUT", "/v1/chat/completions", CHAT),
    ("DELETE", "/v1/models", None),
    ("PATCH", "/v1/models", {}),
]
WRONG = [None, "", f"Bearer {KEY}x", "Bearer sk-test", f"Basic {KEY}", KEY, "Bearer", f"Bearer  {KEY[:-1]}"]


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_requests_without_the_key_get_401_and_nothing_else(keyed, shout, method, path, body):
    for auth in WRONG:
        status, headers, raw = send(keyed, method, path, auth, body)
        assert status == 401 and json.loads(raw) == UNAUTHORIZED, (auth, raw)
        assert headers["Server"] == "flywheel" and b"shout" not in raw and "Python" not in str(headers)
    assert shout.batches == []  # nothing was generated


def test_the_right_key_is_served_and_a_refused_request_leaves_its_connection_usable(keyed, shout):
    conn = http.client.HTTPConnection("127.0.0.1", keyed.port, timeout=10)
    assert send(keyed, "POST", "/v1/chat/completions", "Bearer nope", CHAT, conn)[0] == 401
    status, _, raw = send(keyed, "POST", "/v1/chat/completions", f"Bearer {KEY}", CHAT, conn)
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "HI"
    status, _, raw = send(keyed, "GET", "/v1/models", f"bearer {KEY}", conn=conn)  # the scheme in any case
    assert status == 200 and json.loads(raw)["data"][0]["id"] == "shout"
    assert send(keyed, "GET", "/v1/nothing", f"Bearer {KEY}")[0] == 404  # a path is told only with the key
    assert send(keyed, "DELETE", "/v1/models", f"Bearer {KEY}", conn=conn)[0] == 405  # and a method


class Pinned:
    """A follower that applied version 3 once (a 0.25 s pause) and stays there: what the server asks of one."""

    version, updates = 3, [(3, 0.25)]

    def update(self) -> int:
        return self.version

    def close(self) -> None:
        pass


def test_health_answers_anyone_with_only_status_and_version(keyed, shout):
    status, _, raw = send(keyed, "GET", "/health")
    assert status == 200 and json.loads(raw) == {"status": "ok"}  # follows nothing: no version to tell

    srv, _ = serve_model(shout, config=ServerConfig(api_key=KEY), follower=Pinned())
    try:
        full = json.loads(send(srv, "GET", "/health", f"Bearer {KEY}")[2])
        assert full == {"status": "ok", "policy_version": 3, "last_pause_s": 0.25}
        for auth in (None, "Bearer nope", f"Basic {KEY}"):
            status, _, raw = send(srv, "GET", "/v1/health", auth)
            assert status == 200 and json.loads(raw) == {"status": "ok", "policy_version": 3}
    finally:
        srv.close()


def test_the_openai_sdk_and_the_openai_model_with_and_without_the_key(keyed):
    openai = pytest.importorskip("openai")
    right = openai.OpenAI(base_url=keyed.url, api_key=KEY, max_retries=0)
    assert right.chat.completions.create(**CHAT).choices[0].message.content == "HI"
    assert [m.id for m in right.models.list()] == ["shout"]
    wrong = openai.OpenAI(base_url=keyed.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.chat.completions.create(**CHAT)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()

    ask = [Request(messages=CHAT["messages"], max_tokens=8)]
    [ok] = OpenAIModel("shout", OpenAIConfig(base_url=keyed.url, api_key=KEY, max_retries=0)).generate(ask)
    assert ok.text == "HI" and ok.error is None
    no = OpenAIConfig(base_url=keyed.url, api_key="sk-local", max_retries=0, connect_retries=0)
    [refused] = OpenAIModel("shout", no).generate(ask)
    assert refused.finish_reason == "error" and "401" in refused.error


def test_the_bearer_check():
    assert authorized(f"Bearer {KEY}", KEY) and authorized(f"  BEARER   {KEY} ", KEY)
    assert not any(authorized(h, KEY) for h in WRONG)
    assert not authorized("Bearer sk-tëst", "sk-test")  # a header that is not ASCII is just wrong


def test_a_key_must_be_nonempty_printable_ascii():
    check_key(None)
    check_key(KEY)
    for bad in ("", "two words", "tab\tkey", "clé"):
        with pytest.raises(FlywheelError, match="api key"):
            ServerConfig(api_key=bad)
    assert KEY not in repr(ServerConfig(api_key=KEY))


def test_serving_beyond_loopback_without_a_key_is_warned_about():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host) and exposure_warning(host, None) is None
    for host in ("0.0.0.0", "::", "", "10.0.0.5", "example.org"):
        warning = exposure_warning(host, None)
        assert warning and "\n" not in warning and "--api-key" in warning, host
        assert exposure_warning(host, KEY) is None


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flywheel", "serve", "--model", "scripted", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_serve_command_takes_its_key_from_the_environment_and_warns_without_one():
    open_, keyed = run_serve("--host", "0.0.0.0"), run_serve(env={"FLYWHEEL_API_KEY": KEY})
    try:
        port = {}
        for proc in (open_, keyed):
            line = proc.stdout.readline()
            assert line.startswith("serving scripted at http://"), proc.stderr.read()
            port[proc] = int(line.rsplit(":", 1)[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port[keyed], timeout=10)
        conn.request("GET", "/v1/models")
        refused = conn.getresponse()
        assert refused.status == 401 and json.loads(refused.read()) == UNAUTHORIZED
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert json.loads(conn.getresponse().read())["data"][0]["id"] == "scripted"
        conn = http.client.HTTPConnection("127.0.0.1", port[open_], timeout=10)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().status == 200
    finally:
        for proc in (open_, keyed):
            proc.terminate()
            proc.wait(timeout=20)
    warnings = [line for line in open_.stderr.read().splitlines() if "warning" in line]
    assert len(warnings) == 1 and "0.0.0.0 without an API key" in warnings[0]
    assert "warning" not in keyed.stderr.read()
    for proc in (open_, keyed):
        proc.stdout.close()
        proc.stderr.close()


def test_serve_command_refuses_an_empty_key_in_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "serve", "--model", "scripted", "--api-key", ""],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "must not be empty" in lines[0], r.stderr
