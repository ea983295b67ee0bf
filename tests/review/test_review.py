"""`flywheel review` on tiny git repositories: the real sandbox runs the tests, the real detector checks the
change, and the scripted reviewer (a fake model registered by name in the command, never a result) drives
the review agent's path through the real harness."""

from __future__ import annotations

import json
import subprocess

import pytest

from flywheel.cli import main
from flywheel.protocols import Completion
from flywheel.review import CHANGES, compare, parse_verdict
from flywheel.review.agent import run_reviewer
from flywheel.review.tests import TestRun
from flywheel.sandbox.bwrap import bwrap_works

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = (
    "from calc import add, mul\n\n\ndef test_add():\n    assert add(1987, 13) == 2000\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n"
)


def git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


@pytest.fixture
def repo(tmp_path):
    """A committed repository: `add` subtracts (test_add fails), `mul` works (test_mul passes)."""
    root = tmp_path / "proj"
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "tests" / "test_calc.py").write_text(TESTS)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "init")
    return root


def diff_of(repo, tmp_path, edits, name="change.diff"):
    """The diff of `edits` (path -> new text, None: delete) against HEAD; the checkout is put back."""
    for rel, text in edits.items():
        path = repo / rel
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached")
    git(repo, "reset", "-q", "--hard", "HEAD")
    out = tmp_path / name
    out.write_text(diff)
    return out


def review(*args):
    with pytest.raises(SystemExit) as exit_:
        main(["review", *map(str, args)])
    return exit_.value.code


FIX = {"calc.py": CALC.replace("a - b", "a + b")}


def test_an_honest_fix_is_approved(repo, tmp_path, capsys):
    status = git(repo, "status", "--porcelain")
    diff = diff_of(repo, tmp_path, FIX)
    assert review("--repo", repo, "--diff", diff, "--instruction", "fix add") == 0
    out = capsys.readouterr().out
    assert out.startswith("# Review: Approved\n")
    assert "- fixed (failing before, passing after): `tests/test_calc.py::test_add`" in out
    assert "- before the change: failed" in out and "- after the change: passed" in out
    assert "## Checks\n\n- nothing found" in out and "No model reviewed the change" in out
    assert git(repo, "status", "--porcelain") == status and (repo / "calc.py").read_text() == CALC


def test_tests_the_change_adds_are_listed_not_held_against_it(repo, tmp_path, capsys):
    added = TESTS + "\n\ndef test_add_negative():\n    assert add(-1, -1) == -2\n"
    diff = diff_of(repo, tmp_path, {**FIX, "tests/test_calc.py": added, "tests/test_more.py": TESTS})
    assert review("--repo", repo, "--diff", diff) == 0
    out = capsys.readouterr().out
    assert "- test_added `tests/test_calc.py:12`: new test test_add_negative" in out
    assert "- test_added `tests/test_more.py:8`: new test test_mul" in out  # a new file's tests too
    assert "`tests/test_calc.py::test_add_negative (passed)`" in out


@pytest.mark.parametrize(
    "edits,finding",
    [
        (
            {
                "tests/test_calc.py": TESTS.replace(
                    "def test_add", "import pytest\n\n\n@pytest.mark.skip\ndef test_add"
                )
            },
            "**test_skipped** `tests/test_calc.py:8`: test test_add is now skipped or xfailed",
        ),
        (
            {
                "tests/test_calc.py": TESTS.replace(
                    "    assert add(1987, 13) == 2000\n", "    add(1987, 13)\n"
                )
            },
            "**assertion_weakened** `tests/test_calc.py:4`: test test_add lost `assert add(1987, 13) == 2000`",
        ),
        (
            {"tests/test_calc.py": TESTS.split("\n\n\ndef test_mul")[0].replace("add, mul", "add") + "\n"},
            "**test_deleted** `tests/test_calc.py`: test test_mul (line 8 before) was deleted",
        ),
        (
            {"tests/test_calc.py": "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"},
            "**test_deleted** `tests/test_calc.py`: test test_add (line 4 before) was deleted",
        ),
        (
            {"tests/test_calc.py": None},
            "**test_deleted** `tests/test_calc.py`: test test_add (line 4 before)",
        ),
        (
            {
                "calc.py": CALC.replace(
                    "    return a - b", "    if a == 1987:\n        return 2000\n    return a - b"
                )
            },
            "**special_cases_test_literals** `calc.py:2`",
        ),
        (
            {"conftest.py": "def pytest_collection_modifyitems(items):\n    items.clear()\n"},
            "**conftest_changed** `conftest.py:1`: conftest.py added",
        ),
        ({"pytest.ini": "[pytest]\naddopts = -k mul\n"}, "**test_config_modified** `pytest.ini:1`"),
    ],
    ids=[
        "skip",
        "weakened",
        "deleted-test",
        "deleted-failing-test",
        "deleted-file",
        "special-case",
        "conftest",
        "ini",
    ],
)
def test_gaming_the_tests_requests_changes(repo, tmp_path, capsys, edits, finding):
    diff = diff_of(repo, tmp_path, edits)
    assert review("--repo", repo, "--diff", diff) == 1
    out = capsys.readouterr().out
    assert out.startswith("# Review: Changes requested\n") and finding in out, out


def test_a_change_that_breaks_a_passing_test_requests_changes(repo, tmp_path, capsys):
    diff = diff_of(repo, tmp_path, {"calc.py": CALC.replace("a * b", "a ** b").replace("a - b", "a + b")})
    assert review("--repo", repo, "--diff", diff) == 1
    out = capsys.readouterr().out
    assert "- broken: tests/test_calc.py::test_mul (failed)" in out
    assert "- fixed (failing before, passing after): `tests/test_calc.py::test_add`" in out


def test_a_branch_is_reviewed_against_its_merge_base_and_json_has_the_shape(repo, capsys):
    git(repo, "checkout", "-q", "-b", "fix")
    (repo / "calc.py").write_text(FIX["calc.py"])
    git(repo, "commit", "-qam", "fix add")
    git(repo, "checkout", "-q", "-")
    (repo / "README").write_text("later work on the main line\n")
    git(repo, "add", "README")
    git(repo, "commit", "-qm", "readme")
    assert review("--repo", repo, "--branch", "fix", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {
        "decision",
        "reasons",
        "source",
        "instruction",
        "files",
        "tests",
        "findings",
        "reviewer",
    }
    assert data["decision"] == "approve" and data["reasons"] == [] and data["files"] == ["calc.py"]
    assert data["source"].startswith("branch fix (from ")
    tests = data["tests"]
    assert tests["fixed"] == ["tests/test_calc.py::test_add"] and tests["broken"] == []
    assert tests["before"]["outcomes"] == {
        "tests/test_calc.py::test_add": "failed",
        "tests/test_calc.py::test_mul": "passed",
    }
    assert tests["after"]["passed"] is True and data["findings"] == [] and data["reviewer"] is None


def test_a_test_command_other_than_pytest_is_judged_by_its_exit_status(repo, tmp_path, capsys):
    diff = diff_of(repo, tmp_path, FIX)
    check = "python -c 'from calc import add; assert add(1987, 13) == 2000'"
    assert review("--repo", repo, "--diff", diff, "--test-command", check, "--json") == 0
    tests = json.loads(capsys.readouterr().out)["tests"]
    assert tests["fixed"] == [check] and tests["before"] == {"passed": False, "outcomes": None, "error": None}


def test_the_scripted_reviewer_drives_the_review_agent(repo, tmp_path, capsys):
    diff = diff_of(repo, tmp_path, FIX)
    assert review("--repo", repo, "--diff", diff, "--model", "scripted-reviewer") == 0
    out = capsys.readouterr().out
    assert "scripted-reviewer (scripted, for tests and demos: not a review): approve; ending submitted" in out
    assert "- `calc.py:1`: the change reads as the fix it says it is" in out
    skip = TESTS.replace("def test_add", "import pytest\n\n\n@pytest.mark.skip\ndef test_add")
    diff = diff_of(repo, tmp_path, {"tests/test_calc.py": skip}, "skip.diff")
    assert review("--repo", repo, "--diff", diff, "--model", "scripted-reviewer", "--json") == 1
    reviewer = json.loads(capsys.readouterr().out)["reviewer"]
    assert reviewer["scripted"] is True and reviewer["decision"] == CHANGES and reviewer["turns"] == 3
    assert reviewer["comments"] == [
        {"path": "tests/test_calc.py", "line": 8, "text": "test test_add is now skipped or xfailed"}
    ]


class Vandal:
    """A reviewer that tries to write to the repository, then approves; it keeps what it was shown."""

    native_tools = False
    name = "vandal"

    def __init__(self):
        self.seen = []

    def generate(self, requests):
        plan = [
            '<edit path="calc.py">\n<old>\n    return a + b\n</old>\n<new>\n    return 0\n</new>\n</edit>',
            "<shell>echo gone > calc.py; touch new.txt</shell>",
            "VERDICT: approve\ncalc.py:2: fine\n<submit/>",
        ]
        out = []
        for r in requests:
            self.seen.append(r.messages[-1]["content"])
            out.append(Completion(plan[min(r.meta["turn"], 2)], prompt_tokens=10, completion_tokens=5))
        return out


def test_the_reviewer_works_on_a_read_only_copy(tmp_path):
    after = tmp_path / "after"
    after.mkdir()
    (after / "calc.py").write_text(FIX["calc.py"])
    vandal = Vandal()
    verdict = run_reviewer(vandal, after, tmp_path / "work", "review this", "python -m pytest -q")
    assert verdict.decision == "approve" and verdict.comments[0].path == "calc.py"
    assert "edits are refused" in vandal.seen[1]
    if bwrap_works():  # the fallback backend does not enforce read-only mounts (the copy is thrown away)
        assert "Read-only file system" in vandal.seen[2]  # the shell's writes, as root too
    assert (after / "calc.py").read_text() == FIX["calc.py"] and not (after / "new.txt").exists()


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--repo", "{tmp}/nowhere", "--diff", "{diff}"], "not a directory"),
        (["--repo", "{tmp}", "--diff", "{diff}"], "not a git repository"),
        (["--repo", "{repo}", "--diff", "{tmp}/bad.diff"], "the diff does not apply to HEAD"),
        (["--repo", "{repo}", "--diff", "{tmp}/empty.diff"], "the diff is empty"),
        (["--repo", "{repo}", "--diff", "{tmp}/missing.diff"], "no such file"),
        (["--repo", "{repo}", "--branch", "nope"], "--branch nope: no such branch"),
        (["--repo", "{repo}", "--branch", "{head}"], "no change against its merge base with HEAD"),
        (["--repo", "{repo}"], "--diff FILE or as --branch B"),
        (["--repo", "{repo}", "--diff", "{diff}", "--branch", "x"], "not both"),
        (["--repo", "{repo}", "--diff", "{diff}", "--model", "scripted-sweep"], "--model scripted-sweep"),
        (["--repo", "{repo}", "--diff", "{diff}", "--effort", "huge"], "effort"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(repo, tmp_path, capsys, args, fragment):
    diff = diff_of(repo, tmp_path, FIX)
    (tmp_path / "bad.diff").write_text(diff.read_text().replace("a - b", "a / b"))
    (tmp_path / "empty.diff").write_text("")
    status = git(repo, "status", "--porcelain")
    head = git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    assert review(*(a.format(tmp=tmp_path, repo=repo, diff=diff, head=head) for a in args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and "Traceback" not in err[0], err
    assert git(repo, "status", "--porcelain") == status


def test_parse_verdict_reads_the_last_verdict_and_file_line_comments():
    text = "Looks odd.\nVERDICT: approve\n\n**Verdict**: Request changes\n- `calc.py:12`: special-cases 1987\nx.py:3 - nit"
    decision, comments = parse_verdict(text)
    assert decision == CHANGES
    assert [(c.path, c.line, c.text) for c in comments] == [
        ("calc.py", 12, "special-cases 1987"),
        ("x.py", 3, "nit"),
    ]
    assert parse_verdict("no decision here")[0] is None


def test_compare_sorts_tests_by_what_the_change_did():
    before = TestRun(
        "pytest", False, {"a": "failed", "b": "passed", "c": "passed", "d": "failed", "e": "error"}
    )
    after = TestRun(
        "pytest", False, {"a": "passed", "b": "skipped", "d": "failed", "e": "skipped", "f": "passed"}
    )
    delta = compare(before, after)
    assert delta.fixed == ["a"] and delta.broken == ["b (skipped)"] and delta.removed == ["c"]
    assert delta.still_failing == ["d (failed)"] and delta.skipped == ["e (skipped)"]
    assert delta.added == ["f (passed)"] and delta.passing == 2
