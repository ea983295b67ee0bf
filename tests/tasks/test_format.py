import shutil

import pytest

from flywheel.errors import TaskError
from flywheel.tasks import load_suite, load_task


def test_written_task_loads_with_every_field(clamp_task):
    t = load_task(clamp_task.root)
    assert t.id == "clamp-1"
    assert t.fail_to_pass == ("tests/test_mathx.py::test_clamp_high",)
    assert len(t.pass_to_pass) == 2 and t.timeout_s == 30.0
    assert t.meta["split"] == "train"
    assert t.hidden_files() == ["tests/test_mathx.py"]
    assert "mathx.py" in t.solution_patch


def _edit_toml(task, old, new):
    p = task.root / "task.toml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    "old,new,message",
    [
        ('id = "clamp-1"', "", "missing field 'id'"),
        ('id = "clamp-1"', 'id = "bad id!"', "field 'id'"),
        ("timeout_s = 30", "timeout_s = -1", "field 'timeout_s'"),
        ("timeout_s = 30", 'timeout_s = "soon"', "field 'timeout_s'"),
        (
            'fail_to_pass = ["tests/test_mathx.py::test_clamp_high"]',
            "fail_to_pass = []",
            "field 'fail_to_pass'",
        ),
        (
            'fail_to_pass = ["tests/test_mathx.py::test_clamp_high"]',
            'fail_to_pass = ["nocolons"]',
            "field 'fail_to_pass'",
        ),
        (
            'fail_to_pass = ["tests/test_mathx.py::test_clamp_high"]',
            'fail_to_pass = ["tests/nope.py::t"]',
            "neither",
        ),
        ('test_command = "python -m pytest -q tests"', "test_command = 3", "field 'test_command'"),
        ('id = "clamp-1"', 'id = "clamp-1"\nsurprise = 1', "unknown field 'surprise'"),
        ('id = "clamp-1"', 'id = "clamp-1', "not valid TOML"),
    ],
)
def test_malformed_fields_name_file_and_field(clamp_task, old, new, message):
    _edit_toml(clamp_task, old, new)
    with pytest.raises(TaskError, match=message) as e:
        load_task(clamp_task.root)
    assert "task.toml" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("part", ["repo", "tests", "solution.patch", "task.toml"])
def test_missing_parts_are_named(clamp_task, part):
    p = clamp_task.root / part
    shutil.rmtree(p) if p.is_dir() else p.unlink()
    with pytest.raises(TaskError, match=part):
        load_task(clamp_task.root)


def test_git_history_in_repo_is_refused(clamp_task):
    (clamp_task.repo / ".git").mkdir()
    with pytest.raises(TaskError, match=".git"):
        load_task(clamp_task.root)


def test_suite_directory_and_split_filter(clamp_task):
    suite = clamp_task.root.parent
    assert [t.id for t in load_suite(suite)] == ["clamp-1"]
    assert [t.id for t in load_suite(suite, split="train")] == ["clamp-1"]
    with pytest.raises(Exception, match="no split 'heldout'"):
        load_suite(suite, split="heldout")


def test_unknown_suite_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="unknown suite"):
        load_suite(str(tmp_path / "nowhere"))
