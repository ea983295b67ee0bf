"""Device and precision: a bfloat16 engine, a bfloat16 trainer step over float32 master weights, a bfloat16
SFT, and the one-line refusals of devices and dtypes that cannot run (CPU only; CUDA is refused here)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from flywheel.cli import main
from flywheel.models import get_model
from flywheel.models.sampling import sample_step
from flywheel.models.tiny import build_tiny_model
from flywheel.protocols import Request, Verdict
from flywheel.record import Trajectory
from flywheel.rl.config import ModelConfig, RunConfig
from flywheel.rl.objective import kept_mask, replay_log_probs
from flywheel.rl.train import make_trainer

TEXTS = ["<run_tests/>", '<view path="a.py"/>', "def f(x):\n    return x + 1\n", "1 failed, 2 passed"] * 10
PROMPTS = [
    "Fix the failing test in clamp.py",
    "The function add returns a - b instead of a + b. Fix it.",
    "Run the tests, then view the file.",
]
# |bf16 engine log-prob - float32 replay| per token, toybugs-sweep, 3 prompts x 24 tokens at top-p 0.95 and 1:
# measured max 0.053 and mean 0.0012 nats (the float32 engine: max 4e-6); the bounds leave a 2x margin
MAX_GAP, MEAN_GAP = 0.1, 0.003


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", TEXTS, vocab_size=300, hidden=32, layers=2, heads=2
    )


def requests(top_p: float) -> list[Request]:
    return [
        Request([{"role": "user", "content": p}], max_tokens=24, temperature=1.0, top_p=top_p, seed=i)
        for i, p in enumerate(PROMPTS)
    ]


def replayed(model, completion) -> torch.Tensor:
    """The float32 model's log-probs of a completion's tokens over its recorded kept sets (the trainer's
    replay), at temperature 1."""
    ids = torch.tensor([completion.prompt_ids + completion.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(completion.prompt_ids) - 1 : -1].float()
    mask = kept_mask(completion.kept, logits.shape[1])
    return replay_log_probs(logits, mask, torch.tensor(completion.token_ids), 1.0)


def test_a_bfloat16_engine_records_float32_log_probs_close_to_float32_replay():
    f32 = get_model("toybugs-sweep", seed=0, device="cpu")
    b16 = get_model("toybugs-sweep", seed=0, device="cpu", dtype="bfloat16")
    assert b16.model.dtype == torch.bfloat16 and f32.model.dtype == torch.float32
    gaps = []
    for top_p in (0.95, 1.0):
        for c in b16.generate(requests(top_p)):
            assert c.finish_reason in ("stop", "length") and c.token_ids, c.error
            recorded = np.asarray(c.logprobs)
            assert np.array_equal(recorded.astype(np.float32), recorded)  # float32 values
            assert (recorded <= 0).all()
            gaps.append((torch.tensor(c.logprobs) - replayed(f32.model, c)).abs())
    gap = torch.cat(gaps)
    assert float(gap.max()) < MAX_GAP and float(gap.mean()) < MEAN_GAP, (gap.max(), gap.mean())


def test_sampling_from_bfloat16_logits_is_float32():
    logits = torch.randn(3, 50).to(torch.bfloat16)
    step = sample_step(logits, torch.ones(3), torch.tensor([0.9, 1.0, 0.5]), torch.rand(3))
    assert step.logprobs.dtype == torch.float32 and step.tokens.dtype == torch.long


def test_the_kv_cache_and_the_fallback_forward_follow_the_weights_dtype(tiny):
    fast = get_model(f"hf:{tiny}", seed=0, dtype="bfloat16")
    slow = get_model(f"hf:{tiny}", seed=0, dtype="bfloat16", fast=False)
    assert fast.fast and not slow.fast
    from flywheel.models.fastllama import new_cache

    assert new_cache(fast.model, 1, 4).k.dtype == torch.bfloat16
    for engine in (fast, slow):
        out = engine.generate(requests(0.9))
        assert all(c.finish_reason == "length" and len(c.logprobs) == 24 for c in out)


def records(engine, successes: list[bool]) -> list[Trajectory]:
    out = []
    for i, (c, ok) in enumerate(zip(engine.generate(requests(0.9)), successes, strict=True)):
        turn = {
            "role": "assistant",
            "text": c.text,
            "prompt_ids": c.prompt_ids,
            "token_ids": c.token_ids,
            "logprobs": c.logprobs,
            "kept": c.kept,
        }
        out.append(
            Trajectory(
                f"t/medium/{i}",
                "t",
                "medium",
                model="hf:x",
                turns=[turn],
                n_turns=1,
                completion_tokens=c.completion_tokens,
                success=ok,
                verdict=Verdict("t", success=ok),
            )
        )
    return out


@pytest.mark.parametrize("kind", ["muon", "adamw"])
def test_a_bfloat16_trainer_step_updates_float32_master_weights_and_the_engine_copy(tiny, kind):
    cfg = RunConfig(model=ModelConfig(path=str(tiny), device="cpu", dtype="bfloat16"))
    cfg.optim.kind, cfg.optim.lr = kind, 1e-2
    trainer = make_trainer(cfg)
    served = trainer.engine.model
    assert served is not trainer.model and served.dtype == torch.bfloat16
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics, _ = trainer.step(records(trainer.engine, [True, False, False]))
    assert metrics["train_tokens"] > 0 and np.isfinite(metrics["loss"])
    after = trainer.model.state_dict()
    assert all(v.dtype == torch.float32 for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in after)
    state = [t for _, opt in trainer.optimizer for s in opt.state.values() for t in s.values()]
    moments = [t for t in state if torch.is_tensor(t) and t.dim() > 0]
    assert moments and all(t.dtype == torch.float32 for t in moments)
    for name, p in served.named_parameters():  # the engine generates from the new weights, rounded
        assert torch.equal(p, after[name].to(torch.bfloat16)), name
    assert any(not torch.equal(p, before[n].to(torch.bfloat16)) for n, p in served.named_parameters())
    weights = trainer.serving_weights()
    assert all(w.dtype == torch.bfloat16 and w.device.type == "cpu" for w in weights.values())
    assert torch.equal(weights["model.norm.weight"], after["model.norm.weight"].to(torch.bfloat16))


def test_a_float32_trainer_shares_its_model_with_the_engine(tiny):
    trainer = make_trainer(RunConfig(model=ModelConfig(path=str(tiny), device="cpu")))
    assert trainer.engine.model is trainer.model and trainer.model.dtype == torch.float32


def write_run_config(tmp_path, model: str):
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\npath = "toybugs-sweep"\n{model}\n[train]\nsteps = 1\n')
    return path


@pytest.mark.parametrize(
    "line,needle",
    [
        ('device = "tpu"', "[model] device = 'tpu': unknown device"),
        ('dtype = "float16"', "[model] dtype = 'float16': unknown dtype"),
        ('device = "cuda"', "[model] device = 'cuda' but no GPU is visible"),
    ],
)
def test_flywheel_train_refuses_bad_devices_and_dtypes_in_one_line(tmp_path, capsys, line, needle):
    if "cuda" in line and torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit) as exit_:
        main(["train", str(write_run_config(tmp_path, line)), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_flywheel_eval_refuses_an_unknown_dtype(tmp_path, capsys):
    args = [
        "eval",
        "--suite",
        "toybugs",
        "--model",
        "toybugs-sweep",
        "--dtype",
        "fp8",
        "--out",
        str(tmp_path),
    ]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--dtype = 'fp8': unknown dtype" in err and err.count("\n") == 1, err


def test_a_tiny_sft_run_in_bfloat16_trains_and_saves_float32_weights(tmp_path):
    from flywheel.sft import SftConfig, run_sft

    cfg = SftConfig()
    cfg.data.episodes, cfg.data.concurrency = 3, 3
    cfg.model.vocab_size, cfg.model.hidden, cfg.model.layers, cfg.model.heads = 300, 32, 1, 2
    cfg.model.device, cfg.model.dtype = "cpu", "bfloat16"
    cfg.train.epochs, cfg.train.batch_size, cfg.train.warmup_steps = 1, 3, 1
    cfg.train.copy_steps, cfg.train.copy_batch_size = 2, 2
    out = run_sft(cfg, tmp_path / "base")
    rows = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["copy_step"] for r in rows if "copy_step" in r] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.float32}
    engine = get_model(f"hf:{out}", dtype="bfloat16")
    assert engine.generate(requests(0.9)[:1])[0].token_ids


def test_sft_refuses_an_unknown_dtype(tmp_path):
    from flywheel.errors import FlywheelError
    from flywheel.sft import SftConfig, run_sft

    cfg = SftConfig()
    cfg.model.dtype = "half"
    with pytest.raises(FlywheelError, match=r"\[model\] dtype = 'half'"):
        run_sft(cfg, tmp_path / "base")
