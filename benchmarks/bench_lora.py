"""LoRA against full weights: trainable parameters, step time, bytes per published version, follower gap.

Two trainers start from the same model (`--model`, any spec `flywheel.models` loads in float32) and take
`--steps` real updates (`Trainer.step`, AdamW at `--lr`) on the same records: four short completions the
starting model samples once, half of them rewarded. One trains every weight and publishes bf16 deltas
(`Publisher`); the other trains the default LoRA adapters (`[optim] lora = {}`) and publishes them
(`AdapterPublisher`: the base once, then each version's adapters whole). A bf16 follower
(`Subscriber`) follows each store; after every step the script prints, per side, the step's seconds, the
bytes published, and the largest and mean log-prob gap between the trainer (float32) and its follower
(bf16) on the records' sampled tokens. The two sides' step times alternate within each step, so load on
the machine falls on both alike.

    .venv/bin/python benchmarks/bench_lora.py --model smollm2-135m --steps 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PROMPTS = [
    "Write a python function that adds two numbers.",
    "What is 2+2?",
    "Fix the bug: def f(x): return x+",
    "Say hi.",
]


def records(engine):
    """One sampled completion per prompt as graded single-turn records, every other one successful."""
    from flywheel.protocols import Request, Verdict
    from flywheel.record import Trajectory

    requests = [
        Request([{"role": "user", "content": p}], max_tokens=24, top_p=1.0, seed=i)
        for i, p in enumerate(PROMPTS)
    ]
    out = []
    for i, c in enumerate(engine.generate(requests)):
        ok = i % 2 == 0
        turn = {"role": "assistant", "text": c.text, "prompt_ids": c.prompt_ids, "token_ids": c.token_ids,
                "logprobs": c.logprobs, "kept": c.kept}  # fmt: skip
        out.append(Trajectory(f"t/medium/s0/{i}", "t", "medium", model="bench", turns=[turn], n_turns=1,
                              completion_tokens=c.completion_tokens, cost=0.001, success=ok,
                              verdict=Verdict("t", success=ok)))  # fmt: skip
    return out


@torch.no_grad()
def gap(a, b, recs) -> tuple[float, float]:
    """The largest and mean |log p_a - log p_b| over the records' sampled tokens."""
    gaps: list[float] = []
    for r in recs:
        t = r.turns[0]
        ids = torch.tensor([t["prompt_ids"] + t["token_ids"]])
        n = len(t["prompt_ids"])
        tok = torch.tensor(t["token_ids"])[:, None]
        la = torch.log_softmax(a(ids).logits[0, n - 1 : -1].float(), -1).gather(1, tok)
        lb = torch.log_softmax(b(ids).logits[0, n - 1 : -1].float(), -1).gather(1, tok)
        gaps += (la - lb)[:, 0].abs().tolist()
    return max(gaps), statistics.fmean(gaps)


class Side:
    """One trainer, its store, its publisher and a bf16 follower."""

    def __init__(self, spec: str, lr: float, lora: bool, root: Path) -> None:
        from flywheel.models.torch_engine import load_torch_model
        from flywheel.rl.config import LoraConfig, RunConfig
        from flywheel.rl.trainer import Trainer
        from flywheel.sync import AdapterPublisher, FsspecStore, Publisher, Subscriber
        from flywheel.sync.follow import bind

        self.name = "lora" if lora else "full"
        self.engine = load_torch_model(spec, seed=0)  # float32: the trainer shares it
        cfg = RunConfig()
        cfg.optim.kind, cfg.optim.lr = "adamw", lr
        cfg.optim.lora = LoraConfig() if lora else None
        self.trainer = Trainer(
            self.engine.model, self.engine.tokenizer, cfg, {"medium": 0.0}, engine=self.engine
        )
        store = FsspecStore(str(root / self.name))
        t = self.trainer
        if lora:
            self.publisher = AdapterPublisher(store)
            start = self.publisher.start(t.serving_base(), t.serving_adapters(), 0)
            self.publish = lambda: self.publisher.publish(t.serving_adapters(), t.version)
        else:
            self.publisher = Publisher(store, anchor_every=1000)
            start = self.publisher.start(t.serving_weights(), 0)
            self.publish = lambda: self.publisher.publish(t.serving_weights(), t.version)
        self.first_bytes = start.delta_bytes + start.anchor_bytes if start else 0
        self.follower = load_torch_model(spec, dtype=torch.bfloat16, seed=0)
        self.sub = Subscriber(store, dict(bind(self.follower.model)))
        self.sub.catch_up()
        params = [p for p in t.model.parameters()]
        self.trainable = sum(p.numel() for p in params if p.requires_grad)
        self.params = sum(p.numel() for p in t.served.parameters())

    def step(self, recs) -> dict[str, float]:
        t0 = time.perf_counter()
        self.trainer.step(recs)
        step_s = time.perf_counter() - t0
        stats = self.publish()
        self.sub.catch_up()
        assert self.sub.version == self.trainer.version, self.sub.last_error
        worst, mean = gap(self.trainer.served, self.follower.model, recs)
        return {
            "step_s": step_s,
            "bytes": stats.delta_bytes + stats.anchor_bytes,
            "gap_max": worst,
            "gap_mean": mean,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model spec (smollm2-135m, hf:DIR, ...)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        sides = [Side(args.model, args.lr, lora, Path(tmp)) for lora in (False, True)]
        recs = records(sides[0].engine)
        for s in sides:
            print(
                f"{s.name}: trainable {s.trainable:,} of {s.params:,}; first publish {s.first_bytes:,} bytes"
            )
        rows: dict[str, list[dict[str, float]]] = {s.name: [] for s in sides}
        for step in range(1, args.steps + 1):
            for s in sides if step % 2 else sides[::-1]:
                rows[s.name].append(s.step(recs))
            line = "  ".join(
                f"{n}: {r[-1]['step_s']:.2f} s, {r[-1]['bytes']:,} B, gap {r[-1]['gap_max']:.4f}/{r[-1]['gap_mean']:.5f}"
                for n, r in rows.items()
            )
            print(f"step {step}: {line}", flush=True)
    full, lora = rows["full"], rows["lora"]
    summary = {
        "model": args.model,
        "trainable": {s.name: s.trainable for s in sides},
        "step_s_median": {n: statistics.median(r["step_s"] for r in v) for n, v in rows.items()},
        "bytes_median": {n: statistics.median(r["bytes"] for r in v) for n, v in rows.items()},
        "gap_last": {n: {"max": v[-1]["gap_max"], "mean": v[-1]["gap_mean"]} for n, v in rows.items()},
    }
    summary["step_time_ratio_lora_over_full"] = (
        summary["step_s_median"]["lora"] / summary["step_s_median"]["full"]
    )
    summary["bytes_ratio_lora_over_full"] = statistics.median(
        a["bytes"] / b["bytes"] for a, b in zip(lora, full, strict=True)
    )
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
