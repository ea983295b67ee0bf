"""How the disk budget measures a workspace: what counts, and what cannot hide (`disk.py`)."""

from __future__ import annotations

import os

from flywheel.sandbox.disk import BLOCK, DiskBudget, tree_bytes

MB = 1024 * 1024


def test_files_count_whole_blocks_and_at_least_one(tmp_path):
    (tmp_path / "empty").touch()
    (tmp_path / "small").write_bytes(b"x")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "big").write_bytes(b"x" * (BLOCK + 1))
    assert tree_bytes([tmp_path]) == BLOCK + BLOCK + BLOCK + 2 * BLOCK  # empty, small, d, big


def test_sparse_files_count_their_apparent_size(tmp_path):
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(64 * MB)  # no block allocated, but a copy of it would take 64 MiB
    assert tree_bytes([tmp_path]) == 64 * MB


def test_many_empty_files_add_up(tmp_path):
    for i in range(1000):
        (tmp_path / str(i)).touch()
    assert tree_bytes([tmp_path]) == 1000 * BLOCK


def test_hard_links_count_once_and_symlinks_are_not_followed(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * MB)
    os.link(tmp_path / "a", tmp_path / "b")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big").write_bytes(b"x" * MB)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.link(tmp_path / "a", ws / "a")
    os.link(tmp_path / "a", ws / "b")
    (ws / "link").symlink_to(tmp_path / "outside")
    assert tree_bytes([ws]) == MB + BLOCK


def test_the_walk_stops_once_over_the_limit(tmp_path):
    for i in range(10):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f").write_bytes(b"x" * MB)
    assert tree_bytes([tmp_path]) == 10 * (MB + BLOCK)
    assert tree_bytes([tmp_path], stop_above=2 * MB) < 10 * MB


def test_budget_measures_every_root(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "r").write_bytes(b"x" * 2 * MB)
    assert DiskBudget([tmp_path / "ws", tmp_path / "report"], MB).exceeded()
    assert not DiskBudget([tmp_path / "ws", tmp_path / "report"], 3 * MB).exceeded()
    assert "disk budget of 1 MiB" in DiskBudget([], MB).note()
