"""The serving tests' fake model: `Shout`, a `Model` that answers in capitals or calls its one tool."""

from __future__ import annotations

import pytest

from flywheel.protocols import Completion, Request


class Shout:
    """Answers the last message in capitals, or calls `shout` with it when tools are offered."""

    name = "shout"

    def __init__(self) -> None:
        self.batches: list[list[Request]] = []

    def generate(self, requests):
        self.batches.append(list(requests))
        out = []
        for r in requests:
            last = r.messages[-1].get("content") or ""
            if last == "raise":
                raise RuntimeError("boom")
            calls = [{"name": "shout", "arguments": {"text": last}}] if r.tools else []
            text = "" if calls else last.upper()
            out.append(Completion(text, prompt_tokens=len(r.messages), completion_tokens=2, tool_calls=calls))
        return out


@pytest.fixture
def shout() -> Shout:
    return Shout()
