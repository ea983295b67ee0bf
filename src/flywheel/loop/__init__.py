"""The flywheel across processes: inference pools, a trainer, weight deltas between them, and faults.

Only the trainer needs one tight machine; inference pools anywhere need only the current weights. So the
loop runs a trainer and N pools (processes standing in for regions, or Ray actors on other nodes), and
the only things that travel are work items, trajectory records and weight versions through object
storage (`flywheel.sync`).

    driver (runner.Driver) ──work items──► pool 0..N-1 (pool.Pool: engine + Subscriber)
          ▲    │                              │  prefetch next delta while generating,
          │    └──records (exactly once)◄─────┘  apply between batches (the pause)
          │
     TrainerHost (host): step ─► metrics line ─► checkpoint (local, then peer) ─► publish delta
                                                                            │
                                 WeightStore (file:// or s3://) ◄───────────┘

Modules: `config` (LoopConfig), `dispatch` (work items, leases, exactly-once, staleness; pure state),
`pool` (the engine that follows the store), `checkpoint` (atomic local checkpoints replicated to a peer),
`host` (the trainer side), `runner` (the driver and `run`), `local` / `ray_backend` (processes or actors).

The trainer seam is `LoopTrainer` below: the loop drives any object with these five members, built by the
RL package (`flywheel.rl.trainer.Trainer`) or a test's small fake.

What is covered: a pool killed at any moment (its leased work is reissued; records it finished before
dying are kept; nothing is counted twice; it restarts from the latest anchor plus deltas), a trainer
killed at any moment (it resumes from the newest complete checkpoint, local or the peer's; with the
deterministic schedule the metrics equal an uninterrupted run's), a store that is down for a while
(publishing retries with backoff; pools keep serving the last good weights; checksums guard every apply).
What is not covered: the driver and the trainer are one failure domain in the local backend (a restart
resumes both); the Ray backend survives pool actors dying, not the head node; a store that stays down
longer than the publish retries fails the run (it can be resumed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from flywheel.loop.config import LoopConfig, check_config, config_from_dict
from flywheel.loop.dispatch import Dispatcher, WorkItem, round_items, split_fresh
from flywheel.loop.runner import run


@runtime_checkable
class LoopTrainer(Protocol):
    """What the loop needs from a trainer."""

    version: int  # the version of the current weights; `step` increments it

    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """One RL update from graded trajectory records (as `run_episodes` writes them); returns metrics."""
        ...

    def serving_weights(self) -> dict[str, torch.Tensor]:
        """bf16 copies of the weights to publish (names as in the pools' model state dict)."""
        ...

    def save(self, dir: Path) -> None:
        """Write a complete checkpoint (model, optimizer, RNG, version) into `dir` (not yet existing)."""
        ...

    def load(self, dir: Path) -> None:
        """Restore what `save` wrote."""
        ...


__all__ = [
    "Dispatcher",
    "LoopConfig",
    "LoopTrainer",
    "WorkItem",
    "check_config",
    "config_from_dict",
    "round_items",
    "run",
    "split_fresh",
]
