"""Verifier QA: does a task's grader say yes to the fix and no to everything that is not a fix?

A policy trained by RL learns whatever the verifier rewards, so only tasks that pass QA enter training.
`validate_task` grades, each time through the real grader on a fresh copy of the task's repository:

- the reference solution, k times: a task whose reference fails is broken, one whose reference passes
  only sometimes is flaky; both are rejected. The share of reference runs marked failed is the task's
  estimated **false-negative rate**;
- the unmodified repository (the no-op patch): it must fail, and every fail_to_pass test must fail in it;
- wrong patches (`wrong_patches`): deleting the body of each function the reference fix touches, and up
  to `mutants` other single-site mutants of the fixed function (the AST operators of
  `flywheel.tasks.mutate`, applied to the reference solution's version, so each is a different bug in the
  same place). Each must fail. The share of wrong patches (the no-op included) marked passed is the
  task's estimated **false-positive rate**.

A task is rejected with one reason code per failed check (`REASONS`); `summarize` counts them over a suite
and pools the two rates. A mutant can be equivalent to the fix (`x > hi: return hi` flipped to `x >= hi`
changes nothing), and then its passing is not a verifier error, so the false-positive rate is an upper
bound and a surviving mutant is by default a warning (`warnings`, counted apart), a rejection only with
`strict=True`. The no-op and the deleted body are never equivalent to a fix: they always reject.
"""

from __future__ import annotations

import ast
import random
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flywheel.errors import PatchError
from flywheel.protocols import Limits, Sandbox, Verdict
from flywheel.sandbox.workspaces import temporary_workspace
from flywheel.seeding import stable_seed
from flywheel.tasks.format import Task
from flywheel.tasks.mutate import KINDS, functions, mutants
from flywheel.tasks.patch import apply_patch, apply_patch_to_dir, make_patch, parse_patch
from flywheel.verify.grader import grade

# Reason codes, in the order checks run. A task carries every code that applies.
REASONS = {
    "patch_does_not_apply": "reference patch does not apply",
    "reference_fails": "reference fails",
    "flaky": "flaky: reference passes only sometimes",
    "unmodified_passes": "unmodified repository passes",
    "fail_to_pass_passes_before": "a fail_to_pass test passes before the fix",
    "delete_body_passes": "deleting the fixed function's body passes",
    "mutant_passes": "another mutant of the fixed function passes",
}


@dataclass
class WrongPatch:
    """One wrong patch and what the grader made of it."""

    name: str  # "noop", "delete_body:FUNC" or "mutant:KIND:FUNC:LINE"
    passed: bool
    error: str | None = None


@dataclass
class TaskQA:
    task_id: str
    ok: bool
    reference_passes: int  # of k runs
    k: int
    unmodified_fails: bool
    fail_to_pass_fail_before: bool
    reasons: list[str] = field(default_factory=list)  # human-readable, with details
    codes: list[str] = field(default_factory=list)  # keys of REASONS: why the task is rejected
    warnings: list[str] = field(default_factory=list)  # "mutant_passes: NAME" when not strict
    wrong_patches: list[WrongPatch] = field(default_factory=list)

    @property
    def false_negative_rate(self) -> float:
        """Share of the reference runs the verifier marked failed."""
        return (self.k - self.reference_passes) / self.k if self.k else 0.0

    @property
    def false_positive_rate(self) -> float:
        """Share of the wrong patches (the no-op included) the verifier marked passed."""
        n = len(self.wrong_patches)
        return sum(w.passed for w in self.wrong_patches) / n if n else 0.0

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "false_negative_rate": self.false_negative_rate,
            "false_positive_rate": self.false_positive_rate,
        }


# ------------------------------------------------------------------------------- wrong patches (pure)


def touched_functions(before: str, after: str) -> list[str]:
    """Qualified names of the functions whose code differs between two versions of a module (in `after`)."""
    old = {name: ast.dump(fn) for name, fn in functions(ast.parse(before))}
    return [name for name, fn in functions(ast.parse(after)) if old.get(name) != ast.dump(fn)]


def delete_body(source: str, qualname: str) -> str | None:
    """`source` with function `qualname`'s body (docstring kept) replaced by `pass`; None if not possible."""
    fn = dict(functions(ast.parse(source))).get(qualname)
    if fn is None:
        return None
    body = fn.body[1:] if fn.body and _is_docstring(fn.body[0]) else fn.body
    if not body or body[0].lineno == fn.lineno:
        return None
    lines = source.splitlines(keepends=True)
    first = lines[body[0].lineno - 1]
    indent = first[: len(first) - len(first.lstrip())]
    end = fn.end_lineno or body[-1].end_lineno or body[-1].lineno
    out = "".join(lines[: body[0].lineno - 1] + [indent + "pass\n"] + lines[end:])
    return None if out == source else out


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def wrong_sources(before: str, after: str, n_mutants: int, seed: int) -> list[tuple[str, str]]:
    """(name, wrong version of the module) for a fix from `before` (buggy) to `after` (fixed).

    Body deletions of every touched function, then up to `n_mutants` mutants of the touched functions'
    fixed code (round-robin over mutation kinds, shuffled by `seed`), none equal to `before` or `after`.
    """
    try:
        touched = touched_functions(before, after)
    except SyntaxError:
        return []
    out = [(f"delete_body:{f}", s) for f in touched if (s := delete_body(after, f)) not in (None, before)]
    pool = [m for m in mutants(after) if m.function in touched and m.source not in (before, after)]
    rng = random.Random(seed)
    by_kind = {k: [m for m in pool if m.kind == k] for k in KINDS}
    for ms in by_kind.values():
        rng.shuffle(ms)
    chosen = []
    while len(chosen) < n_mutants and any(by_kind.values()):
        for kind in KINDS:
            if by_kind[kind] and len(chosen) < n_mutants:
                chosen.append(by_kind[kind].pop())
    out += [(f"mutant:{m.kind}:{m.function}:{m.line}", m.source) for m in chosen]
    return out


def wrong_patches(task: Task, n_mutants: int = 3, seed: int = 0) -> list[tuple[str, str]]:
    """(name, patch against the task's repository) for each wrong patch of `wrong_sources`."""
    parsed = parse_patch(task.solution_patch)
    paths = sorted(
        {fp.old_path for fp in parsed if fp.old_path and fp.new_path and fp.old_path.endswith(".py")}
    )
    before = {p: (task.repo / p).read_text() for p in paths if (task.repo / p).is_file()}
    after = apply_patch(before, task.solution_patch) if len(before) == len(paths) else {}
    out: list[tuple[str, str]] = []
    for path in sorted(before):
        if path not in after:
            continue
        rng_seed = stable_seed("qa", task.id, seed, path)
        for name, source in wrong_sources(before[path], after[path], n_mutants, rng_seed):
            out.append((name, make_patch({path: before[path]}, {path: source})))
    return out


# ------------------------------------------------------------------------------------------- grading


def workspace_with_patch(task: Task, patch: str | None, dest: Path) -> Path:
    """A copy of the task's repository at `dest`, with `patch` applied when given."""
    shutil.copytree(task.repo, dest, symlinks=True)
    if patch:
        apply_patch_to_dir(dest, patch)
    return dest


def grade_patch(
    task: Task, patch: str | None, sandbox: Sandbox | None = None, limits: Limits | None = None
) -> Verdict:
    """Grade the task's repository with `patch` applied (None: the repository as shipped)."""
    with temporary_workspace("qa-") as tmp:
        ws = workspace_with_patch(task, patch, tmp / "repo")
        return grade(task, ws, sandbox=sandbox, limits=limits)


def wrong_patch_limits(task: Task, reference_wall_s: float) -> Limits:
    """A wrong patch that loops need not run the task's whole time limit: 5x the reference's time, 15 s
    at least (a wrong patch that times out fails either way)."""
    return Limits(timeout_s=min(task.timeout_s, max(15.0, 5 * reference_wall_s)))


def validate_task(
    task: Task,
    k: int = 1,
    sandbox: Sandbox | None = None,
    n_mutants: int = 3,
    seed: int = 0,
    strict: bool = False,
) -> TaskQA:
    """Run every QA check on `task` (see the module docstring); `n_mutants=0` grades no mutants, `strict`
    rejects a task when a mutant passes."""
    qa = TaskQA(task.id, False, 0, k, False, False)
    wall = 0.0
    try:
        for _ in range(k):
            verdict = grade_patch(task, task.solution_patch, sandbox)
            qa.reference_passes += verdict.success
            wall = max(wall, verdict.wall_s)
            detail = f"reference: {verdict.error}"
            if not verdict.success and verdict.error and detail not in qa.reasons:
                qa.reasons.append(detail)
    except PatchError as e:
        _reject(qa, "patch_does_not_apply", f"reference patch does not apply: {e}")
    before = grade_patch(task, None, sandbox)
    qa.unmodified_fails = not before.success
    qa.fail_to_pass_fail_before = all(before.tests.get(t) != "passed" for t in task.fail_to_pass)
    qa.wrong_patches.append(WrongPatch("noop", before.success, before.error))
    if "patch_does_not_apply" not in qa.codes:
        limits = wrong_patch_limits(task, wall or task.timeout_s)
        for name, patch in wrong_patches(task, n_mutants, seed):
            v = grade_patch(task, patch, sandbox, limits)
            error = (
                f"tests timed out after {limits.timeout_s:g} s"
                if v.error and "timed out" in v.error
                else v.error
            )
            qa.wrong_patches.append(WrongPatch(name, v.success, error))
    judge(qa, strict)
    return qa


def _reject(qa: TaskQA, code: str, detail: str | None = None) -> None:
    if code not in qa.codes:
        qa.codes.append(code)
        qa.reasons.append(detail or REASONS[code])


def judge(qa: TaskQA, strict: bool = False) -> None:
    """Set `qa.ok`, reason codes and warnings from the graded results already in `qa`."""
    if "patch_does_not_apply" not in qa.codes and qa.reference_passes < qa.k:
        if qa.reference_passes == 0:
            _reject(qa, "reference_fails")
        else:
            _reject(qa, "flaky", f"flaky: reference passed {qa.reference_passes} of {qa.k}")
    if not qa.unmodified_fails:
        _reject(qa, "unmodified_passes")
    if not qa.fail_to_pass_fail_before:
        _reject(qa, "fail_to_pass_passes_before")
    for w in qa.wrong_patches:
        if not w.passed or w.name == "noop":
            continue
        if w.name.startswith("delete_body"):
            _reject(qa, "delete_body_passes", f"{REASONS['delete_body_passes']}: {w.name}")
        elif strict:
            _reject(qa, "mutant_passes", f"{REASONS['mutant_passes']}: {w.name}")
        else:
            qa.warnings.append(f"mutant_passes: {w.name}")
    qa.ok = not qa.codes


def summarize(results: Iterable[TaskQA]) -> dict:
    """Totals over a suite: valid tasks, rejections by reason code, pooled false-negative/positive rates."""
    results = list(results)
    runs = sum(r.k for r in results)
    wrong = [w for r in results for w in r.wrong_patches]
    rejections = Counter(code for r in results for code in r.codes)
    warned = Counter(w.split(":", 1)[0] for r in results for w in r.warnings)
    return {
        "total": len(results),
        "valid": sum(r.ok for r in results),
        "rejected": sum(not r.ok for r in results),
        "rejections": {code: rejections[code] for code in REASONS if rejections[code]},
        "warnings": dict(sorted(warned.items())),  # tasks with a surviving mutant, when not strict
        "reference_runs": runs,
        "false_negative_rate": sum(r.k - r.reference_passes for r in results) / runs if runs else 0.0,
        "wrong_patches": len(wrong),
        "false_positive_rate": sum(w.passed for w in wrong) / len(wrong) if wrong else 0.0,
    }
