"""`flywheel serve --follow`: a served torch model that follows a weight store, and the `openai:` client
recording what a following server returns (token ids, log-probs, prompt ids, policy version).

Real parts throughout: a file store written by the trainer's `Publisher`, the HTTP server, the `openai`
client; the CLI tests run `python -m flywheel serve` as a subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from flywheel.models.hf import load_hf
from flywheel.models.openai_backend import OpenAIConfig, OpenAIModel
from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import load_torch_model
from flywheel.protocols import Request
from flywheel.serve import ServerConfig, serve_model
from flywheel.sync import Publisher, open_store
from flywheel.sync.follow import Follower

TEXTS = ["def add(a, b):\n    return a + b\n", '<run_tests/> <submit/> <view path="m.py"/>'] * 8
PROMPT = Request(messages=[{"role": "user", "content": "add"}], max_tokens=12, seed=3)
# served (bf16 weights, bf16 forward) vs trainer (the same bf16 weights, float32 forward) log-probs
LOGPROB_TOL = 0.05


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", TEXTS, vocab_size=300, hidden=32, layers=1, heads=2
    )


def bf16(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}


def nudge(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """A stand-in for an optimizer step: every weight moves a little."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def trainer_logprobs(model: torch.nn.Module, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """The trainer's log-probs of `ids` after `prompt` (temperature 1, full vocabulary), float32."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]


def health(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as r:
        return json.loads(r.read())


def wait_until(check, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class CorruptingStore:
    """A real store whose delta payloads are damaged on the way in while `on` (storage gone bad)."""

    def __init__(self, store) -> None:
        self.store, self.on = store, False

    def put(self, key: str, data: bytes) -> None:
        if self.on and key.startswith("objects/delta-"):
            data = data[:-10] + bytes(b ^ 0xFF for b in data[-10:])
        self.store.put(key, data)

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def list(self, prefix: str) -> list[str]:
        return self.store.list(prefix)


def test_server_follows_versions_reports_them_and_refuses_a_bad_delta(tiny, tmp_path, caplog):
    trainer, _ = load_hf(tiny)
    store = CorruptingStore(open_store(str(tmp_path / "w")))
    pub = Publisher(store, anchor_every=100)
    pub.publish(bf16(trainer), 0)
    engine = load_torch_model(f"hf:{tiny}", dtype=torch.bfloat16, seed=0)
    follower = Follower(engine.model, store, name="tiny", poll_s=0.05)
    assert follower.start() == 0
    srv, _ = serve_model(engine, config=ServerConfig(batch_window_s=0.002), follower=follower)
    client = OpenAIModel("tiny", OpenAIConfig(base_url=srv.url, logprobs=True, max_retries=0))
    caplog.set_level(logging.INFO, logger="flywheel.sync.follow")
    try:
        [c0] = client.generate([PROMPT])
        assert c0.policy_version == 0 and health(srv.url)["policy_version"] == 0
        assert (
            c0.token_ids and c0.prompt_ids and len(c0.logprobs) == len(c0.token_ids) == c0.completion_tokens
        )

        nudge(trainer, seed=1)
        pub.publish(bf16(trainer), 1)
        wait_until(lambda: health(srv.url)["policy_version"] == 1, "version 1 served")
        [c1] = client.generate([PROMPT])
        assert c1.policy_version == 1
        served = torch.tensor(c1.logprobs)
        at_v1 = trainer_logprobs(trainer_copy(tiny, pub.prev), c1.prompt_ids, c1.token_ids)
        assert (served - at_v1).abs().max() < LOGPROB_TOL
        assert any("serving version 1" in r.getMessage() for r in caplog.records)

        v1 = {k: v.clone() for k, v in engine.model.state_dict().items()}
        nudge(trainer, seed=2)
        store.on = True
        pub.publish(bf16(trainer), 2)  # its delta arrives damaged: refused, weights unchanged
        wait_until(lambda: follower.errors > 0, "the bad delta refused")
        assert health(srv.url)["policy_version"] == 1
        assert all(torch.equal(v1[k], v) for k, v in engine.model.state_dict().items())
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors and "does not match its marker" in errors[0] and "serving version 1" in errors[0]
        assert client.generate([PROMPT])[0].policy_version == 1
    finally:
        client.close()
        srv.close()


def trainer_copy(tiny: Path, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The trainer's model holding exactly the published bf16 weights, in float32."""
    model, _ = load_hf(tiny)
    model.load_state_dict({k: v.float() for k, v in weights.items()})
    return model.eval()


def test_a_server_that_follows_nothing_reports_no_version(tiny):
    engine = load_torch_model(f"hf:{tiny}", seed=0)
    srv, _ = serve_model(engine, config=ServerConfig(batch_window_s=0.002))
    client = OpenAIModel("tiny", OpenAIConfig(base_url=srv.url, logprobs=True, max_retries=0))
    try:
        [c] = client.generate([PROMPT])
        assert c.policy_version is None and "policy_version" not in health(srv.url)
        assert c.token_ids and c.prompt_ids and c.kept is None  # kept sets never travel over HTTP
        [plain] = OpenAIModel("tiny", OpenAIConfig(base_url=srv.url, max_retries=0)).generate([PROMPT])
        assert plain.token_ids is None and plain.logprobs is None and plain.prompt_ids is None
    finally:
        client.close()
        srv.close()


# ------------------------------------------------------------------------------------------------ the CLI


def serve_cmd(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flywheel", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


@pytest.mark.parametrize("case", ["store is a file", "unreachable s3", "not a torch model"])
def test_serve_follow_refuses_bad_input_in_one_line(tiny, tmp_path, case):
    (tmp_path / "afile").write_text("x")
    model, store, env = f"hf:{tiny}", str(tmp_path / "afile"), {}
    if case == "unreachable s3":
        store = "s3://weights/w"
        env = {
            "FLYWHEEL_S3_ENDPOINT": "http://127.0.0.1:9",
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
        }
    elif case == "not a torch model":
        model, store = "scripted", str(tmp_path / "w")
    proc = serve_cmd("--model", model, "--follow", store, env=env, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("flywheel: error:"), err
    assert not out


def test_serve_follow_command_waits_for_the_first_version_then_follows(tiny, tmp_path):
    trainer, _ = load_hf(tiny)
    store = open_store(str(tmp_path / "w"))
    log = tmp_path / "serve.log"
    with open(log, "w") as errfile:
        proc = serve_cmd("--model", f"hf:{tiny}", "--follow", str(tmp_path / "w"), stderr=errfile)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving hf:"), log.read_text()
        url = line.split(" at ", 1)[1].strip()
        assert health(url)["policy_version"] is None  # nothing published yet
        pub = Publisher(store, anchor_every=100)
        pub.publish(bf16(trainer), 0)
        wait_until(lambda: health(url)["policy_version"] == 0, "version 0 served")
        nudge(trainer, seed=1)
        pub.publish(bf16(trainer), 1)
        wait_until(lambda: health(url)["policy_version"] == 1, "version 1 served")
        [c] = OpenAIModel("m", OpenAIConfig(base_url=url, logprobs=True, max_retries=0)).generate([PROMPT])
        assert c.policy_version == 1 and c.token_ids
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "nothing published" in text and "serving version 0" in text and "serving version 1" in text
