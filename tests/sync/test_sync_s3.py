"""The store and the publish/follow channel on a real S3 server (SeaweedFS on loopback)."""

from __future__ import annotations

import threading
import time

import pytest
from sync_helpers import ACCESS_KEY, SECRET_KEY, bitwise, clone, versions

from flywheel.sync import FsspecStore, Publisher, Retry, StoreError, Subscriber


def s3_store(weed, prefix: str, **kw) -> FsspecStore:
    return FsspecStore(
        f"s3://weights/{prefix}", endpoint_url=weed.endpoint, key=ACCESS_KEY, secret=SECRET_KEY, **kw
    )


def test_s3_store_basics(weed):
    store = s3_store(weed, "basics")
    store.put("a/b.bin", b"payload")
    assert store.get("a/b.bin") == b"payload"
    assert store.exists("a/b.bin") and not store.exists("a/nope")
    assert store.list("a/") == ["a/b.bin"]
    with pytest.raises(StoreError, match="not found"):
        store.get("a/nope")
    store.delete("a/b.bin")
    store.delete("a/b.bin")  # already gone: not an error
    assert not store.exists("a/b.bin") and store.list("a/") == []


def test_stores_opened_at_once_on_a_new_bucket_all_open(weed):
    """Processes that open stores on a bucket nobody has made yet (pools and a resumed trainer starting
    together) race to make it: whoever loses the race takes the bucket as it is rather than failing."""
    barrier, errors = threading.Barrier(6), []

    def open_one(i: int) -> None:
        barrier.wait()
        try:
            s3 = FsspecStore("s3://race/run", endpoint_url=weed.endpoint, key=ACCESS_KEY, secret=SECRET_KEY)
            s3.put(f"k{i}", b"v")
        except StoreError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_server_try_again_answers_are_retried_and_missing_keys_are_not():
    """S3's 500/503 answers, as s3fs raises them, are transient; a missing key or a refusal is not."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from flywheel.sync.store import is_transient

    def answer(code: str) -> BaseException:
        err = ClientError({"Error": {"Code": code, "Message": "please try again"}}, "GetObject")
        return translate_boto_error(err)

    for code in ("InternalError", "SlowDown", "ServiceUnavailable"):
        assert is_transient(answer(code)), code
    for code in ("NoSuchKey", "AccessDenied"):
        assert not is_transient(answer(code)), code


def test_s3_credentials_from_environment(weed, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("FLYWHEEL_S3_ENDPOINT", weed.endpoint)
    store = FsspecStore("s3://weights/env")
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_publish_and_follow_over_s3(weed):
    store = s3_store(weed, "chain")
    vs = versions(4)
    pub = Publisher(store, anchor_every=2)
    for v, w in enumerate(vs):
        pub.publish(w, v)
    sub = Subscriber(s3_store(weed, "chain"))
    assert sub.catch_up() == 3 and bitwise(sub.weights, vs[3])


def test_outage_while_publishing_retries_and_readers_keep_weights(weed):
    retries: list[int] = []
    store = s3_store(
        weed,
        "outage",
        retry=Retry(attempts=30, base_s=0.1, max_s=1.0),
        on_retry=lambda n, e: retries.append(n),
    )
    vs = versions(3)
    pub = Publisher(store, anchor_every=100)
    pub.publish(vs[0], 0)
    pub.publish(vs[1], 1)
    sub = Subscriber(s3_store(weed, "outage", read_retry=Retry(attempts=1)))
    assert sub.catch_up() == 1
    served = clone(sub.weights)

    weed.stop()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("stats", pub.publish(vs[2], 2)))
    thread.start()
    deadline = time.monotonic() + 30
    while not retries and time.monotonic() < deadline:
        time.sleep(0.05)
    assert retries, "publishing did not retry while the server was down"
    assert sub.catch_up() is None and sub.version == 1  # store down: keep serving the last good weights
    assert bitwise(sub.weights, served) and sub.last_error
    weed.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and result["stats"].version == 2
    assert sub.catch_up() == 2 and bitwise(sub.weights, vs[2])
