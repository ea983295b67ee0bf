"""The `http` backend: `flywheel serve --follow` servers as inference pools, the store on real S3.

Two servers run as subprocesses on loopback and follow a SeaweedFS bucket; the driver trains a tiny model
a few steps against them (episodes run here, generation there). Checked: every server ends at the
trainer's version and its log-probs for a fixed prompt match the trainer's at that version, records carry
the servers' token ids, log-probs and per-turn versions, and bad configurations are one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from loop_helpers import FakeTrainer, loop_config

from flywheel.errors import FlywheelError
from flywheel.loop import run
from flywheel.loop.http import health
from flywheel.models.openai_backend import OpenAIConfig, OpenAIModel
from flywheel.protocols import Request

# Served log-probs come from the published bf16 weights run in bf16; the trainer's from its float32
# master weights in float32. On the tiny model the two differ by about 0.005 nats per token; a server a
# version behind differs by far more (see `test_servers_follow_the_trainer_...`).
LOGPROB_TOL = 0.05
PROMPT = Request(messages=[{"role": "user", "content": "fix clamp"}], max_tokens=16, seed=7)


def start_server(model: Path, store: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flywheel", "serve", "--model", f"hf:{model}", "--port", "0"]
            + ["--follow", store],
            stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **env},
        )  # fmt: skip
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise AssertionError(f"server did not start: {log.read_text()}")
    return proc, line.split(" at ", 1)[1].strip()


@pytest.fixture
def servers(tiny_model, weed, tmp_path):
    """Two `flywheel serve --follow` servers on the bucket `weights/http-run`, with its S3 options."""
    from sync_helpers import ACCESS_KEY, SECRET_KEY  # on the path through the weed fixture

    env = {"FLYWHEEL_S3_ENDPOINT": weed.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY}
    env["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
    store = "s3://weights/http-run"
    started = [start_server(tiny_model, store, env, tmp_path / f"serve-{i}.log") for i in range(2)]
    opts = {"endpoint_url": weed.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}
    yield [url for _, url in started], store, opts
    for proc, _ in started:
        proc.terminate()
    for proc, _ in started:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_until(check, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def trainer_logprobs(model: torch.nn.Module, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]


def test_servers_follow_the_trainer_and_match_its_logprobs(servers, tiny_model, clamp_task, tmp_path):
    urls, store, opts = servers
    trainer = FakeTrainer(tiny_model, lr=3e-2)
    start = {n: t.clone() for n, t in trainer.model.state_dict().items()}
    cfg = loop_config(
        tiny_model, backend="http", pool_urls=urls, store=store, store_options=opts, steps=3, pool_batch=1,
        max_staleness=1, catch_up_wait_s=20.0,
    )  # fmt: skip
    out = tmp_path / "run"
    summary = run(cfg, trainer, [clamp_task], out)
    assert summary["version"] == 3 and set(summary["records_per_pool"]) == {"pool-0", "pool-1"}

    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    turns = [t for r in records for t in r["turns"] if t["role"] == "assistant"]
    assert turns and all(t["token_ids"] and len(t["logprobs"]) == len(t["token_ids"]) for t in turns)
    assert all(t["kept"] is None and isinstance(t["policy_version"], int) for t in turns)
    for r in records:
        versions = [t["policy_version"] for t in r["turns"] if t["role"] == "assistant"]
        assert r["policy_version"] == min(versions) and r["step"] - 1 - r["policy_version"] <= 1

    trainer.model.eval()
    initial = FakeTrainer(tiny_model)
    initial.model.load_state_dict(start)
    for url in urls:  # the last version is published as the run ends: wait for each server to apply it
        wait_until(lambda url=url: health(url)["policy_version"] == trainer.version == 3, f"{url} at 3")
        [c] = OpenAIModel("tiny", OpenAIConfig(base_url=url, logprobs=True, max_retries=0)).generate([PROMPT])
        assert c.policy_version == 3
        served = torch.tensor(c.logprobs)
        gap = (served - trainer_logprobs(trainer.model, c.prompt_ids, c.token_ids)).abs().max()
        behind = (served - trainer_logprobs(initial.model, c.prompt_ids, c.token_ids)).abs().max()
        assert gap < LOGPROB_TOL < behind, (gap, behind)


def test_bad_http_configs_are_refused_in_one_line(tiny_model, clamp_task, tmp_path):
    from flywheel.loop.config import check_config

    with pytest.raises(FlywheelError, match="needs `pool_urls`"):
        check_config(loop_config(tiny_model, backend="http", store=str(tmp_path / "w")))
    with pytest.raises(FlywheelError, match="needs `store`"):
        check_config(loop_config(tiny_model, backend="http", pool_urls=["http://127.0.0.1:9/v1"]))
    with pytest.raises(FlywheelError, match="http:// or https://"):
        check_config(loop_config(tiny_model, backend="http", pool_urls=["127.0.0.1:9"], store="w"))
    cfg = loop_config(
        tiny_model, backend="http", pool_urls=["http://127.0.0.1:9/v1"], store=str(tmp_path / "w")
    )
    with pytest.raises(FlywheelError, match="does not answer") as e:
        run(cfg, FakeTrainer(tiny_model), [clamp_task], tmp_path / "run")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "loop", ['backend = "http"', 'backend = "http"\npool_urls = ["http://127.0.0.1:9/v1"]']
)
def test_flywheel_train_refuses_http_pools_it_cannot_use(tiny_model, tmp_path, loop):
    config = tmp_path / "run.toml"
    store = tmp_path / "w"
    config.write_text(
        f'[model]\npath = "{tiny_model}"\n[tasks]\nsuite = "toybugs"\nlimit = 2\n'
        f'[train]\nsteps = 1\n[loop]\n{loop}\nstore = "{store}"\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "train", str(config), "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert ("pool_urls" in lines[0]) if "pool_urls" not in loop else ("does not answer" in lines[0])


# ------------------------------------------------------------------- servers with a key (serve --api-key)

KEY = "sk-pool-test-key"


@pytest.fixture
def keyed_server(tiny_model, tmp_path):
    """One keyed `flywheel serve --follow` server in this process, following a file store."""
    from flywheel.serve import ServerConfig, serve_model
    from flywheel.serve.follow import load_following

    store = str(tmp_path / "weights")
    policy, follower = load_following(f"hf:{tiny_model}", store)
    srv, _ = serve_model(policy, config=ServerConfig(api_key=KEY), follower=follower)
    yield srv, store
    srv.close()


def test_the_http_backend_sends_its_key_on_completions_and_health_polls(
    keyed_server, tiny_model, clamp_task, tmp_path, monkeypatch
):
    """Without the key the run is refused at start in one line (not turn by turn); the key comes from
    `pool_api_key`, else from FLYWHEEL_API_KEY; with it, every turn is generated by the keyed server."""
    srv, store = keyed_server
    monkeypatch.delenv("FLYWHEEL_API_KEY", raising=False)
    cfg = loop_config(
        tiny_model, backend="http", pool_urls=[srv.url], store=store, steps=2, pool_batch=1, max_staleness=1
    )
    with pytest.raises(FlywheelError, match="needs a key") as e:
        run(cfg, FakeTrainer(tiny_model), [clamp_task], tmp_path / "nokey")
    assert "\n" not in str(e.value) and "pool_api_key" in str(e.value)
    monkeypatch.setenv("FLYWHEEL_API_KEY", "sk-wrong")  # sent when the run config names no key
    with pytest.raises(FlywheelError, match="refuses the key sent"):
        run(cfg, FakeTrainer(tiny_model), [clamp_task], tmp_path / "wrong")

    out = tmp_path / "run"
    keyed = dataclasses.replace(cfg, pool_api_key=KEY)  # the run config's key comes first
    assert KEY not in repr(keyed)
    assert run(keyed, FakeTrainer(tiny_model), [clamp_task], out)["version"] == 2
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert records and not any(r.get("infra_failure") or r.get("error") for r in records)
    turns = [t for r in records for t in r["turns"] if t["role"] == "assistant"]
    assert turns and all(t["token_ids"] and isinstance(t["policy_version"], int) for t in turns)
    full, public = health(srv.url, key=KEY), health(srv.url)
    assert "last_pause_s" in full and public == {k: full[k] for k in ("status", "policy_version")}


def test_the_run_config_names_the_pools_key(monkeypatch):
    from flywheel.loop.http import pool_key
    from flywheel.rl.config import RunConfig
    from flywheel.settings import from_dict

    loop = {"backend": "http", "pool_urls": ["http://10.0.0.5:8001/v1"], "store": "w", "pool_api_key": KEY}
    assert from_dict(RunConfig, {"loop": loop}, "run.toml").loop.pool_api_key == KEY
    monkeypatch.setenv("FLYWHEEL_API_KEY", "sk-env")
    assert pool_key(KEY) == KEY and pool_key("") == "sk-env"
    monkeypatch.delenv("FLYWHEEL_API_KEY")
    assert pool_key("") is None
