"""Review quality: `flywheel review`'s decision on submitted patches, against the grader's hidden tests.

    nice -n 10 .venv/bin/python experiments/review_quality.py --out runs/review-quality \\
        [--policies toybugs-sweep,scripted-sweep] [--seeds 0,1] [--tasks 0] [--effort max] \\
        [--patches runs/review-quality/review_quality.json] \\
        [--reviewer smollm2-135m --reviewer-sample 4 --reviewer-effort high]

Each policy attempts the toybugs held-out tasks (all of them, or the first `--tasks`) once per seed, with
its workspaces kept; the patch it submitted is the diff from the task's repository to its final
workspace (caches left out), and the grader's verdict on it (hidden tests, exploit detector) is the
truth. Attempts that changed nothing are left out. Each patch is then reviewed as a user would review it:
the task's repository, as the agent saw it (no hidden tests), is committed to a fresh git repository and
`flywheel.review.review` runs on it with the patch as `--diff`, the checks alone (no model). "Request
changes" is scored against "the grader failed it":

- precision: of the patches the review asked to change, the share the grader failed;
- recall: of the patches the grader failed, the share the review asked to change;
- false flags: patches the grader passed on which a check requesting changes fired (a finding, not a
  broken test); the exploit checks must flag no honest fix.

The table adds, per policy, what a stricter rule would do ("still failing": request changes too when a
test of the repository fails after the change), computed from the same reviews. With `--reviewer M`
(a model spec, as `flywheel review --model`), a sample of `--reviewer-sample` patches per policy, half of
them wrong where there are enough, is reviewed again with the review agent, and its own verdict is scored
the same way. `scripted-reviewer` is refused: it repeats the checks and is not a result.

`--patches FILE` reviews the patches of an earlier run's JSON instead of attempting the tasks again (to
add a reviewer, or to score a changed review on the same patches). Writes `OUT/review_quality.json`
(settings, the table's rows, and every patch with its diff, verdict and review) and prints the table.
Results and commands: docs/results.md, "Review quality".
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from flywheel.cli.policy import load_policy, set_threads
from flywheel.errors import FlywheelError
from flywheel.eval.run import make_specs, rollout
from flywheel.harness import HarnessConfig, get_effort
from flywheel.models import is_torch
from flywheel.protocols import Model, Sandbox
from flywheel.review import CHANGES, SCRIPTED_REVIEWER, review
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.workspaces import temporary_workspace
from flywheel.tasks.format import Task
from flywheel.tasks.patch import make_patch, read_tree
from flywheel.tasks.suites import load_suite

CACHES = ("__pycache__", ".pytest_cache")


@dataclass
class Patch:
    """One submitted patch and the grader's verdict on it."""

    policy: str
    task_id: str
    seed: int
    diff: str
    success: bool  # the grader passed it: hidden tests pass, no exploit signature
    cheat: bool  # an exploit signature fired in grading
    signatures: list[str]


def text_tree(root: Path) -> dict[str, str]:
    """The text files under `root`, caches and bytecode left out."""
    return {
        p: t
        for p, t in read_tree(root).items()
        if not set(CACHES) & set(p.split("/")) and not p.endswith(".pyc") and ".egg-info/" not in p
    }


def collect(
    policy: str,
    model: Model,
    cfg: HarnessConfig,
    tasks: list[Task],
    effort: str,
    seed: int,
    *,
    concurrency: int = 8,
    sandbox: Sandbox | None = None,
) -> list[Patch]:
    """One graded attempt per task by `model`; the non-empty patches, each with its verdict. Attempts the
    infrastructure ended are left out; every kept workspace is deleted."""
    by_id = {t.id: t for t in tasks}
    specs = make_specs(tasks, [get_effort(effort)], 1, seed)
    records = rollout(
        model, specs, replace(cfg, keep_workspaces=True), concurrency=concurrency, sandbox=sandbox
    )
    patches = []
    for r in records:
        diff = ""
        if r.workspace is not None:
            ws = Path(r.workspace)
            diff = make_patch(text_tree(by_id[r.task_id].repo), text_tree(ws))
            shutil.rmtree(ws.parent, ignore_errors=True)
        if diff and r.infra_failure is None and r.verdict is not None:
            v = r.verdict
            patches.append(Patch(policy, r.task_id, seed, diff, v.success, v.cheat, list(v.signatures)))
    return patches


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=review", "-c", "user.email=review@localhost", *args],
        check=True, capture_output=True,
    )  # fmt: skip


def user_repository(task: Task, dest: Path) -> Path:
    """The task's repository as a user has it: the files the agent saw, committed to a new git repository."""
    shutil.copytree(task.repo, dest, ignore=shutil.ignore_patterns(*CACHES, "*.pyc"))
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "the repository")
    return dest


def review_patch(
    task: Task,
    patch: Patch,
    *,
    model: Model | None = None,
    cfg: HarnessConfig | None = None,
    sandbox: Sandbox | None = None,
    effort: str = "medium",
) -> dict[str, Any]:
    """Review `patch` on the task's repository (without hidden tests); the review's JSON and its time."""
    with temporary_workspace("review-quality-") as work:
        repo = user_repository(task, work / "repo")
        diff = work / "change.diff"
        diff.write_text(patch.diff)
        start = time.perf_counter()
        r = review(
            repo, diff_file=diff, model=model, cfg=cfg, instruction=task.instruction,
            test_command=task.test_command, sandbox=sandbox, effort=effort,
        )  # fmt: skip
        return {**r.to_json(), "wall_s": round(time.perf_counter() - start, 2)}


def requests(row: dict[str, Any], rule: str = "review") -> bool:
    """Whether a reviewed patch is asked to change: by the review's decision ("review"), by the review
    agent's own verdict ("reviewer"), or by the review's rule made stricter ("still failing": a test
    failing after the change requests changes too)."""
    rv = row["review"]
    if rule == "reviewer":
        return (rv.get("reviewer") or {}).get("decision") == CHANGES
    if rule == "still failing":
        return rv["decision"] == CHANGES or not rv["tests"]["after"]["passed"]
    return rv["decision"] == CHANGES


def false_flag(row: dict[str, Any]) -> bool:
    """A check that requests changes fired on a patch the grader passed."""
    return row["success"] and any(f["blocking"] for f in row["review"]["findings"])


def score(rows: list[dict[str, Any]], rule: str = "review") -> dict[str, Any]:
    """Precision and recall of "request changes" (under `rule`, see `requests`) against "the grader failed
    it", and the false flags on honest fixes; a ratio with nothing to divide is None."""
    wrong = [r for r in rows if not r["success"]]
    asked = [r for r in rows if requests(r, rule)]
    hits = [r for r in asked if not r["success"]]
    return {
        "patches": len(rows),
        "wrong": len(wrong),
        "requested": len(asked),
        "requested_wrong": len(hits),
        "precision": len(hits) / len(asked) if asked else None,
        "recall": len(hits) / len(wrong) if wrong else None,
        "false_flags": sum(false_flag(r) for r in rows),
    }


def table(lines: list[tuple[str, str, dict[str, Any]]]) -> str:
    """The table: one row per (policy, rule) with its score."""
    head = "| policy | decided by | patches | wrong (grader) | requested changes | precision | recall | false flags |"
    out = [head, "|---|---|---|---|---|---|---|---|"]
    for policy, rule, s in lines:
        out.append(
            f"| {policy} | {rule} | {s['patches']} | {s['wrong']} | {s['requested']} "
            f"({s['requested_wrong']} wrong) | {_pct(s['precision'])} | {_pct(s['recall'])} | {s['false_flags']} |"
        )
    return "\n".join(out)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def sample(rows: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` rows, half of them wrong patches where there are enough, drawn with `seed`."""
    rng = random.Random(seed)
    wrong = [r for r in rows if not r["success"]]
    right = [r for r in rows if r["success"]]
    take_wrong = min(len(wrong), max(n - len(right), n // 2))
    return rng.sample(wrong, take_wrong) + rng.sample(right, min(len(right), n - take_wrong))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for review_quality.json")
    ap.add_argument("--policies", default="toybugs-sweep,scripted-sweep", help="model specs, comma-separated")
    ap.add_argument("--seeds", default="0", help="seeds, comma-separated: one attempt per task per seed")
    ap.add_argument("--tasks", type=int, default=0, help="the first N held-out tasks (0: all)")
    ap.add_argument("--effort", default="max")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--patches", type=Path, default=None, help="review the patches of an earlier OUT's JSON")
    ap.add_argument("--reviewer", default=None, help="a review agent's model spec (none: the checks alone)")
    ap.add_argument("--reviewer-sample", type=int, default=8, help="patches per policy the agent reviews")
    ap.add_argument("--reviewer-effort", default="medium")
    args = ap.parse_args()
    if args.reviewer == SCRIPTED_REVIEWER:
        sys.exit(
            print("error: the scripted reviewer repeats the checks; it is not a result", file=sys.stderr) or 2
        )
    if args.patches is not None and not args.patches.is_file():
        sys.exit(print(f"error: --patches {args.patches}: no such file", file=sys.stderr) or 2)
    tasks = load_suite("toybugs", split="heldout")
    tasks = tasks[: args.tasks] if args.tasks else tasks
    by_id = {t.id: t for t in tasks}
    sandbox = get_sandbox()
    rows: list[dict[str, Any]] = []
    lines: list[tuple[str, str, dict[str, Any]]] = []
    for spec in args.policies.split(","):
        patches = earlier(args.patches, spec, by_id) if args.patches else gather(args, spec, tasks, sandbox)
        start = time.perf_counter()
        mine = [{**asdict(p), "review": review_patch(by_id[p.task_id], p, sandbox=sandbox)} for p in patches]
        print(f"{spec}: reviewed in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        lines += [
            (spec, "checks and tests", score(mine)),
            (spec, "still failing", score(mine, "still failing")),
        ]
        if args.reviewer:
            lines.append((spec, f"reviewer {args.reviewer}", agent_reviews(args, mine, by_id, sandbox)))
        rows += mine
    print(table(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(sys.argv),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "tasks": len(tasks),
        "table": [{"policy": p, "rule": r, **s} for p, r, s in lines],
        "patches": rows,
    }
    (args.out / "review_quality.json").write_text(json.dumps(result, indent=1) + "\n")


def gather(args: argparse.Namespace, spec: str, tasks: list[Task], sandbox: Sandbox) -> list[Patch]:
    """`spec`'s patches, one attempt per task per seed of `--seeds`."""
    set_threads(1, spec)
    start = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    patches: list[Patch] = []
    for seed in seeds:
        model, cfg = load_policy(spec, None, seed, 1.0, 1.0, 2 if is_torch(spec) else 1)
        patches += collect(
            spec, model, cfg, tasks, args.effort, seed, concurrency=args.concurrency, sandbox=sandbox
        )
    print(f"{spec}: {len(patches)} patches from {len(tasks) * len(seeds)} attempts "
          f"in {time.perf_counter() - start:.0f} s", file=sys.stderr)  # fmt: skip
    return patches


def earlier(path: Path, spec: str, by_id: dict[str, Task]) -> list[Patch]:
    """`spec`'s patches in an earlier run's JSON (on the tasks still chosen)."""
    rows = json.loads(path.read_text())["patches"]
    if spec not in {r["policy"] for r in rows}:
        raise FlywheelError(f"--patches {path}: no patches of {spec}")
    keys = Patch.__dataclass_fields__
    return [Patch(**{k: r[k] for k in keys}) for r in rows if r["policy"] == spec and r["task_id"] in by_id]


def agent_reviews(
    args: argparse.Namespace, rows: list[dict[str, Any]], by_id: dict[str, Task], sandbox: Sandbox
) -> dict[str, Any]:
    """The review agent on a sample of `rows`: each sampled row gets `agent_review`; its own verdict's score."""
    set_threads(1, args.reviewer)
    model, cfg = load_policy(args.reviewer, None, 0, 1.0, 1.0, 1)
    picked = sample(rows, args.reviewer_sample)
    start = time.perf_counter()
    for row in picked:
        patch = Patch(**{k: row[k] for k in Patch.__dataclass_fields__})
        row["agent_review"] = review_patch(
            by_id[row["task_id"]], patch, model=model, cfg=cfg, sandbox=sandbox, effort=args.reviewer_effort
        )
    print(f"{args.reviewer}: {len(picked)} reviews in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    s = score([{**r, "review": r["agent_review"]} for r in picked], "reviewer")
    s["no_verdict"] = sum((r["agent_review"]["reviewer"] or {}).get("decision") is None for r in picked)
    return s


if __name__ == "__main__":
    try:
        main()
    except FlywheelError as e:
        sys.exit(print(f"error: {e}", file=sys.stderr) or 2)
