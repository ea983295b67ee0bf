"""The output of `solve`: the run directory (`save_run`, all or nothing), the patch file, the lines that
close a run on stderr, and the patch applied to the repository only when all of it applies
(`apply_to_repo`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from flywheel.errors import PatchError
from flywheel.record import write_trajectories
from flywheel.solve.attempt import SolveResult
from flywheel.tasks.patch import apply_patch_to_dir


def save_run(out: Path, result: SolveResult, extra: dict[str, Any] | None = None) -> None:
    """Write `out/trajectories.jsonl`, `out/summary.json` and `out/patch.diff`, all or nothing: built in a
    sibling directory and renamed into place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_trajectories(tmp / "trajectories.jsonl", [result.record])
        (tmp / "summary.json").write_text(json.dumps({**(extra or {}), **result.summary()}, indent=1) + "\n")
        (tmp / "patch.diff").write_text(result.patch)
        if out.exists():  # an empty directory (check_inputs refuses any other)
            out.rmdir()
        tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def apply_to_repo(repo: Path, patch: str) -> None:
    """Apply `patch` to `repo` only if all of it applies; else PatchError and `repo` unchanged."""
    if not patch:
        return
    if (repo / ".git").exists() and shutil.which("git"):
        _git_apply(repo, patch)
    else:
        apply_patch_to_dir(repo, patch)  # computes every file before writing any


def _git_apply(repo: Path, patch: str) -> None:
    for args in (["--check"], []):  # git apply is atomic too; --check first says why it would not
        r = subprocess.run(
            ["git", "-C", str(repo), "apply", "--whitespace=nowarn", *args, "-"],
            input=patch,
            text=True,
            capture_output=True,
        )
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or ["git apply failed"])[0]
            raise PatchError(f"the patch does not apply to {repo}: {why.removeprefix('error: ')}")


def write_outputs(
    result: SolveResult, out: Path | None, patch_out: Path | None, about: dict[str, Any]
) -> None:
    """Save the run in `out` (`about` first in its summary) and write the patch to `patch_out`, each only
    where given."""
    if out is not None:
        save_run(out, result, about)
    if patch_out is not None:
        patch_out.write_text(result.patch)


def closing_lines(result: SolveResult, out: Path | None, patch_out: Path | None) -> list[str]:
    """The lines that close a run on stderr: ending, files, tests, cost, where things went."""
    r, tests = result.record, result.tests
    files = result.summary()["files_changed"]
    last = tests["last_run"]
    verdict = "no test command" if last is None else "passed" if last["passed"] else "failed"
    lines = [
        f"solve: {r.ending} after {r.n_turns} turns, {r.wall_s:.1f}s, cost ${r.cost:.6f}"
        + (f" ({r.error})" if r.error else ""),
        f"solve: {len(files)} file(s) changed" + (f": {', '.join(files)}" if files else ""),
        f"solve: the agent ran the tests {tests['agent_runs']} time(s)",
        f"solve: tests: {result.test_command}: {verdict}" if last else f"solve: tests: {verdict}",
    ]
    if patch_out is not None:
        lines.append(f"solve: patch written to {patch_out}")
    lines.append(f"solve: run saved in {out}" if out is not None else "solve: no --out: the run is not saved")
    return lines
