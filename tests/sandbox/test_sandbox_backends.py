"""Choosing backends by name, refusing bad requests, and the pure pieces (layout, argv, rewriting)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flywheel.protocols import Sandbox
from flywheel.sandbox import BACKENDS, SandboxError, available_backends, default_backend, get_sandbox
from flywheel.sandbox.bwrap import bwrap_argv
from flywheel.sandbox.cgroups import RunCgroup
from flywheel.sandbox.fallback import path_mapping, rewrite
from flywheel.sandbox.layout import build_layout, runtime_dirs
from flywheel.sandbox.limits import launcher


def test_every_available_backend_is_a_sandbox():
    assert "fallback" in available_backends()
    for name in available_backends():
        box = get_sandbox(name)
        assert isinstance(box, Sandbox)
        assert box.name == name
    assert default_backend() in BACKENDS


def test_default_follows_the_environment(monkeypatch):
    monkeypatch.setenv("FLYWHEEL_SANDBOX", "fallback")
    assert get_sandbox().name == "fallback"


def test_unknown_backend_is_refused():
    with pytest.raises(SandboxError, match="unknown sandbox backend 'nope'"):
        get_sandbox("nope")


def test_bad_requests_are_refused(sandbox, ws, tmp_path):
    with pytest.raises(SandboxError, match="not a directory"):
        sandbox.run(tmp_path / "missing", ["true"])
    with pytest.raises(SandboxError, match="empty"):
        sandbox.run(ws, [])
    with pytest.raises(SandboxError, match="does not exist"):
        sandbox.run(ws, ["true"], extra_ro={tmp_path / "missing": Path("/x")})
    with pytest.raises(SandboxError, match="absolute"):
        sandbox.run(ws, ["true"], extra_rw={ws: Path("relative")})


def test_exit_codes_and_signals(sandbox, ws):
    assert sandbox.run(ws, ["sh", "-c", "exit 3"]).exit_code == 3
    assert sandbox.run(ws, ["sh", "-c", "kill -9 $$"]).exit_code == 128 + 9


def test_runtime_dirs_keep_only_the_outermost(tmp_path):
    inner = tmp_path / "venv" / "inner"
    inner.mkdir(parents=True)
    assert runtime_dirs([str(inner), str(tmp_path / "venv")]) == [tmp_path / "venv"]


def test_layout_hides_directories_inside_mounts(tmp_path):
    runtime = tmp_path / "runtime"
    (runtime / "pkg" / "data").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    layout = build_layout(("/usr",), None, [str(runtime)], [runtime / "pkg" / "data", outside])
    assert ("ro", str(runtime), str(runtime)) in layout.mounts
    assert layout.hidden == (str(runtime / "pkg" / "data"),)  # `outside` is not mounted at all
    assert layout.path.startswith(f"{runtime}/bin:")


def test_bwrap_argv_mounts_workspace_and_hides_git(tmp_path):
    (tmp_path / ".git").mkdir()
    layout = build_layout((), None, [sys.prefix], [])
    argv = bwrap_argv(
        ["python", "-V"],
        workspace=tmp_path,
        layout=layout,
        env={"A": "1"},
        tmp_mb=64,
        extra_ro={Path("/srv/plugin"): Path("/plugin")},
        extra_rw={},
        as_root=True,
    )
    text = " ".join(argv)
    assert f"--bind {tmp_path} /workspace" in text
    assert "--perms 0555 --tmpfs /workspace/.git" in text
    assert "--ro-bind /srv/plugin /plugin" in text
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--die-with-parent" in argv
    assert argv[-3:] == ["--", "python", "-V"]
    assert text.index("--remount-ro /") > text.index("/plugin")


def test_launcher_joins_cgroups_and_sets_rlimits(tmp_path):
    cg = RunCgroup([tmp_path], {"pids": "cgroup v1 pids.max"})
    argv = launcher(["true"], cg, {"f": 2048})
    assert argv[:2] == ["/bin/sh", "-c"]
    assert f"echo 0 > {tmp_path}/cgroup.procs" in argv[2]
    assert "ulimit -f 2048" in argv[2]
    assert argv[-1] == "true"


def test_fallback_rewrites_sandbox_paths():
    mapping = path_mapping(Path("/host/ws"), {Path("/host/grader"): Path("/grader")})
    assert rewrite("/grader/runner.py", mapping) == "/host/grader/runner.py"
    assert rewrite("--rootdir=/workspace", mapping) == "--rootdir=/host/ws"
    assert rewrite("/workspace", mapping) == "/host/ws"
    assert rewrite("/graders", mapping) == "/graders"
    assert rewrite("-c", mapping) == "-c"
