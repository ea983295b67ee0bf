"""Fixtures for the sandbox tests: each backend this host can run, as this user and as an unprivileged one.

`sandbox` and `ws` run the sandbox in this process. `box` runs it as this user or, when the tests run as
root, as uid 65534 (nobody) too: there a child process started under `setpriv` runs the sandbox on a
workspace that nobody owns and prints the `RunResult` as JSON, so the same adversarial test covers both.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import flywheel
from flywheel.protocols import Limits, RunResult, Sandbox
from flywheel.sandbox import available_backends, enforced_limits, get_sandbox
from flywheel.sandbox.cgroups import create_cgroup

BACKENDS = ["bwrap", "fallback"]
NOBODY = 65534
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "TMPDIR": "/tmp",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
}
# Runs in the child, as nobody: one sandbox run (or the enforced limits) as JSON on stdout.
CHILD = """
import dataclasses, json, sys
from pathlib import Path
from flywheel.protocols import Limits
from flywheel.sandbox import enforced_limits, get_sandbox
req = json.loads(sys.argv[1])
if req["what"] == "enforced":
    print(json.dumps(enforced_limits()))
else:
    box = get_sandbox(req["backend"])
    result = box.run(Path(req["workspace"]), req["argv"], limits=Limits(**req["limits"]))
    print(json.dumps(dataclasses.asdict(result)))
"""


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
    """The cgroup controllers a run gets its own cgroup for here (v1 or v2)."""
    probe = create_cgroup(Limits(), 0)
    probe.remove()
    return set(probe.mechanisms)


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity, for the cache below
class Nobody:
    """How to run Python as nobody: an interpreter it may execute, and a copy of flywheel it may read."""

    python: str
    env: dict[str, str]

    def run(self, what: dict) -> dict:
        """Run `CHILD` as nobody with `what`; its JSON answer."""
        timeout = what.get("limits", {}).get("timeout_s", 0) + 60
        argv = [*SETPRIV, self.python, "-c", CHILD, json.dumps(what)]
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd="/", timeout=timeout)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture(scope="session")
def nobody(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nobody | str]:
    """A way to run the sandbox as nobody, or why there is none here.

    The project's own checkout and virtualenv may sit where nobody cannot read (here the interpreter is
    under /root, mode 0700), so the child imports a copy of the `flywheel` package (its sandbox needs only
    the standard library) with the first interpreter nobody can execute: this one, else the system's."""
    if os.geteuid() != 0:
        yield "the tests already run unprivileged (switching users needs root)"
        return
    if shutil.which("setpriv") is None:
        yield "setpriv (util-linux) is not installed"
        return
    copy = Path(tempfile.mkdtemp(prefix="flywheel-nobody-src-", dir="/tmp"))
    try:
        shutil.copytree(
            Path(flywheel.__file__).parent, copy / "flywheel", ignore=shutil.ignore_patterns("__pycache__")
        )
        os.chmod(copy, 0o755)
        env = {**CHILD_ENV, "PYTHONPATH": str(copy)}
        yield next(
            (Nobody(exe, env) for exe in (sys.executable, "/usr/bin/python3") if _nobody_can_run(exe, env)),
            f"no Python >= 3.11 that uid {NOBODY} may execute ({sys.executable} and /usr/bin/python3 tried)",
        )
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _nobody_can_run(python: str, env: dict[str, str]) -> bool:
    check = 'exec "$0" -c "import sys, flywheel.sandbox; assert sys.version_info >= (3, 11)"'
    done = subprocess.run([*SETPRIV, "/bin/sh", "-c", check, python], capture_output=True, env=env, cwd="/")
    return done.returncode == 0


@dataclasses.dataclass
class Box:
    """A sandbox backend run as this user (`nobody` None: in this process) or as nobody (a child)."""

    backend: str
    ws: Path
    nobody: Nobody | None = None

    @property
    def python(self) -> str:
        """The interpreter whose runtime the sandbox mounts (the one to run inside it)."""
        return self.nobody.python if self.nobody else sys.executable

    def py(self, code: str, *args: str) -> list[str]:
        return [self.python, "-c", code, *args]

    def run(self, workspace: Path, argv: list[str], *, limits: Limits | None = None) -> RunResult:
        limits = limits or Limits()
        if self.nobody is None:
            return get_sandbox(self.backend).run(workspace, argv, limits=limits)
        what = {"what": "run", "backend": self.backend, "workspace": str(workspace), "argv": argv}
        return RunResult(**self.nobody.run({**what, "limits": dataclasses.asdict(limits)}))

    @property
    def enforced(self) -> dict[str, str]:
        return enforced_limits() if self.nobody is None else _enforced_as(self.nobody)


@functools.cache
def _enforced_as(nobody: Nobody) -> dict[str, str]:
    return nobody.run({"what": "enforced"})


@pytest.fixture(
    params=[(b, u) for u in ("self", "nobody") for b in BACKENDS],
    ids=lambda p: f"{p[0]}-as-{p[1] if p[1] == 'nobody' else 'root' if os.geteuid() == 0 else 'user'}",
)
def box(request: pytest.FixtureRequest, tmp_path: Path, nobody: Nobody | str) -> Iterator[Box]:
    backend, user = request.param
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend cannot run on this host")
    if user == "self":
        (tmp_path / "ws").mkdir()
        yield Box(backend, tmp_path / "ws")
        return
    if isinstance(nobody, str):
        pytest.skip(f"cannot run the sandbox as nobody: {nobody}")
    workspace = Path(tempfile.mkdtemp(prefix="flywheel-nobody-ws-", dir="/tmp"))
    try:
        os.chown(workspace, NOBODY, NOBODY)
        yield Box(backend, workspace, nobody)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
