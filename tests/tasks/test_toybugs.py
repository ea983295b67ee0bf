import shutil
import subprocess
import sys

import pytest

from flywheel.tasks import load_suite, load_task
from flywheel.tasks.patch import apply_patch_to_dir
from flywheel.tasks.toy import HELDOUT_MODULES, build, module_names, read_module


def tree_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy") / "a"
    build(out, seed=0, modules=["roman", "ledger"])
    return out


def test_modules_ship_with_their_tests():
    names = module_names()
    assert len(names) >= 14 and set(HELDOUT_MODULES) <= set(names)
    for name in names:
        source, tests = read_module(name)
        assert f"from {name} import" in tests and "def " in source


def test_build_is_deterministic(small_build, tmp_path):
    again = tmp_path / "b"
    build(again, seed=0, modules=["roman", "ledger"])
    assert tree_bytes(small_build) == tree_bytes(again)


def test_tasks_load_and_split_by_module(small_build):
    tasks = [load_task(d) for d in sorted(small_build.iterdir())]
    assert len(tasks) > 20
    for t in tasks:
        assert t.meta["split"] == ("heldout" if t.meta["module"] in HELDOUT_MODULES else "train")
        assert t.fail_to_pass and t.pass_to_pass
        assert t.meta["mutation"] and t.meta["function"]
    assert {t.meta["split"] for t in tasks} == {"train", "heldout"}


def test_instruction_is_a_bug_report_not_the_fix(small_build):
    for d in sorted(small_build.iterdir()):
        t = load_task(d)
        added = [
            ln[1:].strip()
            for ln in t.solution_patch.splitlines()
            if ln.startswith("+") and not ln.startswith("+++")
        ]
        for line in added:
            if len(line) > 12:
                assert line not in t.instruction, (t.id, line)
        assert "mutat" not in t.instruction.lower() and "line" not in t.instruction.lower()


def test_visible_tests_reproduce_the_failure(small_build):
    for d in sorted(small_build.iterdir()):
        t = load_task(d)
        visible = (t.repo / f"tests/test_{t.meta['module']}.py").read_text()
        names = [i.split("::")[1] for i in t.fail_to_pass]
        assert any(f"def {n}(" in visible for n in names), t.id
        assert len(visible) < len((t.hidden_tests / f"tests/test_{t.meta['module']}.py").read_text())


def pytest_passes(ws):
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=ws, capture_output=True
    )
    return r.returncode == 0


def test_reference_passes_and_bug_fails_under_real_pytest(small_build, tmp_path):
    for d in sorted(small_build.iterdir())[::12][:3]:
        t = load_task(d)
        for fixed in (False, True):
            ws = tmp_path / f"{t.id}-{fixed}"
            shutil.copytree(t.repo, ws)
            shutil.copyfile(
                t.hidden_tests / f"tests/test_{t.meta['module']}.py", ws / f"tests/test_{t.meta['module']}.py"
            )
            if fixed:
                apply_patch_to_dir(ws, t.solution_patch)
            assert pytest_passes(ws) is fixed, (t.id, fixed)


@pytest.mark.slow
def test_whole_suite_counts():
    assert len(load_suite("toybugs", split="train")) >= 300
    assert len(load_suite("toybugs", split="heldout")) >= 100
