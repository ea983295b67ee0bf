"""Each family's own tool-call syntax: read off its vendored chat template, written as the template renders
it, parsed from good and malformed text, and used by the real engine and the real agent loop."""

from __future__ import annotations

import json

import pytest

from chat_families import FAMILIES, family_tokenizer, scripted_engine, template_text
from flywheel.actions import TOOLS
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes
from flywheel.models.chat_formats import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    Parsed,
    chat_messages,
    completion_calls,
    mistral_id,
    syntax_of,
)
from flywheel.models.tiny import CHAT_TEMPLATE
from flywheel.models.torch_engine import render_prompt
from flywheel.protocols import Request

VIEW = {"name": "view", "arguments": {"path": "mathx.py", "start": 1}}
OUTPUT = "1 def clamp(x, lo, hi):"


@pytest.mark.parametrize(
    "family,name,think",
    [
        ("qwen2.5", "hermes", False),
        ("qwen3", "hermes", True),
        ("llama3.1", "llama3_json", False),
        ("llama3.2", "llama3_json", False),
        ("mistral", "mistral", False),
    ],
)
def test_each_vendored_template_defines_its_familys_syntax(family, name, think):
    syntax = syntax_of(template_text(family))
    assert syntax is not None and (syntax.name, syntax.think) == (name, think)
    assert syntax_of({"default": CHAT_TEMPLATE, "tool_use": template_text(family)}).name == name


def test_a_template_without_tool_calls_defines_no_syntax():
    assert syntax_of(CHAT_TEMPLATE) is None and syntax_of(None) is None and syntax_of("") is None


# ------------------------------------------------------------------------ rendering through the template


def conversation(content):
    """A system prompt, a task, a call as the harness and OpenAI clients write it (arguments as JSON text,
    an id the harness made up), and its result."""
    arguments = json.dumps(VIEW["arguments"])
    call = {"id": "call_1_0", "type": "function", "function": {"name": "view", "arguments": arguments}}
    return [
        {"role": "system", "content": "You are a software engineer."},
        {"role": "user", "content": "Fix clamp in mathx.py."},
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": OUTPUT},
    ]


LLAMA_FORMAT = 'Respond in the format {"name": function name, "parameters": dictionary of argument name'
# per family: the content of the call turn, then what the prompt holds: the tools, the call turn as the
# family's writer writes it, the result turn; and the end of the prompt
RENDERED = {
    "qwen2.5": (
        "Let me look.",
        '<tools>\n{"type": "function", "function": {"name": "shell"',
        "<|im_start|>assistant\n{call}<|im_end|>\n",
        f"<|im_start|>user\n<tool_response>\n{OUTPUT}\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    ),
    "qwen3": (
        "Let me look.",
        '<tools>\n{"type": "function", "function": {"name": "shell"',
        "<|im_start|>assistant\n{call}<|im_end|>\n",
        f"<|im_start|>user\n<tool_response>\n{OUTPUT}\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    ),
    "llama3.1": (
        None,
        f"Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        f"You are a software engineer.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        f"Given the following functions, please respond with a JSON for a function call with its proper "
        f"arguments that best answers the given prompt.\n\n{LLAMA_FORMAT}",
        "<|start_header_id|>assistant<|end_header_id|>\n\n{call}<|eot_id|>",
        f'<|start_header_id|>ipython<|end_header_id|>\n\n"{OUTPUT}"<|eot_id|>',
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "llama3.2": (
        None,
        LLAMA_FORMAT,
        "<|start_header_id|>assistant<|end_header_id|>\n\n{call}<|eot_id|>",
        f'<|start_header_id|>ipython<|end_header_id|>\n\n"{OUTPUT}"<|eot_id|>',
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "mistral": (
        None,
        '[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "shell"',
        "[INST] Fix clamp in mathx.py.[/INST]{call}</s>",
        f'[TOOL_RESULTS] {{"content": {OUTPUT}, "call_id": "{mistral_id("call_1_0")}"}}[/TOOL_RESULTS]',
        "[/TOOL_RESULTS]",
    ),
}


@pytest.mark.parametrize("family", sorted(RENDERED))
def test_a_tool_call_and_its_result_render_through_the_template_as_the_writer_writes_them(family):
    assert family in FAMILIES
    content, tools, call_turn, result_turn, end = RENDERED[family]
    tokenizer = family_tokenizer(family)
    syntax = syntax_of(tokenizer.chat_template)
    prompt = tokenizer.decode(render_prompt(tokenizer, Request(conversation(content), tools=TOOLS)))
    call = dict(VIEW, id=mistral_id("call_1_0")) if syntax is MISTRAL else VIEW
    written = syntax.write(content or "", [call])
    assert tools in prompt and call_turn.format(call=written) in prompt and result_turn in prompt
    assert prompt.endswith(end)
    assert syntax.parse(written) == Parsed(content or "", [call])


def test_chat_messages_give_templates_argument_objects_and_mistral_its_ids():
    messages = conversation("")
    plain = chat_messages(family_tokenizer("qwen2.5"), messages)
    assert plain[2]["tool_calls"][0]["function"]["arguments"] == VIEW["arguments"]
    assert plain[2]["tool_calls"][0]["id"] == "call_1_0" and plain[3] == messages[3]
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == json.dumps(VIEW["arguments"])  # a copy
    short = chat_messages(family_tokenizer("mistral"), messages)
    assert short[2]["tool_calls"][0]["id"] == short[3]["tool_call_id"] == mistral_id("call_1_0")
    assert len(mistral_id("call_1_0")) == 9 and mistral_id("abc123XYZ") == "abc123XYZ"
    empty = [{"role": "assistant", "content": "ok", "tool_calls": []}]
    assert chat_messages(family_tokenizer("llama3.1"), empty) == [{"role": "assistant", "content": "ok"}]


# ---------------------------------------------------------------------------------------------- parsers


def test_hermes_calls_with_a_thought_several_calls_and_an_unclosed_last_one():
    text = 'Let me look.\n<tool_call>\n{"name": "view", "arguments": {"path": "mathx.py", "start": 1}}\n</tool_call>'
    assert HERMES.parse(text) == Parsed("Let me look.", [VIEW])
    two = '<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>\n<tool_call>{"name": "submit"}'
    assert [c["name"] for c in HERMES.parse(two).calls] == ["run_tests", "submit"]
    as_text = '<tool_call>{"name": "shell", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    assert HERMES.parse(as_text).calls == [{"name": "shell", "arguments": {"command": "ls"}}]
    assert HERMES.parse("No call here.") == Parsed("No call here.")


def test_a_thinking_template_reads_calls_after_the_reasoning_only():
    qwen3 = syntax_of(template_text("qwen3"))
    reasoning = '<think>\nMaybe <tool_call>{"name": "submit"}</tool_call>? No.\n</think>\n\n'
    found = qwen3.parse(reasoning + '<tool_call>\n{"name": "run_tests", "arguments": {}}\n</tool_call>')
    assert found == Parsed(reasoning[:-1], [{"name": "run_tests", "arguments": {}}])  # less the separator
    still = '<think>\nI could <tool_call>{"name": "submit"}</tool_call>'
    assert qwen3.parse(still) == Parsed(still)  # reasoning not closed: nothing is called yet


def test_llama3_calls_alone_in_the_turn():
    assert LLAMA3_JSON.parse('{"name": "view", "parameters": {"path": "mathx.py", "start": 1}}') == Parsed(
        "", [VIEW]
    )
    tagged = '<|python_tag|>{"name": "run_tests", "parameters": {}}; {"name": "submit", "parameters": {}}'
    assert [c["name"] for c in LLAMA3_JSON.parse(tagged).calls] == ["run_tests", "submit"]
    assert LLAMA3_JSON.parse('  {"name": "submit", "arguments": {}}\n').calls == [
        {"name": "submit", "arguments": {}}
    ]
    assert LLAMA3_JSON.parse("I will look at mathx.py first.") == Parsed("I will look at mathx.py first.")


def test_mistral_calls_after_the_marker():
    text = 'Looking.[TOOL_CALLS] [{"name": "view", "arguments": {"path": "mathx.py", "start": 1}, "id": "a1b2c3d4e"}]'
    assert MISTRAL.parse(text) == Parsed("Looking.", [dict(VIEW, id="a1b2c3d4e")])
    one = '[TOOL_CALLS]{"name": "submit", "arguments": {}}'
    assert MISTRAL.parse(one).calls == [{"name": "submit", "arguments": {}}]
    assert MISTRAL.parse("[INST] is not a call") == Parsed("[INST] is not a call")


@pytest.mark.parametrize(
    "syntax,text,why",
    [
        (HERMES, '<tool_call>{"name": "view", "arguments": {"path": }</tool_call>', "not valid JSON"),
        (HERMES, '<tool_call>{"arguments": {"path": "m.py"}}</tool_call>', "has no name"),
        (HERMES, '<tool_call>{"name": "view", "arguments": ["m.py"]}</tool_call>', "not a JSON object"),
        (HERMES, '<tool_call>["view"]</tool_call>', "a call is a JSON object"),
        (HERMES, '<tool_call>{"name": "view"}} trailing</tool_call>', "text after the call"),
        (LLAMA3_JSON, '{"name": "view", "parameters": {"path": "m.py"', "not valid JSON"),
        (LLAMA3_JSON, '{"parameters": {}}', "has no name"),
        (MISTRAL, "[TOOL_CALLS] [{'name': 'view'}]", "not valid JSON"),
        (MISTRAL, "[TOOL_CALLS] []", "list of calls is empty"),
        (
            MISTRAL,
            '[TOOL_CALLS] [{"name": "view", "arguments": 3}]',
            "arguments of view are not a JSON object",
        ),
    ],
)
def test_a_malformed_call_is_an_error_for_the_model_and_calls_nothing(syntax, text, why):
    found = syntax.parse(text)
    assert found.calls == [] and found.content == text and why in found.error
    assert found.error.startswith("malformed tool call: ") and syntax.example in found.error
    assert found.raw and found.raw in text


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3_JSON, MISTRAL])
def test_what_a_syntax_writes_it_reads_back(syntax):
    calls = [VIEW, {"name": "shell", "arguments": {"command": "grep -n 'é' m.py"}}]
    content = "" if syntax is LLAMA3_JSON else "Two things."  # Llama's template drops a call turn's text
    assert syntax.parse(syntax.write(content, calls)) == Parsed(content, calls)


# ---------------------------------------------------------------------------------- the engine's hook

SUBMIT = {"name": "submit", "arguments": {}}
SCRIPTS = {
    "qwen2.5": ["<tool_call>", '{"name": "submit", "arguments": {}}', "</tool_call>"],
    "qwen3": ["<think>", "The tests pass.", "</think>"]
    + ["<tool_call>", '{"name": "submit", "arguments": {}}', "</tool_call>"],
    "llama3.1": ['{"name": "submit", "parameters": {}}'],
    "mistral": ["[TOOL_CALLS]", ' [{"name": "submit", "arguments": {}}]'],  # the marker is a special token
}
BAD = ["<tool_call>", '{"name": "submit", "arguments": {', "</tool_call>"]
ASK = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix clamp."}]


@pytest.mark.parametrize("family", sorted(SCRIPTS))
def test_the_engine_returns_the_calls_its_model_writes_in_its_own_syntax(family):
    engine = scripted_engine(family, SCRIPTS[family])
    [c] = engine.generate([Request(ASK, tools=TOOLS, temperature=0.0, max_tokens=20)])
    assert c.tool_calls == [SUBMIT] and c.finish_reason == "stop"
    assert c.text == ("<think>The tests pass.</think>" if family == "qwen3" else "")
    assert len(c.token_ids) == len(SCRIPTS[family]) + 1  # the script, then the end of the turn
    [plain] = engine.generate([Request(ASK, temperature=0.0, max_tokens=20)])  # no tools offered: text
    assert plain.tool_calls == [] and plain.token_ids == c.token_ids and "submit" in plain.text


def test_the_engine_reports_a_malformed_call_and_keeps_its_text():
    engine = scripted_engine("qwen2.5", BAD)
    [c] = engine.generate([Request(ASK, tools=TOOLS, temperature=0.0, max_tokens=20)])
    [call] = c.tool_calls
    assert c.text == "".join(BAD)
    assert call["name"] is None and call["arguments"] is None and "not valid JSON" in call["error"]


def test_a_template_without_a_syntax_keeps_the_text():
    engine = scripted_engine("qwen2.5", SCRIPTS["qwen2.5"])
    engine.tokenizer.chat_template = CHAT_TEMPLATE  # ChatML without tools, as the shipped bases have
    [c] = engine.generate([Request(ASK, tools=TOOLS, temperature=0.0, max_tokens=20)])
    assert c.tool_calls == [] and c.text == "".join(SCRIPTS["qwen2.5"])
    assert completion_calls(engine.tokenizer, TOOLS, c.text, c.token_ids) == (c.text, [])


# ------------------------------------------------------------------------------------- the agent loop


def run_native(task, engine, max_turns=6, action_format="native"):
    cfg = HarnessConfig(action_format=action_format, temperature=0.0)
    return run_episodes([EpisodeSpec(task, get_effort("medium", max_turns=max_turns))], engine, cfg=cfg)[0]


def prompt_of(engine, rec, turn):
    """The prompt the model saw at its `turn`-th answer (0-based), decoded."""
    return engine.tokenizer.decode([t for t in rec.turns if t["role"] == "assistant"][turn]["prompt_ids"])


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3"])
@pytest.mark.parametrize("action_format", ["native", "auto"])
def test_an_in_process_qwen_models_tool_call_is_its_action(clamp_task, family, action_format):
    """`auto` offers tools natively to a model whose template has a call syntax (`TorchEngine.native_tools`)."""
    engine = scripted_engine(family, SCRIPTS[family])
    assert engine.native_tools
    rec = run_native(clamp_task, engine, action_format=action_format)
    assert rec.ending == "submitted" and rec.n_turns == 1 and rec.format_errors == 0
    assert [t["name"] for t in rec.turns if t["role"] == "tool"] == ["submit"]
    assert rec.turns[2]["tool_calls"] == [SUBMIT]


def test_the_history_is_rendered_with_the_templates_own_call_and_result_turns(clamp_task):
    shell = '{"name": "shell", "arguments": {"command": "echo hello"}}'
    engine = scripted_engine("qwen2.5", ["<tool_call>", shell, "</tool_call>"])
    rec = run_native(clamp_task, engine, max_turns=2)
    assert (
        rec.ending == "turn_limit" and [t["name"] for t in rec.turns if t["role"] == "tool"] == ["shell"] * 2
    )
    second = prompt_of(engine, rec, 1)
    assert f"<|im_start|>assistant\n<tool_call>\n{shell}\n</tool_call><|im_end|>\n" in second
    assert second.endswith(
        "<|im_start|>user\n<tool_response>\nexit code 0\nhello\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_malformed_call_is_a_format_error_the_model_sees(clamp_task):
    engine = scripted_engine("qwen2.5", BAD)
    rec = run_native(clamp_task, engine)
    assert rec.ending == "format_errors" and rec.format_errors == HarnessConfig().max_format_errors
    errors = [t["text"] for t in rec.turns if t.get("name") == "format_error"]
    assert errors[0].startswith("error: malformed tool call: not valid JSON")
    assert all("tool_calls" not in t for t in rec.turns if t["role"] == "assistant")
    second = prompt_of(engine, rec, 1)
    assert f"<|im_start|>assistant\n{''.join(BAD)}<|im_end|>\n" in second
    assert second.endswith(f"<|im_start|>user\n{errors[0]}<|im_end|>\n<|im_start|>assistant\n")
