"""Loading HF-format directories, and smollm2-135m: packaged GGUF -> cached safetensors -> generation."""

from __future__ import annotations

import time

import pytest

from flywheel.errors import FlywheelError
from flywheel.models.hf import COMPLETE, find_gguf, load_hf, smollm2_dir
from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import load_torch_model
from flywheel.protocols import Request


def test_load_hf_reads_a_model_directory(tmp_path):
    path = build_tiny_model(tmp_path / "m", ["abc def " * 20], vocab_size=280, hidden=32, layers=1, heads=2)
    model, tokenizer = load_hf(path)
    assert not model.training
    assert model.config.vocab_size == len(tokenizer)


def test_not_a_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FlywheelError, match="no config.json"):
        load_hf(tmp_path)
    with pytest.raises(FlywheelError, match="no config.json"):
        load_torch_model(f"hf:{tmp_path / 'missing'}")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(FlywheelError, match="cannot load model"):
        load_hf(tmp_path)


def test_missing_package_names_what_to_install():
    with pytest.raises(FlywheelError, match="pip install no-such-model-package"):
        find_gguf("no-such-model-package")


def test_packaged_gguf_is_found():
    path = find_gguf()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000


@pytest.mark.slow
def test_smollm2_converts_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    path = smollm2_dir()
    convert_s = time.perf_counter() - t0
    assert path == tmp_path / "models" / "smollm2-135m"
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    stamp = (path / COMPLETE).stat().st_mtime_ns
    engine = load_torch_model("smollm2-135m", max_batch=2)
    assert (path / COMPLETE).stat().st_mtime_ns == stamp  # read, not converted again
    question = [{"role": "user", "content": "What is the capital of France?"}]
    c = engine.generate([Request(messages=question, max_tokens=8, temperature=0.0)])[0]
    assert c.error is None and c.completion_tokens >= 1
    assert "Paris" in c.text, (c.text, convert_s)
    assert engine.tokenizer.decode(c.prompt_ids).startswith("<|im_start|>")
