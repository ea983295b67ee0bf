"""`solve --branch`: the agent's diff committed on a new branch, the user's checkout untouched.

Everything here runs `git` outside the sandbox, on the repository itself, and never writes its HEAD, its
index or its working tree: a temporary index (`GIT_INDEX_FILE` in a temporary directory) holds the trees
being built, objects are added to the repository's object store, and the one ref written is the new
branch, created only where it does not exist (`git update-ref` with an empty old value).

`git_base` fixes what the agent starts from (`Base`): HEAD's tree, or, with `include_uncommitted`, the
working tree as `git add -A` would stage it (tracked changes, deletions and untracked files; ignored files
and `SKIP`'s caches and environments left out); a checkout whose tracked files have changes is refused
without it (untracked files do not count); `checkout_base` writes that tree into the sandbox's snapshot (`git checkout-index` into a
prefix), and `commit_branch` applies the agent's diff to it (`git apply --cached`) and commits the result
on the new branch, whose parent is HEAD. A branch made with `include_uncommitted` therefore holds the
uncommitted changes and the agent's, in one commit.

What is not covered: files git does not track as text (the agent's binary changes are not in its diff,
see `flywheel.solve`), submodules (their directories stay empty in the snapshot), executable bits the
agent changes, and the filters of `.gitattributes` beyond what `checkout-index` applies.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from flywheel.errors import FlywheelError
from flywheel.solve.inputs import SKIP

SLUG_WORDS = 6  # of the instruction, in a default branch name


@dataclass(frozen=True)
class Base:
    """What the agent starts from on a git repository: HEAD, and the tree the snapshot holds."""

    top: Path  # the repository's top level
    head: str  # HEAD's commit
    tree: str  # the snapshot's tree: HEAD's own, or with the uncommitted changes staged
    includes_uncommitted: bool


def git(top: Path, *args: str, index: Path | None = None, stdin: str | None = None) -> str:
    """Run `git -C top ARGS` (with `index` as its index file); its stdout, or FlywheelError with git's
    first error line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k.endswith(("_NAME", "_EMAIL"))}
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    argv = ["git", "--no-optional-locks", "-C", str(top), *args]  # `status` must not refresh the index
    r = subprocess.run(argv, input=stdin, text=True, capture_output=True, env=env)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"git {args[0]} failed"])[0]
        raise FlywheelError(f"git {args[0]}: {why.removeprefix('error: ').removeprefix('fatal: ')}")
    return r.stdout


def toplevel(repo: Path) -> Path:
    """`repo`, which must be the top level of a git work tree with at least one commit."""
    try:
        top = Path(git(repo, "rev-parse", "--show-toplevel").strip())
    except FlywheelError:
        raise FlywheelError(f"{repo}: not a git repository (--branch commits to one)") from None
    if top.resolve() != repo.resolve():
        raise FlywheelError(f"{repo}: --branch needs the repository's top level, {top}")
    try:
        git(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except FlywheelError:
        raise FlywheelError(f"{repo}: the repository has no commit yet; --branch starts from HEAD") from None
    return top


def uncommitted(top: Path) -> list[str]:
    """`git status --porcelain`'s lines for tracked files: changes staged or not (untracked files are
    not the agent's to see without `include_uncommitted`, and do not stand in the way)."""
    return git(top, "status", "--porcelain", "--untracked-files=no").splitlines()


def _not_skipped() -> list[str]:
    """Pathspecs that leave `SKIP` (caches, environments) out of `git add -A`."""
    return [f":(exclude,glob){pre}{s}{post}" for s in SKIP for pre in ("", "**/") for post in ("", "/**")]


def git_base(repo: Path, include_uncommitted: bool = False) -> Base:
    """What the agent starts from (`Base`); a checkout with uncommitted changes is refused unless
    `include_uncommitted`, and one without a committer identity is refused before anything runs."""
    top = toplevel(repo)
    changes = uncommitted(top)
    if changes and not include_uncommitted:
        raise FlywheelError(
            f"{repo}: {len(changes)} uncommitted change(s) ({changes[0].strip()}, ...); commit them, or "
            "pass --include-uncommitted to put them on the branch too"
        )
    git(top, "var", "GIT_COMMITTER_IDENT")  # no identity: git's own one line, before the agent starts
    head = git(top, "rev-parse", "HEAD").strip()
    with tempfile.TemporaryDirectory(prefix="flywheel-index-") as tmp:
        index = Path(tmp) / "index"
        git(top, "read-tree", head, index=index)
        if include_uncommitted:
            git(top, "add", "-A", "--", ".", *_not_skipped(), index=index)
        tree = git(top, "write-tree", index=index).strip()
    return Base(top, head, tree, tree != git(top, "rev-parse", f"{head}^{{tree}}").strip())


def checkout_base(base: Base, dest: Path) -> None:
    """Write `base`'s tree into the new directory `dest` (the user's working tree is not read)."""
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="flywheel-index-") as tmp:
        index = Path(tmp) / "index"
        git(base.top, "read-tree", base.tree, index=index)
        git(base.top, "checkout-index", "--all", f"--prefix={dest}/", index=index)


def branch_name(top: Path, name: str | None, instruction: str) -> str:
    """The new branch's name: `name`, which must be valid and new; else `flywheel/<slug>` of the
    instruction, with `-2`, `-3`, ... where that exists."""
    if name is not None:
        try:
            git(top, "check-ref-format", "--branch", name)
        except FlywheelError:
            raise FlywheelError(f"--branch {name!r}: not a valid branch name") from None
        if _exists(top, name):
            raise FlywheelError(f"--branch {name}: the branch exists; choose another name")
        return name
    words = re.findall(r"[a-z0-9]+", instruction.lower())[:SLUG_WORDS]
    stem = "flywheel/" + ("-".join(words)[:50].strip("-") or "change")
    return next(c for c in (stem, *(f"{stem}-{k}" for k in range(2, 1000))) if not _exists(top, c))


def _exists(top: Path, name: str) -> bool:
    try:
        git(top, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}")
    except FlywheelError:
        return False
    return True


def commit_branch(base: Base, patch: str, message: str, name: str) -> str:
    """Commit `base`'s tree with `patch` applied, parent HEAD, on the new branch `name`; its commit. The
    branch is created only where it does not exist (FlywheelError otherwise, and no ref written)."""
    with tempfile.TemporaryDirectory(prefix="flywheel-index-") as tmp:
        index = Path(tmp) / "index"
        git(base.top, "read-tree", base.tree, index=index)
        if patch:
            git(base.top, "apply", "--cached", "--whitespace=nowarn", "-", index=index, stdin=patch)
        tree = git(base.top, "write-tree", index=index).strip()
    commit = git(base.top, "commit-tree", tree, "-p", base.head, stdin=message.strip() + "\n").strip()
    try:
        git(base.top, "update-ref", f"refs/heads/{name}", commit, "")
    except FlywheelError as e:
        raise FlywheelError(f"branch {name} not created: {e}") from None
    return commit


def branch_plan(
    repo: Path, branch: str | None, include_uncommitted: bool, instruction: str
) -> tuple[Base, str] | None:
    """The base and the new branch's name for `--branch` (None without it); bad input is one
    FlywheelError line before anything runs."""
    if branch is None:
        if include_uncommitted:
            raise FlywheelError("--include-uncommitted goes with --branch")
        return None
    base = git_base(repo, include_uncommitted)
    return base, branch_name(base.top, None if branch == "auto" else branch, instruction)
