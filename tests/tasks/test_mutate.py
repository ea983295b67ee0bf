import ast

import pytest

from flywheel.tasks.mutate import KINDS, mutants

SOURCE = '''def f(xs, n):
    """Doc."""
    total = 0
    for i in range(n):
        if xs[i] > 0 and i != 3:
            total += xs[i] * 2
        elif xs[i] == -1:
            total = total - 1
    return total


class Box:
    def size(self, a, b):
        # a comment that must survive
        return a - b
'''


def changed_lines(a, b):
    la, lb = a.splitlines(), b.splitlines()
    return [x for x in lb if x not in la], [x for x in la if x not in lb]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_gives_valid_different_programs(kind):
    found = [m for m in mutants(SOURCE) if m.kind == kind]
    assert found, kind
    for m in found:
        ast.parse(m.source)
        assert m.source != SOURCE


def test_mutations_are_local_and_keep_the_rest_of_the_file():
    for m in mutants(SOURCE):
        added, removed = changed_lines(SOURCE, m.source)
        assert len(added) <= 1 and len(removed) <= 5, m
        assert "# a comment that must survive" in m.source


def test_examples():
    sources = {m.source for m in mutants(SOURCE)}
    assert SOURCE.replace("xs[i] > 0", "xs[i] >= 0") in sources
    assert SOURCE.replace("range(n)", "range(n - 1)") in sources
    assert SOURCE.replace("return a - b", "return b - a") in sources
    assert SOURCE.replace(" and i != 3", " or i != 3") in sources
    assert SOURCE.replace("elif xs[i] == -1:", "elif not xs[i] == -1:") in sources
    assert SOURCE.replace("return total\n", "return None\n") in sources
    assert SOURCE.replace("    total = 0\n", "") in sources


def test_methods_are_named_with_their_class_and_mutants_are_unique():
    ms = mutants(SOURCE)
    assert {"f", "Box.size"} <= {m.function for m in ms}
    assert len({m.source for m in ms}) == len(ms)
    assert mutants(SOURCE) == ms  # deterministic
