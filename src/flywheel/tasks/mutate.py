"""AST mutation operators: plant one realistic bug in one function.

Each operator walks a function's AST and yields copies with one node changed. Only the mutated function
is re-rendered (`ast.unparse`) and spliced back into the original source by its line range, so the rest
of the file keeps its formatting and the reverse diff — the reference fix — stays small and local.

| kind | example |
| --- | --- |
| `flip_comparison` | `a < b` → `a <= b`, `==` → `!=` |
| `off_by_one` | `range(n)` → `range(n - 1)`, `x + 1` → `x`, `s[i]` → `s[i + 1]` |
| `swap_operands` | `a - b` → `b - a` |
| `arithmetic_operator` | `+` → `-`, `*` → `//`, `//` → `/` |
| `boolean_operator` | `and` → `or` |
| `drop_statement` | remove one statement from a block of two or more |
| `invert_condition` | `if c:` → `if not c:` |
| `wrong_return` | `return x` → `return None` |
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

KINDS = (
    "flip_comparison",
    "off_by_one",
    "swap_operands",
    "arithmetic_operator",
    "boolean_operator",
    "drop_statement",
    "invert_condition",
    "wrong_return",
)

_FLIP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_ARITH = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Div,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
_NONCOMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


@dataclass(frozen=True)
class Mutant:
    kind: str
    function: str  # qualified name: `func` or `Class.method`
    line: int  # line of the changed node in the original source
    description: str
    source: str  # the whole mutated module


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """Top-level functions and methods of top-level classes, with qualified names."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef):
                    yield f"{node.name}.{sub.name}", sub


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


# Each site function yields (node, apply) where apply(node_copy) mutates the copied node in place, or
# returns a replacement node.
Site = tuple[ast.AST, Callable[[ast.AST], ast.AST | None], str]


def _sites(fn: ast.FunctionDef, kind: str) -> Iterator[Site]:
    for node in ast.walk(fn):
        if kind == "flip_comparison" and isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _FLIP:
                    yield (
                        node,
                        (lambda n, i=i: n.ops.__setitem__(i, _FLIP[type(n.ops[i])]())),
                        "comparison flipped",
                    )
        elif (
            kind == "arithmetic_operator"
            and isinstance(node, (ast.BinOp, ast.AugAssign))
            and type(node.op) in _ARITH
        ):
            yield node, (lambda n: setattr(n, "op", _ARITH[type(n.op)]())), "arithmetic operator changed"
        elif kind == "swap_operands" and isinstance(node, ast.BinOp) and isinstance(node.op, _NONCOMMUTATIVE):
            yield node, _swap, "operands swapped"
        elif kind == "boolean_operator" and isinstance(node, ast.BoolOp):
            yield (
                node,
                (lambda n: setattr(n, "op", ast.Or() if isinstance(n.op, ast.And) else ast.And())),
                "boolean operator changed",
            )
        elif kind == "invert_condition" and isinstance(node, (ast.If, ast.While, ast.IfExp)):
            yield node, (lambda n: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test))), "condition inverted"
        elif kind == "wrong_return" and isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                yield node, (lambda n: setattr(n, "value", ast.Constant(None))), "returns None"
        elif kind == "off_by_one":
            yield from _off_by_one(node)
        elif kind == "drop_statement":
            for field in ("body", "orelse"):
                block = getattr(node, field, None)
                if (
                    not isinstance(block, list)
                    or len(block) < 2
                    or not all(isinstance(b, ast.stmt) for b in block)
                ):
                    continue
                for stmt in block:
                    if not _is_docstring(stmt) and not isinstance(stmt, ast.Return):
                        yield stmt, _DROP, "statement dropped"


def _swap(n: ast.BinOp) -> None:
    n.left, n.right = n.right, n.left


_DROP = lambda n: None  # noqa: E731 - marker: the site statement is deleted from the source


def _off_by_one(node: ast.AST) -> Iterator[Site]:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "range"
        and node.args
    ):
        idx = len(node.args) - 1 if len(node.args) <= 2 else 1
        yield (
            node,
            (lambda n, k=idx: n.args.__setitem__(k, ast.BinOp(n.args[k], ast.Sub(), ast.Constant(1)))),
            "range bound off by one",
        )
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, (ast.Add, ast.Sub))
        and isinstance(node.right, ast.Constant)
        and node.right.value == 1
    ):
        yield node, (lambda n: n.left), "+/- 1 dropped"
    if isinstance(node, ast.Subscript) and not isinstance(node.slice, (ast.Slice, ast.Constant, ast.Tuple)):
        yield (
            node,
            (lambda n: setattr(n, "slice", ast.BinOp(n.slice, ast.Add(), ast.Constant(1)))),
            "index off by one",
        )
    if (
        isinstance(node, ast.Compare)
        and len(node.comparators) == 1
        and isinstance(node.comparators[0], ast.Constant)
    ):
        value = node.comparators[0].value
        if isinstance(value, int) and not isinstance(value, bool):
            yield (
                node,
                (lambda n: setattr(n.comparators[0], "value", n.comparators[0].value + 1)),
                "bound off by one",
            )


def _path_to(root: ast.AST, target: ast.AST) -> list[tuple[str, int | None]] | None:
    if root is target:
        return []
    for field, value in ast.iter_fields(root):
        items = value if isinstance(value, list) else [value]
        for i, child in enumerate(items):
            if isinstance(child, ast.AST):
                sub = _path_to(child, target)
                if sub is not None:
                    return [(field, i if isinstance(value, list) else None), *sub]
    return None


def _follow(root: ast.AST, path: list[tuple[str, int | None]]) -> ast.AST:
    for field, index in path:
        root = getattr(root, field) if index is None else getattr(root, field)[index]
    return root


def _set(root: ast.AST, path: list[tuple[str, int | None]], new: ast.AST) -> None:
    parent, (field, index) = _follow(root, path[:-1]), path[-1]
    if index is None:
        setattr(parent, field, new)
    else:
        getattr(parent, field)[index] = new


def _innermost_stmt(path: list[tuple[str, int | None]], root: ast.AST) -> int:
    """Length of the longest prefix of `path` that ends on a statement."""
    best, node = 0, root
    for depth, (field, index) in enumerate(path, 1):
        node = getattr(node, field) if index is None else getattr(node, field)[index]
        if isinstance(node, ast.stmt):
            best = depth
    return best


def _splice(lines: list[str], original: ast.stmt, mutated: ast.stmt) -> list[str] | None:
    """Source lines with `original`'s text replaced by `mutated` (a header only, for compound statements)."""
    first = lines[original.lineno - 1]
    indent = first[: len(first) - len(first.lstrip())]
    text = ast.unparse(mutated).splitlines()
    if hasattr(original, "body") and isinstance(original.body, list):
        header, stop = text[0], original.body[0].lineno - 1
        if first.lstrip().startswith("elif ") and header.startswith("if "):
            header = "el" + header
        new = [indent + header + "\n"]
    else:
        new, stop = [indent + ln + "\n" for ln in text], original.end_lineno or original.lineno
    return lines[: original.lineno - 1] + new + lines[stop:]


def mutants(source: str, kinds: tuple[str, ...] = KINDS) -> list[Mutant]:
    """Every single-site mutant of every function in `source`, deduplicated, in a stable order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out: list[Mutant] = []
    seen = {source}
    for name, fn in functions(tree):
        for kind in kinds:
            for node, apply, desc in list(_sites(fn, kind)):
                mutated = _mutate(lines, fn, node, apply)
                if mutated is None or mutated in seen:
                    continue
                try:
                    ast.parse(mutated)
                except SyntaxError:
                    continue
                seen.add(mutated)
                out.append(Mutant(kind, name, getattr(node, "lineno", fn.lineno), desc, mutated))
    return out


def _mutate(lines: list[str], fn: ast.FunctionDef, node: ast.AST, apply) -> str | None:
    if apply is _DROP:
        assert isinstance(node, ast.stmt)
        return "".join(lines[: node.lineno - 1] + lines[node.end_lineno or node.lineno :])
    path = _path_to(fn, node)
    if not path:
        return None
    clone = copy.deepcopy(fn)
    target = _follow(clone, path)
    replacement = apply(target)
    if replacement is not None and replacement is not target:
        _set(clone, path, replacement)
    depth = _innermost_stmt(path, fn)
    if depth == 0:
        return None
    original_stmt, mutated_stmt = _follow(fn, path[:depth]), _follow(clone, path[:depth])
    try:
        ast.fix_missing_locations(mutated_stmt)
        if ast.unparse(mutated_stmt) == ast.unparse(original_stmt):
            return None
        spliced = _splice(lines, original_stmt, mutated_stmt)
    except (ValueError, AttributeError, IndexError):
        return None
    return "".join(spliced) if spliced else None
