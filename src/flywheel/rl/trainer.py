"""The trainer: graded trajectory records in, one policy-gradient update out.

`Trainer.step(records)`:

1. the run's rubric (`flywheel.rubric.Rubric`) scores the records: reward ``R_i = S_i - λ_e·C_i`` (a
   Fusion attempt's C is the lead's and the sidekick's together), length penalties, and advantages within
   each (task, effort) group over the attempts the policy ended (one the infrastructure ended stays in
   the records with its score but has advantage 0 and is left out of its group's baseline);
3. for every trained assistant turn that carries its sampled tokens (`turns_of`: a Fusion attempt's
   sidekick turns only, the lead frozen), a forward pass over the turn's exact prompt
   and generated ids (packed, see below); the generated tokens' log-probabilities are replayed over the sampler's top-p kept
   sets (`replay=True`) or over the full vocabulary (`replay=False`, the ablation), both at the sampling
   temperature;
4. the truncated-importance-weighted loss of `objective.policy_loss`, summed over all turns and divided by
   one constant token budget, so every generated token weighs the same in every step (see the objective's
   docstring for why); gradients accumulate turn by turn, then are clipped and the optimizer steps.

The forward passes are packed (`objective.pack`, on by default): the turns' ``prompt + generated`` ids go
into a prefix tree (`flywheel.rl.pack`), and one tree-masked forward computes each shared prefix once, the
group's common prompt and an episode's earlier turns alike. Sharing is by exact token ids, so a turn whose
prompt re-renders the conversation differently from the ids generated before simply shares less. With
``pack = false`` each turn is its own right-padded row (turns of similar length share a batch).
The tree mask is full causal attention, so a model with a sliding window (`fastllama.attention_window`:
Mistral's, Gemma's, Qwen's windowed layers) is packed only while every turn fits in its window; a step
with a longer turn replays padded, where the model's own masks apply the window.
Rollouts whose advantage is exactly zero carry no gradient and are skipped.

The model is shared with the rollout engine, which always generates from the current parameters, so the
next step's rollouts see this step's update without a copy. `serving_weights()` gives the bf16 weights to
publish as deltas (with LoRA, `serving_base()` and `serving_adapters()`: the base once, the adapters per
version, `flywheel.sync.adapters`); `save` / `load` checkpoint the model, the optimizer and the version atomically.

Precision (`[model] dtype`): with `"bfloat16"` the trainer's model holds float32 master weights and the
optimizer keeps float32 state; the forward passes run under `torch.autocast` to bfloat16 (`hf.mixed`) and
the loss is computed on float32 logits. The engine then serves its own bfloat16 copy, which
`sync_engine` overwrites from the master weights after every update and every `load`; deltas and
checkpoints are read from the master weights. The device is the model's: batches are built on the CPU and
moved there.

Memory (`[objective]`): `pack_tokens` / `batch_tokens` bound the tokens of one forward pass (micro-batches
whose gradients accumulate into one update), and `activation_checkpointing = true` keeps only each
decoder layer's input from the forward pass and recomputes the layer's inner activations in the backward
pass (HF's gradient checkpointing, non-reentrant): less memory for about a third more compute. The forward
then runs in training mode, so a model with dropout would apply it there.

LoRA (`[optim] lora`, `flywheel.rl.lora`): the trainer trains a copy of the model with adapters injected
(`model`) and only the adapters; the model it was given becomes `served`, whose adapted matrices hold the
base plus the adapters after every update and every `load`. The engine generates from `served` (shared in
float32, synced into its own bfloat16 copy otherwise), `serving_weights()` and checkpoints read it (so a
checkpoint is still an HF model directory, with the adapters beside it), and `load` restores the adapters
and the optimizer on the base the trainer was built on. Pools get the base once and the adapters per
version (`serving_base`, `serving_adapters`; `flywheel.sync.adapters`). Without LoRA `served` is `model`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from flywheel.errors import FlywheelError
from flywheel.files import building
from flywheel.models.fastllama import attention_window
from flywheel.models.hf import mixed, resolve_dtype, train_top_layers
from flywheel.record import Trajectory
from flywheel.rl.config import RunConfig
from flywheel.rl.lora import WEIGHTS as LORA_WEIGHTS
from flywheel.rl.lora import Adapters
from flywheel.rl.objective import (
    policy_loss,
    replay_entropy,
    replay_log_probs,
    replay_mask,
)
from flywheel.rl.optim import build_optimizer
from flywheel.rl.pack import PrefixPack, pack_groups
from flywheel.rubric import Rubric, counts, turns_of
from flywheel.sync.adapters import AdapterWeights

TURN_TOKENS = 256  # default per-rollout share of the token budget


@contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to `n` inside the block (0: left as they are)."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def token_batches(turns: Sequence[dict[str, Any]], max_tokens: int) -> list[list[int]]:
    """Indices of `turns` grouped into batches of similar length whose padded size stays under `max_tokens`."""
    order = sorted(range(len(turns)), key=lambda i: len(turns[i]["prompt_ids"]) + len(turns[i]["token_ids"]))
    batches: list[list[int]] = []
    for i in order:
        width = len(turns[i]["prompt_ids"]) + len(turns[i]["token_ids"])
        if batches and width * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class Trainer:
    """Policy-gradient updates of an HF causal LM from trajectory records; see the module docstring."""

    def __init__(self, model, tokenizer, cfg: RunConfig, lambdas: dict[str, float], engine: Any = None):
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.engine = engine  # a Model generating from `model`'s parameters (the inline loop backend's)
        self.lambdas = dict(lambdas)
        r = cfg.reward
        self.rubric = Rubric(
            self.lambdas, cfg.objective.baseline, cfg.deterministic, r.prices(), r.budgets(), r.length_phase,
            r.length_scope,
        )  # fmt: skip
        self.dtype = resolve_dtype(cfg.model.dtype, "[model] dtype")
        first = next(model.parameters())
        self.device = first.device
        if self.dtype != torch.float32 and first.dtype != torch.float32:
            raise FlywheelError(
                f"[model] dtype = '{cfg.model.dtype}' trains float32 master weights, not {first.dtype}"
            )
        o = cfg.optim
        self.lora = Adapters(model, o.lora, cfg.seed) if o.lora is not None else None
        if self.lora is not None:
            self.model = model = self.lora.model  # trained; `served` (the model given) holds the merge
        else:
            try:
                train_top_layers(model, o.train_layers)
            except ValueError as e:
                raise FlywheelError(f"optim.{e}") from None
        self.served = self.lora.served if self.lora is not None else model  # what the engine and deltas read
        self.optimizer = build_optimizer(
            model, o.kind, lr=o.lr, muon_lr=o.muon_lr or None, weight_decay=o.weight_decay
        )
        self.recompute = cfg.objective.activation_checkpointing
        if self.recompute:
            if not getattr(model, "supports_gradient_checkpointing", False):
                raise FlywheelError(
                    f"[objective] activation_checkpointing: {type(model).__name__} does not support it"
                )
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.x's name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self.version = 0

    # -- one update

    def scores(self, records: Sequence[Trajectory], step: int) -> list[dict[str, float]]:
        """The rubric's score of the records of RL step `step` (1-based; it sets the length-penalty phase)."""
        return self.rubric.score(records, step)

    def step(self, records: Sequence[Trajectory]) -> tuple[dict[str, float], list[dict[str, float]]]:
        """One RL step from graded records (step `version + 1`, which sets the length-penalty phase), on
        `[train] update_threads` threads; increments `version`; returns the step's metrics (`_update`'s and
        the rubric's) and each record's score (`flywheel.rubric.score`)."""
        step = self.version + 1
        with torch_threads(self.cfg.train.update_threads):
            scores = self.rubric.score(records, step)
            metrics = self.rubric.metrics(records, scores, step)
            metrics.update(self._update(records, scores))
        return metrics, scores

    def _update(self, records: Sequence[Trajectory], scores: list[dict[str, float]]) -> dict[str, float]:
        cfg = self.cfg
        work = [
            (t, s["advantage"])
            for r, s in zip(records, scores, strict=True)
            for t in turns_of(r)
            if s["advantage"] != 0.0
        ]
        # masked attempts (the infrastructure ended them; a retry took their place) are not in the budget
        budget = cfg.objective.token_budget or max(1, sum(map(counts, records))) * TURN_TOKENS
        stats: dict[str, float] = {}
        for _ in range(max(1, cfg.optim.updates_per_step)):
            self.optimizer.zero_grad(set_to_none=True)
            stats = self._accumulate(work, budget)
            params = [p for p in self.model.parameters() if p.grad is not None]
            norm = (
                torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip) if params else torch.tensor(0.0)
            )
            stats["grad_norm"] = float(norm)
            if params:
                self.optimizer.step()
        if self.lora is not None:
            self.lora.merge()
        self.sync_engine()
        self.version += 1
        return stats

    def _accumulate(self, work: list[tuple[dict[str, Any], float]], budget: float) -> dict[str, float]:
        """Backward of the loss over every turn in `work`, in padded batches; returns the step's statistics."""
        sums = {"loss": 0.0, "entropy": 0.0, "is_weight_mean": 0.0, "clip_frac": 0.0, "kl_k3": 0.0}
        ratio_max, n_tokens = 0.0, 0
        obj = self.cfg.objective
        if obj.pack and self._packable(work):
            batches = pack_groups([t["prompt_ids"] + t["token_ids"] for t, _ in work], obj.pack_tokens)
        else:
            batches = [(b, None) for b in token_batches([t for t, _ in work], obj.batch_tokens)]
        for batch, pack in batches:
            turns = [work[i][0] for i in batch]
            advs = torch.cat(
                [torch.full((len(t["token_ids"]),), work[i][1]) for i, t in zip(batch, turns, strict=True)]
            )
            with mixed(self.device, self.dtype), self._training_mode():
                logits = self._generated_logits(turns) if pack is None else self._packed_logits(turns, pack)
            dev = logits.device
            advs = advs.to(dev)
            tokens = torch.tensor([x for t in turns for x in t["token_ids"]], device=dev)
            temperature = self.cfg.rollout.temperature
            # a turn without kept sets (an HTTP pool's) has them rebuilt at the rollout's top-p (replay_mask)
            kept = [t.get("kept") if obj.replay else [None] * len(t["token_ids"]) for t in turns]
            lengths = [len(t["token_ids"]) for t in turns]
            mask = replay_mask(kept, lengths, logits, tokens, self.cfg.rollout.top_p, temperature)
            lp = replay_log_probs(logits, mask, tokens, temperature)
            rollout_lp = torch.tensor([x for t in turns for x in t["logprobs"]], device=dev)
            loss, s = policy_loss(
                lp,
                rollout_lp,
                advs,
                torch.ones_like(tokens, dtype=torch.bool),
                clip_c=self.cfg.objective.clip_c,
                token_budget=budget,
            )
            loss.backward()
            n = len(tokens)
            with torch.no_grad():
                sums["entropy"] += float(replay_entropy(logits.detach(), mask, temperature).sum())
            sums["loss"] += float(loss.detach())
            for key in ("is_weight_mean", "clip_frac", "kl_k3"):
                sums[key] += s[key] * n
            ratio_max, n_tokens = max(ratio_max, s["is_ratio_max"]), n_tokens + n
        out = {"loss": sums["loss"], "train_tokens": float(n_tokens), "is_ratio_max": ratio_max}
        for key in ("entropy", "is_weight_mean", "clip_frac", "kl_k3"):
            out[key] = sums[key] / n_tokens if n_tokens else 0.0
        return out

    def _packable(self, work: list[tuple[dict[str, Any], float]]) -> bool:
        """Whether the tree mask gives these turns their own attention: always, but under a sliding window
        narrower than the longest turn (the tree mask does not apply it)."""
        window = attention_window(self.model.config)
        return window is None or all(len(t["prompt_ids"]) + len(t["token_ids"]) <= window for t, _ in work)

    @contextmanager
    def _training_mode(self):
        """The modules that act differently in training run in training mode inside, eval mode after: with
        activation checkpointing the whole model (the mode in which the layers keep only their inputs and
        recompute the rest in the backward pass), else LoRA's dropout, when it has one."""
        if self.recompute:
            modules = [self.model]
        else:
            modules = self.lora.dropouts() if self.lora is not None else []
        for m in modules:
            m.train()
        try:
            yield
        finally:
            for m in modules:
                m.eval()

    def _generated_logits(self, turns: list[dict[str, Any]]) -> torch.Tensor:
        """Logits predicting each turn's generated tokens, concatenated: ``[Σ len(gen), V]`` float32.

        One right-padded forward of the decoder over prompt + generated ids; the output head runs only at
        the positions that predict generated tokens (the head of a large vocabulary is the costly part).
        """
        seqs = [t["prompt_ids"] + t["token_ids"] for t in turns]
        ids = torch.zeros((len(seqs), max(map(len, seqs))), dtype=torch.long)
        attn = torch.zeros_like(ids)
        rows, cols = [], []
        for j, (seq, t) in enumerate(zip(seqs, turns, strict=True)):
            ids[j, : len(seq)] = torch.tensor(seq)
            attn[j, : len(seq)] = 1
            start = len(t["prompt_ids"]) - 1
            rows += [j] * len(t["token_ids"])
            cols += range(start, start + len(t["token_ids"]))
        ids, attn = ids.to(self.device), attn.to(self.device)
        hidden = self.model.base_model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        return self._head(hidden[rows, cols])

    def _packed_logits(self, turns: list[dict[str, Any]], pack: PrefixPack | None = None) -> torch.Tensor:
        """`_generated_logits` from one forward over the turns' prefix tree (`flywheel.rl.pack`): each
        shared prefix (a group's prompt, an episode's earlier turns) is computed once. `pack`: the tree
        already filled with the turns, in order (built here when None)."""
        if pack is None:
            pack = PrefixPack()
            for t in turns:
                pack.add(t["prompt_ids"] + t["token_ids"])
        dev = self.device
        # the mask in the dtype attention computes in: autocast's, else the weights'
        dtype = self.dtype if self.dtype != torch.float32 else next(self.model.parameters()).dtype
        hidden = self.model.base_model(
            input_ids=torch.tensor([pack.ids], device=dev),
            attention_mask=pack.mask(dtype).to(dev),
            position_ids=torch.tensor([pack.positions], device=dev),
            use_cache=False,
        ).last_hidden_state[0]
        rows = [
            node
            for path, t in zip(pack.paths, turns, strict=True)
            for node in path[len(t["prompt_ids"]) - 1 : len(path) - 1]
        ]
        return self._head(hidden[rows])

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of the output head at `hidden`, soft-capped as the model's own forward caps them
        (Gemma 2's `final_logit_softcapping`)."""
        logits = self.model.get_output_embeddings()(hidden)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    # -- weights and checkpoints

    def serving_weights(self) -> dict[str, torch.Tensor]:
        """bf16 copies of the (master) weights on the CPU, as inference serves them (with LoRA: the base
        with the adapters merged in, under the base's names)."""
        return {k: v.detach().to("cpu", torch.bfloat16).clone() for k, v in self.served.state_dict().items()}

    def serving_base(self) -> dict[str, torch.Tensor]:
        """With LoRA: float32 copies of the frozen base on the CPU, under the served names (what pools hold
        under the adapters, `flywheel.sync.adapters`)."""
        if self.lora is None:
            raise FlywheelError("serving_base: the trainer has no LoRA adapters")
        return {k: v.detach().to("cpu", torch.float32).clone() for k, v in self.lora.base_weights()}

    def serving_adapters(self) -> AdapterWeights:
        """With LoRA: the adapters, float32 copies on the CPU, by served matrix name (published per version
        instead of a delta of the merged weights)."""
        if self.lora is None:
            raise FlywheelError("serving_adapters: the trainer has no LoRA adapters")
        out = AdapterWeights(self.lora.cfg.rank, float(self.lora.cfg.alpha))
        for name, a, b in self.lora.adapter_tensors():
            out.a[name] = a.detach().to("cpu", torch.float32).clone()
            out.b[name] = b.detach().to("cpu", torch.float32).clone()
        return out

    def sync_engine(self) -> None:
        """Copy the weights into the engine's model when it holds a copy of its own (a bfloat16 engine under
        float32 master weights), in place, so the engine sees the update; nothing when they are shared.
        With LoRA only the merged matrices are copied: nothing else changes."""
        served = getattr(self.engine, "model", None)
        if served is None or served is self.served:
            return
        target = dict(served.named_parameters())
        changed = self.lora.served_weights() if self.lora is not None else self.model.named_parameters()
        with torch.no_grad():
            for name, p in changed:
                target[name].copy_(p)

    def save(self, path: Path) -> Path:
        """Checkpoint into directory `path` atomically: weights, tokenizer, optimizer, version (with LoRA:
        the merged weights, and the adapters apart, `flywheel.rl.lora`)."""
        path = Path(path)
        with building(path) as tmp:
            self.served.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            if self.lora is not None:
                self.lora.save(tmp)
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / "trainer.json").write_text(
                json.dumps({"version": self.version, "lambdas": self.lambdas}) + "\n"
            )
        return path

    def load(self, path: Path) -> None:
        """Restore a checkpoint written by `save` (weights in place, optimizer state, version; with LoRA the
        adapters, on the base the trainer was built on)."""
        from safetensors.torch import load_file

        path = Path(path)
        adapters = (path / LORA_WEIGHTS).exists()
        if adapters != (self.lora is not None):
            held = "LoRA adapters" if adapters else "full weights"
            raise FlywheelError(
                f"{path}: the checkpoint holds {held}; resume it with the run's own [optim] lora"
            )
        if self.lora is not None:
            self.lora.load(path)
        else:
            state = load_file(path / "model.safetensors")
            missing = self.model.load_state_dict(state, strict=False).missing_keys
            if [k for k in missing if "lm_head" not in k]:  # tied heads are not saved separately
                raise ValueError(f"{path}: checkpoint lacks {missing[:3]}")
        self.optimizer.load_state_dict(
            torch.load(path / "optimizer.pt", map_location=self.device, weights_only=False)
        )
        self.version = int(json.loads((path / "trainer.json").read_text())["version"])
        self.sync_engine()
