"""AST mutation operators: plant one realistic bug at one site of one function.

`mutants(source)` is a pure function of the module text. It walks the body of every top-level function
and every method of a top-level class, and for each site an operator accepts it yields one candidate:

| kind | example |
| --- | --- |
| `flip_comparison` | `a < b` -> `a <= b`, `==` -> `!=`, `in` -> `not in` |
| `off_by_one` | `range(n)` -> `range(n - 1)`, `x + 1` -> `x`, `s[i]` -> `s[i + 1]`, `> 0` -> `> 1` |
| `swap_operands` | `a - b` -> `b - a`, `f(x, y)` -> `f(y, x)` |
| `arithmetic_operator` | `+` <-> `-`, `*` <-> `/`, `//` -> `/`, `%` -> `//` (also in `+=` and friends) |
| `boolean_operator` | `and` <-> `or` |
| `drop_statement` | remove one statement from a block of two or more (never the docstring) |
| `invert_condition` | `if c:` -> `if not c:`, `if a < b:` -> `if a >= b:` (also `while`, `x if c else y`) |
| `wrong_return` | `return x` -> `return None`, `return True` -> `return False`, `return x` -> `return y` |

The mutated node is applied to a copy of the function's AST, and the edit is written back into the
original text as narrowly as possible: an operator token is replaced in place, a swapped pair keeps the
two operands' own text, an expression is replaced by its `ast.unparse` (with double quotes, as the
modules are written). Every splice is checked by parsing the result and comparing its AST with the
mutated AST; if a narrow splice would change the meaning (operator precedence, say), wider ones are
tried, ending with the whole top-level definition re-rendered. So the rest of the file keeps its
formatting and the reverse diff, the reference fix, stays a line or two.

Candidates are deduplicated by resulting text; a candidate identical to the original is dropped.
Whether a candidate is a bug worth a task (some test fails, some still passes) is decided elsewhere.
"""

from __future__ import annotations

import ast
import copy
import io
import tokenize
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


@dataclass(frozen=True)
class Mutant:
    """One candidate bug: the whole mutated module text and where the change is."""

    kind: str
    function: str  # "name" or "Class.method"
    line: int  # 1-based line of the changed node in the original text
    description: str
    source: str


# An edit names the node it changes; `apply` gets that node's twin in a deep copy of the function and
# returns its replacement (or None after changing it in place); `splices` proposes text replacements.
@dataclass(frozen=True)
class _Edit:
    kind: str
    description: str
    node: ast.AST
    apply: Callable[[ast.AST], ast.AST | None]
    splices: Callable[[_Text], list[tuple[tuple[int, int], str]]]  # (char span, new text), narrowest first


_CMP_FLIP = {
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
_COMPLEMENT = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.LtE: ast.Gt,
    ast.Gt: ast.LtE,
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
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_SYMBOL = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.And: "and",
    ast.Or: "or",
}
_COMPOUND = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)
_NO_SWAP_CALLS = {"isinstance", "issubclass", "getattr", "hasattr", "setattr", "max", "min", "divmod"}


# ----------------------------------------------------------------------------------------- public


def mutants(source: str, kinds: tuple[str, ...] | list[str] = KINDS) -> list[Mutant]:
    """Every distinct single-site mutant of `source`, in order of function, operator and site."""
    tree = ast.parse(source)
    text = _Text(source)
    seen = {source}
    out: list[Mutant] = []
    for top_index, qualname, func in _functions(tree):
        for edit in _edits(func, kinds):
            mutated = _render(text, tree, top_index, func, edit)
            if mutated is None or mutated in seen:
                continue
            seen.add(mutated)
            out.append(Mutant(edit.kind, qualname, edit.node.lineno, edit.description, mutated))
    return out


def functions(source: str) -> list[str]:
    """Qualified names of the functions `mutants` looks into."""
    return [name for _, name, _ in _functions(ast.parse(source))]


# ------------------------------------------------------------------------------------ enumeration


def _functions(tree: ast.Module) -> Iterator[tuple[int, str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for i, node in enumerate(tree.body):
        if isinstance(node, defs):
            yield i, node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, defs):
                    yield i, f"{node.name}.{sub.name}", sub


def _body_nodes(func: ast.AST) -> list[ast.AST]:
    """Nodes of the function body (not its signature or decorators), breadth first per statement."""
    return [n for stmt in func.body for n in ast.walk(stmt)]


def _edits(func: ast.AST, kinds) -> Iterator[_Edit]:
    operators = {
        "flip_comparison": _flip_comparison,
        "off_by_one": _off_by_one,
        "swap_operands": _swap_operands,
        "arithmetic_operator": _arithmetic_operator,
        "boolean_operator": _boolean_operator,
        "drop_statement": _drop_statement,
        "invert_condition": _invert_condition,
        "wrong_return": _wrong_return,
    }
    nodes = [func] + [n for n in _body_nodes(func) if not _is_docstring_holder(n)]
    for kind in KINDS:
        if kind in kinds:
            for node in nodes:
                yield from operators[kind](node, func)


def _is_docstring_holder(node: ast.AST) -> bool:
    """A bare string statement (a docstring or a string used as a comment)."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


# ------------------------------------------------------------------------------------- operators


def _flip_comparison(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    if not isinstance(node, ast.Compare):
        return
    for k, op in enumerate(node.ops):
        new = _CMP_FLIP.get(type(op))
        if new is None:
            continue
        old_sym, new_sym = _SYMBOL[type(op)], _SYMBOL[new]
        left = node.left if k == 0 else node.comparators[k - 1]
        yield _Edit(
            "flip_comparison",
            f"`{old_sym}` -> `{new_sym}`",
            node,
            _set_list_item("ops", k, new),
            _token_swap([(left, node.comparators[k])], old_sym, new_sym, node),
        )


def _arithmetic_operator(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH and not _is_text_op(node):
        new = _ARITH[type(node.op)]
        old_sym, new_sym = _SYMBOL[type(node.op)], _SYMBOL[new]
        yield _Edit(
            "arithmetic_operator",
            f"`{old_sym}` -> `{new_sym}`",
            node,
            _set_attr("op", new),
            _token_swap([(node.left, node.right)], old_sym, new_sym, node),
        )
    elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITH and not _is_text(node.value):
        new = _ARITH[type(node.op)]
        old_sym, new_sym = _SYMBOL[type(node.op)] + "=", _SYMBOL[new] + "="
        yield _Edit(
            "arithmetic_operator",
            f"`{old_sym}` -> `{new_sym}`",
            node,
            _set_attr("op", new),
            _token_swap([(node.target, node.value)], old_sym, new_sym, node),
        )


def _boolean_operator(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    if not isinstance(node, ast.BoolOp):
        return
    new = ast.Or if isinstance(node.op, ast.And) else ast.And
    old_sym, new_sym = _SYMBOL[type(node.op)], _SYMBOL[new]
    pairs = list(zip(node.values, node.values[1:], strict=False))
    yield _Edit(
        "boolean_operator", f"`{old_sym}` -> `{new_sym}`", node, _set_attr("op", new), _token_swap(pairs, old_sym, new_sym, node)
    )


def _swap_operands(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, _NON_COMMUTATIVE):
        if ast.dump(node.left) != ast.dump(node.right):
            yield _Edit("swap_operands", "swapped operands", node, _swap_fields("left", "right"), _pair_swap(node.left, node.right, node))
    elif isinstance(node, ast.Call) and len(node.args) == 2 and not any(isinstance(a, ast.Starred) for a in node.args):
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name not in _NO_SWAP_CALLS and ast.dump(node.args[0]) != ast.dump(node.args[1]):
            yield _Edit(
                "swap_operands", f"swapped the arguments of `{name}`", node, _swap_args, _pair_swap(node.args[0], node.args[1], node)
            )


def _off_by_one(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range" and node.args:
        if len(node.args) <= 2 and not _is_plus_minus_one(node.args[-1]):
            yield _shift_edit(node.args[-1], -1, "range bound `n` -> `n - 1`")
        if len(node.args) == 2 and not _is_plus_minus_one(node.args[0]):
            yield _shift_edit(node.args[0], +1, "range start `a` -> `a + 1`")
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub) and _is_int(node.right, 1):
        yield _Edit("off_by_one", "dropped a `± 1`", node, lambda n: n.left, _replace_with_segment(node, node.left))
    elif isinstance(node, ast.Compare):
        for operand in [node.left, *node.comparators]:
            if _is_int(operand) and not isinstance(operand.value, bool):
                yield _shift_edit(operand, +1, "bound `c` -> `c + 1`")
                if operand.value > 0:
                    yield _shift_edit(operand, -1, "bound `c` -> `c - 1`")
    elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        index = node.slice
        if isinstance(index, ast.Slice):
            if index.lower is not None and _shiftable(index.lower):
                yield _shift_edit(index.lower, +1, "slice start `i` -> `i + 1`")
            if index.upper is not None and _shiftable(index.upper):
                yield _shift_edit(index.upper, -1, "slice end `j` -> `j - 1`")
        elif _shiftable(index):
            yield _shift_edit(index, +1, "index `i` -> `i + 1`")


def _drop_statement(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if not isinstance(block, list) or len(block) < 2 or isinstance(node, ast.Module | ast.ClassDef):
            continue
        for stmt in block:
            if not isinstance(stmt, ast.stmt) or _is_docstring_holder(stmt):
                continue
            if isinstance(stmt, (ast.Pass, ast.Global, ast.Nonlocal, *_COMPOUND)):
                continue
            yield _Edit("drop_statement", f"removed `{_first_line(stmt)}`", stmt, _drop, _drop_lines(stmt))


def _invert_condition(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    if not isinstance(node, ast.If | ast.While | ast.IfExp):
        return
    test = node.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPLEMENT:
        old, new = type(test.ops[0]), _COMPLEMENT[type(test.ops[0])]
        pair = [(test.left, test.comparators[0])]
        yield _Edit(
            "invert_condition",
            f"negated a condition (`{_SYMBOL[old]}` -> `{_SYMBOL[new]}`)",
            test,
            _set_list_item("ops", 0, new),
            _token_swap(pair, _SYMBOL[old], _SYMBOL[new], test),
        )
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yield _Edit("invert_condition", "removed a `not`", test, lambda n: n.operand, _replace_with_segment(test, test.operand))
    else:
        yield _Edit("invert_condition", "negated a condition", test, _negate, _negate_text(test))


def _wrong_return(node: ast.AST, func: ast.AST) -> Iterator[_Edit]:
    if not isinstance(node, ast.Return) or node.value is None or func.name == "__init__":
        return
    value = node.value
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        flipped = ast.Constant(not value.value)
        yield _Edit("wrong_return", f"`return {value.value}` -> `return {not value.value}`", value, _const(flipped), _unparse_at(value, flipped))
        return
    if not (isinstance(value, ast.Constant) and value.value is None):
        yield _Edit("wrong_return", "`return ...` -> `return None`", value, _const(ast.Constant(None)), _unparse_at(value, ast.Constant(None)))
    if isinstance(value, ast.Name):
        other = _other_local(func, value.id, node.lineno)
        if other is not None:
            name = ast.Name(other, ast.Load())
            yield _Edit("wrong_return", f"`return {value.id}` -> `return {other}`", value, _const(name), _unparse_at(value, name))


# ------------------------------------------------------------------------------ operator helpers


def _is_int(node: ast.AST, value: int | None = None) -> bool:
    return (
        isinstance(node, ast.Constant)
        and type(node.value) is int
        and (value is None or node.value == value)
    )


def _is_plus_minus_one(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub) and _is_int(node.right, 1)


def _shiftable(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) or (_is_int(node) and node.value >= 0)


def _is_text(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)) or isinstance(
        node, ast.JoinedStr | ast.List | ast.Tuple | ast.ListComp
    )


def _is_text_op(node: ast.BinOp) -> bool:
    """String or sequence concatenation/formatting, where a changed operator is only a crash."""
    return _is_text(node.left) or _is_text(node.right)


def _first_line(stmt: ast.stmt) -> str:
    return ast.unparse(stmt).splitlines()[0].strip()


def _other_local(func: ast.AST, name: str, before_line: int) -> str | None:
    """The local name assigned (or a parameter) most recently before `before_line`, other than `name`."""
    candidates: list[tuple[int, str]] = [(func.lineno, a.arg) for a in func.args.args if a.arg not in ("self", "cls")]
    for n in _body_nodes(func):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.lineno < before_line:
            candidates.append((n.lineno, n.id))
    candidates = [c for c in candidates if c[1] != name]
    return max(candidates)[1] if candidates else None


def _set_attr(field: str, op_type: type) -> Callable[[ast.AST], None]:
    def apply(n: ast.AST) -> None:
        setattr(n, field, op_type())

    return apply


def _set_list_item(field: str, k: int, op_type: type) -> Callable[[ast.AST], None]:
    def apply(n: ast.AST) -> None:
        getattr(n, field)[k] = op_type()

    return apply


def _swap_fields(a: str, b: str) -> Callable[[ast.AST], None]:
    def apply(n: ast.AST) -> None:
        x, y = getattr(n, a), getattr(n, b)
        setattr(n, a, y)
        setattr(n, b, x)

    return apply


def _swap_args(n: ast.Call) -> None:
    n.args[0], n.args[1] = n.args[1], n.args[0]


def _const(replacement: ast.AST) -> Callable[[ast.AST], ast.AST]:
    return lambda n: copy.deepcopy(replacement)


def _negate(n: ast.AST) -> ast.AST:
    return ast.UnaryOp(ast.Not(), n)


_DROPPED = ast.Pass()  # sentinel returned by an edit's `apply`: remove the statement from its block


def _drop(n: ast.AST) -> ast.AST:
    return _DROPPED


def _shift_edit(node: ast.AST, delta: int, description: str) -> _Edit:
    if _is_int(node):
        new = ast.Constant(node.value + delta)
        return _Edit("off_by_one", description, node, _const(new), _unparse_at(node, new))
    op = ast.Add() if delta > 0 else ast.Sub()
    sym = "+" if delta > 0 else "-"

    def apply(n: ast.AST) -> ast.AST:
        return ast.BinOp(n, op, ast.Constant(1))

    def splices(text: _Text) -> list[tuple[tuple[int, int], str]]:
        span = _span(text, node)
        seg = text[span[0] : span[1]]
        return [(span, f"{seg} {sym} 1"), (span, f"({seg}) {sym} 1")]

    return _Edit("off_by_one", description, node, apply, splices)


# --------------------------------------------------------------------------------- text splices


class _Text:
    """Line offsets of a source text, to turn AST (line, byte column) positions into char offsets."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode())

    def __getitem__(self, part: slice) -> str:
        return self.source[part]


def _span(text: _Text, node: ast.AST) -> tuple[int, int]:
    return text.offset(node.lineno, node.col_offset), text.offset(node.end_lineno, node.end_col_offset)


def _token_swap(pairs, old_sym: str, new_sym: str, node: ast.AST):
    """Replace the operator between each (left, right) pair in place, keeping all other text."""

    def splices(text: _Text) -> list[tuple[tuple[int, int], str]]:
        span = _span(text, node)
        pieces, cursor = [], span[0]
        for left, right in pairs:
            gap_start, gap_end = _span(text, left)[1], _span(text, right)[0]
            gap = text[gap_start:gap_end]
            bare = gap.replace("(", " ").replace(")", " ")
            if " ".join(bare.split()) != old_sym:
                return []
            at = gap.find(old_sym.split()[0])
            pieces.append(text[cursor:gap_start] + gap[:at] + gap[at:].replace(old_sym, new_sym, 1))
            cursor = gap_end
        return [(span, "".join(pieces) + text[cursor : span[1]])]

    return splices


def _pair_swap(a: ast.AST, b: ast.AST, node: ast.AST):
    """Swap the text of two operands, keeping what lies between them."""

    def splices(text: _Text) -> list[tuple[tuple[int, int], str]]:
        (a0, a1), (b0, b1) = _span(text, a), _span(text, b)
        swapped = text[b0:b1] + text[a1:b0] + text[a0:a1]
        return [((a0, b1), swapped), ((a0, b1), f"({text[b0:b1]}){text[a1:b0]}({text[a0:a1]})")]

    return splices


def _replace_with_segment(node: ast.AST, inner: ast.AST):
    def splices(text: _Text) -> list[tuple[tuple[int, int], str]]:
        s, i = _span(text, node), _span(text, inner)
        seg = text[i[0] : i[1]]
        return [(s, seg), (s, f"({seg})")]

    return splices


def _negate_text(test: ast.AST):
    def splices(text: _Text) -> list[tuple[tuple[int, int], str]]:
        s = _span(text, test)
        seg = text[s[0] : s[1]]
        return [(s, f"not {seg}"), (s, f"not ({seg})")]

    return splices


def _unparse_at(node: ast.AST, replacement: ast.AST):
    def splices(text: _Text) -> list[tuple[tuple[int, int], str]]:
        s = _span(text, node)
        rendered = unparse(replacement)
        return [(s, rendered), (s, f"({rendered})")]

    return splices


def _drop_lines(stmt: ast.stmt):
    """Remove the statement's whole lines, when it has them to itself."""

    def splices(text: _Text) -> list[tuple[tuple[int, int], str]]:
        start, end = _span(text, stmt)
        line_start, line_end = text.starts[stmt.lineno - 1], text.starts[stmt.end_lineno]
        before, after = text[line_start:start], text[end:line_end]
        if before.strip() or (after.strip() and not after.strip().startswith("#")):
            return []
        return [((line_start, line_end), "")]

    return splices


def unparse(node: ast.AST) -> str:
    """`ast.unparse` with plain single-quoted string literals turned to double quotes."""
    rendered = ast.unparse(node)
    if "'" not in rendered:
        return rendered
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(rendered).readline))
    except (tokenize.TokenError, SyntaxError):
        return rendered
    text = _Text(rendered)
    out, cursor = [], 0
    for tok in tokens:
        body = tok.string[1:-1]
        plain = tok.string.startswith("'") and not tok.string.startswith("'''")
        if tok.type == tokenize.STRING and plain and '"' not in body and "\\" not in body:
            start = text.starts[tok.start[0] - 1] + tok.start[1]  # tokenize columns count characters
            end = text.starts[tok.end[0] - 1] + tok.end[1]
            out.append(rendered[cursor:start] + f'"{body}"')
            cursor = end
    return "".join(out) + rendered[cursor:]


# ------------------------------------------------------------------------------------- rendering


def _render(text: _Text, tree: ast.Module, top_index: int, func: ast.AST, edit: _Edit) -> str | None:
    """The mutated module text, or None when the edit cannot be rendered faithfully.

    The edit is applied to the tree in place and undone afterwards (cheaper than copying the tree for
    every site); each proposed splice is kept only if it parses back to exactly the mutated tree.
    """
    top = tree.body[top_index]
    first, last = _first_line_of(top), top.end_lineno
    if func is not top:
        first, last = _first_line_of(func), func.end_lineno
    lo, hi = text.starts[first - 1], text.starts[last]
    splices = [s for s in edit.splices(text) if lo <= s[0][0] <= s[0][1] <= hi]
    undo = _apply(func, edit)
    try:
        for (start, end), replacement in splices:
            region = text[lo:start] + replacement + text[end:hi]
            if _matches(region, func, func is not top):
                return text[:lo] + region + text[hi:]
        # fallback: the whole top-level definition, re-rendered
        start, end = text.starts[_first_line_of(top) - 1], text.starts[top.end_lineno]
        region = unparse(top) + "\n"
        if _matches(region, top, False):
            return text[:start] + region + text[end:]
        return None
    finally:
        undo()


def _first_line_of(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _apply(func: ast.AST, edit: _Edit) -> Callable[[], None]:
    """Apply `edit` to `func` in place; returns the function that undoes it."""
    node = edit.node
    parent, field, k = _parent(func, node)
    saved_parent = list(getattr(parent, field)) if k is not None else getattr(parent, field)
    saved_node = {f: _shallow(getattr(node, f, None)) for f in node._fields}
    replacement = edit.apply(node)
    if replacement is _DROPPED:
        getattr(parent, field).pop(k)
    elif replacement is not None and k is None:
        setattr(parent, field, replacement)
    elif replacement is not None:
        getattr(parent, field)[k] = replacement

    def undo() -> None:
        for f, v in saved_node.items():
            setattr(node, f, _shallow(v))
        setattr(parent, field, _shallow(saved_parent))

    return undo


def _shallow(value):
    return list(value) if isinstance(value, list) else value


def _parent(root: ast.AST, target: ast.AST) -> tuple[ast.AST, str, int | None]:
    for node in ast.walk(root):
        for field, value in ast.iter_fields(node):
            if value is target:
                return node, field, None
            if isinstance(value, list):
                for k, item in enumerate(value):
                    if item is target:
                        return node, field, k
    raise ValueError("node not found in its function")


def _matches(region: str, node: ast.AST, is_method: bool) -> bool:
    """Whether the text `region` parses to exactly the (mutated) definition `node`."""
    try:
        parsed = ast.parse("class _:\n" + region if is_method else region)
    except SyntaxError:
        return False
    body = parsed.body[0].body if is_method else parsed.body
    return len(body) == 1 and _same(node, body[0])


def _same(a, b) -> bool:
    """Structural equality of two ASTs, ignoring positions."""
    if type(a) is not type(b):
        return False
    if isinstance(a, ast.AST):
        return all(_same(getattr(a, f, None), getattr(b, f, None)) for f in a._fields)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b
