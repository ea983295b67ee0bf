"""A Harbor task's `environment/Dockerfile`, read without Docker: what a Python image does becomes the
task's `Environment`, and the repository is what its COPYs put under WORKDIR (`.dockerignore` applied).

- `FROM python:3.X…` sets `python = "3.X"` (a tag without a minor version, such as `python:3` or
  `python:slim`, leaves it to the project's Python); a bare OS image (ubuntu, debian, alpine) leaves it
  unset. Any other image, a second FROM (a multi-stage build) and `COPY --from` are refused.
- `WORKDIR` is the environment's `workdir`: the repository appears there in the sandbox, so tests that
  read `/app/...` find it. A WORKDIR the sandbox cannot give (`check_workdir`) is refused.
- `ENV` (`A=1 B=2` or `A 1`; `$VAR` and `${VAR}` of earlier ENVs and ARGs substituted) is the
  environment's `env`, less the Python and pip switches that change nothing here (`_HARMLESS_ENV`). An
  `ENV PATH=…:$PATH` that only prepends directories under WORKDIR or /usr/local/bin is dropped (the
  environment's `bin` comes first on the sandbox's PATH); any other PATH is refused.
- `RUN pip install …` (`pip`, `pip3`, `python -m pip`, `uv pip`), command by command across `&&`, `;`
  and `||`, gives the `requirements`: any packages and versions; `-r FILE` read from the file the COPYs
  put there (else from environment/ itself), comments, blank lines, `\\` continuations, nested `-r` and
  `--hash` options handled; installing pip itself is dropped. `pip install .` or `-e .[extra]` of the
  repository (WORKDIR) gives its pyproject.toml's static `[project] dependencies` and those extras.
  Refused with one line each: an option that changes where packages come from or go (`--index-url`,
  `--find-links`, `-c`, `--target`, ... on the command line or as a line of a requirements file), an
  unknown option, another local project, a repository with no static dependencies or a `src/` layout
  (only an install makes that importable). `mkdir` and `cd` are allowed; system packages (`apt-get`,
  `apt`, `apk`, `yum`, `dnf`) and any other RUN are refused.

Every refusal is one FlywheelError naming the Dockerfile line. The host's check of the Python version is
the caller's (`check_python`: the tasks layer does not know the host's interpreters).
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flywheel.errors import FlywheelError
from flywheel.protocols import Environment
from flywheel.tasks.declared import requirement_lines
from flywheel.tasks.format import check_requirement, check_workdir
from flywheel.tasks.interop.draft import _files
from flywheel.tasks.interop.scripts import shell_commands


class DockerPlan(NamedTuple):
    """What a Dockerfile we can run without Docker does: the repository's place, what it copies there,
    and the environment it sets up."""

    workdir: str
    copies: list[tuple[list[str], str, bool]]  # (context sources, absolute destination, into a directory)
    environment: Environment = Environment()


_HARMLESS = {
    "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "MAINTAINER", "USER", "VOLUME", "STOPSIGNAL", "SHELL",
}  # fmt: skip
_HARMLESS_ENV = {
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_ROOT_USER_ACTION", "DEBIAN_FRONTEND", "LANG", "LC_ALL",
}  # fmt: skip
_BARE_OS = ("ubuntu", "debian", "alpine")
_SYSTEM_PACKAGERS = {"apt-get", "apt", "aptitude", "apk", "yum", "dnf", "microdnf", "zypper"}
_PATH_OK = "/usr/local/bin"  # where a python image's pip puts scripts; the environment's bin serves them
# pip's and uv's options: those ignored (with or without a value), and those that change where packages
# come from or go, which an environment built from the configured index cannot carry
_PIP_FLAGS = {
    "-U", "--upgrade", "-q", "--quiet", "-v", "--verbose", "--no-cache-dir", "--no-cache", "--user",
    "--system", "--break-system-packages", "--no-deps", "--pre", "--force-reinstall", "-I",
    "--ignore-installed", "--no-compile", "--compile", "--disable-pip-version-check", "--no-input",
    "--no-warn-script-location", "--no-build-isolation", "--prefer-binary", "--isolated", "--no-color",
}  # fmt: skip
_PIP_VALUED = {
    "--progress-bar", "--upgrade-strategy", "--root-user-action", "--python", "-p", "--cache-dir",
    "--timeout", "--retries", "--only-binary", "--no-binary", "--exists-action", "--trusted-host",
    "--log", "--config-settings", "-C", "--resolution",
}  # fmt: skip
_PIP_REFUSED = {
    "-i", "--index-url", "--extra-index-url", "--index", "--default-index", "--no-index", "-f",
    "--find-links", "-c", "--constraint", "-t", "--target", "--prefix", "--root", "--src",
}  # fmt: skip
_VAR = re.compile(r"(?<!\\)\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")


def dockerfile_instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) of a Dockerfile: continuations joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        word, *rest = (buf + stripped).split(None, 1)
        out.append((start, word.upper(), rest[0].strip() if rest else ""))
        buf = ""
    if buf:
        word, *rest = buf.split(None, 1)
        out.append((start, word.upper(), rest[0].strip() if rest else ""))
    return out


def docker_plan(
    text: str, context: Mapping[str, Path], check_python: Callable[[str], object] | None = None
) -> DockerPlan:
    """Read a Dockerfile whose image is a Python image (or a bare OS) plus packages, variables and files;
    raise FlywheelError naming the first instruction that needs its own container. `context` is the
    build context's files (`build_context`); `check_python(version)` raises FlywheelError when this host
    lacks the base image's Python."""
    image = _Image(context, check_python)
    for n, instr, args in dockerfile_instructions(text):
        where = f"environment/Dockerfile line {n}"
        step = _STEPS.get(instr)
        if step is not None:
            step(image, where, args)
        elif instr not in _HARMLESS:
            raise _needs_docker(f"{where}: {instr} {args}".strip())
    return image.plan()


def build_context(env: Path) -> dict[str, Path]:
    """The files of the build context `env` (environment/) that `.dockerignore` leaves, by posix path."""
    ignore = _dockerignore(env)
    return {rel: p for rel, p in _files(env).items() if not any(_ignored(rel, pat) for pat in ignore)}


def copied_files(plan: DockerPlan, context: Mapping[str, Path]) -> dict[str, Path]:
    """The repository the plan's COPYs build: workdir-relative path -> file in the build context."""
    repo: dict[str, Path] = {}
    for target, (source, p) in _image_files(plan.copies, context).items():
        inside = posixpath.relpath(target, plan.workdir)
        if inside in (".", "..") or inside.startswith("../"):
            raise FlywheelError(
                f"environment/Dockerfile copies {source} to {target}, outside WORKDIR {plan.workdir}"
            )
        repo[inside] = p
    return dict(sorted(repo.items()))


def _needs_docker(what: str) -> FlywheelError:
    return FlywheelError(f"needs its own Docker environment ({what}); flywheel runs tasks without Docker")


@dataclass
class _Image:
    """What the Dockerfile's instructions have done so far."""

    context: Mapping[str, Path]
    check_python: Callable[[str], object] | None
    base: str | None = None
    python: str | None = None
    workdir: str | None = None
    workdir_at: str = ""  # the Dockerfile line of the last WORKDIR
    copies: list[tuple[list[str], str, bool]] = field(default_factory=list)
    requirements: dict[str, None] = field(default_factory=dict)  # in order, once each
    env: dict[str, str] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)  # every ENV and ARG value, for `$VAR`
    paths: list[tuple[str, str]] = field(default_factory=list)  # (line, value) of each ENV PATH
    projects: list[tuple[str, str, str]] = field(default_factory=list)  # (line, image path, as written)

    def from_(self, where: str, args: str) -> None:
        image = args.split()[0] if args else ""
        if self.base is not None:
            raise _needs_docker(f"{where}: a multi-stage build")
        name, tag = _image_name(image)
        if name not in ("python", *_BARE_OS) or "$" in image:
            raise _needs_docker(f"{where}: base image {image or '?'} is neither python nor a bare OS")
        self.base = image
        version = re.match(r"^(\d+)(?:\.(\d+))?", tag) if name == "python" else None
        if version and version.group(1) != "3":
            raise _needs_docker(f"{where}: base image {image} is not a Python 3 image")
        if version and version.group(2) is not None:
            self.python = f"3.{version.group(2)}"
            if self.check_python is not None:
                try:
                    self.check_python(self.python)
                except FlywheelError as e:
                    raise FlywheelError(f"{where}: base image {image}: {e}") from None

    def workdir_(self, where: str, args: str) -> None:
        path = self.expand(where, "WORKDIR", _unquote(args))
        self.workdir = posixpath.normpath(posixpath.join(self.workdir or "/", path))
        self.workdir_at = where

    def copy(self, where: str, args: str, instr: str = "COPY") -> None:
        self.copies.append(_copy(where, instr, args, self.workdir or "/"))

    def add(self, where: str, args: str) -> None:
        self.copy(where, args, "ADD")

    def arg(self, where: str, args: str) -> None:
        name, eq, value = args.partition("=")
        if eq and re.fullmatch(r"\w+", name.strip()):
            self.values[name.strip()] = _unquote(value) if value.strip() else ""

    def env_(self, where: str, args: str) -> None:
        for name, raw in _env_pairs(where, args):
            if name == "PATH":
                self.paths.append((where, raw))
                continue
            value = self.expand(where, f"ENV {name}", raw)
            self.values[name] = value
            if name.startswith("FLYWHEEL_"):
                raise FlywheelError(f"{where}: ENV {name}: the sandbox owns the FLYWHEEL_ variables")
            if name not in _HARMLESS_ENV:
                self.env[name] = value

    def expand(self, where: str, what: str, text: str) -> str:
        """`text` with `$VAR`, `${VAR}` and `${VAR:-default}` of earlier ENVs and ARGs substituted."""

        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(3)
            if name in self.values:
                return self.values[name]
            if m.group(2) is not None:
                return m.group(2)
            raise FlywheelError(f"{where}: {what} uses ${name}, which the Dockerfile does not set")

        return _VAR.sub(value, text).replace("\\$", "$")

    def run(self, where: str, args: str) -> None:
        if args.startswith("["):
            try:
                args = shlex.join(json.loads(args))
            except (ValueError, TypeError):
                raise FlywheelError(f"{where}: cannot read RUN {args}") from None
        try:
            commands = shell_commands(args)
        except ValueError:
            raise FlywheelError(f"{where}: cannot read RUN {args}") from None
        cwd = self.workdir or "/"
        for cmd in commands:
            words = cmd.words
            name = posixpath.basename(words[0]) if words else ""
            if not words or name == "mkdir":
                continue
            if name == "cd":
                cwd = posixpath.normpath(posixpath.join(cwd, words[1] if len(words) > 1 else "/root"))
                continue
            if name in _SYSTEM_PACKAGERS:
                raise _needs_docker(f"{where}: RUN {shlex.join(words)}: system packages")
            pip_args = _pip_install_args(words)
            if pip_args is None:
                raise _needs_docker(f"{where}: RUN {shlex.join(words)}")
            self.pip_install(where, [self.expand(where, "RUN", w) for w in pip_args], cwd)

    def pip_install(self, where: str, args: list[str], cwd: str) -> None:
        i = 0
        while i < len(args):
            word = args[i]
            option, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
            takes = option in ("-r", "--requirement", "-e", "--editable", *_PIP_VALUED, *_PIP_REFUSED)
            if takes and not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            i += 1
            if option in ("-r", "--requirement"):
                self.requirements_file(where, posixpath.normpath(posixpath.join(cwd, value)), value, [])
            elif option in ("-e", "--editable"):
                self.local(where, value, cwd)
            elif option in _PIP_REFUSED:
                raise _not_carried(where, option)
            elif option in _PIP_FLAGS or option in _PIP_VALUED or re.fullmatch(r"-[qvUI]+", option):
                continue
            elif word.startswith("-"):
                raise FlywheelError(f"{where}: pip install {word}: an option flywheel does not know")
            elif _local_path(word):
                self.local(where, word, cwd)
            else:
                self.requirement(where, word)

    def requirement(self, where: str, text: str) -> None:
        check_requirement(text, where)
        if canonicalize_name(Requirement(text).name) != "pip":  # upgrading the installer changes nothing
            self.requirements.setdefault(text.strip())

    def local(self, where: str, target: str, cwd: str) -> None:
        """`pip install PATH` (or `-e PATH`): the repository itself, resolved once WORKDIR is known."""
        if not _local_path(target):
            raise FlywheelError(f"{where}: pip installs an editable {target}, which is not the repository")
        path = target.split("[", 1)[0]
        self.projects.append((where, posixpath.normpath(posixpath.join(cwd, path)), target))

    def requirements_file(self, where: str, path: str, written: str, stack: list[str]) -> None:
        """The requirements of the file at image path `path` (`written` as the RUN or -r line names it)."""
        if path in stack:
            raise FlywheelError(f"{where}: {written} includes itself")
        copied = _image_files(self.copies, self.context).get(path)
        found = copied[1] if copied else self.context.get(posixpath.normpath(written))
        if found is None:
            raise FlywheelError(f"{where}: pip reads {written}, which is not in environment/")
        try:
            text = found.read_text()
        except UnicodeDecodeError:
            raise FlywheelError(f"{where}: pip reads {written}, which is not text") from None
        for n, line in requirement_lines(text):
            at = f"{where}: {written} line {n}"
            option, _, rest = line.partition(" ")
            if option in ("-r", "--requirement") or option.startswith(("-r", "--requirement=")):
                nested = rest.strip() or option.removeprefix("--requirement=").removeprefix("-r")
                inner = posixpath.normpath(posixpath.join(posixpath.dirname(path), nested))
                self.requirements_file(at, inner, nested, [*stack, path])
            elif option in ("-e", "--editable"):
                self.local(at, rest.strip(), posixpath.dirname(path))
            elif line.startswith("-"):
                raise _not_carried(at, option.split("=", 1)[0])
            elif _local_path(line):
                self.local(at, line, posixpath.dirname(path))
            else:
                self.requirement(at, _without_hashes(at, line))

    def plan(self) -> DockerPlan:
        if self.base is None:
            raise FlywheelError("environment/Dockerfile has no FROM")
        if self.workdir is None:
            raise FlywheelError(
                "environment/Dockerfile sets no WORKDIR, so the repository's place is unknown"
            )
        check_workdir(self.workdir, self.workdir_at)
        for where, value in self.paths:
            _check_path(where, value, self.workdir)
        if self.projects:
            repo = copied_files(DockerPlan(self.workdir, self.copies), self.context)
            for where, path, target in self.projects:
                if path != self.workdir:
                    raise FlywheelError(
                        f"{where}: pip installs {target}, a local project other than the repository "
                        f"in WORKDIR {self.workdir}"
                    )
                for req in _project_requirements(where, target, repo):
                    self.requirement(f"{where}: pyproject.toml", req)
        environment = Environment(
            requirements=tuple(self.requirements),
            python=self.python,
            env=tuple(sorted(self.env.items())),
            workdir=self.workdir,
        )
        return DockerPlan(self.workdir, self.copies, environment)


_STEPS: dict[str, Callable[[_Image, str, str], None]] = {
    "FROM": _Image.from_,
    "WORKDIR": _Image.workdir_,
    "COPY": _Image.copy,
    "ADD": _Image.add,
    "ARG": _Image.arg,
    "ENV": _Image.env_,
    "RUN": _Image.run,
}


def _image_name(image: str) -> tuple[str, str]:
    """(name, tag) of an image reference: `docker.io/library/python:3.11-slim@sha256:…` -> python, 3.11-slim."""
    ref = image.split("@", 1)[0].rsplit("/", 1)[-1]
    name, _, tag = ref.partition(":")
    return name, tag


def _unquote(text: str) -> str:
    words = shlex.split(text)
    return words[0] if words else ""


def _env_pairs(where: str, args: str) -> list[tuple[str, str]]:
    """(name, value) of `ENV A=1 B="two words"` or `ENV A value`, values unexpanded."""
    try:
        words = shlex.split(args)
    except ValueError:
        raise FlywheelError(f"{where}: cannot read ENV {args}") from None
    if not words:
        raise FlywheelError(f"{where}: ENV names no variable")
    if "=" in words[0]:
        pairs = []
        for word in words:
            name, eq, value = word.partition("=")
            if not eq:
                raise FlywheelError(f"{where}: ENV {word} has no value (write NAME=VALUE)")
            pairs.append((name, value))
    else:
        pairs = [(words[0], " ".join(words[1:]))]
    for name, _ in pairs:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise FlywheelError(f"{where}: ENV {name!r} is not a variable name")
    return pairs


def _check_path(where: str, value: str, workdir: str) -> None:
    """An `ENV PATH` that only prepends directories under WORKDIR or /usr/local/bin to `$PATH`."""
    *dirs, last = value.split(":")
    roots = (workdir, _PATH_OK)
    ok = last in ("$PATH", "${PATH}") and all(
        d.startswith("/") and any(_under(posixpath.normpath(d), r) for r in roots) for d in dirs
    )
    if not ok:
        raise FlywheelError(
            f"{where}: ENV PATH={value} does more than put directories under WORKDIR or {_PATH_OK} "
            "before $PATH; the sandbox owns PATH"
        )


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _pip_install_args(words: list[str]) -> list[str] | None:
    """The arguments of `pip install` (`pip`, `pip3`, `python -m pip`, `uv pip`), or None when `words` is
    not one."""
    name = posixpath.basename(words[0])
    if re.fullmatch(r"pip[0-9.]*", name):
        rest = words[1:]
    elif re.fullmatch(r"python[0-9.]*", name) and words[1:3] == ["-m", "pip"]:
        rest = words[3:]
    elif name == "uv" and words[1:2] == ["pip"]:
        rest = words[2:]
    else:
        return None
    return rest[1:] if rest[:1] == ["install"] else None


def _not_carried(where: str, option: str) -> FlywheelError:
    return FlywheelError(
        f"{where}: pip option {option} cannot be carried (environments install from the configured index)"
    )


def _local_path(word: str) -> bool:
    """A local directory or archive (`.`, `./pkg`, `.[test]`, `/src/x`), not a package name."""
    return word.startswith((".", "/", "~"))


def _without_hashes(where: str, line: str) -> str:
    """A requirement line without its `--hash=...` options (which pin the files, not the versions)."""
    requirement, *options = re.split(r"\s+(?=--?[A-Za-z])", line)
    for option in options:
        if not option.startswith("--hash"):
            raise _not_carried(where, option.split("=", 1)[0].split()[0])
    return requirement


def _project_requirements(where: str, target: str, repo: Mapping[str, Path]) -> list[str]:
    """What `pip install .[extras]` of the repository installs: pyproject.toml's static `[project]
    dependencies` and the extras it names, a self-reference's extras followed."""
    refuse = f"{where}: pip installs the repository ({target})"
    path = repo.get("pyproject.toml")
    try:
        project = tomllib.loads(path.read_text()).get("project") if path else None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise FlywheelError(f"{refuse}, whose pyproject.toml cannot be read ({e})") from None
    if not isinstance(project, dict) or "dependencies" in (project.get("dynamic") or []):
        raise FlywheelError(f"{refuse}, whose pyproject.toml declares no static [project] dependencies")
    if any(re.fullmatch(r"src/[^/]+(/__init__)?\.py", rel) for rel in repo):
        raise FlywheelError(f"{refuse}, whose src/ layout only an install makes importable")
    own = canonicalize_name(str(project.get("name", "")))
    extras = project.get("optional-dependencies") or {}
    if not isinstance(extras, dict):
        raise FlywheelError(f"{refuse}, whose pyproject.toml optional-dependencies are not a table")
    wanted = [e.strip() for e in target.partition("[")[2].rstrip("]").split(",") if e.strip()]
    found, seen = list(_strings(refuse, project.get("dependencies", []))), set()
    while wanted:
        extra = wanted.pop(0)
        if extra not in seen:
            seen.add(extra)
            if extra not in extras:
                raise FlywheelError(f"{refuse}: pyproject.toml has no extra {extra!r}")
            found += _strings(refuse, extras[extra])
            # `all = ["me[test]"]`: the project itself, with more extras
            wanted += [e for r in found if own and _named(r) == own for e in sorted(Requirement(r).extras)]
    return [r for r in found if not (own and _named(r) == own)]


def _named(requirement: str) -> str:
    try:
        return canonicalize_name(Requirement(requirement).name)
    except ValueError:
        return ""


def _strings(refuse: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FlywheelError(f"{refuse}, whose pyproject.toml dependencies are not a list of strings")
    return value


def _copy(where: str, instr: str, args: str, cwd: str) -> tuple[list[str], str, bool]:
    try:
        parts = json.loads(args) if args.startswith("[") else shlex.split(args)
    except ValueError:
        raise FlywheelError(f"{where}: cannot read {instr} {args}") from None
    flags = [p for p in parts if p.startswith("--")]
    parts = [p for p in parts if not p.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        raise _needs_docker(f"{where}: {instr} from another image or stage")
    if len(parts) < 2:
        raise FlywheelError(f"{where}: {instr} needs a source and a destination")
    *sources, dest = parts
    for s in sources:
        if instr == "ADD" and (re.match(r"^[a-z]+://|^git@", s) or re.search(r"\.(tar(\.\w+)?|tgz)$", s)):
            raise _needs_docker(f"{where}: ADD {s} (a download or an archive)")
    target = posixpath.normpath(posixpath.join(cwd, dest))
    return sources, target, dest.endswith("/") or len(sources) > 1 or target == cwd


def _image_files(
    copies: list[tuple[list[str], str, bool]], context: Mapping[str, Path]
) -> dict[str, tuple[str, Path]]:
    """Every file the COPYs put in the image: absolute path -> (the source as written, context file)."""
    out: dict[str, tuple[str, Path]] = {}
    for sources, dest, into_dir in copies:
        for source in sources:
            src = posixpath.normpath(source.lstrip("/") or ".")
            if src == ".":
                found = dict(context)
            elif src in context:
                found = {posixpath.basename(src) if into_dir else "": context[src]}
            else:
                found = {rel[len(src) + 1 :]: p for rel, p in context.items() if rel.startswith(src + "/")}
                if not found and any(c in src for c in "*?["):
                    found = {posixpath.basename(r): p for r, p in context.items() if _match(r, src)}
            if not found:
                raise FlywheelError(f"environment/Dockerfile copies {source}, which is not in environment/")
            for rel, p in found.items():
                out[posixpath.normpath(posixpath.join(dest, rel)) if rel else dest] = (source, p)
    return out


def _dockerignore(env: Path) -> list[str]:
    path = env / ".dockerignore"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line.strip("/") for line in lines if line and not line.startswith(("#", "!"))]


def _ignored(rel: str, pattern: str) -> bool:
    return _match(rel, pattern) or rel.startswith(pattern + "/")


def _match(rel: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(rel, pattern)
