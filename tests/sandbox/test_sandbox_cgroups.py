"""Per-run cgroups: parsing what the host offers, choosing a v2 parent, the files a run's cgroup gets.

The v2 path is unit-tested against a directory tree standing in for the cgroup file system (a real
cgroupfs creates the interface files itself; here they are plain files). Where this host's unified
hierarchy is writable, a run is also joined to a real v2 leaf, and killed and removed through it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flywheel.protocols import Limits
from flywheel.sandbox.cgroups import (
    CgroupHost,
    RunCgroup,
    create_cgroup,
    parse_mounts,
    parse_proc_cgroup,
    prepare_v2,
    v2_candidates,
)
from flywheel.sandbox.limits import launcher, mechanisms, rlimits, unenforced_warning
from flywheel.sandbox.supervise import run_supervised

MB = 1024 * 1024
HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V2_MOUNTS = """\
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0
"""
HYBRID_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/jobs/42\n0::/\n"
V2_CGROUP = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope\n"


def test_mounts_name_v1_controllers_and_the_v2_mount():
    assert parse_mounts(HYBRID_MOUNTS) == (
        {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids")},
        Path("/sys/fs/cgroup/unified"),
    )
    assert parse_mounts(V2_MOUNTS) == ({}, Path("/sys/fs/cgroup"))
    assert parse_mounts("") == ({}, None)


def test_proc_cgroup_gives_v1_paths_and_the_v2_path():
    v1, v2 = parse_proc_cgroup(HYBRID_CGROUP)
    assert (v1["memory"], v1["pids"], v2) == ("/jobs/42", "/", "/")
    assert parse_proc_cgroup(V2_CGROUP) == (
        {},
        "/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope",
    )


def test_v2_candidates_are_the_ancestors_nearest_first():
    root = Path("/sys/fs/cgroup")
    assert v2_candidates(root, "/a/b/c.scope") == [root / "a/b", root / "a", root]
    assert v2_candidates(root, "/") == [root]  # the root may hold processes and children with controllers
    assert v2_candidates(root, "/../outside") == []  # not in this namespace's view


def fake_cgroup(path: Path, controllers: str = "cpu memory pids", enabled: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers)
    (path / "cgroup.subtree_control").write_text(enabled)
    (path / "cgroup.procs").write_text("")
    return path


def test_prepare_v2_enables_controllers_below_the_nearest_usable_ancestor(tmp_path):
    root = fake_cgroup(tmp_path)
    fake_cgroup(root / "user.slice", "memory pids", "memory pids")  # a delegated parent
    fake_cgroup(root / "user.slice/session.scope", "memory pids")  # this process's own cgroup
    parent, offered = prepare_v2(v2_candidates(root, "/user.slice/session.scope"), {"pids", "memory"})
    assert (parent, offered) == (root / "user.slice/flywheel", {"pids", "memory"})
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (root / "user.slice/cgroup.subtree_control").read_text() == "memory pids"  # already enabled


def test_prepare_v2_skips_ancestors_that_lack_controllers_or_refuse(tmp_path):
    root = fake_cgroup(tmp_path, "memory pids")
    fake_cgroup(root / "a", "cpu")  # offers neither controller
    busy = fake_cgroup(root / "a/b", "memory pids")
    (busy / "cgroup.subtree_control").unlink()
    (busy / "cgroup.subtree_control").mkdir()  # writing fails, as EBUSY does for a cgroup with processes
    fake_cgroup(root / "a/b/c", "memory pids")
    parent, offered = prepare_v2(v2_candidates(root, "/a/b/c"), {"pids"})
    assert (parent, offered) == (root / "flywheel", {"pids"})
    assert (root / "cgroup.subtree_control").read_text() == "+pids"
    assert prepare_v2([root / "a"], {"pids", "memory"}) is None


def test_a_v2_run_cgroup_is_one_leaf_with_every_limit(tmp_path):
    parent = fake_cgroup(tmp_path / "flywheel")
    host = CgroupHost(v2=parent, v2_controllers=frozenset({"pids", "memory"}))
    cg = create_cgroup(Limits(max_procs=10, memory_mb=64), 2, host=host)
    (leaf,) = cg.dirs
    assert leaf.parent == parent
    written = {
        f: (leaf / f).read_text() for f in ("pids.max", "memory.max", "memory.swap.max", "memory.oom.group")
    }
    assert written == {
        "pids.max": "12",
        "memory.max": str(64 * MB),
        "memory.swap.max": "0",
        "memory.oom.group": "1",
    }
    assert cg.mechanisms == {"pids": "cgroup v2 pids.max", "memory": "cgroup v2 memory.max"}
    assert cg.procs_files == [leaf / "cgroup.procs"]
    assert "v" not in rlimits(Limits(), cg)  # memory is the cgroup's: no RLIMIT_AS


def test_v1_is_preferred_and_v2_fills_in(tmp_path):
    v1_pids = fake_cgroup(tmp_path / "pids")
    v2 = fake_cgroup(tmp_path / "unified/flywheel")
    host = CgroupHost(v1={"pids": v1_pids}, v2=v2, v2_controllers=frozenset({"pids", "memory"}))
    cg = create_cgroup(Limits(memory_mb=64), 0, host=host)
    assert cg.mechanisms == {"pids": "cgroup v1 pids.max", "memory": "cgroup v2 memory.max"}
    assert [d.parent for d in cg.dirs] == [v1_pids, v2]
    assert not (cg.dirs[1] / "pids.max").exists()


def test_v1_settings_keep_their_names(tmp_path):
    host = CgroupHost(v1={"memory": fake_cgroup(tmp_path / "memory")})
    cg = create_cgroup(Limits(memory_mb=32), 0, host=host)
    assert (cg.dirs[0] / "memory.limit_in_bytes").read_text() == str(32 * MB)
    assert (cg.dirs[0] / "memory.memsw.limit_in_bytes").read_text() == str(32 * MB)
    assert create_cgroup(Limits(), 0, enabled=False, host=host).dirs == []


def test_what_enforces_each_limit_and_the_warning():
    none = RunCgroup()
    as_root, as_user = mechanisms(none, as_root=True), mechanisms(none, as_root=False)
    assert as_root["processes"] == "not enforced (root without a pids cgroup)"
    assert (as_user["processes"], as_user["memory"]) == ("RLIMIT_NPROC", "RLIMIT_AS")
    assert unenforced_warning(as_root) == "sandbox: process count not enforced (root without a pids cgroup)"
    assert unenforced_warning(as_user) is None
    with_cgroup = RunCgroup([Path("/x")], {"pids": "cgroup v2 pids.max"})
    assert mechanisms(with_cgroup, as_root=True)["processes"] == "cgroup v2 pids.max"


def _real_v2_root() -> tuple[Path, str] | None:
    _, mount = parse_mounts(Path("/proc/self/mounts").read_text())
    _, own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    return (mount, own) if mount is not None and own is not None and os.access(mount, os.W_OK) else None


def test_a_run_joins_a_real_v2_leaf_and_is_killed_through_it(tmp_path):
    found = _real_v2_root()
    if found is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    name = f"flywheel-test-{os.getpid()}"
    prepared = prepare_v2(v2_candidates(*found), set(), name=name)  # no controllers: nothing enabled
    if prepared is None:
        pytest.skip("no cgroup v2 parent this process may use")
    parent = prepared[0]
    leaf = parent / "run"
    leaf.mkdir()
    cg = RunCgroup([leaf])
    try:
        daemon = "setsid sh -c 'sleep 1000 &' & sleep 0.2; cat /proc/self/cgroup"
        result = run_supervised(
            launcher(["sh", "-c", daemon], cg, {}),
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin"},
            limits=Limits(),
            cgroup=cg,
        )
        assert f"0::{found[1].rstrip('/')}/{name}/run" in result.output  # the command ran in the leaf
        assert cg.pids() == []  # the setsid daemon was killed through the cgroup
    finally:
        cg.remove()
        parent.rmdir()
    assert not parent.exists()
