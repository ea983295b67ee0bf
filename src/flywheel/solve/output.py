"""The output of `solve`: the run directory (`save_run`, all or nothing) with its `PR.md`
(`pull_request`), the patch file, the branch (`Branch`, committed by `flywheel.solve.git`), the lines that
close a run on stderr, and the patch applied to the repository only when all of it applies
(`apply_to_repo`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError, PatchError
from flywheel.record import write_trajectories
from flywheel.solve.attempt import SolveResult, changed_files, last_message
from flywheel.solve.git import Base, commit_branch
from flywheel.tasks.patch import apply_patch_to_dir


def save_run(
    out: Path, result: SolveResult, extra: dict[str, Any] | None = None, pr: str | None = None
) -> None:
    """Write `out/trajectories.jsonl`, `out/summary.json`, `out/patch.diff` and, when given, `out/PR.md`,
    all or nothing: built in a sibling directory and renamed into place."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_trajectories(tmp / "trajectories.jsonl", [result.record])
        (tmp / "summary.json").write_text(json.dumps({**(extra or {}), **result.summary()}, indent=1) + "\n")
        (tmp / "patch.diff").write_text(result.patch)
        if pr is not None:
            (tmp / "PR.md").write_text(pr)
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
    """Save the run in `out` (`about` first in its summary; `about["instruction"]` and, where there is
    one, `about["branch"]` go into its PR.md) and write the patch to `patch_out`, each only where given."""
    if out is not None:
        branch = about.get("branch")
        save_run(out, result, about, pull_request(result, about["instruction"], branch))
    if patch_out is not None:
        patch_out.write_text(result.patch)


def diff_stat(patch: str) -> str:
    """The diff's stat, as `git diff --stat` writes it: a line per file, then the totals."""
    counts: dict[str, list[int]] = {path: [0, 0] for path in changed_files(patch)}
    path = None
    for line in patch.splitlines():
        if line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t")[0]
            path = name[2:] if name != "/dev/null" else path
        elif path in counts and line[:1] in "+-" and line:
            counts[path][line[0] == "-"] += 1
    if not counts:
        return "no change"
    width = max(map(len, counts))
    lines = [f" {p:<{width}} | {a + d:3d} {'+' * a}{'-' * d}" for p, (a, d) in counts.items()]
    added, deleted = (sum(c[k] for c in counts.values()) for k in (0, 1))
    return "\n".join(
        [*lines, f" {len(counts)} file(s) changed, {added} insertion(s)(+), {deleted} deletion(s)(-)"]
    )


def pull_request(result: SolveResult, instruction: str, branch: dict[str, Any] | None = None) -> str:
    """PR.md: the instruction, the agent's summary, the diff's stat, the tests before and after the change,
    and what the attempt took (turns, tokens, cost, model); the branch and commit where there are."""
    r, tests = result.record, result.tests
    summary = last_message(r) or "(the agent left no message)"
    head = [f"# {subject(instruction)}", ""]
    if branch:
        head += [f"Branch `{branch['name']}`, commit `{branch['commit']}` (parent `{branch['parent']}`)."]
        head += (
            ["It holds the uncommitted changes of the checkout too.", ""] if branch["uncommitted"] else [""]
        )
    return "\n".join(
        [
            *head,
            "## Instruction",
            "",
            instruction.strip(),
            "",
            "## Summary",
            "",
            summary,
            "",
            "## Changes",
            "",
            "```",
            diff_stat(result.patch),
            "```",
            "",
            "## Tests",
            "",
            f"Command: `{result.test_command}`"
            if result.test_command
            else "No test command was found or given.",
            "",
            *_test_lines(tests),
            "",
            "## The attempt",
            "",
            f"- model: {r.model} (effort {r.effort}); ending: {r.ending}"
            + (f" ({r.error})" if r.error else ""),
            f"- turns: {r.n_turns}; tokens: {r.prompt_tokens} prompt, {r.completion_tokens} completion",
            f"- cost: ${r.cost:.6f}; wall time: {r.wall_s:.1f}s",
            "",
        ]
    )


def _test_lines(tests: dict[str, Any]) -> list[str]:
    lines = []
    for when, key in (("before the change", "first_run"), ("after the change", "last_run")):
        run = tests.get(key)
        if run is not None:
            verdict = "passed" if run["passed"] else "failed"
            tail = _result_line(run["output"])
            lines.append(f"- {when}: {verdict}" + (f" ({tail})" if tail else ""))
            lines += [f"  - `{t}`" for t in _failures(run["output"])]
    lines.append(f"- the agent ran the tests {tests.get('agent_runs', 0)} time(s)")
    return lines


PYTEST_TIME = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?$")
FAILURES_SHOWN = 10


def _result_line(output: str | None) -> str:
    """pytest's summary line (`1 failed, 2 passed`, its time left out), when the output ends with one."""
    for line in reversed((output or "").strip().splitlines()):
        line = line.strip(" =")
        if any(w in line for w in (" passed", " failed", " error", "no tests ran")):
            return PYTEST_TIME.sub("", line)
    return ""


def _failures(output: str | None) -> list[str]:
    """The tests pytest's short summary names as failed or in error (the first `FAILURES_SHOWN`)."""
    found = [ln.split(" - ")[0] for ln in (output or "").splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return found[:FAILURES_SHOWN]


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


SUBJECT_CHARS = 72


def subject(text: str) -> str:
    """A title of at most `SUBJECT_CHARS` from `text`'s first line: its first sentence where that is
    short enough, else its words cut with an ellipsis."""
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if len(line) <= SUBJECT_CHARS:
        return line
    sentence = re.split(r"(?<=[.;!?])\s", line, maxsplit=1)[0].rstrip(".;")
    if len(sentence) <= SUBJECT_CHARS:
        return sentence
    return line[: SUBJECT_CHARS - 1].rsplit(" ", 1)[0].rstrip(" ,;:") + "…"


def commit_message(text: str) -> str:
    """`text` as a commit message: a subject line (`subject`), then the whole text where the subject is
    not all of it."""
    text = text.strip()
    title = subject(text)
    return text if title == text.splitlines()[0] else f"{title}\n\n{text}"


def commit_result(result: SolveResult, base: Base, name: str, instruction: str) -> dict[str, Any]:
    """Commit the attempt's diff on the new branch `name` (see `flywheel.solve.git`); what PR.md and
    summary.json say of it. The commit message is the agent's last message, else the instruction."""
    message = commit_message(last_message(result.record) or instruction)
    commit = commit_branch(base, result.patch, message, name)
    return {"name": name, "commit": commit, "parent": base.head, "uncommitted": base.includes_uncommitted}


def deliver(
    result: SolveResult,
    repo: Path,
    about: dict[str, Any],
    out: Path | None,
    patch_out: Path | None,
    branch: tuple[Base, str] | None = None,
) -> list[str]:
    """Commit the branch (where `branch` gives its base and name, and the agent changed something), then
    save the run and the patch file; the closing lines. A commit that fails is raised after the run is
    saved (without the branch)."""
    failed = None
    if branch is not None and result.patch:
        try:
            about = {**about, "branch": commit_result(result, *branch, about["instruction"])}
        except FlywheelError as e:
            failed = e
    write_outputs(result, out, patch_out, about)
    lines = closing_lines(result, out, patch_out)
    if branch is not None and not result.patch:
        lines.append("solve: no change: no branch was made")
    elif "branch" in about:
        b = about["branch"]
        lines.append(f"solve: committed {b['commit'][:12]} on the new branch {b['name']} of {repo}")
    if failed is not None:
        raise FlywheelError(f"{failed} (the run is saved; the checkout is unchanged)")
    return lines
