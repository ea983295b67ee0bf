"""Imports run only downward through the layers; `python tests/test_layers.py` prints them.

    __main__ → cli, demo → eval, rl, sft, fusion, solve, review, report → loop, serve, rubric → harness
             → models, verify → tasks, sandbox, sync, actions
             → protocols, record, registry, errors, seeding, progress, files, settings

A package may import its own modules and anything in a lower layer; packages in one layer may import each
other only where `SIDEWAYS` says so (the bottom layer's modules may use each other): rl reads eval's
episode runner, sft's renaming and fusion's pair runner; sft, fusion, solve and the report read eval's
runner and summaries; fusion's lead reviews with review's checks; nothing imports back. Every import counts: at module level or inside a function (an import
inside a function to dodge a cycle is still an edge), absolute or relative, `import flywheel.x`,
`from flywheel.x import y` and `from flywheel import x`; and so does every "flywheel.x…:attr" string,
the names a registry table (`flywheel.registry`) resolves at run time.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "flywheel"
LAYERS = [
    {"__main__"},
    {"cli", "demo"},
    {"eval", "rl", "sft", "fusion", "solve", "review", "report"},
    {"loop", "serve", "rubric"},
    {"harness"},
    {"models", "verify"},
    {"tasks", "sandbox", "sync", "actions"},
    {"protocols", "record", "registry", "errors", "seeding", "progress", "files", "settings", "__init__"},
]
SIDEWAYS = {
    ("rl", "eval"),
    ("rl", "sft"),
    ("rl", "fusion"),
    ("sft", "eval"),
    ("fusion", "eval"),
    ("fusion", "review"),
    ("solve", "eval"),
    ("report", "eval"),
}
REF = re.compile(r"^flywheel\.([A-Za-z_][\w.]*):\w+$")  # a registry string, "flywheel.x.y:attr"


def layer(pkg: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if pkg in names)


def package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def module_of(path: Path) -> list[str]:
    """`flywheel.a.b` of src/flywheel/a/b.py (a package's `__init__` is the package), as parts."""
    parts = ["flywheel", *path.relative_to(SRC).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported(node: ast.AST, path: Path) -> list[str]:
    """The dotted flywheel names one node imports or names in a registry string."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: resolved against the importing module's package
            here = module_of(path)
            package = here if path.name == "__init__.py" else here[:-1]
            up = package[: len(package) - (node.level - 1)]
            base = ".".join(up + ([base] if base else []))
        if base == "flywheel":  # `from flywheel import x`: x is a package or module
            return [f"flywheel.{a.name}" for a in node.names]
        return [base]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and REF.match(node.value):
        return [node.value.split(":", 1)[0]]
    return []


def edges() -> dict[tuple[str, str], set[str]]:
    """(importer package, imported package) -> the importing files."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(SRC.rglob("*.py")):
        src = package_of(path)
        for node in ast.walk(ast.parse(path.read_text())):
            for name in imported(node, path):
                parts = name.split(".")
                if parts[0] != "flywheel" or len(parts) < 2:
                    continue
                if parts[1] != src:
                    out[src, parts[1]].add(path.relative_to(SRC).as_posix())
    return out


def upward(found: dict[tuple[str, str], set[str]]) -> list[str]:
    bad = []
    for (src, dst), files in sorted(found.items()):
        bottom = layer(src) == len(LAYERS) - 1  # the shared value types and utilities use each other
        if layer(dst) < layer(src) or (
            layer(dst) == layer(src) and (src, dst) not in SIDEWAYS and not bottom
        ):
            bad.append(f"{src} -> {dst} in {', '.join(sorted(files))}")
    return bad


def test_no_import_runs_back_up_the_layers():
    assert upward(edges()) == []


def test_every_package_has_a_layer():
    packages = {package_of(p) for p in SRC.rglob("*.py")}
    assert all(any(p in names for names in LAYERS) for p in packages), packages


def test_the_edge_finder_sees_every_kind_of_import(tmp_path):
    """Relative imports, `from flywheel import x` and registry strings are edges too."""
    code = (
        "from . import sibling\nfrom ..loop import run\nfrom flywheel import rubric\n"
        "import flywheel.models.hf\nTABLE = {'x': 'flywheel.fusion.pair:Fusion'}\n"
    )
    path = SRC / "harness" / "agent.py"
    names = [n for node in ast.walk(ast.parse(code)) for n in imported(node, path)]
    assert names == [
        "flywheel.harness",
        "flywheel.loop",
        "flywheel.rubric",
        "flywheel.models.hf",
        "flywheel.fusion.pair",
    ]


def command_bodies() -> dict[str, int]:
    """`cli/<file>:<function>` -> the lines of its body (the statements after its signature and docstring)."""
    out = {}
    for path in sorted((SRC / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.body:
                body = node.body[1:] if ast.get_docstring(node) else node.body
                if body:
                    out[f"cli/{path.name}:{node.name}"] = body[-1].end_lineno - body[0].lineno + 1
    return out


def test_the_cli_parses_and_calls():
    """No command's body is over 40 lines: the work lives in the packages."""
    assert {name: n for name, n in command_bodies().items() if n > 40} == {}


if __name__ == "__main__":
    for (src, dst), files in sorted(edges().items(), key=lambda kv: (layer(kv[0][0]), kv[0])):
        print(f"{src:>9} -> {dst:<10} {len(files):3d} file(s)")
    bad = upward(edges())
    print("\n".join(["", "upward:"] + bad) if bad else "\nno import runs back up the layers")
    sys.exit(1 if bad else 0)
