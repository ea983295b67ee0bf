"""Backends chosen by name, imported only when chosen.

Every "backend by name" in the project is a table of `name -> "module:attribute"` next to the seam it
fills (`flywheel.models.MODELS`, `flywheel.sandbox.BACKENDS`, `flywheel.loop.config.BACKENDS`), resolved
here, so an optional heavy dependency (ray, s3fs, an engine) loads only when its backend is used and an
unknown name is one clear line listing the known ones.
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
