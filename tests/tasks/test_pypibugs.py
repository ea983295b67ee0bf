"""The `pypibugs` suite: its recipe, the sdist cache, the flat layout, and a build from a local sdist made
here with an environment from the tests' own wheels (no network); one slow test builds a real package."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import io
import json
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from flywheel.errors import FlywheelError, TaskError
from flywheel.protocols import Environment
from flywheel.tasks import load_suite
from flywheel.tasks.pypibugs import (
    SPLITS,
    Package,
    build,
    fetch_sdist,
    lay_out,
    load_recipe,
    parse_recipe,
    sdist_dir,
)
from flywheel.tasks.suites import builtin_suites
from flywheel.verify.qa import validate_task

PYTEST_ITSELF = {"pytest", "pluggy", "iniconfig", "packaging", "pygments"}


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_the_recipe_is_valid_and_split_by_package():
    packages = load_recipe()
    assert "pypibugs" in builtin_suites()
    assert len(packages) >= 8 and len({p.name for p in packages}) == len(packages)
    splits = {s: [p.name for p in packages if p.split == s] for s in SPLITS}
    assert splits["train"] and splits["heldout"]
    for p in packages:
        assert all(
            Requirement(r).specifier and str(Requirement(r).specifier).startswith("==")
            for r in p.requirements
        )
        assert p.max_tasks >= 1 and not Path(p.source).is_absolute()
    # at least half need what this project does not install: their environment is what makes them run
    needing = [p.name for p in packages if any(not installed(Requirement(r).name) for r in p.requirements)]
    assert len(needing) * 2 >= len(packages), needing


ENTRY = {
    "name": "demo",
    "version": "1.0",
    "sha256": "0" * 64,
    "source": "src/demo",
    "tests": "tests",
    "requirements": ["greetlib==1.0"],
    "split": "train",
    "seed": 0,
    "max_tasks": 3,
}


@pytest.mark.parametrize(
    "change, says",
    [
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"split": "test"}, "'split' must be one of train, heldout"),
        ({"sha256": "abc"}, "'sha256' must be 64"),
        ({"source": "../elsewhere"}, "'source' must be a relative path inside the sdist"),
        ({"tests": "/abs"}, "'tests' must be a relative path"),
        ({"max_tasks": 0}, "'max_tasks' must be an integer of at least 1"),
        ({"requirements": ["greetlib=1.0"]}, "requirement 'greetlib=1.0' cannot be parsed"),
        ({"python": 3.12}, "'python' must be a version"),
    ],
)
def test_a_bad_recipe_entry_is_one_line_naming_it(change, says):
    with pytest.raises(TaskError, match="recipe \\[\\[package\\]\\] 1 \\(demo\\)") as e:
        parse_recipe({"package": [{**ENTRY, **change}]}, "recipe")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_recipe_refuses_a_missing_field_and_a_package_twice():
    with pytest.raises(TaskError, match="missing 'seed'"):
        parse_recipe({"package": [{k: v for k, v in ENTRY.items() if k != "seed"}]}, "recipe")
    with pytest.raises(TaskError, match="demo appears more than once"):
        parse_recipe({"package": [ENTRY, {**ENTRY, "split": "heldout"}]}, "recipe")
    with pytest.raises(TaskError, match="no \\[\\[package\\]\\] entries"):
        parse_recipe({}, "recipe")


# ------------------------------------------------------------------------------- a local sdist, offline

DEMO = '''"""A greeting helper."""

from greetlib import greet


def loud(name):
    return greet(name).upper() + "!"


def joined(names):
    out = ""
    for name in names:
        out = out + name[0]
    return out
'''
DEMO_TESTS = """from demo import joined, loud


def test_loud():
    assert loud("bob") == "HELLO BOB!"


def test_joined():
    assert joined(["ada", "bob"]) == "ab"


def test_joined_nothing():
    assert joined([]) == ""
"""


def make_sdist(path: Path, top: str = "demo-1.0") -> Path:
    """A src-layout sdist: src/demo, tests/, a licence and files the layout leaves behind."""
    files = {
        f"{top}/src/demo/__init__.py": DEMO,
        f"{top}/tests/test_demo.py": DEMO_TESTS,
        f"{top}/LICENSE": "MIT\n",
        f"{top}/pyproject.toml": "[project]\nname = 'demo'\n",
        f"{top}/docs/index.md": "# demo\n",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def demo_package(archive: Path, **change) -> Package:
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    return dataclasses.replace(parse_recipe({"package": [{**ENTRY, "sha256": sha}]}, "t")[0], **change)


def test_lay_out_puts_the_source_directory_at_the_top(tmp_path):
    archive = make_sdist(tmp_path / "demo-1.0.tar.gz")
    project = lay_out(demo_package(archive), archive, tmp_path / "demo")
    files = sorted(p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file())
    assert files == ["LICENSE", "demo/__init__.py", "tests/test_demo.py"]
    with pytest.raises(FlywheelError, match="demo==1.0: no directory lib/demo in the sdist"):
        lay_out(demo_package(archive, source="lib/demo"), archive, tmp_path / "other")


def test_the_sdist_cache_checks_the_pin_and_a_failed_download_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    archive = make_sdist(sdist_dir() / "demo-1.0.tar.gz")
    package = demo_package(archive)
    assert fetch_sdist(package) == archive  # cached: no download
    with pytest.raises(FlywheelError, match="sha256 differs from the pin of demo==1.0"):
        fetch_sdist(dataclasses.replace(package, sha256="1" * 64))
    empty = tmp_path / "no-index"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(FlywheelError) as e:
        fetch_sdist(dataclasses.replace(package, version="2.0"))
    assert str(e.value).startswith("pypibugs: demo==2.0: download failed (") and "\n" not in str(e.value)
    assert not (sdist_dir() / "demo-2.0.tar.gz").exists() and list(sdist_dir().iterdir()) == [archive]


def test_build_writes_each_packages_tasks_with_its_environment_and_split(offline_envs, tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    archive = make_sdist(sdist_dir() / "demo-1.0.tar.gz")
    package = demo_package(archive, split="heldout", max_tasks=2)
    out = tmp_path / "suite"
    out.mkdir()
    build(out, 0, [package])
    tasks = load_suite(out)
    assert [t.id for t in tasks] == ["demo-0000", "demo-0001"]
    assert json.loads((out / ".synth" / "demo.json").read_text())["kept"] == 2
    for task in tasks:
        assert task.meta["split"] == "heldout" and task.environment == Environment(
            requirements=("greetlib==1.0",)
        )
        assert task.meta["module"] == "demo/__init__.py" and (task.repo / "LICENSE").is_file()
    qa = validate_task(tasks[0], k=1, n_mutants=0)
    assert qa.reference_passes == 1 and qa.unmodified_fails and qa.fail_to_pass_fail_before, qa.reasons


def test_a_package_whose_tests_never_pass_stops_the_build_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    archive = make_sdist(sdist_dir() / "demo-1.0.tar.gz")
    package = demo_package(archive, requirements=())  # greetlib missing: no test can pass
    with pytest.raises(FlywheelError, match="^pypibugs: demo==1.0: .*no test of the project's suite passes"):
        build(tmp_path / "suite", 0, [package])


# ------------------------------------------------------------------------------ the registry (slow)


@pytest.mark.slow
def test_build_one_real_package_from_the_registry(tmp_path, monkeypatch):
    """Download, environment and a few tasks of one pinned package whose tests need typeguard."""
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FLYWHEEL_ENV_CACHE", str(tmp_path / "envs"))
    (package,) = [dataclasses.replace(p, max_tasks=3) for p in load_recipe() if p.name == "inflect"]
    assert not installed("typeguard")
    out = tmp_path / "suite"
    out.mkdir()
    build(out, 0, [package])
    assert (sdist_dir() / "inflect-7.6.0.tar.gz").is_file()
    tasks = load_suite(out)
    assert len(tasks) == 3 and all(t.meta["split"] == "heldout" for t in tasks)
    assert all(t.environment == package.environment for t in tasks)
    qa = validate_task(tasks[0], k=1, n_mutants=0)
    assert qa.reference_passes == 1 and qa.unmodified_fails and qa.fail_to_pass_fail_before, qa.reasons
