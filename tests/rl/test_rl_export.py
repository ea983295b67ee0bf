"""`flywheel export` (flywheel.rl.export): a run's newest checkpoint as an HF directory that transformers
loads with the trained model's logits, for full-weight and LoRA runs; bad input is one line, exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from flywheel.loop import RunDir
from flywheel.loop.checkpoint import Checkpointer
from flywheel.models.hf import load_hf
from flywheel.models.tiny import build_tiny_model
from flywheel.models.torch_engine import load_torch_model
from flywheel.protocols import Request, Verdict
from flywheel.record import Trajectory
from flywheel.rl.config import LoraConfig, RunConfig
from flywheel.rl.export import export_model
from flywheel.rl.trainer import Trainer

TEXTS = ["<run_tests/>", '<view path="a.py"/>', "def f(x):\n    return x + 1\n", "1 failed, 2 passed"] * 10
TRAINER_FILES = {"optimizer.pt", "trainer.json", "lora.safetensors", "lora.json"}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> tuple[Path, Trainer]:
    """A run directory whose checkpoints (versions 1 and 2) hold a LoRA trainer, and the trainer."""
    root = tmp_path_factory.mktemp("export")
    tiny = build_tiny_model(root / "tiny", TEXTS, vocab_size=300, hidden=32, layers=2, heads=2)
    engine = load_torch_model(f"hf:{tiny}", seed=0)
    cfg = RunConfig()
    cfg.optim.kind, cfg.optim.lr, cfg.optim.lora = "adamw", 1e-2, LoraConfig()
    trainer = Trainer(engine.model, engine.tokenizer, cfg, {"medium": 0.0}, engine=engine)
    reqs = [Request([{"role": "user", "content": p}], max_tokens=12, seed=i) for i, p in enumerate("xxyy")]
    records = []
    for i, c in enumerate(engine.generate(reqs)):
        turn = {"role": "assistant", "prompt_ids": c.prompt_ids, "token_ids": c.token_ids}
        turn |= {"logprobs": c.logprobs, "kept": c.kept}
        ok = i % 2 == 0
        records.append(
            Trajectory(
                f"t/medium/{i}", "t", "medium", turns=[turn], n_turns=1, success=ok, verdict=Verdict("t", ok)
            )
        )
    checkpoints = Checkpointer(root / "run" / "checkpoints")
    for _ in range(2):
        trainer.step(records)
        checkpoints.save(trainer, {})
    return root / "run", trainer


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_lora_run_exports_merged_weights_with_the_trained_logits(lora_run, tmp_path):
    run, trainer = lora_run
    info = export_model(run, tmp_path / "out")
    assert info["from"].endswith("v00000002/trainer") and info["lora_merged"]
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names and not names & TRAINER_FILES
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    ids = torch.tensor([tokenizer("def f(x):\n    return x + 1\n")["input_ids"]])
    trained = logits(trainer.model, ids)  # the adapters applied, not merged: W·x + s·B·(A·x)
    base, _ = load_hf(run.parent / "tiny")
    assert torch.allclose(logits(exported, ids), trained, atol=1e-4)
    assert not torch.allclose(logits(base, ids), trained, atol=1e-2)  # and they are not the base's


def test_a_full_weight_run_exports_through_the_command(one_step_run, tmp_path):
    out = tmp_path / "hf"
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "export", str(one_step_run), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["lora_merged"] is False and not {p.name for p in out.iterdir()} & TRAINER_FILES
    checkpoint, tokenizer = load_hf(RunDir(one_step_run).latest_weights())
    ids = torch.tensor([tokenizer("<run_tests/>")["input_ids"]])
    assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(out), ids), logits(checkpoint, ids))
    assert AutoTokenizer.from_pretrained(out).chat_template == tokenizer.chat_template


def test_one_checkpoint_given_directly_is_exported(lora_run, tmp_path):
    run, _ = lora_run
    info = export_model(run / "checkpoints" / "v00000001", tmp_path / "v1")
    assert info["from"].endswith("v00000001/trainer")
    assert (tmp_path / "v1" / "model.safetensors").read_bytes() == (
        run / "checkpoints/v00000001/trainer/model.safetensors"
    ).read_bytes()


def export_fails(args: list[str], capsys) -> str:
    from flywheel.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["export", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line_and_writes_nothing(lora_run, tmp_path, capsys):
    run, _ = lora_run
    out = tmp_path / "out"
    assert "no such directory" in export_fails([str(tmp_path / "nope"), "--out", str(out)], capsys)
    (tmp_path / "plain").mkdir()
    assert "not a run directory" in export_fails([str(tmp_path / "plain"), "--out", str(out)], capsys)
    fresh = tmp_path / "fresh-run"
    (fresh / "checkpoints" / "v00000001" / "trainer").mkdir(parents=True)  # no manifest: incomplete
    assert "no complete checkpoint" in export_fails([str(fresh), "--out", str(out)], capsys)
    damaged = tmp_path / "v00000002"
    shutil.copytree(run / "checkpoints" / "v00000002", damaged)
    with open(damaged / "trainer" / "model.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert "damaged checkpoint" in export_fails([str(damaged), "--out", str(out)], capsys)
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run / "checkpoints" / "v00000002" / "trainer" / "config.json", bare)
    assert "no safetensors weights" in export_fails([str(bare), "--out", str(out)], capsys)
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine\n")
    assert "already exists" in export_fails([str(run), "--out", str(out)], capsys)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
