"""Augmentation for imitation data: the same episode with the task's own names made up anew, or with
its module's lines at other numbers.

A base trained on eleven train modules learns their names by heart: on a held-out task it views
`textutil.py` when the report names `ledger.py`. Renaming every identifier the task's code defines (the
module, its classes, functions, arguments and variables) to a fresh made-up name, consistently through
the whole conversation (report, code, test output, the teacher's actions), makes recall useless and
copying from the context the only way to write the next action, which is what a held-out task needs.

What is never renamed: Python keywords and builtins, the methods of the builtin containers (`get`,
`items`, `append`), dunder names, names imported from other modules, and every word of the system
prompt (the action tags and their attributes: `path`, `start`, `old`, `new`). A test function named
`test_<name>` and a test file `test_<module>.py` follow their name. Episodes are text, so this needs
no sandbox: nothing is run again.

`rename_task` does the same to a task itself (repository, hidden tests, report, test ids, solution), so RL
can train on fresh copies of its tasks (`[tasks] rename` in a run config).

`shift_lines` moves a module's lines down by inserting blank lines, through its `cat -n` listings and
the `sed` line addresses that refer to them, so that line numbers are read off the listing, not recalled.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import random
import re
from pathlib import Path
from typing import Any

from flywheel.tasks.format import Task, load_task, task_toml, write_task

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ONSETS = tuple("bdfgklmnprstvz") + ("br", "gr", "st", "tr", "pl", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "k", "x")
_PYTEST = {"pytest", "raises", "approx", "fixture", "mark", "parametrize"}
_FIXED = {"self", "cls", "main", "test", "tests"} | _PYTEST


def protected_words() -> set[str]:
    """Names that keep their meaning everywhere: keywords, builtins, builtin containers' methods."""
    words = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | _FIXED
    for kind in (dict, list, str, set, tuple, int, float, bytes):
        words |= set(dir(kind))
    return words


def defined_names(sources: list[str], local: set[str] = frozenset()) -> tuple[set[str], set[str]]:
    """(names, class names) the code defines; names imported from modules other than `local` are left
    out. Unparsable files are skipped."""
    names: set[str] = set()
    classes: set[str] = set()
    imported: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.add(node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] not in local:
                        imported |= {alias.asname or alias.name.split(".")[0], alias.name.split(".")[0]}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] not in local:
                imported |= {alias.asname or alias.name for alias in node.names} | {
                    (node.module or "").split(".")[0]
                }
    return names - imported, classes - imported


def made_up(rng: random.Random, camel: bool = False) -> str:
    """A pronounceable made-up identifier: `vorbak`, `stil_mex`, or CamelCase `VorbakStil`."""

    def word() -> str:
        return "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 2))
        ) + rng.choice(_CODAS)

    parts = [word() for _ in range(rng.choices((1, 2), weights=(3, 1))[0])]
    return "".join(p.capitalize() for p in parts) if camel else "_".join(parts)


def renaming(repo: Path, rng: random.Random, keep: set[str]) -> dict[str, str]:
    """Old name -> new name for the names the repository's Python files define, and its modules' names."""
    files = sorted(p for p in repo.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {p.stem for p in files if not p.stem.startswith(("test", "__"))}
    names, classes = defined_names([p.read_text(errors="replace") for p in files], modules)
    names |= modules
    taken = set(keep) | names | classes
    mapping: dict[str, str] = {}
    for old in sorted(names | classes):
        if old in keep or old.startswith("__") or len(old) < 3 or old.startswith("test"):
            continue
        new = made_up(rng, camel=old in classes and old not in names)
        while new in taken:
            new = made_up(rng, camel=old in classes and old not in names)
        taken.add(new)
        mapping[old] = new
    return mapping


def rename_text(text: str, mapping: dict[str, str]) -> str:
    """`text` with each whole identifier in `mapping` replaced, and `test_<old>` by `test_<new>`."""

    def sub(m: re.Match) -> str:
        word = m.group(0)
        if word in mapping:
            return mapping[word]
        if word.startswith("test_") and word[5:] in mapping:
            return "test_" + mapping[word[5:]]
        return word

    return _WORD.sub(sub, text)


def generic_words(
    conversations: list[list[dict[str, Any]]], groups: list[str], share: float = 0.5
) -> set[str]:
    """Words found in the conversations of at least `share` of the groups (e.g. source modules): the
    harness's and pytest's own words (`line`, `passed`) and names common to all code (`value`), which
    carry meaning across tasks and so are never renamed."""
    seen: dict[str, set[str]] = {}
    for conv, group in zip(conversations, groups, strict=True):
        for m in conv:
            for w in set(_WORD.findall(m["content"])):
                seen.setdefault(w, set()).add(group)
    need = max(2, math.ceil(share * len(set(groups))))
    return {w for w, g in seen.items() if len(g) >= need}


def rename_messages(
    messages: list[dict[str, Any]], repo: Path, rng: random.Random, keep: set[str] = frozenset()
) -> list[dict[str, Any]]:
    """The conversation with the task's names made up anew, except the words in `keep` and the protected
    ones; the system prompt is unchanged and its words are never renamed."""
    keep = protected_words() | set(keep)
    for m in messages:
        if m["role"] == "system":
            keep |= set(_WORD.findall(m["content"]))
    mapping = renaming(repo, rng, keep)
    return [
        m if m["role"] == "system" else {**m, "content": rename_text(m["content"], mapping)} for m in messages
    ]


def rename_task(task: Task, dest: Path, rng: random.Random) -> Task:
    """A copy of `task` in `dest` with its names made up anew: repository, hidden tests, instruction,
    test node ids and solution patch, all renamed alike, so the copy is graded like the original
    (`tests/sft/test_rename.py` checks every shipped module still passes its renamed tests). Its id is
    the name of `dest` and `meta.renamed_from` names the original. An existing `dest` is loaded as is."""
    dest = Path(dest)
    if (dest / "task.toml").is_file():
        return load_task(dest)
    mapping = renaming(task.repo, rng, protected_words())

    def tree(root: Path) -> dict[str, str]:
        files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        return {
            rename_text(p.relative_to(root).as_posix(), mapping): rename_text(p.read_text(), mapping)
            for p in files
        }

    toml = task_toml(
        id=dest.name,
        instruction=rename_text(task.instruction, mapping),
        test_command=task.test_command,
        fail_to_pass=[rename_text(n, mapping) for n in task.fail_to_pass],
        pass_to_pass=[rename_text(n, mapping) for n in task.pass_to_pass],
        timeout_s=task.timeout_s,
        meta={**task.meta, "renamed_from": task.id},
    )
    return write_task(
        dest,
        toml=toml,
        repo=tree(task.repo),
        hidden_tests=tree(task.hidden_tests),
        solution_patch=rename_text(task.solution_patch, mapping),
    )


# ------------------------------------------------------------------------------------- line shifts

_LISTED = re.compile(r"^ *(\d+)\t(.*)$")  # a line of `cat -n` output
_SED_LINE = re.compile(r"(sed -i '?)(\d+)(s/)")  # `sed -i 'Ns/...` addresses line N


def shift_lines(messages: list[dict[str, Any]], rng: random.Random, most: int) -> list[dict[str, Any]]:
    """The conversation as if the module had up to `most` more blank lines, each next to a blank line it
    already has: every `cat -n` listing is renumbered and every `sed -i 'Ns/…'` address follows its line.

    A base that sees each train module at the same line numbers can learn "line 41 holds `not in`" by
    heart; on held-out code only reading the number off the listing works. Conversations without a
    listing, and listings that do not start at line 1, are returned unchanged.
    """
    listings = [i for i, m in enumerate(messages) if m["role"] == "user" and _listing(m["content"])]
    if not listings or most <= 0:
        return messages
    lines = _listing(messages[listings[0]]["content"])
    blank = [n for n, text in lines if not text.strip()]
    if not blank:
        return messages
    after = sorted(rng.choice(blank) for _ in range(rng.randint(0, most)))  # a blank line goes after these

    def moved(n: int) -> int:
        return n + sum(p < n for p in after)

    out = []
    for i, m in enumerate(messages):
        if i in listings:
            text = m["content"].split("\n")
            rows = []
            for row in text:
                hit = _LISTED.match(row)
                if hit is None:
                    rows.append(row)
                    continue
                n = int(hit.group(1))
                rows.append(f"{moved(n):6d}\t{hit.group(2)}")
                rows += [f"{moved(n) + k:6d}\t" for k in range(1, after.count(n) + 1)]
            m = {**m, "content": "\n".join(rows)}
        elif m["role"] == "assistant":
            m = {
                **m,
                "content": _SED_LINE.sub(
                    lambda h: f"{h.group(1)}{moved(int(h.group(2)))}{h.group(3)}", m["content"]
                ),
            }
        out.append(m)
    return out


def _listing(text: str) -> list[tuple[int, str]]:
    """(number, text) of each line of a `cat -n` listing in `text` that starts at line 1 ([] if none)."""
    rows = [(int(h.group(1)), h.group(2)) for h in map(_LISTED.match, text.split("\n")) if h]
    return rows if rows and rows[0][0] == 1 else []
