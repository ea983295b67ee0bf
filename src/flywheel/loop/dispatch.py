"""Work items, rounds and the dispatcher: who generates what, and exactly-once collection.

A round is the work one trainer step consumes: `groups_per_step` (task, effort) groups of `samples`
items each. An item's trajectory id is the harness's episode id (`task/effort/s<seed>/<index>`), so the
record a pool returns names the item it answers. Each group gets its own seed, derived from the run's seed
and the group's position in the stream, so ids never repeat within a run and a resumed run issues the
same ids (and, with seeded sampling, the same episodes) as an uninterrupted one.

`Dispatcher` is plain state, no I/O: items are queued, leased to a pool, and completed by the first record
with their id. A record whose id is already completed, not issued, or already consumed is a duplicate
(a reissued item answered twice, a late answer from a pool presumed dead) and is dropped and counted. When
a pool is lost its leased items go back to the front of the queue (reissued, counted); so is work leased
longer than the lease time. A round is complete when every one of its items is completed; the trainer
takes rounds in order.

Staleness (`split_fresh`): a record generated at policy version v may be used at trainer version t only
when t - v <= k; older ones are dropped and counted. The truncated importance weight in the trainer's
loss corrects the remaining lag.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from flywheel.record import Trajectory
from flywheel.tasks.format import Task


@dataclass(frozen=True)
class WorkItem:
    """One episode to generate."""

    id: str  # trajectory id: the harness's EpisodeSpec id
    task: Task
    effort: str
    seed: int  # the group's seed
    index: int  # sample number within the group
    round: int
    min_version: int = 0  # weights a pool should hold before generating it (older: waits, then serves)


def item_id(task_id: str, effort: str, seed: int, index: int) -> str:
    """The harness's episode id for these coordinates (`flywheel.harness.EpisodeSpec.id`)."""
    return f"{task_id}/{effort}/s{seed}/{index}"


def round_items(
    round_no: int,
    tasks: Sequence[Task],
    efforts: Sequence[str],
    groups: int,
    samples: int,
    seed: int = 0,
    min_version: int = 0,
) -> list[WorkItem]:
    """The items of round `round_no`: groups cycle through the tasks, efforts cycle per group."""
    out = []
    for g in range(groups):
        n = round_no * groups + g
        task, effort = tasks[n % len(tasks)], efforts[n % len(efforts)]
        group_seed = seed * 1_000_000 + n
        for i in range(samples):
            out.append(
                WorkItem(
                    item_id(task.id, effort, group_seed, i),
                    task,
                    effort,
                    group_seed,
                    i,
                    round_no,
                    min_version,
                )
            )
    return out


def split_fresh(
    records: Sequence[Trajectory], trainer_version: int, k: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """(fresh, stale): fresh when `trainer_version - policy_version <= k`."""
    fresh = [r for r in records if trainer_version - r.policy_version <= k]
    stale = [r for r in records if trainer_version - r.policy_version > k]
    return fresh, stale


@dataclass
class Lease:
    pool: str
    item: WorkItem
    since: float


@dataclass
class Dispatcher:
    """Queue, leases and completed records; see the module docstring."""

    queue: deque[WorkItem] = field(default_factory=deque)
    leases: dict[str, Lease] = field(default_factory=dict)
    rounds: dict[int, list[str]] = field(default_factory=dict)  # round -> its item ids, in issue order
    round_of: dict[str, int] = field(default_factory=dict)  # item id -> its round
    done: dict[str, Trajectory] = field(default_factory=dict)
    consumed: set[str] = field(default_factory=set)
    duplicates: int = 0
    reissued: int = 0

    def release(self, items: Sequence[WorkItem]) -> None:
        for it in items:
            self.rounds.setdefault(it.round, []).append(it.id)
            self.round_of[it.id] = it.round
            self.queue.append(it)

    def take(self, pool: str, n: int, now: float | None = None) -> list[WorkItem]:
        now = time.monotonic() if now is None else now
        out = []
        while self.queue and len(out) < n:
            it = self.queue.popleft()
            if it.id in self.done or it.id in self.consumed:
                continue  # answered meanwhile by its first holder
            self.leases[it.id] = Lease(pool, it, now)
            out.append(it)
        return out

    def complete(self, record: Trajectory) -> bool:
        """Accept a record once; False (and counted) for a duplicate or an id never issued."""
        rid = record.id
        known = rid in self.round_of and self.round_of[rid] in self.rounds
        if not known or rid in self.done or rid in self.consumed:
            self.duplicates += 1
            return False
        self.leases.pop(rid, None)
        self.done[rid] = record
        return True

    def lost(self, pool: str) -> list[WorkItem]:
        """Put the items leased to `pool` back at the front of the queue; returns them."""
        items = [lease.item for lease in self.leases.values() if lease.pool == pool]
        return self._reissue(items)

    def expire(self, lease_s: float, now: float | None = None) -> list[WorkItem]:
        now = time.monotonic() if now is None else now
        return self._reissue([lease.item for lease in self.leases.values() if now - lease.since > lease_s])

    def _reissue(self, items: list[WorkItem]) -> list[WorkItem]:
        for it in items:
            del self.leases[it.id]
        self.queue.extendleft(reversed(items))
        self.reissued += len(items)
        return items

    def held_by(self, pool: str) -> int:
        return sum(1 for lease in self.leases.values() if lease.pool == pool)

    def complete_round(self, round_no: int) -> bool:
        ids = self.rounds.get(round_no)
        return bool(ids) and all(i in self.done for i in ids)

    def pop_round(self, round_no: int) -> list[Trajectory]:
        """The round's records in issue order; their ids become consumed (later answers are duplicates)."""
        ids = self.rounds.pop(round_no)
        self.consumed.update(ids)
        return [self.done.pop(i) for i in ids]
