"""Whose log-probs a served answer reports: the sampling distribution's ("processed") or the model's ("raw").

The torch engine records each sampled token's log-prob under the distribution it was drawn from: after
temperature and the top-p renormalisation, so every greedy token has log-prob 0 (`processed`). That is
what the trainer's replay compares its own distribution against, so it is what a server that feeds the
trainer (`flywheel serve --follow`, the loop's `http` backend) must report, and it costs nothing: the
numbers come with sampling. It is the default.

vLLM reports the model's own log-probs by default (its `logprobs_mode`, `raw_logprobs`): the softmax of
the raw logits, whatever the temperature or top-p (`raw`). `raw_scorer` gives those for a model that has
its weights in process (the torch engine's `model`): one forward over each answer's prompt and tokens
after generation, on the batcher's thread, so with the same weights that generated the answer (a
following server changes weights only between batches). The price is that forward: about a prefill per
answer. The logits are taken in float32, as the engine takes them.

torch is imported only when a raw answer is scored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from flywheel.protocols import Completion, Model

Scorer = Callable[[list[Completion]], list[Completion]]


def raw_scorer(model: Model) -> Scorer | None:
    """Completions -> the same with each token's raw log-prob, for a model with its torch module in process
    (`model.model`); None for any other."""
    module = getattr(model, "model", None)
    if not (callable(getattr(module, "forward", None)) and callable(getattr(module, "parameters", None))):
        return None

    def score(completions: list[Completion]) -> list[Completion]:
        return [_rescored(module, c) for c in completions]

    return score


def _rescored(module: Any, c: Completion) -> Completion:
    if not c.token_ids or c.prompt_ids is None or c.logprobs is None:
        return c
    return dataclasses.replace(c, logprobs=raw_logprobs(module, c.prompt_ids, c.token_ids))


def raw_logprobs(module: Any, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> list[float]:
    """Each of `token_ids`' log-prob under the model's softmax, after `prompt_ids` and the tokens before it."""
    import torch

    device = next(module.parameters()).device
    ids = torch.tensor([[*prompt_ids, *token_ids[:-1]]], device=device)
    with torch.inference_mode():
        logits = module(input_ids=ids, logits_to_keep=len(token_ids)).logits[0, -len(token_ids) :]
        logp = torch.log_softmax(logits.float(), dim=-1)
        picked = logp.gather(-1, torch.tensor(list(token_ids), device=device)[:, None])[:, 0]
    return picked.cpu().tolist()
