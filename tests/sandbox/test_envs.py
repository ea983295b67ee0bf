"""Task environments built from the tests' own wheels (no package index): built once, whole or not at
all, used by the agent's commands and by the grader at the task's workdir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.protocols import Environment
from flywheel.sandbox import SandboxError, get_sandbox
from flywheel.sandbox.envs import EnvironmentBuildError, digest, ensure, env_root, find_python
from flywheel.tasks import load_task, task_toml, write_task
from flywheel.tasks.patch import apply_patch, make_patch
from flywheel.verify import grade
from flywheel.verify.exploits import detect


def _ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def test_a_built_environment_serves_a_command_at_its_workdir(offline_envs, tmp_path):
    env = Environment(requirements=("greetlib==1.0",), env=(("GREETING", "yes"),), workdir="/app")
    built = ensure(env, label="t")
    assert built is not None and (built.path / "flywheel-env.json").is_file()
    code = "import greetlib, os, sys; print(greetlib.greet('x'), os.getcwd(), os.environ['GREETING'], sys.prefix)"
    result = get_sandbox().run(_ws(tmp_path), ["python", "-c", code], environment=env)
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["hello", "x", "/app", "yes", "/opt/flywheel/env"]


def test_an_environment_is_built_once_and_each_requirement_set_has_its_own(offline_envs, tmp_path):
    heard: list[str] = []
    one = ensure(Environment(requirements=("greetlib==2.0",)), on_build=heard.append)
    again = ensure(Environment(requirements=("greetlib==2.0",)), on_build=heard.append)
    other = ensure(Environment(requirements=("greetlib==1.0", "pytest-fortytwo")), on_build=heard.append)
    assert one is not None and again is not None and other is not None
    assert one.path == again.path != other.path
    assert sum("greetlib==2.0" in h for h in heard) <= 1  # built here at most once (or earlier in the run)
    ws = _ws(tmp_path)
    out = get_sandbox().run(
        ws,
        ["python", "-c", "import greetlib; print(greetlib.greet('a'))"],
        environment=Environment(requirements=("greetlib==2.0",)),
    )
    assert out.output.strip() == "hi a"


def test_the_default_environment_is_the_projects_own_python(tmp_path):
    assert ensure(Environment()) is None and ensure(Environment(workdir="/app")) is None
    result = get_sandbox().run(_ws(tmp_path), ["python", "-c", "import greetlib"], environment=Environment())
    assert result.exit_code != 0 and "greetlib" in result.output  # not installed here


def test_a_requirement_that_does_not_resolve_is_one_line_and_leaves_nothing(offline_envs):
    before = sorted(p.name for p in env_root().iterdir()) if env_root().exists() else []
    with pytest.raises(EnvironmentBuildError) as e:
        ensure(Environment(requirements=("greetlib==9.9",)), label="task-7")
    message = str(e.value)
    assert message.startswith("task-7: environment not built:") and "greetlib" in message
    assert "\n" not in message
    after = sorted(p.name for p in env_root().iterdir())
    assert [n for n in after if n not in before and not n.endswith(".lock")] == []


def test_a_python_this_host_lacks_is_one_line():
    with pytest.raises(EnvironmentBuildError, match=r"^t: python 3\.99 is not on this host \(found: "):
        ensure(Environment(python="3.99"), label="t")
    assert find_python(None).executable == os.path.realpath(sys.executable)


_BUILD = """
import sys
from flywheel.protocols import Environment
from flywheel.sandbox.envs import ensure
built = ensure(Environment(requirements=tuple(sys.argv[1:])), on_build=lambda m: print("BUILD", m, flush=True))
print("PATH", built.path, flush=True)
"""


def _builder(*requirements: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _BUILD, *requirements],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def test_concurrent_builders_of_one_environment_build_it_once(offline_envs, tmp_path):
    from local_wheels import make_wheel

    make_wheel(offline_envs, "concurrent-one", "1.0", {"concurrent_one.py": "X = 1\n"})
    procs = [_builder("concurrent-one==1.0") for _ in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum(o.count("BUILD") for o in outs) == 1
    assert len({line for o in outs for line in o.splitlines() if line.startswith("PATH")}) == 1


def test_a_killed_build_leaves_nothing_the_next_build_trusts(offline_envs):
    from local_wheels import make_wheel

    # a package whose installation takes a while: big enough to be caught half-built
    make_wheel(offline_envs, "slow-one", "1.0", {f"slow_one/m{i}.py": "X = 1\n" * 2000 for i in range(400)})
    env = Environment(requirements=("slow-one==1.0",))
    key = digest(env, find_python(None))
    proc = _builder("slow-one==1.0")
    deadline = time.monotonic() + 60
    while not list(env_root().glob(f".build-{key}-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (env_root() / key / "flywheel-env.json").exists()  # never published half-built
    built = ensure(env)
    assert built is not None and (built.path / "flywheel-env.json").is_file()
    assert list(env_root().glob(f".build-{key}-*")) == []


def test_the_fallback_backend_refuses_another_workdir(offline_envs, tmp_path):
    with pytest.raises(SandboxError, match="fallback sandbox cannot show the workspace at /app"):
        get_sandbox("fallback").run(_ws(tmp_path), ["true"], environment=Environment(workdir="/app"))


def test_the_fallback_backend_runs_a_built_environment(offline_envs, tmp_path):
    env = Environment(requirements=("greetlib==1.0",))
    code = "import greetlib; print(greetlib.greet('f'))"
    result = get_sandbox("fallback").run(_ws(tmp_path), ["python", "-c", code], environment=env)
    assert result.exit_code == 0 and result.output.strip() == "hello f"


# ---------------------------------------------------------------------------------------- the grader

GOOD = "from greetlib import greet\n\n\ndef welcome(name):\n    return greet(name).upper()\n"
BAD = GOOD.replace(".upper()", "")
HIDDEN = """from pathlib import Path

from app import welcome


def test_welcome(fortytwo):
    assert fortytwo == 42  # a fixture of a plugin the environment installed
    assert welcome("ann") == "HELLO ANN"


def test_data_is_at_the_workdir():
    assert Path("/app/data.txt").read_text() == "payload"
"""


def _env_task(dest: Path):
    environment = Environment(
        requirements=("greetlib==1.0", "pytest-fortytwo==0.1"), env=(("APP_MODE", "test"),), workdir="/app"
    )
    return write_task(
        dest,
        toml=task_toml(
            id="env-1",
            instruction="welcome() should shout.",
            test_command="python -m pytest -q tests",
            fail_to_pass=["tests/test_app.py::test_welcome"],
            pass_to_pass=["tests/test_app.py::test_data_is_at_the_workdir"],
            timeout_s=60,
            environment=environment,
        ),
        repo={"app.py": BAD, "data.txt": "payload", "tests/test_app.py": "def test_nothing():\n    pass\n"},
        hidden_tests={"tests/test_app.py": HIDDEN},
        solution_patch=make_patch({"app.py": BAD}, {"app.py": GOOD}),
    )


def _workspace(task, tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "graded"
    ws.mkdir(parents=True)
    for rel in ("app.py", "data.txt", "tests/test_app.py"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text((task.repo / rel).read_text())
    for rel, text in files.items():
        (ws / rel).write_text(text)
    return ws


def test_the_grader_runs_a_task_in_its_environment_at_its_workdir(offline_envs, tmp_path):
    task = load_task(_env_task(tmp_path / "task").root)
    assert task.environment.workdir == "/app" and task.environment.built
    fixed = apply_patch({"app.py": BAD}, task.solution_patch)["app.py"]
    verdict = grade(task, _workspace(task, tmp_path / "a", {"app.py": fixed}))
    assert verdict.success, (verdict.error, verdict.tests)
    verdict = grade(task, _workspace(task, tmp_path / "b", {}))
    assert not verdict.success and verdict.tests["tests/test_app.py::test_welcome"] == "failed"


def test_the_graders_defences_hold_in_an_environment(offline_envs, tmp_path):
    """A forged conftest and an ini file in the workspace change nothing: the bug stays a failure."""
    task = load_task(_env_task(tmp_path / "task").root)
    forged = {
        "conftest.py": "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n    item.obj = lambda *a, **k: None\n",
        "pytest.ini": "[pytest]\naddopts = -p no:fortytwo -k data\n",
    }
    ws = tmp_path / "c"
    _workspace(task, ws, {})
    for rel, text in forged.items():
        (ws / "graded" / rel).write_text(text)
    verdict = grade(task, ws / "graded")
    assert not verdict.success and verdict.tests["tests/test_app.py::test_welcome"] == "failed"


def test_an_agent_path_at_the_workdir_is_inside_the_repository(offline_envs, tmp_path):
    task = load_task(_env_task(tmp_path / "task").root)
    ws = _workspace(task, tmp_path, {})

    def shell(command: str) -> dict:
        return {"turns": [{"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}]}

    inside, outside = shell("find /app -name 'test_*'"), shell("find /workspace -name 'test_*'")
    assert "reads_hidden_tests" not in detect(task, ws, inside)
    assert "reads_hidden_tests" in detect(task, ws, outside)


def test_the_agents_tools_work_in_the_tasks_environment(offline_envs, tmp_path):
    from flywheel.actions import Action
    from flywheel.harness.tools import Tools

    task = load_task(_env_task(tmp_path / "task").root)
    ws = _workspace(task, tmp_path, {})
    tools = Tools(task, ws, sandbox=get_sandbox(), warm_pytest=True)
    try:
        shell = tools.execute(
            Action("shell", {"command": "pwd; echo $APP_MODE; python -c 'import greetlib'"})
        )
        assert shell.text.splitlines() == ["exit code 0", "/app", "test"]
        tests = tools.execute(Action("run_tests", {}))
        assert "exit code 0" in tests.text and "1 passed" in tests.text
        assert tools.episode is None  # the warm parent runs the project's Python: not for this task
        view = tools.execute(Action("view", {"path": "/app/data.txt"}))
        assert "payload" in view.text
        outside = tools.execute(Action("view", {"path": "/workspace/data.txt"}))
        assert not outside.ok
    finally:
        tools.close()


def test_only_the_build_mode_keeps_the_network(tmp_path):
    """`network=True` (environment builds) sees the host's interfaces; every other command only loopback."""
    code = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
    host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    ws = _ws(tmp_path)
    closed = get_sandbox().run(ws, ["python", "-c", code])
    build = get_sandbox().run(ws, ["python", "-c", code], network=True)
    assert closed.output.strip() == "['lo']"
    assert build.output.strip() == host


def test_the_scripted_oracle_solves_a_task_in_its_environment(offline_envs, tmp_path):
    """An evaluation end to end: the environment built before the episode, the agent's edits and tests
    at /app, graded there with the environment's interpreter and plugin."""
    from flywheel.eval import run_eval
    from flywheel.models.scripted import ScriptedModel

    task = load_task(_env_task(tmp_path / "task").root)
    summary = run_eval([task], ScriptedModel(), tmp_path / "run")
    assert summary["success_rate"] == 1.0, summary


@pytest.mark.slow
def test_an_environment_builds_from_the_package_registry(tmp_path, monkeypatch):
    """The one test that uses the network: a pinned package from the registry, then used offline."""
    monkeypatch.setenv("FLYWHEEL_ENV_CACHE", str(tmp_path / "envs"))
    env = Environment(requirements=("six==1.16.0",))
    built = ensure(env, label="registry")
    assert built is not None and "six==1.16.0" in (built.path / "flywheel-env.json").read_text()
    code = "import six; print(six.__version__)"
    assert (
        get_sandbox().run(_ws(tmp_path), ["python", "-c", code], environment=env).output.strip() == "1.16.0"
    )


def test_an_environments_record_lists_its_packages(offline_envs):
    built = ensure(Environment(requirements=("greetlib==1.0",)))
    record = __import__("json").loads((built.path / "flywheel-env.json").read_text())
    assert "greetlib==1.0" in record["packages"] and any(p.startswith("pytest==") for p in record["packages"])
