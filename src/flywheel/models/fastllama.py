"""A hand-written Llama forward over a preallocated KV cache: the fast path of the rollout engine.

`TorchEngine` generates with this whenever its model is a `LlamaForCausalLM` (the tiny models of
`flywheel.models.tiny` and SmolLM2 both are) and falls back to the model's own forward otherwise.
`unsupported(model)` says why a model cannot take this path (None when it can).

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

Weights: every call reads the parameters of the HF modules it is given (`layer.self_attn.q_proj.weight`
and so on); nothing derived from weights is cached, so an optimizer that updates the model in place
between calls is seen by the next call. The rotary inverse frequencies (`rotary_emb.inv_freq`, a buffer,
not a weight) are read each call too.

What is not covered (those models fall back to the HF forward): architectures other than
`LlamaForCausalLM`, activations other than SiLU, `pretraining_tp > 1`, and rotary variants whose
frequencies depend on the sequence length (`dynamic`, `longrope`). Attention and MLP biases are honoured.

Numerics: the same operations as the HF Llama in the same order (RMSNorm in float32, rotary on q and k,
softmax attention scaled by `attn.scaling`), so logits agree with the HF forward up to float rounding
(summation order inside the fused kernels differs). Deterministic for a fixed machine and thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SEQUENCE_DEPENDENT_ROPE = {"dynamic", "longrope"}
FIRST_CHUNK = 256  # decode columns allocated with the prompt; doubled when outgrown


def unsupported(model) -> str | None:
    """Why `model` cannot run on the fast path, or None when it can."""
    if type(model).__name__ != "LlamaForCausalLM":
        return f"{type(model).__name__} is not LlamaForCausalLM"
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    if int(getattr(cfg, "pretraining_tp", 1) or 1) != 1:
        return "pretraining_tp > 1"
    rope_type = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope_type in SEQUENCE_DEPENDENT_ROPE:
        return f"rope type {rope_type}"
    return None


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


def prefill(model, cache: KVCache, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Run left-padded prompts `input_ids` [B, S] (`mask` 1 on real tokens) into an empty cache.

    Returns the logits of the last position [B, vocab]. The prompts' common prefix is computed once and
    its keys and values copied into every row (columns `0:shared`); the rest of each prompt follows,
    left-padded, in columns `shared:`. Padding queries attend to themselves only, so their (unused)
    outputs stay finite.
    """
    shared = common_prefix(input_ids, mask) if input_ids.shape[0] > 1 else 0
    if shared:
        start = input_ids.shape[1] - int(mask.sum(-1)[0])
        _prefill_prefix(model, cache, input_ids[:1, start : start + shared])
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
    logits = forward(model, cache, input_ids, positions, torch.cat([before, attend], dim=2).unsqueeze(1))
    cache.next_pos = shared + real.long().sum(-1)
    return logits


def prefill_unique(
    model, input_ids: torch.Tensor, mask: torch.Tensor, capacity: int
) -> tuple[KVCache, torch.Tensor]:
    """`prefill` into a new cache of `capacity` columns, computing each distinct prompt once.

    Rows with the same (left-padded) prompt, such as the G samples of a group, share one forward; their
    keys and values are then copied to every row that has them. Returns (cache, last logits [B, vocab]).
    """
    rows = torch.cat([input_ids, mask], dim=1)
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if unique.shape[0] == rows.shape[0]:
        cache = new_cache(model, input_ids.shape[0], capacity)
        return cache, prefill(model, cache, input_ids, mask)
    width = input_ids.shape[1]
    cache = new_cache(model, unique.shape[0], capacity)
    logits = prefill(model, cache, unique[:, :width], unique[:, width:])
    return select_rows(cache, inverse), logits[inverse]


def common_prefix(input_ids: torch.Tensor, mask: torch.Tensor) -> int:
    """Tokens every left-padded prompt starts with, leaving each at least one token of its own."""
    lengths = mask.sum(-1)
    shortest = int(lengths.min())
    starts = (input_ids.shape[1] - lengths).tolist()
    heads = torch.stack([row[s : s + shortest] for row, s in zip(input_ids, starts, strict=True)])
    same = (heads == heads[:1]).all(dim=0).long().cumprod(dim=0).sum()
    return max(0, min(int(same), shortest - 1))


def _prefill_prefix(model, cache: KVCache, prefix: torch.Tensor) -> None:
    """Compute the keys and values of `prefix` [1, P] once and copy them into every row's columns 0:P."""
    n = prefix.shape[1]
    one = new_cache(model, 1, n)
    cols = torch.arange(n, device=prefix.device)
    causal = (cols.unsqueeze(0) <= cols.unsqueeze(1))[None, None]
    forward(model, one, prefix, cols.unsqueeze(0), causal, logits=False)
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


def decode(model, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
    """One step: feed `tokens` [B] at the next column; returns the next logits [B, vocab]."""
    col = cache.length
    cache.valid[:, col] = True
    attend = cache.valid[:, None, None, : col + 1]
    logits = forward(model, cache, tokens.unsqueeze(1), cache.next_pos.unsqueeze(1), attend)
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
) -> torch.Tensor | None:
    """Write `ids` [B, S] into columns `cache.length ...` and return the last position's logits [B, V].

    `attend` [B, 1, S, length + S] is True where a query may attend to a key column.
    """
    inner = model.model
    x = F.embedding(ids, inner.embed_tokens.weight)
    cos, sin = rotary(inner.rotary_emb, positions, x.dtype)
    start = cache.length
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    if ids.shape[1] > 1 and group > 1:
        attend = attend.repeat(1, 1, group, 1)  # query rows are (head in group, position)
    for i, layer in enumerate(inner.layers[: model.config.num_hidden_layers]):
        x = decoder_layer(layer, x, cos, sin, cache.k[i], cache.v[i], start, attend)
    cache.length = start + ids.shape[1]
    if not logits:
        return None
    h = _rms_norm(x[:, -1], inner.norm)
    return F.linear(h, model.lm_head.weight, getattr(model.lm_head, "bias", None))


def rotary(rope, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, 1, S, head_dim] for `positions` [B, S], as `LlamaRotaryEmbedding` computes them."""
    freqs = positions.unsqueeze(-1).float() * rope.inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = rope.attention_scaling
    return (emb.cos() * scale).to(dtype).unsqueeze(1), (emb.sin() * scale).to(dtype).unsqueeze(1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _linear(x: torch.Tensor, layer) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def decoder_layer(layer, x, cos, sin, k_cache, v_cache, start: int, attend) -> torch.Tensor:
    """One Llama block on `x` [B, S, hidden], writing this layer's K/V into columns `start:start+S`."""
    attn, mlp = layer.self_attn, layer.mlp
    b, s, _ = x.shape
    kv_heads, d = k_cache.shape[1], attn.head_dim
    h = _rms_norm(x, layer.input_layernorm)
    q = _linear(h, attn.q_proj).view(b, s, -1, d).transpose(1, 2)
    k = _linear(h, attn.k_proj).view(b, s, kv_heads, d).transpose(1, 2)
    v = _linear(h, attn.v_proj).view(b, s, kv_heads, d).transpose(1, 2)
    heads = q.shape[1]
    end = start + s
    k_cache[:, :, start:end] = _rotate(k, cos, sin)
    v_cache[:, :, start:end] = v
    q = _rotate(q, cos, sin).reshape(b, kv_heads, heads // kv_heads * s, d)
    o = F.scaled_dot_product_attention(
        q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=attend, scale=attn.scaling
    )
    o = o.view(b, heads, s, d).transpose(1, 2).reshape(b, s, heads * d)
    x = x + _linear(o, attn.o_proj)
    h = _rms_norm(x, layer.post_attention_layernorm)
    return x + _linear(F.silu(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj), mlp.down_proj)


# ------------------------------------------------------------------------------------------------ runner


class LlamaRunner:
    """The engine's stepping interface over one batch: `prefill`, then `step` per token, `select` rows."""

    def __init__(self, model, steps: int) -> None:
        self.model = model
        self.steps = steps  # most tokens any row may generate
        self.cache: KVCache | None = None

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        capacity = input_ids.shape[1] + min(self.steps, FIRST_CHUNK)
        self.cache, logits = prefill_unique(self.model, input_ids, mask, capacity)
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None
        self.cache = reserve(self.cache, 1)
        return decode(self.model, self.cache, tokens)

    def select(self, rows: torch.Tensor) -> None:
        assert self.cache is not None
        self.cache = select_rows(self.cache, rows)
