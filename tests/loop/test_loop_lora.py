"""A LoRA run on the `local` backend: `flywheel train` with `[optim] lora` publishes the base once and the
adapters per version, the pool applies them to its own frozen base, and the log-probs it sampled with
match the trainer's replay at the same version within the full-weight pool tests' tolerance."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from flywheel.loop.config import LoopConfig
from flywheel.record import read_trajectories
from flywheel.rl.config import LoraConfig, load_config
from flywheel.rl.objective import replay_log_probs, replay_mask
from flywheel.rl.train import make_trainer, train
from flywheel.sync import FsspecStore
from flywheel.sync.channel import marker_key

ROOT = Path(__file__).resolve().parents[2]
LOGPROB_TOL = 0.05  # test_http_pools' bound: bf16 weights served in bf16 against float32 master weights


def lora_run(model: Path, steps: int):
    cfg = load_config(ROOT / "configs" / "quick.toml")
    cfg.model.path, cfg.train.steps, cfg.train.trajectories = f"hf:{model}", steps, "full"
    cfg.tasks.limit = 2
    cfg.rollout.efforts, cfg.rollout.tasks_per_step, cfg.rollout.group_size = ["medium"], 1, 2
    cfg.rollout.max_turns, cfg.rollout.max_tokens = {"medium": 2}, {"medium": 40}
    cfg.reward.lambdas = {"medium": 10.0}
    cfg.optim.kind, cfg.optim.lr, cfg.optim.lora = "adamw", 3e-2, LoraConfig(rank=4)
    cfg.loop = LoopConfig(backend="local", pools=1)
    return cfg


def gaps(trainer, records) -> list[float]:
    """Per generated token: |the pool's sampled log-prob - the trainer's replay of it|."""
    out = []
    for r in records:
        for t in r.turns:
            if t.get("role") != "assistant" or not t.get("token_ids"):
                continue
            with torch.no_grad():
                logits = trainer._generated_logits([t])
            tokens = torch.tensor(t["token_ids"])
            mask = replay_mask([t["kept"]], [len(tokens)], logits, tokens, trainer.cfg.rollout.top_p, 1.0)
            lp = replay_log_probs(logits, mask, tokens, trainer.cfg.rollout.temperature)
            out += (lp - torch.tensor(t["logprobs"])).abs().tolist()
    return out


def test_a_lora_run_on_local_pools_matches_the_trainer(tiny_model, tmp_path):
    cfg = lora_run(tiny_model, steps=3)
    out = tmp_path / "run"
    assert [r["version"] for r in train(cfg, out)] == [1, 2, 3]

    store = FsspecStore(str(out / "weights"))
    markers = [json.loads(store.get(marker_key(v))) for v in range(4)]
    assert all("adapters" in m and "delta" not in m for m in markers)
    assert len({m["base"]["key"] for m in markers}) == 1  # the base went once
    assert not any("/delta-" in k or "/anchor-" in k for k in store.list("objects/"))

    records = read_trajectories(out / "trajectories.jsonl")
    late = [r for r in records if r.policy_version == 2]  # sampled at version 2, trained into version 3
    trainer = make_trainer(cfg)
    behind = gaps(trainer, late)  # the trainer at version 0: the base
    trainer.load(out / "checkpoints" / "v00000002" / "trainer")
    at = gaps(trainer, late)
    assert at and max(at) < LOGPROB_TOL < max(behind), (max(at), max(behind))


@pytest.mark.slow
def test_a_lora_run_on_ray_pools_follows_the_adapters(tiny_model, tmp_path):
    ray = pytest.importorskip("ray")
    here = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH", "")] if p)
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        cfg = lora_run(tiny_model, steps=2)
        cfg.loop = LoopConfig(backend="ray", pools=1)
        assert [r["version"] for r in train(cfg, tmp_path / "run")] == [1, 2]
    finally:
        ray.shutdown()
    store = FsspecStore(str(tmp_path / "run" / "weights"))
    assert all("adapters" in json.loads(store.get(marker_key(v))) for v in range(3))
    records = read_trajectories(tmp_path / "run" / "trajectories.jsonl")
    assert {r.policy_version for r in records} == {0, 1}


def test_http_servers_follow_a_lora_trainer(tiny_model, clamp_task, tmp_path):
    """The `http` backend with `flywheel serve --follow` servers on a file store: each ends at the LoRA
    trainer's version with its log-probs within the full-weight bound of the trainer's."""
    from loop_helpers import loop_config
    from test_http_pools import PROMPT, start_server, trainer_logprobs, wait_until

    from flywheel.loop import run
    from flywheel.loop.http import health
    from flywheel.models.hf import load_hf
    from flywheel.models.openai_backend import OpenAIConfig, OpenAIModel
    from flywheel.rl.config import RunConfig
    from flywheel.rl.trainer import Trainer

    store = str(tmp_path / "w")
    proc, url = start_server(tiny_model, store, {}, tmp_path / "serve.log")
    try:
        model, tokenizer = load_hf(tiny_model)
        rcfg = RunConfig()
        rcfg.optim.kind, rcfg.optim.lr, rcfg.optim.lora = "adamw", 3e-2, LoraConfig(rank=4)
        trainer = Trainer(model, tokenizer, rcfg, {"medium": 0.0})
        cfg = loop_config(tiny_model, backend="http", pool_urls=[url], store=store, steps=2, pool_batch=1)
        assert run(cfg, trainer, [clamp_task], tmp_path / "run")["version"] == 2
        wait_until(lambda: health(url)["policy_version"] == 2, "the server at version 2")
        [c] = OpenAIModel("tiny", OpenAIConfig(base_url=url, logprobs=True, max_retries=0)).generate([PROMPT])
        gap = (torch.tensor(c.logprobs) - trainer_logprobs(trainer.served, c.prompt_ids, c.token_ids)).abs()
        assert c.policy_version == 2 and gap.max() < LOGPROB_TOL, gap.max()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
