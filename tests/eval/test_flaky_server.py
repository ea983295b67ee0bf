"""An inference server that fails some requests, over real HTTP: the attempts it broke are kept, recorded
as the infrastructure's failures, reported apart by evaluation and masked by the trainer's score."""

from __future__ import annotations

import pytest

from flywheel.eval import summarize
from flywheel.eval.run import make_specs, rollout
from flywheel.harness import HarnessConfig, get_effort
from flywheel.models.openai_backend import load_openai_model
from flywheel.models.scripted import ScriptedModel
from flywheel.protocols import Completion
from flywheel.rubric import score
from flywheel.serve import ServerConfig, serve_model


class FlakyModel:
    """The scripted oracle, failing every `period`-th request it is given (counted across batches).

    A failed request comes back as `Completion(error=...)`, which the server answers with HTTP 500 for that
    request alone (raising would fail its whole batch). Records the episode of each failed request.
    """

    def __init__(self, period: int):
        self.inner, self.period = ScriptedModel(), period
        self.name = self.inner.name
        self.seen, self.failed = 0, []

    def generate(self, requests):
        out = self.inner.generate(requests)
        for i, r in enumerate(requests):
            self.seen += 1
            if self.seen % self.period == 0:
                self.failed.append(r.meta["episode"])
                out[i] = Completion("", finish_reason="error", error="injected outage")
        return out


def flaky_rollout(task, attempts: int, period: int):
    """`attempts` scripted attempts at `task` through `openai:` against a server failing 1 in `period`."""
    flaky = FlakyModel(period)
    srv, _ = serve_model(flaky, config=ServerConfig(batch_window_s=0.002))
    try:
        model = load_openai_model(
            "openai:scripted", base_url=srv.url, send_meta=True, max_retries=0, connect_retries=0
        )
        specs = make_specs([task], [get_effort("medium")], attempts, seed=0)
        records = rollout(model, specs, HarnessConfig(), concurrency=8)
    finally:
        srv.close()
    return flaky, records


def check_masked(flaky: FlakyModel, records) -> dict[str, int]:
    """Every attempt with a failed request is recorded, reported and masked as one; returns the counts."""
    failed = set(flaky.failed)
    assert len(failed) == len(flaky.failed) >= 1  # no retries: an attempt ends at its first failed request
    infra = [r for r in records if r.infra_failure is not None]
    assert {r.id for r in infra} == failed
    assert all(r.infra_failure == "model_server" and r.ending == "model_error" for r in infra)
    assert all("HTTP 500" in r.error and "injected outage" in r.error for r in infra)
    assert all(r.ending == "submitted" and r.success for r in records if r.infra_failure is None)
    s = summarize(records)
    assert (s["n"], s["n_valid"], s["infra_failures"]) == (
        len(records),
        len(records) - len(failed),
        len(failed),
    )
    assert s["infra_causes"] == {"model_server": len(failed)} and s["success_rate"] == 1.0
    scores = score(records, {"medium": 10.0}, "mean", deterministic=False)
    masked = [r.id for r, x in zip(records, scores, strict=True) if r.infra_failure and x["advantage"] == 0.0]
    assert set(masked) == failed
    valid = [x["advantage"] for r, x in zip(records, scores, strict=True) if r.infra_failure is None]
    assert sum(valid) == pytest.approx(0.0, abs=1e-12)  # the baseline is the valid attempts' mean
    return {"attempts": len(records), "requests": flaky.seen, "failed": len(failed), "masked": len(masked)}


def test_attempts_a_flaky_server_broke_are_kept_reported_apart_and_masked(clamp_task):
    check_masked(*flaky_rollout(clamp_task, attempts=6, period=10))


@pytest.mark.slow
def test_a_server_failing_one_request_in_ten_masks_every_attempt_it_broke(clamp_task):
    counts = check_masked(*flaky_rollout(clamp_task, attempts=40, period=10))
    print(counts)
    assert counts["masked"] == counts["failed"]
