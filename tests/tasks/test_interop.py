"""Harbor and SWE-bench, in and out: round trips on toybugs, tasks written the other systems' way, their
refusals, and the imported tasks through the real verifier QA (sandbox and grader)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.protocols import Environment
from flywheel.tasks import Task, load_suite
from flywheel.tasks.interop import (
    collect_test_ids,
    docker_plan,
    export_tasks,
    import_tasks,
    pytest_targets,
    solve_patch,
    tree_digest,
)

ROOT = Path(__file__).resolve().parents[2]
PY = f"{sys.version_info.major}.{sys.version_info.minor}"  # a Python this host has


def flywheel(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", *map(str, args)], capture_output=True, text=True)


def assert_one_line_error(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("flywheel: error: ") and all(f in lines[0] for f in fragments), lines[0]


@pytest.fixture(scope="module")
def toy() -> list[Task]:
    """Six toybugs tasks, one per module (both splits), from the cached built-in suite."""
    first: dict[str, Task] = {}
    for task in load_suite("toybugs"):
        first.setdefault(str(task.meta["module"]), task)
    tasks = list(first.values())[:6]
    assert {t.meta["split"] for t in tasks} == {"train", "heldout"}
    return tasks


def snapshot(task: Task) -> dict[str, object]:
    """Every field of our task format, files included."""

    def files(root: Path) -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }

    return {
        "id": task.id,
        "instruction": task.instruction,
        "test_command": task.test_command,
        "fail_to_pass": task.fail_to_pass,
        "pass_to_pass": task.pass_to_pass,
        "timeout_s": task.timeout_s,
        "meta": dict(task.meta),
        "repo": files(task.repo),
        "tests": files(task.hidden_tests),
        "solution.patch": task.solution_patch,
        "environment": task.environment,
    }


# ------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("fmt", ["harbor", "swebench"])
def test_round_trip_keeps_every_field(toy, tmp_path, fmt):
    export_tasks(fmt, toy, tmp_path / "out")
    back = import_tasks(fmt, tmp_path / "out", tmp_path / "back")
    assert [snapshot(t) for t in back] == [snapshot(t) for t in sorted(toy, key=lambda t: t.id)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back", "out"]  # no staging directory left


def test_harbor_export_layout(toy, tmp_path):
    task = toy[0]
    export_tasks("harbor", [task], tmp_path / "h")
    d = tmp_path / "h" / task.id
    assert (d / "instruction.md").read_text() == task.instruction
    assert (d / "environment" / "Dockerfile").read_text().splitlines()[2:] == [
        f"FROM python:{sys.version_info.major}.{sys.version_info.minor}",
        f"RUN pip install --no-cache-dir pytest=={pytest.__version__}",
        "WORKDIR /app",
        "COPY . /app/",
    ]
    for rel in task.hidden_files():
        assert (d / "tests" / rel).read_bytes() == (task.hidden_tests / rel).read_bytes()
        assert (d / "environment" / rel).read_bytes() == (task.repo / rel).read_bytes()
    assert "/logs/verifier/reward.txt" in (d / "tests" / "test.sh").read_text()
    assert os.access(d / "tests" / "test.sh", os.X_OK) and os.access(d / "solution" / "solve.sh", os.X_OK)


def test_swebench_export_fields(toy, tmp_path):
    export_tasks("swebench", toy[:2], tmp_path / "s")
    rows = [json.loads(line) for line in (tmp_path / "s" / "instances.jsonl").read_text().splitlines()]
    assert [r["instance_id"] for r in rows] == [t.id for t in toy[:2]]
    for row, task in zip(rows, toy, strict=False):
        assert row["repo"] == f"flywheel/{task.id}" and row["patch"] == task.solution_patch
        assert row["problem_statement"] == task.instruction
        assert row["FAIL_TO_PASS"] == list(task.fail_to_pass) and row["PASS_TO_PASS"] == list(
            task.pass_to_pass
        )
        checkout = tmp_path / "s" / "repos" / f"flywheel__{task.id}"
        assert row["base_commit"] == tree_digest(checkout) == tree_digest(task.repo)
        assert "+++ b/tests/" in row["test_patch"]


def test_exported_harbor_scripts_grade_under_bash(toy, tmp_path):
    """solve.sh and test.sh as Harbor runs them, with /app, /tests and /logs moved under tmp_path."""
    if not (shutil.which("bash") and shutil.which("patch")):
        pytest.skip("needs bash and patch")
    task = toy[1]
    export_tasks("harbor", [task], tmp_path / "h")
    d = tmp_path / "h" / task.id
    app, logs = tmp_path / "app", tmp_path / "logs"
    shutil.copytree(d / "environment", app, ignore=shutil.ignore_patterns("Dockerfile", ".dockerignore"))
    where = {"/app": str(app), "/tests/": f"{d / 'tests'}/", "/logs/verifier": str(logs)}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def run(script: str) -> None:
        text = re.sub(r"/app\b|/tests/|/logs/verifier", lambda m: where[m.group(0)], (d / script).read_text())
        (tmp_path / "script.sh").write_text(text)
        subprocess.run(["bash", str(tmp_path / "script.sh")], env=env, capture_output=True, check=False)

    run("tests/test.sh")
    assert (logs / "reward.txt").read_text().strip() == "0"
    run("solution/solve.sh")
    run("tests/test.sh")
    assert (logs / "reward.txt").read_text().strip() == "1"


# ------------------------------------------------------------------------------------------- Harbor, theirs

GREET_BUGGY = 'def greet(name):\n    return f"Hi, {name}"\n'
GREET_PATCH = """--- a/greet.py
+++ b/greet.py
@@ -1,2 +1,2 @@
 def greet(name):
-    return f"Hi, {name}"
+    return f"Hello, {name}!"
"""
HARBOR_TEST_SH = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json \\
  /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
HARBOR_FILES = {
    "task.toml": """version = "1.0"

[metadata]
author_name = "Ada"
difficulty = "easy"
tags = ["python"]

[verifier]
timeout_sec = 90.0

[agent]
timeout_sec = 300.0
""",
    "instruction.md": "`greet(name)` in greet.py should say `Hello, NAME!`.\n",
    "environment/Dockerfile": f"""FROM python:{PY}-slim
ENV PYTHONUNBUFFERED=1
RUN pip install --no-cache-dir pytest=={pytest.__version__}
WORKDIR /app
COPY greet.py /app/greet.py
""",
    "environment/greet.py": GREET_BUGGY,
    "environment/notes.txt": "not copied into the image\n",
    "tests/test.sh": HARBOR_TEST_SH,
    "tests/test_outputs.py": """from greet import greet


def test_hello():
    assert greet("Ada") == "Hello, Ada!"


class TestGreet:
    def test_empty(self):
        assert greet("") == "Hello, !"
""",
    "solution/solve.sh": f"#!/bin/bash\ncat > /tmp/fix.patch <<'EOF'\n{GREET_PATCH}EOF\ncd /app\npatch -p1 < /tmp/fix.patch\n",
}


def write_files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def harbor_task(tmp_path: Path) -> Path:
    """A Harbor task written the way Harbor's template writes them: pytest through uvx, a patch in solve.sh."""
    return write_files(tmp_path / "harbor" / "hello", HARBOR_FILES)


def test_harbor_task_imports(harbor_task, tmp_path):
    (task,) = import_tasks("harbor", harbor_task.parent, tmp_path / "ours")
    assert task.id == "hello" and task.instruction == HARBOR_FILES["instruction.md"]
    assert task.fail_to_pass == ("test_outputs.py::test_hello", "test_outputs.py::TestGreet::test_empty")
    assert task.pass_to_pass == () and task.timeout_s == 90.0
    assert dict(task.meta) == {
        "source": "harbor",
        "author_name": "Ada",
        "difficulty": "easy",
        "tags": ["python"],
        "agent_timeout_s": 300.0,
    }
    assert sorted(p.name for p in task.repo.iterdir()) == ["greet.py"]
    assert task.hidden_files() == ["test_outputs.py"] and task.solution_patch == GREET_PATCH
    assert task.environment == Environment(
        requirements=(f"pytest=={pytest.__version__}",), python=PY, workdir="/app"
    )


@pytest.mark.parametrize(
    "rel,text,fragments",
    [
        ("environment/Dockerfile", "FROM node:20\nWORKDIR /app\n", ["line 1", "node:20"]),
        (
            "environment/Dockerfile",
            "FROM python:3.12\nRUN apt-get update && apt-get install -y jq\nWORKDIR /app\nCOPY . .\n",
            ["line 2", "RUN apt-get update"],
        ),
        ("environment/docker-compose.yaml", "services: {}\n", ["docker-compose"]),
    ],
)
def test_harbor_task_that_needs_docker_is_refused(harbor_task, tmp_path, rel, text, fragments):
    (harbor_task / rel).write_text(text)
    with pytest.raises(FlywheelError) as e:
        import_tasks("harbor", harbor_task, tmp_path / "ours")
    message = str(e.value)
    assert message.startswith("harbor task hello: needs its own Docker environment") and "\n" not in message
    assert all(f in message for f in fragments), message
    assert not (tmp_path / "ours").exists()


@pytest.mark.parametrize(
    "rel,text,fragment",
    [
        ("tests/test.sh", "pytest /tests/test_outputs.py\ngrep -q hi /app/out.txt\n", "runs `grep -q hi"),
        ("tests/test.sh", "echo hi\n", "runs no pytest"),
        ("tests/test.sh", "pytest -k hello /tests\n", "-k selects tests"),
        (
            "tests/test_outputs.py",
            "def test_out():\n    assert open('/tests/expected.txt')\n",
            "tests/test_outputs.py reads /tests, where Harbor uploads the tests",
        ),
        (
            "solution/solve.sh",
            "#!/bin/bash\nsed -i 's/Hi, {name}/Hello, {name}!/' /app/greet.py\n",
            "no diff",
        ),
        ("environment/Dockerfile", "FROM python:3.12\nCOPY greet.py /app/\n", "no WORKDIR"),
        ("environment/Dockerfile", "FROM python:3.12\nWORKDIR /app\nCOPY nope.py .\n", "copies nope.py"),
    ],
)
def test_harbor_task_we_cannot_grade_is_refused(harbor_task, tmp_path, rel, text, fragment):
    (harbor_task / rel).write_text(text)
    with pytest.raises(FlywheelError, match=re.escape(fragment)) as e:
        import_tasks("harbor", harbor_task, tmp_path / "ours")
    assert str(e.value).startswith("harbor task hello: ")


def test_dockerfile_plan_reads_copies_and_workdir():
    text = "# comment\nFROM docker.io/library/python:3.11-slim AS base\nWORKDIR /srv\nWORKDIR app\n"
    text += 'COPY --chown=1000 src/ lib/\nRUN python -m pip install -q pytest \\\n    && mkdir -p /tmp/x\nCMD ["bash"]\n'
    plan = docker_plan(text, {})
    assert plan.workdir == "/srv/app" and plan.copies == [(["src/"], "/srv/app/lib", True)]
    assert plan.environment == Environment(requirements=("pytest",), python="3.11", workdir="/srv/app")


def test_pytest_targets_follow_cd_and_map_tests_over_workdir():
    assert pytest_targets("cd /tests\npython3 -m pytest -q -p no:cacheprovider test_a.py::t\n", "/app") == [
        "test_a.py::t"
    ]
    assert pytest_targets("uv run --with pytest pytest /app/tests /tests\n", "/app") == ["tests", "."]
    assert pytest_targets("mkdir -p x && cp /tests/a.py a.py\npytest 2>&1 | tee log\n", "/app") == ["."]
    with pytest.raises(FlywheelError, match="pytest 2 times"):
        pytest_targets("pytest a.py\npytest b.py\n", "/app")
    with pytest.raises(FlywheelError, match="neither /tests nor /app"):
        pytest_targets("pytest /opt/t.py\n", "/app")


def test_test_ids_follow_pytest_collection_rules():
    source = (
        "import unittest\n\ndef test_a(): pass\ndef helper(): pass\n"
        "class TestB:\n    def test_c(self): pass\n    def other(self): pass\n"
        "class TestInit:\n    def __init__(self): pass\n    def test_no(self): pass\n"
        "class Case(unittest.TestCase):\n    def test_d(self): pass\n"
    )
    assert collect_test_ids("t.py", source) == ["t.py::test_a", "t.py::TestB::test_c", "t.py::Case::test_d"]
    with pytest.raises(FlywheelError, match="parametrized"):
        collect_test_ids("t.py", "import pytest\n@pytest.mark.parametrize('x', [1])\ndef test_p(x): pass\n")


def test_solve_patch_forms():
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert solve_patch(f"cd /app\ngit apply <<'EOF'\n{diff}EOF\n", {}) == diff
    assert solve_patch(f"cat <<EOF | patch -p1\n{diff}EOF\n", {}) == diff
    assert solve_patch("cd /app\ngit apply --verbose /solution/fix.diff\n", {"fix.diff": diff}) == diff
    assert solve_patch("cat > /app/x.py <<'EOF'\nb\nEOF\n", {}) is None
    with pytest.raises(FlywheelError, match="never closed"):
        solve_patch("patch -p1 <<EOF\n--- a\n", {})


# ------------------------------------------------------------------------------------------- SWE-bench, theirs

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
CALC_TESTS = "from calc import add, sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
CALC_PATCH = "--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,5 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n \n \n def sub(a, b):\n"
CALC_TEST_PATCH = (
    "diff --git a/tests/test_calc.py b/tests/test_calc.py\nindex 1111111..2222222 100644\n"
    "--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -2,4 +2,8 @@\n \n \n def test_sub():\n"
    "     assert sub(3, 1) == 2\n+\n+\n+def test_add():\n+    assert add(2, 2) == 4\n"
)


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def swebench(tmp_path: Path) -> Path:
    """A SWE-bench instance over a real git checkout whose HEAD is past base_commit."""
    repo = write_files(tmp_path / "repos" / "acme__calc", {"calc.py": CALC, "tests/test_calc.py": CALC_TESTS})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    write_files(repo, {"README.md": "later\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "later")
    instance = {
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "base_commit": base,
        "patch": CALC_PATCH,
        "test_patch": CALC_TEST_PATCH,
        "problem_statement": "add(2, 2) returns 0.",
        "hints_text": "",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": ["tests/test_calc.py::test_sub"],
    }
    path = tmp_path / "calc.jsonl"
    path.write_text(json.dumps(instance) + "\n")
    return path


def test_swebench_instance_imports_from_a_git_checkout(swebench, tmp_path):
    (task,) = import_tasks("swebench", swebench, tmp_path / "ours")
    assert task.id == "acme__calc-1" and task.instruction == "add(2, 2) returns 0."
    assert task.fail_to_pass == ("tests/test_calc.py::test_add",)
    assert task.pass_to_pass == ("tests/test_calc.py::test_sub",)
    assert sorted(p.relative_to(task.repo).as_posix() for p in task.repo.rglob("*.*")) == [
        "calc.py",
        "tests/test_calc.py",
    ]
    assert "def test_add" in (task.hidden_tests / "tests" / "test_calc.py").read_text()
    assert task.solution_patch == CALC_PATCH
    assert task.meta["FAIL_TO_PASS"] == ["tests/test_calc.py::test_add"]
    assert task.meta["PASS_TO_PASS"] == ["tests/test_calc.py::test_sub"]
    assert task.meta["version"] == "0.1" and task.meta["source"] == "swebench"


def _edit(path: Path, **fields: object) -> None:
    instance = json.loads(path.read_text())
    for key, value in fields.items():
        if value is None:
            del instance[key]
        else:
            instance[key] = value
    path.write_text(json.dumps(instance) + "\n")


@pytest.mark.parametrize(
    "fields,fragment",
    [
        (
            {"FAIL_TO_PASS": ["test_add (calc.tests.CalcTest)"]},
            "FAIL_TO_PASS has 'test_add (calc.tests.CalcTest)'",
        ),
        ({"FAIL_TO_PASS": "not json"}, "field 'FAIL_TO_PASS' must be a list"),
        ({"base_commit": "0" * 40}, f"no base_commit {'0' * 40}"),
        ({"repo": "acme/other"}, "acme__other is missing"),
        ({"patch": "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n"}, "reference patch does not apply"),
        ({"test_patch": ""}, "test_patch is empty"),
    ],
)
def test_swebench_instance_we_cannot_carry_is_refused(swebench, tmp_path, fields, fragment):
    _edit(swebench, **fields)
    with pytest.raises(FlywheelError, match=re.escape(fragment)) as e:
        import_tasks("swebench", swebench, tmp_path / "ours")
    assert str(e.value).startswith("instance acme__calc-1: ")


# ------------------------------------------------------------------------------------------- the command line


def test_cli_exports_and_imports(toy, tmp_path):
    suite = tmp_path / "suite"
    for task in toy[:3]:
        shutil.copytree(task.root, suite / task.id)
    r = flywheel("tasks", "export", "--format", "swebench", suite, "--out", tmp_path / "swe", "--limit", "2")
    assert r.returncode == 0 and "exported 2 tasks" in r.stdout, r.stderr
    r = flywheel("tasks", "import", "--format", "swebench", tmp_path / "swe", "--out", tmp_path / "back")
    assert r.returncode == 0 and "imported 2 tasks" in r.stdout, r.stderr
    assert [snapshot(t) for t in load_suite(tmp_path / "back")] == [snapshot(t) for t in toy[:2]]


def test_cli_bad_input_is_one_line_and_exit_2(harbor_task, swebench, tmp_path):
    out = tmp_path / "out"
    assert_one_line_error(
        flywheel("tasks", "import", "--format", "nope", harbor_task, "--out", out), "unknown format"
    )
    assert_one_line_error(
        flywheel("tasks", "export", "--format", "nope", "toybugs", "--out", out), "unknown format"
    )
    missing = tmp_path / "missing"
    assert_one_line_error(
        flywheel("tasks", "import", "--format", "harbor", missing, "--out", out), "no such file or directory"
    )
    _edit(swebench, patch=None)
    r = flywheel("tasks", "import", "--format", "swebench", swebench, "--out", out)
    assert_one_line_error(r, "instance acme__calc-1", "missing field 'patch'")
    (harbor_task / "environment" / "Dockerfile").write_text("FROM python:3.12\nRUN apt-get install -y jq\n")
    r = flywheel("tasks", "import", "--format", "harbor", harbor_task, "--out", out)
    assert_one_line_error(r, "harbor task hello", "needs its own Docker environment", "apt-get install -y jq")
    assert not out.exists()


def test_a_refusal_midway_leaves_no_output(toy, swebench, tmp_path):
    export_tasks("swebench", toy[:3], tmp_path / "swe")
    rows = (tmp_path / "swe" / "instances.jsonl").read_text().splitlines()
    broken = json.loads(rows[2])
    del broken["problem_statement"]
    (tmp_path / "swe" / "instances.jsonl").write_text("\n".join([*rows[:2], json.dumps(broken)]) + "\n")
    with pytest.raises(FlywheelError, match=f"instance {toy[2].id}: missing field 'problem_statement'"):
        import_tasks("swebench", tmp_path / "swe", tmp_path / "back")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calc.jsonl", "repos", "swe"]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(FlywheelError, match="exists and is not empty"):
        export_tasks("harbor", toy[:1], tmp_path / "full")


# ------------------------------------------------------------------------------------------- verifier QA


def test_imported_tasks_pass_validation(toy, harbor_task, swebench, tmp_path, offline_envs):
    """The imported tasks through `flywheel tasks validate`: the real sandbox runs the reference and the
    hidden tests (the Harbor task's in the environment its Dockerfile names, built from local wheels),
    the unmodified repository fails."""
    export_tasks("harbor", toy[:1], tmp_path / "harbor-out")
    for name in os.listdir(tmp_path / "harbor-out"):
        shutil.copytree(tmp_path / "harbor-out" / name, harbor_task.parent / name)
    suite = tmp_path / "suite"
    import_tasks("harbor", harbor_task.parent, suite / "h")
    import_tasks("swebench", swebench, suite / "s")
    for sub in ("h", "s"):
        for task_dir in (suite / sub).iterdir():
            task_dir.rename(suite / task_dir.name)
        (suite / sub).rmdir()
    r = flywheel("tasks", "validate", suite, "--k", "1", "--mutants", "0", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0, [t for t in report["tasks"] if not t["ok"]]
    assert report["valid"] == report["total"] == 3
    assert {t["task_id"] for t in report["tasks"]} == {"hello", "acme__calc-1", toy[0].id}
