"""Can a tiny model learn to look a line up by its number? A synthetic drill, learned and measured.

The lookup a `scripted-search` try needs, alone: a window of a `cat -n` listing of a toybugs module
(lines moved by up to 12 blank lines), then `sed -i 'N s/`, and the model must write the operator that
line N holds (` +=`, ` <`, ` and`, ...; the first on the line). Train modules teach it, held-out modules
measure it: the share of held-out queries whose operator the model writes exactly (greedy), against
always writing the commonest operator, and against writing the commonest of the operators that start a
line of the window (what a model that knows which operators are there, but not where, can reach). One run per `--from` (a base to start from, or `new` for a fresh
model of the base's shape and tokenizer), side by side at the same steps.

    .venv/bin/python experiments/lookup_probe.py --tokenizer runs/base-shift --from new runs/base-shift --steps 1500
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

OPS = (
    " +=",
    " -=",
    " <=",
    " >=",
    " ==",
    " !=",
    " <",
    " >",
    " +",
    " -",
    " and",
    " or",
    " not",
    " in",
    " //",
    " *",
)
_FIRST = re.compile("|".join(re.escape(o) + (" " if o[-1].isalpha() else r"(?=[ (\w])") for o in OPS))


def examples(modules: list[str], n: int, rng: random.Random, window: int) -> list[tuple[str, str]]:
    """(prompt, operator): a listing window and a query for one of its lines that holds an operator."""
    from flywheel.tasks.toy import read_module

    sources = [read_module(m)[0].splitlines() for m in modules]
    out = []
    while len(out) < n:
        lines = list(rng.choice(sources))
        for _ in range(rng.randint(0, 12)):
            blank = [i for i, line in enumerate(lines) if not line.strip()]
            lines.insert(rng.choice(blank) if blank else 0, "")
        start = rng.randrange(max(1, len(lines) - window))
        shown = range(start, min(len(lines), start + window))
        asked = [i for i in shown if _FIRST.search(lines[i])]
        if not asked:
            continue
        i = rng.choice(asked)
        listing = "".join(f"{j + 1:6d}\t{lines[j]}\n" for j in shown)
        out.append(
            (f"exit code 0\n{listing}<shell>sed -i '{i + 1}s/", _FIRST.search(lines[i]).group(0).rstrip(" "))
        )
    return out


def _starting(prompt: str) -> set[str]:
    """The operators that come first on some line of the prompt's listing."""
    rows = (row.split("\t", 1)[-1] for row in prompt.split("<shell>")[0].splitlines())
    return {hit.group(0).rstrip(" ") for hit in map(_FIRST.search, rows) if hit}


def encode(tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[list[int], int]]:
    """Token ids of prompt + operator, and where the operator's tokens start."""
    out = []
    for prompt, op in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out.append((p + tokenizer(op, add_special_tokens=False)["input_ids"], len(p)))
    return out


def accuracy(model, data: list[tuple[list[int], int]]) -> float:
    """Share of examples whose operator tokens are all predicted exactly (teacher-forced greedy)."""
    import torch

    right = 0
    with torch.no_grad():
        for ids, k in data:
            pred = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
            right += all(pred[i - 1] == ids[i] for i in range(k, len(ids)))
    return right / len(data)


def drill(
    model, train, test, steps: int, batch: int, lr: float, every: int, label: str
) -> list[tuple[int, float]]:
    import torch

    rng = random.Random(0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95))
    curve = [(0, accuracy(model, test))]
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        rows = rng.sample(train, batch)
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros((batch, width), dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        weight = torch.zeros((batch, width))
        for j, (seq, k) in enumerate(rows):
            ids[j, : len(seq)] = torch.tensor(seq)
            mask[j, : len(seq)] = 1
            weight[j, k : len(seq)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (ce * weight[:, 1:]).sum() / weight[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % every == 0 or step == steps:
            model.eval()
            curve.append((step, accuracy(model, test)))
            model.train()
            print(
                f"{label}: step {step} loss {float(loss.detach()):.3f} held-out accuracy {curve[-1][1]:.1%} "
                f"({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return curve


def _shape(text: str) -> tuple[int, int]:
    try:
        hidden, layers = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want HIDDEN,LAYERS, e.g. 256,4") from None
    if hidden <= 0 or layers <= 0 or hidden % 4:
        raise argparse.ArgumentTypeError(
            f"{text!r}: HIDDEN a positive multiple of the 4 heads, LAYERS positive"
        )
    return hidden, layers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="starts", nargs="+", required=True, help="`new`, or base directories")
    ap.add_argument(
        "--tokenizer", type=Path, required=True, help="a base whose tokenizer and shape `new` uses"
    )
    ap.add_argument(
        "--shape", type=_shape, default=None, help="HIDDEN,LAYERS of `new` (default: the tokenizer base's)"
    )
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--window", type=int, default=12, help="listing lines shown")
    ap.add_argument("--every", type=int, default=250, help="measure every N steps")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    for path in [args.tokenizer, *(Path(s) for s in args.starts if s != "new")]:
        if not (path / "config.json").is_file():
            ap.error(f"{path}: not a model directory (no config.json)")
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from flywheel.tasks.toy import HELDOUT_MODULES, module_names

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    train_mods = [m for m in module_names() if m not in HELDOUT_MODULES]
    train = encode(tokenizer, examples(train_mods, 20000, random.Random(1), args.window))
    test_pairs = examples(list(HELDOUT_MODULES), 200, random.Random(2), args.window)
    test = encode(tokenizer, test_pairs)
    freq = Counter(op for _, op in examples(train_mods, 5000, random.Random(3), args.window))
    common = freq.most_common(1)[0][0]
    present = sum(op == max(_starting(prompt), key=freq.__getitem__) for prompt, op in test_pairs) / len(test)
    print(
        f"held-out queries: {len(test)}; always `{common}`: {sum(op == common for _, op in test_pairs) / len(test):.1%}; "
        f"the commonest operator that starts some line of the window (no lookup): {present:.1%}"
    )
    curves = {}
    for start in args.starts:
        if start == "new":
            config = AutoConfig.from_pretrained(args.tokenizer)
            if args.shape:
                hidden, layers = args.shape
                config.hidden_size, config.num_hidden_layers = hidden, layers
                config.intermediate_size = -(-8 * hidden // 3 // 32) * 32  # as flywheel.models.tiny shapes it
                config.head_dim = hidden // config.num_attention_heads
            model = LlamaForCausalLM(config)
            print(f"new: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", file=sys.stderr)
        else:
            model = LlamaForCausalLM.from_pretrained(start)
        model.train()
        curves[start] = drill(model, train, test, args.steps, args.batch, args.lr, args.every, start)
    steps = [s for s, _ in next(iter(curves.values()))]
    print("| from | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|" + "---|" * len(steps))
    for start, curve in curves.items():
        print(f"| {start} | " + " | ".join(f"{a:.1%}" for _, a in curve) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
