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

Retries (`infra_retries`, `[rollout] infra_retries`). A record the infrastructure ended (`infra_failure` in
`RETRIED`: the model server, the sandbox, the grader) completes its item like any other, and, while the
item's slot has retries left, the dispatcher issues a retry at the front of the queue (`retry_item`): the
same task, effort, index and round, its own seed (the failed attempt's plus `RETRY_SEED_STEP`, so it draws
other random numbers) and its own id (`.../s<seed>/<index>/retry<n>`, the harness's episode id with the
variant `retry<n>`). The retry joins the round right after the attempt it replaces, so the round waits for
it and a round's records keep one order whatever the order they arrive in. The round then holds both: the
failed attempt, which the trainer masks (it leaves the group's baseline and gets no advantage), and its
retry, which takes its place in the same (task, effort) group. A slot whose last retry fails too trains
with what it has. A pool lost with work in hand is not an attempt's failure: its leases are reissued
under the same ids, as above.

Staleness (`split_fresh`): a record generated at policy version v may be used at trainer version t only
when t - v <= k; older ones are dropped and counted. The truncated importance weight in the trainer's
loss corrects the remaining lag.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

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
    retry: int = 0  # 0: a first attempt; n: the n-th retry of its slot (`retry_item`)
    retry_of: str | None = None  # a retry: the id of the failed attempt it replaces

    @property
    def variant(self) -> str:
        """The harness's `EpisodeSpec.variant` for this item: `retry<n>` for a retry, else none."""
        return f"retry{self.retry}" if self.retry else ""


RETRIED = ("model_server", "sandbox", "grader")  # the `infra_failure` causes an attempt is retried for
RETRY_SEED_STEP = 1 << 31  # a retry's seed is the failed attempt's plus this (`flywheel train`'s are below)


def item_id(task_id: str, effort: str, seed: int, index: int, retry: int = 0) -> str:
    """The harness's episode id for these coordinates (`flywheel.harness.EpisodeSpec.id`); a retry's adds
    its variant `retry<n>`."""
    base = f"{task_id}/{effort}/s{seed}/{index}"
    return f"{base}/retry{retry}" if retry else base


def retry_item(item: WorkItem) -> WorkItem:
    """The next attempt at `item`'s slot, after the infrastructure ended `item`: its own seed and id."""
    n, seed = item.retry + 1, item.seed + RETRY_SEED_STEP
    new_id = item_id(item.task.id, item.effort, seed, item.index, n)
    return replace(item, id=new_id, seed=seed, retry=n, retry_of=item.id)


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
    infra_retries: int = 0  # retries per slot of an attempt the infrastructure ended (module docstring)
    issued: dict[str, WorkItem] = field(default_factory=dict)  # item id -> the item, until consumed
    retries: dict[str, WorkItem] = field(default_factory=dict)  # failed attempt's id -> its retry

    def release(self, items: Sequence[WorkItem]) -> None:
        for it in items:
            self.rounds.setdefault(it.round, []).append(it.id)
            self.round_of[it.id] = it.round
            self.issued[it.id] = it
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
        """Accept a record once; False (and counted) for a duplicate or an id never issued. A record the
        infrastructure ended, with retries left for its slot, issues its retry (`retries`)."""
        rid = record.id
        known = rid in self.round_of and self.round_of[rid] in self.rounds
        if not known or rid in self.done or rid in self.consumed:
            self.duplicates += 1
            return False
        self.leases.pop(rid, None)
        self.done[rid] = record
        item = self.issued[rid]
        if record.infra_failure in RETRIED and item.retry < self.infra_retries:
            self._retry(item)
        return True

    def _retry(self, item: WorkItem) -> None:
        """Issue the retry of `item` first in the queue, placed in its round right after `item`."""
        again = retry_item(item)
        ids = self.rounds[item.round]
        ids.insert(ids.index(item.id) + 1, again.id)
        self.round_of[again.id] = item.round
        self.issued[again.id] = self.retries[item.id] = again
        self.queue.appendleft(again)

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
        for i in ids:
            self.issued.pop(i, None)
            self.retries.pop(i, None)
        return [self.done.pop(i) for i in ids]
