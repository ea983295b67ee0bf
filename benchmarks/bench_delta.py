"""Weight-delta size and speed on real RL steps of SmolLM2-135M, against the entropy bound.

    .venv/bin/python benchmarks/bench_delta.py [--steps 3] [--max-new-tokens 12] [--out bench_delta.json]

For each optimiser setting (AdamW at lr 1e-6 and 3e-6; Muon at lr 2e-4 on the 2-D hidden matrices with
AdamW at lr 1e-6 for the rest) it loads the model (the packaged GGUF, converted once and cached as HF
safetensors by `flywheel.models.hf.smollm2_dir`), keeps an fp32 master copy, and runs a few
policy-gradient steps: sample short completions from a few prompts, reward them with a simple rule
(completions that contain a digit and stay short score higher), loss = -A * log p with A the reward minus
the batch mean. After each step the bf16 cast is published through a `Publisher` on a file:// store and
followed by a `Subscriber` holding its own bf16 copy.

Per step: fraction of bf16 weights changed, delta bytes against the full bf16 checkpoint, encode, upload,
download and apply times, bits per changed weight, and the empirical bound: n*H(p) for the change mask
plus k*H(symbols) for the changed values (symbols of the value coding the delta chose), with the ratio.
Goals: delta <= 1% of the checkpoint at AdamW lr 1e-6 (aim <= 0.6%), within 1.2x of the bound; publish
<= 1 s and apply <= 0.5 s for 135M parameters on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from flywheel.models.hf import load_hf, smollm2_dir
from flywheel.sync import FsspecStore, Publisher, Subscriber, read_manifest
from flywheel.sync.codec import find_changes, value_symbols

PROMPTS = [
    "Write a Python function that adds two numbers.",
    "What is 12 times 7?",
    "Name a prime number greater than 10.",
]


def reward(text: str) -> float:
    return float(any(c.isdigit() for c in text)) + 0.5 * (len(text) < 40)


def make_optimizer(model: torch.nn.Module, kind: str, lr: float) -> list[torch.optim.Optimizer]:
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "adamw":
        return [torch.optim.AdamW(params, lr=lr, weight_decay=0.0)]
    embed = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    hidden = [p for p in params if p.ndim == 2 and id(p) not in embed]
    rest = [p for p in params if p.ndim != 2 or id(p) in embed]
    return [
        torch.optim.Muon(hidden, lr=lr, weight_decay=0.0),
        torch.optim.AdamW(rest, lr=1e-6, weight_decay=0.0),
    ]


def rl_step(model, tok, optimizers, max_new_tokens: int, seed: int) -> float:
    torch.manual_seed(seed)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS
    ]
    loss_total, rewards = 0.0, []
    samples = []
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt").input_ids
            out = model.generate(
                ids,
                do_sample=True,
                temperature=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.eos_token_id,
            )
            comp = out[0, ids.shape[1] :]
            samples.append((out, ids.shape[1]))
            rewards.append(reward(tok.decode(comp, skip_special_tokens=True)))
    adv = torch.tensor(rewards) - sum(rewards) / len(rewards)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    for (seq, start), a in zip(samples, adv, strict=True):
        logits = model(seq).logits[0, start - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(1, seq[0, start:, None]).sum()
        loss = -a * logp / len(samples)
        loss.backward()
        loss_total += float(loss.detach())
    for opt in optimizers:
        opt.step()
    return loss_total


def bf16_of(model) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().to(torch.bfloat16).contiguous()
        for n, p in model.state_dict().items()
        if p.is_floating_point()
    }


def entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum() * counts.sum())


def bound_bits(old, new, mode: str) -> float:
    ch = find_changes(old, new)
    n = sum(t.numel() for t in new.values())
    k = ch.old.size
    if k == 0:
        return 0.0
    p = k / n
    mask = n * -(p * math.log2(p) + (1 - p) * math.log2(1 - p)) if 0 < p < 1 else 0.0
    sym = value_symbols(ch.old, ch.new, mode)
    return mask + entropy_bits(np.bincount(sym, minlength=65536))


def run_setting(kind: str, lr: float, args, root: Path) -> list[dict]:
    model, tok = load_hf(smollm2_dir())
    model.train()
    optimizers = make_optimizer(model, kind, lr)
    store = FsspecStore(str(root / f"{kind}-{lr:g}"))
    pub = Publisher(store, anchor_every=1000)
    prev = bf16_of(model)
    pub.publish(prev, 0)
    sub = Subscriber(store, {n: t.clone() for n, t in prev.items()}, 0)
    rows = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        loss = rl_step(model, tok, optimizers, args.max_new_tokens, seed=step)
        rl_s = time.perf_counter() - t0
        cur = bf16_of(model)
        stats = pub.publish(cur, step)
        t1 = time.perf_counter()
        plan = sub.plan()
        download_s = time.perf_counter() - t1
        sub.apply(plan)
        blob = plan.steps[-1].blob
        m = read_manifest(blob)
        n = sum(t.numel() for t in cur.values())
        k = sum(t["changed"] for t in m["tensors"])
        bound = bound_bits(prev, cur, m["value_mode"])
        ok = all(torch.equal(sub.weights[x].view(torch.int16), cur[x].view(torch.int16)) for x in cur)
        rows.append(
            {
                "optimizer": kind,
                "lr": lr,
                "step": step,
                "loss": loss,
                "rl_step_s": rl_s,
                "weights": n,
                "changed_fraction": k / n,
                "delta_bytes": stats.delta_bytes,
                "full_bf16_bytes": 2 * n,
                "delta_pct_of_full": 100 * stats.delta_bytes / (2 * n),
                "value_mode": m["value_mode"],
                "encode_s": stats.encode_s,
                "upload_s": stats.upload_s,
                "keep_copy_s": stats.keep_s,
                "publish_s": stats.encode_s + stats.upload_s + stats.keep_s,
                "download_s": download_s,
                "apply_s": sub.last_pause_s,
                "bits_per_changed": 8 * stats.delta_bytes / k if k else None,
                "bound_bits_per_changed": bound / k if k else None,
                "ratio_to_bound": 8 * stats.delta_bytes / bound if bound else None,
                "bitwise_equal": ok,
            }
        )
        print_row(rows[-1])
        prev = cur
    return rows


HEAD = f"{'opt':>6} {'lr':>7} {'step':>4} {'changed':>8} {'delta%':>7} {'MB':>6} {'enc s':>6} {'up s':>5} {'down s':>6} {'apply s':>7} {'b/chg':>6} {'bound':>6} {'ratio':>5} ok"


def print_row(r: dict) -> None:
    def f(x, spec):
        return format(x, spec) if x is not None else "-"

    print(
        f"{r['optimizer']:>6} {r['lr']:>7.0e} {r['step']:>4} {r['changed_fraction']:>8.3%} {r['delta_pct_of_full']:>6.3f}% "
        f"{r['delta_bytes'] / 1e6:>6.2f} {r['encode_s']:>6.3f} {r['upload_s']:>5.3f} {r['download_s']:>6.3f} "
        f"{r['apply_s']:>7.3f} {f(r['bits_per_changed'], '6.2f')} {f(r['bound_bits_per_changed'], '6.2f')} "
        f"{f(r['ratio_to_bound'], '5.2f')} {r['bitwise_equal']}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: frugal on shared machines)")
    ap.add_argument(
        "--settings", default="adamw:1e-6,adamw:3e-6,muon:2e-4", help="optimizer:lr, comma-separated"
    )
    ap.add_argument("--out", type=Path, default=Path("bench_delta.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.disable_progress_bar()
    print(HEAD)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-delta-") as tmp:
        for item in args.settings.split(","):
            kind, lr = item.split(":")
            rows += run_setting(kind, float(lr), args, Path(tmp))
            report = {"store": "file://", "torch_threads": args.threads, "rows": rows}
            args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
