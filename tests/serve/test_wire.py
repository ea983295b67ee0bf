"""The OpenAI wire format's pure functions: request parsing, error mapping, responses, stream text."""

from __future__ import annotations

import pytest

from flywheel.protocols import Completion
from flywheel.serve.wire import ApiError, chat_response, check_completions, parse_chat_request, settled

BODY = {"model": "shout", "messages": [{"role": "user", "content": "hi"}]}


def test_parse_chat_request_fields():
    body = dict(
        BODY,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ],
        max_completion_tokens=9,
        temperature=0,
        top_p=0.5,
        stop="END",
        seed=1,
        tools=[{"type": "function", "function": {"name": "t"}}],
        tool_choice="none",
    )
    [r] = parse_chat_request(body)
    assert r.messages == [{"role": "user", "content": "ab"}]
    assert (r.max_tokens, r.temperature, r.top_p, r.stop, r.seed, r.tools) == (9, 0.0, 0.5, ["END"], 1, None)
    assert parse_chat_request(dict(BODY, flywheel_meta={"episode": "e"}))[0].meta == {"episode": "e"}
    image = dict(
        BODY, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    )
    with pytest.raises(ApiError, match="only text"):
        parse_chat_request(image)


def test_check_completions():
    check_completions([Completion("ok")])
    with pytest.raises(ApiError) as e:
        check_completions([Completion("", finish_reason="context", prompt_tokens=4000)])
    assert e.value.status == 400 and e.value.code == "context_length_exceeded"
    with pytest.raises(ApiError) as e:
        check_completions([Completion("", finish_reason="error", error="oom")])
    assert e.value.status == 500 and "oom" in e.value.message
    check_completions([Completion("partial", finish_reason="context", completion_tokens=3)])


def test_chat_response_keeps_raw_arguments_and_maps_context_to_length():
    bad = {"id": "c1", "name": "view", "arguments": None, "arguments_raw": "{oops"}
    r = chat_response("m", [Completion("", tool_calls=[bad])], created=1, response_id="x")
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{oops"
    r = chat_response("m", [Completion("cut", finish_reason="context", completion_tokens=3)])
    assert r["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "text,stops,sent",
    [
        ("return a + b", [], "return a + b"),
        ("return a <sub", ["<submit/>"], "return a "),  # may still become the stop string
        ("return a <submit/> more", ["<submit/>"], "return a "),
        ("caf\ufffd", [], "caf"),  # an incomplete character waits for its next token
        ("a <b", ["<x>", "<b>"], "a "),
    ],
)
def test_settled_holds_back_what_may_become_a_stop(text, stops, sent):
    assert settled(text, stops) == sent
