"""The real agent loop, driven by the scripted oracle and by small fake models (no mocking)."""

from __future__ import annotations

import dataclasses

import pytest

from flywheel.harness import (
    ENDINGS,
    INFRA_ENDINGS,
    EpisodeSpec,
    HarnessConfig,
    Pricing,
    get_effort,
    run_episodes,
)
from flywheel.models.scripted import ScriptedModel
from flywheel.protocols import Completion


class FakeModel:
    """Answers every request with `reply(request)`; records what it was asked."""

    def __init__(self, reply, name="fake", native=False):
        self.reply, self.name, self.native_tools = reply, name, native
        self.requests = []

    def generate(self, requests):
        self.requests.extend(requests)
        return [self.reply(r) for r in requests]


def text(s, tokens=5, **kw):
    return lambda r: Completion(s, prompt_tokens=10, completion_tokens=tokens, **kw)


def run(task, model, effort="medium", cfg=None, **overrides):
    level = get_effort(effort, **overrides)
    return run_episodes([EpisodeSpec(task, level)], model, cfg=cfg or HarnessConfig(), concurrency=2)[0]


@pytest.mark.parametrize("action_format", ["tagged", "native"])
def test_scripted_oracle_solves_through_the_real_grader(clamp_task, action_format):
    rec = run(clamp_task, ScriptedModel(), cfg=HarnessConfig(action_format=action_format))
    assert rec.ending == "submitted" and rec.success and rec.verdict.success
    names = [t["name"] for t in rec.turns if t["role"] == "tool"]
    assert names == ["run_tests", "view", "edit", "run_tests", "submit"]
    assert rec.steps_to_first_edit == 3 and rec.n_turns == 5
    assert rec.verdict.fail_to_pass == (1, 1)
    assert rec.cost > 0 and rec.completion_tokens > 0


@pytest.mark.slow
def test_noisy_oracle_varies_but_still_solves(clamp_task):
    recs = run_episodes(
        [EpisodeSpec(clamp_task, get_effort("max"), seed=s) for s in range(4)],
        ScriptedModel(noisy=True),
        concurrency=4,
    )
    assert all(r.success for r in recs)
    assert len({r.n_turns for r in recs}) > 1


def test_variants_of_an_episode_have_their_own_ids_and_draw_the_same_random_numbers(clamp_task):
    model = FakeModel(text("<shell>ls</shell>"))
    specs = [EpisodeSpec(clamp_task, get_effort("medium", max_turns=n), variant=f"x{n}") for n in (2, 4)]
    specs.append(EpisodeSpec(clamp_task, get_effort("medium", max_turns=2), index=1))
    recs = run_episodes(specs, model, cfg=HarnessConfig(), concurrency=3)
    assert len({r.id for r in recs}) == 3 and recs[0].id.endswith("/x2")
    seeds = {}
    for request in model.requests:
        seeds.setdefault(request.meta["episode"], []).append(request.seed)
    short, long, other = (seeds[s.id] for s in specs)
    assert len(short) == 2 and long[:2] == short and len(set(long)) == 4
    assert other[0] != short[0]


def test_cohorts_take_turns_and_run_the_same_episodes_as_lockstep(clamp_task):
    """Two cohorts: each generate call holds one cohort's episodes, and every episode does what it did in
    the lockstep loop; episodes that end make room for pending ones in their cohort."""

    class Recording(ScriptedModel):
        def __init__(self):
            super().__init__(noisy=True)
            self.batches = []

        def generate(self, requests):
            self.batches.append([r.meta["episode"] for r in requests])
            return super().generate(requests)

    specs = [EpisodeSpec(clamp_task, get_effort("max"), seed=s) for s in range(5)]
    runs = {}
    for n in (1, 2):
        model = Recording()
        recs = run_episodes(specs, model, cfg=HarnessConfig(cohorts=n), concurrency=4)
        runs[n] = (sorted(recs, key=lambda r: r.id), model.batches)
    (lockstep, one_batches), (cohorts, two_batches) = runs[1], runs[2]
    assert [r.id for r in cohorts] == [s.id for s in specs]
    assert [[t["text"] for t in r.turns] for r in cohorts] == [[t["text"] for t in r.turns] for r in lockstep]
    assert [r.success for r in cohorts] == [r.success for r in lockstep]
    assert max(map(len, one_batches)) == 4 and max(map(len, two_batches)) == 2
    first, second = set(two_batches[0]), set(two_batches[1])
    assert first.isdisjoint(second) and len(first | second) == 4  # the first four, two to a cohort
    assert len({r.n_turns for r in lockstep}) > 1  # the episodes differ, so the comparison means something


def test_cost_is_priced_from_usage_and_compute_time(clamp_task):
    price = Pricing(prompt_per_m=1e6, completion_per_m=2e6, per_second=0.0)
    rec = run(clamp_task, FakeModel(text("<submit/>", tokens=7)), cfg=HarnessConfig(pricing=price))
    assert rec.cost == pytest.approx(10 * 1.0 + 7 * 2.0)


@pytest.mark.parametrize(
    "ending,model,overrides",
    [
        ("submitted", FakeModel(text("<submit/>")), {}),
        ("turn_limit", FakeModel(text('<view path="mathx.py"/>')), {"max_turns": 2}),
        ("token_limit", FakeModel(text('<view path="mathx.py"/>', tokens=400)), {"max_tokens": 1000}),
        ("time_limit", FakeModel(text('<view path="mathx.py"/>')), {"wall_s": 0.0}),
        ("cost_limit", FakeModel(text('<view path="mathx.py"/>')), {"max_cost": 1e-9}),
        ("context_exhausted", FakeModel(text("", finish_reason="context")), {}),
        ("format_errors", FakeModel(text("I am thinking about it.")), {}),
        ("model_error", FakeModel(text("", finish_reason="error", error="server exploded")), {}),
    ],
)
def test_every_ending_is_typed_and_recorded(clamp_task, ending, model, overrides):
    rec = run(clamp_task, model, **overrides)
    assert rec.ending == ending
    assert rec.verdict is not None and rec.success is False
    assert rec.infra_failure == ("model_server" if ending == "model_error" else None)
    if ending == "model_error":
        assert rec.error == "server exploded"
    if ending == "format_errors":
        assert rec.format_errors == HarnessConfig().max_format_errors


def test_the_time_limit_counts_an_attempts_own_seconds_not_its_neighbours(clamp_task):
    """Two attempts share each 0.2 s generate call: the one that writes 1 token in 100 is charged 1% of it."""
    import time

    first: list[str] = []

    def reply(r):
        first.append(first[0] if first else r.meta["episode"])
        tokens = 1 if r.meta["episode"] == first[0] else 99
        return Completion('<view path="mathx.py"/>', prompt_tokens=10, completion_tokens=tokens)

    class Slow(FakeModel):
        def generate(self, requests):
            time.sleep(0.2)
            return super().generate(requests)

    level = get_effort("medium", wall_s=0.5, max_turns=5)
    specs = [EpisodeSpec(clamp_task, level, seed=s) for s in (0, 1)]
    recs = run_episodes(specs, Slow(reply), concurrency=2)
    endings = {r.id == first[0]: r.ending for r in recs}
    assert endings == {True: "turn_limit", False: "time_limit"}


def test_endings_list_is_complete():
    assert set(ENDINGS) == {
        "submitted",
        "turn_limit",
        "token_limit",
        "time_limit",
        "cost_limit",
        "context_exhausted",
        "format_errors",
        "model_error",
        "sandbox_error",
    }
    assert INFRA_ENDINGS == {"model_error": "model_server", "sandbox_error": "sandbox"}


def test_self_compaction_shortens_old_observations(clamp_task):
    calls = {"n": 0}

    def reply(r):
        calls["n"] += 1
        if calls["n"] == 4:
            return Completion("", prompt_tokens=10, completion_tokens=1, finish_reason="context")
        return Completion(
            '<view path="mathx.py"/>' if calls["n"] < 5 else "<submit/>",
            prompt_tokens=10,
            completion_tokens=5,
        )

    rec = run(clamp_task, FakeModel(reply))
    assert rec.ending == "submitted" and rec.compactions == 1


def test_a_conversation_that_still_does_not_fit_ends_instead_of_compacting_forever(clamp_task):
    """Observations already elided cannot be shortened again: the next overflow ends the attempt."""
    calls = {"n": 0}

    def reply(r):
        calls["n"] += 1
        if calls["n"] <= 3:
            return Completion('<view path="mathx.py"/>', prompt_tokens=10, completion_tokens=5)
        return Completion("", prompt_tokens=10, completion_tokens=1, finish_reason="context")

    rec = run(clamp_task, FakeModel(reply), max_turns=50)
    assert rec.ending == "context_exhausted" and rec.compactions == 1 and rec.n_turns == 5


def test_compaction_turns_count_toward_the_turn_limit(clamp_task):
    """Every overflow that compaction can still answer is a turn: the budget ends the attempt."""
    calls = {"n": 0}

    def reply(r):
        calls["n"] += 1
        if calls["n"] in (3, 5):  # each time a new, not yet elided observation is there to shorten
            return Completion("", prompt_tokens=10, completion_tokens=1, finish_reason="context")
        return Completion('<view path="mathx.py"/>', prompt_tokens=10, completion_tokens=5)

    rec = run(clamp_task, FakeModel(reply), max_turns=5)
    assert rec.ending == "turn_limit" and rec.n_turns == 5 and rec.compactions == 2


def test_agent_cannot_see_hidden_tests_through_any_tool(clamp_task):
    root = clamp_task.root
    probes = [
        "<shell>cat tests/test_mathx.py</shell>",
        f"<shell>cat {root}/tests/tests/test_mathx.py; ls {root}</shell>",
        "<shell>grep -rl test_clamp_low /tmp /root /home /work /workspace 2>/dev/null | head</shell>",
        f'<view path="{root}/tests/tests/test_mathx.py"/>',
        '<view path="../../tests/tests/test_mathx.py"/>',
        "<run_tests/>",
        "<submit/>",
    ]
    it = iter(probes)
    rec = run(
        clamp_task, FakeModel(lambda r: Completion(next(it), prompt_tokens=1, completion_tokens=1)), "max"
    )
    observations = [t["text"] for t in rec.turns if t["role"] == "tool"]
    assert len(observations) == len(probes)
    assert not any("test_clamp_low" in o for o in observations), observations
    assert "outside the repository" in observations[3]


def test_malformed_action_gets_an_error_observation_and_the_episode_goes_on(clamp_task):
    it = iter(["<view/>", "<submit/>"])
    model = FakeModel(lambda r: Completion(next(it), prompt_tokens=1, completion_tokens=1))
    rec = run(clamp_task, model)
    assert rec.ending == "submitted" and rec.format_errors == 1
    assert "needs a path" in model.requests[1].messages[-1]["content"]


def test_in_process_token_data_is_recorded(clamp_task):
    reply = text("<submit/>", token_ids=[1, 2], logprobs=[-0.1, -0.2], kept=[[1, 3], None], prompt_ids=[9])
    rec = run(clamp_task, FakeModel(reply))
    turn = next(t for t in rec.turns if t["role"] == "assistant")
    assert turn["token_ids"] == [1, 2] and turn["kept"] == [[1, 3], None] and turn["prompt_ids"] == [9]


def test_effort_marker_reaches_the_system_prompt(clamp_task):
    model = FakeModel(text("<submit/>"))
    for effort in ("medium", "high", "max"):
        run(clamp_task, model, effort)
    systems = [r.messages[0]["content"] for r in model.requests]
    assert [get_effort(e).marker in s for e, s in zip(("medium", "high", "max"), systems, strict=True)] == [
        True
    ] * 3
    assert dataclasses.asdict(get_effort("max"))["max_turns"] > get_effort("medium").max_turns


def test_a_crashing_grader_is_recorded_as_a_failed_verdict(clamp_task):
    def crash(task, workspace, trajectory):
        raise RuntimeError("boom")

    spec = EpisodeSpec(clamp_task, get_effort("medium"))
    [rec] = run_episodes([spec], FakeModel(text("<submit/>")), grader=crash)
    assert rec.ending == "submitted" and not rec.success
    assert rec.verdict.task_id == clamp_task.id and rec.verdict.error.startswith("grader crashed")
    assert rec.infra_failure == "grader"  # the policy's ending, the grader's failure


class BrokenSandbox:
    """A sandbox that cannot start a command (as bwrap does when it may not create namespaces)."""

    name = "broken"

    def run(self, workspace, argv, **kw):
        raise OSError("bwrap: creating new namespace failed")


def test_a_sandbox_that_raises_ends_the_attempt_as_an_infrastructure_failure(clamp_task):
    graded = []
    model = FakeModel(text("<shell>ls</shell>"))
    spec = EpisodeSpec(clamp_task, get_effort("medium"))
    [rec] = run_episodes([spec], model, sandbox=BrokenSandbox(), grader=lambda *a: graded.append(a))
    assert rec.ending == "sandbox_error" and rec.infra_failure == "sandbox"
    assert rec.error == "OSError: bwrap: creating new namespace failed"
    assert len(model.requests) == 1 and rec.n_turns == 1  # the exception never reached the model
    assert rec.turns[-1]["name"] == "shell" and rec.turns[-1]["ok"] is False
    assert rec.verdict is None and not rec.success and graded == []  # not graded in that sandbox


def test_a_command_that_fails_or_times_out_is_the_policys_observation(clamp_task):
    it = iter(["<shell>echo no; exit 3</shell>", "<shell>sleep 5</shell>", "<submit/>"])
    model = FakeModel(lambda r: Completion(next(it), prompt_tokens=1, completion_tokens=1))
    rec = run(clamp_task, model, cfg=HarnessConfig(command_timeout_s=0.5))
    assert rec.ending == "submitted" and rec.infra_failure is None and rec.error is None
    shells = [t["text"] for t in rec.turns if t.get("name") == "shell"]
    assert shells[0] == "exit code 3\nno" and shells[1].startswith("timed out")


def test_a_workspace_that_cannot_be_copied_is_recorded_without_a_model_call(clamp_task):
    import shutil

    shutil.rmtree(clamp_task.repo)
    model = FakeModel(text("<submit/>"))
    [rec] = run_episodes([EpisodeSpec(clamp_task, get_effort("medium"))], model, concurrency=2)
    assert rec.ending == "sandbox_error" and rec.infra_failure == "sandbox"
    assert rec.error.startswith("the workspace could not be copied") and model.requests == []
    assert rec.n_turns == 0 and rec.verdict is None
