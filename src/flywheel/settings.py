"""Settings from TOML: one file per run, one dataclass per section, checked field by field.

`load_config(path, cls)` reads a TOML file into nested dataclasses (`flywheel.rl.config.RunConfig` for
`flywheel train`, `flywheel.sft.SftConfig` for `flywheel sft`). Every key must be a known field of its
section and every value must have the field's type (an int is accepted where a float is asked); a field
whose metadata says `run` is filled by the program, not the file, and is refused there too. Anything else
is refused with one line naming the file, the section and the key, so the CLI can exit 2 before any work
starts. Unset fields keep their defaults; each section checks its own values as it is built
(`__post_init__`).
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError

# where a setting may come from the environment instead: the key `flywheel serve --api-key` takes and the
# `http` loop backend sends, when neither the option nor `[loop] pool_api_key` gives one
API_KEY_ENV = "FLYWHEEL_API_KEY"

# -------------------------------------------------------------------------------------------- loading


def load_config(path: str | Path, cls: type) -> Any:
    """`cls` filled from the TOML file at `path`; FlywheelError names the first bad key."""
    path = Path(path)
    if not path.is_file():
        raise FlywheelError(f"{path}: config file not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise FlywheelError(f"{path}: not valid TOML: {e}") from None
    return from_dict(cls, data, f"{path}")


def from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    """Build dataclass `cls` from `data`, refusing unknown keys and wrongly typed values."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key not in fields:
            known = [k for k, f in fields.items() if not f.metadata.get("run")]
            raise FlywheelError(f"{where}: unknown key '{key}' (known: {', '.join(known)})")
        if fields[key].metadata.get("run"):
            raise FlywheelError(f"{where} {key}: set by the rest of the run config, not in this table")
        values[key] = _coerce(
            hints[key],
            value,
            f"{where}: [{key}]" if _section(hints[key]) else f"{where}: '{key}'",
        )
    return cls(**values)


def _section(hint: Any) -> bool:
    """A dataclass, or an optional one."""
    return any(dataclasses.is_dataclass(h) for h in (hint, *typing.get_args(hint)))


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise FlywheelError(f"{where}: expected a table, got {type(value).__name__}")
        return from_dict(hint, value, where)
    origin = typing.get_origin(hint)
    if origin in (list, dict):
        return _coerce_container(origin, typing.get_args(hint), value, where)
    if origin in (typing.Union, types.UnionType) and value is not None:
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        if len(options) == 1:  # an optional section or value: its own errors, by name
            return _coerce(options[0], value, where)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _coerce(option, value, where)
            except FlywheelError:
                continue
        raise FlywheelError(f"{where}: unexpected value {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is type(None) and value is None:
        return None
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise FlywheelError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _coerce_container(origin: type, args: tuple[Any, ...], value: Any, where: str) -> Any:
    if not isinstance(value, origin):
        raise FlywheelError(f"{where}: expected a {'list' if origin is list else 'table'}, got {value!r}")
    if origin is list:
        return [_coerce(args[0], v, where) for v in value]
    return {str(k): _coerce(args[1], v, f"{where}.{k}") for k, v in value.items()}


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data (for run directories and checkpoints)."""
    return dataclasses.asdict(config)
