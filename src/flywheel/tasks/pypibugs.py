"""The built-in `pypibugs` suite: bugs planted by `flywheel tasks synth` in pinned sdists from the registry.

What ships is the recipe (`pypibugs.toml` beside this file), not the tasks. Per package it pins the sdist
(name, version, sha256), names the package's source directory and its test directory inside the sdist,
lists the requirements the tests need (pinned whole), and gives the synthesis seed, the most tasks to keep
and the split. The split is by package: a held-out package's code is never seen in training. Most of the
packages' test suites need packages this project does not install (freezegun, hypothesis, typeguard, …),
so each package's tasks carry their own `[environment]`; a package whose tests need nothing else runs on
the project's own Python.

`build(out, seed)` (what `materialise("pypibugs")` calls; it takes minutes):

1. **Download** every pinned sdist once into `cache_dir()/sdists/` (pip, with the pin's hash required:
   a file whose sha256 differs is refused), written whole or not at all; later builds read the cache and
   need no network. A download that fails is one line naming the package.
2. **Lay out** each package as a flat project: its source directory at the top (a `src/` layout's
   `src/pkg` becomes `pkg`, as the grader puts the workspace on `sys.path`), its test directory, and its
   licence files.
3. **Synthesise** with `flywheel tasks synth` on that project, with the package's requirements
   (`--requirements`: the environment is built once, or found built), its seed (the recipe's plus the
   suite's), its maximum and its split. Progress goes to stderr as it comes; each package's
   `synth.json` (candidates, yield, drops by reason) is kept in the suite's `.synth/` directory.

The build runs the `synth` command in a child process rather than calling `synthesize`: the sandboxed
checker and the environment builder sit in layers above the task formats (`flywheel.verify`,
`flywheel.sandbox`), which this package does not import.

What is not covered: tasks are not put through verifier QA here (no built-in suite is; run `flywheel
tasks validate pypibugs --strict`); synthesis is deterministic in the seed only up to timing (a candidate
that times out on a loaded machine is dropped, so a slower machine can keep a different set).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from flywheel.errors import FlywheelError, TaskError
from flywheel.files import cache_dir, writing
from flywheel.protocols import Environment
from flywheel.tasks.format import check_requirement
from flywheel.tasks.suites import Builtin

VERSION = "1"  # raise with any change to the recipe: a new version is a new cache directory
RECIPE = Path(__file__).with_name("pypibugs.toml")
SPLITS = ("train", "heldout")
REPORTS = ".synth"  # in the suite's directory: each package's synth.json (counts, yield, drops)
_FIELDS = {
    "name",
    "version",
    "sha256",
    "source",
    "tests",
    "requirements",
    "python",
    "split",
    "seed",
    "max_tasks",
}
_REQUIRED = _FIELDS - {"python"}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_LICENCE = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE)", re.IGNORECASE)


@dataclass(frozen=True)
class Package:
    """One recipe entry: a pinned sdist and how bugs are planted in it."""

    name: str  # the distribution's name on the registry; task ids start with it
    version: str
    sha256: str  # of the sdist
    source: str  # the package's directory inside the sdist ("src/humanize"); laid out at the top
    tests: str  # the test directory inside the sdist
    requirements: tuple[str, ...]  # what the tests need, pinned; () when the project's Python serves
    split: str  # "train" or "heldout"
    seed: int
    max_tasks: int
    python: str | None = None

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def environment(self) -> Environment:
        return Environment(requirements=self.requirements, python=self.python)


# ------------------------------------------------------------------------------------------ the recipe


def load_recipe(path: Path = RECIPE) -> list[Package]:
    """The recipe's packages, checked (`parse_recipe`)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TaskError(f"{path}: cannot be read as TOML ({e})") from None
    return parse_recipe(data, str(path))


def parse_recipe(data: Mapping[str, Any], where: str) -> list[Package]:
    """Every `[[package]]` table as a `Package`; a bad entry is one `TaskError` naming it and the field."""
    entries = data.get("package")
    if not isinstance(entries, list) or not entries:
        raise TaskError(f"{where}: no [[package]] entries")
    packages = [_package(entry, f"{where} [[package]] {i + 1}") for i, entry in enumerate(entries)]
    names = [p.name.lower() for p in packages]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TaskError(f"{where}: package {twice[0]} appears more than once (the split is by package)")
    return packages


def _package(entry: Any, where: str) -> Package:
    if not isinstance(entry, dict):
        raise TaskError(f"{where}: must be a table")
    if isinstance(entry.get("name"), str):
        where = f"{where} ({entry['name']})"
    unknown = sorted(set(entry) - _FIELDS)
    missing = sorted(_REQUIRED - set(entry))
    if unknown or missing:
        what = f"unknown key '{unknown[0]}'" if unknown else f"missing '{missing[0]}'"
        raise TaskError(f"{where}: {what}")
    for key in ("name", "version", "sha256", "source", "tests", "split"):
        if not isinstance(entry[key], str) or not entry[key]:
            raise TaskError(f"{where}: '{key}' must be a non-empty string")
    if not _SHA256.match(entry["sha256"]):
        raise TaskError(f"{where}: 'sha256' must be 64 lowercase hex digits")
    for key in ("source", "tests"):
        _check_inside(entry[key], f"{where}: '{key}'")
    if entry["split"] not in SPLITS:
        raise TaskError(f"{where}: 'split' must be one of {', '.join(SPLITS)}, not {entry['split']!r}")
    for key, least in (("seed", 0), ("max_tasks", 1)):
        if not isinstance(entry[key], int) or isinstance(entry[key], bool) or entry[key] < least:
            raise TaskError(f"{where}: '{key}' must be an integer of at least {least}")
    reqs = entry["requirements"]
    if not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs):
        raise TaskError(f"{where}: 'requirements' must be a list of pip requirement strings")
    for r in reqs:
        check_requirement(r, where)
    python = entry.get("python")
    if python is not None and not (isinstance(python, str) and re.match(r"^3\.\d+$", python)):
        raise TaskError(f"{where}: 'python' must be a version such as \"3.12\"")
    fields = {k: entry[k] for k in _REQUIRED if k != "requirements"}
    return Package(**fields, requirements=tuple(reqs), python=python)


def _check_inside(rel: str, where: str) -> None:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or rel != p.as_posix():
        raise TaskError(f"{where} must be a relative path inside the sdist, not {rel!r}")


# ---------------------------------------------------------------------------------------- the sdists


def sdist_dir() -> Path:
    """Where downloaded sdists are kept: `cache_dir()/sdists`."""
    return cache_dir() / "sdists"


def sdist_path(package: Package) -> Path:
    """Where the package's sdist is kept once downloaded."""
    return sdist_dir() / f"{package.name}-{package.version}.tar.gz"


def fetch_sdist(package: Package) -> Path:
    """The package's pinned sdist, downloaded once (`sdist_path`) and checked against its sha256; a failed
    download is one `FlywheelError` line naming the package."""
    dest = sdist_path(package)
    if dest.is_file():
        if _sha256(dest) != package.sha256:
            raise FlywheelError(
                f"{dest}: sha256 differs from the pin of {package.pin}; delete it to download again"
            )
        return dest
    with tempfile.TemporaryDirectory(prefix="flywheel-sdist-") as tmp:
        pinned = Path(tmp) / "requirements.txt"
        pinned.write_text(f"{package.pin} --hash=sha256:{package.sha256}\n")
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        argv += ["--require-hashes", "--disable-pip-version-check", "-r", str(pinned), "-d", f"{tmp}/out"]
        done = subprocess.run(argv, capture_output=True, text=True)
        found = sorted(Path(tmp, "out").glob("*.tar.gz")) if done.returncode == 0 else []
        if len(found) != 1:
            raise FlywheelError(f"pypibugs: {package.pin}: download failed ({_last_line(done.stderr)})")
        with writing(dest) as part:
            shutil.copyfile(found[0], part)
    return dest


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("WARNING")]
    return (lines[-1] if lines else "pip said nothing")[:300]


def lay_out(package: Package, archive: Path, dest: Path) -> Path:
    """Unpack `archive` and write the flat project synthesis works on into `dest`: the source directory
    at the top under its own name, the test directory, and the licence files. Returns `dest`."""
    with tempfile.TemporaryDirectory(prefix="flywheel-unpack-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tops = [p for p in Path(tmp).iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise FlywheelError(f"{archive}: not one top-level directory")
        root = tops[0]
        for rel in (package.source, package.tests):
            if not (root / rel).is_dir():
                raise FlywheelError(f"pypibugs: {package.pin}: no directory {rel} in the sdist")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(root / package.source, dest / PurePosixPath(package.source).name)
        shutil.copytree(root / package.tests, dest / package.tests)
        for p in root.iterdir():
            if p.is_file() and _LICENCE.match(p.name):
                shutil.copyfile(p, dest / p.name)
    return dest


# ----------------------------------------------------------------------------------------- the build


def build(out: Path, seed: int, packages: list[Package] | None = None) -> None:
    """Write every package's synthesised tasks into `out` (see the module docstring)."""
    packages = load_recipe() if packages is None else packages
    archives = {}
    for package in packages:
        if not sdist_path(package).is_file():
            _say(f"pypibugs: downloading {package.pin}")
        archives[package.name] = fetch_sdist(package)
    out.mkdir(parents=True, exist_ok=True)
    for i, package in enumerate(packages, 1):
        _say(
            f"pypibugs: [{i}/{len(packages)}] {package.pin} ({package.split}): up to {package.max_tasks} tasks"
        )
        with tempfile.TemporaryDirectory(prefix="flywheel-pypibugs-") as tmp:
            project = lay_out(package, archives[package.name], Path(tmp) / package.name)
            written = Path(tmp) / "tasks"
            synth(package, project, written, package.seed + seed, _say)
            for task in sorted(p for p in written.iterdir() if p.is_dir()):
                shutil.move(task, out / task.name)
            (out / REPORTS).mkdir(exist_ok=True)
            shutil.copyfile(written / "synth.json", out / REPORTS / f"{package.name}.json")


def synth(package: Package, project: Path, out: Path, seed: int, say: Callable[[str], None]) -> None:
    """`flywheel tasks synth` on `project` with the package's settings, its output passed to `say` line by
    line; a failure is one `FlywheelError` naming the package and what the command said."""
    argv = [sys.executable, "-m", "flywheel", "tasks", "synth", "--from-dir", str(project), "--out", str(out)]
    argv += ["--max", str(package.max_tasks), "--seed", str(seed), "--name", package.name]
    argv += ["--split", package.split]
    if package.requirements:
        reqs = project.parent / "requirements.txt"
        reqs.write_text("".join(f"{r}\n" for r in package.requirements))
        argv += ["--requirements", str(reqs)]
    if package.python is not None:
        argv += ["--python", package.python]
    last = ""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                last = line.strip()
                say(last)
    if proc.returncode != 0:
        raise FlywheelError(f"pypibugs: {package.pin}: {last.removeprefix('flywheel: error: ')}")


def _say(line: str) -> None:
    if os.environ.get("FLYWHEEL_PROGRESS") != "0":
        print(line, file=sys.stderr, flush=True)


BUILTIN = Builtin(VERSION, build)
