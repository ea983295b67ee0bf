"""Guarantee 6: no git history inside: the workspace's .git is hidden, the host's repositories absent."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import flywheel
from flywheel.sandbox import SandboxError

PROBE = """
import json, os, subprocess, sys
res = {"git_dir": sorted(os.listdir("/workspace/.git")) if os.path.isdir("/workspace/.git") else None}
res["host_repo"] = [p for p in sys.argv[1:] if os.path.exists(p)]
try:
    open("/workspace/.git/HEAD", "w").write("ref: refs/heads/evil")
    res["git_writable"] = True
except OSError:
    res["git_writable"] = False
log = subprocess.run(["git", "log", "--oneline"], capture_output=True, text=True)
res["git_log"] = [log.returncode, log.stdout]
print(json.dumps(res))
"""


def _repo(ws: Path) -> None:
    """A real repository with one commit in the workspace."""
    (ws / "a.txt").write_text("secret history\n")
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the fix is in here"], check=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_history_is_not_reachable(sandbox, ws, py):
    _repo(ws)
    host_repos = [str(Path(flywheel.__file__).resolve().parents[2] / ".git"), str(ws / ".git")]
    if sandbox.name == "fallback":
        with pytest.raises(SandboxError, match=".git"):  # it cannot hide .git, so it refuses the workspace
            sandbox.run(ws, py(PROBE, *host_repos))
        return
    result = sandbox.run(ws, py(PROBE, *host_repos))
    assert result.exit_code == 0, result.output
    res = json.loads(result.output)
    assert res["git_dir"] == []
    assert res["git_writable"] is False
    assert res["git_log"][0] != 0 and "the fix" not in res["git_log"][1]
    assert res["host_repo"] == []  # neither the project repository nor the workspace host path
    assert (ws / ".git" / "HEAD").read_text().startswith("ref: refs/heads/")  # the host repo is untouched
    assert "evil" not in (ws / ".git" / "HEAD").read_text()


def test_git_file_is_hidden(sandbox, ws):
    (ws / ".git").write_text("gitdir: /somewhere/else/.git\n")
    if sandbox.name == "fallback":
        with pytest.raises(SandboxError):
            sandbox.run(ws, ["cat", ".git"])
        return
    result = sandbox.run(ws, ["cat", ".git"])
    assert "somewhere" not in result.output  # covered by a node that cannot be read
    assert (ws / ".git").read_text().startswith("gitdir:")  # the host file is untouched
