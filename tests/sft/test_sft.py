"""SFT of the embedded base: what is learned, the imitation data and its augmentation, config errors.

`base` (tests/conftest.py) is a tiny base built once per run from configs/sft-quick.toml.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.record import Trajectory
from flywheel.settings import load_config
from flywheel.sft.imitate import SftConfig, encode, messages_of, render_with_spans, run_sft, segments_of

ROOT = Path(__file__).resolve().parents[2]


def test_sft_writes_a_loadable_model_and_its_loss(base):
    info = json.loads((base / "sft_config.json").read_text())
    assert info["episodes"] == 6 and info["tokens"] > 0
    rows = [json.loads(line) for line in (base / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["copy_step"] for r in rows if "copy_step" in r] == [1, 2, 3]  # copy pretraining comes first
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses and all(loss > 0 for loss in losses) and "copy_step" in rows[0]
    from flywheel.models.torch_engine import load_torch_model

    engine = load_torch_model(f"hf:{base}")
    assert engine.tokenizer.eos_token == "<|im_end|>"


def test_an_sft_base_is_evaluated_under_the_harness_it_learned(base):
    from flywheel.sft.imitate import trained_harness

    info = json.loads((base / "sft_config.json").read_text())
    assert trained_harness(f"hf:{base}") == {
        "action_format": "tagged",
        "observation_chars": info["config"]["data"]["observation_chars"],
    }
    assert trained_harness("scripted") == {} and trained_harness(f"hf:{base / 'missing'}") == {}


def test_sft_learns_only_the_assistant_tokens():
    from flywheel.models.tiny import CHAT_TEMPLATE, train_tokenizer, wrap_tokenizer

    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "<run_tests/>"},
        {"role": "user", "content": "1 failed"},
    ]
    text, spans = render_with_spans(messages)
    tok = wrap_tokenizer(train_tokenizer([text] * 4, 300), CHAT_TEMPLATE)
    assert text == tok.apply_chat_template(messages, tokenize=False)  # the engine renders the same text
    ids, target = encode(tok, messages, 10_000)
    learned = tok.decode([i for i, t in zip(ids, target, strict=True) if t])
    assert learned == "<run_tests/><|im_end|>"
    ids, weights = encode(tok, messages, 10_000, context_weight=0.25)
    read = tok.decode([i for i, w in zip(ids, weights, strict=True) if w == 0.25])
    assert read == "sys<|im_end|>fix it<|im_end|>1 failed<|im_end|>"
    assert tok.decode([i for i, w in zip(ids, weights, strict=True) if w == 1.0]) == learned


def test_messages_of_a_record_replays_the_conversation():
    record = Trajectory(
        "t/medium/s0/0",
        "t",
        "medium",
        turns=[
            {"role": "system", "text": "s"},
            {"role": "user", "text": "u"},
            {"role": "assistant", "text": '<view path="a.py"/>'},
            {"role": "tool", "name": "view", "text": "1| x"},
            {"role": "assistant", "text": "oops"},
            {"role": "tool", "name": "format_error", "text": "error: no action"},
        ],
    )
    assert [m["role"] for m in messages_of(record)] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages_of(record)[-1]["content"] == "error: no action"


def test_a_model_written_compaction_cuts_the_conversation_where_the_context_restarted():
    turns = [
        {"role": "system", "text": "s"},
        {"role": "user", "text": "task"},
        {"role": "assistant", "text": "<run_tests/>"},
        {"role": "tool", "name": "run_tests", "text": "1 failed"},
        {"role": "user", "text": "Summarise your work so far."},
        {"role": "assistant", "text": "Task: t. Next: view a.py.", "summary": True},
        {"role": "tool", "name": "compaction", "text": "summary", "ok": True},
        {"role": "user", "text": "Your summary of the work so far: Task: t. Next: view a.py."},
        {"role": "assistant", "text": '<view path="a.py"/>'},
    ]
    first, second = segments_of(Trajectory("t/medium/s0/0", "t", "medium", turns=turns))
    assert [m["content"] for m in first][-2:] == ["Summarise your work so far.", "Task: t. Next: view a.py."]
    assert [m["content"] for m in second] == ["s", "task", turns[7]["text"], '<view path="a.py"/>']
    plain = Trajectory("t/medium/s0/1", "t", "medium", turns=turns[:4])
    assert segments_of(plain) == [messages_of(plain)]  # no compaction: one segment, as before


def test_sft_does_not_learn_the_teachers_malformed_actions():
    record = Trajectory(
        "t/medium/s0/0",
        "t",
        "medium",
        turns=[
            {"role": "system", "text": "s"},
            {"role": "user", "text": "u"},
            {"role": "assistant", "text": "I will look first."},
            {"role": "tool", "name": "format_error", "text": "error: no action found"},
            {"role": "assistant", "text": "<run_tests/>"},
            {"role": "tool", "name": "run_tests", "text": "1 failed"},
        ],
    )
    text, spans = render_with_spans(messages_of(record))
    assert "I will look first." in text  # still context: the model sees the recovery
    assert [text[a:b] for a, b in spans] == ["<run_tests/><|im_end|>"]


def test_weighted_loss_is_the_action_loss_when_context_weighs_nothing(tmp_path):
    import torch

    from flywheel.models.tiny import build_tiny_model
    from flywheel.models.torch_engine import load_torch_model
    from flywheel.sft.imitate import collate, weighted_loss

    messages = [
        {"role": "user", "content": "fix add.py"},
        {"role": "assistant", "content": '<view path="add.py"/>'},
        {"role": "user", "content": "1| def add(a, b):"},
        {"role": "assistant", "content": "<submit/>"},
    ]
    build_tiny_model(
        tmp_path / "m", [render_with_spans(messages)[0]] * 4, vocab_size=300, hidden=32, layers=1, heads=2
    )
    engine = load_torch_model(f"hf:{tmp_path / 'm'}")
    ids, mask, weights = collate([encode(engine.tokenizer, messages, 512)], engine.tokenizer.pad_token_id)
    labels = torch.where(weights == 1.0, ids, torch.full_like(ids, -100))
    reference = engine.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    objective, action = weighted_loss(engine.model, ids, mask, weights)
    assert torch.allclose(objective, reference, atol=1e-5) and torch.allclose(action, reference, atol=1e-5)
    ids, mask, weights = collate(
        [encode(engine.tokenizer, messages, 512, 0.5)], engine.tokenizer.pad_token_id
    )
    objective, action = weighted_loss(engine.model, ids, mask, weights)
    assert torch.allclose(action, reference, atol=1e-5) and not torch.allclose(
        objective, reference, atol=1e-3
    )


def test_a_copy_example_learns_only_the_predictable_part_of_the_repeat():
    import random

    from flywheel.sft.imitate import copy_example

    stream = list(range(1000, 1300))
    for seed in range(20):
        ids, weights = copy_example(stream, random.Random(seed))
        window, repeat = ids[:200], ids[200:]
        assert window == stream[window[0] - 1000 : window[0] - 1000 + 200] and 8 <= len(repeat) <= 40
        start = window.index(repeat[0])
        assert window[start : start + len(repeat)] == repeat  # the repeat is a span of the window
        assert weights == [0.0] * 202 + [1.0] * (len(repeat) - 2)


def test_sft_refuses_a_context_weight_the_actions_cannot_outweigh(tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\ncontext_weight = 1.0\n")
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--out", str(tmp_path / "base")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "train.context_weight" in err and err.count("\n") == 1, err
    assert not (tmp_path / "base").exists()


def test_sft_renames_its_share_of_the_teachers_episodes(base):
    from flywheel.sft.imitate import augmented, collect

    cfg = load_config(ROOT / "configs" / "sft-quick.toml", SftConfig)
    records = collect(cfg)  # cached by the fixture's run
    convs = [messages_of(r) for r in records]
    out = augmented(convs, records, cfg)
    changed = [a != b for a, b in zip(convs, out, strict=True)]
    assert 0 < sum(changed) < len(convs)  # rename = 0.5 of 6 episodes, drawn from the seed
    assert out == augmented(convs, records, cfg)  # deterministic
    for before, after, r in zip(convs, out, records, strict=True):
        assert after[0] == before[0]  # the system prompt
        module = r.task_id.split("-")[1]
        text = " ".join(m["content"] for m in after[1:])
        assert (f"{module}.py" in text) != (after != before)


def test_sft_from_a_pretrained_model_trains_only_its_top_layers(base, tmp_path):
    import torch
    from safetensors.torch import load_file

    cfg = load_config(ROOT / "configs" / "sft-quick.toml", SftConfig)
    cfg.model.init, cfg.train.train_layers, cfg.train.copy_steps = f"hf:{base}", 1, 0
    out = run_sft(cfg, tmp_path / "tuned")
    before, after = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("model.layers.1.", "model.norm.")) for k in changed), changed
    assert (out / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()


def test_sft_refuses_more_train_layers_than_the_model_has(base, tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(
        f'[data]\nepisodes = 2\nconcurrency = 2\n[model]\ninit = "hf:{base}"\n[train]\ntrain_layers = 9\n'
    )
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--out", str(tmp_path / "tuned")])
    err = capsys.readouterr().err
    assert (
        exit_.value.code == 2
        and err == "flywheel: error: train.train_layers = 9: the model has 2 decoder layers\n"
    )
    assert not (tmp_path / "tuned").exists() and not (tmp_path / ".tuned.building").exists()
    bad.write_text(
        "[data]\nepisodes = 2\n[model]\nlayers = 2\n[train]\ntrain_layers = 3\n"
    )  # a new tiny model
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--out", str(tmp_path / "tuned")])
    err = capsys.readouterr().err  # one line, before any data is collected
    assert exit_.value.code == 2 and err == (
        "flywheel: error: train.train_layers = 3: must be 0 (all) or at most the model's 2 layers\n"
    )
