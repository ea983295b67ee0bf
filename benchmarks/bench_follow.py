"""`flywheel serve --follow`: the serving pause per delta, and the trainer/served log-prob gap.

    .venv/bin/python benchmarks/bench_follow.py pause [--model smollm2-135m] [--steps 5] [--lr 1e-6]
    .venv/bin/python benchmarks/bench_follow.py gap [--steps 10]

`pause`: starts `flywheel serve --model M --follow STORE` on a file store, then plays the trainer: an
fp32 master copy of M takes AdamW steps (loss: the negative log-likelihood of a short fixed text, a
stand-in for a policy-gradient step of the same size), and each step's bf16 weights are published as a
delta. Per version it waits for the server's `GET /health` to report it and reads `last_pause_s`: the
seconds the server's batcher spent applying the delta in place (serving paused), plus the delta's size.

`gap`: the loop's `http` backend on two `flywheel serve --follow` servers and the tests' tiny model and
`FakeTrainer` (tests/loop), `--steps` steps on the clamp task; then each server's log-probs of its own
sampled completion of a fixed prompt against the trainer's (float32 master weights, float32 forward) at
the same version, and against the initial weights for scale.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def start_server(model: str, store: str, log: Path) -> tuple[subprocess.Popen, str]:
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flywheel", "serve", "--model", model, "--port", "0", "--follow", store],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        raise SystemExit(f"server did not start: {log.read_text()}")
    return proc, line.split(" at ", 1)[1].strip()


def health(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as r:
        return json.loads(r.read())


def wait_version(url: str, version: int, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (h := health(url))["policy_version"] != version:
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not reach version {version}: {h}")
        time.sleep(0.02)
    return h


def bf16(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}


def pause(args: argparse.Namespace) -> None:
    from flywheel.models.hf import load_hf, smollm2_dir
    from flywheel.sync import Publisher, open_store

    path = smollm2_dir() if args.model == "smollm2-135m" else Path(args.model.removeprefix("hf:"))
    model, tokenizer = load_hf(path)
    ids = torch.tensor([tokenizer("def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n")["input_ids"]])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-follow-"))
    store = open_store(str(tmp / "weights"))
    pub = Publisher(store, anchor_every=1000)
    proc, url = start_server(args.model, str(tmp / "weights"), tmp / "serve.log")
    rows = []
    try:
        pub.publish(bf16(model), 0)
        wait_version(url, 0)
        for v in range(1, args.steps + 1):
            opt.zero_grad()
            model(ids, labels=ids).loss.backward()
            opt.step()
            stats = pub.publish(bf16(model), v)
            h = wait_version(url, v)
            rows.append(
                {"version": v, "pause_s": round(h["last_pause_s"], 4), "delta_bytes": stats.delta_bytes}
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    pauses = sorted(r["pause_s"] for r in rows)
    print(json.dumps({"model": args.model, "lr": args.lr, "median_pause_s": pauses[len(pauses) // 2]}))
    print(
        "server log:\n"
        + "".join(ln for ln in (tmp / "serve.log").read_text().splitlines(True) if "weights" in ln)
    )


def gap(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "loop"))
    sys.path.insert(0, str(ROOT / "tests"))
    from loop_helpers import FakeTrainer, loop_config

    from conftest import build_clamp_task
    from flywheel.loop import run
    from flywheel.models.openai_backend import OpenAIConfig, OpenAIModel
    from flywheel.models.tiny import build_tiny_model
    from flywheel.protocols import Request

    texts = [
        "def f(x):\n    return x * 2\n",
        '<edit path="mathx.py"><old>if x >= hi + 1:</old><new>if x > hi:</new></edit>',
        '<run_tests/> <submit/> <view path="mathx.py"/>',
    ] * 8  # tests/loop/conftest.py's tiny model
    tmp = Path(tempfile.mkdtemp(prefix="bench-gap-"))
    tiny = build_tiny_model(tmp / "tiny", texts, vocab_size=300, hidden=32, layers=1, heads=2)
    task = build_clamp_task(tmp / "tasks" / "clamp-1")
    store = str(tmp / "weights")
    servers = [start_server(f"hf:{tiny}", store, tmp / f"serve-{i}.log") for i in range(2)]
    try:
        trainer = FakeTrainer(tiny, lr=3e-2)
        start = {n: t.clone() for n, t in trainer.model.state_dict().items()}
        cfg = loop_config(
            tiny, backend="http", pool_urls=[u for _, u in servers], store=store, steps=args.steps,
            pool_batch=1, max_staleness=1,
        )  # fmt: skip
        t0 = time.monotonic()
        summary = run(cfg, trainer, [task], tmp / "run")
        print(json.dumps({"steps": summary["version"], "records_per_pool": summary["records_per_pool"],
                          "stale_dropped": summary["stale_dropped"], "wall_s": round(time.monotonic() - t0, 1)}))  # fmt: skip
        initial = FakeTrainer(tiny)
        initial.model.load_state_dict(start)
        prompt = Request(messages=[{"role": "user", "content": "fix clamp"}], max_tokens=64, seed=7)
        for _, url in servers:
            wait_version(url, trainer.version)
            [c] = OpenAIModel("tiny", OpenAIConfig(base_url=url, logprobs=True)).generate([prompt])
            served = torch.tensor(c.logprobs)
            row = {"url": url, "version": c.policy_version, "tokens": len(c.token_ids)}
            for name, model in (("trainer", trainer.model), ("initial", initial.model)):
                model.eval()
                with torch.no_grad():
                    logits = model(torch.tensor([c.prompt_ids + c.token_ids])).logits[
                        0, len(c.prompt_ids) - 1 : -1
                    ]
                ref = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(c.token_ids)[:, None])[
                    :, 0
                ]
                diff = (served - ref).abs()
                row[f"{name}_max"], row[f"{name}_mean"] = (
                    round(diff.max().item(), 5),
                    round(diff.mean().item(), 5),
                )
            print(json.dumps(row))
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pause")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-6)
    g = sub.add_parser("gap")
    g.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)
    pause(args) if args.what == "pause" else gap(args)


if __name__ == "__main__":
    main()
