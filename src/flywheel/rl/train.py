"""`flywheel train`: a run config in, the flywheel turning through `flywheel.loop`.

Each step: sample `tasks_per_step` tasks (from those re-curation keeps, some renamed) → roll out
`group_size` attempts per task at every effort level → grade → rewards → advantages → update
(`Trainer.step`) → the next step generates from the new weights. This module says *what* each step
trains on (`TrainRounds`) and builds the trainer; `flywheel.loop.run` drives the steps the same way
under every backend: `[loop] backend = "inline"` (the default: one process, the trainer's engine
generates, sharing its parameters), `"local"` or `"ray"` (inference pools following weight deltas).

The run directory (`flywheel.loop.RunDir`):

    config.json          the resolved config, λ included
    metrics.jsonl        one line per step (reward, success, cost, turns, tokens, loss, entropy, importance
                         weights, KL, grad norm; also per effort level as `medium/success`, ...; loop counters)
    timings.jsonl        seconds of each step (kept apart so metrics can be byte-identical)
    trajectories.jsonl   every rollout with its step and its score `rl` (reward, advantage, ...);
                         "lite" by default: without the per-token replay data
    checkpoints/vN/      weights, tokenizer, optimizer, the loop's state (the latest `keep` are kept)
    tensorboard/         metrics.jsonl's scalars as TensorBoard events, with `[train] tensorboard = true`

Determinism (`deterministic = true`): task sampling and every sampling seed derive from (seed, step); the
reward prices modelled seconds instead of measured ones (`flywheel.rubric`); torch runs deterministic
algorithms. Two runs of one config then write the same metrics.jsonl and checkpoint files, byte for byte,
on the same machine and thread count. A deterministic Fusion run's engine keeps no prefix cache: its
delegations run one at a time in the order the concurrent leads reach them, and a prompt prefilled whole or
from an earlier delegation's cached keys gives log-probs that differ in the last bits.

Fusion (`[fusion] lead = SPEC`): every attempt is a frozen lead's, delegating to the run's model as its
sidekick (`flywheel.fusion.sidekick_rollout`, run by every backend's pools); the trainer trains only the
sidekick's turns, and the reward charges the whole pair's cost, the lead's included, so the sidekick
learns to need less of its lead.

Resume: a run directory with checkpoints continues from the latest complete one; metrics and trajectories
written after it are cut back first, so the continuation is the same as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import random
from functools import partial
from pathlib import Path
from typing import Any

import torch

from flywheel import rubric
from flywheel.errors import FlywheelError
from flywheel.fusion import sidekick_rollout
from flywheel.harness import Effort, HarnessConfig, efforts_for
from flywheel.loop import RunDir, WorkItem
from flywheel.loop import run as run_loop
from flywheel.loop.config import LoopConfig
from flywheel.loop.dispatch import item_id
from flywheel.progress import progress
from flywheel.record import Trajectory
from flywheel.rl.config import RunConfig, to_dict
from flywheel.rl.trainer import Trainer
from flywheel.seeding import stable_seed
from flywheel.sft.rename import rename_task
from flywheel.tasks import Task, load_suite
from flywheel.tasks.curate import pass_rates, select


def model_spec(path: str) -> str:
    """`hf:DIR` for a plain directory or a shipped base (`toybugs-sweep`); other specs unchanged."""
    from flywheel.models.shipped import BASES, base_dir

    if not path:
        raise FlywheelError(
            "[model] path is missing: give hf:DIR, smollm2-135m, toybugs-sweep or a directory from `flywheel sft`"
        )
    if path in BASES:
        return f"hf:{base_dir(path)}"
    if path.startswith("hf:") or path == "smollm2-135m":
        return path
    if not Path(path).is_dir():
        raise FlywheelError(f"[model] path '{path}': no such model directory")
    return f"hf:{path}"


def load_engine(cfg: RunConfig, spec: str = ""):
    """The run's torch engine on `spec` (default: the run's base model) with the `[model]` settings: device,
    dtype, context, draft (no prefix cache for a deterministic Fusion run: see the module docstring)."""
    from flywheel.models.torch_engine import load_torch_model

    return load_torch_model(
        spec or model_spec(cfg.model.path),
        device=cfg.model.device,
        dtype=cfg.model.dtype,
        max_context=cfg.model.max_context,
        seed=cfg.seed,
        prefix_cache_mb=0 if cfg.fusion and cfg.deterministic else cfg.model.prefix_cache_mb,
        draft=cfg.model.draft or None,
        draft_tokens=cfg.model.draft_tokens,
        pack=cfg.model.pack,
    )


def resolve_lambdas(cfg: RunConfig) -> dict[str, float]:
    """λ per effort (`flywheel.rubric.resolve_lambdas`): `[reward] lambdas`, else its calibration file's."""
    return rubric.resolve_lambdas(cfg.rollout.efforts, cfg.reward.lambdas, cfg.reward.calibration)


def fusion_options(cfg: RunConfig) -> dict[str, Any]:
    """`flywheel.fusion.sidekick_rollout`'s keywords from `[fusion]` (empty without one)."""
    f = cfg.fusion
    if f is None:
        return {}
    return {
        "lead": f.lead,
        "lead_base_url": f.lead_base_url,
        "lead_effort": f.lead_effort,
        "max_delegations": f.max_delegations,
    }


def setup_torch(cfg: RunConfig) -> None:
    """Threads, the seed and, for deterministic runs, deterministic algorithms."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)


def load_tasks(cfg: RunConfig, split: str | None = None, limit: int | None = None) -> list[Task]:
    tasks = load_suite(cfg.tasks.suite, split=split or cfg.tasks.split)
    n = cfg.tasks.limit if limit is None else limit
    return tasks[:n] if n else tasks


def load_heldout(cfg: RunConfig) -> list[Task]:
    """The evaluation tasks: `eval_split` of `eval_suite` (of `suite` when that is unset)."""
    return load_suite(cfg.tasks.eval_suite or cfg.tasks.suite, split=cfg.tasks.eval_split)


def batch_for(tasks: list, cfg: RunConfig, step: int) -> list:
    """The step's tasks: a seeded sample, the same in every run and on resume."""
    rng = random.Random(stable_seed(cfg.seed, "tasks", step))
    return rng.sample(tasks, min(cfg.rollout.tasks_per_step, len(tasks)))


def renamed_batch(batch: list, cfg: RunConfig, step: int, root: Path) -> list:
    """The step's tasks with a `[tasks] rename` share replaced by renamed copies under `root`, drawn from
    the seed (the same on resume)."""
    if not cfg.tasks.rename:
        return batch
    rng = random.Random(stable_seed(cfg.seed, "rename", step))
    return [
        rename_task(t, root / f"{t.id}.s{step:06d}", rng) if rng.random() < cfg.tasks.rename else t
        for t in batch
    ]


def curated(tasks: list, history: list[Trajectory], cfg: RunConfig, step: int) -> list:
    """The tasks eligible at `step`: all, or those curation keeps after the last re-curation point.

    Pass rates come from the run's own rollouts (`history`, as `history_row` keeps them) up to that point,
    over the last `recurate_window` policy versions; if curation would leave nothing, all stay.
    """
    every = cfg.tasks.recurate_every
    if not every or step <= every:
        return tasks
    point = (step - 1) // every * every
    seen = [h for h in history if (h.step or 0) <= point]
    rates = pass_rates(seen, min_policy_version=point - cfg.tasks.recurate_window)
    keep = set(select(rates, cfg.tasks.p_max, task_ids=[t.id for t in tasks]))
    return [t for t in tasks if t.id in keep] or tasks


def harness_config(cfg: RunConfig, version: int = 0) -> HarnessConfig:
    """The harness every backend runs the run's episodes under (at policy `version`); it checks its own
    settings (a bad one names `[rollout]`)."""
    r = cfg.rollout
    try:
        return HarnessConfig(
            action_format="tagged",
            temperature=r.temperature,
            top_p=r.top_p,
            observation_chars=r.observation_chars,
            policy_version=version,
            cohorts=r.cohorts,
            compaction=r.compaction,
            compact_at=r.compact_at,
            warm_pytest=r.warm_pytest,
        )
    except FlywheelError as e:
        raise FlywheelError(f"[rollout] {str(e).removeprefix('harness ')}") from None


def run_efforts(cfg: RunConfig) -> dict[str, Effort]:
    """Each effort level of the run with its `[rollout]` budgets (deterministic: no budget that depends on
    measured seconds), by name."""
    r = cfg.rollout
    return {e.name: e for e in efforts_for(r.efforts, r.max_turns, r.max_tokens, cfg.deterministic)}


def history_row(record: Trajectory, step: int) -> Trajectory:
    """What re-curation needs of a rollout (its task, success, policy version and step; the turns are
    dropped); a renamed copy counts toward its original task."""
    return dataclasses.replace(record, task_id=record.renamed_from or record.task_id, turns=[], step=step)


class TrainRounds:
    """What each step trains on: the tasks re-curation keeps, a seeded sample of them, a share renamed,
    every effort level, `group_size` attempts each (`flywheel.loop.Rounds`)."""

    def __init__(self, cfg: RunConfig, tasks: list[Task], run: RunDir) -> None:
        self.cfg, self.tasks, self.run = cfg, tasks, run
        self.history: list[Trajectory] | None = None  # read once the driver has cut back the files
        self.eligible: dict[int, int] = {}
        self.origin: dict[str, str] = {}  # renamed task id -> the original's

    def items(self, round_no: int, min_version: int) -> list[WorkItem]:
        cfg, step = self.cfg, round_no + 1
        if self.history is None:
            self.history = [history_row(r, r.step or 0) for r in self.run.records()]
        pool = curated(self.tasks, self.history, cfg, step)
        self.eligible[round_no] = len(pool)
        batch = renamed_batch(batch_for(pool, cfg, step), cfg, step, self.run.out / "tasks")
        self.origin.update({t.id: t.meta["renamed_from"] for t in batch if "renamed_from" in t.meta})
        seed = stable_seed(cfg.seed, "rollout", step) % 2**31
        return [
            WorkItem(item_id(t.id, e, seed, i), t, e, seed, i, round_no, min_version)
            for t in batch
            for e in cfg.rollout.efforts
            for i in range(cfg.rollout.group_size)
        ]

    def used(self, round_no: int, records: list[Trajectory]) -> dict[str, float]:
        for r in records:
            r.renamed_from = self.origin.get(r.task_id)
        self.history = (self.history or []) + [history_row(r, round_no + 1) for r in records]
        return {"eligible_tasks": float(self.eligible.pop(round_no, len(self.tasks)))}


def make_trainer(cfg: RunConfig) -> Trainer:
    """A fresh `Trainer` on the run's base model, with its engine (a factory the backends call where the
    trainer runs). In float32 the two share one model; with `[model] dtype = "bfloat16"` the trainer gets
    float32 master weights loaded from the same directory and the engine a bfloat16 copy it keeps in sync."""
    from flywheel.models.hf import load_hf
    from flywheel.models.loading import torch_model_dir

    setup_torch(cfg)
    engine = load_engine(cfg)
    model = engine.model
    if model.dtype != torch.float32:
        path = torch_model_dir(model_spec(cfg.model.path))
        model, _ = load_hf(path, dtype=torch.float32, device=model.device)
    return Trainer(model, engine.tokenizer, cfg, resolve_lambdas(cfg), engine=engine)


def loop_config(cfg: RunConfig, spec: str = "") -> LoopConfig:
    """The loop's config: the `[loop]` table, with its run-level fields from the rest of the run config
    (`spec`: the model spec, default the run's `[model] path`, resolved after the loop has checked its
    settings)."""
    r = cfg.rollout
    loop = dataclasses.replace(
        cfg.loop,
        steps=cfg.train.steps,
        efforts=run_efforts(cfg),
        harness=harness_config(cfg),
        samples=r.group_size,
        groups_per_step=r.tasks_per_step * len(r.efforts),
        concurrency=r.concurrency,
        deterministic=cfg.deterministic,
        seed=cfg.seed,
        infra_retries=r.infra_retries,
        max_context=cfg.model.max_context,
        max_minutes=cfg.train.max_minutes,
        checkpoint_every=cfg.train.checkpoint_every,
        trajectories=cfg.train.trajectories,
        episodes=partial(sidekick_rollout, **fusion_options(cfg)) if cfg.fusion else None,
    )
    loop.model = spec or model_spec(cfg.model.path)
    return loop


class ScalarEvents:
    """metrics.jsonl's scalars as TensorBoard event files in `RUN_DIR/tensorboard/` (`[train] tensorboard`),
    one value per metric and step, the step as the global step. The writer opens at the first step this
    process runs and purges the events of that step on: those of a resumed run's abandoned steps."""

    def __init__(self, out: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise FlywheelError(
                "[train] tensorboard = true needs the tensorboard package: pip install tensorboard "
                "(or this package's [tensorboard] extra)"
            ) from None
        self.make, self.dir, self.writer = SummaryWriter, out / "tensorboard", None

    def write(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        if self.writer is None:
            self.writer = self.make(log_dir=str(self.dir), purge_step=step)
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def train(cfg: RunConfig, out: Path, *, on_step=None) -> list[dict[str, Any]]:
    """Run (or resume) training into `out`; returns the metrics of the steps run now."""
    events = ScalarEvents(Path(out)) if cfg.train.tensorboard else None  # a missing package fails first
    lcfg = loop_config(cfg)
    lambdas = resolve_lambdas(cfg)
    tasks = load_tasks(cfg)
    if not tasks:
        raise FlywheelError(f"[tasks] suite '{cfg.tasks.suite}' split '{cfg.tasks.split}' has no tasks")
    run = RunDir(out)
    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / "config.json").write_text(json.dumps({**to_dict(cfg), "lambdas": lambdas}, indent=1) + "\n")
    setup_torch(cfg)
    trainer = partial(make_trainer, cfg)  # built where the trainer runs (a Ray actor's node)
    rows: list[dict[str, Any]] = []
    with progress("train", cfg.train.steps) as advance:

        def on_event(event: dict[str, Any]) -> None:
            if event["event"] == "resumed":
                advance(event["version"])
            elif event["event"] == "record":
                advance(0, step=event["round"] + 1, rollouts=f"{event['done']}/{event['total']}")
            elif event["event"] == "step":
                row = event["metrics"]
                rows.append(row)
                advance(1, **{k: row[k] for k in ("reward", "success") if k in row})  # none: all infra
                if events:
                    events.write(row)
                if on_step:
                    on_step(row)

        try:
            run_loop(lcfg, trainer, tasks, run.out, rounds=TrainRounds(cfg, tasks, run), on_event=on_event)
        finally:
            if events:
                events.close()
    return rows
