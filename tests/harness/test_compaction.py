"""Model-written compaction: near the context limit the model summarises its working state and the episode
goes on from the summary. Driven by the scripted oracle behind a small fake that reports a context size."""

from __future__ import annotations

import pytest

from flywheel.errors import FlywheelError
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes
from flywheel.harness.prompts import RESUME_HEAD, SUMMARY_PROMPT
from flywheel.models.scripted import ScriptedModel
from flywheel.protocols import Completion, Request
from flywheel.record import Trajectory

# The oracle's prompts on the clamp task, in estimated tokens: 137, 285 (after the tests' output), 337, ...
# A 400-token context passes 80% after the `view`; a 300-token one after the first `run_tests`.


class Windowed(ScriptedModel):
    """The scripted oracle as a model with a context of `max_context` tokens; `summary` replaces its
    answer to a summary request. Records what it was asked."""

    def __init__(self, max_context: int | None, summary=None):
        super().__init__()
        self.max_context, self.summary, self.requests = max_context, summary, []

    def generate(self, requests):
        self.requests.extend(requests)
        out = super().generate(requests)
        if self.summary is not None:
            out = [
                self.summary(c) if r.meta.get("summary") else c for r, c in zip(requests, out, strict=True)
            ]
        return out


SUMMARY = HarnessConfig(compaction="summary")  # model-written compaction is opt-in for now


def run(task, model, cfg=None, **overrides):
    spec = EpisodeSpec(task, get_effort("medium", **overrides))
    return run_episodes([spec], model, cfg=cfg or SUMMARY, concurrency=1)[0]


def assistant(rec):
    return [t for t in rec.turns if t["role"] == "assistant"]


@pytest.mark.parametrize("action_format,context", [("tagged", 400), ("native", 320)])
def test_near_the_limit_the_model_summarises_and_the_conversation_restarts(
    clamp_task, action_format, context
):
    model = Windowed(context)  # passes 80% after the `view` (native prompts hold no action text)
    rec = run(clamp_task, model, HarnessConfig(action_format=action_format, compaction="summary"))
    assert rec.ending == "submitted" and rec.success and rec.compactions == 1
    turns = assistant(rec)
    assert [bool(t.get("summary")) for t in turns] == [False, False, True, False, False, False]
    assert rec.n_turns == 6  # the summary is a turn of its own
    i = rec.turns.index(turns[2])
    assert rec.turns[i - 1] == {"role": "user", "text": SUMMARY_PROMPT}
    assert rec.turns[i + 1] == {"role": "tool", "name": "compaction", "text": "summary", "ok": True}
    summary = turns[2]["text"]
    assert summary.startswith("Task: clamp-1.") and "Steps done: 2." in summary

    asked, after = model.requests[2], model.requests[3]
    assert asked.meta["summary"] and asked.messages[-1] == {"role": "user", "content": SUMMARY_PROMPT}
    assert asked.tools is None and asked.stop == []
    view = model.requests[2].messages[-2]["content"]  # the `view`'s output, the latest observation
    assert after.messages[:2] == model.requests[0].messages[:2]  # the system prompt and the task
    assert after.messages[2] == {
        "role": "user",
        "content": f"{RESUME_HEAD} {summary}\n\nThe output of your last action:\n{view}",
    }
    assert len(after.messages) == 3 and not after.meta.get("summary")
    assert rec.turns[i + 2] == {"role": "user", "text": after.messages[2]["content"]}

    assert rec.completion_tokens == sum(t["completion_tokens"] for t in turns)  # the summary's count
    assert rec.max_context_tokens == max(t["prompt_tokens"] + t["completion_tokens"] for t in turns)
    assert turns[3]["prompt_tokens"] < turns[1]["prompt_tokens"]  # the restarted prompt is the shorter
    assert Trajectory.from_json(rec.to_json()).max_context_tokens == rec.max_context_tokens


def test_budgets_count_across_the_boundary(clamp_task):
    rec = run(clamp_task, Windowed(400), max_turns=4)
    assert rec.ending == "turn_limit" and rec.n_turns == 4 and rec.compactions == 1
    full = run(clamp_task, Windowed(400))
    tokens = sum(t["completion_tokens"] for t in assistant(full)[:3])
    rec = run(clamp_task, Windowed(400), max_tokens=tokens)
    assert rec.ending == "token_limit" and rec.n_turns == 3 and assistant(rec)[-1].get("summary")


def test_an_ordinary_short_episode_is_unchanged(clamp_task):
    plain, roomy = run(clamp_task, Windowed(None)), run(clamp_task, Windowed(10_000))
    assert [t["text"] for t in roomy.turns] == [t["text"] for t in plain.turns]
    assert roomy.compactions == plain.compactions == 0 and roomy.n_turns == 5
    assert not any(t.get("summary") or t.get("name") == "compaction" for t in roomy.turns)
    assert roomy.max_context_tokens == max(
        t["prompt_tokens"] + t["completion_tokens"] for t in assistant(roomy)
    )
    elide = run(clamp_task, Windowed(400), HarnessConfig(compaction="elide"))  # no threshold: the old way
    assert [t["text"] for t in elide.turns] == [t["text"] for t in plain.turns]


def test_an_empty_summary_falls_back_to_elision(clamp_task):
    model = Windowed(
        400, summary=lambda c: Completion("  ", prompt_tokens=c.prompt_tokens, completion_tokens=1)
    )
    rec = run(clamp_task, model)
    assert rec.ending == "submitted" and rec.success and rec.compactions == 1
    assert {"role": "tool", "name": "compaction", "text": "elided", "ok": True} in rec.turns
    after = model.requests[3]
    assert "[older output elided]" in after.messages[3]["content"]  # the tests' first output
    assert not any(RESUME_HEAD in str(m["content"]) for m in after.messages)


def test_a_summary_too_long_for_the_restarted_prompt_falls_back_to_elision(clamp_task):
    model = Windowed(400, summary=lambda c: Completion("word " * 400, prompt_tokens=1, completion_tokens=400))
    rec = run(clamp_task, model)
    assert rec.ending == "submitted" and rec.compactions == 1
    assert not any(RESUME_HEAD in str(m["content"]) for r in model.requests for m in r.messages)


class Overflowing:
    """A model without a known context (as an `openai:` one) whose third answer is a context error."""

    name = "overflowing"
    native_tools = False

    def __init__(self):
        self.oracle, self.requests = ScriptedModel(), []

    def generate(self, requests):
        self.requests.extend(requests)
        if len(self.requests) == 3:
            return [Completion("", finish_reason="context")]
        return self.oracle.generate(requests)


def test_a_context_error_asks_for_a_summary_over_the_elided_conversation(clamp_task):
    model = Overflowing()
    rec = run(clamp_task, model)
    assert rec.ending == "submitted" and rec.success and rec.compactions == 1
    asked = model.requests[3]
    assert asked.meta["summary"] and "[older output elided]" in asked.messages[3]["content"]
    assert model.requests[4].messages[2]["content"].startswith(RESUME_HEAD)


def test_without_compaction_a_context_error_ends_the_attempt(clamp_task):
    model = Overflowing()
    rec = run(clamp_task, model, HarnessConfig(compaction="none"))
    assert rec.ending == "context_exhausted" and rec.compactions == 0 and rec.n_turns == 3


def test_the_scripted_teacher_answers_the_summary_prompt_with_a_summary(clamp_task):
    meta = {"task_dir": str(clamp_task.root), "episode": "e", "summary": True}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "<run_tests/>"},
        {"role": "user", "content": "exit code 1"},
        {"role": "user", "content": SUMMARY_PROMPT},
    ]
    [c] = ScriptedModel().generate([Request(messages, meta=meta)])
    assert c.finish_reason == "stop" and not c.tool_calls and "<" not in c.text
    assert c.text == (
        "Task: clamp-1. Files involved: mathx.py. Done so far: run_tests. Next: view mathx.py. Steps done: 1."
    )
    resumed = [*messages[:2], {"role": "user", "content": f"{RESUME_HEAD} {c.text}"}]
    [c] = ScriptedModel().generate([Request(resumed, meta={**meta, "summary": False})])
    assert c.text == '<view path="mathx.py"/>'  # it found its place in its plan


@pytest.mark.parametrize(
    "field,value",
    [("compact_at", 0.0), ("compact_at", 1.5), ("summary_prompt", " "), ("compaction", "fold")],
)
def test_bad_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(FlywheelError, match=f"harness {field}:"):
        HarnessConfig(**{field: value})
