"""Does a searching base read its line addresses off the listing? The `sed` tries of its trajectories,
checked against the module.

A `scripted-search` try is `cp *.py /tmp; sed -i 'Ns/OLD/NEW/' *.py; <tests> && echo fixed || cp /tmp/*.py .`
(before the copy-back, the undo was a second `sed -i 'Ns/NEW/OLD/'`). A base that reads the `cat -n`
listing writes an N whose line holds OLD; one that recalls train modules names lines and text that are not
there, and its try changes nothing. For each trajectories file (`flywheel eval --out DIR` writes
`DIR/trajectories.jsonl`) this prints the share of tries whose line exists, lies in the function the
report calls, holds OLD, is one of the teacher's candidates, and whose undo restores the module exactly
(a copy-back, or the inverse `sed`). No model runs: it reads the records and the tasks' code.

`--bases DIR...` adds the same question under teacher forcing: on the trajectories of `scripted-search`
itself (`flywheel eval --model scripted-search`), one forward per episode for each base, and the share of
the teacher's line-number tokens, and of its OLD tokens (given the teacher's line number), that the base
predicts exactly (greedy). OLD given N is the lookup a search needs; a base that reads only its prior
scores what the commonest operators give.

    .venv/bin/python experiments/search_probe.py runs/eval-base/medium/trajectories.jsonl ...
    .venv/bin/python experiments/search_probe.py runs/eval-teacher/trajectories.jsonl --bases runs/base-search
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from flywheel.record import Trajectory, read_trajectories

_PART = r"((?:[^/\\]|\\.)*)"
TRY = re.compile(
    rf"sed -i '(\d+)s/{_PART}/{_PART}/' \S+;.*\|\| (?:(cp /tmp/)|sed -i '(\d+)s/{_PART}/{_PART}/')"
)
CHECKS = ("line exists", "in the function", "holds OLD", "a candidate", "undo restores")


def _plain(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def tally(records: list[Trajectory], tasks: dict) -> Counter:
    """Counts of tries (and of first tries) passing each check."""
    from flywheel.models.scripted import function_lines, repair_candidates, searched_function

    c: Counter = Counter()
    for r in records:
        task = tasks[r.renamed_from or r.task_id]
        files = sorted(p for p in task.repo.glob("*.py"))
        if len(files) != 1:
            continue
        source = files[0].read_text()
        lines = source.splitlines()
        name = searched_function(task.instruction, source)
        inside = function_lines(name, source) if name else set()
        # with or without the space before the text replaced (older trajectories lack it)
        candidates = {
            (n, old.lstrip(" "), new.lstrip(" ")) for n, old, new in repair_candidates(source, inside)
        }
        first = True
        for turn in r.turns:
            hit = TRY.search(turn["text"]) if turn["role"] == "assistant" else None
            if hit is None:
                continue
            n, old, new = int(hit[1]), _plain(hit[2]), _plain(hit[3])
            undone = bool(hit[4]) or (int(hit[5]), _plain(hit[6]), _plain(hit[7])) == (n, new, old)
            passed = {
                "line exists": 1 <= n <= len(lines),
                "in the function": n in inside,
                "holds OLD": 1 <= n <= len(lines) and bool(old) and old in lines[n - 1],
                "a candidate": (n, old.lstrip(" "), new.lstrip(" ")) in candidates,
                "undo restores": undone,
            }
            for key in ("tries", *(("first tries",) if first else ())):
                c[key] += 1
                for check, ok in passed.items():
                    c[f"{key}: {check}"] += ok
            first = False
    return c


def teacher_forced(base: Path, records: list[Trajectory], limit: int) -> Counter:
    """Tokens of the teacher's line numbers and OLD texts, and of those the base predicts (greedy)."""
    import torch

    from flywheel.models.torch_engine import load_torch_model
    from flywheel.sft.imitate import _render, messages_of

    engine = load_torch_model(f"hf:{base}", max_context=2048)
    c: Counter = Counter()
    for r in records[:limit]:
        text, learned, _ = _render(messages_of(r))
        enc = engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"][:2048], enc["offset_mapping"][:2048]
        with torch.no_grad():
            pred = engine.model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
        for a, b in learned:
            hit = TRY.search(text, a, b)
            if hit is None:
                continue
            c["tries"] += 1
            for group, key in ((1, "N"), (2, "OLD")):
                s, e = hit.span(group)
                right = [pred[i - 1] == ids[i] for i in range(1, len(ids)) if s <= offsets[i][0] < e]
                c[f"{key} tokens"] += len(right)
                c[f"{key} right"] += sum(right)
                c[f"{key} whole"] += all(right)
    return c


def _share(c: Counter, key: str, n: int) -> str:
    return f"{c[key]}/{n} ({c[key] / n:.0%})" if n else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trajectories", nargs="+", type=Path, help="trajectories.jsonl files of toybugs runs")
    ap.add_argument("--suite", default="toybugs")
    ap.add_argument(
        "--bases", nargs="*", type=Path, default=[], help="HF model dirs to probe under teacher forcing"
    )
    ap.add_argument("--episodes", type=int, default=80, help="episodes of each file the bases are probed on")
    args = ap.parse_args(argv)
    for path in args.trajectories:
        if not path.is_file():
            ap.error(f"{path}: no such file")
    for base in args.bases:
        if not (base / "config.json").is_file():
            ap.error(f"{base}: not a model directory (no config.json)")
    from flywheel.tasks import load_suite

    tasks = {t.id: t for split in ("train", "heldout") for t in load_suite(args.suite, split=split)}
    print(f"| trajectories | tries | {' | '.join(CHECKS)} | first try holds OLD |")
    print("|---|---|" + "---|" * (len(CHECKS) + 1))
    for path in args.trajectories:
        c = tally(read_trajectories(path), tasks)
        print(
            f"| {path} | {c['tries']} | "
            + " | ".join(_share(c, f"tries: {k}", c["tries"]) for k in CHECKS)
            + f" | {_share(c, 'first tries: holds OLD', c['first tries'])} |"
        )
    if args.bases:
        print(
            "\n| base | trajectories | tries | N tokens right | OLD tokens right | OLD whole right |\n|---|---|---|---|---|---|"
        )
    for base in args.bases:
        for path in args.trajectories:
            c = teacher_forced(base, read_trajectories(path), args.episodes)
            print(
                f"| {base} | {path} | {c['tries']} | {_share(c, 'N right', c['N tokens'])} | "
                f"{_share(c, 'OLD right', c['OLD tokens'])} | {_share(c, 'OLD whole', c['tries'])} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
