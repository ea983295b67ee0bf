"""LoRA in the trainer (`[optim] lora`, flywheel.rl.lora) on a tiny Llama: only the adapters train, the
inline engine generates from the merged policy, checkpoints resume exactly, bad settings are one line."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flywheel.errors import FlywheelError
from flywheel.models.hf import load_hf
from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import TorchEngine, load_torch_model
from flywheel.protocols import Request, Verdict
from flywheel.record import Trajectory
from flywheel.rl.config import LoraConfig, RunConfig, load_config
from flywheel.rl.lora import LORA_TARGETS
from flywheel.rl.objective import replay_log_probs, replay_mask
from flywheel.rl.train import train
from flywheel.rl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["<run_tests/>", '<view path="a.py"/>', "def f(x):\n    return x + 1\n", "1 failed, 2 passed"] * 10
REPLAY_F32 = 1e-4  # the full-weight path's bound: a float32 engine against the trainer's replay
TOP_P = 0.9


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", TEXTS, vocab_size=300, hidden=32, layers=2, heads=2
    )


def fresh(tiny: Path) -> TorchEngine:
    return load_torch_model(f"hf:{tiny}", seed=0)


def lora_config(kind: str = "adamw", **lora) -> RunConfig:
    cfg = RunConfig()
    cfg.optim.kind, cfg.optim.lr, cfg.optim.lora = kind, 1e-2, LoraConfig(**lora)
    return cfg


def requests(n: int = 4) -> list[Request]:
    return [
        Request([{"role": "user", "content": p}], max_tokens=12, top_p=TOP_P, seed=i)
        for i, p in enumerate(["x", "x", "y", "y"][:n])
    ]


def records_from(engine: TorchEngine, success: list[bool]) -> list[Trajectory]:
    out = []
    for i, (c, ok) in enumerate(zip(engine.generate(requests(len(success))), success, strict=True)):
        turn = {"role": "assistant", "text": c.text, "prompt_ids": c.prompt_ids, "token_ids": c.token_ids}
        turn |= {"logprobs": c.logprobs, "kept": c.kept}
        out.append(
            Trajectory(
                f"t/medium/{i}", "t", "medium", model="hf:x", turns=[turn], n_turns=1,
                completion_tokens=c.completion_tokens, cost=0.001, success=ok, verdict=Verdict("t", success=ok),
            )
        )  # fmt: skip
    return out


def log_prob(trainer: Trainer, record: Trajectory) -> float:
    t = record.turns[0]
    with torch.no_grad():
        logits = trainer._generated_logits([t])
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(t["token_ids"]).unsqueeze(1)).sum().item()


def replayed(trainer: Trainer, completions) -> torch.Tensor:
    """The trainer's replay of sampled completions over their kept sets (what a step computes)."""
    with torch.no_grad():
        logits = trainer._packed_logits(
            [{"prompt_ids": c.prompt_ids, "token_ids": c.token_ids} for c in completions]
        )
    tokens = torch.tensor([t for c in completions for t in c.token_ids])
    mask = replay_mask(
        [c.kept for c in completions], [len(c.token_ids) for c in completions], logits, tokens, TOP_P, 1.0
    )
    return replay_log_probs(logits, mask, tokens, 1.0)


# ----------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_only_the_adapters_train_and_a_step_moves_the_policy(tiny, kind):
    engine = fresh(tiny)
    base = {k: v.clone() for k, v in engine.model.state_dict().items()}
    records = records_from(engine, [True, False, True, False])
    trainer = Trainer(engine.model, engine.tokenizer, lora_config(kind), {"medium": 0.0}, engine=engine)
    adapters = dict(trainer.lora.trainable())
    config = engine.model.config
    h, inter = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h)}
    shapes |= {"gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    assert sum(p.numel() for p in adapters.values()) == config.num_hidden_layers * 8 * sum(
        i + o for i, o in shapes.values()
    )
    assert all(".lora_A." in n or ".lora_B." in n for n in adapters)
    before = [log_prob(trainer, r) for r in records]

    metrics, _ = trainer.step(records)

    assert metrics["grad_norm"] > 0 and trainer.version == 1
    after = [log_prob(trainer, r) for r in records]
    assert after[0] > before[0] and after[1] < before[1]  # rewarded up, unrewarded down
    with_grad = {n for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert with_grad == set(adapters)  # the frozen base got no gradient
    state = {id(p) for _, opt in trainer.optimizer for p in opt.state}
    assert state == {id(p) for p in adapters.values()}  # and no optimizer state
    assert [name for name, _ in trainer.optimizer] == [kind]  # every adapter is a matrix: Muon takes them all
    for name, p in trainer.model.named_parameters():  # the base weights the trainer holds are untouched
        if name not in adapters:
            assert torch.equal(p, base[name.replace(".base_layer", "")]), name
    merged = dict(trainer.lora.served_weights())
    for name, w in engine.model.state_dict().items():  # the served model: merged matrices, the rest as was
        moved = not torch.equal(w, base[name])
        assert moved == (name in merged), name


def test_inline_rollouts_generate_from_the_updated_policy_on_the_fast_path(tiny):
    engine = fresh(tiny)
    plain = copy.deepcopy(engine.model)  # the base, for contrast
    records = records_from(engine, [True, False, True, False])
    trainer = Trainer(engine.model, engine.tokenizer, lora_config(), {"medium": 0.0}, engine=engine)
    for _ in range(3):
        trainer.step(records)
    out = engine.generate(requests())
    assert engine.path == "fast" and engine.model is trainer.served
    sampled = torch.tensor([x for c in out for x in c.logprobs])
    gap = float((replayed(trainer, out) - sampled).abs().max())
    base_trainer = Trainer(plain, engine.tokenizer, RunConfig(), {})
    base_gap = float((replayed(base_trainer, out) - sampled).abs().max())
    assert (
        gap < REPLAY_F32 < 100 * REPLAY_F32 < base_gap
    )  # the engine samples the adapted policy, not the base


def test_a_bfloat16_engine_copy_gets_the_merged_matrices(tiny):
    master, tokenizer = load_hf(tiny)
    served = copy.deepcopy(master).to(torch.bfloat16)
    engine = TorchEngine(served, tokenizer, seed=0)
    untouched = {k: v.clone() for k, v in served.state_dict().items()}
    cfg = lora_config()
    cfg.model.dtype = "bfloat16"
    trainer = Trainer(master, tokenizer, cfg, {"medium": 0.0}, engine=engine)
    trainer.step(records_from(fresh(tiny), [True, False, True, False]))
    merged = {n: w.to(torch.bfloat16) for n, w in trainer.lora.served_weights()}
    for name, w in served.state_dict().items():
        assert torch.equal(w, merged[name]) if name in merged else torch.equal(w, untouched[name]), name
    assert any(not torch.equal(merged[n], untouched[n]) for n in merged)


def test_lora_dropout_applies_in_the_replay_forward_only(tiny):
    engine = fresh(tiny)
    trainer = Trainer(
        engine.model, engine.tokenizer, lora_config(dropout=0.5), {"medium": 0.0}, engine=engine
    )
    records = records_from(engine, [True, False, True, False])
    trainer.step(records)  # B is zero at first: the adapters only contribute (and drop out) after a step
    turn = records[0].turns[0]
    with torch.no_grad():
        assert torch.equal(trainer._generated_logits([turn]), trainer._generated_logits([turn]))
        with trainer._training_mode():
            assert not torch.equal(trainer._generated_logits([turn]), trainer._generated_logits([turn]))
    assert trainer.lora.dropouts() and not any(m.training for m in trainer.model.modules())


def test_activation_checkpointing_gives_the_same_adapter_update(tiny):
    records = records_from(fresh(tiny), [True, False, True, False])
    after = {}
    for recompute in (False, True):
        engine = fresh(tiny)
        cfg = lora_config()
        cfg.objective.activation_checkpointing = recompute
        trainer = Trainer(engine.model, engine.tokenizer, cfg, {"medium": 0.0}, engine=engine)
        mlp, calls = trainer.model.model.layers[0].mlp, []
        plain = mlp.forward
        mlp.forward = lambda *a, plain=plain, calls=calls, **k: calls.append(1) or plain(*a, **k)
        metrics, _ = trainer.step(records)
        after[recompute] = (dict(trainer.lora.trainable()), metrics, len(calls))
        assert not any(m.training for m in trainer.model.modules())
    assert after[True][2] == 2 * after[False][2] > 0  # the layer ran again in the backward pass
    assert after[True][1]["loss"] == pytest.approx(after[False][1]["loss"], rel=1e-5, abs=1e-7)
    assert all(torch.allclose(p, after[False][0][n], atol=1e-6) for n, p in after[True][0].items())


# -------------------------------------------------------------------------------------- checkpoints


def test_a_checkpoint_resumes_exactly_and_is_an_hf_directory(tiny, tmp_path):
    records = records_from(fresh(tiny), [True, False, True, False])
    a = fresh(tiny)
    first = Trainer(a.model, a.tokenizer, lora_config("muon"), {"medium": 0.0}, engine=a)
    first.step(records)
    first.save(tmp_path / "ckpt")
    second_a, _ = first.step(records)

    b = fresh(tiny)
    resumed = Trainer(b.model, b.tokenizer, lora_config("muon"), {"medium": 0.0}, engine=b)
    resumed.load(tmp_path / "ckpt")
    assert resumed.version == 1
    second_b, _ = resumed.step(records)

    assert second_a == second_b
    for (name, p), (_, q) in zip(first.lora.trainable(), resumed.lora.trainable(), strict=True):
        assert torch.equal(p, q), name
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())
    assert {"lora.safetensors", "lora.json", "optimizer.pt", "model.safetensors"} <= {
        p.name for p in (tmp_path / "ckpt").iterdir()
    }
    model, _ = load_hf(tmp_path / "ckpt")  # the merged weights of version 1, under the base's names
    ids = torch.tensor([records[0].turns[0]["prompt_ids"] + records[0].turns[0]["token_ids"]])
    c = fresh(tiny)
    at_one = Trainer(c.model, c.tokenizer, lora_config("muon"), {"medium": 0.0}, engine=c)
    at_one.load(tmp_path / "ckpt")
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, at_one.model(input_ids=ids).logits, atol=1e-4)


def test_a_checkpoint_is_refused_by_another_setting_or_base(tiny, tmp_path):
    engine = fresh(tiny)
    trainer = Trainer(engine.model, engine.tokenizer, lora_config(), {"medium": 0.0}, engine=engine)
    trainer.step(records_from(engine, [True, False, True, False]))
    trainer.save(tmp_path / "lora")
    full = fresh(tiny)
    Trainer(full.model, full.tokenizer, RunConfig(), {}).save(tmp_path / "full")

    def load_into(cfg: RunConfig, ckpt: str, nudge: bool = False) -> str:
        e = fresh(tiny)
        if nudge:
            with torch.no_grad():
                e.model.model.norm.weight.add_(0.1)
        with pytest.raises(FlywheelError) as err:
            Trainer(e.model, e.tokenizer, cfg, {}).load(tmp_path / ckpt)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "rank" in load_into(lora_config(rank=4), "lora")
    assert "holds LoRA adapters" in load_into(RunConfig(), "lora")
    assert "holds full weights" in load_into(lora_config(), "full")
    assert "another base model" in load_into(lora_config(), "lora", nudge=True)


# ---------------------------------------------------------------------------------------- the loop


def quick(base: Path, steps: int) -> RunConfig:
    cfg = load_config(ROOT / "configs" / "quick.toml")
    cfg.model.path, cfg.train.steps = str(base), steps
    cfg.optim.lora = LoraConfig(rank=4)
    return cfg


def test_a_deterministic_lora_run_repeats_and_resumes_exactly(base, tmp_path):
    """Run a: two steps. Run c: one step (the same as a's first, from its own start), then resumed from
    its checkpoint for the second: the same metrics and adapters as a, byte for byte."""
    a, c = tmp_path / "a", tmp_path / "c"
    train(quick(base, 2), a)
    train(quick(base, 1), c)
    first = (a / "metrics.jsonl").read_text().splitlines()[0]
    assert (c / "metrics.jsonl").read_text().splitlines() == [first]
    train(quick(base, 2), c)
    assert (c / "metrics.jsonl").read_bytes() == (a / "metrics.jsonl").read_bytes()
    ckpt = "checkpoints/v00000002/trainer"
    for name in ("lora.safetensors", "optimizer.pt", "model.safetensors"):
        assert (a / ckpt / name).read_bytes() == (c / ckpt / name).read_bytes(), name
    adapters = load_file(a / ckpt / "lora.safetensors")
    assert any(".lora_B." in n and t.abs().max() > 0 for n, t in adapters.items())  # B left zero: it trained
    settings = json.loads((a / ckpt / "lora.json").read_text())
    assert settings["rank"] == 4 and settings["targets"] == list(LORA_TARGETS)
    assert json.loads((a / "config.json").read_text())["optim"]["lora"]["rank"] == 4


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "body,needle",
    [
        ("[optim]\nlora = { rank = 8, scale = 2 }\n", "unknown key 'scale'"),
        ("[optim]\nlora = { rank = 0 }\n", "lora.rank must be >= 1"),
        ("[optim]\nlora = { alpha = 0 }\n", "lora.alpha must be > 0"),
        ("[optim]\nlora = { targets = [] }\n", "lora.targets must name"),
        ("[optim]\nlora = { dropout = 1.0 }\n", "lora.dropout"),
        ("[optim]\nlora = { rank = 'big' }\n", "'rank'"),
        ("[optim]\ntrain_layers = 1\nlora = {}\n", "lora and train_layers"),
        ("[optim]\nlora = { targets = ['q_proj', 'wq'] }\n", "no module named 'wq'"),
        ("[optim]\nlora = { targets = ['lm_head'] }\n", "not a linear layer of the decoder"),
        ("[optim]\nlora = { targets = ['mlp'] }\n", "not a linear layer of the decoder"),
    ],
)
def test_bad_lora_settings_exit_2_in_one_line(body, needle, tiny, tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(f"[model]\npath = '{tiny}'\n[tasks]\nlimit = 1\n{body}")
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(bad), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1, err


def test_lora_without_peft_names_the_extra(tmp_path, capsys, monkeypatch):
    from flywheel.cli import main

    monkeypatch.setitem(sys.modules, "peft", None)  # what an environment without the package gives
    bad = tmp_path / "lora.toml"
    bad.write_text("[optim]\nlora = {}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(bad), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert "swe-flywheel[lora]" in err and "peft" in err
