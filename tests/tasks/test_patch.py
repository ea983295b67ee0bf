import pytest

from flywheel.errors import PatchError
from flywheel.tasks.patch import apply_patch, make_patch, parse_patch

OLD = {"a.py": "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n", "gone.py": "x = 1\n"}
NEW = {"a.py": "one\nTWO\nthree\nfour\nfive\nsix\nseven\neight\nnine\nTEN\neleven\n", "new/b.py": "print(1)"}


def test_round_trip_modify_create_delete():
    patch = make_patch(OLD, NEW)
    assert "--- /dev/null" in patch and "+++ /dev/null" in patch
    assert apply_patch(OLD, patch) == NEW


def test_reverse_patch_restores():
    assert apply_patch(NEW, make_patch(NEW, OLD)) == OLD


def test_no_newline_at_end_round_trips():
    old, new = {"f": "a\nb"}, {"f": "a\nc"}
    patch = make_patch(old, new)
    assert "No newline" in patch
    assert apply_patch(old, patch) == new


def test_identical_maps_give_empty_patch():
    assert make_patch(OLD, OLD) == ""
    assert apply_patch(OLD, "") == OLD


def test_mismatched_context_is_refused_and_input_untouched():
    patch = make_patch(OLD, NEW)
    drifted = dict(OLD, **{"a.py": OLD["a.py"].replace("three", "3")})
    before = dict(drifted)
    with pytest.raises(PatchError, match="a.py, hunk 1"):
        apply_patch(drifted, patch)
    assert drifted == before


def test_missing_file_and_existing_creation_are_refused():
    patch = make_patch(OLD, NEW)
    with pytest.raises(PatchError, match="does not exist"):
        apply_patch({"gone.py": "x = 1\n"}, patch)
    with pytest.raises(PatchError, match="already exists"):
        apply_patch(dict(OLD, **{"new/b.py": "x"}), patch)


@pytest.mark.parametrize(
    "bad",
    ["--- a/x\nnot a header\n", "--- a/x\n+++ b/x\n@@ nonsense @@\n", "random text with no headers\n"],
)
def test_malformed_patches_raise(bad):
    with pytest.raises(PatchError):
        parse_patch(bad)


def test_paths_outside_the_repository_are_refused():
    with pytest.raises(PatchError, match="outside"):
        parse_patch("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n")
