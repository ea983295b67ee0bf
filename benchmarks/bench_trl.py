"""Seconds per RL step: TRL's `GRPOTrainer` against Flywheel's rollout engine + `Trainer`, side by side.

The work, identical on both sides:
- the model: a randomly initialised `LlamaForCausalLM` (hidden 256, 4 layers, 4 heads, tied embeddings)
  with SmolLM2's 49k tokenizer (taken from `flywheel.models.hf.smollm2_dir()`), saved once in HF format to
  a temporary directory; each side loads its own copy of the same weights;
- the prompts: a single-turn version of the first two `toybugs` train tasks (the instruction plus the buggy
  module's source as one user message, rendered with the tokenizer's chat template);
- one step: 2 prompts x 8 completions = 16 completions of exactly 64 new tokens (temperature 1, top-p 0.95;
  TRL with `min_new_tokens=64`, ours with `ignore_eos=True`), a cheap reward, and one optimizer step at the
  same learning rate with gradient clipping at 1.0.

The reward: 1 if the completion contains the line that `solution.patch` adds, else 0. A random model never
writes it, so every group's rewards tie and every advantage is 0. TRL still runs forward and backward over
all 16 completions; Flywheel's trainer skips rollouts whose advantage is exactly zero, so with the true
reward our update would do no work at all. To time equal work, ours breaks the tie in each all-equal group
by flipping the first completion's outcome (`tie_break`): every rollout then carries gradient, as in TRL.
The table reports the true reward's mean beside the timings.

Timing. The two sides run interleaved in one process so machine load hits both alike: a `TrainerCallback`
times each TRL step (`on_step_begin` to `on_step_end`) and then runs one Flywheel step with AdamW and one
with Muon (each on its own model copy, engine and optimizer). TRL's generation time is that of its
`_generate` (model.generate); its update is the rest of the step (scoring, forward/backward, optimizer).
Ours: generation is `TorchEngine.generate`, update is building the records plus `Trainer.step`. The first
step of every side is a warm-up and is dropped; figures are the mean and the best of the remaining steps,
with the 1-minute load average sampled at every step.

    .venv/bin/python benchmarks/bench_trl.py --steps 3 --threads 2

Device and precision: `--device` (`cpu`, the default, `cuda` or `auto`) and `--dtype` (`float32`, the
default, or `bfloat16`) apply to both sides. With bfloat16, TRL trains in its own mixed precision
(`bf16=True`: float32 weights, forwards under autocast, generation included); ours as a run with
`[model] dtype = "bfloat16"` does (`flywheel.rl.train.make_trainer`): the engine generates from a bfloat16
copy of the weights that the trainer refreshes after each update, and the trainer keeps float32 master
weights and autocasts. On a GPU every timing waits for the GPU's queued work first.

Needs `trl` (`pip install trl`); without it the script prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, GROUP, NEW_TOKENS = 2, 8, 64
TEMPERATURE, TOP_P = 1.0, 0.95


# ------------------------------------------------------------------------------------------ the work


def fixing_line(patch: str) -> str:
    """The first line a unified diff adds, stripped (the reward looks for it)."""
    for line in patch.splitlines():
        if line.startswith("+") and not line.startswith("+++") and line[1:].strip():
            return line[1:].strip()
    raise ValueError("solution.patch adds no line")


def task_prompt(instruction: str, module: str, source: str) -> str:
    return f"{instruction}\n\n`{module}.py`:\n```python\n{source}```\nReply with the fixed line."


def load_work(n: int = PROMPTS) -> list[dict[str, str]]:
    """The first `n` toybugs train tasks as single-turn prompts: task_id, prompt, fix."""
    from flywheel.tasks import load_suite

    work = []
    for task in load_suite("toybugs", split="train")[:n]:
        module = str(task.meta["module"])
        source = (task.repo / f"{module}.py").read_text()
        work.append(
            {
                "task_id": task.id,
                "prompt": task_prompt(task.instruction, module, source),
                "fix": fixing_line(task.solution_patch),
            }
        )
    return work


def fix_reward(completion: str, fix: str) -> float:
    return 1.0 if fix in completion else 0.0


def tie_break(successes: list[bool], group: int) -> list[bool]:
    """Flip the first outcome of every group whose outcomes all agree, so each group has variance."""
    out = list(successes)
    for start in range(0, len(out), group):
        block = out[start : start + group]
        if len(block) > 1 and len(set(block)) == 1:
            out[start] = not out[start]
    return out


def build_model_dir(root: Path, intermediate: int) -> tuple[Path, int]:
    """A random tiny Llama with SmolLM2's tokenizer, saved in HF format; returns (dir, parameter count)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from flywheel.models.hf import smollm2_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=intermediate,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    out = root / "tiny-llama"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------- Flywheel


class Ours:
    """One Flywheel pipeline: its own model copy, rollout engine and trainer."""

    def __init__(
        self,
        model_dir: Path,
        optim: str,
        lr: float,
        work: list[dict[str, str]],
        device: str = "cpu",
        dtype: str = "float32",
    ):
        from flywheel.models.hf import DTYPES, load_hf
        from flywheel.models.torch_engine import TorchEngine
        from flywheel.rl.config import ModelConfig, OptimConfig, RolloutConfig, RunConfig
        from flywheel.rl.trainer import Trainer

        model, tokenizer = load_hf(model_dir, dtype=DTYPES[dtype], device=device)
        self.engine = TorchEngine(model, tokenizer, ignore_eos=True, seed=0)
        if dtype != "float32":  # float32 master weights beside the engine's copy, as make_trainer does
            model, _ = load_hf(model_dir, device=device)
        cfg = RunConfig(
            model=ModelConfig(device=device, dtype=dtype),
            optim=OptimConfig(kind=optim, lr=lr, grad_clip=1.0),
            rollout=RolloutConfig(temperature=TEMPERATURE, top_p=TOP_P, group_size=GROUP),
        )
        self.trainer = Trainer(model, tokenizer, cfg, lambdas={}, engine=self.engine)
        self.work, self.step_no = work, 0
        self.times: list[dict[str, float]] = []

    def step(self) -> dict[str, float]:
        from flywheel.protocols import Request

        t0 = time.perf_counter()
        requests = [
            Request(
                messages=[{"role": "user", "content": w["prompt"]}],
                max_tokens=NEW_TOKENS,
                temperature=TEMPERATURE,
                top_p=TOP_P,
                seed=self.step_no * 1000 + i,
            )
            for w in self.work
            for i in range(GROUP)
        ]
        completions = self.engine.generate(requests)
        t1 = time.perf_counter()
        bad = [c.error for c in completions if c.error or c.completion_tokens != NEW_TOKENS]
        if bad:
            raise RuntimeError(f"generation did not produce {NEW_TOKENS} tokens each: {bad[:1]}")
        fixes = [w for w in self.work for _ in range(GROUP)]
        rewards = [fix_reward(c.text, w["fix"]) for c, w in zip(completions, fixes, strict=True)]
        successes = tie_break([r > 0 for r in rewards], GROUP)
        records = [
            record(c, w, s, self.engine.name, i)
            for i, (c, w, s) in enumerate(zip(completions, fixes, successes, strict=True))
        ]
        metrics, _ = self.trainer.step(records)
        self.engine.model.eval()
        sync()
        t2 = time.perf_counter()
        self.step_no += 1
        row = {
            "total": t2 - t0,
            "generation": t1 - t0,
            "update": t2 - t1,
            "reward": statistics.fmean(rewards),
            "train_tokens": metrics.get("train_tokens", 0.0),
            "load1": os.getloadavg()[0],
        }
        self.times.append(row)
        return row


def sync() -> None:
    """Wait for the GPU's queued work, if a GPU is in use, so that a timing covers it."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def record(c, w: dict[str, str], success: bool, model: str, index: int):
    """A single-turn graded `Trajectory`, as the trainer reads it."""
    from flywheel.protocols import Verdict
    from flywheel.record import Trajectory

    turns = [
        {"role": "user", "content": w["prompt"]},
        {
            "role": "assistant",
            "content": c.text,
            "prompt_ids": c.prompt_ids,
            "token_ids": c.token_ids,
            "logprobs": c.logprobs,
            "kept": c.kept,
        },
    ]
    return Trajectory(
        id=f"{w['task_id']}/medium/s0/{index % GROUP}",
        task_id=w["task_id"],
        effort="medium",
        index=index % GROUP,
        model=model,
        turns=turns,
        n_turns=1,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        verdict=Verdict(w["task_id"], success=success),
        success=success,
    )


# ------------------------------------------------------------------------------------------------ TRL


def make_trl(
    model_dir: Path,
    out_dir: Path,
    work: list[dict[str, str]],
    lr: float,
    steps: int,
    callback,
    device: str = "cpu",
    dtype: str = "float32",
):
    """A GRPOTrainer doing the same work: 2 prompts x 8 completions of 64 tokens per step, no vLLM; on the
    CPU unless `device` is `cuda`, in mixed precision when `dtype` is bfloat16."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    fixes = {w["task_id"]: w["fix"] for w in work}

    def reward(prompts, completions, task_id, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [fix_reward(t, fixes[tid]) for t, tid in zip(texts, task_id, strict=True)]

    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": w["prompt"]}], "task_id": w["task_id"]} for w in work]
    )
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=device == "cpu",
        bf16=dtype == "bfloat16",
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        weight_decay=0.0,
        per_device_train_batch_size=PROMPTS * GROUP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=NEW_TOKENS,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        generation_kwargs={"min_new_tokens": NEW_TOKENS},
        use_vllm=False,
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[callback],
    )
    generate = trainer._generate  # timed: TRL's generation share of the step

    def timed_generate(prompts):
        t0 = time.perf_counter()
        out = generate(prompts)
        callback.generation += time.perf_counter() - t0
        callback.completion_lengths.extend(len(ids) for ids in out[1])
        callback.prompt_lengths.update(len(ids) for ids in out[0])
        return out

    trainer._generate = timed_generate
    return trainer


def make_callback(ours: list[Ours]):
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        """Times each TRL step, then runs one step of every Flywheel pipeline outside that timing."""

        def __init__(self) -> None:
            self.generation, self.t0 = 0.0, 0.0
            self.completion_lengths: list[int] = []
            self.prompt_lengths: set[int] = set()
            self.times: list[dict[str, float]] = []

        def on_step_begin(self, args, state, control, **kw):
            sync()
            self.generation, self.t0 = 0.0, time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            total = time.perf_counter() - self.t0
            self.times.append(
                {
                    "total": total,
                    "generation": self.generation,
                    "update": total - self.generation,
                    "load1": os.getloadavg()[0],
                }
            )
            print(f"  step {len(self.times)}: trl {total:.2f}s", end="", flush=True)
            for o in ours:
                row = o.step()
                print(f" | {o.trainer.cfg.optim.kind} {row['total']:.2f}s", end="", flush=True)
            print(f" | load {os.getloadavg()[0]:.1f}", flush=True)

    return Interleave()


# ---------------------------------------------------------------------------------------------- report


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean and best seconds per step after the warm-up step (the first)."""
    kept = rows[1:] or rows
    out = {
        f"{k}_mean": statistics.fmean(r[k] for r in kept) for k in ("total", "generation", "update", "load1")
    }
    out["total_best"] = min(r["total"] for r in kept)
    out["steps"] = len(kept)
    return out


def table(results: dict[str, dict[str, float]]) -> str:
    trl = results["trl"]
    lines = [f"{'side':<16}{'s/step':>9}{'best':>8}{'gen s':>8}{'update s':>10}{'TRL/ours':>10}{'load1':>7}"]
    for name, s in results.items():
        ratio = trl["total_mean"] / s["total_mean"]
        lines.append(
            f"{name:<16}{s['total_mean']:>9.2f}{s['total_best']:>8.2f}{s['generation_mean']:>8.2f}"
            f"{s['update_mean']:>10.2f}{ratio:>9.2f}x{s['load1_mean']:>7.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side (one more runs as warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads, both sides")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument(
        "--intermediate",
        type=int,
        default=1024,
        help="MLP width: 1024 gives the 16.8M parameters of the reference figure; 688 gives 15.7M",
    )
    ap.add_argument("--no-muon", action="store_true", help="time Flywheel with AdamW only")
    ap.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu", help="both sides run here")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="see the docstring")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        print("bench_trl needs TRL: .venv/bin/pip install trl", file=sys.stderr)
        return 2
    if args.steps < 1 or args.threads < 1:
        print("--steps and --threads must be at least 1", file=sys.stderr)
        return 2

    import torch
    import transformers
    import trl

    from flywheel.models.hf import resolve_device
    from flywheel.models.torch_engine import render_prompt
    from flywheel.protocols import Request

    device = resolve_device(args.device, "--device").type
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    work = load_work()
    with tempfile.TemporaryDirectory(prefix="bench_trl.") as tmp:
        model_dir, n_params = build_model_dir(Path(tmp), args.intermediate)
        ours = [Ours(model_dir, "adamw", args.lr, work, device, args.dtype)]
        if not args.no_muon:
            ours.append(Ours(model_dir, "muon", args.lr, work, device, args.dtype))
        callback = make_callback(ours)
        trainer = make_trl(
            model_dir, Path(tmp) / "trl", work, args.lr, args.steps + 1, callback, device, args.dtype
        )
        prompt_lens = [
            len(
                render_prompt(
                    ours[0].engine.tokenizer, Request(messages=[{"role": "user", "content": w["prompt"]}])
                )
            )
            for w in work
        ]
        print(
            f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}; "
            f"{n_params / 1e6:.1f}M parameters; prompt tokens {prompt_lens}; threads {args.threads}; "
            f"{device}, {args.dtype}; fast engine: {ours[0].engine.fast}",
            flush=True,
        )
        trainer.train()
    lengths = sorted(set(callback.completion_lengths))
    results = {"trl": summary(callback.times)}
    for o in ours:
        results[f"flywheel-{o.trainer.cfg.optim.kind}"] = summary(o.times)
    load_end = os.getloadavg()
    print(
        f"\nseconds per RL step, {PROMPTS}x{GROUP} completions of {NEW_TOKENS} tokens "
        f"(TRL saw prompt tokens {sorted(callback.prompt_lengths)}, completion lengths {lengths}); mean of {args.steps} steps after 1 warm-up"
    )
    print(table(results))
    print(
        f"true reward mean (ours): {statistics.fmean(r['reward'] for r in ours[0].times):.3f}; "
        f"load average start {load_start[0]:.1f}/{load_start[1]:.1f}/{load_start[2]:.1f}, "
        f"end {load_end[0]:.1f}/{load_end[1]:.1f}/{load_end[2]:.1f} on {os.cpu_count()} cores"
    )
    if args.out:
        payload = {
            "trl_version": trl.__version__,
            "threads": args.threads,
            "device": device,
            "dtype": args.dtype,
            "params": n_params,
            "load_start": load_start,
            "load_end": load_end,
            "summary": results,
            "per_step": {
                "trl": callback.times,
                **{f"flywheel-{o.trainer.cfg.optim.kind}": o.times for o in ours},
            },
        }
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
