"""Task environments built from the tests' own wheels (no package index): built once, used by a command."""

from __future__ import annotations

from flywheel.protocols import Environment
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.envs import ensure


def test_a_built_environment_serves_a_command_at_its_workdir(offline_envs, tmp_path):
    env = Environment(requirements=("greetlib==1.0",), env=(("GREETING", "yes"),), workdir="/app")
    built = ensure(env, label="t")
    assert built is not None and (built.path / "flywheel-env.json").is_file()
    ws = tmp_path / "ws"
    ws.mkdir()
    code = "import greetlib, os, sys; print(greetlib.greet('x'), os.getcwd(), os.environ['GREETING'], sys.prefix)"
    result = get_sandbox().run(ws, ["python", "-c", code], environment=env)
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["hello", "x", "/app", "yes", "/opt/flywheel/env"]
