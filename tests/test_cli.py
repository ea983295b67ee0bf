"""The command line as a user meets it: real subprocesses, exit codes and one-line errors."""

import json
import subprocess
import sys

import pytest


def flywheel(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "flywheel", *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def assert_one_line_error(r, fragment):
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_help_lists_the_commands():
    r = flywheel("--help")
    assert r.returncode == 0
    for cmd in ("tasks", "sandbox", "grade", "eval"):
        assert cmd in r.stdout


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["tasks", "list", "nosuchsuite"], "unknown suite"),
        (["eval", "--suite", "nosuchsuite", "--model", "scripted", "--out", "x"], "unknown suite"),
        (["tasks", "list"], "Missing argument"),
        (["frobnicate"], "No such command"),
        (["eval", "--suite", "x", "--model", "scripted", "--compaction", "no", "--out", "x"], "compaction"),
        (["eval", "--suite", "x", "--model", "scripted", "--compact-at", "0", "--out", "x"], "compact_at"),
        (
            ["eval", "--suite", "x", "--model", "scripted", "--draft", "lookup", "--out", "x"],
            "--draft needs a torch",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment, tmp_path):
    assert_one_line_error(flywheel(*args, cwd=tmp_path), fragment)


def test_grade_and_list_a_task_directory(clamp_task, tmp_path):
    r = flywheel("tasks", "list", clamp_task.root.parent)
    assert r.returncode == 0 and r.stdout.split() == ["clamp-1"]
    r = flywheel("grade", clamp_task.root, clamp_task.repo, "--json")
    verdict = json.loads(r.stdout)
    assert r.returncode == 1 and verdict["success"] is False
    assert verdict["fail_to_pass"] == {"passed": 0, "total": 1} and verdict["pass_to_pass"]["passed"] == 2
    assert set(verdict) >= {"task_id", "success", "reward", "cheat", "signatures", "error"}


def test_grade_refuses_bad_input(clamp_task, tmp_path):
    assert_one_line_error(flywheel("grade", clamp_task.root, tmp_path / "missing"), "not a directory")
    (clamp_task.root / "task.toml").write_text("id = 3\n")
    assert_one_line_error(flywheel("grade", clamp_task.root, clamp_task.repo), "task.toml")


def test_validate_and_eval_a_task_directory(clamp_task, tmp_path):
    r = flywheel("tasks", "validate", clamp_task.root.parent, "--json")
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["valid"] == 1 and data["tasks"][0]["ok"]
    out = tmp_path / "run"
    r = flywheel(
        "eval", "--suite", clamp_task.root.parent, "--model", "scripted", "--out", out, "--cohorts", "2"
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["success_rate"] == 1.0
    assert_one_line_error(
        flywheel("eval", "--suite", clamp_task.root.parent, "--model", "nope", "--out", tmp_path / "r2"),
        "unknown model",
    )
    assert_one_line_error(
        flywheel(
            "eval",
            "--suite",
            clamp_task.root.parent,
            "--model",
            "scripted",
            "--effort",
            "huge",
            "--out",
            tmp_path / "r3",
        ),
        "unknown effort",
    )
    drafted = tmp_path / "r4"  # the shipped base, its turns decoded with a lookup draft
    r = flywheel(
        "eval",
        "--suite",
        clamp_task.root.parent,
        "--model",
        "toybugs-sweep",
        "--draft",
        "lookup",
        "--out",
        drafted,
    )
    assert r.returncode == 0, r.stderr
    episode = json.loads((drafted / "trajectories.jsonl").read_text().splitlines()[0])
    replies = [t for t in episode["turns"] if t["role"] == "assistant"]
    assert replies and all(len(t["token_ids"]) == len(t["logprobs"]) > 0 for t in replies)


def test_a_reader_that_stops_early_gets_no_traceback(clamp_task):
    """`flywheel tasks list DIR | head -0`: the pipe is closed before the command writes; it ends quietly."""
    argv = [sys.executable, "-m", "flywheel", "tasks", "list", str(clamp_task.root.parent)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # long before the interpreter has started and imported the CLI
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert "Traceback" not in err, err
