"""The trajectory record: its JSON shape, the one reader and writer, legacy keys, the lite copy."""

from __future__ import annotations

import json

import pytest

from flywheel.errors import FlywheelError
from flywheel.protocols import Verdict
from flywheel.record import (
    Trajectory,
    append_trajectories,
    read_trajectories,
    write_trajectories,
    write_trajectory,
)

KEYS = [
    "id", "task_id", "effort", "seed", "index", "policy_version", "model", "action_format", "turns",
    "n_turns", "usage", "wall_s", "compute_s", "tool_s", "gen_s", "cost", "ending", "error", "format_errors",
    "steps_to_first_edit", "compactions", "max_context_tokens", "verdict", "success", "workspace",
]  # fmt: skip


def graded(**kw) -> Trajectory:
    turns = [
        {"role": "system", "text": "s"},
        {"role": "assistant", "text": "<submit/>", "token_ids": [1, 2], "logprobs": [-0.1, -0.2],
         "kept": [[1], None], "prompt_ids": [7, 8], "finish_reason": "stop"},
        {"role": "tool", "name": "submit", "arguments": {}, "text": "ok", "ok": True},
    ]  # fmt: skip
    verdict = Verdict("t", success=True, fail_to_pass=(1, 1), tests={"tests/test_t.py::test_a": "passed"})
    base = dict(id="t/medium/s0/0", task_id="t", effort="medium", turns=turns, n_turns=1, prompt_tokens=10,
                completion_tokens=2, cost=0.5, verdict=verdict, success=True)  # fmt: skip
    return Trajectory(**{**base, **kw})


def test_the_json_shape_is_the_contract_key_for_key():
    data = graded().to_json()
    assert list(data) == KEYS
    assert data["usage"] == {"prompt_tokens": 10, "completion_tokens": 2}
    assert data["verdict"]["fail_to_pass"] == {"passed": 1, "total": 1} and "reward" not in data["verdict"]
    loop = graded(pool="pool-0", renamed_from="u", step=3, rl={"reward": 1.0}).to_json()
    assert list(loop) == [*KEYS, "pool", "renamed_from", "step", "rl"]  # optional fields only when set


def test_an_infrastructure_failure_is_written_only_when_set_and_read_back(tmp_path):
    failed = graded(ending="model_error", error="HTTP 500: boom", infra_failure="model_server")
    data = failed.to_json()
    assert list(data) == [*KEYS[:18], "infra_failure", *KEYS[18:]] and data["infra_failure"] == "model_server"
    assert "infra_failure" not in graded().to_json()
    assert Trajectory.from_json(data) == failed
    write_trajectories(tmp_path / "t.jsonl", [failed, graded()])
    assert [r.infra_failure for r in read_trajectories(tmp_path / "t.jsonl")] == ["model_server", None]


def test_a_record_comes_back_from_its_json_line(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    records = [graded(), graded(id="t/medium/s0/1", verdict=None, success=False, step=2, rl={"reward": 0.0})]
    write_trajectories(path, records)
    assert read_trajectories(path) == records
    append_trajectories(path, records[:1])
    with path.open("a") as f:
        write_trajectory(f, records[1])
    assert read_trajectories(path) == records * 2


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(graded().to_json()) + "\n" + '{"id": "t/medium/s0/1", "succ')
    assert read_trajectories(path) == [graded()]


def test_legacy_keys_are_dropped_and_unknown_keys_refused():
    data = graded().to_json()
    legacy = {**data, "reward": 1.0, "loop_version": 4, "verdict": {**data["verdict"], "reward": 1.0}}
    assert Trajectory.from_json(legacy) == graded()
    with pytest.raises(FlywheelError, match="unknown key 'rewards'"):
        Trajectory.from_json({**data, "rewards": 1.0})
    with pytest.raises(FlywheelError, match="unknown key 'score'"):
        Trajectory.from_json({**data, "verdict": {**data["verdict"], "score": 1}})
    with pytest.raises(FlywheelError, match="missing key 'effort'"):
        Trajectory.from_json({"id": "x", "task_id": "t"})


def test_lite_drops_only_the_per_token_replay_data():
    record = graded()
    lite = record.lite()
    assert [set(t) for t in lite.turns][1] == {"role", "text", "token_ids", "finish_reason"}
    assert lite.turns[2] == record.turns[2] and "kept" in record.turns[1]  # the original is unchanged
    assert (lite.id, lite.verdict, lite.success) == (record.id, record.verdict, record.success)
