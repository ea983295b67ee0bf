"""The model families' chat formats in tests, with no download: their vendored chat templates
(tests/data/chat_templates/), tokenizers built around them, and two models that write each family's
tool-call syntax.

- `family_tokenizer(family)`: a small byte-level BPE with the family's special tokens (and Qwen's plain
  added ones: `<tool_call>`, `<think>`, ...) and its vendored template.
- `scripted_engine(family, script)`: the real torch engine on a tiny model of the family's architecture
  whose weights are set so that, greedily, it writes `script` (a list of added tokens) after any prompt
  and then its end-of-turn token: its layers add nothing (zero output projections), so each position's
  logits depend on its own token only, and the head maps each token of the chain to the next.
- `FamilyScripted(family)`: the scripted oracle speaking a family's format: every request is rendered
  through the family's template (what it saw is kept in `prompts`), and the oracle's calls come back as
  text in the family's syntax, for a server to parse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from flywheel.actions import TOOLS
from flywheel.models.chat_formats import tokenizer_syntax
from flywheel.models.scripted import ScriptedModel
from flywheel.models.torch_engine import TorchEngine, render_prompt
from flywheel.protocols import Completion, Request

TEMPLATES = Path(__file__).resolve().parent / "data" / "chat_templates"


@dataclass(frozen=True)
class Family:
    template: str  # file name under TEMPLATES
    arch: str  # the transformers model type of its tiny model
    special: tuple[str, ...]  # special tokens, the first ones named below
    bos: str | None
    eos: str
    pad: str | None
    plain: tuple[str, ...] = ()  # added tokens that are not special (they survive skip_special_tokens)


FAMILIES = {
    "qwen2.5": Family(
        "qwen2.5.jinja",
        "qwen2",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        None,
        "<|im_end|>",
        "<|endoftext|>",
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    ),
    "qwen3": Family(
        "qwen3.jinja",
        "qwen3",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        None,
        "<|im_end|>",
        "<|endoftext|>",
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
    ),
    "llama3.1": Family(
        "llama3.1.jinja",
        "llama",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
        + ("<|eom_id|>", "<|python_tag|>"),
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|end_of_text|>",
    ),
    "llama3.2": Family(
        "llama3.2.jinja",
        "llama",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
        + ("<|eom_id|>", "<|python_tag|>"),
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|end_of_text|>",
    ),
    "mistral": Family(
        "mistral-v0.3.jinja",
        "mistral",
        ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]")
        + ("[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        "<s>",
        "</s>",
        None,
    ),
}


def template_text(family: str) -> str:
    return (TEMPLATES / FAMILIES[family].template).read_text()


def family_tokenizer(family: str, extra: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer (trained on the template and the harness's tools) with the family's
    special and added tokens, `extra` added tokens, and its vendored chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    f = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=list(f.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [template_text(family), json.dumps(TOOLS), "Fix the bug in mathx.py. The tests fail."]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*f.plain, *extra)])
    specials = {
        "eos_token": f.eos,
        **({"bos_token": f.bos} if f.bos else {}),
        **({"pad_token": f.pad} if f.pad else {}),
    }
    named = {f.bos, f.eos, f.pad}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        additional_special_tokens=[t for t in f.special if t not in named],
        chat_template=template_text(family),
        clean_up_tokenization_spaces=False,
        **specials,
    )


def _tiny_config(arch: str, vocab: int, tokenizer):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        arch,
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def scripted_engine(family: str, script: list[str], **engine_opts) -> TorchEngine:
    """The torch engine on a tiny model of `family` that writes `script` (added tokens), then ends its turn."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = family_tokenizer(family, tuple(t for t in script if t not in FAMILIES[family].special))
    prompt = render_prompt(tokenizer, Request([{"role": "user", "content": "hi"}], tools=TOOLS))
    chain = [prompt[-1], *(tokenizer.convert_tokens_to_ids(t) for t in script), tokenizer.eos_token_id]
    assert len(set(chain[:-1])) == len(chain) - 1, "each token of the chain must lead to one next token"
    config = _tiny_config(FAMILIES[family].arch, len(tokenizer), tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()  # the layers add nothing: the last position sees its own token only
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        head.zero_()
        for i, (token, following) in enumerate(zip(chain, chain[1:], strict=False)):
            embed[token] = 0.0
            embed[token, i] = 1.0
            head[following, i] = 10.0
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return TorchEngine(model, tokenizer, name=f"{family}-scripted", seed=0, **engine_opts)


class FamilyScripted:
    """The scripted oracle writing its calls in a family's syntax, after rendering each request through the
    family's template."""

    def __init__(self, family: str):
        self.tokenizer = family_tokenizer(family)
        self.syntax = tokenizer_syntax(self.tokenizer)
        self.name = f"scripted-{family}"
        self.oracle = ScriptedModel()
        self.prompts: list[str] = []

    def generate(self, requests):
        out = []
        for r, c in zip(requests, self.oracle.generate(requests), strict=True):
            ids = render_prompt(self.tokenizer, r)
            self.prompts.append(self.tokenizer.decode(ids))
            text = self.syntax.write(c.text, c.tool_calls) if c.tool_calls else c.text
            n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            out.append(Completion(text, c.finish_reason, len(ids), n, error=c.error))
        return out
