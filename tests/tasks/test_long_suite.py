import ast
import shutil

import pytest

from flywheel.tasks import builtin_suites, load_suite, load_task
from flywheel.tasks.patch import apply_patch
from flywheel.tasks.toy import HELDOUT_MODULES, module_names, read_module
from flywheel.tasks.toy import build as build_toybugs
from flywheel.tasks.toy.long import MODULE_CHARS, build, defined, grow, split_module
from flywheel.verify.qa import validate_task

CONTEXT = 2048  # the embedded base's context, in tokens


def tree_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def toybugs(tmp_path_factory):
    """Every 8th toybugs task of one held-out module and one train module."""
    full = tmp_path_factory.mktemp("toy") / "full"
    build_toybugs(full, seed=0, modules=["ledger", "roman"])
    some = full.parent / "some"
    for task in sorted(full.iterdir())[::8]:
        shutil.copytree(task, some / task.name)
    return some


@pytest.fixture(scope="module")
def long_suite(toybugs):
    out = toybugs.parent / "long"
    build(out, seed=0, base=toybugs)
    return out


def test_the_suite_is_built_in():
    assert "toybugs-long" in builtin_suites()


def test_build_is_deterministic(toybugs, long_suite, tmp_path):
    build(tmp_path / "again", seed=0, base=toybugs)
    assert tree_bytes(tmp_path / "again") == tree_bytes(long_suite)
    build(tmp_path / "other", seed=1, base=toybugs)
    padding = [tuple(load_task(d).meta["padding"]) for d in sorted((tmp_path / "other").iterdir())]
    assert padding != [tuple(load_task(d).meta["padding"]) for d in sorted(long_suite.iterdir())]


def test_splits_are_disjoint_and_train_never_holds_heldout_code(long_suite):
    train, heldout = load_suite(long_suite, split="train"), load_suite(long_suite, split="heldout")
    assert train and heldout and {t.id for t in train}.isdisjoint(t.id for t in heldout)
    for t in train:
        assert t.meta["module"] not in HELDOUT_MODULES
        assert not set(t.meta["padding"]) & set(HELDOUT_MODULES), t.id
    for t in heldout:
        assert t.meta["module"] in HELDOUT_MODULES and t.meta["module"] not in t.meta["padding"]


def test_each_module_outgrows_the_context(long_suite):
    for d in sorted(long_suite.iterdir()):
        t = load_task(d)
        module = (t.repo / f"{t.meta['module']}.py").read_text()
        assert len(module) >= MODULE_CHARS and len(module) // 4 > CONTEXT, t.id  # at 4 characters a token
        ast.parse(module)


def test_the_bug_the_report_and_the_tests_are_the_toybugs_ones(toybugs, long_suite):
    for d in sorted(long_suite.iterdir()):
        t = load_task(d)
        base = load_task(toybugs / t.meta["base"])
        name = t.meta["module"]
        assert t.instruction == base.instruction and t.fail_to_pass == base.fail_to_pass
        padded = [p.split("::")[0] for p in t.pass_to_pass[len(base.pass_to_pass) :]]
        assert t.pass_to_pass[: len(base.pass_to_pass)] == base.pass_to_pass
        assert sorted(set(padded)) == sorted(f"tests/test_{p}.py" for p in t.meta["padding"])
        fixed = apply_patch({f"{name}.py": (t.repo / f"{name}.py").read_text()}, t.solution_patch)
        grown = [
            grow(name, read_module(name)[0], t.meta["padding"], at)
            for at in range(len(t.meta["padding"]) + 1)
        ]
        assert fixed[f"{name}.py"] in grown, t.id
        assert changed(t.solution_patch) == changed(base.solution_patch)
        for p in t.meta["padding"]:
            tests = (t.hidden_tests / f"tests/test_{p}.py").read_text()
            assert tests == (t.repo / f"tests/test_{p}.py").read_text() and f"from {name} import" in tests


def changed(patch):
    return [ln for ln in patch.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]


def test_grow_joins_modules_under_one_docstring_with_the_imports_on_top():
    padding = [m for m in module_names() if m not in ("lru", "roman")][:2] + ["lru"]
    grown = grow("roman", read_module("roman")[0], padding, 1)
    doc, imports, _ = split_module(grown)
    assert doc == split_module(read_module("roman")[0])[0]
    assert imports == ["from collections import OrderedDict"]
    defined = {n.name for n in ast.parse(grown).body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert {"to_roman", "LRUCache"} <= defined
    assert grown.index("def to_roman") > grown.index(split_module(read_module(padding[0])[0])[2][:30])


def test_defined_names_are_what_padding_must_not_repeat():
    assert defined(read_module("roman")[0]) == {"_VALUES", "_DIGITS", "to_roman", "from_roman", "is_valid"}
    assert defined("x: int = 1\ny, (z, w) = 1, (2, 3)\nclass C: pass\nimport os\n") == {
        "x",
        "y",
        "z",
        "w",
        "C",
    }


def test_one_task_validates_in_the_real_sandbox(long_suite):
    task = load_suite(long_suite, split="heldout")[0]
    qa = validate_task(task, k=1, n_mutants=0)
    assert qa.ok and qa.reference_passes == 1 and qa.unmodified_fails, qa.reasons
