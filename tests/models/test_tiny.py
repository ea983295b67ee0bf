"""build_tiny_model: deterministic HF-format files that load back as a working tokenizer and Llama."""

from __future__ import annotations

import pytest

from flywheel.errors import FlywheelError
from flywheel.models.tiny import IM_END, PAD, build_tiny_model

TEXTS = ["def f(x):\n    return x * 2\n", "hello wörld ✓ ", "while True:\n    pass\n"] * 8


def build(path, **kw):
    return build_tiny_model(path, TEXTS, vocab_size=300, hidden=32, layers=1, heads=2, **kw)


def files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_same_inputs_same_files(tmp_path):
    a, b = build(tmp_path / "a"), build(tmp_path / "b")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files(a))
    assert files(a) == files(b)
    assert files(build(tmp_path / "c", seed=1))["model.safetensors"] != files(a)["model.safetensors"]


def test_loads_back_with_special_tokens_and_template(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok) <= 300
    assert tok.eos_token == IM_END and tok.pad_token == PAD
    assert model.generation_config.eos_token_id == tok.eos_token_id
    text = "naïve ☃ bytes \x07 round-trip"
    assert tok.decode(tok(text)["input_ids"]) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.eos_token_id) == 1


def test_refuses_non_empty_dir_and_bad_shape(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FlywheelError, match="non-empty"):
        build(tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(FlywheelError, match="divisible"):
        build_tiny_model(tmp_path / "x", TEXTS, hidden=30, heads=4)
    assert not (tmp_path / "x").exists()


def test_max_token_chars_spells_repeated_names_in_shared_pieces():
    from flywheel.models.tiny import train_tokenizer

    texts = ["view csvline.py then edit csvline.py\n"] * 50 + ["ledger.py holds the ledger\n"]
    whole = train_tokenizer(texts, 400)
    capped = train_tokenizer(texts, 400, max_token_chars=3)
    assert whole.encode(" csvline.py").tokens[0] == "Ġcsvline"
    pieces = capped.encode(" csvline.py").tokens
    assert len(pieces) > 3 and all(len(p.lstrip("Ġ")) <= 3 for p in pieces)
    assert capped.decode(capped.encode("csvline.py ledger.py").ids) == "csvline.py ledger.py"


def test_split_symbols_spells_a_line_number_and_an_operator_alike_in_a_listing_and_a_command(tmp_path):
    from transformers import AutoTokenizer

    from flywheel.models.tiny import CHAT_TEMPLATE, train_tokenizer, wrap_tokenizer

    listing = "    16\t        if initial < 1:\n    17\t            raise ValueError()\n"
    command = "sed -i '16s/ </ <=/' *.py; timeout 5 python -m pytest -q tests > /dev/null && echo fixed"
    texts = [listing, command] * 30
    plain, split = train_tokenizer(texts, 400), train_tokenizer(texts, 400, split_symbols=True)

    def tokens(tok, text, part):  # the tokens that overlap `part` where it first stands in `text`
        enc, start = tok.encode(text), text.index(part)
        return [
            t
            for t, (a, b) in zip(enc.tokens, enc.offsets, strict=True)
            if a < start + len(part) and b > start
        ]

    assert "Ġ16" in tokens(plain, listing, "16") and tokens(plain, command, "16") == ["16"]  # two spellings
    assert "Ġ<" in tokens(plain, listing, " <") and "Ġ<" not in tokens(plain, command, " <")
    assert tokens(split, listing, "16") == tokens(split, command, "16") == ["1", "6"]
    assert tokens(split, listing, " <") == tokens(split, command, " <") == ["Ġ", "<"]
    tok = wrap_tokenizer(split, CHAT_TEMPLATE)
    assert tok.decode(tok(listing + command)["input_ids"]) == listing + command
    tok.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)(command)["input_ids"] == tok(command)["input_ids"]
