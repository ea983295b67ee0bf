"""Run configuration: `flywheel train CONFIG`'s sections, one dataclass each, read by `flywheel.settings`.

Each section checks its own values as it is built (`__post_init__`), so a bad key is refused with one line
before any work starts; checks whose meaning spans sections (`[reward]`'s length budgets against
`[rollout]`'s efforts) run as the whole `RunConfig` is built (`check_budgets`). Unset fields keep the
defaults written next to them below. `load_config(path)` reads a run config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel import settings
from flywheel.errors import FlywheelError
from flywheel.harness import EFFORTS
from flywheel.loop.config import LoopConfig
from flywheel.models import MODELS, SPECS
from flywheel.models.hf import resolve_device, resolve_dtype
from flywheel.rl.lora import LORA_TARGETS, require_peft
from flywheel.rubric import BASELINES, QUANTITIES

# ------------------------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    path: str = ""  # `hf:DIR`, `smollm2-135m`, `toybugs-sweep` (the shipped base), or a directory made by `flywheel sft`
    max_context: int = 2048  # prompt + generation, in tokens
    prefix_cache_mb: int = 512  # keys and values of earlier turns kept for the next turn's prompt (0: off)
    device: str = "auto"  # "auto" (CUDA when a GPU is visible, else the CPU), "cpu" or "cuda"
    dtype: str = "float32"  # or "bfloat16": engine weights and KV cache; training autocasts (float32 master)
    draft: str = ""  # speculative decoding's draft ("": none): `layers:N` or a model with the same vocabulary
    draft_tokens: int = 4  # tokens the draft proposes per round (with a draft, requests run one at a time)
    pack: bool = (
        True  # on the CPU: a packed copy of the matrices, faster at batch > 1 (false: half the memory)
    )

    def __post_init__(self) -> None:
        resolve_device(self.device, "[model] device")  # "cuda" without a visible GPU is refused here
        resolve_dtype(self.dtype, "[model] dtype")


@dataclass
class TasksConfig:
    suite: str = "toybugs"  # a built-in suite or a directory of task directories
    split: str = "train"
    limit: int = 0  # use the first N tasks of the split (0: all)
    eval_split: str = "heldout"
    eval_suite: str = ""  # the suite eval_split is read from ("": suite), e.g. when suite is a curated subset
    recurate_every: int = 0  # every N steps keep only tasks with 0 < pass rate <= p_max (0: never)
    p_max: float = 0.75  # curation's upper pass rate; unmeasured tasks stay eligible
    recurate_window: int = 8  # pass rates count attempts of the last N policy versions
    rename: float = (
        0.0  # share of each step's tasks replaced by a copy with made-up names (flywheel.sft.rename)
    )

    def __post_init__(self) -> None:
        if not 0 <= self.rename <= 1:
            raise FlywheelError("[tasks] rename must be a share between 0 and 1")


@dataclass
class RolloutConfig:
    efforts: list[str] = field(default_factory=lambda: ["medium", "high", "max"])
    tasks_per_step: int = 4  # tasks sampled per step; each is rolled out at every effort level
    group_size: int = 4  # G attempts per (task, effort)
    temperature: float = 1.0
    top_p: float = 0.95
    concurrency: int = 24  # episodes stepped together (one batched generate call per step)
    cohorts: int = 1  # groups of those that take turns: one generates while another's tools run
    observation_chars: int = 1500  # longest tool output kept in the conversation
    compaction: str = "elide"  # near the context limit: "summary" (model-written), "elide" or "none"
    compact_at: float = 0.8  # with "summary": the share of the model's context that triggers it
    warm_pytest: bool = True  # the agent's pytest runs forked from a warm parent (flywheel.sandbox.warm)
    max_turns: dict[str, int] = field(default_factory=dict)  # per-effort override of the turn budget
    max_tokens: dict[str, int] = field(default_factory=dict)  # per-effort override of the token budget
    infra_retries: int = 1  # retries of an attempt the model server, sandbox or grader ended (0: none)

    def __post_init__(self) -> None:
        for e in self.efforts:
            if e not in EFFORTS:
                raise FlywheelError(
                    f"[rollout] efforts: unknown effort '{e}' (choose from {', '.join(EFFORTS)})"
                )
        if not self.temperature > 0:
            raise FlywheelError("[rollout] temperature must be > 0 (the replayed distribution needs one)")
        if not 0 < self.top_p <= 1:
            raise FlywheelError("[rollout] top_p must be in (0, 1]")
        for key in ("tasks_per_step", "group_size", "concurrency", "cohorts"):
            if getattr(self, key) < 1:
                raise FlywheelError(f"[rollout] {key} must be >= 1")
        if self.infra_retries < 0:
            raise FlywheelError(f"[rollout] infra_retries must be >= 0, got {self.infra_retries}")


@dataclass
class RewardConfig:
    lambdas: dict[str, float] = field(default_factory=dict)  # λ_e per effort (missing: 0, or calibration)
    calibration: str = ""  # a calibration.json written by `flywheel calibrate`; its λ fill the gaps
    cost_scale: float = 1.0  # C is measured in dollars × cost_scale (calibration uses the same unit)
    length_penalty: float = 0.0  # reward lost per turn over the effort's turn budget, in penalised phases
    length_budget: dict[str, int] = field(default_factory=dict)  # turns per effort (missing: never penalised)
    # per effort, a budget per quantity (turns, tokens, seconds), e.g. { medium = { turns = 3, tokens = 800 } }
    length_budgets: dict[str, dict[str, float]] = field(default_factory=dict)
    length_prices: dict[str, float] = field(default_factory=dict)  # reward lost per unit over, per quantity
    length_phase: int = (
        1  # steps per phase: success-only and penalised phases alternate (0: penalise every step)
    )
    length_scope: str = "all"  # "solved": only in (task, effort) groups where some attempt succeeded

    def __post_init__(self) -> None:
        if self.length_penalty < 0 or self.length_phase < 0:
            raise FlywheelError("[reward] length_penalty and length_phase must be >= 0")
        if self.length_scope not in ("all", "solved"):
            raise FlywheelError("[reward] length_scope must be 'all' or 'solved'")
        for e, turns in self.length_budget.items():
            if turns < 1:
                raise FlywheelError(f"[reward] length_budget.{e} must be >= 1 turn")

    def budgets(self) -> dict[str, dict[str, float]]:
        """Each effort's budget per quantity: `length_budgets` with `length_budget`'s turns added."""
        out = {e: dict(b) for e, b in self.length_budgets.items()}
        for e, turns in self.length_budget.items():
            out.setdefault(e, {})["turns"] = float(turns)
        return {e: b for e, b in out.items() if b}

    def prices(self) -> dict[str, float]:
        """Reward lost per unit over budget, per quantity: `length_prices`, turns at `length_penalty` unless
        `length_prices` names them."""
        return {"turns": self.length_penalty, **self.length_prices}


@dataclass
class ObjectiveConfig:
    baseline: str = "length_weighted"  # or "mean" (the ablation)
    replay: bool = True  # renormalise over the sampler's top-p kept set (False: full softmax)
    clip_c: float = 2.0  # truncation of the importance weight
    token_budget: int = 0  # the constant N of the loss normalisation (0: counted rollouts per step × 256)
    batch_tokens: int = 16384  # padded tokens per trainer forward pass (pack = false)
    pack: bool = True  # share common prefixes of the replayed turns in one tree-masked sequence
    pack_tokens: int = 4096  # distinct tokens per packed forward pass (pack = true)
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward: less memory

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise FlywheelError("[objective] baseline must be 'length_weighted' or 'mean'")
        if self.pack_tokens < 1 or self.batch_tokens < 1:
            raise FlywheelError("[objective] pack_tokens and batch_tokens must be >= 1")


@dataclass
class LoraConfig:
    """`[optim] lora`: train low-rank adapters on the named matrices, the base frozen (`flywheel.rl.lora`)."""

    rank: int = 8  # r: each adapted matrix W gets W + (alpha / rank) · B·A, B [out, r], A [r, in]
    alpha: float = 16.0  # the adapters' scale is alpha / rank
    # every linear layer of a Llama-shaped decoder (Llama, Mistral, Qwen2/2.5/3, Gemma name them so)
    targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    dropout: float = 0.0  # dropout on the adapters' input in the trainer's forward (0: the replay is exact)

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise FlywheelError(f"[optim] lora.rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise FlywheelError(f"[optim] lora.alpha must be > 0, got {self.alpha}")
        if not self.targets or not all(self.targets):
            raise FlywheelError("[optim] lora.targets must name at least one module (e.g. q_proj)")
        if len(set(self.targets)) != len(self.targets):
            raise FlywheelError(f"[optim] lora.targets names a module twice: {self.targets}")
        if not 0 <= self.dropout < 1:
            raise FlywheelError(f"[optim] lora.dropout must be in [0, 1), got {self.dropout}")
        require_peft()


@dataclass
class OptimConfig:
    kind: str = "muon"  # "muon" (Muon for hidden matrices + AdamW) or "adamw"
    lr: float = 3e-4
    muon_lr: float = 0.0  # 0: same as lr
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    updates_per_step: int = 1
    train_layers: int = 0  # train only the top N decoder layers and the final norm (0: every parameter)
    lora: LoraConfig | None = None  # set: train LoRA adapters only (`{ rank, alpha, targets, dropout }`)

    def __post_init__(self) -> None:
        if self.kind not in ("muon", "adamw"):
            raise FlywheelError("[optim] kind must be 'muon' or 'adamw'")
        if self.lora is not None and self.train_layers:
            raise FlywheelError(
                "[optim] lora and train_layers cannot be combined (LoRA freezes the whole base); set one"
            )


@dataclass
class TrainConfig:
    steps: int = 20
    checkpoint_every: int = 1
    trajectories: str = "lite"  # RUN_DIR/trajectories.jsonl: "lite" (no kept sets), "full" or "none"
    threads: int = 1  # torch intra-op threads (0: torch's default); small models run fastest on one
    update_threads: int = (
        0  # threads for scoring and the optimizer step, which have the cores to themselves (0: `threads`)
    )
    max_minutes: float = 0.0  # wall-time budget: no step starts that would end past it (0: none)
    tensorboard: bool = False  # metrics.jsonl's scalars also as TensorBoard events in RUN_DIR/tensorboard/

    def __post_init__(self) -> None:
        if self.update_threads < 0:
            raise FlywheelError("[train] update_threads must be >= 0 (0: as `threads`)")
        if self.steps < 0 or self.checkpoint_every < 1:
            raise FlywheelError("[train] steps must be >= 0 and checkpoint_every >= 1")
        if self.trajectories not in ("lite", "full", "none"):
            raise FlywheelError("[train] trajectories must be 'lite', 'full' or 'none'")


@dataclass
class FusionSection:
    """`[fusion]`: train the run's model as the sidekick of a frozen lead (`flywheel.fusion`)."""

    lead: str = ""  # the lead's model spec (scripted-lead, openai:NAME, hf:DIR, ...); required
    lead_base_url: str = ""  # the lead's server, for openai:NAME
    lead_effort: str = ""  # the lead's turn and token budgets come from this level ("": the attempt's)
    max_delegations: int = 4  # per attempt

    def __post_init__(self) -> None:
        if not self.lead:
            raise FlywheelError("[fusion] lead is missing: give the lead's model spec (e.g. scripted-lead)")
        kind = self.lead.split(":", 1)[0]
        if kind not in MODELS:
            raise FlywheelError(f"[fusion] lead: unknown model '{self.lead}' (use {SPECS})")
        if self.lead_effort and self.lead_effort not in EFFORTS:
            raise FlywheelError(f"[fusion] lead_effort: unknown effort '{self.lead_effort}'")
        if self.max_delegations < 1:
            raise FlywheelError("[fusion] max_delegations must be >= 1")


@dataclass
class RunConfig:
    """`flywheel train CONFIG`: everything a run needs."""

    seed: int = 0
    deterministic: bool = False  # byte-identical metrics and checkpoints for the same config and seed
    model: ModelConfig = field(default_factory=ModelConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)  # backend "inline" (default), "local" or "ray"
    fusion: FusionSection | None = None  # set: the model is trained as a lead's sidekick

    def __post_init__(self) -> None:
        check_budgets(self)


def check_budgets(cfg: RunConfig) -> None:
    """Refuse `[reward] length_budgets` and `length_prices` that cannot mean what they say, naming the key:
    an unknown effort or quantity, a negative number, a budgeted quantity without a price, a turn budget or
    price given twice (also as `length_budget` or `length_penalty`), or measured seconds in a deterministic
    run (its metrics would not repeat)."""
    r, where = cfg.reward, "[reward] length_budgets"
    for e in r.length_budget:
        if e not in cfg.rollout.efforts:
            raise FlywheelError(f"[reward] length_budget: effort '{e}' is not in [rollout] efforts")
    for q, price in r.length_prices.items():
        _check_quantity(q, f"[reward] length_prices.{q}")
        if price < 0:
            raise FlywheelError(f"[reward] length_prices.{q} must be >= 0")
    if "turns" in r.length_prices and r.length_penalty:
        raise FlywheelError("[reward] length_prices.turns: the turn price is already length_penalty; set one")
    for e, budget in r.length_budgets.items():
        if e not in cfg.rollout.efforts:
            raise FlywheelError(f"{where}: effort '{e}' is not in [rollout] efforts")
        for q, b in budget.items():
            _check_budget(cfg, e, q, b)


def _check_budget(cfg: RunConfig, effort: str, quantity: str, budget: float) -> None:
    r, key = cfg.reward, f"[reward] length_budgets.{effort}.{quantity}"
    _check_quantity(quantity, key)
    if budget < 0:
        raise FlywheelError(f"{key} must be >= 0")
    if quantity == "turns" and effort in r.length_budget:
        raise FlywheelError(f"{key}: {effort}'s turn budget is already length_budget.{effort}; set one")
    if quantity not in r.length_prices and not (quantity == "turns" and r.length_penalty):
        also = " (or length_penalty)" if quantity == "turns" else ""
        raise FlywheelError(f"{key} has no price: set [reward] length_prices.{quantity}{also}")
    if quantity == "seconds" and cfg.deterministic:
        raise FlywheelError(
            f"{key}: a deterministic run cannot budget measured seconds (budget turns or tokens)"
        )


def _check_quantity(quantity: str, key: str) -> None:
    if quantity not in QUANTITIES:
        raise FlywheelError(f"{key}: unknown quantity '{quantity}' (known: {', '.join(QUANTITIES)})")


def load_config(path: str | Path) -> RunConfig:
    """The run config in the TOML file at `path`; FlywheelError names the first bad key."""
    return settings.load_config(path, RunConfig)


SECRET = "<redacted>"


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data (for run directories), the secrets it may hold (the pools' API key, the
    store's secret key) replaced by `SECRET`: a run directory is shared, a key is not."""
    out = dataclasses.asdict(config)
    loop = out.get("loop")
    if isinstance(loop, dict):
        if loop.get("pool_api_key"):
            loop["pool_api_key"] = SECRET
        options = loop.get("store_options") or {}
        if options.get("secret"):
            options["secret"] = SECRET
    return out
