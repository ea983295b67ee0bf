"""Imports run only downward through the layers of DESIGN.md; `python tests/test_layers.py` prints them.

    __main__ → cli, demo → eval, rl, sft, fusion → loop → harness → models, verify → tasks, sandbox, sync
              → protocols, record, registry, errors, seeding, progress

A package may import its own modules and anything in a lower layer; packages in one layer may import each
other only where `SIDEWAYS` says so (the bottom layer's modules may use each other) (rl reads eval's episode runner, sft's renaming and fusion's pair runner;
nothing imports back). Every import counts, at module level or inside a function: an import inside a function to dodge a
cycle is still an edge.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "flywheel"
LAYERS = [
    {"__main__"},
    {"cli", "demo"},
    {"eval", "rl", "sft", "fusion"},
    {"loop"},
    {"harness"},
    {"models", "verify"},
    {"tasks", "sandbox", "sync"},
    {"protocols", "record", "registry", "errors", "seeding", "progress", "__init__"},
]
SIDEWAYS = {("rl", "eval"), ("rl", "sft"), ("sft", "eval"), ("rl", "fusion")}


def layer(pkg: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if pkg in names)


def package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def edges() -> dict[tuple[str, str], set[str]]:
    """(importer package, imported package) -> the importing files."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(SRC.rglob("*.py")):
        src = package_of(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flywheel."):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("flywheel.")]
            for name in names:
                dst = name.split(".")[1]
                if dst != src:
                    out[src, dst].add(path.relative_to(SRC).as_posix())
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


if __name__ == "__main__":
    for (src, dst), files in sorted(edges().items(), key=lambda kv: (layer(kv[0][0]), kv[0])):
        print(f"{src:>9} -> {dst:<10} {len(files):3d} file(s)")
    bad = upward(edges())
    print("\n".join(["", "upward:"] + bad) if bad else "\nno import runs back up the layers")
    sys.exit(1 if bad else 0)
