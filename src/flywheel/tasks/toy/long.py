"""The built-in `toybugs-long` suite: toybugs bugs in a module, and a test run, longer than a small context.

Each task is one toybugs task — the same planted bug, bug report, failing tests and reference fix — whose
module has grown: the buggy module's code shares its file with the working code of other shipped modules,
in a seeded order, until the file holds at least `MODULE_CHARS` characters (over 2,048 tokens even at the
harness's estimate of 4 characters a token; real tokenizers count more). The module keeps its own name
and docstring; the others' docstrings become section comments and every import moves to the top. The
other modules' tests come along whole, each in its own file (`tests/test_<other>.py`, importing from the
grown module), all passing: they join the task's `pass_to_pass`, visible and hidden alike, so breaking
the padding while fixing the bug fails the task. The test command is verbose (`pytest -v`, one line per
test), so a full run of the tests is long too.

What that does to an episode: the `view` tool shows 120 lines at a time and every observation is cut to
its first and last 2,000 characters, so the whole module is never on screen at once, and an agent that
reads it and runs the tests outgrows a 2,048-token context within a few turns; what it keeps is up to
compaction (`[rollout] compaction`, `flywheel.harness.agent`).

Splits follow toybugs': a task is `heldout` when its buggy module is one of `HELDOUT_MODULES`. Train
tasks are padded with train modules only, so no held-out module's code is ever seen in training;
held-out tasks with any module but their own. Everything is deterministic in the seed: the tasks are
built from the toybugs suite of the same seed (materialised first if need be), and each task's padding
and the place of its module among it are drawn from `stable_seed("toybugs-long", seed, toybugs id)`.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from flywheel.seeding import stable_seed
from flywheel.tasks.format import Task, task_toml, write_task
from flywheel.tasks.patch import make_patch
from flywheel.tasks.suites import Builtin, load_suite, materialise
from flywheel.tasks.toy.suite import HELDOUT_MODULES, module_names, read_module, test_names
from flywheel.tasks.toy.suite import VERSION as TOY_VERSION

VERSION = f"{TOY_VERSION}.1"  # a new toybugs is a new toybugs-long
SUITE = "toybugs-long"
MODULE_CHARS = 9000  # the grown (buggy) module's least size: 2,250 tokens at 4 characters a token
TEST_COMMAND = "python -m pytest -v tests"


def split_module(source: str) -> tuple[str, list[str], str]:
    """(docstring as written, import lines, the rest as written) of a module's source."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    doc, imports, end = "", [], 0
    for node in tree.body:
        if not end and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            doc = "".join(lines[node.lineno - 1 : node.end_lineno]).strip()
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(ast.unparse(node))
        else:
            break
        end = node.end_lineno or node.lineno
    return doc, imports, "".join(lines[end:]).strip("\n") + "\n"


def grow(name: str, source: str, padding: Sequence[str], at: int) -> str:
    """Module `name` (its `source`, buggy or not) with the code of the shipped `padding` modules, its own
    code at position `at` among theirs: its docstring first, then every module's imports, and each other
    module's docstring as the comment above its code."""
    doc, imports, body = split_module(source)
    sections = []
    for other in padding:
        other_doc, other_imports, other_body = _shipped(other)
        imports = [*imports, *other_imports]
        text = (ast.get_docstring(ast.parse(other_doc)) or "") if other_doc else ""
        header = "\n".join(f"# {line}".rstrip() for line in text.splitlines())
        sections.append(f"{header}\n\n{other_body}" if header else other_body)
    sections.insert(at, body)
    head = [part for part in (doc, "\n".join(sorted(set(imports)))) if part]
    return "\n\n".join(head) + ("\n\n\n" if head else "") + "\n\n".join(sections)


@cache
def _shipped(name: str) -> tuple[str, list[str], str]:
    return split_module(read_module(name)[0])


def padding_tests(name: str, other: str) -> str:
    """Module `other`'s test file, importing from module `name` instead."""
    tests, n = re.subn(rf"^from {other} import ", f"from {name} import ", read_module(other)[1], flags=re.M)
    if n != 1:
        raise ValueError(f"test_{other}.py: expected one 'from {other} import' line, found {n}")
    return tests


def choose_padding(name: str, buggy: str, heldout: bool, rng: random.Random) -> list[str]:
    """Shipped modules, in a seeded order, until `buggy` grown with them holds MODULE_CHARS characters.
    Train tasks draw from the train modules only; a module that defines a name already defined is passed
    over, so no code shadows another's."""
    pool = [m for m in module_names() if m != name and (heldout or m not in HELDOUT_MODULES)]
    rng.shuffle(pool)
    chosen: list[str] = []
    taken = defined(buggy)
    for other in pool:
        if len(grow(name, buggy, chosen, 0)) >= MODULE_CHARS:
            break
        if not taken & defined(read_module(other)[0]):
            chosen.append(other)
            taken |= defined(read_module(other)[0])
    return chosen


def defined(source: str) -> set[str]:
    """The names a module's top level binds."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def long_task(out: Path, base: Task, seed: int) -> Task:
    """Write the toybugs-long task grown from toybugs task `base` under `out`."""
    name = base.meta["module"]
    heldout = base.meta["split"] == "heldout"
    rng = random.Random(stable_seed(SUITE, seed, base.id))
    module, tests = f"{name}.py", f"tests/test_{name}.py"
    buggy = (base.repo / module).read_text()
    padding = choose_padding(name, buggy, heldout, rng)
    at = rng.randrange(len(padding) + 1)
    before, after = grow(name, buggy, padding, at), grow(name, read_module(name)[0], padding, at)
    others = {f"tests/test_{p}.py": padding_tests(name, p) for p in padding}
    task_id = base.id.replace("toybugs-", f"{SUITE}-", 1)
    return write_task(
        out / task_id,
        toml=task_toml(
            id=task_id,
            instruction=base.instruction,
            test_command=TEST_COMMAND,
            fail_to_pass=base.fail_to_pass,
            pass_to_pass=[
                *base.pass_to_pass,
                *(f"tests/test_{p}.py::{t}" for p in padding for t in test_names(read_module(p)[1])),
            ],
            timeout_s=base.timeout_s,
            meta={**base.meta, "suite": SUITE, "base": base.id, "padding": padding},
        ),
        repo={module: before, tests: (base.repo / tests).read_text(), **others},
        hidden_tests={tests: (base.hidden_tests / tests).read_text(), **others},
        solution_patch=make_patch({module: before}, {module: after}),
    )


def build(out: Path, seed: int, base: Path | None = None) -> None:
    """Write one toybugs-long task into `out` per task of the toybugs suite of `seed` (or per toybugs task
    directory under `base`)."""
    for task in load_suite(base or materialise("toybugs", seed)):
        long_task(out, task, seed)


BUILTIN = Builtin(VERSION, build)
