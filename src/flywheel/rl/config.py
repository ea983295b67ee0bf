"""Run configuration: one TOML file per run, one dataclass per section, checked field by field.

`load_config(path, RunConfig)` reads a TOML file into nested dataclasses. Every key must be a known field
of its section and every value must have the field's type (an int is accepted where a float is asked);
anything else is refused with one line naming the file, the section and the key, so the CLI can exit 2
before any work starts. Unset fields keep the defaults written next to them below. `[reward]`'s length
budgets are checked as the run config is built (`check_budgets`), since their meaning spans keys.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.loop.config import LoopConfig
from flywheel.models.hf import resolve_device, resolve_dtype
from flywheel.rl.objective import QUANTITIES

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
    max_turns: dict[str, int] = field(default_factory=dict)  # per-effort override of the turn budget
    max_tokens: dict[str, int] = field(default_factory=dict)  # per-effort override of the token budget


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
    token_budget: int = 0  # the constant N of the loss normalisation (0: rollouts per step × 256)
    batch_tokens: int = 16384  # padded tokens per trainer forward pass (pack = false)
    pack: bool = True  # share common prefixes of the replayed turns in one tree-masked sequence
    pack_tokens: int = 4096  # distinct tokens per packed forward pass (pack = true)
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward: less memory


@dataclass
class OptimConfig:
    kind: str = "muon"  # "muon" (Muon for hidden matrices + AdamW) or "adamw"
    lr: float = 3e-4
    muon_lr: float = 0.0  # 0: same as lr
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    updates_per_step: int = 1
    train_layers: int = 0  # train only the top N decoder layers and the final norm (0: every parameter)


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


@dataclass
class FusionSection:
    """`[fusion]`: train the run's model as the sidekick of a frozen lead (`flywheel.fusion`)."""

    lead: str = ""  # the lead's model spec (scripted-lead, openai:NAME, hf:DIR, ...); required
    lead_base_url: str = ""  # the lead's server, for openai:NAME
    lead_effort: str = ""  # the lead's turn and token budgets come from this level ("": the attempt's)
    max_delegations: int = 4  # per attempt


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


# -------------------------------------------------------------------------------------------- loading


def load_config(path: str | Path, cls: type = RunConfig) -> Any:
    """`cls` filled from the TOML file at `path`; FlywheelError names the first bad key."""
    path = Path(path)
    if not path.is_file():
        raise FlywheelError(f"{path}: config file not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise FlywheelError(f"{path}: not valid TOML: {e}") from None
    return from_dict(cls, data, f"{path}")


def from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    """Build dataclass `cls` from `data`, refusing unknown keys and wrongly typed values."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key not in fields:
            raise FlywheelError(f"{where}: unknown key '{key}' (known: {', '.join(fields)})")
        values[key] = _coerce(
            hints[key],
            value,
            f"{where}: [{key}]" if _section(hints[key]) else f"{where}: '{key}'",
        )
    return cls(**values)


def _section(hint: Any) -> bool:
    """A dataclass, or an optional one."""
    return any(dataclasses.is_dataclass(h) for h in (hint, *typing.get_args(hint)))


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise FlywheelError(f"{where}: expected a table, got {type(value).__name__}")
        return from_dict(hint, value, where)
    origin = typing.get_origin(hint)
    if origin in (list, dict):
        return _coerce_container(origin, typing.get_args(hint), value, where)
    if origin in (typing.Union, types.UnionType) and value is not None:
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        if len(options) == 1:  # an optional section or value: its own errors, by name
            return _coerce(options[0], value, where)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _coerce(option, value, where)
            except FlywheelError:
                continue
        raise FlywheelError(f"{where}: unexpected value {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is type(None) and value is None:
        return None
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise FlywheelError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _coerce_container(origin: type, args: tuple[Any, ...], value: Any, where: str) -> Any:
    if not isinstance(value, origin):
        raise FlywheelError(f"{where}: expected a {'list' if origin is list else 'table'}, got {value!r}")
    if origin is list:
        return [_coerce(args[0], v, where) for v in value]
    return {str(k): _coerce(args[1], v, f"{where}.{k}") for k, v in value.items()}


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data (for run directories and checkpoints)."""
    return dataclasses.asdict(config)
