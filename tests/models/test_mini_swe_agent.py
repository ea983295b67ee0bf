"""A real client drives `flywheel serve` end to end: mini-swe-agent fixes a task with bash commands only.

`flywheel serve --model scripted` runs as a subprocess on a free loopback port; mini-swe-agent's own
`DefaultAgent`, `LocalEnvironment` and litellm model classes, in both of its configurations (`text`: one
fenced ```` ```mswea_bash_command ```` block per answer; `tool`: a call of its one `bash` tool), work in a
copy of the task's repository until they echo `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`; the project's
grader, with the exploit detector reading the commands, grades the copy. The wiring is
`experiments/mini_swe_agent.py`'s, which measures the same on more tasks.

The scripted oracle reads its task from the request's `flywheel_meta` (litellm's `extra_body`); what it
does for a bash-only client is the server's own translation (`toolcalls`): `view` is `cat -n`, `edit` a
Python script, `run_tests` pytest and `submit` the sentinel echo.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from flywheel.tasks import Task, load_suite

pytest.importorskip("minisweagent", reason="mini-swe-agent is in the dev extra")

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("mini_swe_agent", ROOT / "experiments" / "mini_swe_agent.py")
mini = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = mini  # dataclasses look their module up
SPEC.loader.exec_module(mini)

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory):
    """The base URL of `flywheel serve --model scripted`, with mini-swe-agent's environment set."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in mini.ENV.items():
            mp.setenv(name, value)
        mp.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path_factory.mktemp("mswea")))
        with mini.served("scripted") as base_url:
            yield base_url


@pytest.fixture(scope="module")
def heldout_task() -> Task:
    return load_suite("toybugs", split="heldout")[0]


@pytest.mark.parametrize("config", ["text", "tool"])
def test_mini_swe_agent_fixes_the_clamp_task_through_flywheel_serve(url, clamp_task, tmp_path, config):
    run = mini.run_task(url, "scripted", clamp_task, tmp_path / "repo", config)
    assert run.exit_status == "Submitted" and run.verdict.success, run
    assert not run.verdict.cheat and run.verdict.fail_to_pass == (1, 1) and run.verdict.pass_to_pass == (2, 2)
    assert run.commands == (
        "python -m pytest -q",  # run_tests
        "cat -n mathx.py",  # view
        run.commands[2],  # edit: the Python replace script
        "python -m pytest -q",
        SUBMIT,
    )
    assert run.commands[2].startswith("python - <<'FLYWHEEL_EDIT'") and run.steps == 5
    bug = "if x >= hi + 1:"  # fixed in the copy, not in the task
    assert bug not in (tmp_path / "repo" / "mathx.py").read_text()
    assert bug in (clamp_task.repo / "mathx.py").read_text()


@pytest.mark.parametrize("config", ["text", "tool"])
def test_mini_swe_agent_fixes_a_toybugs_heldout_task(url, heldout_task, tmp_path, config):
    run = mini.run_task(url, "scripted", heldout_task, tmp_path / "repo", config)
    assert run.exit_status == "Submitted" and run.verdict.success, run
    assert run.commands[-1] == SUBMIT and run.steps == len(run.commands)


def test_a_run_out_of_steps_is_graded_as_a_failure(url, clamp_task, tmp_path):
    run = mini.run_task(url, "scripted", clamp_task, tmp_path / "repo", "tool", step_limit=2)
    assert run.exit_status == "LimitsExceeded" and run.steps == 2
    assert not run.verdict.success and run.verdict.fail_to_pass == (0, 1)  # it ran the tests and a view
