"""`flywheel train`: the flywheel on one machine.

Each step: sample `tasks_per_step` tasks → roll out `group_size` attempts per task at every effort level
with the torch engine through the harness → grade → rewards → advantages → update (`Trainer.step`) → the
engine, which shares the trainer's parameters, generates the next step from the new weights.

The run directory:

    config.json          the resolved config, λ included
    metrics.jsonl        one line per step (reward, success, cost, turns, tokens, loss, entropy, importance
                         weights, KL, grad norm; also per effort level as `medium/success`, ...)
    timings.jsonl        seconds per phase of each step (kept apart so metrics can be byte-identical)
    trajectories.jsonl   every rollout with its step, reward and advantage ("lite": without kept sets)
    checkpoints/step-N/  weights, tokenizer, optimizer (the latest `keep` are kept)

Determinism (`deterministic = true`): task sampling and every sampling seed derive from (seed, step); the
rollout records are ordered by episode id; the reward prices modelled seconds instead of measured ones
(`flywheel.rl.rollout`); torch runs deterministic algorithms. Two runs of one config then write the same
metrics.jsonl and checkpoint files, byte for byte, on the same machine and thread count.

Resume: a run directory with checkpoints continues from the latest complete one; metrics and trajectories
written after it are cut back first, so the continuation is the same as an uninterrupted run.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from flywheel.errors import FlywheelError
from flywheel.rl.config import RunConfig, to_dict
from flywheel.seeding import stable_seed

KEEP_CHECKPOINTS = 2


def model_spec(path: str) -> str:
    """`hf:DIR` for a plain directory; other specs unchanged."""
    if not path:
        raise FlywheelError(
            "[model] path is missing: give hf:DIR, smollm2-135m or a directory from `flywheel sft`"
        )
    if path.startswith("hf:") or path == "smollm2-135m":
        return path
    if not Path(path).is_dir():
        raise FlywheelError(f"[model] path '{path}': no such model directory")
    return f"hf:{path}"


def load_engine(cfg: RunConfig, spec: str = ""):
    """The run's torch engine on `spec` (default: the run's base model) with the `[model]` settings."""
    from flywheel.models.torch_engine import load_torch_model

    return load_torch_model(
        spec or model_spec(cfg.model.path),
        max_context=cfg.model.max_context,
        seed=cfg.seed,
        prefix_cache_mb=cfg.model.prefix_cache_mb,
    )


def resolve_lambdas(cfg: RunConfig) -> dict[str, float]:
    """λ per effort: explicit values, else the calibration file's, else 0."""
    from_file: dict[str, float] = {}
    if cfg.reward.calibration:
        path = Path(cfg.reward.calibration)
        if not path.is_file():
            raise FlywheelError(f"[reward] calibration '{path}': file not found (run `flywheel calibrate`)")
        from_file = json.loads(path.read_text()).get("lambdas", {})
    return {e: float(cfg.reward.lambdas.get(e, from_file.get(e, 0.0))) for e in cfg.rollout.efforts}


def check(cfg: RunConfig) -> None:
    """Refuse settings that cannot run, naming the key."""
    from flywheel.harness.effort import EFFORTS

    for e in cfg.rollout.efforts:
        if e not in EFFORTS:
            raise FlywheelError(f"[rollout] efforts: unknown effort '{e}' (choose from {', '.join(EFFORTS)})")
    if not cfg.rollout.temperature > 0:
        raise FlywheelError("[rollout] temperature must be > 0 (the replayed distribution needs one)")
    if not 0 < cfg.rollout.top_p <= 1:
        raise FlywheelError("[rollout] top_p must be in (0, 1]")
    if cfg.objective.baseline not in ("length_weighted", "mean"):
        raise FlywheelError("[objective] baseline must be 'length_weighted' or 'mean'")
    if cfg.optim.kind not in ("muon", "adamw"):
        raise FlywheelError("[optim] kind must be 'muon' or 'adamw'")
    for key in ("tasks_per_step", "group_size", "concurrency", "cohorts"):
        if getattr(cfg.rollout, key) < 1:
            raise FlywheelError(f"[rollout] {key} must be >= 1")
    if cfg.objective.pack_tokens < 1 or cfg.objective.batch_tokens < 1:
        raise FlywheelError("[objective] pack_tokens and batch_tokens must be >= 1")
    if cfg.train.update_threads < 0:
        raise FlywheelError("[train] update_threads must be >= 0 (0: as `threads`)")
    if cfg.train.steps < 0 or cfg.train.checkpoint_every < 1:
        raise FlywheelError("[train] steps must be >= 0 and checkpoint_every >= 1")
    if not 0 <= cfg.tasks.rename <= 1:
        raise FlywheelError("[tasks] rename must be a share between 0 and 1")
    if cfg.train.trajectories not in ("lite", "full", "none"):
        raise FlywheelError("[train] trajectories must be 'lite', 'full' or 'none'")
    r = cfg.reward
    if r.length_penalty < 0 or r.length_phase < 0:
        raise FlywheelError("[reward] length_penalty and length_phase must be >= 0")
    if r.length_scope not in ("all", "solved"):
        raise FlywheelError("[reward] length_scope must be 'all' or 'solved'")
    for e, turns in r.length_budget.items():
        if e not in cfg.rollout.efforts:
            raise FlywheelError(f"[reward] length_budget: effort '{e}' is not in [rollout] efforts")
        if turns < 1:
            raise FlywheelError(f"[reward] length_budget.{e} must be >= 1 turn")


def setup_torch(cfg: RunConfig) -> None:
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)


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


def load_tasks(cfg: RunConfig, split: str | None = None, limit: int | None = None):
    from flywheel.tasks import load_suite

    tasks = load_suite(cfg.tasks.suite, split=split or cfg.tasks.split)
    n = cfg.tasks.limit if limit is None else limit
    return tasks[:n] if n else tasks


def load_heldout(cfg: RunConfig):
    """The evaluation tasks: `eval_split` of `eval_suite` (of `suite` when that is unset)."""
    from flywheel.tasks import load_suite

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
    from flywheel.rl.rename import rename_task

    rng = random.Random(stable_seed(cfg.seed, "rename", step))
    return [
        rename_task(t, root / f"{t.id}.s{step:06d}", rng) if rng.random() < cfg.tasks.rename else t
        for t in batch
    ]


def curated(tasks: list, history: list[dict[str, Any]], cfg: RunConfig, step: int) -> list:
    """The tasks eligible at `step`: all, or those curation keeps after the last re-curation point.

    Pass rates come from the run's own rollouts (`history`: task_id, success, policy_version, step) up to
    that point, over the last `recurate_window` policy versions; if curation would leave nothing, all stay.
    """
    every = cfg.tasks.recurate_every
    if not every or step <= every:
        return tasks
    from flywheel.tasks.curate import pass_rates, select

    point = (step - 1) // every * every
    seen = [h for h in history if h["step"] <= point]
    rates = pass_rates(seen, min_policy_version=point - cfg.tasks.recurate_window)
    keep = set(select(rates, cfg.tasks.p_max, task_ids=[t.id for t in tasks]))
    return [t for t in tasks if t.id in keep] or tasks


def harness_config(cfg: RunConfig, version: int):
    from flywheel.harness import HarnessConfig

    r = cfg.rollout
    return HarnessConfig(
        action_format="tagged",
        temperature=r.temperature,
        top_p=r.top_p,
        observation_chars=r.observation_chars,
        policy_version=version,
        cohorts=r.cohorts,
    )


# ------------------------------------------------------------------------------------------ the run


class Run:
    """A training run directory: config, metrics, trajectories, checkpoints."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.ckpt_dir = self.out / "checkpoints"

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        done = [
            (int(p.name.split("-")[1]), p)
            for p in self.ckpt_dir.glob("step-*")
            if (p / "trainer.json").is_file()
        ]
        return max(done) if done else None

    def cut_back(self, step: int) -> None:
        """Drop metrics and trajectories of steps after `step` (written after the last checkpoint)."""
        for name in ("metrics.jsonl", "trajectories.jsonl", "timings.jsonl"):
            path = self.out / name
            if not path.exists():
                continue
            keep = []
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= step:
                        keep.append(line)
                except (json.JSONDecodeError, KeyError):
                    break  # a torn last line
            path.write_text("".join(f"{ln}\n" for ln in keep))

    def history(self) -> list[dict[str, Any]]:
        """(task_id, success, policy_version, step) of every rollout so far, for re-curation."""
        path = self.out / "trajectories.jsonl"
        if not path.exists():
            return []
        return [history_row(r, r["step"]) for r in map(json.loads, path.read_text().splitlines())]

    def step_seconds(self) -> list[float]:
        """The wall seconds of each step so far (rollouts, update, checkpoint), for a budget kept across resumes."""
        path = self.out / "timings.jsonl"
        if not path.exists():
            return []
        return [
            t["rollout_s"] + t["update_s"] + t["checkpoint_s"]
            for t in map(json.loads, path.read_text().splitlines())
        ]

    def seconds_spent(self) -> float:
        return sum(self.step_seconds())

    def append(self, name: str, rows: list[dict[str, Any]]) -> None:
        with (self.out / name).open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def checkpoint(self, trainer, step: int) -> None:
        trainer.save(self.ckpt_dir / f"step-{step:06d}")
        done = sorted(self.ckpt_dir.glob("step-*"))
        for old in done[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)


def history_row(record: dict[str, Any], step: int) -> dict[str, Any]:
    """What re-curation needs of a rollout; a renamed copy counts toward its original task."""
    return {
        "task_id": record.get("renamed_from", record["task_id"]),
        "success": record["success"],
        "policy_version": record["policy_version"],
        "step": step,
    }


def lite(record: dict[str, Any]) -> dict[str, Any]:
    """A record without the per-token replay data (kept sets, prompt ids): for logs, not for training."""
    turns = [
        {k: v for k, v in t.items() if k not in ("kept", "prompt_ids", "logprobs")} for t in record["turns"]
    ]
    return {**record, "turns": turns}


def rounded(metrics: dict[str, float], step: int, version: int) -> dict[str, Any]:
    return {
        "step": step,
        "policy_version": version,
        **{k: round(float(v), 6) for k, v in sorted(metrics.items())},
    }


def make_trainer(cfg: RunConfig):
    """A fresh `Trainer` on the run's base model (a factory the distributed backends call where they run)."""
    from flywheel.rl.trainer import Trainer

    setup_torch(cfg)
    engine = load_engine(cfg)
    return Trainer(engine.model, engine.tokenizer, cfg, resolve_lambdas(cfg))


def loop_config(cfg: RunConfig):
    """The distributed loop's config: the run's settings, then the `[loop]` table's own keys."""
    from flywheel.loop.config import config_from_dict
    from flywheel.rl.rollout import budget_overrides

    r, h = cfg.rollout, harness_config(cfg, 0)  # the pools run episodes as the inline loop does
    base = {
        "model": model_spec(cfg.model.path),
        "steps": cfg.train.steps,
        "efforts": list(r.efforts),
        "samples": r.group_size,
        "groups_per_step": r.tasks_per_step * len(r.efforts),
        "temperature": r.temperature,
        "top_p": r.top_p,
        "seed": cfg.seed,
        "deterministic": cfg.deterministic,
        "max_context": cfg.model.max_context,
        "budgets": {e: budget_overrides(e, r.max_turns, r.max_tokens, cfg.deterministic) for e in r.efforts},
        "observation_chars": h.observation_chars,
        "action_format": h.action_format,
        "cohorts": h.cohorts,
    }
    return config_from_dict({**base, **cfg.loop})


def train(cfg: RunConfig, out: Path, *, on_step=None) -> list[dict[str, Any]]:
    """Run (or resume) training into `out`; returns the metrics of the steps run now.

    With `[loop] backend = "local"` or `"ray"` the trainer and separate inference pools run through
    `flywheel.loop` (weights shipped as deltas through the store); otherwise everything runs in this process.
    """
    if cfg.loop.get("backend", "inline") != "inline":
        from functools import partial

        from flywheel.loop import run as run_loop

        check(cfg)
        for key, value in (
            ("[tasks] rename", cfg.tasks.rename),
            ("[tasks] recurate_every", cfg.tasks.recurate_every),
            ("[train] max_minutes", cfg.train.max_minutes),
        ):
            if value:
                raise FlywheelError(f"{key} works with the inline loop only (no [loop] backend) for now")
        lcfg = loop_config(cfg)
        run_loop(lcfg, partial(make_trainer, cfg), load_tasks(cfg), out)
        path = Path(out) / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    from flywheel.progress import progress
    from flywheel.rl.rollout import efforts_for, make_specs, rollout
    from flywheel.rl.trainer import Trainer

    check(cfg)
    spec = model_spec(cfg.model.path)
    lambdas = resolve_lambdas(cfg)
    tasks = load_tasks(cfg)
    if not tasks:
        raise FlywheelError(f"[tasks] suite '{cfg.tasks.suite}' split '{cfg.tasks.split}' has no tasks")
    setup_torch(cfg)
    run = Run(out)
    run.out.mkdir(parents=True, exist_ok=True)
    engine = load_engine(cfg, spec)
    trainer = Trainer(engine.model, engine.tokenizer, cfg, lambdas)
    start = 0
    latest = run.latest_checkpoint()
    if latest:
        start, path = latest
        trainer.load(path)
    run.cut_back(start)
    history = run.history()
    (run.out / "config.json").write_text(json.dumps({**to_dict(cfg), "lambdas": lambdas}, indent=1) + "\n")
    efforts = efforts_for(
        cfg.rollout.efforts, cfg.rollout.max_turns, cfg.rollout.max_tokens, cfg.deterministic
    )
    rows = []
    durations = run.step_seconds()  # a resumed run has spent part of the budget already

    def fits() -> bool:  # a step starts only if one as long as the longest so far ends within the budget
        return (
            cfg.train.max_minutes <= 0
            or sum(durations) + max(durations, default=0.0) <= 60 * cfg.train.max_minutes
        )

    with progress("train", cfg.train.steps) as advance:
        advance(start)
        out_of_time = not fits()  # a resumed run may have spent its budget already
        for step in range(start + 1, cfg.train.steps + 1):
            if out_of_time:
                break
            t0 = time.perf_counter()
            pool = curated(tasks, history, cfg, step)
            batch = renamed_batch(batch_for(pool, cfg, step), cfg, step, run.out / "tasks")
            specs = make_specs(
                batch, efforts, cfg.rollout.group_size, seed=stable_seed(cfg.seed, "rollout", step) % 2**31
            )
            counts = (
                f"{i}/{len(specs)}" for i in range(1, len(specs) + 1)
            )  # a step's rollouts can take minutes
            records = rollout(
                engine,
                specs,
                harness_config(cfg, trainer.version),
                concurrency=cfg.rollout.concurrency,
                on_record=lambda r, c=counts, s=step: advance(0, step=s, rollouts=next(c)),
            )
            origin = {t.id: t.meta["renamed_from"] for t in batch if "renamed_from" in t.meta}
            for r in records:
                if r["task_id"] in origin:
                    r["renamed_from"] = origin[r["task_id"]]
            t1 = time.perf_counter()
            with torch_threads(cfg.train.update_threads):
                scores = trainer.scores(records, step)
                metrics = trainer.step(records, scores)
            metrics["eligible_tasks"] = float(len(pool))
            history += [history_row(r, step) for r in records]
            t2 = time.perf_counter()
            row = rounded(metrics, step, trainer.version)
            run.append("metrics.jsonl", [row])
            if cfg.train.trajectories != "none":
                keep = (lambda r: r) if cfg.train.trajectories == "full" else lite
                run.append(
                    "trajectories.jsonl",
                    [{**keep(r), "step": step, "rl": s} for r, s in zip(records, scores, strict=True)],
                )
            durations.append(time.perf_counter() - t0)
            out_of_time = not fits()  # the next step would end past the budget: checkpoint this one and stop
            if step % cfg.train.checkpoint_every == 0 or step == cfg.train.steps or out_of_time:
                run.checkpoint(trainer, step)
            run.append(
                "timings.jsonl",
                [
                    {
                        "step": step,
                        "rollout_s": round(t1 - t0, 2),
                        "update_s": round(t2 - t1, 2),
                        "checkpoint_s": round(time.perf_counter() - t2, 2),
                    }
                ],
            )
            rows.append(row)
            advance(1, reward=row["reward"], success=row["success"])
            if on_step:
                on_step(row)
    return rows
