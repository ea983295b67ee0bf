"""Names resolved one way: backends and suites chosen by name, imported only when chosen.

Every name a user may give is an entry of a table of `name -> "module:attribute"` next to the seam it
fills, resolved here: models (`flywheel.models.MODELS`, `scripted-lead` included), sandboxes
(`flywheel.sandbox.BACKENDS`), loop backends (`flywheel.loop.config.BACKENDS`) and built-in suites
(`flywheel.tasks.suites.SUITES`). An optional heavy dependency (ray, s3fs, an engine) loads only when its
entry is used, and an unknown name is one clear line listing the known ones. The strings are imports
like any other: the layer test counts them. What the program itself hands down (a run's grader, the
episode runner of Fusion's sidekick) travels as a value, not as a name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from flywheel.errors import FlywheelError


def load(ref: str, what: str) -> Any:
    """The object named by `ref` ("module:attribute"), imported now; `what` names it in errors."""
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise FlywheelError(f"{what} '{ref}' cannot be loaded: {exc}") from None


def choose(table: Mapping[str, str], name: str, what: str, error: type[FlywheelError] = FlywheelError) -> Any:
    """The entry `name` of `table`, loaded; an unknown name is refused (`error`) with the known ones."""
    if name not in table:
        raise error(f"unknown {what} '{name}' (choose from {', '.join(table)})")
    return load(table[name], what)
