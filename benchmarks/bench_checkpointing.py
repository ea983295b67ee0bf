"""Activation checkpointing (`[objective] activation_checkpointing`): peak memory and time of one training
forward and backward, with and without, each in a fresh process (peak RSS is per process).

One sequence of `--tokens` random ids through SmolLM2-135M (or `--model`) in training mode, the loss on the
last 256 positions' logits, as the trainer computes logits for generated tokens only. Peak RSS is reported
above what the loaded model already held.

    .venv/bin/python benchmarks/bench_checkpointing.py [--tokens 2048] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from flywheel.models.hf import load_hf, smollm2_dir


def one(tokens: int, recompute: bool, threads: int) -> dict:
    torch.set_num_threads(threads)
    model, _ = load_hf(smollm2_dir())
    if recompute:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    model.lm_head(hidden[0, -256:]).float().logsumexp(-1).mean().backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"checkpointing": recompute, "seconds": seconds, "peak_mib": (peak - before) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", choices=["on", "off"], help=argparse.SUPPRESS)  # a child process's part
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.tokens, args.one == "on", args.threads)))
        return
    rows = []
    for part in ("off", "on"):
        cmd = [sys.executable, __file__, "--tokens", str(args.tokens), "--threads", str(args.threads)]
        out = subprocess.run([*cmd, "--one", part], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"checkpointing {part:3s}: {r['seconds']:6.1f} s, peak +{r['peak_mib']:.0f} MiB", flush=True)
    off, on = rows
    print(
        f"with checkpointing: {on['peak_mib'] / off['peak_mib']:.2f}x the memory, "
        f"{on['seconds'] / off['seconds']:.2f}x the time"
    )


if __name__ == "__main__":
    main()
