"""SWE-bench instances with their environments: what the repository declares or `--environment FILE` says,
at /testbed, built from the tests' own wheels and graded by the real sandbox and grader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.protocols import Environment
from flywheel.tasks import load_task, task_toml, write_task
from flywheel.tasks.interop import export_tasks, import_tasks
from flywheel.tasks.patch import make_patch
from flywheel.verify import grade_patch

GREET = "import greetlib\n\n\ndef shout(name):\n    return greetlib.greet(name)\n"
FIXED = GREET.replace("return greetlib.greet(name)", "return greetlib.greet(name).upper()")
TESTS = (
    "import os\n\nfrom shout import shout\n\n\ndef test_at_testbed():\n    assert os.getcwd() == '/testbed'\n"
)
HIDDEN = TESTS + "\n\ndef test_shout():\n    assert shout('x') == 'HELLO X'\n"
PYPROJECT = '[project]\nname = "shout"\nversion = "0.1"\ndependencies = ["greetlib==1.0"]\n'


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def instance(repo: str, iid: str) -> dict[str, object]:
    return {
        "repo": repo,
        "instance_id": iid,
        "base_commit": "0" * 40,  # a plain copy (no .git): the files as they are
        "patch": make_patch({"shout.py": GREET}, {"shout.py": FIXED}),
        "test_patch": make_patch({"tests/test_shout.py": TESTS}, {"tests/test_shout.py": HIDDEN}),
        "problem_statement": "shout('x') should be loud.",
        "version": "0.1",
        "FAIL_TO_PASS": ["tests/test_shout.py::test_shout"],
        "PASS_TO_PASS": ["tests/test_shout.py::test_at_testbed"],
    }


@pytest.fixture
def swe(tmp_path: Path) -> Path:
    """instances.jsonl with two instances of two repositories: acme/shout declares greetlib==1.0 in its
    pyproject.toml, acme/plain declares it in requirements.txt."""
    src = tmp_path / "swe"
    files = {"shout.py": GREET, "tests/test_shout.py": TESTS}
    write(src / "repos" / "acme__shout", {**files, "pyproject.toml": PYPROJECT})
    write(src / "repos" / "acme__plain", {**files, "requirements.txt": "greetlib==1.0  # the one we need\n"})
    rows = [instance("acme/shout", "acme__shout-1"), instance("acme/plain", "acme__plain-1")]
    (src / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def flywheel(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", *map(str, args)], capture_output=True, text=True)


def test_an_instance_runs_in_what_its_repository_declares_at_testbed(swe, tmp_path, offline_envs):
    tasks = import_tasks("swebench", swe, tmp_path / "ours")
    assert [t.environment for t in tasks] == [Environment(("greetlib==1.0",), workdir="/testbed")] * 2
    assert "[environment]" in (tasks[0].root / "task.toml").read_text()
    task = tasks[1]
    fixed = grade_patch(task, task.solution_patch)
    assert fixed.success, fixed
    broken = grade_patch(task, None)
    assert not broken.success and broken.tests["tests/test_shout.py::test_shout"] == "failed", broken
    assert broken.tests["tests/test_shout.py::test_at_testbed"] == "passed"  # greetlib imported, at /testbed


def test_environment_file_gives_every_instance_its_requirements(swe, tmp_path):
    (tmp_path / "reqs.txt").write_text("greetlib==2.0\n")
    tasks = import_tasks("swebench", swe, tmp_path / "ours", environment=tmp_path / "reqs.txt")
    assert [t.environment.requirements for t in tasks] == [("greetlib==2.0",)] * 2


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_environment_mapping_names_repositories(swe, tmp_path, suffix):
    write(
        tmp_path / "envs", {"shout.txt": "-r common.txt\npytest-fortytwo\n", "common.txt": "greetlib==2.0\n"}
    )
    mapping = tmp_path / "envs" / f"map{suffix}"
    text = '"acme__shout" = "shout.txt"\n' if suffix == ".toml" else json.dumps({"acme__shout": "shout.txt"})
    mapping.write_text(text)
    by_id = {t.id: t for t in import_tasks("swebench", swe, tmp_path / "ours", environment=mapping)}
    assert by_id["acme__shout-1"].environment.requirements == ("greetlib==2.0", "pytest-fortytwo")
    assert by_id["acme__plain-1"].environment.requirements == ("greetlib==1.0",)  # not named: declared


def test_an_environment_survives_ours_to_swebench_to_ours(tmp_path):
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = Environment(("greetlib==1.0", "pytest-fortytwo"), python, (("MODE", "test"),), "/app")
    task = write_task(
        tmp_path / "t" / "shout-1",
        toml=task_toml(
            id="shout-1",
            instruction="Be loud.",
            test_command="python -m pytest -q",
            fail_to_pass=["tests/test_shout.py::test_shout"],
            pass_to_pass=[],
            timeout_s=30,
            environment=env,
        ),
        repo={"shout.py": GREET, "tests/test_shout.py": TESTS, "requirements.txt": "greetlib==2.0\n"},
        hidden_tests={"tests/test_shout.py": HIDDEN},
        solution_patch=make_patch({"shout.py": GREET}, {"shout.py": FIXED}),
    )
    export_tasks("swebench", [task], tmp_path / "out")
    row = json.loads((tmp_path / "out" / "instances.jsonl").read_text())
    assert row["flywheel"]["environment"]["workdir"] == "/app"
    (back,) = import_tasks("swebench", tmp_path / "out", tmp_path / "back")
    assert back.environment == env  # carried whole: not /testbed, not requirements.txt's greetlib==2.0
    assert load_task(back.root).environment == env


def test_a_bad_declaration_names_the_instance_and_the_file(swe, tmp_path):
    write(swe / "repos" / "acme__shout", {"requirements-dev.txt": "pytest\ngreetlib===\n"})
    with pytest.raises(FlywheelError) as e:
        import_tasks("swebench", swe, tmp_path / "ours")
    assert str(e.value).startswith(
        "instance acme__shout-1: acme/shout at base_commit: requirements-dev.txt line 2"
    )
    assert not (tmp_path / "ours").exists()


def test_the_cli_imports_with_an_environment_file(swe, tmp_path):
    (tmp_path / "reqs.txt").write_text("greetlib==2.0\n")
    out = tmp_path / "ours"
    r = flywheel(
        "tasks", "import", "--format", "swebench", swe, "--out", out, "--environment", tmp_path / "reqs.txt"
    )
    assert r.returncode == 0 and "imported 2 tasks" in r.stdout, r.stderr
    assert load_task(out / "acme__shout-1").environment.requirements == ("greetlib==2.0",)


@pytest.mark.parametrize(
    "name,text,fragment",
    [
        ("missing.txt", None, "no such file"),
        ("map.toml", "acme__shout = [", "not valid TOML"),
        ("map.json", "{", "not valid JSON"),
        ("map.toml", 'acme__other = "r.txt"\n', "acme__other names no repository of the instances"),
        ("map.toml", 'acme__shout = "nope.txt"\n', "acme__shout: nope.txt is not a file"),
        ("map.toml", "acme__shout = 3\n", "acme__shout must name a requirements file"),
        ("reqs.txt", "greetlib==1.0\nnot a requirement!\n", "line 2: requirement 'not a requirement!'"),
    ],
)
def test_a_bad_environment_file_is_one_line_and_exit_2(swe, tmp_path, name, text, fragment):
    (tmp_path / "r.txt").write_text("greetlib==1.0\n")
    if text is not None:
        (tmp_path / name).write_text(text)
    out = tmp_path / "ours"
    r = flywheel(
        "tasks", "import", "--format", "swebench", swe, "--out", out, "--environment", tmp_path / name
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert f"--environment {tmp_path / name}" in lines[0] and fragment in lines[0], lines[0]
    assert not out.exists()


def test_environment_is_for_swebench_only(tmp_path):
    (tmp_path / "h").mkdir()
    with pytest.raises(FlywheelError, match="--environment is for --format swebench"):
        import_tasks("harbor", tmp_path / "h", tmp_path / "out", environment=tmp_path / "r.txt")
