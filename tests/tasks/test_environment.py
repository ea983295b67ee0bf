"""task.toml's `[environment]` table: read, written back the same, and bad input refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flywheel.errors import TaskError
from flywheel.protocols import Environment
from flywheel.tasks import load_task
from flywheel.tasks.format import environment_toml, parse_environment


def _with_table(task, table: str):
    path = task.root / "task.toml"
    path.write_text(path.read_text() + "\n" + table)
    return task.root


def test_a_task_without_the_table_has_the_default_environment(clamp_task):
    assert load_task(clamp_task.root).environment == Environment()
    assert environment_toml(Environment()) == ""


def test_the_table_is_read_and_written_back_the_same(clamp_task):
    table = """[environment]
requirements = ["greetlib==1.0", "attrs>=23; python_version >= '3.8'"]
python = "3.11"
workdir = "/testbed"
env = { B = "2", A = "one two" }
"""
    env = load_task(_with_table(clamp_task, table)).environment
    assert env == Environment(
        requirements=("greetlib==1.0", "attrs>=23; python_version >= '3.8'"),
        python="3.11",
        env=(("A", "one two"), ("B", "2")),
        workdir="/testbed",
    )
    assert parse_environment(__import__("tomllib").loads(environment_toml(env))["environment"], "x") == env


@pytest.mark.parametrize(
    "table,message",
    [
        ("colour = 'red'", "unknown key 'colour'"),
        ("requirements = 'six'", "'requirements' must be a list"),
        ("requirements = ['six==']", "requirement 'six==' cannot be parsed"),
        ("python = '3'", "'python' must be a version"),
        ("env = { PATH = '/x' }", "may not set PATH"),
        ("env = { 'A-B' = '1' }", "not a variable name"),
        ("workdir = 'app'", "must be an absolute, normalised path"),
        ("workdir = '/'", "must be an absolute, normalised path"),
        ("workdir = '/app/../etc'", "must be an absolute, normalised path"),
        ("workdir = '/tmp/app'", "overlaps /tmp"),
        ("workdir = '/proc'", "overlaps /proc"),
        ("workdir = '/usr/src/app'", "overlaps /usr"),
        ("workdir = '/lib64/x'", "overlaps the system's /lib* directories"),
        ("workdir = '/etc'", "overlaps /etc"),
        ("workdir = '/opt'", "overlaps /opt/flywheel"),
        ("workdir = '/grader'", "overlaps /grader"),
        (f"workdir = '{sys.base_prefix}'", "overlaps"),
    ],
)
def test_bad_input_is_one_line_naming_the_table(clamp_task, table, message):
    root = _with_table(clamp_task, "[environment]\n" + table + "\n")
    with pytest.raises(TaskError) as e:
        load_task(root)
    assert message in str(e.value) and "[environment]" in str(e.value) and "\n" not in str(e.value)


def test_the_command_line_refuses_a_bad_table_with_exit_2(clamp_task):
    root = _with_table(clamp_task, "[environment]\nworkdir = 'relative'\n")
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "tasks", "validate", str(root.parent)],
        capture_output=True,
        text=True,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "'workdir' must be an absolute" in lines[0], r.stderr
