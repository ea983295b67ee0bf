"""Verifier QA: wrong patches, flakiness, reason codes and the estimated error rates, on real grading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.protocols import RunResult
from flywheel.sandbox import get_sandbox
from flywheel.tasks import Task, task_toml, write_task
from flywheel.tasks.patch import make_patch
from flywheel.verify.qa import (
    REASONS,
    TaskQA,
    WrongPatch,
    delete_body,
    judge,
    summarize,
    touched_functions,
    validate_task,
    wrong_patches,
    wrong_sources,
)

GOOD = '''def score(hits, misses):
    """Share of hits, as a whole percentage rounded down."""
    if hits + misses == 0:
        return 0
    return 100 * hits // (hits + misses)


def double(x):
    return 2 * x
'''
BUGGY = GOOD.replace("// (hits + misses)", "// (hits + misses + 1)")
# Every single-site mutant of the fixed `score` fails at least one of these tests.
STRONG = """import os

from scores import score


def test_all_hits():
    assert score(1, 0) == 100


def test_third():
    assert score(1, 2) == 33


def test_most():
    assert score(3, 1) == 75 and score(2, 1) == 66


def test_half():
    assert score(1, 1) == 50


def test_empty():
    assert score(0, 0) == 0


def test_none():
    assert score(0, 1) == 0


def test_not_on_a_marked_run():
    assert os.environ.get("QA_FLAKE") != "fail"
"""
FAIL_BEFORE = ("test_all_hits", "test_third", "test_most", "test_half")
# One case only: the off-by-one mutant of the fixed `score` (`== 0` -> `== 1`) still returns 75 for it.
WEAK = """from scores import score


def test_most():
    assert score(3, 1) == 75
"""


def make_task(
    dest: Path,
    tests: str,
    *,
    task_id: str = "score-qa",
    solution: str | None = None,
    repo_source: str = BUGGY,
) -> Task:
    names = [ln[4:].split("(")[0] for ln in tests.splitlines() if ln.startswith("def test_")]
    node = "tests/test_scores.py::"
    return write_task(
        dest,
        toml=task_toml(
            id=task_id,
            instruction="score(1, 0) returns 50; it should be 100.",
            test_command="python -m pytest -q tests",
            fail_to_pass=[node + n for n in names if n in FAIL_BEFORE],
            pass_to_pass=[node + n for n in names if n not in FAIL_BEFORE],
            timeout_s=30,
        ),
        repo={"scores.py": repo_source, "tests/test_scores.py": WEAK},
        hidden_tests={"tests/test_scores.py": tests},
        solution_patch=solution
        if solution is not None
        else make_patch({"scores.py": BUGGY}, {"scores.py": GOOD}),
    )


# ------------------------------------------------------------------------------------------ pure parts


def test_touched_functions_and_delete_body():
    assert touched_functions(BUGGY, GOOD) == ["score"]
    assert touched_functions(GOOD, GOOD + "\n\ndef extra():\n    return 1\n") == ["extra"]
    deleted = delete_body(GOOD, "score")
    assert (
        deleted is not None
        and '"""Share of hits, as a whole percentage rounded down."""\n    pass\n' in deleted
    )
    assert "if hits" not in deleted and "return 2 * x" in deleted  # the other function is untouched
    assert delete_body("def f(): return 1\n", "f") is None and delete_body(GOOD, "nope") is None


def test_wrong_sources_are_other_bugs_in_the_fixed_function():
    wrong = wrong_sources(BUGGY, GOOD, n_mutants=4, seed=0)
    names = [n for n, _ in wrong]
    assert names[0] == "delete_body:score" and len(names) == 5
    assert all(n.startswith("mutant:") and n.split(":")[2] == "score" for n in names[1:])
    assert len({n.split(":")[1] for n in names[1:]}) == 4  # round-robin over mutation kinds
    assert all(src not in (BUGGY, GOOD) and "return 2 * x" in src for _, src in wrong)
    assert wrong == wrong_sources(BUGGY, GOOD, n_mutants=4, seed=0)
    assert len(wrong_sources(BUGGY, GOOD, n_mutants=0, seed=0)) == 1


def test_summarize_counts_reasons_and_pools_rates():
    a = TaskQA("a", True, 3, 3, True, True, wrong_patches=[WrongPatch("noop", False), WrongPatch("m", False)])
    b = TaskQA(
        "b",
        False,
        1,
        3,
        True,
        True,
        reasons=["x", "y"],
        codes=["flaky", "mutant_passes"],
        wrong_patches=[WrongPatch("noop", False), WrongPatch("m", True)],
    )
    c = TaskQA(
        "c",
        False,
        0,
        2,
        False,
        False,
        codes=["reference_fails", "unmodified_passes"],
        wrong_patches=[WrongPatch("noop", True)],
    )
    s = summarize([a, b, c])
    assert (s["total"], s["valid"], s["rejected"]) == (3, 1, 2)
    assert s["rejections"] == {"reference_fails": 1, "flaky": 1, "unmodified_passes": 1, "mutant_passes": 1}
    assert s["false_negative_rate"] == pytest.approx(4 / 8) and s["false_positive_rate"] == pytest.approx(
        2 / 5
    )
    assert b.false_negative_rate == pytest.approx(2 / 3) and b.false_positive_rate == 0.5
    assert set(REASONS) >= set(s["rejections"])


# ------------------------------------------------------------------------------------- real grading


class MarkedRuns:
    """The real sandbox, with QA_FLAKE=fail set on the runs whose numbers are listed (a flaky test)."""

    def __init__(self, fail_on: set[int]):
        self.inner, self.fail_on, self.calls = get_sandbox(), fail_on, 0
        self.name = self.inner.name

    def run(self, workspace, argv, *, env=None, **kw) -> RunResult:
        self.calls += 1
        env = {**(env or {}), **({"QA_FLAKE": "fail"} if self.calls in self.fail_on else {})}
        return self.inner.run(workspace, argv, env=env, **kw)


def test_judge_warns_on_a_surviving_mutant_unless_strict():
    def graded(*passed_names):
        names = ["noop", "delete_body:f", "mutant:flip_comparison:f:3", "mutant:off_by_one:f:4"]
        return TaskQA(
            "t", False, 2, 2, True, True, wrong_patches=[WrongPatch(n, n in passed_names) for n in names]
        )

    qa = graded("mutant:off_by_one:f:4")
    judge(qa)
    assert qa.ok and qa.codes == [] and qa.warnings == ["mutant_passes: mutant:off_by_one:f:4"]
    assert qa.false_positive_rate == 0.25 and summarize([qa])["warnings"] == {"mutant_passes": 1}
    qa = graded("mutant:off_by_one:f:4")
    judge(qa, strict=True)
    assert not qa.ok and qa.codes == ["mutant_passes"] and qa.warnings == []
    qa = graded("delete_body:f")
    judge(qa)
    assert not qa.ok and qa.codes == ["delete_body_passes"]
    qa = graded()
    judge(qa, strict=True)
    assert qa.ok and qa.false_positive_rate == 0.0


def test_a_flaky_reference_is_rejected(tmp_path):
    task = make_task(tmp_path / "t", STRONG)
    qa = validate_task(task, k=3, sandbox=MarkedRuns({2}), n_mutants=0)
    assert qa.reference_passes == 2 and qa.codes == ["flaky"] and not qa.ok
    assert qa.false_negative_rate == pytest.approx(1 / 3)


def test_broken_tasks_get_their_reason_codes(tmp_path):
    bad_patch = make_task(
        tmp_path / "a", STRONG, solution=make_patch({"scores.py": GOOD}, {"scores.py": BUGGY})
    )
    qa = validate_task(bad_patch, k=1, n_mutants=0)
    assert qa.codes == ["patch_does_not_apply"] and not qa.ok
    comment_only = make_patch({"scores.py": GOOD}, {"scores.py": "# fixed\n" + GOOD})
    already_fixed = make_task(tmp_path / "b", STRONG, solution=comment_only, repo_source=GOOD)
    qa = validate_task(already_fixed, k=1, n_mutants=0)
    assert qa.codes == ["unmodified_passes", "fail_to_pass_passes_before"], qa.reasons
    assert qa.false_positive_rate == 1.0  # the no-op patch passed


def test_validate_json_reports_wrong_patches_and_rejections(tmp_path):
    make_task(tmp_path / "suite" / "strong", STRONG, task_id="strong")
    make_task(tmp_path / "suite" / "weak", WEAK, task_id="weak")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "flywheel",
            "tasks",
            "validate",
            tmp_path / "suite",
            "--json",
            "--k",
            "1",
            "--mutants",
            "2",
            "--strict",
        ],
        capture_output=True,
        text=True,
    )
    data = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr
    by_id = {t["task_id"]: t for t in data["tasks"]}
    strong, weak = by_id["strong"], by_id["weak"]
    assert strong["ok"] and strong["codes"] == [] and strong["reference_passes"] == 1, strong["reasons"]
    names = [w["name"].split(":")[0] for w in strong["wrong_patches"]]
    assert names == ["noop", "delete_body", "mutant", "mutant"]
    assert not any(w["passed"] for w in strong["wrong_patches"]) and strong["false_positive_rate"] == 0.0
    assert weak["codes"] == ["mutant_passes"] and weak["false_positive_rate"] == 0.25
    assert [w["name"] for w in weak["wrong_patches"] if w["passed"]] == ["mutant:off_by_one:score:3"]
    assert (data["total"], data["valid"], data["rejected"]) == (2, 1, 1)
    assert data["rejections"] == {"mutant_passes": 1} and data["false_negative_rate"] == 0.0
    assert data["strict"] and data["warnings"] == {}
    assert data["wrong_patches"] == 8 and data["false_positive_rate"] == pytest.approx(1 / 8)


def test_wrong_patches_apply_to_the_task_repository(tmp_path):
    from flywheel.tasks.patch import apply_patch, read_tree

    task = make_task(tmp_path / "t", STRONG)
    patches = wrong_patches(task, n_mutants=3, seed=1)
    assert len(patches) == 4
    for _, patch in patches:
        files = apply_patch(read_tree(task.repo), patch)
        assert files["scores.py"] not in (BUGGY, GOOD)
