"""A hand-written forward of Llama-shaped decoders over a preallocated KV cache: the engine's fast path.

`TorchEngine` generates with this whenever `unsupported(model, context)` finds nothing against its model
(None), and falls back to the model's own forward otherwise, saying why. The families it takes
(`FAST_ARCHITECTURES`) are one decoder with small differences, each read from the HF modules:
- Llama (`LlamaForCausalLM`: SmolLM2, Llama 3 with its `llama3` rope scaling, the tiny models of
  `flywheel.models.tiny`) and Mistral (`MistralForCausalLM`, the same decoder);
- Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): biases on the q, k and v projections, tied or untied heads;
- Qwen3 dense (`Qwen3ForCausalLM`): an RMSNorm over each query and key head before the rotation
  (`decoder_layer`), and a head size of its own (`head_dim`, not hidden / heads).
Biases on any projection and tied or untied heads are honoured in all of them; the rotary inverse
frequencies (scaled by the config's rope type) are the model's own buffer.

A sliding window (Mistral's, Qwen's `use_sliding_window` layers) is taken when it covers the context the
engine serves (`attention_window(config) >= context`): the window then never drops a key, and full
attention is the same computation. A narrower window falls back. Gemma 2 and 3 fall back
(`NOT_TAKEN` says why in one line): soft-capped attention scores and logits (Gemma 2), sliding-window
layers alternating with global ones (with a rotary base of their own in Gemma 3), the (1+w) RMSNorm
with four norms a layer, and scaled embeddings are each a change to the forward below.

Why it is faster than calling the HF modules with a `DynamicCache`:
- The KV cache is one preallocated tensor per K and V, `[layers, batch, kv_heads, capacity, head_dim]`.
  Prefill writes the prompt's keys and values, each decode step writes one column in place; nothing is
  concatenated, so a step costs the attention over the filled prefix and not a copy of the whole cache.
  Capacity grows by doubling when a batch outlives it (pages of an untouched `torch.empty` are never
  faulted in, so the first allocation is sized to the prompt plus a first chunk of steps).
- Rows are left-padded to one width, so every row writes the same column at every step; a boolean
  `valid[row, column]` marks real tokens and is the attention mask. Rotary positions are per row (the
  count of real tokens before), so padding never shifts a row's positions.
- Grouped-query attention without repeating K/V: the `group` query heads that share one KV head are laid
  out as extra query rows of that head (`[B, kv_heads, group * S, D]`), so one `scaled_dot_product_attention`
  call reads each cached K/V once.
- One plain function per layer over `torch.nn.functional` ops: no module hooks, no mask factories, no
  per-step cache objects. Logits are computed for the last position only.
- Rows that finish are dropped with `select_rows`, which copies only the filled prefix of the kept rows.
- The prompts' common prefix (the system prompt and task header every episode shares; the whole prompt
  for a group of samples of one task) is run once at batch 1 and its keys and values copied into every
  row; only the rest of each prompt is prefilled per row. Rotary positions count real tokens, so a row's
  keys are the same whichever columns they sit in, and the result equals a full per-row prefill up to
  float rounding.

- Across calls, a `PrefixStore` keeps the keys and values of sequences that finished (prompt and
  generated tokens). An agent's next turn is its last prompt, its answer and a new observation, so its
  prompt starts with a stored sequence; only the tokens after the longest stored match are prefilled
  (`prefill_after`), on top of the stored keys and values (`cache_from`). Multi-turn rollouts prefill
  mostly what is new.
- Speculative decoding (`flywheel.models.speculative`) feeds a row several tokens at once and reads every
  position's logits (`prefill_after(..., every=True)`), then rolls the cache back past the tokens it
  rejected (`truncate`).

Weights: the layers' norms and the rotary inverse frequencies are read from the HF modules at every call;
the matrices too, unless packed (below). Two things derived from weights are kept between calls, the
`PrefixStore` and the packed matrices, and `WeightsCache.refresh` (run by the engine before each batch)
rebuilds them whenever the weights change: it compares a fingerprint of every parameter (its version
counter, its sum and its norm), which catches in-place updates through any path, `.data` and numpy views
included. So an optimizer that updates the model in place between calls is seen by the next call.

Packed matrices (`pack_weights`, on the CPU with oneDNN, float32 or bfloat16): each layer's q, k and v
projections are concatenated into one matrix, the gate and up projections into another, and every matrix
(the head's too) is reordered once into oneDNN's blocked layout. A matrix multiply then reads the weight
in the order the kernel wants instead of repacking it at every call, which is where a small batch's time
went: on SmolLM2-135M with one thread, the products of one decode step at batch 16 took 65 ms packed
against 97 ms with `F.linear` (all of the model's matrices in turn, timed alone), and at batch 1 the same.
A single token of a single row (batch-1 decoding) still multiplies by the plain weights, which a
matrix-vector product reads faster, and models with a hidden size under `PACK_MIN_HIDDEN` are not packed:
there the fixed cost of a packed product outweighs what it saves (both measured with
`benchmarks/bench_engine.py`). The cost is a second copy of the matrices in memory and a repack (about
0.5 s for SmolLM2-135M) after each weights change; the engine's `pack=False` turns it off.

What is not covered (those models fall back to the HF forward): architectures other than
`FAST_ARCHITECTURES` (Gemma, mixtures of experts, multimodal models), sliding windows narrower than the
context, activations other than SiLU, `pretraining_tp > 1`, a rotation over part of each head, and
rotary variants whose frequencies depend on the sequence length (`dynamic`, `longrope`).

Device and precision: the cache takes the dtype and device of the model's weights; `FastRunner` moves each
call's token ids and masks there, and `forward` returns float32 logits (a no-op for a float32 model; a
bfloat16 model's head runs in bfloat16 and its logits are cast). Attention is one
`torch.nn.functional.scaled_dot_product_attention` call per layer on every device; with the boolean mask it
takes PyTorch picks the fastest kernel it has for the device and dtype (on CUDA a memory-efficient one).

Numerics: the same operations as the HF modules in the same order (RMSNorm in float32, Qwen3's q/k
norms, rotary on q and k, softmax attention scaled by `attn.scaling`), so logits agree with the HF forward
up to float rounding (summation order inside the fused kernels differs). Deterministic for a fixed machine and thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

SEQUENCE_DEPENDENT_ROPE = {"dynamic", "longrope"}
FIRST_CHUNK = 256  # decode columns allocated with the prompt; doubled when outgrown
FAST_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_GEMMA = "the (1+w) RMSNorm with four norms a layer and scaled embeddings are not in the fast forward"
NOT_TAKEN = {  # families that fall back, and why (one line each)
    "Gemma2ForCausalLM": f"Gemma 2: soft-capped attention scores and logits, sliding-window layers "
    f"alternating with global ones, {_GEMMA}",
    "Gemma3ForCausalLM": f"Gemma 3: sliding-window layers (with a rotary base of their own) alternating with "
    f"global ones, {_GEMMA}",
}


def unsupported(model, context: int | None = None) -> str | None:
    """Why `model` cannot run on the fast path, or None when it can. `context`: the most tokens a sequence
    may hold, prompt and generation (None: the model's `max_position_embeddings`), which a sliding window
    must cover."""
    name = type(model).__name__
    if name in NOT_TAKEN:
        return NOT_TAKEN[name]
    if name not in FAST_ARCHITECTURES:
        return f"{name} is not {', '.join(FAST_ARCHITECTURES[:-1])} or {FAST_ARCHITECTURES[-1]}"
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    if int(getattr(cfg, "pretraining_tp", 1) or 1) != 1:
        return "pretraining_tp > 1"
    rope = model.model.rotary_emb
    rope_type = getattr(rope, "rope_type", "default")
    if rope_type in SEQUENCE_DEPENDENT_ROPE:
        return f"rope type {rope_type}"
    head_dim = model.model.layers[0].self_attn.head_dim
    if 2 * rope.inv_freq.numel() != head_dim:
        return f"rotary over {2 * rope.inv_freq.numel()} of {head_dim} head dimensions"
    window = attention_window(cfg)
    context = context or int(getattr(cfg, "max_position_embeddings", 0) or 0)
    if window is not None and window < context:
        return f"sliding window {window} < context {context}"
    return None


def attention_window(config) -> int | None:
    """The sliding window of a model's windowed layers (keys at most `window - 1` positions back), or None
    when every layer attends to the whole sequence."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


# ------------------------------------------------------------------------------------------------ cache


@dataclass
class KVCache:
    """Keys and values of a left-padded batch; column `c` holds the same step of every row."""

    k: torch.Tensor  # [layers, B, kv_heads, capacity, head_dim]
    v: torch.Tensor
    valid: torch.Tensor  # [B, capacity] bool: column holds a real token of that row
    next_pos: torch.Tensor  # [B] long: rotary position of each row's next token
    length: int = 0  # columns filled

    @property
    def capacity(self) -> int:
        return self.k.shape[3]


def new_cache(model, batch: int, capacity: int) -> KVCache:
    """An empty cache for `batch` rows of `capacity` columns, in the model's dtype and device."""
    cfg, w = model.config, model.model.embed_tokens.weight
    kv_heads, head_dim = cfg.num_key_value_heads, model.model.layers[0].self_attn.head_dim
    shape = (cfg.num_hidden_layers, batch, kv_heads, capacity, head_dim)
    return KVCache(
        k=torch.empty(shape, dtype=w.dtype, device=w.device),
        v=torch.empty(shape, dtype=w.dtype, device=w.device),
        valid=torch.zeros((batch, capacity), dtype=torch.bool, device=w.device),
        next_pos=torch.zeros(batch, dtype=torch.long, device=w.device),
    )


def _resized(cache: KVCache, rows: torch.Tensor | None, capacity: int) -> KVCache:
    """A copy of the filled prefix of `rows` (all when None) into a cache of `capacity` columns."""
    n, layers, k = cache.length, cache.k.shape[0], cache.k
    batch = k.shape[1] if rows is None else rows.numel()
    shape = (layers, batch, k.shape[2], capacity, k.shape[4])
    out = KVCache(
        k=k.new_empty(shape),
        v=k.new_empty(shape),
        valid=cache.valid.new_zeros((batch, capacity)),
        next_pos=cache.next_pos if rows is None else cache.next_pos[rows],
        length=n,
    )
    pick = (lambda t, dim: t) if rows is None else (lambda t, dim: t.index_select(dim, rows))
    out.k[:, :, :, :n] = pick(cache.k[:, :, :, :n], 1)
    out.v[:, :, :, :n] = pick(cache.v[:, :, :, :n], 1)
    out.valid[:, :n] = pick(cache.valid[:, :n], 0)
    return out


def select_rows(cache: KVCache, rows: torch.Tensor) -> KVCache:
    """The cache of the kept `rows` only (a copy of their filled columns)."""
    return _resized(cache, rows, cache.capacity)


def reserve(cache: KVCache, columns: int) -> KVCache:
    """`cache`, or a copy with room for `columns` more (capacity at least doubled)."""
    need = cache.length + columns
    if need <= cache.capacity:
        return cache
    return _resized(cache, None, max(need, 2 * cache.capacity))


# ---------------------------------------------------------------------------------------------- forward


def prefill(
    model, cache: KVCache, input_ids: torch.Tensor, mask: torch.Tensor, packed: Packed | None = None
) -> torch.Tensor:
    """Run left-padded prompts `input_ids` [B, S] (`mask` 1 on real tokens) into an empty cache.

    Returns the logits of the last position [B, vocab]. The prompts' common prefix is computed once and
    its keys and values copied into every row (columns `0:shared`); the rest of each prompt follows,
    left-padded, in columns `shared:`. Padding queries attend to themselves only, so their (unused)
    outputs stay finite.
    """
    shared = common_prefix(input_ids, mask) if input_ids.shape[0] > 1 else 0
    if shared:
        start = input_ids.shape[1] - int(mask.sum(-1)[0])
        _prefill_prefix(model, cache, input_ids[:1, start : start + shared], packed)
        input_ids, mask = _drop_prefix(input_ids, mask, shared)
    width = input_ids.shape[1]
    real = mask.bool()
    cache.valid[:, :shared] = True
    cache.valid[:, shared : shared + width] = real
    positions = shared + (real.long().cumsum(-1) - 1).clamp(min=0)
    cols = torch.arange(width, device=input_ids.device)
    causal = cols.unsqueeze(0) <= cols.unsqueeze(1)  # [query, key]
    attend = causal & (real.unsqueeze(1) | torch.eye(width, dtype=torch.bool, device=real.device))
    before = attend.new_ones((attend.shape[0], width, shared))
    attend = torch.cat([before, attend], dim=2).unsqueeze(1)
    logits = forward(model, cache, input_ids, positions, attend, packed=packed)
    cache.next_pos = shared + real.long().sum(-1)
    return logits


def prefill_unique(
    model, input_ids: torch.Tensor, mask: torch.Tensor, capacity: int, packed: Packed | None = None
) -> tuple[KVCache, torch.Tensor]:
    """`prefill` into a new cache of `capacity` columns, computing each distinct prompt once.

    Rows with the same (left-padded) prompt, such as the G samples of a group, share one forward; their
    keys and values are then copied to every row that has them. Returns (cache, last logits [B, vocab]).
    """
    rows = torch.cat([input_ids, mask], dim=1)
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if unique.shape[0] == rows.shape[0]:
        cache = new_cache(model, input_ids.shape[0], capacity)
        return cache, prefill(model, cache, input_ids, mask, packed)
    width = input_ids.shape[1]
    cache = new_cache(model, unique.shape[0], capacity)
    logits = prefill(model, cache, unique[:, :width], unique[:, width:], packed)
    return select_rows(cache, inverse), logits[inverse]


def common_prefix(input_ids: torch.Tensor, mask: torch.Tensor) -> int:
    """Tokens every left-padded prompt starts with, leaving each at least one token of its own."""
    lengths = mask.sum(-1)
    shortest = int(lengths.min())
    starts = (input_ids.shape[1] - lengths).tolist()
    heads = torch.stack([row[s : s + shortest] for row, s in zip(input_ids, starts, strict=True)])
    same = (heads == heads[:1]).all(dim=0).long().cumprod(dim=0).sum()
    return max(0, min(int(same), shortest - 1))


def _prefill_prefix(model, cache: KVCache, prefix: torch.Tensor, packed: Packed | None) -> None:
    """Compute the keys and values of `prefix` [1, P] once and copy them into every row's columns 0:P."""
    n = prefix.shape[1]
    one = new_cache(model, 1, n)
    cols = torch.arange(n, device=prefix.device)
    causal = (cols.unsqueeze(0) <= cols.unsqueeze(1))[None, None]
    forward(model, one, prefix, cols.unsqueeze(0), causal, logits=False, packed=packed)
    cache.k[:, :, :, :n] = one.k
    cache.v[:, :, :, :n] = one.v
    cache.length = n


def _drop_prefix(input_ids: torch.Tensor, mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded prompts without their first `n` real tokens, re-padded to the new width."""
    lengths = mask.sum(-1) - n
    width = int(lengths.max())
    ids = input_ids[:, input_ids.shape[1] - width :].clone()
    keep = torch.arange(width, device=mask.device).unsqueeze(0) >= (width - lengths).unsqueeze(1)
    return ids.masked_fill(~keep, 0), keep.long()


def cache_from(model, prefixes: list[tuple[torch.Tensor, torch.Tensor] | None], capacity: int) -> KVCache:
    """A new cache whose row j holds `prefixes[j]` (keys and values `[layers, kv_heads, n, head_dim]` of
    positions 0..n-1, or None for nothing), right-aligned in columns `0:P` (P the longest n)."""
    longest = max((kv[0].shape[2] for kv in prefixes if kv is not None), default=0)
    cache = new_cache(model, len(prefixes), max(capacity, longest))
    cache.k[:, :, :, :longest] = 0  # the gaps left of shorter prefixes are masked, but must not be NaN
    cache.v[:, :, :, :longest] = 0
    for j, kv in enumerate(prefixes):
        if kv is not None:
            n = kv[0].shape[2]
            cache.k[:, j, :, longest - n : longest] = kv[0]
            cache.v[:, j, :, longest - n : longest] = kv[1]
            cache.valid[j, longest - n : longest] = True
            cache.next_pos[j] = n
    cache.length = longest
    return cache


def prefill_after(
    model,
    cache: KVCache,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    every: bool = False,
    packed: Packed | None = None,
) -> torch.Tensor:
    """Run left-padded `input_ids` [B, S] after what each row of `cache` already holds (`cache_from`);
    positions continue from `cache.next_pos`. Returns the last position's logits [B, vocab] (`every`: the
    logits of every position [B, S, vocab], as speculative decoding's verification needs)."""
    held, width = cache.length, input_ids.shape[1]
    real = mask.bool()
    cache.valid[:, held : held + width] = real
    positions = cache.next_pos.unsqueeze(1) + (real.long().cumsum(-1) - 1).clamp(min=0)
    cols = torch.arange(width, device=input_ids.device)
    causal = cols.unsqueeze(0) <= cols.unsqueeze(1)
    attend = causal & (real.unsqueeze(1) | torch.eye(width, dtype=torch.bool, device=real.device))
    before = cache.valid[:, None, :held].expand(-1, width, -1)
    attend = torch.cat([before, attend], dim=2).unsqueeze(1)
    logits = forward(model, cache, input_ids, positions, attend, every=every, packed=packed)
    cache.next_pos = cache.next_pos + real.long().sum(-1)
    return logits


def truncate(cache: KVCache, length: int) -> None:
    """Roll `cache` back to its first `length` columns: what it held before the tokens fed after them (the
    keys and values left in the dropped columns are masked out and overwritten by the next tokens)."""
    dropped = cache.valid[:, length : cache.length]
    cache.next_pos = cache.next_pos - dropped.long().sum(-1)
    dropped.fill_(False)
    cache.length = min(cache.length, length)


def row_kv(cache: KVCache, row: int, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the keys and values of `row`'s real tokens (its first `n`), in order:
    `[layers, kv_heads, n, head_dim]`."""
    cols = cache.valid[row, : cache.length].nonzero().squeeze(1)[:n]
    return cache.k[:, row].index_select(2, cols), cache.v[:, row].index_select(2, cols)


def weights_fingerprint(model) -> tuple:
    """Changes whenever any parameter changes: version counters, sums and norms (float32, one read of each
    parameter per reduction; about 75 ms for SmolLM2-135M on one thread)."""
    params = list(model.parameters())
    with torch.no_grad():
        sums = torch.stack(
            [
                torch.stack([p.sum(dtype=torch.float32), torch.linalg.vector_norm(p, dtype=torch.float32)])
                for p in params
            ]
        )
    return tuple(p._version for p in params), tuple(sums.flatten().tolist())


class PrefixStore:
    """Keys and values of finished sequences, looked up by the longest common prefix of token ids.

    At most `max_bytes` are kept (the oldest go first); a sequence that extends a stored one replaces it.
    `WeightsCache.refresh` empties the store when the weights change.
    """

    def __init__(self, max_bytes: int, min_tokens: int = 16) -> None:
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self.entries: list[tuple[np.ndarray, torch.Tensor, torch.Tensor]] = []
        self.hits = self.reused = self.lookups = 0  # statistics: rows served, tokens not prefilled, lookups

    def lookup(self, ids: list[int]) -> tuple[int, tuple[torch.Tensor, torch.Tensor] | None]:
        """(n, stored keys and values of `ids[:n]`) for the longest stored match, leaving at least one
        token to prefill; (0, None) when no match reaches `min_tokens`."""
        self.lookups += 1
        query = np.asarray(ids, dtype=np.int64)
        best, kv = 0, None
        for stored, k, v in self.entries:
            n = min(len(stored), len(query) - 1)
            if n <= best:
                continue
            diff = np.flatnonzero(stored[:n] != query[:n])
            common = int(diff[0]) if diff.size else n
            if common > best:
                best, kv = common, (k, v)
        if best < self.min_tokens or kv is None:
            return 0, None
        self.hits += 1
        self.reused += best
        return best, (kv[0][:, :, :best], kv[1][:, :, :best])

    def add(self, ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        if len(ids) < self.min_tokens:
            return
        new = np.asarray(ids, dtype=np.int64)
        self.entries = [
            e for e in self.entries if not (len(e[0]) <= len(new) and np.array_equal(e[0], new[: len(e[0])]))
        ]
        self.entries.append((new, k, v))
        total = sum(e[1].nbytes + e[2].nbytes for e in self.entries)
        while total > self.max_bytes and self.entries:
            old = self.entries.pop(0)
            total -= old[1].nbytes + old[2].nbytes


def decode(model, cache: KVCache, tokens: torch.Tensor, packed: Packed | None = None) -> torch.Tensor:
    """One step: feed `tokens` [B] at the next column; returns the next logits [B, vocab]."""
    col = cache.length
    cache.valid[:, col] = True
    attend = cache.valid[:, None, None, : col + 1]
    logits = forward(model, cache, tokens.unsqueeze(1), cache.next_pos.unsqueeze(1), attend, packed=packed)
    cache.next_pos = cache.next_pos + 1
    assert logits is not None
    return logits


def forward(
    model,
    cache: KVCache,
    ids: torch.Tensor,
    positions: torch.Tensor,
    attend: torch.Tensor,
    logits: bool = True,
    every: bool = False,
    packed: Packed | None = None,
) -> torch.Tensor | None:
    """Write `ids` [B, S] into columns `cache.length ...` and return the last position's logits [B, V]
    (`every`: every position's, [B, S, V]).

    `attend` [B, 1, S, length + S] is True where a query may attend to a key column. `packed`: the model's
    matrices from `pack_weights` (None: the modules' own weights).
    """
    inner = model.model
    x = F.embedding(ids, inner.embed_tokens.weight)
    cos, sin = rotary(inner.rotary_emb, positions, x.dtype)
    start = cache.length
    if ids.numel() == 1:  # one token of one row: a matrix-vector product reads plain weights faster
        packed = None
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    if ids.shape[1] > 1 and group > 1:
        attend = attend.repeat(1, 1, group, 1)  # query rows are (head in group, position)
    for i, layer in enumerate(inner.layers[: model.config.num_hidden_layers]):
        mats = packed.layers[i] if packed is not None else None
        x = decoder_layer(layer, x, cos, sin, cache.k[i], cache.v[i], start, attend, mats)
    cache.length = start + ids.shape[1]
    if not logits:
        return None
    h = _rms_norm(x if every else x[:, -1], inner.norm)
    if packed is not None:
        return _packed_linear(h, packed.head, packed.head_bias).float()
    return F.linear(h, model.lm_head.weight, getattr(model.lm_head, "bias", None)).float()


def rotary(rope, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [B, 1, S, head_dim] for `positions` [B, S]: `LlamaRotaryEmbedding`'s cos, and its
    sin with the first half negated, which `_rotate` needs."""
    freqs = positions.unsqueeze(-1).float() * rope.inv_freq.float()
    scale = rope.attention_scaling
    cos, sin = freqs.cos() * scale, freqs.sin() * scale
    return torch.cat((cos, cos), dim=-1).to(dtype).unsqueeze(1), torch.cat((-sin, sin), dim=-1).to(
        dtype
    ).unsqueeze(1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin`: rotate_half(x) is (-x2, x1), the halves of x swapped (a roll)
    with the first negated (in `signed_sin`)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """HF's `LlamaRMSNorm`: normalised in float32, scaled in the weights' dtype."""
    h = F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _linear(x: torch.Tensor, layer) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def decoder_layer(
    layer, x, cos, sin, k_cache, v_cache, start: int, attend, mats: PackedLayer | None = None
) -> torch.Tensor:
    """One decoder block (Llama's; Qwen3's with its q/k norms) on `x` [B, S, hidden], writing this layer's
    K/V into columns `start:start+S` (`mats`: the layer's packed matrices, else the modules' own)."""
    attn, mlp = layer.self_attn, layer.mlp
    b, s, _ = x.shape
    kv_heads, d = k_cache.shape[1], attn.head_dim
    h = _rms_norm(x, layer.input_layernorm)
    q_norm = getattr(attn, "q_norm", None)  # Qwen3's per-head norms of queries and keys
    if mats is not None and q_norm is None:  # q, k and v heads side by side: q and k rotated in one go
        qkv = _packed_linear(h, mats.qkv, mats.qkv_bias).view(b, s, -1, d).transpose(1, 2)
        heads = qkv.shape[1] - 2 * kv_heads
        qk = _rotate(qkv[:, : heads + kv_heads], cos, sin)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
    else:
        q, k, v = _projected(attn, h, mats, kv_heads, d)
        if q_norm is not None:  # each head normalised over its own dimensions, before the rotation
            q, k = _rms_norm(q, q_norm), _rms_norm(k, attn.k_norm)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        heads = q.shape[1]
    end = start + s
    k_cache[:, :, start:end] = k
    v_cache[:, :, start:end] = v
    q = q.reshape(b, kv_heads, heads // kv_heads * s, d)
    o = F.scaled_dot_product_attention(
        q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=attend, scale=attn.scaling
    )
    o = o.view(b, heads, s, d).transpose(1, 2).reshape(b, s, heads * d)
    if mats is None:
        x = x + _linear(o, attn.o_proj)
        h = _rms_norm(x, layer.post_attention_layernorm)
        return x + _linear(F.silu(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj), mlp.down_proj)
    x = x + _packed_linear(o, mats.o, mats.o_bias)
    h = _rms_norm(x, layer.post_attention_layernorm)
    gate, up = _packed_linear(h, mats.gate_up, mats.gate_up_bias).chunk(2, dim=-1)
    return x + _packed_linear(F.silu(gate) * up, mats.down, mats.down_bias)


def _projected(attn, h: torch.Tensor, mats: PackedLayer | None, kv_heads: int, d: int):
    """The query, key and value heads of `h` [B, S, hidden], [B, heads, S, d] each, not yet rotated."""
    b, s, _ = h.shape
    if mats is not None:
        qkv = _packed_linear(h, mats.qkv, mats.qkv_bias).view(b, s, -1, d).transpose(1, 2)
        heads = qkv.shape[1] - 2 * kv_heads
        return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    q = _linear(h, attn.q_proj).view(b, s, -1, d).transpose(1, 2)
    k = _linear(h, attn.k_proj).view(b, s, kv_heads, d).transpose(1, 2)
    return q, k, _linear(h, attn.v_proj).view(b, s, kv_heads, d).transpose(1, 2)


# ---------------------------------------------------------------------------------------- packed weights


@dataclass
class PackedLayer:
    """One decoder layer's matrices in oneDNN's blocked layout: q|k|v stacked, gate|up stacked."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


@dataclass
class Packed:
    """Every matrix of a Llama, packed (`pack_weights`): what `forward` multiplies by instead."""

    layers: list[PackedLayer]
    head: torch.Tensor
    head_bias: torch.Tensor | None


PACK_HINT = 16  # the batch rows oneDNN lays the blocks out for; any row count runs on them
PACK_MIN_HIDDEN = 512  # below, a packed product's fixed cost outweighs what it saves (bench_engine.py)


def packable(model) -> str | None:
    """Why `model`'s matrices are not packed (None when they are): the CPU, float32 or bfloat16, oneDNN, and
    a hidden size of at least `PACK_MIN_HIDDEN`."""
    w = model.model.embed_tokens.weight
    if w.shape[1] < PACK_MIN_HIDDEN:
        return f"hidden size {w.shape[1]} < {PACK_MIN_HIDDEN}"
    if w.device.type != "cpu":
        return f"weights on {w.device.type}"
    if w.dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {w.dtype}"
    if not torch.backends.mkldnn.is_available():
        return "PyTorch built without oneDNN"
    return None


def pack_weights(model) -> Packed:
    """Copies of `model`'s matrices (and biases) packed for `forward`; a snapshot: repack after an update."""

    def pack(*modules) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = torch.cat([m.weight.detach() for m in modules])
        biases = [getattr(m, "bias", None) for m in modules]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [
                    m.bias.detach() if b is not None else m.weight.new_zeros(m.weight.shape[0])
                    for m, b in zip(modules, biases, strict=True)
                ]
            )
        return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_HINT), bias

    with torch.no_grad():
        layers = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(
                PackedLayer(
                    *pack(attn.q_proj, attn.k_proj, attn.v_proj),
                    *pack(attn.o_proj),
                    *pack(mlp.gate_proj, mlp.up_proj),
                    *pack(mlp.down_proj),
                )
            )
        return Packed(layers, *pack(model.lm_head))


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class WeightsCache:
    """What the fast path keeps derived from `model`'s weights between calls: the prefix store's keys and
    values and, where `packable`, the packed matrices. `refresh()`, before each batch, rebuilds both when
    the weights changed since the last refresh (`weights_fingerprint`) and returns the packed matrices."""

    def __init__(self, model, store: PrefixStore | None = None, pack: bool = True) -> None:
        self.model, self.store = model, store
        self.pack = pack and packable(model) is None
        self.fingerprint: tuple | None = None
        self.packed: Packed | None = None

    def refresh(self) -> Packed | None:
        if self.store is None and not self.pack:
            return None
        now = weights_fingerprint(self.model)
        if now != self.fingerprint:
            self.fingerprint = now
            if self.store is not None:
                self.store.entries.clear()
            self.packed = None  # the old copies go before the new are made
            self.packed = pack_weights(self.model) if self.pack else None
        return self.packed


# ------------------------------------------------------------------------------------------------ runner


class FastRunner:
    """The engine's stepping interface over one batch: `prefill`, then `step` per token, `select` rows."""

    def __init__(
        self, model, steps: int, store: PrefixStore | None = None, packed: Packed | None = None
    ) -> None:
        self.model = model
        self.device = model.model.embed_tokens.weight.device
        self.steps = steps  # most tokens any row may generate
        self.store = store  # current for these weights (`WeightsCache.refresh`)
        self.packed = packed
        self.cache: KVCache | None = None

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hits = self._stored_prefixes(input_ids, mask)
        if hits is not None:
            return self._prefill_stored(input_ids, mask, hits)
        capacity = input_ids.shape[1] + min(self.steps, FIRST_CHUNK)
        ids, mask = input_ids.to(self.device), mask.to(self.device)
        self.cache, logits = prefill_unique(self.model, ids, mask, capacity, self.packed)
        return logits

    def _stored_prefixes(self, input_ids: torch.Tensor, mask: torch.Tensor):
        if self.store is None or not self.store.entries:
            return None
        hits = [self.store.lookup(row[m.bool()].tolist()) for row, m in zip(input_ids, mask, strict=True)]
        return hits if any(n for n, _ in hits) else None

    def _prefill_stored(self, input_ids: torch.Tensor, mask: torch.Tensor, hits) -> torch.Tensor:
        """Prefill each row after its stored prefix (rows without one from the start)."""
        lengths = mask.sum(-1) - torch.tensor([n for n, _ in hits])
        width = int(lengths.max())
        ids = input_ids.new_zeros((len(hits), width))
        new_mask = mask.new_zeros((len(hits), width))
        for j, length in enumerate(lengths.tolist()):
            ids[j, width - length :] = input_ids[j, input_ids.shape[1] - length :]
            new_mask[j, width - length :] = 1
        held = max(n for n, _ in hits)
        self.cache = cache_from(
            self.model, [kv for _, kv in hits], held + width + min(self.steps, FIRST_CHUNK)
        )
        return prefill_after(
            self.model, self.cache, ids.to(self.device), new_mask.to(self.device), packed=self.packed
        )

    def remember(self, row: int, ids: list[int]) -> None:
        """Store `row`'s keys and values (it holds exactly `ids`: its prompt and the tokens fed since)."""
        if self.store is not None and self.cache is not None:
            k, v = row_kv(self.cache, row)
            assert k.shape[2] == len(ids), (k.shape, len(ids))
            self.store.add(ids, k, v)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None
        self.cache = reserve(self.cache, 1)
        return decode(self.model, self.cache, tokens.to(self.device), self.packed)

    def select(self, rows: torch.Tensor) -> None:
        assert self.cache is not None
        self.cache = select_rows(self.cache, rows.to(self.device))
