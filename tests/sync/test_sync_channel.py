"""Publisher and Subscriber over the file:// store: chains, anchors, recovery, prefetch."""

from __future__ import annotations

import json

from sync_helpers import bitwise, clone, ulp_step, versions

from flywheel.sync import FsspecStore, Publisher, Subscriber, latest_version
from flywheel.sync.channel import marker_key


def test_store_put_get_list(tmp_path):
    store = FsspecStore(f"file://{tmp_path}/w")
    store.put("a/b.bin", b"xyz")
    assert store.get("a/b.bin") == b"xyz" and store.exists("a/b.bin") and not store.exists("a/c")
    store.put("a/b.bin", b"new")
    assert store.get("a/b.bin") == b"new"
    assert store.list("a/") == ["a/b.bin"]
    assert store.list("missing/") == []


def test_subscriber_follows_deltas_in_place(tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    vs = versions(5)
    pub = Publisher(store, anchor_every=100)
    kinds = [pub.publish(w, v).kind for v, w in enumerate(vs)]
    assert kinds == ["anchor", "delta", "delta", "delta", "delta"]
    sub = Subscriber(store, clone(vs[1]), 1)
    ptrs = {n: t.data_ptr() for n, t in sub.weights.items()}
    assert sub.catch_up() == 4
    assert bitwise(sub.weights, vs[4]) and {n: t.data_ptr() for n, t in sub.weights.items()} == ptrs
    assert sub.recoveries == 0 and sub.catch_up() == 4


def test_fresh_subscriber_bootstraps_from_anchor(tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    vs = versions(6)
    pub = Publisher(store, anchor_every=3)
    kinds = [pub.publish(w, 10 + v).kind for v, w in enumerate(vs)]
    assert kinds == ["anchor", "delta", "delta", "delta+anchor", "delta", "delta"]
    sub = Subscriber(store)
    assert sub.catch_up() == 15 and bitwise(sub.weights, vs[5])
    assert latest_version(store) == 15


def test_corrupt_delta_recovers_from_anchor_and_chain(tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    vs = versions(6)
    pub = Publisher(store, anchor_every=3)
    for v, w in enumerate(vs):
        pub.publish(w, v)
    sub = Subscriber(store, clone(vs[2]), 2)
    marker = json.loads(store.get(marker_key(3)))  # version 3 has a delta and an anchor
    blob = bytearray(store.get(marker["delta"]["key"]))
    blob[-10] ^= 0xFF
    store.put(marker["delta"]["key"], bytes(blob))  # damaged in storage after publishing
    assert sub.catch_up() == 5
    assert bitwise(sub.weights, vs[5]) and sub.recoveries == 1
    assert "does not match its marker" in (sub.last_error or "")


def test_wrong_base_recovers(tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    vs = versions(4)
    pub = Publisher(store, anchor_every=2)
    for v, w in enumerate(vs):
        pub.publish(w, v)
    wrong = ulp_step(vs[2], 0.01, seed=77)  # claims version 2, holds other bits
    sub = Subscriber(store, clone(wrong), 2)
    assert sub.catch_up() == 3 and bitwise(sub.weights, vs[3]) and sub.recoveries == 1


def test_prefetch_then_apply_between_batches(tmp_path):
    store = FsspecStore(str(tmp_path / "w"))
    vs = versions(3)
    pub = Publisher(store)
    pub.publish(vs[0], 0)
    sub = Subscriber(store, clone(vs[0]), 0)
    pub.publish(vs[1], 1)
    pub.publish(vs[2], 2)
    sub.prefetch()
    assert sub.apply_ready(wait=True) == 2
    assert bitwise(sub.weights, vs[2]) and sub.last_pause_s > 0
    sub.prefetch()
    assert sub.apply_ready(wait=True) is None  # nothing new
    sub.close()
