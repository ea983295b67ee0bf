"""The batcher: concurrent requests in capped batches, and refusal after close."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from flywheel.protocols import Request
from flywheel.serve.batcher import Batcher
from flywheel.serve.wire import ApiError


def test_batcher_caps_batches_and_fails_after_close(shout):
    batcher = Batcher(shout, window_s=0.5, max_batch=2)
    texts = [f"r{i}" for i in range(5)]
    with ThreadPoolExecutor(5) as pool:
        out = list(
            pool.map(lambda t: batcher.submit([Request(messages=[{"role": "user", "content": t}])]), texts)
        )
    assert [c.text for [c] in out] == [t.upper() for t in texts]
    assert max(len(b) for b in shout.batches) == 2 and sum(len(b) for b in shout.batches) == 5
    batcher.close()
    with pytest.raises(ApiError) as e:
        batcher.submit([Request(messages=[{"role": "user", "content": "x"}])])
    assert e.value.status == 503
