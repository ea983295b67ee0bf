"""Fixtures for the sandbox tests: each backend this host can run, a workspace, a Python command line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flywheel.protocols import Sandbox
from flywheel.sandbox import available_backends, get_sandbox
from flywheel.sandbox.limits import controller_roots

BACKENDS = ["bwrap", "fallback"]


@pytest.fixture(params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if request.param not in available_backends():
        pytest.skip(f"the {request.param} backend cannot run on this host")
    return get_sandbox(request.param)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.fixture
def py():
    """Build a command line that runs Python `code` with this interpreter (its runtime is mounted inside)."""

    def command(code: str, *args: str) -> list[str]:
        return [sys.executable, "-c", code, *args]

    return command


@pytest.fixture
def cgroups() -> set[str]:
    """The cgroup controllers a run gets its own child cgroup in here."""
    return set(controller_roots())
