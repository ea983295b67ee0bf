"""The flywheel's one driver: rounds of work, inference pools, a trainer, weight deltas, and faults.

Every `flywheel train` runs through `run`, whatever the backend (`inline`: one process, the trainer's
engine generating; `local`: pool processes; `ray`: actors; `http`: `flywheel serve --follow` servers, the
episodes run by the driver against them). Only the trainer needs one tight machine;
inference pools anywhere need only the current weights. So the pool backends run a trainer and N pools
(processes standing in for regions, or Ray actors on other nodes), and the only things that travel are
work items, trajectory records and weight versions through object storage (`flywheel.sync`).

    driver (runner.Driver) ──work items──► pool 0..N-1 (pool.Pool: engine + Subscriber)
          ▲    │                              │  prefetch next delta while generating,
          │    └──records (exactly once)◄─────┘  apply between batches (the pause)
          │
     TrainerHost (host): step ─► metrics line ─► checkpoint (local, then peer) ─► publish delta
                                                                            │
                                 WeightStore (file:// or s3://) ◄───────────┘

Modules: `config` (LoopConfig, the backend table), `dispatch` (work items, leases, exactly-once,
staleness; pure state), `pool` (the engine that follows the store), `checkpoint` (atomic local checkpoints
replicated to a peer), `host` (the trainer side), `runner` (the driver, `RunDir`, `Rounds` and `run`),
`inline` / `local` / `ray_backend` / `http` (the `LoopBackend`s).

The seams are in `flywheel.protocols`: the loop drives any `LoopTrainer` (`flywheel.rl.trainer.Trainer`
or a test's small fake) through any `LoopBackend`; the caller's `Rounds` choose each round's work.

What is covered: a pool killed at any moment (its leased work is reissued; records it finished before
dying are kept; nothing is counted twice; it restarts from the latest anchor plus deltas), a trainer
killed at any moment (it resumes from the newest complete checkpoint, local or the peer's; with the
deterministic schedule the metrics equal an uninterrupted run's), a store that is down for a while
(publishing retries with backoff; pools keep serving the last good weights; checksums guard every apply).
What is not covered: the driver and the trainer are one failure domain in the local backend (a restart
resumes both); the Ray backend survives pool actors dying, not the head node; a store that stays down
longer than the publish retries fails the run (it can be resumed).
"""

from flywheel.loop.config import BACKENDS, LoopConfig, check_config
from flywheel.loop.dispatch import Dispatcher, WorkItem, round_items, split_fresh
from flywheel.loop.runner import CycleRounds, Rounds, RunDir, run

__all__ = [
    "BACKENDS",
    "CycleRounds",
    "Dispatcher",
    "LoopConfig",
    "Rounds",
    "RunDir",
    "WorkItem",
    "check_config",
    "round_items",
    "run",
    "split_fresh",
]
