"""`flywheel serve` in each family's own formats, and its two log-prob modes.

Tool calls: a scripted model that writes the family's syntax (`chat_families.FamilyScripted`) and the real
engine on a model that does (`scripted_engine`), through the real server and the real openai SDK, and
mini-swe-agent's tool-calling configuration fixing a task. Log-probs: the sampling distribution's
("processed", the default) and the model's own ("raw"), against `transformers`' `generate`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chat_families import FamilyScripted, family_tokenizer, scripted_engine
from flywheel.actions import TOOLS
from flywheel.errors import FlywheelError
from flywheel.protocols import Completion
from flywheel.serve import ServerConfig, serve_model

openai = pytest.importorskip("openai")

FAMILIES = ["qwen2.5", "qwen3", "llama3.1", "llama3.2", "mistral"]


@pytest.fixture
def sdk():
    servers = []

    def start(model, **config):
        srv, _ = serve_model(model, config=ServerConfig(batch_window_s=0.002, **config))
        servers.append(srv)
        return openai.OpenAI(base_url=srv.url, api_key="sk-local", max_retries=0)

    yield start
    for srv in servers:
        srv.close()


def ask(task, messages, **kw):
    return {
        "model": "m",
        "messages": messages,
        "tools": TOOLS,
        "extra_body": {"flywheel_meta": {"task_dir": str(task.root)}},
        **kw,
    }


# per family: how the first call's turn and its result look in the prompt of the next request
HISTORY = {
    "qwen2.5": (
        '<|im_start|>assistant\n<tool_call>\n{"name": "run_tests", "arguments": {}}\n</tool_call><|im_end|>',
        "<|im_start|>user\n<tool_response>\n3 passed\n</tool_response><|im_end|>",
    ),
    "qwen3": (
        '<|im_start|>assistant\n<tool_call>\n{"name": "run_tests", "arguments": {}}\n</tool_call><|im_end|>',
        "<|im_start|>user\n<tool_response>\n3 passed\n</tool_response><|im_end|>",
    ),
    "llama3.1": (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "run_tests", "parameters": {}}<|eot_id|>',
        '<|start_header_id|>ipython<|end_header_id|>\n\n"3 passed"<|eot_id|>',
    ),
    "llama3.2": (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "run_tests", "parameters": {}}<|eot_id|>',
        '<|start_header_id|>ipython<|end_header_id|>\n\n"3 passed"<|eot_id|>',
    ),
    "mistral": (
        '[TOOL_CALLS] [{"name": "run_tests", "arguments": {}, "id": "',
        '[TOOL_RESULTS] {"content": 3 passed, "call_id": "',
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_served_model_writing_its_familys_syntax_gives_the_sdk_tool_calls(sdk, clamp_task, family):
    model = FamilyScripted(family)
    client = sdk(model)
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix clamp."}]
    first = client.chat.completions.create(**ask(clamp_task, messages)).choices[0]
    [tc] = first.message.tool_calls
    assert first.finish_reason == "tool_calls" and not first.message.content
    assert tc.function.name == "run_tests" and json.loads(tc.function.arguments) == {}

    messages += [
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tc.id, "content": "3 passed"},
    ]
    second = client.chat.completions.create(**ask(clamp_task, messages)).choices[0]
    [tc] = second.message.tool_calls
    assert tc.function.name == "view" and json.loads(tc.function.arguments) == {"path": "mathx.py"}
    call_turn, result_turn = HISTORY[family]
    assert call_turn in model.prompts[-1] and result_turn in model.prompts[-1]

    chunks = list(client.chat.completions.create(**ask(clamp_task, messages), stream=True))
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "view"
    assert "".join(t.function.arguments or "" for t in calls) == tc.function.arguments


class Writes:
    """Writes `text` to every request, with a family's tokenizer (and so its call syntax)."""

    def __init__(self, family, text):
        self.name, self.tokenizer, self.text = "writes", family_tokenizer(family), text

    def generate(self, requests):
        return [Completion(self.text, completion_tokens=3) for _ in requests]


@pytest.mark.parametrize(
    "family,text",
    [
        ("qwen2.5", 'Let me see.\n<tool_call>\n{"name": "view", "arguments": {"path": "m.py"}\n</tool_call>'),
        ("llama3.1", '{"name": "view", "parameters": {"path": '),
        ("mistral", "[TOOL_CALLS] [{name: view}]"),
    ],
)
def test_a_malformed_call_comes_back_as_the_text_the_model_wrote(sdk, family, text):
    client = sdk(Writes(family, text))
    choice = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS
    ).choices[0]
    assert (
        choice.message.tool_calls is None
        and choice.message.content == text
        and choice.finish_reason == "stop"
    )


def test_the_engines_own_calls_reach_the_sdk_with_a_thought(sdk):
    script = ["Done.", "<tool_call>", '{"name": "submit", "arguments": {}}', "</tool_call>"]
    client = sdk(scripted_engine("qwen2.5", script))
    request = {"model": "m", "messages": [{"role": "user", "content": "go"}], "temperature": 0}
    choice = client.chat.completions.create(**request, tools=TOOLS, logprobs=True).choices[0]
    assert [t.function.name for t in choice.message.tool_calls] == [
        "submit"
    ] and choice.message.content == "Done."
    assert len(choice.logprobs.content) == len(script) + 1
    plain = client.chat.completions.create(**request).choices[0]  # no tools: the text as written
    assert plain.message.tool_calls is None and plain.message.content == "".join(script)


# ----------------------------------------------------------------------------- mini-swe-agent, per family

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """experiments/mini_swe_agent.py (mini-swe-agent's own agent and configurations), its environment set."""
    pytest.importorskip("minisweagent", reason="mini-swe-agent is in the dev extra")
    spec = importlib.util.spec_from_file_location(
        "mini_swe_agent", ROOT / "experiments" / "mini_swe_agent.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in module.ENV.items():
            mp.setenv(name, value)
        mp.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path_factory.mktemp("mswea")))
        yield module


RESULT = {  # what opens a tool's result in each family's prompt
    "qwen2.5": "<|im_start|>user\n<tool_response>\n",
    "qwen3": "<|im_start|>user\n<tool_response>\n",
    "llama3.1": "<|start_header_id|>ipython<|end_header_id|>\n\n",
    "llama3.2": "<|start_header_id|>ipython<|end_header_id|>\n\n",
    "mistral": '[TOOL_RESULTS] {"content": ',
}


@pytest.mark.parametrize("family", FAMILIES)
def test_mini_swe_agents_tool_configuration_fixes_a_task_through_each_familys_syntax(
    mini, clamp_task, tmp_path, family
):
    model = FamilyScripted(family)
    srv, _ = serve_model(model, config=ServerConfig(batch_window_s=0.002))
    try:
        run = mini.run_task(srv.url, model.name, clamp_task, tmp_path / "repo", "tool")
    finally:
        srv.close()
    assert run.exit_status == "Submitted" and run.verdict.success and not run.verdict.cheat, run
    assert run.commands[0] == "python -m pytest -q" and run.commands[-1].endswith(
        "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    )
    first = model.syntax.write("", [{"name": "bash", "arguments": {"command": "python -m pytest -q"}}])
    assert first.rstrip("]}") in model.prompts[-1]  # (Mistral's template adds the call's id at the end)
    assert RESULT[family] in model.prompts[-1]


def test_mini_swe_agent_calls_bash_through_a_served_in_process_qwen_engine(mini, clamp_task, tmp_path):
    submit = {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
    engine = scripted_engine("qwen2.5", ["<tool_call>", json.dumps(submit), "</tool_call>"])
    srv, _ = serve_model(engine, config=ServerConfig(batch_window_s=0.002))
    try:
        run = mini.run_task(srv.url, engine.name, clamp_task, tmp_path / "repo", "tool")
    finally:
        srv.close()
    assert run.exit_status == "Submitted" and run.commands == (submit["arguments"]["command"],), run
    assert not run.verdict.success  # it submitted without fixing anything


# ------------------------------------------------------------------------------------------ log-probs


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from flywheel.models.tiny import build_tiny_model
    from flywheel.models.torch_engine import load_torch_model

    texts = ["def add(a, b):\n    return a + b\n", '<run_tests/> <submit/> <view path="m.py"/>'] * 8
    path = build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", texts, vocab_size=300, hidden=32, layers=1, heads=2
    )
    return load_torch_model(f"hf:{path}", seed=0)


def generate_logprobs(engine, prompt_ids, n):
    """`transformers`' greedy tokens and each one's log-prob under the model's softmax."""
    import torch

    out = engine.model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=engine.pad_id,
    )
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    logp = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.logits, tokens, strict=True)]
    return tokens, logp


ADD = {"model": "m", "messages": [{"role": "user", "content": "add"}], "max_tokens": 10, "logprobs": True}


def test_greedy_tokens_have_log_prob_0_processed_and_the_models_own_raw(sdk, engine):
    client = sdk(engine)
    greedy = {**ADD, "temperature": 0}
    processed = client.chat.completions.create(**greedy).choices[0]
    raw = client.chat.completions.create(**{**greedy, "extra_body": {"logprobs_mode": "raw"}})
    tokens, want = generate_logprobs(
        engine, raw.model_extra["prompt_token_ids"], len(raw.choices[0].logprobs.content)
    )
    assert [t.logprob for t in processed.logprobs.content] == [0.0] * len(tokens)
    assert raw.choices[0].model_extra["token_ids"] == processed.model_extra["token_ids"] == tokens
    got = [t.logprob for t in raw.choices[0].logprobs.content]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4 and min(got) < -0.01


def test_at_temperature_1_over_the_whole_vocabulary_raw_and_processed_agree(sdk, engine):
    client = sdk(engine, logprobs_mode="raw")  # the server's default: raw
    sampled = {**ADD, "temperature": 1.0, "top_p": 1.0, "seed": 7}
    raw = client.chat.completions.create(**sampled).choices[0]
    processed = client.chat.completions.create(**sampled, extra_body={"logprobs_mode": "processed"}).choices[
        0
    ]
    assert raw.model_extra["token_ids"] == processed.model_extra["token_ids"]
    pairs = zip(raw.logprobs.content, processed.logprobs.content, strict=True)
    assert max(abs(a.logprob - b.logprob) for a, b in pairs) < 1e-4
    hot = client.chat.completions.create(
        **{**sampled, "temperature": 0.5}, extra_body={"logprobs_mode": "processed"}
    )
    again = client.chat.completions.create(**{**sampled, "temperature": 0.5}).choices[0]  # raw, same tokens
    assert hot.choices[0].model_extra["token_ids"] == again.model_extra["token_ids"]
    assert [t.logprob for t in hot.choices[0].logprobs.content] != [t.logprob for t in again.logprobs.content]


def test_raw_log_probs_stream_in_the_last_chunk(sdk, engine):
    client = sdk(engine)
    request = {**ADD, "temperature": 0, "extra_body": {"logprobs_mode": "raw"}}
    whole = client.chat.completions.create(**request).choices[0]
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert [t.logprob for t in chunks[-1].choices[0].logprobs.content] == [
        t.logprob for t in whole.logprobs.content
    ]


def test_a_log_prob_mode_is_checked(sdk, shout):
    client = sdk(shout)
    with pytest.raises(openai.BadRequestError, match="logprobs_mode"):
        client.chat.completions.create(**ADD, extra_body={"logprobs_mode": "sampled"})
    with pytest.raises(openai.BadRequestError, match="no weights in process"):
        client.chat.completions.create(**ADD, extra_body={"logprobs_mode": "raw"})
    assert client.chat.completions.create(**ADD).choices[0].message.content == "ADD"  # processed: fine
    with pytest.raises(FlywheelError, match="no weights in process"):
        serve_model(shout, config=ServerConfig(logprobs_mode="raw"))
    with pytest.raises(FlywheelError, match="processed or raw"):
        ServerConfig(logprobs_mode="model")


@pytest.mark.parametrize(
    "args,error",
    [
        (["--model", "scripted", "--logprobs-mode", "raw"], "--logprobs-mode raw needs a torch model"),
        (
            ["--model", "toybugs-sweep", "--logprobs-mode", "raw", "--follow", "/nonexistent"],
            "follows the trainer",
        ),
        (["--model", "scripted", "--logprobs-mode", "softmax"], "processed or raw"),
    ],
)
def test_serve_command_refuses_a_log_prob_mode_it_cannot_serve(args, error):
    r = subprocess.run([sys.executable, "-m", "flywheel", "serve", *args], capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and error in lines[0], r.stderr
