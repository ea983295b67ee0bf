"""The dispatcher's bookkeeping: ids, leases, exactly-once collection, reissue and staleness (no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.harness import HarnessConfig, get_effort
from flywheel.loop import Dispatcher, LoopConfig, check_config, round_items, split_fresh
from flywheel.record import Trajectory
from flywheel.settings import from_dict
from flywheel.tasks.format import Task


def task(name: str) -> Task:
    return Task(
        root=Path(f"/nowhere/{name}"),
        id=name,
        instruction="",
        test_command="",
        fail_to_pass=("t",),
        pass_to_pass=(),
        timeout_s=1.0,
        meta={},
    )


def answer(item_id: str, policy_version: int = 0) -> Trajectory:
    """A pool's record answering the item `item_id`."""
    return Trajectory(item_id, "a", "medium", policy_version=policy_version)


def test_round_items_are_unique_and_match_episode_ids():
    from flywheel.harness import EpisodeSpec, get_effort

    tasks = [task("a"), task("b")]
    seen = set()
    for r in range(3):
        items = round_items(r, tasks, ["medium", "high"], groups=3, samples=2, seed=7, min_version=r)
        assert len(items) == 6 and {it.round for it in items} == {r}
        for it in items:
            assert it.id == EpisodeSpec(it.task, get_effort(it.effort), seed=it.seed, index=it.index).id
            seen.add(it.id)
    assert len(seen) == 18
    assert round_items(1, tasks, ["medium"], 3, 2, seed=7) == round_items(1, tasks, ["medium"], 3, 2, seed=7)


def test_exactly_once_with_reissue_after_a_lost_pool():
    d = Dispatcher()
    items = round_items(0, [task("a")], ["medium"], groups=2, samples=2)
    d.release(items)
    first, second = d.take("p0", 3), d.take("p1", 3)
    assert [it.id for it in first + second] == [it.id for it in items]
    assert d.complete(answer(first[0].id))
    reissued = d.lost("p0")  # p0 died holding two items, one already answered
    assert [it.id for it in reissued] == [it.id for it in first[1:]] and d.reissued == 2
    again = d.take("p1", 5)
    assert [it.id for it in again] == [it.id for it in first[1:]]
    for it in again + second:
        assert d.complete(answer(it.id))
    assert not d.complete(answer(first[1].id))  # the dead pool's late answer
    assert not d.complete(answer("never/issued"))
    assert d.duplicates == 2 and d.complete_round(0)
    records = d.pop_round(0)
    assert [r.id for r in records] == [it.id for it in items]
    assert not d.complete(answer(items[0].id)) and d.duplicates == 3  # consumed ids stay closed


def test_expired_leases_are_reissued():
    d = Dispatcher()
    d.release(round_items(0, [task("a")], ["medium"], 1, 2))
    d.take("p0", 2, now=0.0)
    assert d.expire(10.0, now=5.0) == [] and len(d.expire(10.0, now=11.0)) == 2
    assert d.held_by("p0") == 0 and len(d.take("p1", 2)) == 2


def test_staleness_bound():
    records = [answer(str(v), v) for v in range(6)]
    fresh, stale = split_fresh(records, trainer_version=5, k=2)
    assert [r.policy_version for r in fresh] == [3, 4, 5]
    assert [r.policy_version for r in stale] == [0, 1, 2]


def test_config_checks():
    cfg = LoopConfig(model="hf:x", backend="local", deterministic=True, max_staleness=3)
    assert cfg.sync and cfg.max_staleness == 0 and cfg.pool_batch == 1
    assert LoopConfig(model="hf:x", backend="inline", max_staleness=3).sync  # one process: always synchronous
    with pytest.raises(FlywheelError, match="checkpoint_every = 2 needs the inline backend"):
        check_config(LoopConfig(model="hf:x", backend="local", checkpoint_every=2))
    with pytest.raises(FlywheelError, match="unknown loop backend"):
        check_config(LoopConfig(model="hf:x", backend="slurm"))
    with pytest.raises(FlywheelError, match="pools"):
        check_config(LoopConfig(model="hf:x", pools=0))
    with pytest.raises(FlywheelError, match="unknown key 'poolz'"):
        from_dict(LoopConfig, {"poolz": 2}, "[loop]")
    with pytest.raises(FlywheelError, match="model: set by the rest of the run config"):
        from_dict(LoopConfig, {"model": "hf:x"}, "[loop]")
    with pytest.raises(FlywheelError, match="efforts"):
        check_config(LoopConfig(model="hf:x", efforts={}))
    with pytest.raises(FlywheelError, match="unknown effort"):  # each value is checked by the type owning it
        get_effort("huge")
    with pytest.raises(FlywheelError, match="not an effort budget.*max_turnz"):
        get_effort("medium", max_turnz=3)
    with pytest.raises(FlywheelError, match="cohorts"):
        LoopConfig(model="hf:x", harness=HarnessConfig(cohorts=0))
    with pytest.raises(FlywheelError, match="action_format"):
        LoopConfig(model="hf:x", harness=HarnessConfig(action_format="json"))
