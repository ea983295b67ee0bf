"""A tiny from-scratch causal LM in HF format: byte-level BPE tokenizer plus a randomly initialised Llama.

`build_tiny_model` is the seed of the embedded default. Tests use it as a small random model that drives
the real engine (real tokenizer, real chat template, real `LlamaForCausalLM`), and the SFT step uses it as
the untrained policy it imitates oracle trajectories into.

Design:
- The tokenizer is a byte-level BPE trained with `tokenizers` on the given texts, so every string
  round-trips (unknown bytes fall back to the 256 byte tokens). Its vocabulary is at most `vocab_size`;
  a small corpus yields fewer merges, and the model's embedding matches the tokenizer's real size.
- Special tokens: `<|endoftext|>` (padding), `<|im_start|>`, `<|im_end|>` (end of a message, the EOS the
  policy learns to emit). The default chat template is ChatML-shaped and ends with the assistant header
  when `add_generation_prompt` is set.
- Deterministic: the same texts, sizes and seed give byte-identical files (weights are drawn under a
  forked, seeded RNG; the BPE trainer is deterministic for a fixed corpus).
- Written atomically: files are built in a temporary sibling directory and renamed into place, so a
  reader never sees a half-written model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

from flywheel.errors import FlywheelError

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, max_token_chars: int = 0, split_symbols: bool = False
):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts` (special tokens get ids 0, 1, 2).

    `max_token_chars` > 0 caps a merged token's length, so that names the texts repeat (a module's) are
    spelled in pieces that other names share instead of becoming one token of their own.

    `split_symbols` makes every digit and punctuation mark a token of its own, so that a text is spelled
    with the same tokens wherever it stands. Without it, line 16 is ` 16` in a `cat -n` listing and `16`
    in `sed -i '16s/`, and `<` is ` <` in code and part of `/</` in a `sed` command: a model that copies
    from its context has to learn each such pair, where a matching token would do.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.Punctuation(behavior="isolated"),
                byte_level,
            ]
        )
        if split_symbols
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=max_token_chars or None,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def wrap_tokenizer(tok, chat_template: str):
    """The HF fast tokenizer around a trained `tokenizers.Tokenizer`, with special tokens and template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )


def tiny_config(vocab: int, hidden: int, layers: int, heads: int, ids: dict[str, int], max_positions: int):
    """A small Llama configuration: tied embeddings, MLP width ~8/3 hidden (rounded up to 32)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=-(-hidden * 8 // 3 // 32) * 32,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=ids[PAD],
        eos_token_id=ids[IM_END],
        bos_token_id=None,
    )


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    texts: Iterable[str],
    *,
    vocab_size: int = 512,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 2048,
    seed: int = 0,
    chat_template: str = CHAT_TEMPLATE,
    max_token_chars: int = 0,
    split_symbols: bool = False,
) -> Path:
    """Train a tokenizer on `texts`, initialise a tiny Llama with `seed`, save both to `out_dir` (HF format).

    `out_dir` must not exist or be empty. Returns `out_dir`; load it with `load_torch_model(f"hf:{out_dir}")`.
    """
    from transformers import LlamaForCausalLM

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FlywheelError(f"{out}: refusing to build a model into a non-empty directory")
    if hidden % heads:
        raise FlywheelError(f"hidden size {hidden} is not divisible by {heads} heads")
    tokenizer = wrap_tokenizer(
        train_tokenizer(texts, vocab_size, max_token_chars, split_symbols), chat_template
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = tiny_config(len(tokenizer), hidden, layers, heads, ids, max_positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = ids[IM_END]
    model.generation_config.pad_token_id = ids[PAD]
    _save_atomically(out, model, tokenizer)
    return out


def _save_atomically(out: Path, model, tokenizer) -> None:
    from flywheel.models.hf import quiet_transformers

    quiet_transformers()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
