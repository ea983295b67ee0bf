"""Task environments: a virtual environment per distinct (requirements, python), built once with uv.

`ensure(environment, label=...)` returns the built environment for a task's `Environment` (None when it
needs none: the project's own Python serves), building it on first use:

- **Where.** `cache_dir()/envs/<digest>/` (`$FLYWHEEL_ENV_CACHE` moves it), the digest taken over the requirements, the interpreter's
  real path and version, and this builder's format. The environment is made with `uv venv
  --relocatable`, so it works at any path: inside the sandbox it is mounted read-only at `ENV_AT`, with
  its `bin` first on PATH (`mounts`); the fallback backend uses it where it lies.
- **Inside the sandbox.** A build runs packages' own code (setup.py, build backends), so it runs in the
  sandbox, in its build mode (`network=True`: the one use of the network a sandbox allows), with the new
  environment and uv's download cache as its only writable mounts. uv is the one the project installs.
- **Offline first.** pytest is always installed; the wheels of the pytest this host runs (and what it
  needs) are made from the installed files once (`host_wheelhouse`) and offered to every build, so an
  environment whose requirements are all local needs no network. `UV_FIND_LINKS` / `UV_NO_INDEX` /
  `UV_INDEX_URL` and the proxy variables of the caller's environment are passed to the build; a local
  find-links directory is mounted read-only at its own path.
- **Whole or not at all.** Builders of one digest take turns under an `flock` (`<digest>.lock`): one
  builds, the others wait and then find it built. A build happens in `.build-<digest>-<pid>` and is renamed
  into place only once its record (`flywheel-env.json`) is written; a failed build removes its directory,
  and a killed one leaves it for the next builder of that digest, which removes it first.
- **Errors.** An interpreter of the asked version missing on this host, or a requirement that does not
  resolve (or cannot be fetched: no network), is one `EnvironmentBuildError` line naming the label and
  what uv said.

What is not covered: packages' files are copied from uv's cache, not linked (the cache and the new
environment are separate mounts in the build's sandbox, and the kernel does not link across mounts), so
each environment holds its own copy; environments are never removed (delete `cache_dir()/envs` to reclaim
the space); system packages (a library a wheel links against) come from the host as they are.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from flywheel.files import building, cache_dir
from flywheel.protocols import Environment, Limits
from flywheel.sandbox.common import SandboxError
from flywheel.sandbox.layout import SYSTEM_DIRS, host_layout

ENV_AT = "/opt/flywheel/env"  # where a built environment appears inside the sandbox
WHEELS_AT = "/opt/flywheel/wheels"
UV_CACHE_AT = "/opt/flywheel/uv-cache"
RECORD = "flywheel-env.json"  # written last: an environment without it is not built
FORMAT = 2  # a new format is a new digest (2: bytecode compiled at build)
HOST_WHEELS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
BUILD_LIMITS = Limits(
    timeout_s=1800, memory_mb=8192, max_procs=512, max_file_mb=4096, disk_mb=64_000, output_bytes=65_536
)
PASSED_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
_VERSION = re.compile(r"^3\.\d+(\.\d+)?$")


class EnvironmentBuildError(SandboxError):
    """A task environment cannot be built here (no such interpreter, a requirement uv cannot install)."""


@dataclass(frozen=True)
class Interpreter:
    """A Python on this host: its real executable, its version and its installation prefix."""

    executable: str
    version: str
    prefix: str


@dataclass(frozen=True)
class BuiltEnv:
    """A built environment: where it lies on the host, and the interpreter it was made from."""

    path: Path
    interpreter: Interpreter

    def mounts(self) -> dict[Path, Path]:
        """The read-only mounts a sandboxed command needs: the environment, and its interpreter's prefix
        where the sandbox does not already show it."""
        out = {self.path: Path(ENV_AT)}
        if not visible(Path(self.interpreter.prefix)):
            out[Path(self.interpreter.prefix)] = Path(self.interpreter.prefix)
        return out


def env_root() -> Path:
    """Where environments are built: `$FLYWHEEL_ENV_CACHE`, else `cache_dir()/envs`."""
    return Path(os.environ.get("FLYWHEEL_ENV_CACHE") or cache_dir() / "envs")


def visible(path: Path) -> bool:
    """Whether `path` lies under a directory every sandboxed command sees (system dirs, the runtime)."""
    roots = [Path(d) for d in SYSTEM_DIRS] + [Path(m[2]) for m in host_layout().mounts if m[0] == "ro"]
    real = Path(os.path.realpath(path))
    return any(real == r or r in real.parents for r in roots)


# ---------------------------------------------------------------------------------------------- pythons


@functools.cache
def find_python(version: str | None) -> Interpreter:
    """The interpreter of `version` ("3.12", "3.12.1") on this host; None: the one running flywheel."""
    if version is None:
        return Interpreter(os.path.realpath(sys.executable), platform.python_version(), sys.base_prefix)
    if not _VERSION.match(version):
        raise EnvironmentBuildError(f"python {version!r} is not a version such as 3.12")
    found: dict[str, Interpreter] = {}
    for candidate in _candidates(version):
        interp = _inspect(candidate)
        if interp is None:
            continue
        found.setdefault(interp.version, interp)
        if interp.version == version or interp.version.startswith(version + "."):
            return interp
    have = ", ".join(sorted(found)) or "none"
    raise EnvironmentBuildError(f"python {version} is not on this host (found: {have})")


def _candidates(version: str) -> Iterator[str]:
    minor = ".".join(version.split(".")[:2])
    yield sys.executable
    for name in (f"python{minor}", "python3"):
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if d and os.access(os.path.join(d, name), os.X_OK):
                yield os.path.join(d, name)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    yield from (str(p) for p in sorted(pyenv.glob(f"{minor}*/bin/python{minor}")))
    yield from (f"{d}/python{minor}" for d in ("/usr/local/bin", "/usr/bin"))


def _inspect(executable: str) -> Interpreter | None:
    code = "import json, os, platform, sys; print(json.dumps([os.path.realpath(sys.executable), platform.python_version(), sys.base_prefix]))"
    try:
        out = subprocess.run([executable, "-I", "-c", code], capture_output=True, text=True, timeout=20)
        real, ver, prefix = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return Interpreter(real, ver, prefix) if out.returncode == 0 else None


# ------------------------------------------------------------------------------------------- the build


def digest(environment: Environment, interp: Interpreter) -> str:
    spec = {
        "format": FORMAT,
        "requirements": sorted(set(environment.requirements)),
        "python": [interp.executable, interp.version],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


def ensure(
    environment: Environment,
    *,
    label: str = "",
    sandbox: str | None = None,
    on_build: Callable[[str], None] | None = None,
) -> BuiltEnv | None:
    """The built environment for `environment` (None when it needs none), built first if it is not.

    `label` names the task in errors; `sandbox` is the backend the build runs in (default: the host's);
    `on_build(message)` hears when a build starts (it can take minutes)."""
    if not environment.built:
        return None
    where = f"{label}: " if label else ""
    try:
        interp = find_python(environment.python)
    except EnvironmentBuildError as e:
        raise EnvironmentBuildError(f"{where}{e}") from None
    root = env_root()
    key = digest(environment, interp)
    final = root / key
    if (final / RECORD).is_file():
        return BuiltEnv(final, interp)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):
        if (final / RECORD).is_file():  # another builder finished while this one waited
            return BuiltEnv(final, interp)
        for stale in root.glob(f".build-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)  # no record: not a finished environment
        tmp = root / f".build-{key}-{os.getpid()}"
        tmp.mkdir()
        try:
            if on_build is not None:
                on_build(f"building the environment {_describe(environment, interp)} ({key})")
            packages = _build(environment, interp, tmp, sandbox, where)
            record = {"digest": key, "requirements": list(environment.requirements), "python": interp.version}
            (tmp / RECORD).write_text(json.dumps({**record, "packages": packages}, indent=1) + "\n")
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return BuiltEnv(final, interp)


def _describe(environment: Environment, interp: Interpreter) -> str:
    reqs = ", ".join(environment.requirements) or "no requirements"
    return f"python {interp.version}, {reqs}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(
    environment: Environment, interp: Interpreter, dest: Path, backend: str | None, where: str
) -> list:
    """Make the environment in `dest` with uv, in the sandbox's build mode; returns its packages."""
    from flywheel.sandbox.backends import get_sandbox
    from flywheel.sandbox.workspaces import temporary_workspace

    uv = _uv()
    wheels = host_wheelhouse()
    uv_cache = env_root() / "uv-cache"
    uv_cache.mkdir(parents=True, exist_ok=True)
    find_links = [d for d in os.environ.get("UV_FIND_LINKS", "").replace(",", " ").split() if d]
    local_links = {Path(d): Path(d) for d in find_links if Path(d).is_dir()}
    ro = {wheels: Path(WHEELS_AT), **local_links}
    if not visible(Path(interp.prefix)):
        ro[Path(interp.prefix)] = Path(interp.prefix)
    env = {
        "UV_CACHE_DIR": UV_CACHE_AT,
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_LINK_MODE": "copy",
        "UV_NO_PROGRESS": "1",
        "UV_NO_CONFIG": "1",
        **{k: v for k, v in os.environ.items() if k.startswith("UV_") and k not in _OWN_UV},
        **{k: os.environ[k] for k in PASSED_VARS if k in os.environ},
        **_index_from_pip(),
    }
    requirements = list(dict.fromkeys(environment.requirements))
    if not any(_name(r) == "pytest" for r in requirements):
        requirements.append("pytest")
    sandbox = get_sandbox(backend)
    steps = [
        [uv, "venv", "--quiet", "--relocatable", "--allow-existing", "--python", interp.executable, ENV_AT],
        # compiled here, where it is mounted: the sandbox writes no bytecode, so an environment without it
        # compiles every module it imports on every run (pytest's own: about half a second)
        [uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", f"{ENV_AT}/bin/python"]
        + [a for d in [WHEELS_AT, *find_links] for a in ("--find-links", d)]
        + ["--", *requirements],
    ]
    with temporary_workspace("envbuild-") as ws:
        for argv in steps:
            result = sandbox.run(
                ws, argv, limits=BUILD_LIMITS, env=env, extra_ro=ro,
                extra_rw={dest: Path(ENV_AT), uv_cache: Path(UV_CACHE_AT)}, network=True,
            )  # fmt: skip
            if result.exit_code != 0:
                raise EnvironmentBuildError(f"{where}environment not built: {_uv_error(result.output)}")
        listing = sandbox.run(
            ws, [uv, "pip", "list", "--format", "json", "--python", f"{ENV_AT}/bin/python"],
            limits=BUILD_LIMITS, env=env, extra_ro=ro, extra_rw={dest: Path(ENV_AT), uv_cache: Path(UV_CACHE_AT)},
        )  # fmt: skip
    lines = [ln for ln in listing.output.splitlines() if ln.startswith("[")]  # stderr shares the pipe
    try:
        return [f"{p['name']}=={p['version']}" for p in json.loads(lines[-1])]
    except (IndexError, ValueError, KeyError, TypeError):
        return []


_OWN_UV = {
    "UV_CACHE_DIR",
    "UV_PYTHON_DOWNLOADS",
    "UV_LINK_MODE",
    "UV_NO_PROGRESS",
    "UV_NO_CONFIG",
    "UV_FIND_LINKS",
}


def _index_from_pip() -> dict[str, str]:
    """pip's index settings of the caller's environment, for uv (a mirror configured for pip serves both)."""
    out = {}
    if os.environ.get("PIP_INDEX_URL") and "UV_DEFAULT_INDEX" not in os.environ:
        out["UV_DEFAULT_INDEX"] = os.environ["PIP_INDEX_URL"]
    if os.environ.get("PIP_CERT") and "SSL_CERT_FILE" not in os.environ:
        out["SSL_CERT_FILE"] = os.environ["PIP_CERT"]
    elif os.environ.get("SSL_CERT_FILE"):
        out["SSL_CERT_FILE"] = os.environ["SSL_CERT_FILE"]
    return out


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _uv_error(output: str) -> str:
    """uv's failure as one line: its error, and the reasons under it."""
    lines = [ln.strip(" │╰─▶×") for ln in output.splitlines()]
    lines = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("hint:")]
    start = next((i for i, ln in enumerate(lines) if ln.startswith(("error:", "No solution", "Because"))), 0)
    text = " ".join(lines[start:])[:600] or "uv failed with no message"
    if re.search(
        r"dns error|Failed to fetch|failed to lookup|Network is unreachable|Connection refused", text
    ):
        text += " (no network, or the index is unreachable)"
    return text


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise EnvironmentBuildError("uv is not installed (make install installs it)") from None
        return found


# ----------------------------------------------------------------------------------- the host's wheels


def host_wheelhouse() -> Path:
    """A directory of wheels of the pytest this host runs and what it needs, made once from the installed
    files (all are pure Python), so that pytest reaches an environment without a package index."""
    dists = [importlib.metadata.distribution(n) for n in HOST_WHEELS]
    tag = hashlib.sha256(" ".join(f"{d.metadata['Name']}={d.version}" for d in dists).encode()).hexdigest()
    dest = env_root() / f"wheels-{tag[:12]}"
    if dest.is_dir():
        return dest
    with building(dest) as tmp:
        for dist in dists:
            write_wheel(dist, tmp)
    return dest


def write_wheel(dist: importlib.metadata.Distribution, out: Path) -> Path:
    """A wheel of the installed pure-Python distribution `dist`, rebuilt from its recorded files."""
    info = next(f for f in dist.files or [] if f.parts[0].endswith(".dist-info"))
    info_dir = info.parts[0]
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel_meta.splitlines() if ln.startswith("Tag:")]
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    path = out / f"{name}-{dist.version}-{tags[0] if tags else 'py3-none-any'}.whl"
    skip = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files or []:
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in f.parts or rel.endswith(".pyc"):
                continue
            if f.parts[0] == info_dir and f.name in skip:
                continue
            data = Path(f.locate()).read_bytes()
            zf.writestr(rel, data)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{rel},sha256={sha},{len(data)}")
        rows.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(rows) + "\n")
    return path


# ------------------------------------------------------------------------------------------ at run time


def command_setup(environment: Environment | None, path: str) -> tuple[dict[Path, Path], dict[str, str]]:
    """What `environment` adds to one command: read-only mounts, and variables over the base environment
    (whose PATH is `path`). A built environment's `bin` comes first on PATH and its pytest plugins load
    (the project's own runtime keeps them off: `layout.base_env`)."""
    if environment is None or environment == Environment():
        return {}, {}
    built = ensure(environment)
    mounts: dict[Path, Path] = {}
    env: dict[str, str] = {}
    if built is not None:
        mounts = built.mounts()
        env = {"PATH": f"{ENV_AT}/bin:{path}", "VIRTUAL_ENV": ENV_AT, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": ""}
    return mounts, {**env, **dict(environment.env)}


def ensure_all(
    labelled: Iterable[tuple[str, Environment]],
    *,
    sandbox: str | None = None,
    on_build: Callable[[str], None] | None = None,
) -> int:
    """Build every distinct environment of (label, environment) pairs that is not built yet, before work
    that needs them starts (so a failure names its task up front, and no episode waits on a build);
    returns how many distinct environments there are. `on_build` defaults to a line on stderr."""
    first: dict[Environment, str] = {}
    for label, environment in labelled:
        if environment.built:
            first.setdefault(environment, label)
    say = on_build or (lambda message: print(message, file=sys.stderr, flush=True))
    for environment, label in first.items():
        ensure(environment, label=label, sandbox=sandbox, on_build=say)
    return len(first)
