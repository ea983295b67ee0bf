"""`flywheel serve` as a subprocess: serving until a signal, and refusing bad input in one line."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys

import pytest

from flywheel.protocols import Request


@pytest.mark.parametrize(
    "stop, ignored", [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)]
)
def test_serve_command_serves_until_interrupted(stop, ignored):
    """`ignored`: started with SIGINT ignored, as a background job of a non-interactive shell is."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel", "serve", "--model", "scripted", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving scripted at http://127.0.0.1:"), proc.stderr.read()
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/models")
        assert json.loads(conn.getresponse().read())["data"][0]["id"] == "scripted"
        proc.send_signal(stop)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_serve_command_refuses_an_unknown_model():
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "serve", "--model", "nosuch"], capture_output=True, text=True
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "unknown model" in lines[0], r.stderr


def test_serve_command_serves_with_a_lookup_draft_the_plain_engines_greedy_answer():
    from flywheel.models.torch_engine import load_torch_model

    messages = [{"role": "user", "content": "Fix the bug in mathx.py. The tests in test_mathx.py fail."}]
    want = load_torch_model("toybugs-sweep").generate([Request(messages, max_tokens=40, temperature=0.0)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel", "serve", "--model", "toybugs-sweep", "--port", "0"]
        + ["--draft", "lookup", "--draft-tokens", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving toybugs-sweep at http://127.0.0.1:"), proc.stderr.read()
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"model": "toybugs-sweep", "messages": messages, "max_tokens": 40, "temperature": 0.0}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        assert answer["choices"][0]["message"]["content"] == want[0].text
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize(
    "model,draft,error",
    [
        ("scripted", "lookup", "--draft needs a torch model"),
        ("toybugs-sweep", "layers:9", "the target has 4 decoder layers"),  # the draft reaches the engine
    ],
)
def test_serve_command_refuses_a_draft_it_cannot_use(model, draft, error):
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "serve", "--model", model, "--draft", draft],
        capture_output=True,
        text=True,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and error in lines[0], r.stderr
