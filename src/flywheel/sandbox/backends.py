"""The sandbox backends by name: `bwrap` where it works on this host, else `fallback` (see the package
docstring for what each enforces); `$FLYWHEEL_SANDBOX` chooses one."""

from __future__ import annotations

import os

from flywheel.protocols import Sandbox
from flywheel.registry import choose
from flywheel.sandbox.common import SandboxError

BACKENDS: dict[str, str] = {
    "bwrap": "flywheel.sandbox.bwrap:BwrapSandbox",
    "fallback": "flywheel.sandbox.fallback:FallbackSandbox",
}


def default_backend() -> str:
    """`$FLYWHEEL_SANDBOX` if set, else "bwrap" where it works here, else "fallback"."""
    chosen = os.environ.get("FLYWHEEL_SANDBOX")
    if chosen:
        return chosen
    from flywheel.sandbox.bwrap import bwrap_works

    return "bwrap" if bwrap_works() else "fallback"


def available_backends() -> list[str]:
    """The backends that can run on this host."""
    from flywheel.sandbox.bwrap import bwrap_works

    return ["bwrap", "fallback"] if bwrap_works() else ["fallback"]


def get_sandbox(name: str | None = None) -> Sandbox:
    """The sandbox backend called `name` (default: `default_backend()`)."""
    return choose(BACKENDS, name or default_backend(), "sandbox backend", SandboxError)()
