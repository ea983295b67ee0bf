"""The change under review: the repository before it and after it, as two directories.

`load_change` takes a git repository's top level and either a diff (`--diff FILE`: applied to HEAD's tree)
or a branch (`--branch B`: its tree, against the commit where it left HEAD's history, `git merge-base`).
Both trees are written out of the object store (`git archive`), so the user's HEAD, index and working tree
are only read. Bad input is one FlywheelError line: not a repository, no commit, a branch that does not
exist or holds no change, a diff that is empty or does not apply.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from flywheel.errors import FlywheelError


@dataclass(frozen=True)
class Change:
    """The repository before and after the change, and the change as a diff."""

    repo: Path  # the repository's top level
    before: Path  # a directory holding the tree the change starts from (`work/repo`, as a task's repository)
    after: Path  # a directory holding the tree with the change
    diff: str  # the change, as a unified diff
    source: str  # what was reviewed: "diff FILE" or "branch B (from COMMIT)"


def run_git(cwd: Path, *args: str, stdin: bytes | None = None, alone: bool = False) -> bytes:
    """`git ARGS` in `cwd` (`alone`: never in a repository around `cwd`); its stdout, or FlywheelError
    with git's first error line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    if alone:
        env["GIT_CEILING_DIRECTORIES"] = str(cwd.parent)
    r = subprocess.run(
        ["git", "--no-optional-locks", *args], cwd=cwd, input=stdin, capture_output=True, env=env
    )
    if r.returncode != 0:
        why = (r.stderr.decode(errors="replace").strip().splitlines() or [f"git {args[0]} failed"])[0]
        raise FlywheelError(why.removeprefix("error: ").removeprefix("fatal: "))
    return r.stdout


def toplevel(repo: Path) -> Path:
    """The top level of the git repository at `repo` (which must have a commit)."""
    if not repo.is_dir():
        raise FlywheelError(f"--repo {repo}: not a directory")
    try:
        top = Path(run_git(repo, "rev-parse", "--show-toplevel").decode().strip())
    except FlywheelError:
        raise FlywheelError(f"--repo {repo}: not a git repository") from None
    try:
        run_git(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except FlywheelError:
        raise FlywheelError(f"--repo {repo}: the repository has no commit yet") from None
    return top


def export_tree(top: Path, rev: str, dest: Path) -> None:
    """Write the tree of `rev` into the new directory `dest`."""
    dest.mkdir(parents=True)
    data = run_git(top, "archive", "--format=tar", rev)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def load_change(repo: Path, work: Path, diff_file: Path | None = None, branch: str | None = None) -> Change:
    """The change given by `diff_file` (against HEAD) or `branch` (against its merge base with HEAD) in
    `repo`, its trees written under the directory `work`."""
    if (diff_file is None) == (branch is None):
        raise FlywheelError("give the change as --diff FILE or as --branch B (one of them)")
    top = toplevel(repo)
    before, after = work / "repo", work / "after"
    if branch is not None:
        return _branch_change(top, branch, before, after)
    if not diff_file.is_file():
        raise FlywheelError(f"--diff {diff_file}: no such file")
    diff = diff_file.read_text(errors="replace")
    if not diff.strip():
        raise FlywheelError(f"--diff {diff_file}: the diff is empty")
    export_tree(top, "HEAD", before)
    export_tree(top, "HEAD", after)
    try:
        run_git(after, "apply", "--whitespace=nowarn", "-", stdin=diff.encode(), alone=True)
    except FlywheelError as e:
        raise FlywheelError(f"--diff {diff_file}: the diff does not apply to HEAD: {e}") from None
    return Change(top, before, after, diff, f"diff {diff_file}")


def _branch_change(top: Path, branch: str, before: Path, after: Path) -> Change:
    try:
        tip = (
            run_git(top, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}")
            .decode()
            .strip()
        )
    except FlywheelError:
        raise FlywheelError(f"--branch {branch}: no such branch") from None
    try:
        base = run_git(top, "merge-base", "HEAD", tip).decode().strip()
    except FlywheelError:
        raise FlywheelError(f"--branch {branch}: shares no history with HEAD") from None
    export_tree(top, base, before)
    export_tree(top, tip, after)
    diff = run_git(top, "diff", "--no-color", "--no-ext-diff", base, tip).decode(errors="replace")
    if not diff.strip():
        raise FlywheelError(f"--branch {branch}: no change against its merge base with HEAD")
    return Change(top, before, after, diff, f"branch {branch} (from {base[:12]})")
