"""What a repository declares it needs to run its tests, as pip requirement strings.

`declared_requirements(repo)` reads, in this order:

- `pyproject.toml`: `[project] dependencies`, then the test extras of `[project.optional-dependencies]`
  (`TEST_EXTRAS`: test, tests, testing, dev), then the same groups of `[dependency-groups]` (PEP 735,
  `{include-group = ...}` followed);
- `requirements*.txt` at the top level (`requirements.txt` first) and `requirements/*.txt`, each read as
  pip reads it (`read_requirements`): comments and blank lines dropped, `\\` continuations joined,
  environment markers kept, `-r FILE` includes followed (inside the repository only), option lines
  (`--index-url`, `-e .`, `-c FILE`, ...) and per-line options (`--hash=...`) skipped;
- `setup.cfg`: `[options] install_requires` and the test extras of `[options.extras_require]`, when they
  are plain lists (a `file:` or `attr:` directive is not followed).

The repository's own package is not a requirement: a line naming the project itself (its `name` in
pyproject.toml or setup.cfg), or a local path to it (`.`, `.[test]`), is skipped; a self-reference with
extras (`dev = ["mypkg[test]"]`) brings those extras' requirements in. The order is kept and duplicates
(the same requirement written alike, up to spacing) are dropped. Each string is checked with
`flywheel.tasks.format.check_requirement`: one that pip cannot parse is one `TaskError` naming the file
(and line) relative to the repository.

What is not covered: Poetry's and Pipenv's own tables (`[tool.poetry.dependencies]`, `Pipfile`),
`setup.py` (it is code), requirement files named for documentation (`requirements-docs.txt`,
`requirements/doc.txt`: not needed to run the tests), and variables (`${VAR}`) inside requirement lines.
"""

from __future__ import annotations

import configparser
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from flywheel.errors import TaskError
from flywheel.tasks.format import check_requirement

TEST_EXTRAS = ("test", "tests", "testing", "dev")
_DOCS = re.compile(r"(^|[-_.])docs?([-_.]|$)", re.IGNORECASE)
_INCLUDE = re.compile(r"^(?:-r|--requirement)(?:\s*=\s*|\s+|(?=[^\s=]))(?P<path>\S+)$")
_COMMENT = re.compile(r"(^|\s+)#.*$")
_LINE_OPTION = re.compile(r"\s+--?[A-Za-z]")  # `pkg==1.0 --hash=sha256:...`: per-requirement options


def declared_requirements(repo: Path) -> list[str]:
    """The requirements `repo` declares for running its tests (see the module docstring)."""
    repo = Path(repo)
    project = _project(repo)
    found: list[tuple[str, str]] = []  # (requirement, where)
    found += _pyproject(repo, project)
    for path in requirement_files(repo):
        found += _read(path, repo, repo, set())
    found += _setup_cfg(repo, project)
    return _unique(r for r, where in found if not _names_project(r, where, project))


def read_requirements(path: Path, root: Path | None = None) -> list[str]:
    """The requirement strings of one requirements file, read as pip reads it; `-r` includes are followed
    (only inside `root`, when given). Errors name the file (relative to `root`, else to `path`'s
    directory) and the line."""
    path = Path(path)
    found = _read(path, root, root or path.parent, set())
    for r, where in found:
        check_requirement(r, where)
    return _unique(r for r, _ in found)


def requirement_files(repo: Path) -> list[Path]:
    """`requirements*.txt` at the top (requirements.txt first) and `requirements/*.txt`, none for docs."""
    top = sorted(repo.glob("requirements*.txt"), key=lambda p: (p.name != "requirements.txt", p.name))
    sub = sorted((repo / "requirements").glob("*.txt")) if (repo / "requirements").is_dir() else []
    return [p for p in top + sub if p.is_file() and not _DOCS.search(p.stem.removeprefix("requirements"))]


# --------------------------------------------------------------------------------------------- sources


def _project(repo: Path) -> str | None:
    """The project's own name (canonical), from pyproject.toml or setup.cfg."""
    name = _table(_load_pyproject(repo).get("project", {}), "[project]").get("name")
    if not isinstance(name, str):
        cfg = _load_setup_cfg(repo)
        name = cfg.get("metadata", "name", fallback=None) if cfg is not None else None
    return canonicalize_name(name) if isinstance(name, str) and name.strip() else None


def _load_pyproject(repo: Path) -> dict[str, Any]:
    path = repo / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"pyproject.toml: not valid TOML ({e})") from None


def _pyproject(repo: Path, project: str | None) -> list[tuple[str, str]]:
    data = _load_pyproject(repo)
    table = _table(data.get("project", {}), "[project]")
    extras = _table(table.get("optional-dependencies", {}), "[project.optional-dependencies]")
    deps = _list(table, "dependencies", "pyproject.toml [project]")
    out = [(r, "pyproject.toml [project] dependencies") for r in deps]
    out += _extras(extras, TEST_EXTRAS, project, "pyproject.toml [project.optional-dependencies]")
    groups = _table(data.get("dependency-groups", {}), "[dependency-groups]")
    for name in TEST_EXTRAS:
        if name in groups:
            out += [(r, f"pyproject.toml [dependency-groups] {name}") for r in _group(groups, name, [])]
    return out


def _extras(
    extras: Mapping[str, Any], names: Iterable[str], project: str | None, where: str, seen: set | None = None
) -> list[tuple[str, str]]:
    """The requirements of the extras `names`, a self-reference's extras followed (once each)."""
    seen = set() if seen is None else seen
    out = []
    for name in names:
        if name in seen or name not in extras:
            continue
        seen.add(name)
        for r in _list(extras, name, where):
            out.append((r, f"{where} {name}"))
            own = _self_extras(r, project)
            if own:
                out += _extras(extras, own, project, where, seen)
    return out


def _group(groups: Mapping[str, Any], name: str, stack: list[str]) -> list[str]:
    """A PEP 735 dependency group's requirements, its `{include-group = ...}` entries followed."""
    if name in stack:
        raise TaskError(f"pyproject.toml [dependency-groups]: group {name!r} includes itself")
    if name not in groups:
        raise TaskError(f"pyproject.toml [dependency-groups]: no group {name!r} to include")
    entries = groups[name]
    if not isinstance(entries, list):
        raise TaskError(f"pyproject.toml [dependency-groups] {name}: must be a list")
    out: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
            out += _group(groups, entry["include-group"], [*stack, name])
        else:
            raise TaskError(f"pyproject.toml [dependency-groups] {name}: {entry!r} is not a requirement")
    return out


def _load_setup_cfg(repo: Path) -> configparser.ConfigParser | None:
    path = repo / "setup.cfg"
    if not path.is_file():
        return None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text())
    except (configparser.Error, UnicodeDecodeError) as e:
        raise TaskError(f"setup.cfg: cannot be read ({str(e).splitlines()[0]})") from None
    return parser


def _setup_cfg(repo: Path, project: str | None) -> list[tuple[str, str]]:
    cfg = _load_setup_cfg(repo)
    if cfg is None:
        return []
    out = [(r, "setup.cfg [options] install_requires") for r in _cfg_list(cfg, "options", "install_requires")]
    if cfg.has_section("options.extras_require"):
        extras = {k: _cfg_list(cfg, "options.extras_require", k) for k in cfg["options.extras_require"]}
        out += _extras(extras, TEST_EXTRAS, project, "setup.cfg [options.extras_require]")
    return out


def _cfg_list(cfg: configparser.ConfigParser, section: str, key: str) -> list[str]:
    """A setup.cfg list value, one requirement a line; a `file:`/`attr:` directive gives none."""
    value = cfg.get(section, key, fallback="").strip()
    if value.startswith(("file:", "attr:")):
        return []
    lines = [_COMMENT.sub("", ln).strip() for ln in value.splitlines()]
    return [ln for ln in lines if ln]


# ---------------------------------------------------------------------------------- requirements files


def _read(path: Path, root: Path | None, names: Path, seen: set[Path]) -> list[tuple[str, str]]:
    """(requirement, where) for each requirement line of `path`, includes followed (inside `root` when
    given); `where` names the file relative to `names`."""
    rel = _rel(path, names)
    real = path.resolve()
    if real in seen:
        return []
    seen.add(real)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise TaskError(f"{rel}: not text") from None
    except OSError as e:
        raise TaskError(f"{rel}: cannot be read ({e.strerror})") from None
    out: list[tuple[str, str]] = []
    for n, line in requirement_lines(text):
        where = f"{rel} line {n}"
        include = _INCLUDE.match(line)
        if include:
            out += _read(_included(path, include["path"], root, where), root, names, seen)
        elif line.startswith("-") or _local_path(line):
            continue  # an option (--index-url, -e ., -c FILE, --pre) or a path: nothing to resolve by name
        else:
            out.append((_LINE_OPTION.split(line, maxsplit=1)[0].strip(), where))
    return out


def requirement_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, line) of a requirements file: comments stripped, `\\` continuations joined (a
    backslash before trailing spaces too), blanks dropped."""
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1]  # joined as pip joins them: nothing between
            continue
        line = _COMMENT.sub("", buf + raw).strip()
        buf = ""
        if line:
            yield start, line
    if buf and _COMMENT.sub("", buf).strip():
        yield start, _COMMENT.sub("", buf).strip()


def _included(path: Path, target: str, root: Path | None, where: str) -> Path:
    """The file `-r target` names, relative to the including file; inside `root` when given."""
    inc = path.parent / target
    if root is not None:
        real = inc.resolve()
        top = root.resolve()
        if real != top and top not in real.parents:
            raise TaskError(f"{where}: -r {target} lies outside the repository")
    if not inc.is_file():
        raise TaskError(f"{where}: -r {target}: no such file")
    return inc


def _local_path(line: str) -> bool:
    """A line that installs a local directory or archive (`.`, `./pkg`, `.[test]`), not a named package."""
    return line.startswith((".", "/", "~"))


def _rel(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------------------ checks


def _names_project(requirement: str, where: str, project: str | None) -> bool:
    """Whether `requirement` is the project itself (checked first: an unparsable one is refused)."""
    check_requirement(requirement, where)
    return project is not None and canonicalize_name(Requirement(requirement).name) == project


def _self_extras(requirement: str, project: str | None) -> list[str]:
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return []  # refused later, with its file
    own = project is not None and canonicalize_name(req.name) == project
    return sorted(req.extras) if own else []


def _unique(requirements: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for r in requirements:
        key = re.sub(r"\s+", "", r)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _list(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{where} {key}: must be a list of requirement strings")
    return [v.strip() for v in value if v.strip()]


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TaskError(f"pyproject.toml {where}: must be a table")
    return value
