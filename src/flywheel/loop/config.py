"""`LoopConfig`: how a training run is driven (backend, pools, schedule, staleness, stores) and what it runs.

A run config's `[loop]` table fills the fields above `model`; it may not set the run-level fields below
it, which `flywheel train` fills from the rest of the run config (`flywheel.rl.train.loop_config`) and
which are marked `RUN` (the TOML loader refuses them in `[loop]`). Tests and other callers of
`flywheel.loop.run` may fill every field directly.

The harness settings travel whole: `harness` is the `HarnessConfig` every episode runs under (the pools set
only its `policy_version`), and `efforts` maps each effort level's name to its `Effort` with the run's
budgets, so an episode gets its budgets from one map. Each value is checked once, by the type that owns it:
`HarnessConfig` and `get_effort` check theirs, `LoopConfig` the loop's (`check_config`, run as the config is
built). The pools' grader and episode runner travel as values (a function, or a `functools.partial` of one,
pickled by reference to the pool processes and actors), never as names.

Backends, by name (imported only when chosen, so Ray loads only for `ray`):
- `inline`: one process; the trainer's own engine generates (it shares the trainer's parameters, so no
  weights travel); synchronous by construction. The default.
- `local`: the trainer in the driver process, each inference pool its own process following the
  weight store through deltas.
- `ray`: the trainer host and the pools as Ray actors.
- `http`: the trainer in the driver process; the pools are `flywheel serve --follow STORE` servers
  anywhere, named by URL (`pool_urls`), following the weight store `store`; episodes run in the driver
  (`flywheel.loop.http`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.harness import Effort, HarnessConfig, get_effort
from flywheel.protocols import Grader
from flywheel.registry import choose

# name -> "module:class"; each backend takes (host_args, trainer, cfg)
BACKENDS = {
    "inline": "flywheel.loop.inline:InlineBackend",
    "local": "flywheel.loop.local:LocalBackend",
    "ray": "flywheel.loop.ray_backend:RayBackend",
    "http": "flywheel.loop.http:HttpBackend",
}
TRAJECTORIES = ("full", "lite", "none")
RUN = {"run": True}  # a field's metadata: set from the rest of the run config, not in `[loop]`


def run_field(default: Any = None, factory: Callable[[], Any] | None = None) -> Any:
    """A run-level field (see the module docstring)."""
    if factory is not None:
        return field(default_factory=factory, metadata=RUN)
    return field(default=default, metadata=RUN)


def default_efforts() -> dict[str, Effort]:
    return {"medium": get_effort("medium")}


@dataclass
class LoopConfig:
    """One run of the loop; every field has a working default except `model`."""

    # -- the [loop] table of a run config
    backend: str = "inline"  # "inline" (one process), "local" (pool processes), "ray" (actors) or "http"
    pools: int = 2  # inference pools (each its own process / actor, engine and weight subscriber)
    pool_urls: list[str] = field(
        default_factory=list
    )  # http: the servers' base URLs (…/v1); pools = their count
    # http: the key the servers were started with (flywheel serve --api-key); "": $FLYWHEEL_API_KEY, else none
    pool_api_key: str = field(default="", repr=False)
    pool_batch: int = 4  # work items a pool runs together (its run_episodes concurrency)
    max_staleness: int = 1  # k: a record generated at version v is used at trainer version <= v + k
    sync: bool = False  # synchronous schedule: round r is generated at exactly version r (forces k = 0)
    store: str = ""  # weight store URL (file:// or s3://); default: OUT_DIR/weights
    peer: str = ""  # checkpoint replica URL (file:// or s3://); default: OUT_DIR/peer ("none": no replica)
    store_options: dict[str, Any] = field(default_factory=dict)  # endpoint_url, key, secret, region (s3)
    anchor_every: int = 10  # a full anchor every N published versions
    publish_attempts: int = 30  # store retries (exponential backoff up to 5 s) before publishing fails
    catch_up_wait_s: float = 30.0  # longest a pool below an item's version waits for it (sync: no limit)
    lease_s: float = 600.0  # work not returned within this is reissued to another pool
    max_restarts: int = 3  # restarts of one pool before the run fails
    keep_checkpoints: int = 2  # local checkpoints kept
    torch_threads: int = 1  # per pool process
    ray_address: str | None = None  # ray.init address ("auto" to join a running cluster); None: local
    ray_pool_options: dict[str, Any] = field(default_factory=dict)  # .options() of pool actors
    ray_trainer_options: dict[str, Any] = field(default_factory=dict)  # .options() of the trainer actor
    # -- run-level: filled from the run config by `flywheel train`
    model: str = run_field("")  # the pools' engine: hf:PATH or smollm2-135m; weights come from the store
    steps: int = run_field(10)  # trainer versions to reach (a resumed run counts from its checkpoint)
    groups_per_step: int = run_field(2)  # (task, effort) groups in one round; a round feeds one step
    samples: int = run_field(2)  # samples per group (the group the trainer's baseline compares within)
    efforts: dict[str, Effort] = run_field(factory=default_efforts)  # cycled over the groups, with budgets
    harness: HarnessConfig = run_field(factory=HarnessConfig)  # every episode's harness settings
    concurrency: int = run_field(0)  # episodes an inline batch steps together (0: the whole round)
    deterministic: bool = run_field(False)  # sync schedule, one item per pool batch: equal metrics on rerun
    seed: int = run_field(0)  # seeds of the work items (episode seeds derive from the trajectory ids)
    infra_retries: int = run_field(1)  # retries of an attempt the infrastructure ended (`dispatch.RETRIED`)
    max_context: int | None = run_field(None)  # engine context limit (None: the model's)
    max_minutes: float = run_field(0.0)  # wall-time budget: no step starts that would end past it (0: none)
    checkpoint_every: int = run_field(1)  # checkpoint every N versions (and the last); > 1 only inline
    trajectories: str = run_field(
        "full"
    )  # RUN_DIR/trajectories.jsonl: "full", "lite" (no replay data), "none"
    grader: Grader | None = run_field(None)  # grades each episode; None: the shared verifier
    # runs a pool batch's episodes, with `flywheel.eval.run.rollout`'s signature (None: the harness's
    # `run_episodes`); Fusion: `functools.partial(flywheel.fusion.sidekick_rollout, lead=...)`
    episodes: Callable[..., Any] | None = run_field(None)

    def __post_init__(self) -> None:
        if self.backend == "http" and self.pool_urls:
            self.pools = len(self.pool_urls)
        if self.deterministic:
            self.sync = True
            if self.backend != "inline":
                self.pool_batch = 1
        if self.sync or self.backend == "inline":
            self.sync, self.max_staleness = True, 0
        check_config(self)

    @property
    def staleness(self) -> int:
        return self.max_staleness


# the fields `flywheel train` fills from the rest of the run config
RUN_FIELDS = tuple(f.name for f in fields(LoopConfig) if f.metadata.get("run"))


def check_config(cfg: LoopConfig) -> None:
    """Refuse a bad configuration with one clear line (the model, known only once the run is assembled, is
    checked by `flywheel.loop.run`)."""
    if cfg.backend not in BACKENDS:
        raise FlywheelError(f"unknown loop backend '{cfg.backend}' (choose from {', '.join(BACKENDS)})")
    if cfg.backend == "http":
        check_http(cfg)
    if cfg.steps < 0:
        raise FlywheelError(f"loop: `steps` must be >= 0, got {cfg.steps}")
    positive = (
        "pools",
        "pool_batch",
        "groups_per_step",
        "samples",
        "anchor_every",
        "publish_attempts",
        "checkpoint_every",
    )
    for name in positive:
        if int(getattr(cfg, name)) < 1:
            raise FlywheelError(f"loop: `{name}` must be at least 1, got {getattr(cfg, name)}")
    if cfg.infra_retries < 0:
        raise FlywheelError(f"loop: `infra_retries` must be >= 0, got {cfg.infra_retries}")
    if cfg.max_staleness < 0:
        raise FlywheelError(f"loop: `max_staleness` must be >= 0, got {cfg.max_staleness}")
    if not cfg.efforts:
        raise FlywheelError("loop: `efforts` must name at least one effort level")
    if cfg.trajectories not in TRAJECTORIES:
        raise FlywheelError(f"loop: `trajectories` must be one of {', '.join(TRAJECTORIES)}")
    if cfg.checkpoint_every > 1 and cfg.backend != "inline":
        raise FlywheelError(
            f"checkpoint_every = {cfg.checkpoint_every} needs the inline backend: pools follow the published "
            "weights, so every version they serve must be checkpointed first"
        )


def check_http(cfg: LoopConfig) -> None:
    """The `http` backend needs the servers' URLs and the store they follow (whether each URL answers is
    checked when the backend starts)."""
    if not cfg.pool_urls:
        raise FlywheelError('loop: backend "http" needs `pool_urls`, e.g. ["http://127.0.0.1:8000/v1"]')
    bad = [u for u in cfg.pool_urls if not isinstance(u, str) or not u.startswith(("http://", "https://"))]
    if bad:
        raise FlywheelError(f"loop: `pool_urls` must be http:// or https:// URLs, got {bad[0]!r}")
    if len(set(cfg.pool_urls)) != len(cfg.pool_urls):
        raise FlywheelError("loop: `pool_urls` names a server twice")
    if not cfg.store:
        raise FlywheelError(
            'loop: backend "http" needs `store`, the weight store its servers follow (flywheel serve --follow STORE)'
        )


def backend_class(name: str) -> type:
    """The backend class registered as `name`, imported now."""
    return choose(BACKENDS, name, "loop backend")
