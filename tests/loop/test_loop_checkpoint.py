"""Checkpoints: atomic, verified, replicated to the peer, restored from it when the local copy is bad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flywheel.loop.checkpoint import Checkpointer, verify
from flywheel.sync import DeltaError, FsspecStore, Publisher, Subscriber


class Counter:
    """A trainer-shaped object whose state is one number (what the checkpoint layer needs)."""

    def __init__(self, value: int = 0) -> None:
        self.version = value

    def save(self, dir: Path) -> None:
        dir.mkdir()
        (dir / "state.json").write_text(json.dumps({"version": self.version, "pad": "x" * 1000}))

    def load(self, dir: Path) -> None:
        self.version = json.loads((dir / "state.json").read_text())["version"]


def saved(tmp_path: Path, versions: range, keep: int = 2) -> Checkpointer:
    ck = Checkpointer(tmp_path / "local", FsspecStore(str(tmp_path / "peer")), keep=keep)
    for v in versions:
        ck.replicate(ck.save(Counter(v), {"round": v}))
    return ck


def test_save_replicate_restore_and_prune(tmp_path):
    ck = saved(tmp_path, range(1, 5))
    assert [p.name for p in ck.local_dirs()] == ["v00000004", "v00000003"]  # keep=2
    assert all(verify(p) for p in ck.local_dirs())
    t = Counter()
    assert ck.restore(t) == {"round": 4} and t.version == 4 and ck.source == "local"


def test_corrupt_local_falls_back_to_the_peer(tmp_path):
    ck = saved(tmp_path, range(1, 4))
    state = tmp_path / "local" / "v00000003" / "trainer" / "state.json"
    state.write_text(state.read_text().replace("x", "y", 1))  # one flipped byte
    t = Counter()
    assert ck.restore(t) == {"round": 3} and t.version == 3
    assert ck.source == "peer" and ck.skipped == ["v00000003"]
    assert verify(tmp_path / "local" / "v00000003")  # replaced by the peer's verified copy


def test_local_gone_and_incomplete_peer(tmp_path):
    saved(tmp_path, range(1, 3))
    import shutil

    shutil.rmtree(tmp_path / "local")
    t = Counter()
    fresh = Checkpointer(tmp_path / "local", FsspecStore(str(tmp_path / "peer")))
    assert fresh.restore(t) == {"round": 2} and t.version == 2 and fresh.source == "peer"
    # a peer upload cut short before its manifest: LATEST still names the last complete one
    peer = FsspecStore(str(tmp_path / "peer"))
    peer.put("checkpoints/v00000003/trainer/state.json", b"{}")
    t = Counter()
    assert Checkpointer(tmp_path / "other", peer).restore(t) == {"round": 2} and t.version == 2
    assert Checkpointer(tmp_path / "none", None).restore(Counter()) is None


def test_publisher_start_resumes_or_refuses(tmp_path):
    g = torch.Generator().manual_seed(0)
    w0 = {"a": torch.randn(64, generator=g).bfloat16()}
    w1 = {"a": w0["a"].clone()}
    w1["a"][:3] += 1
    store = FsspecStore(str(tmp_path / "w"))
    pub = Publisher(store, anchor_every=5)
    assert pub.start(w0, 0).kind == "anchor"
    pub.publish(w1, 1)
    again = Publisher(store, anchor_every=5)  # a restarted trainer at version 1
    assert again.start(w1, 1) is None and again.anchor_version == 0 and again.since_anchor == 1
    w2 = {"a": w1["a"].clone()}
    w2["a"][10] += 1
    assert again.publish(w2, 2).kind == "delta"
    sub = Subscriber(store)
    assert sub.catch_up() == 2 and torch.equal(sub.weights["a"], w2["a"])
    with pytest.raises(DeltaError, match="ahead"):
        Publisher(store).start(w1, 1)
    with pytest.raises(DeltaError, match="other weights"):
        Publisher(store).start(w1, 2)


def test_the_peer_keeps_only_the_newest_checkpoints(tmp_path):
    saved(tmp_path, range(1, 6), keep=2)
    peer = FsspecStore(str(tmp_path / "peer"))
    names = {k.split("/")[1] for k in peer.list("checkpoints/") if k.count("/") >= 2}
    assert names == {"v00000005", "v00000004"}
    assert sorted(p.name for p in (tmp_path / "peer" / "checkpoints").iterdir()) == [
        "LATEST",
        "v00000004",
        "v00000005",
    ]
    # a deletion cut short (manifest gone, a file left) is finished by the next start, which restores the newest
    peer.put("checkpoints/v00000002/trainer/state.json", b"{}")
    t = Counter()
    assert Checkpointer(tmp_path / "other", peer, keep=2).restore(t) == {"round": 5} and t.version == 5
    assert not (tmp_path / "peer" / "checkpoints" / "v00000002").exists()
    peer.delete("checkpoints/v00000002/trainer/state.json")  # deleting what is gone is not an error
