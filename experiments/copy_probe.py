"""Can a base copy names it has never seen? Teacher-forced accuracy on held-out episodes, side by side.

The work: `scripted-noisy` episodes on toybugs held-out tasks (`--episodes`, collected once through the
real harness and cached like SFT data), rendered as each base sees them. For every base given, one forward
per episode, and the share of the teacher's action tokens the base predicts exactly (greedy), overall and
for the module-name tokens inside `<view path="...">` actions: a held-out module's name appears only in
the report and the file list, so predicting it is copying from the context. A base that recalls its train
modules scores 0 there.

    .venv/bin/python experiments/copy_probe.py runs/base-big runs/base-rename
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flywheel.record import Trajectory


def probe(base: Path, records: list[Trajectory]) -> tuple[int, int, int, int]:
    """(action tokens right, action tokens, name tokens right, name tokens) of `base` on `records`."""
    import torch

    from flywheel.models.torch_engine import load_torch_model
    from flywheel.sft.imitate import _render, messages_of

    engine = load_torch_model(f"hf:{base}", max_context=2048)
    act_ok = act_n = name_ok = name_n = 0
    for r in records:
        text, learned, _ = _render(messages_of(r))
        enc = engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"][:2048], enc["offset_mapping"][:2048]
        with torch.no_grad():
            pred = engine.model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
        module = r.task_id.split("-")[1]
        for i in range(1, len(ids)):
            start = offsets[i][0]
            span = next(((a, b) for a, b in learned if a <= start < b), None)
            if span is None:
                continue
            ok = pred[i - 1] == ids[i]
            act_ok, act_n = act_ok + ok, act_n + 1
            at = text.find(module, span[0], span[1])
            if text.startswith("<view ", span[0]) and 0 <= at <= start < at + len(module):
                name_ok, name_n = name_ok + ok, name_n + 1
    return act_ok, act_n, name_ok, name_n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bases", type=Path, nargs="+", help="SFT base directories (flywheel sft --out)")
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    for base in args.bases:
        if not (base / "config.json").is_file():
            print(f"copy_probe: {base}: not a model directory", file=sys.stderr)
            return 2

    import torch

    from flywheel.sft.imitate import SftConfig, collect

    torch.set_num_threads(args.threads)
    cfg = SftConfig()
    cfg.data.split, cfg.data.episodes = "heldout", args.episodes
    records = collect(cfg)
    print(f"{len(records)} teacher episodes on toybugs held-out")
    print(f"{'base':32s} {'action tokens':>15s} {'module name in <view>':>22s}")
    for base in args.bases:
        act_ok, act_n, name_ok, name_n = probe(base, records)
        print(
            f"{str(base):32s} {act_ok / act_n:15.2f} {name_ok / max(1, name_n):22.2f}   ({name_ok}/{name_n})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
