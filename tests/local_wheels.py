"""Wheels made by the tests themselves, and task environments built from them without a package index.

`make_wheel(out, name, version, files, requires)` writes a pure-Python wheel. The `offline_envs` fixture
(tests/conftest.py) points environment builds at such a directory with no index (`UV_NO_INDEX`), and at
one environment cache for the whole session, so one requirement set is built once per test run.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def make_wheel(
    out: Path, name: str, version: str, files: Mapping[str, str], requires: Sequence[str] = ()
) -> Path:
    """A wheel of `files` (archive path -> text) named `name`-`version`, needing `requires`."""
    out.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    wheel = "Wheel-Version: 1.0\nGenerator: flywheel-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = {**files, f"{info}/METADATA": metadata, f"{info}/WHEEL": wheel}
    path = out / f"{dist}-{version}-py3-none-any.whl"
    rows = []
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in entries.items():
            data = text.encode()
            zf.writestr(arc, data)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{arc},sha256={sha},{len(data)}")
        rows.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return path


# a package the project does not install, and a pytest plugin (an entry point in group pytest11)
GREETLIB = {"greetlib/__init__.py": "def greet(name):\n    return 'hello ' + name\n"}
PLUGIN = {
    "pytest_fortytwo/__init__.py": "import pytest\n\n\n@pytest.fixture\ndef fortytwo():\n    return 42\n",
}


def standard_wheels(out: Path) -> Path:
    """The wheels the environment tests install: greetlib 1.0 and 2.0, and a pytest plugin."""
    make_wheel(out, "greetlib", "1.0", GREETLIB)
    make_wheel(
        out, "greetlib", "2.0", {"greetlib/__init__.py": "def greet(name):\n    return 'hi ' + name\n"}
    )
    path = make_wheel(out, "pytest-fortytwo", "0.1", PLUGIN, requires=["pytest"])
    with zipfile.ZipFile(path, "a") as zf:  # RECORD need not list it for installers
        zf.writestr(
            "pytest_fortytwo-0.1.dist-info/entry_points.txt", "[pytest11]\nfortytwo = pytest_fortytwo\n"
        )
    return out
