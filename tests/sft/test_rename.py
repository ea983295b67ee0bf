"""Renaming augmentation: made-up names, applied consistently, keep every shipped module working."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.sft.rename import generic_words, protected_words, rename_messages, rename_text, renaming
from flywheel.tasks.toy import module_names, read_module


def _repo(root: Path, name: str) -> Path:
    source, tests = read_module(name)
    (root / "tests").mkdir(parents=True)
    (root / f"{name}.py").write_text(source)
    (root / "tests" / f"test_{name}.py").write_text(tests)
    return root


@pytest.mark.parametrize("name", module_names())
def test_a_renamed_module_still_passes_its_renamed_tests(name, tmp_path):
    repo = _repo(tmp_path / "repo", name)
    mapping = renaming(repo, random.Random(1), protected_words())
    assert name in mapping and len(mapping) >= 5
    out = tmp_path / "renamed"
    for path in repo.rglob("*.py"):
        target = out / rename_text(path.relative_to(repo).as_posix(), mapping)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rename_text(path.read_text(), mapping))
    assert not (out / f"{name}.py").exists() and (out / f"{mapping[name]}.py").is_file()
    assert (out / "tests" / f"test_{mapping[name]}.py").is_file()  # the test file follows its module
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:]


def test_renaming_is_consistent_and_leaves_the_protocol_alone(tmp_path):
    repo = _repo(tmp_path / "repo", "ledger")
    system = (
        'Act with one action: <view path="FILE" start="N" end="M"/> or <edit path="FILE"><old>A</old></edit>'
    )
    messages = [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": "`Ledger().open('x', -5)` should raise ValueError. This is in `ledger.py`.",
        },
        {"role": "assistant", "content": '<view path="ledger.py" start="1" end="40"/>'},
        {"role": "user", "content": "def open(self, name, amount):\n    self.accounts.append(name)"},
    ]
    out = rename_messages(messages, repo, random.Random(0))
    assert out[0] == messages[0]
    mapping = renaming(repo, random.Random(0), protected_words() | set(system.replace('"', " ").split()))
    new = mapping["ledger"]
    assert (
        f"`{new}.py`" in out[1]["content"]
        and f'<view path="{new}.py" start="1" end="40"/>' == out[2]["content"]
    )
    assert "ledger" not in " ".join(m["content"] for m in out[1:]).lower()
    assert (
        "self." in out[3]["content"] and ".append(" in out[3]["content"] and "ValueError" in out[1]["content"]
    )
    assert mapping["Ledger"][0].isupper() and "_" not in mapping["Ledger"]  # a class gets a CamelCase name


def test_words_common_to_most_modules_are_kept():
    convs = [[{"role": "user", "content": f"edited {m}.py at line 3; value"}] for m in ("a1", "b1", "c1")]
    assert generic_words(convs, ["a", "b", "c"]) == {"edited", "py", "at", "line", "value"}


def test_sft_refuses_a_rename_share_outside_0_to_1(tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[data]\nrename = 1.5\n")
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--out", str(tmp_path / "base")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "data.rename" in err and err.count("\n") == 1, err
    assert not (tmp_path / "base").exists()


def test_a_renamed_task_is_graded_like_the_original(tmp_path):
    from flywheel.sft.rename import rename_task
    from flywheel.tasks import load_suite
    from flywheel.verify.qa import grade_patch

    task = load_suite("toybugs", split="train")[0]
    copy = rename_task(task, tmp_path / f"{task.id}.s000001", random.Random(3))
    module = task.meta["module"]
    assert copy.id == f"{task.id}.s000001" and copy.meta["renamed_from"] == task.id
    assert module not in copy.instruction and module not in " ".join(copy.fail_to_pass)
    assert not (copy.repo / f"{module}.py").exists() and len(list(copy.repo.glob("*.py"))) == 1
    assert grade_patch(copy, copy.solution_patch).success
    assert not grade_patch(copy, None).success
    assert rename_task(task, copy.root, random.Random(99)) == copy  # an existing copy is loaded as is


def test_shifted_lines_match_a_real_listing_and_real_sed(tmp_path):
    from flywheel.models.scripted import repair_candidates, try_command
    from flywheel.sandbox import get_sandbox
    from flywheel.sft.rename import shift_lines

    source, _ = read_module("ledger")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "m.py").write_text(source)
    line, old, new = repair_candidates(source, set(range(1, len(source.splitlines()) + 1)))[-1]
    listing = subprocess.run(["cat", "-n", "m.py"], cwd=tmp_path / "a", capture_output=True, text=True).stdout
    conv = [
        {"role": "system", "content": "sed -i '3s/a/b/' is the form"},
        {"role": "assistant", "content": "<shell>cat -n *.py</shell>"},
        {"role": "user", "content": "exit code 0\n" + listing},
        {"role": "assistant", "content": f"<shell>{try_command('*.py', line, old, new, 'true')}</shell>"},
    ]
    out = shift_lines(conv, random.Random(1), 12)
    assert out[:2] == conv[:2] and out != conv
    shown = out[2]["content"].removeprefix("exit code 0\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "m.py").write_text("".join(row.split("\t", 1)[1] + "\n" for row in shown.splitlines()))
    relisted = subprocess.run(
        ["cat", "-n", "m.py"], cwd=tmp_path / "b", capture_output=True, text=True
    ).stdout
    assert relisted == shown and len(shown.splitlines()) > len(
        listing.splitlines()
    )  # what `cat -n` would show
    for where, conversation in (("a", conv), ("b", out)):
        command = conversation[3]["content"].removeprefix("<shell>").removesuffix("</shell>")
        assert get_sandbox().run(tmp_path / where, ["bash", "-c", command]).output == "fixed\n"
    fixed = [row for row in (tmp_path / "b" / "m.py").read_text().splitlines() if row.strip()]
    assert fixed == [row for row in (tmp_path / "a" / "m.py").read_text().splitlines() if row.strip()]
    assert (tmp_path / "a" / "m.py").read_text() != source  # the try was kept (`true` passes) and it moved
    assert shift_lines(conv[:2], random.Random(1), 12) == conv[:2]  # no listing: unchanged
