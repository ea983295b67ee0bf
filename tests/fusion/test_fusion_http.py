"""Fusion with an `openai:` lead over real HTTP: `flywheel serve` on loopback serves `scripted-lead`, and
`flywheel eval --lead openai:scripted-lead?send_meta=true` runs it with a local sidekick.

The served lead reads its task from the request's `flywheel_meta` (the server runs on this machine), so
it views, delegates, reviews and submits as it does in process: the delegation's `<delegate>` (or the
`delegate` tool call) comes back over HTTP. The server logs each request it answers; every lead turn is
one of them, and no sidekick turn is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.record import read_trajectories

# `flywheel serve` as `python -m flywheel serve` runs it, with the server's request log on stderr
SERVE = (
    "import logging, sys; logging.basicConfig(format='%(message)s'); "
    "logging.getLogger('flywheel.serve.http').setLevel(logging.DEBUG); "
    "from flywheel.cli import main; main(sys.argv[1:])"
)
ANSWERED = '"POST /v1/chat/completions HTTP/1.1" 200'


@pytest.fixture(scope="module")
def served_lead(tmp_path_factory: pytest.TempPathFactory):
    """(base URL, request log) of `flywheel serve --model scripted-lead` on a free loopback port."""
    log = tmp_path_factory.mktemp("serve") / "requests.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, "serve", "--model", "scripted-lead", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving scripted-lead at http://127.0.0.1:"), log.read_text()
        yield line.split(" at ")[1].strip(), log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def answered(log: Path) -> int:
    return log.read_text().count(ANSWERED)


@pytest.mark.parametrize("tools", ["tagged", "native"])
def test_an_openai_lead_delegates_over_http(served_lead, clamp_task, tmp_path, tools):
    url, log = served_lead
    before, out = answered(log), tmp_path / "run"
    lead = f"openai:scripted-lead?send_meta=true&tools={tools}"
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "eval", "--suite", str(clamp_task.root.parent), "--lead", lead,
         "--base-url", url, "--sidekick", "scripted", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model_name"] == "openai:scripted-lead" and summary["success_rate"] == 1.0
    assert summary["delegations_per_attempt"] == 1.0 and summary["take_overs_per_attempt"] == 0.0
    assert summary["mean_lead_cost"] > 0 and summary["mean_sidekick_cost"] > 0
    assert summary["mean_cost"] == pytest.approx(summary["mean_lead_cost"] + summary["mean_sidekick_cost"])
    [record] = read_trajectories(out / "trajectories.jsonl")
    assert record.action_format == tools and record.fusion["sidekick"] == "scripted"
    assert record.fusion["lead"] == "openai:scripted-lead" and record.sidekick[0].model == "scripted"
    acted = [t["name"] for t in record.turns if t["role"] == "tool"]
    assert acted == ["view", "delegate", "run_tests", "submit"]
    lead_turns = sum(t["role"] == "assistant" for t in record.turns)
    assert answered(log) - before == lead_turns == record.n_turns
