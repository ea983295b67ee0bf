"""`flywheel solve` on a tiny git repository, driven by a fake model that plays a fixed plan (no mocking:
the real harness, sandbox and command line run; the fake is registered as a model backend by name)."""

from __future__ import annotations

import json
import subprocess

import pytest

from flywheel.cli import main
from flywheel.models import MODELS
from flywheel.protocols import Completion
from flywheel.record import read_trajectories
from flywheel.solve import diff_stat, find_test_command, snapshot
from flywheel.solve.output import commit_message, subject
from local_wheels import make_wheel

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
FIX = '<edit path="calc.py">\n<old>\n    return a - b\n</old>\n<new>\n    return a + b\n</new>\n</edit>'
PLAN = ["<shell>ls -a</shell>", '<view path="calc.py"/>', FIX, "<run_tests/>", "<submit/>"]


class PlanModel:
    """Plays `plan`, one tagged action per turn; `before_turn[k]()` runs before it answers turn k."""

    native_tools = False

    def __init__(self, plan=PLAN, before_turn=None, name="plan"):
        self.plan, self.before_turn, self.name = plan, before_turn or {}, name

    def generate(self, requests):
        out = []
        for r in requests:
            turn = r.meta["turn"]
            if turn in self.before_turn:
                self.before_turn[turn]()
            out.append(
                Completion(self.plan[min(turn, len(self.plan) - 1)], prompt_tokens=50, completion_tokens=10)
            )
        return out


PLANS: dict[str, PlanModel] = {}


def load_plan(spec, **opts):
    return PLANS[spec]


@pytest.fixture
def use_model(monkeypatch):
    """Register a `PlanModel` under a model spec, as a backend is registered by name."""

    def register(spec, model):
        PLANS[spec] = model
        monkeypatch.setitem(MODELS, spec, f"{__name__}:load_plan")
        return spec

    yield register
    PLANS.clear()


@pytest.fixture
def repo(tmp_path):
    """A git checkout with a bug in calc.py and a pytest test that shows it."""
    root = tmp_path / "proj"
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(BUGGY)
    (root / "tests" / "test_calc.py").write_text(TEST)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "calc.py", "tests"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    return root


def solve(*args):
    with pytest.raises(SystemExit) as exit_:
        main(["solve", *map(str, args)])
    return exit_.value.code


def one_line_error(capsys, fragment):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and "Traceback" not in err[0], err


def test_the_diff_comes_out_and_the_repository_is_untouched(repo, tmp_path, use_model, capsys):
    out = tmp_path / "run"
    assert solve("--repo", repo, "--model", use_model("plan", PlanModel()), "--out", out, "fix add") == 0
    captured = capsys.readouterr()
    assert "-    return a - b\n+    return a + b\n" in captured.out
    assert captured.out.startswith("--- a/calc.py\n+++ b/calc.py\n")
    assert (repo / "calc.py").read_text() == BUGGY
    assert "tests: python -m pytest -q: passed" in captured.err
    [record] = read_trajectories(out / "trajectories.jsonl")
    listing = next(t["text"] for t in record.turns if t.get("name") == "shell")
    assert "calc.py" in listing and ".git" not in listing and "__pycache__" not in listing
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ending"] == "submitted" and summary["files_changed"] == ["calc.py"]
    assert summary["tests"]["agent_runs"] == 1 and summary["tests"]["last_run"]["passed"] is True
    assert "1 passed" in summary["tests"]["agent_last"] and summary["cost"] >= 0
    assert (out / "patch.diff").read_text() == captured.out


def test_apply_patches_the_repository_and_git_agrees(repo, tmp_path, use_model, capsys):
    patch = tmp_path / "fix.diff"
    spec = use_model("plan", PlanModel())
    assert solve("--repo", repo, "--model", spec, "--apply", "--patch-out", patch, "fix add") == 0
    assert capsys.readouterr().out == "" and "+    return a + b" in patch.read_text()
    assert (repo / "calc.py").read_text() == FIXED
    status = subprocess.run(["git", "-C", repo, "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout.split()[:2] == ["M", "calc.py"]  # the only tracked change


def test_apply_without_git_uses_the_projects_applier(repo, use_model, capsys):
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)
    assert solve("--repo", repo, "--model", use_model("plan", PlanModel()), "--apply", "fix add") == 0
    assert (repo / "calc.py").read_text() == FIXED


def test_a_patch_that_no_longer_applies_leaves_the_repository_as_it_is(repo, tmp_path, use_model, capsys):
    edited = "def add(a, b):\n    return b - a  # someone else's edit\n"
    model = PlanModel(before_turn={4: lambda: (repo / "calc.py").write_text(edited)})
    out = tmp_path / "run"
    assert solve("--repo", repo, "--model", use_model("plan", model), "--apply", "--out", out, "fix") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "not applied" in err[-1] and "Traceback" not in "".join(err)
    assert (repo / "calc.py").read_text() == edited and (out / "summary.json").is_file()


def test_a_given_test_command_and_an_agent_that_changes_nothing(repo, tmp_path, use_model, capsys):
    spec = use_model("idle", PlanModel(["<submit/>"]))
    args = (
        "--repo",
        repo,
        "--model",
        spec,
        "--test-command",
        "python -m pytest -q tests",
        "--out",
        tmp_path / "r",
    )
    assert solve(*args, "look around") == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "tests: python -m pytest -q tests: failed" in captured.err
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["files_changed"] == []


def test_fusion_pairs_are_taken(repo, use_model, capsys):
    lead = use_model("lead", PlanModel(["<delegate>fix add in calc.py</delegate>", "<submit/>"]))
    side = use_model("side", PlanModel(PLAN[1:]))
    assert solve("--repo", repo, "--lead", lead, "--sidekick", side, "fix add") == 0
    assert "+    return a + b" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--repo", "{tmp}/missing", "--model", "scripted", "fix"], "not a directory"),
        (["--repo", "{repo}", "--model", "scripted", "  "], "instruction is empty"),
        (["--repo", "{repo}", "--model", "nope", "fix"], "unknown model"),
        (["--repo", "{repo}", "--model", "scripted", "--effort", "huge", "fix"], "effort"),
        (["--repo", "{repo}", "--model", "scripted", "--out", "{repo}", "fix"], "exists"),
        (["--repo", "{repo}", "--lead", "scripted", "fix"], "--sidekick"),
        (["--repo", "{repo}", "--model", "scripted-sweep", "fix"], "replay a task's reference fix"),
        (
            ["--repo", "{repo}", "--lead", "scripted-lead", "--sidekick", "toybugs-sweep", "fix"],
            "--lead scripted-lead",
        ),
        (["--repo", "{repo}", "--model", "openai:x", "--draft", "lookup", "fix"], "--draft needs a torch"),
        (["--repo", "{repo}", "--model", "toybugs-sweep", "--draft", "layers:9", "fix"], "4 decoder layers"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment, repo, tmp_path, capsys):
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))
    code = solve(*(a.format(tmp=tmp_path, repo=repo) for a in args))
    assert code == 2
    one_line_error(capsys, fragment)
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before


def test_the_test_command_is_found_from_the_usual_markers(tmp_path):
    assert find_test_command(tmp_path) is None
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")
    assert find_test_command(tmp_path) is None
    (tmp_path / "tox.ini").write_text("[pytest]\naddopts = -q\n")
    assert find_test_command(tmp_path) == "python -m pytest -q"
    (tmp_path / "tox.ini").unlink()
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    assert find_test_command(tmp_path) == "python -m pytest -q"


def test_the_snapshot_leaves_history_caches_and_environments_behind(repo, tmp_path):
    for d in (".venv/lib", "node_modules/x", "pkg.egg-info"):
        (repo / d).mkdir(parents=True)
    snapshot(repo, tmp_path / "copy")
    kept = sorted(p.relative_to(tmp_path / "copy").as_posix() for p in (tmp_path / "copy").rglob("*"))
    assert kept == ["calc.py", "tests", "tests/test_calc.py"]


# ------------------------------------------------------------------------------------------ environments

SHOUT = "import greetlib\n\n\ndef shout(name):\n    return greetlib.greet(name)\n"
SHOUT_TEST = "from shout import shout\n\n\ndef test_shout():\n    assert shout('x') == 'HELLO X'\n"
SHOUT_FIX = (
    '<edit path="shout.py">\n<old>\n    return greetlib.greet(name)\n</old>\n'
    "<new>\n    return greetlib.greet(name).upper()\n</new>\n</edit>"
)
SHOUT_PLAN = [SHOUT_FIX, "<run_tests/>", "<submit/>"]


@pytest.fixture
def needy(tmp_path, offline_envs):
    """A repository whose code and tests need greetlib (not installed here), declared in its pyproject.toml,
    and a test helper (a wheel no other test installs) declared in requirements-dev.txt."""
    make_wheel(offline_envs, "solvetools", "1.0", {"solvetools.py": "READY = True\n"})
    root = tmp_path / "needy"
    (root / "tests").mkdir(parents=True)
    (root / "shout.py").write_text(SHOUT)
    (root / "tests" / "test_shout.py").write_text(SHOUT_TEST)
    (root / "pyproject.toml").write_text('[project]\nname = "shout"\ndependencies = ["greetlib==1.0"]\n')
    (root / "requirements-dev.txt").write_text("shout  # the project itself\nsolvetools==1.0\n")
    return root


def test_the_repository_runs_in_the_environment_it_declares(needy, tmp_path, use_model, capsys):
    out = tmp_path / "run"
    spec = use_model("shout", PlanModel(SHOUT_PLAN))
    assert solve("--repo", needy, "--model", spec, "--out", out, "make shout loud") == 0
    captured = capsys.readouterr()
    assert "+    return greetlib.greet(name).upper()" in captured.out
    building = [ln for ln in captured.err.splitlines() if "building the environment" in ln]
    assert len(building) == 1 and "greetlib==1.0, solvetools==1.0" in building[0], captured.err
    assert "solve: environment: greetlib==1.0, solvetools==1.0" in captured.err
    assert "tests: python -m pytest -q: passed" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"] == {"requirements": ["greetlib==1.0", "solvetools==1.0"], "python": None}
    assert "1 passed" in summary["tests"]["agent_last"] and summary["tests"]["last_run"]["passed"] is True
    # a second run reuses the environment: no build
    assert solve("--repo", needy, "--model", spec, "make shout loud") == 0
    captured = capsys.readouterr()
    assert "building the environment" not in captured.err and "python -m pytest -q: passed" in captured.err


def test_without_the_environment_the_tests_cannot_import(needy, tmp_path, use_model, capsys):
    out = tmp_path / "run"
    spec = use_model("shout", PlanModel(SHOUT_PLAN))
    assert solve("--repo", needy, "--model", spec, "--no-env", "--out", out, "make shout loud") == 0
    captured = capsys.readouterr()
    assert "building the environment" not in captured.err
    assert "solve: environment: the project's own Python" in captured.err
    assert "tests: python -m pytest -q: failed" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert "No module named 'greetlib'" in summary["tests"]["agent_last"]
    assert summary["environment"]["requirements"] == []


def test_a_requirements_file_adds_to_the_environment(needy, tmp_path, use_model, capsys):
    (needy / "pyproject.toml").unlink()
    (needy / "requirements-dev.txt").unlink()
    (tmp_path / "extra.txt").write_text("greetlib==2.0\n")
    plan = ["<shell>python -c 'import greetlib; print(greetlib.greet(\"x\"))'</shell>", "<submit/>"]
    out = tmp_path / "run"
    spec = use_model("look", PlanModel(plan))
    assert (
        solve(
            "--repo", needy, "--model", spec, "--requirements", tmp_path / "extra.txt", "--out", out, "look"
        )
        == 0
    )
    [record] = read_trajectories(out / "trajectories.jsonl")
    assert "hi x" in next(t["text"] for t in record.turns if t.get("name") == "shell")
    assert json.loads((out / "summary.json").read_text())["environment"]["requirements"] == ["greetlib==2.0"]


def test_an_environment_that_does_not_build_stops_before_the_agent(needy, tmp_path, use_model, capsys):
    (needy / "requirements.txt").write_text("nosuchpackage==9.9\n")
    out = tmp_path / "run"
    spec = use_model("shout", PlanModel(SHOUT_PLAN))
    assert solve("--repo", needy, "--model", spec, "--out", out, "make shout loud") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "building the environment" in err[0] and len(err) == 2, err
    assert (
        err[-1].startswith("flywheel: error: ") and "nosuchpackage" in err[-1] and "Traceback" not in err[-1]
    )
    assert not out.exists() and (needy / "shout.py").read_text() == SHOUT


@pytest.mark.parametrize(
    "files,args,fragment",
    [
        ({"requirements.txt": "greetlib==\n"}, [], "requirements.txt line 1: requirement 'greetlib=='"),
        ({"pyproject.toml": "[project\n"}, [], "pyproject.toml: not valid TOML"),
        ({}, ["--requirements", "{tmp}/missing.txt"], "--requirements {tmp}/missing.txt: no such file"),
        ({}, ["--no-env", "--requirements", "{tmp}/r.txt"], "which --no-env turns off"),
        ({}, ["--requirements", "{tmp}/r.txt"], "r.txt line 2: requirement '!!'"),
    ],
)
def test_a_bad_environment_is_one_line_and_exit_2(needy, tmp_path, use_model, capsys, files, args, fragment):
    for rel, text in files.items():
        (needy / rel).write_text(text)
    (tmp_path / "r.txt").write_text("greetlib==1.0\n!!\n")
    spec = use_model("shout", PlanModel(SHOUT_PLAN))
    code = solve("--repo", needy, "--model", spec, *(a.format(tmp=tmp_path) for a in args), "make shout loud")
    assert code == 2
    one_line_error(capsys, fragment.format(tmp=tmp_path))


# ------------------------------------------------------------------------------------------ --branch

SAID = "The sum was a difference; add now adds.\n" + FIX
BRANCH_PLAN = [FIX, "<run_tests/>", "The sum was a difference; add now adds.\n<submit/>"]


def git_out(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def checkout_state(repo):
    """What the user has: HEAD, the index's entries, the status and the working tree's files."""
    files = {
        p.relative_to(repo).as_posix(): p.read_bytes()
        for p in repo.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(repo).parts
    }
    index = (repo / ".git" / "index").read_bytes()  # before any command of ours could refresh it
    return (
        index,
        git_out(repo, "rev-parse", "HEAD"),
        git_out(repo, "ls-files", "--stage"),
        git_out(repo, "--no-optional-locks", "status", "--porcelain"),
        files,
    )


@pytest.fixture
def identity(monkeypatch):
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Flywheel Test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")


def test_branch_commits_the_diff_and_leaves_the_checkout_as_it_was(
    repo, tmp_path, use_model, identity, capsys
):
    before = checkout_state(repo)
    out = tmp_path / "run"
    spec = use_model("plan", PlanModel(BRANCH_PLAN))
    assert solve("--repo", repo, "--model", spec, "--branch", "fix-add", "--out", out, "fix add") == 0
    captured = capsys.readouterr()
    assert checkout_state(repo) == before  # HEAD, index (byte for byte), status and files
    head = before[1].strip()
    assert git_out(repo, "rev-parse", "fix-add^").strip() == head
    branch_diff = git_out(repo, "diff", head, "fix-add").splitlines(keepends=True)
    assert "".join(branch_diff[2:]) == captured.out  # exactly the diff (after git's `diff`, `index` lines)
    assert git_out(repo, "show", "fix-add:calc.py") == FIXED
    assert (
        git_out(repo, "log", "-1", "--format=%B", "fix-add").strip()
        == "The sum was a difference; add now adds."
    )
    commit = git_out(repo, "rev-parse", "fix-add").strip()
    assert f"committed {commit[:12]} on the new branch fix-add" in captured.err
    pr = (out / "PR.md").read_text()
    for part in (
        "# fix add",
        f"Branch `fix-add`, commit `{commit}` (parent `{head}`)",
        "## Summary\n\nThe sum was a difference; add now adds.",
        " calc.py | ",
        "1 file(s) changed, 1 insertion(s)(+), 1 deletion(s)(-)",
        "- before the change: failed (1 failed)\n  - `FAILED tests/test_calc.py::test_add`\n",
        "- after the change: passed (1 passed)\n",
        "- the agent ran the tests 1 time(s)",
        "- model: plan (effort medium); ending: submitted",
        "- turns: 3; tokens: 150 prompt, 30 completion",
    ):
        assert part in pr, (part, pr)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["branch"] == {"name": "fix-add", "commit": commit, "parent": head, "uncommitted": False}
    assert summary["tests"]["first_run"]["passed"] is False and summary["tokens"]["prompt"] == 150


def test_the_agent_works_on_heads_tree_and_the_default_name_comes_from_the_instruction(
    repo, tmp_path, use_model, identity, capsys
):
    (repo / "stray.txt").write_text("untracked: neither refused nor seen\n")
    subprocess.run(["git", "-C", repo, "branch", "flywheel/fix-the-add-function"], check=True)
    spec = use_model("look", PlanModel(["<shell>ls -a</shell>", FIX, "<submit/>"]))
    out = tmp_path / "run"
    assert (
        solve("--repo", repo, "--model", spec, "--branch", "auto", "--out", out, "Fix the add() function!")
        == 0
    )
    err = capsys.readouterr().err
    assert "on the new branch flywheel/fix-the-add-function-2" in err  # the first free name
    assert git_out(repo, "show", "flywheel/fix-the-add-function-2:calc.py") == FIXED
    message = git_out(repo, "log", "-1", "--format=%B", "flywheel/fix-the-add-function-2").strip()
    assert message == "Fix the add() function!"  # the agent said nothing besides its actions
    [record] = read_trajectories(out / "trajectories.jsonl")
    listing = next(t["text"] for t in record.turns if t.get("name") == "shell").split()
    assert (
        "calc.py" in listing and "tests" in listing and "stray.txt" not in listing and ".git" not in listing
    )


def test_uncommitted_changes_are_refused_unless_included(repo, tmp_path, use_model, identity, capsys):
    (repo / "calc.py").write_text(BUGGY + "\n\ndef mul(a, b):\n    return a * b\n")
    (repo / "notes.txt").write_text("untracked\n")
    (repo / ".gitignore").write_text("secret.txt\n")
    (repo / "secret.txt").write_text("ignored\n")
    spec = use_model("plan", PlanModel(BRANCH_PLAN))
    assert solve("--repo", repo, "--model", spec, "--branch", "b", "fix add") == 2
    one_line_error(capsys, "uncommitted change(s)")
    before = checkout_state(repo)
    args = ("--repo", repo, "--model", spec, "--branch", "b", "--include-uncommitted", "fix add")
    assert solve(*args) == 0
    patch = capsys.readouterr().out
    assert checkout_state(repo) == before
    assert git_out(repo, "show", "b:calc.py") == FIXED + "\n\ndef mul(a, b):\n    return a * b\n"
    assert git_out(repo, "show", "b:notes.txt") == "untracked\n"
    tracked = git_out(repo, "ls-tree", "-r", "--name-only", "b").split()
    assert "secret.txt" not in tracked and ".gitignore" in tracked
    assert "notes.txt" not in patch and "+def mul" not in patch  # the patch is the agent's change alone


def test_apply_with_branch_commits_and_also_changes_the_working_tree(repo, use_model, identity, capsys):
    spec = use_model("plan", PlanModel(BRANCH_PLAN))
    assert solve("--repo", repo, "--model", spec, "--branch", "b", "--apply", "fix add") == 0
    assert (repo / "calc.py").read_text() == FIXED and git_out(repo, "show", "b:calc.py") == FIXED
    assert git_out(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() != "b"  # not checked out


def test_no_change_makes_no_branch(repo, use_model, identity, capsys):
    spec = use_model("idle", PlanModel(["<submit/>"]))
    assert solve("--repo", repo, "--model", spec, "--branch", "b", "look around") == 0
    assert "no change: no branch was made" in capsys.readouterr().err
    assert git_out(repo, "branch", "--list", "b") == ""


def test_a_branch_taken_during_the_run_is_one_line_and_the_run_is_saved(
    repo, tmp_path, use_model, identity, capsys
):
    take = lambda: subprocess.run(["git", "-C", repo, "branch", "b"], check=True)  # noqa: E731
    out = tmp_path / "run"
    spec = use_model("plan", PlanModel(BRANCH_PLAN, before_turn={2: take}))
    assert solve("--repo", repo, "--model", spec, "--branch", "b", "--out", out, "fix add") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "branch b not created" in err[-1] and "the run is saved" in err[-1]
    assert git_out(repo, "rev-parse", "b") == git_out(repo, "rev-parse", "HEAD")  # the other one's branch
    assert "Branch `" not in (out / "PR.md").read_text()


@pytest.mark.parametrize(
    "setup,args,fragment",
    [
        ("rm -rf .git", ["--branch", "b"], "not a git repository"),
        ("mkdir sub && touch sub/x", ["--branch", "b", "--repo-sub"], "needs the repository's top level"),
        ("git branch taken", ["--branch", "taken"], "--branch taken: the branch exists"),
        ("", ["--branch", "bad..name"], "not a valid branch name"),
        ("", ["--include-uncommitted"], "--include-uncommitted goes with --branch"),
        ("git checkout -q --orphan fresh && git rm -rqf --cached .", ["--branch", "b"], "no commit yet"),
    ],
)
def test_bad_branch_input_is_one_line_and_exit_2(repo, use_model, identity, capsys, setup, args, fragment):
    if setup:
        subprocess.run(setup, shell=True, cwd=repo, check=True)
    where = repo / "sub" if "--repo-sub" in args else repo
    args = [a for a in args if a != "--repo-sub"]
    spec = use_model("plan", PlanModel(BRANCH_PLAN))
    assert solve("--repo", where, "--model", spec, *args, "fix add") == 2
    one_line_error(capsys, fragment)


def test_the_branch_solve_makes_is_what_review_reads(repo, tmp_path, use_model, identity, capsys):
    """The workflow end to end: solve commits a branch, review runs its tests before and after and approves."""
    spec = use_model("plan", PlanModel(BRANCH_PLAN))
    assert solve("--repo", repo, "--model", spec, "--branch", "fix-add", "fix add") == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["review", "--repo", str(repo), "--branch", "fix-add", "--model", "scripted-reviewer", "--json"])
    assert exit_.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decision"] == "approve" and data["tests"]["fixed"] == ["tests/test_calc.py::test_add"]
    assert data["reviewer"]["decision"] == "approve" and data["reviewer"]["scripted"] is True


def test_titles_and_commit_messages_keep_a_short_subject():
    long = "Calling `deposit('bob', 0)` is supposed to fail with ValueError; it silently succeeds. See ledger.py."
    assert subject(long) == "Calling `deposit('bob', 0)` is supposed to fail with ValueError"
    assert commit_message(long) == f"{subject(long)}\n\n{long}"
    assert commit_message("  fix add\n\nbecause  ") == "fix add\n\nbecause"
    assert subject("word " * 30) == "word " * 13 + "word…" and len(subject("word " * 30)) <= 72


def test_the_diff_stat_counts_each_files_lines():
    patch = (
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
        "+# done\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x = 1\n--- a/old.py\n+++ /dev/null\n"
        "@@ -1 +0,0 @@\n-y = 2\n"
    )
    assert diff_stat(patch).splitlines() == [
        " calc.py |   3 ++-",
        " new.py  |   1 +",
        " old.py  |   1 -",
        " 3 file(s) changed, 3 insertion(s)(+), 2 deletion(s)(-)",
    ]
    assert diff_stat("") == "no change"
