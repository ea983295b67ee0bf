"""Whole or not at all: `building` and `writing` on real files, on success and on failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.files import building, writing


class Boom(Exception):
    pass


def test_building_creates_dest_with_what_the_block_wrote(tmp_path: Path) -> None:
    dest = tmp_path / "a" / "b" / "suite"
    with building(dest) as tmp:
        assert tmp.is_dir() and tmp.parent == dest.parent and not dest.exists()
        (tmp / "task.toml").write_text("id = 1\n")
    assert (dest / "task.toml").read_text() == "id = 1\n"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["suite"]


def test_building_replaces_an_old_dest_whole(tmp_path: Path) -> None:
    dest = tmp_path / "suite"
    (dest / "old").mkdir(parents=True)
    (dest / "old" / "f").write_text("old")
    with building(dest) as tmp:
        (tmp / "new").write_text("new")
    assert sorted(p.name for p in dest.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite"]


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_building_that_fails_leaves_dest_as_it_was_and_no_temporary(tmp_path: Path, error) -> None:
    dest = tmp_path / "suite"
    dest.mkdir()
    (dest / "keep").write_text("old")
    with pytest.raises(error), building(dest) as tmp:
        (tmp / "half").write_text("half")
        raise error()
    assert not tmp.exists()
    assert sorted(p.name for p in dest.iterdir()) == ["keep"]
    assert (dest / "keep").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite"]


def test_building_that_fails_with_no_old_dest_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "suite"
    with pytest.raises(Boom), building(dest):
        raise Boom()
    assert list(tmp_path.iterdir()) == []


def test_building_temporary_is_a_hidden_sibling_named_after_dest(tmp_path: Path) -> None:
    with building(tmp_path / "v000001") as tmp:
        assert tmp.name.startswith(".v000001.tmp-")
        assert list(tmp_path.glob(".v*.tmp-*")) == [tmp]


def test_writing_creates_and_replaces_a_file(tmp_path: Path) -> None:
    dest = tmp_path / "out" / "delta.bin"
    with writing(dest) as tmp:
        assert tmp.is_file() and tmp.parent == dest.parent and tmp.read_bytes() == b""
        tmp.write_bytes(b"one")
    assert dest.read_bytes() == b"one"
    with writing(dest) as tmp:
        tmp.write_bytes(b"two")
    assert dest.read_bytes() == b"two"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["delta.bin"]


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_writing_that_fails_leaves_dest_as_it_was_and_no_temporary(tmp_path: Path, error) -> None:
    dest = tmp_path / "delta.bin"
    dest.write_bytes(b"old")
    with pytest.raises(error), writing(dest) as tmp:
        tmp.write_bytes(b"half")
        raise error()
    assert not tmp.exists()
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["delta.bin"]


def test_writing_that_fails_with_no_old_dest_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(Boom), writing(tmp_path / "delta.bin"):
        raise Boom()
    assert list(tmp_path.iterdir()) == []
