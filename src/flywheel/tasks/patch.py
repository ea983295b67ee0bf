"""Unified diffs as pure functions: make one from two file maps, apply one to a file map.

A file map is `{relative posix path: text}`. Creation and deletion use `/dev/null` as in git's diffs.
Application is strict: every context and removed line must match exactly, hunks in order, or the
patch is refused with a `PatchError` that names the file and the hunk.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.errors import PatchError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def make_patch(old: Mapping[str, str], new: Mapping[str, str], context: int = 3) -> str:
    """Unified diff turning `old` into `new` (paths sorted, `a/` and `b/` prefixes)."""
    out: list[str] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        src = "/dev/null" if a is None else f"a/{path}"
        dst = "/dev/null" if b is None else f"b/{path}"
        lines = difflib.unified_diff(_lines(a or ""), _lines(b or ""), fromfile=src, tofile=dst, n=context)
        for line in lines:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


@dataclass
class _FilePatch:
    old_path: str | None
    new_path: str | None
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)  # (old start, lines with prefix)


def parse_patch(patch: str) -> list[_FilePatch]:
    """Split a unified diff into per-file hunks; raises PatchError on malformed input."""
    files: list[_FilePatch] = []
    lines = patch.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"malformed patch: '---' header without '+++' at line {i + 1}")
        fp = _FilePatch(_header_path(line[4:]), _header_path(lines[i + 1][4:]))
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise PatchError(f"malformed hunk header at line {i + 1}: {lines[i].strip()}")
            old_len = 1 if m.group(2) is None else int(m.group(2))
            new_len = 1 if m.group(4) is None else int(m.group(4))
            start, body = int(m.group(1)), []
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len or lines[i].startswith("\\")):
                ln = lines[i]
                tag = ln[:1]
                if tag == "\\":
                    if body:
                        body[-1] = body[-1].rstrip("\n")
                elif tag in (" ", "-", "+"):
                    body.append(ln if ln.endswith("\n") else ln + "\n")
                    seen_old += tag != "+"
                    seen_new += tag != "-"
                elif ln in ("\n", ""):  # some tools drop the space of an empty context line
                    body.append(" \n")
                    seen_old += 1
                    seen_new += 1
                else:
                    raise PatchError(f"malformed hunk line {i + 1}: {ln.rstrip()[:60]!r}")
                i += 1
            fp.hunks.append((start, body))
        if fp.old_path is None and fp.new_path is None:
            raise PatchError("malformed patch: both sides are /dev/null")
        files.append(fp)
    if not files and patch.strip():
        raise PatchError("malformed patch: no '---'/'+++' file headers found")
    return files


def _header_path(rest: str) -> str | None:
    path = rest.rstrip("\n").split("\t")[0].strip()
    if path == "/dev/null":
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    if path.startswith("/") or ".." in Path(path).parts:
        raise PatchError(f"patch names a path outside the repository: {path}")
    return path


def apply_patch(files: Mapping[str, str], patch: str) -> dict[str, str]:
    """Return a new file map with `patch` applied; `files` is not modified."""
    result = dict(files)
    for fp in parse_patch(patch):
        path = fp.new_path or fp.old_path
        assert path is not None
        if fp.old_path is None:
            if path in result:
                raise PatchError(f"patch creates {path}, which already exists")
            old_lines: list[str] = []
        else:
            if fp.old_path not in result:
                raise PatchError(f"patch modifies {fp.old_path}, which does not exist")
            old_lines = _lines(result[fp.old_path])
        new_lines = _apply_hunks(path, old_lines, fp.hunks)
        if fp.old_path is not None and fp.old_path != path:
            del result[fp.old_path]
        if fp.new_path is None:
            if new_lines:
                raise PatchError(f"patch deletes {path} but leaves lines behind")
            del result[path]
        else:
            result[path] = "".join(new_lines)
    return result


def _apply_hunks(path: str, old: list[str], hunks: list[tuple[int, list[str]]]) -> list[str]:
    out: list[str] = []
    pos = 0
    for n, (start, body) in enumerate(hunks, 1):
        want = [ln[1:] for ln in body if ln[0] != "+"]
        at = max(start - 1, 0) if want else start  # a pure insertion goes after line `start`
        if old[at : at + len(want)] != want or at < pos:
            raise PatchError(f"patch does not apply: {path}, hunk {n} (at line {start}) does not match")
        out.extend(old[pos:at])
        out.extend(ln[1:] for ln in body if ln[0] != "-")
        pos = at + len(want)
    out.extend(old[pos:])
    return out


def read_tree(root: Path) -> dict[str, str]:
    """Read every text file under `root` into a file map (binary files are skipped)."""
    files: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            try:
                files[p.relative_to(root).as_posix()] = p.read_text()
            except UnicodeDecodeError:
                continue
    return files


def apply_patch_to_dir(root: Path, patch: str) -> None:
    """Apply `patch` to the directory `root` in place; on failure nothing is written."""
    parsed = parse_patch(patch)
    touched = {p for fp in parsed for p in (fp.old_path, fp.new_path) if p}
    before = {p: (root / p).read_text() for p in touched if (root / p).is_file()}
    after = apply_patch(before, patch)
    for p in touched - set(after):
        (root / p).unlink()
    for p, text in after.items():
        if before.get(p) != text:
            (root / p).parent.mkdir(parents=True, exist_ok=True)
            (root / p).write_text(text)
