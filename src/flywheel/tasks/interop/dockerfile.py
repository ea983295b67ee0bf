"""A Harbor task's `environment/Dockerfile`, read without Docker: accepted when its image is a Python
image (or a bare OS) plus files, refused naming the first instruction that needs its own container. The
repository is what its COPYs put under WORKDIR, `.dockerignore` applied."""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from flywheel.errors import FlywheelError
from flywheel.tasks.interop.draft import _files


class DockerPlan(NamedTuple):
    """What a Dockerfile we can run without Docker does: the repository's place and what it copies there."""

    workdir: str
    copies: list[tuple[list[str], str, bool]]  # (context sources, absolute destination, into a directory)


_HARMLESS = {
    "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "ARG", "MAINTAINER", "USER", "VOLUME", "STOPSIGNAL", "SHELL",
}  # fmt: skip
_HARMLESS_ENV = {
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_ROOT_USER_ACTION", "DEBIAN_FRONTEND", "LANG", "LC_ALL",
}  # fmt: skip


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


def docker_plan(text: str, context: Mapping[str, Path]) -> DockerPlan:
    """Read a Dockerfile whose image is a Python image plus files; raise FlywheelError naming the first
    instruction that needs its own Docker environment. `context` is the build context's files."""
    workdir: str | None = None
    base: str | None = None
    copies = []
    for n, instr, args in dockerfile_instructions(text):
        where = f"environment/Dockerfile line {n}"
        if instr == "FROM":
            image = args.split()[0] if args else ""
            if base is not None:
                raise _needs_docker(f"{where}: a multi-stage build")
            if not _python_image(image):
                raise _needs_docker(f"{where}: base image {image or '?'} is neither python nor a bare OS")
            base = image
        elif instr == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir or "/", _unquote(args)))
        elif instr in ("COPY", "ADD"):
            copies.append(_copy(where, instr, args, workdir or "/"))
        elif instr == "RUN":
            _check_run(where, args, context)
        elif instr == "ENV":
            _check_env(where, args)
        elif instr not in _HARMLESS:
            raise _needs_docker(f"{where}: {instr} {args}".strip())
    if base is None:
        raise FlywheelError("environment/Dockerfile has no FROM")
    if workdir is None:
        raise FlywheelError("environment/Dockerfile sets no WORKDIR, so the repository's place is unknown")
    return DockerPlan(workdir, copies)


def _needs_docker(what: str) -> FlywheelError:
    return FlywheelError(f"needs its own Docker environment ({what}); flywheel runs tasks without Docker")


def _unquote(text: str) -> str:
    words = shlex.split(text)
    return words[0] if words else ""


def _python_image(image: str) -> bool:
    """A python image, or a bare OS image a test.sh can install pytest on (Harbor's template uses ubuntu)."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return name in ("python", "ubuntu", "debian", "alpine") and "$" not in image


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


def _check_run(where: str, args: str, context: Mapping[str, Path]) -> None:
    if args.startswith("["):
        try:
            args = shlex.join(json.loads(args))
        except (ValueError, TypeError):
            raise FlywheelError(f"{where}: cannot read RUN {args}") from None
    for part in re.split(r"\s*(?:&&|\|\||;)\s*", args):
        try:
            words = shlex.split(part)
        except ValueError:
            raise FlywheelError(f"{where}: cannot read RUN {args}") from None
        if not words or words[0] == "mkdir":
            continue
        requirements = _pip_install(words, context)
        if requirements is None:
            raise _needs_docker(f"{where}: RUN {part}")
        for req in requirements:
            name = re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*", req)
            if name is None or "://" in req:
                raise _needs_docker(f"{where}: pip installs {req}")
            try:
                metadata.distribution(name.group(0))
            except metadata.PackageNotFoundError:
                raise _needs_docker(f"{where}: pip installs {req}, which is not installed here") from None


def _pip_install(words: list[str], context: Mapping[str, Path]) -> list[str] | None:
    """The requirements a `pip install` command names (reading `-r` files from the build context), or None
    when `words` is not one."""
    for prefix in (["pip"], ["pip3"], ["uv", "pip"], ["python", "-m", "pip"], ["python3", "-m", "pip"]):
        if words[: len(prefix)] == prefix and words[len(prefix) : len(prefix) + 1] == ["install"]:
            rest = words[len(prefix) + 1 :]
            break
    else:
        return None
    reqs, i = [], 0
    while i < len(rest):
        word = rest[i]
        if word in ("-r", "--requirement"):
            src = context.get(posixpath.normpath(rest[i + 1] if i + 1 < len(rest) else ""))
            if src is None:
                raise FlywheelError(f"pip reads {rest[i + 1 : i + 2] or ['?']}, which is not in environment/")
            reqs += _requirements(src.read_text())
            i += 2
        elif word in ("-e", "--editable") or word.startswith((".", "/")):
            raise _needs_docker(f"pip installs a local project ({' '.join(words)})")
        elif word in ("-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f", "--find-links"):
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            reqs.append(word)
            i += 1
    return reqs


def _requirements(text: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def _check_env(where: str, args: str) -> None:
    words = shlex.split(args)
    names = [w.split("=", 1)[0] for w in words] if words and "=" in words[0] else words[:1]
    for name in names:
        if name not in _HARMLESS_ENV:
            raise _needs_docker(f"{where}: ENV {name}")


def _copied_files(env: Path, plan: DockerPlan) -> dict[str, Path]:
    """The repository the plan's COPYs build: workdir-relative path -> file in the build context."""
    ignore = _dockerignore(env)
    context = {rel: p for rel, p in _files(env).items() if not any(_ignored(rel, pat) for pat in ignore)}
    repo: dict[str, Path] = {}
    for sources, dest, into_dir in plan.copies:
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
                target = posixpath.normpath(posixpath.join(dest, rel)) if rel else dest
                inside = posixpath.relpath(target, plan.workdir)
                if inside == "." or inside.startswith("../"):
                    raise FlywheelError(
                        f"environment/Dockerfile copies {source} to {target}, outside WORKDIR {plan.workdir}"
                    )
                repo[inside] = p
    return dict(sorted(repo.items()))


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
