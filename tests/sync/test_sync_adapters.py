"""LoRA adapter payloads over the file:// store (`flywheel.sync.adapters`, `AdapterPublisher`): a LoRA
trainer publishes its base once and its adapters per version; subscribers on the plain base model end
bitwise at the trainer's merged bf16 weights, join late from the base plus the latest payload, and refuse
and recover from a damaged payload or weights that drifted."""

from __future__ import annotations

import json
import time

import pytest
import torch
from sync_helpers import bitwise

from flywheel.models.hf import load_hf
from flywheel.models.tiny import build_tiny_model
from flywheel.rl.config import LoraConfig, RunConfig
from flywheel.rl.trainer import Trainer
from flywheel.sync import (
    AdapterPublisher,
    DeltaError,
    FsspecStore,
    Subscriber,
    apply_adapters,
    encode_adapters,
    encode_delta,
)
from flywheel.sync.adapters import decode_masters, encode_masters
from flywheel.sync.channel import marker_key
from flywheel.sync.follow import bind

TEXTS = ["def f(x):\n    return x + 1\n", "<run_tests/> <submit/>", '<view path="a.py"/>'] * 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", TEXTS, vocab_size=300, hidden=128, layers=2, heads=2
    )


def lora_trainer(tiny) -> Trainer:
    """A LoRA trainer on float32 master weights (most of them between two bf16 numbers)."""
    model, tokenizer = load_hf(tiny, dtype=torch.float32)
    assert any(not torch.equal(p, p.bfloat16().float()) for p in model.parameters())
    cfg = RunConfig()
    cfg.optim.kind, cfg.optim.lora = "adamw", LoraConfig(rank=4, alpha=8.0)
    return Trainer(model, tokenizer, cfg, {})


def train_step(trainer: Trainer, seed: int) -> None:
    """Move every adapter as an optimizer step would (B leaves zero), merge, and count the version."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in trainer.lora.trainable():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    trainer.lora.merge()
    trainer.version += 1


def follower(tiny) -> dict[str, torch.Tensor]:
    """A pool's weights: the plain base model loaded in bf16, its tensors bound for in-place updates."""
    model, _ = load_hf(tiny, dtype=torch.bfloat16)
    return dict(bind(model))


def publish(pub: AdapterPublisher, trainer: Trainer):
    return pub.publish(trainer.serving_adapters(), trainer.version)


def test_round_trip_is_bitwise_and_far_smaller_than_a_delta(tiny, tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    trainer = lora_trainer(tiny)
    pub = AdapterPublisher(store)
    first = pub.start(trainer.serving_base(), trainer.serving_adapters(), 0)
    assert first is not None and first.kind == "adapters+base" and first.anchor_bytes > 0
    assert {k.split("-")[0] for k in store.list("objects/")} == {
        "objects/base",
        "objects/masters",
        "objects/adapters",
    }
    sub = Subscriber(store, follower(tiny))
    ptrs = {n: t.data_ptr() for n, t in sub.weights.items()}
    assert sub.catch_up() == 0 and bitwise(sub.weights, trainer.serving_weights())
    for step in range(1, 4):
        before = trainer.serving_weights()
        train_step(trainer, step)
        stats = publish(pub, trainer)
        after = trainer.serving_weights()
        assert not bitwise(before, after)
        full = encode_delta(before, after, version=step, base_version=step - 1)
        assert stats.kind == "adapters" and stats.anchor_bytes == 0  # the base went once
        assert stats.delta_bytes * 4 < len(full), (stats.delta_bytes, len(full))
        assert sub.catch_up() == step and bitwise(sub.weights, after)
    assert {n: t.data_ptr() for n, t in sub.weights.items()} == ptrs  # applied in place
    assert sub.recoveries == 0 and sub.last_error is None


def test_a_late_follower_needs_the_base_and_the_latest_payload_only(tiny, tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    trainer = lora_trainer(tiny)
    pub = AdapterPublisher(store)
    pub.start(trainer.serving_base(), trainer.serving_adapters(), 0)
    for step in range(1, 6):
        train_step(trainer, step)
        publish(pub, trainer)
    sub = Subscriber(store, follower(tiny))
    plan = sub.plan()
    assert plan is not None and [s.kind for s in plan.steps] == ["base", "masters", "adapters"]
    assert sub.apply(plan) == 5 and bitwise(sub.weights, trainer.serving_weights())
    # a restarted trainer resumes the store's version with the same adapters, and refuses other ones
    again = AdapterPublisher(store)
    assert again.start(trainer.serving_base(), trainer.serving_adapters(), 5) is None
    train_step(trainer, 99)
    with pytest.raises(DeltaError, match="other weights"):
        AdapterPublisher(store).start(trainer.serving_base(), trainer.serving_adapters(), 5)
    assert again.publish(trainer.serving_adapters(), 6).kind == "adapters"
    assert sub.catch_up() == 6 and bitwise(sub.weights, trainer.serving_weights())


def test_a_damaged_payload_is_refused_then_the_next_version_recovers(tiny, tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    trainer = lora_trainer(tiny)
    pub = AdapterPublisher(store)
    pub.start(trainer.serving_base(), trainer.serving_adapters(), 0)
    train_step(trainer, 1)
    publish(pub, trainer)
    sub = Subscriber(store, follower(tiny))
    assert sub.catch_up() == 1
    good = trainer.serving_weights()
    train_step(trainer, 2)
    publish(pub, trainer)
    key = json.loads(store.get(marker_key(2)))["adapters"]["key"]
    blob = bytearray(store.get(key))
    blob[-5] ^= 0xFF
    store.put(key, bytes(blob))  # damaged in storage after publishing
    assert sub.catch_up() == 1 and bitwise(sub.weights, good)
    assert "does not match its marker" in (sub.last_error or "") and sub.recoveries == 1
    train_step(trainer, 3)
    publish(pub, trainer)
    assert sub.catch_up() == 3 and bitwise(sub.weights, trainer.serving_weights())


@pytest.mark.parametrize("drift", ["other tensor", "base copy"])
def test_drifted_weights_are_refused_and_recovered_from_the_base(tiny, tmp_path, drift):
    store = FsspecStore(str(tmp_path / "w"))
    trainer = lora_trainer(tiny)
    pub = AdapterPublisher(store)
    pub.start(trainer.serving_base(), trainer.serving_adapters(), 0)
    train_step(trainer, 1)
    publish(pub, trainer)
    sub = Subscriber(store, follower(tiny))
    assert sub.catch_up() == 1
    if drift == "other tensor":  # a tensor no adapter touches (a norm) moved on this follower
        name = next(n for n in sub.weights if "norm" in n)
        sub.weights[name].add_(1.0)
    else:  # the follower's float32 base of an adapted matrix moved
        next(iter(sub.masters.values()))[0, 0] += 1e-3
    train_step(trainer, 2)
    publish(pub, trainer)
    assert sub.catch_up() == 2 and bitwise(sub.weights, trainer.serving_weights())
    assert sub.recoveries == 1 and "weights left unchanged" in (sub.last_error or "")


def test_a_refused_apply_leaves_the_weights_untouched(tiny):
    trainer = lora_trainer(tiny)
    train_step(trainer, 1)
    adapters = trainer.serving_adapters()
    base32 = trainer.serving_base()
    base = {n: t.bfloat16() for n, t in base32.items()}
    masters = {n: base32[n] for n in adapters.a}
    blob = encode_adapters(base, masters, adapters, version=1)
    weights = {n: t.clone() for n, t in base.items()}
    wrong = {n: t.clone() for n, t in masters.items()}
    next(iter(wrong.values()))[0, 0] += 1e-3
    with pytest.raises(DeltaError, match="base of .* differs"):
        apply_adapters(weights, wrong, blob)
    assert bitwise(weights, base)
    with pytest.raises(DeltaError, match="another base"):
        apply_adapters(weights, masters, blob, base_digest="0" * 32)
    assert apply_adapters(weights, masters, blob) == 1 and bitwise(weights, trainer.serving_weights())
    with pytest.raises(DeltaError, match="corrupt adapters"):
        apply_adapters(weights, masters, blob[:-3])
    assert decode_masters(encode_masters(masters)).keys() == masters.keys()
    with pytest.raises(DeltaError, match="corrupt LoRA base"):
        decode_masters(encode_masters(masters)[:-3])


def test_a_following_server_serves_the_trainers_merge(tiny, tmp_path):
    from flywheel.serve.follow import load_following

    store = FsspecStore(str(tmp_path / "w"))
    trainer = lora_trainer(tiny)
    pub = AdapterPublisher(store)
    pub.start(trainer.serving_base(), trainer.serving_adapters(), 0)
    train_step(trainer, 1)
    publish(pub, trainer)
    policy, follower = load_following(f"hf:{tiny}", str(tmp_path / "w"))
    served = lambda: {n: t for n, t in policy.model.state_dict().items()}  # noqa: E731
    assert follower.version == 1 and bitwise(served(), trainer.serving_weights())
    train_step(trainer, 2)
    publish(pub, trainer)
    follower.poll_s = 0.0
    for _ in range(500):  # between batches: download in the background, then apply
        if follower.update() == 2:
            break
        time.sleep(0.01)
    assert follower.version == 2 and bitwise(served(), trainer.serving_weights())
    assert follower.errors == 0
    follower.close()
