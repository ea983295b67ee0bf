"""Bounded retries of the attempts the infrastructure ended (`[rollout] infra_retries`).

The dispatcher's bookkeeping is checked without I/O; then whole runs with real faults: the inline backend
with the real trainer generating through a model server that answers HTTP 500 to the episodes it is told
to fail (each failed attempt is kept and masked, its retry has its own id and seed and takes its place in
the group, the bound holds against a server that always fails, and `infra_retries = 0` is the behaviour
without retries), and the local backend with a grader that crashes in the pool processes.
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from loop_helpers import loop_config, quick_grade

from flywheel.errors import FlywheelError
from flywheel.harness import EpisodeSpec, get_effort
from flywheel.loop import Dispatcher, LoopConfig, round_items, run
from flywheel.loop.dispatch import RETRY_SEED_STEP
from flywheel.protocols import Completion
from flywheel.record import Trajectory, read_jsonl, read_trajectories
from flywheel.tasks.format import Task

EFFORTS = {e: get_effort(e, max_turns=3) for e in ("medium", "high")}  # tests run, file viewed, fixed


def task(name: str = "a") -> Task:
    return Task(name, "", "", ("t",), (), 1.0, Path(f"/nowhere/{name}"))


def answer(item_id: str, infra: str | None = None) -> Trajectory:
    return Trajectory(item_id, "a", "medium", infra_failure=infra)


# ------------------------------------------------------------------------------------------ the dispatcher


def test_a_failed_attempt_is_retried_with_its_own_id_and_seed_in_its_round():
    d = Dispatcher(infra_retries=1)
    items = round_items(0, [task()], ["medium"], groups=1, samples=3, seed=5)
    d.release(items)
    assert [it.id for it in d.take("p0", 3)] == [it.id for it in items]
    d.release(round_items(1, [task()], ["medium"], groups=1, samples=3, seed=5))  # the next round waits
    assert d.complete(answer(items[0].id)) and d.complete(answer(items[1].id, "model_server"))
    again = d.retries[items[1].id]
    assert d.complete(answer(items[2].id))
    assert not d.complete_round(0)  # the round waits for the retry
    assert (again.retry, again.retry_of, again.index, again.round) == (1, items[1].id, 1, 0)
    assert again.seed == items[1].seed + RETRY_SEED_STEP and again.id == f"a/medium/s{again.seed}/1/retry1"
    assert again.id == EpisodeSpec(task(), get_effort("medium"), again.seed, 1, variant=again.variant).id
    assert [it.id for it in d.take("p1", 1)] == [again.id]  # first in the queue
    assert d.complete(answer(again.id))
    assert d.complete_round(0)
    records = d.pop_round(0)  # the failed attempt stays, its retry right after it
    assert [r.id for r in records] == [items[0].id, items[1].id, again.id, items[2].id]
    assert not d.complete(answer(again.id)) and set(d.issued) == set(d.rounds[1]) and not d.retries


def test_retries_are_bounded_and_only_for_the_infrastructures_failures():
    d = Dispatcher(infra_retries=2)
    items = round_items(0, [task()], ["medium"], groups=1, samples=4)
    d.release(items)
    d.take("p0", 4)
    d.complete(answer(items[0].id, "grader"))
    d.complete(answer(items[1].id, "pool_lost"))  # a lost pool's work is reissued, not retried
    d.complete(answer(items[2].id))  # the policy's own failure
    d.complete(answer(items[3].id, "sandbox"))
    assert set(d.retries) == {items[0].id, items[3].id}
    tries: dict[int, list[str]] = {0: [items[0].id], 3: [items[3].id]}
    for n in (1, 2):  # a slot that keeps failing: 1 + infra_retries attempts, then it is done
        for it in d.take("p0", 5):
            assert (it.retry, it.retry_of) == (n, tries[it.index][-1])
            assert it.seed == items[it.index].seed + n * RETRY_SEED_STEP
            assert not d.complete(answer(it.retry_of, "grader"))  # a duplicate issues nothing
            assert d.complete(answer(it.id, "grader"))
            tries[it.index].append(it.id)
    assert not d.queue and d.complete_round(0)
    expected = [*tries[0], items[1].id, items[2].id, *tries[3]]
    assert [r.id for r in d.pop_round(0)] == expected
    assert [i.rsplit("/", 1)[-1] for i in tries[3]] == ["3", "retry1", "retry2"]

    plain = Dispatcher()  # infra_retries = 0: no retries
    plain.release(items)
    plain.take("p0", 4)
    plain.complete(answer(items[0].id, "model_server"))
    assert not plain.retries and not plain.queue


def test_the_setting_is_checked(tmp_path, capsys):
    from flywheel.cli import main

    with pytest.raises(FlywheelError, match="infra_retries"):
        LoopConfig(model="hf:x", infra_retries=-1)
    bad = tmp_path / "bad.toml"
    for body, needle in [
        ("[rollout]\ninfra_retries = -1\n", "[rollout] infra_retries must be >= 0"),
        ("[rollout]\ninfra_retries = 'twice'\n", "infra_retries"),
        ("[loop]\ninfra_retries = 2\n", "[loop] infra_retries"),  # it is [rollout]'s
    ]:
        bad.write_text(body)
        with pytest.raises(SystemExit) as exit_:
            main(["train", str(bad), "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and needle in err and err.count("\n") == 1, err


def test_train_hands_the_setting_to_the_loop():
    from flywheel.rl.config import RolloutConfig, RunConfig
    from flywheel.rl.train import loop_config as train_loop_config

    assert RunConfig().rollout.infra_retries == 1 == LoopConfig(model="hf:x").infra_retries
    cfg = RunConfig(rollout=RolloutConfig(infra_retries=3))
    assert train_loop_config(cfg, "hf:x").infra_retries == 3


def test_old_records_load_and_a_retry_round_trips():
    old = answer("a/medium/s0/0").to_json()
    assert "retry" not in old and "retry_of" not in old
    assert Trajectory.from_json(old).retry is None
    retry = Trajectory("a/medium/s9/0/retry1", "a", "medium", retry_of="a/medium/s0/0", retry=1)
    assert Trajectory.from_json(retry.to_json()) == retry


# ------------------------------------------------------------------------------------------ whole runs


class Outage:
    """The scripted oracle, failing every request of the episodes `down` picks (by episode id).

    Served over HTTP, a failed request is answered with HTTP 500 for that request alone, which the
    client turns into a `model_error` ending, as a model server that breaks does.
    """

    def __init__(self, down: Callable[[str], bool]) -> None:
        from flywheel.models.scripted import ScriptedModel

        self.inner, self.down = ScriptedModel(), down
        self.name = self.inner.name

    def generate(self, requests):
        out = self.inner.generate(requests)
        for i, r in enumerate(requests):
            if self.down(r.meta["episode"]):
                out[i] = Completion("", finish_reason="error", error="injected outage")
        return out


class Remote:
    """A served model as the inline backend's engine (the trainer syncs no weights into it)."""

    def __init__(self, client) -> None:
        self.client, self.name = client, client.name

    def generate(self, requests):
        return self.client.generate(requests)


def inline_run(tmp_path: Path, tiny_model: Path, clamp_task, down, steps: int, **kw) -> list[Trajectory]:
    """An inline run of the real trainer generating through a served `Outage`; its records."""
    from flywheel.models.hf import load_hf
    from flywheel.models.openai_backend import load_openai_model
    from flywheel.rl.config import RunConfig
    from flywheel.rl.trainer import Trainer
    from flywheel.serve import ServerConfig, serve_model

    srv, _ = serve_model(Outage(down), config=ServerConfig(batch_window_s=0.002))
    try:
        client = load_openai_model(
            "openai:scripted", base_url=srv.url, send_meta=True, max_retries=0, connect_retries=0
        )
        model, tokenizer = load_hf(tiny_model)
        trainer = Trainer(
            model, tokenizer, RunConfig(), lambdas={"medium": 1.0, "high": 1.0}, engine=Remote(client)
        )
        cfg = loop_config(tiny_model, backend="inline", pools=1, steps=steps, efforts=EFFORTS, **kw)
        summary = run(cfg, trainer, [clamp_task], tmp_path / "run")
    finally:
        srv.close()
    assert summary["version"] == steps
    return read_trajectories(tmp_path / "run" / "trajectories.jsonl")


def slot(r: Trajectory) -> tuple:
    """The place in a group an attempt fills: (step, task, effort, sample index)."""
    return (r.step, r.task_id, r.effort, r.index)


def slots(records: list[Trajectory]) -> dict[tuple, list[Trajectory]]:
    """Each slot's attempts, in order."""
    out: dict[tuple, list[Trajectory]] = defaultdict(list)
    for r in records:
        out[slot(r)].append(r)
    return out


def test_a_failing_model_server_s_attempts_are_masked_and_retried_into_full_groups(
    tmp_path, tiny_model, clamp_task
):
    down = lambda episode: episode.endswith("/0")  # noqa: E731  first attempts of each group's sample 0
    records = inline_run(tmp_path, tiny_model, clamp_task, down, steps=1, groups_per_step=2, samples=2)
    failed = [r for r in records if r.infra_failure]
    retries = {r.retry_of: r for r in records if r.retry}
    assert len(records) == 6 and len(failed) == 2 and set(retries) == {r.id for r in failed}
    for r in failed:  # kept, masked: no advantage
        assert (r.infra_failure, r.ending, r.retry) == ("model_server", "model_error", None)
        assert r.rl["advantage"] == 0.0
        again = retries[r.id]  # its own seed and id, in the same slot
        assert again.infra_failure is None and again.success and again.retry == 1 and slot(again) == slot(r)
        assert again.seed == r.seed + RETRY_SEED_STEP
        assert again.id == f"{clamp_task.id}/{r.effort}/s{again.seed}/0/retry1"
    groups: dict[tuple, list[Trajectory]] = defaultdict(list)
    for r in records:
        groups[(r.step, r.task_id, r.effort)].append(r)
    assert len(groups) == 2
    for group in groups.values():  # every group trains on its full size; the failure is not in its baseline
        valid = [r for r in group if r.infra_failure is None]
        assert len(valid) == 2 and sum(r.rl["advantage"] for r in valid) == pytest.approx(0.0, abs=1e-9)
    [metrics] = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert (metrics["infra_failures"], metrics["loop_infra_retried"], metrics["loop_records"]) == (2.0, 2, 6)
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [e["retry_of"] for e in events if e["event"] == "retry"] == [r.id for r in failed]


@pytest.mark.parametrize("retries", [0, 2])
def test_a_server_that_always_fails_gets_exactly_one_plus_infra_retries_attempts_per_slot(
    tmp_path, tiny_model, clamp_task, retries
):
    records = inline_run(
        tmp_path, tiny_model, clamp_task, lambda e: True, steps=1, groups_per_step=1, samples=2,
        infra_retries=retries,
    )  # fmt: skip
    assert all(r.infra_failure == "model_server" and r.rl["advantage"] == 0.0 for r in records)
    for attempts in slots(records).values():
        assert [r.retry for r in attempts] == [None, *range(1, retries + 1)]
        assert [r.retry_of for r in attempts[1:]] == [r.id for r in attempts[:-1]]
        assert len({r.seed for r in attempts}) == len({r.id for r in attempts}) == 1 + retries
    assert len(records) == 2 * (1 + retries)
    if retries == 0:  # today's behaviour: the items of the round, nothing more
        assert [r.id for r in records] == [it.id for it in round_items(0, [clamp_task], ["medium"], 1, 2)]


def crash_first(limit: int, marks: str, task, workspace, trajectory):
    """`quick_grade`, but the first `limit` gradings of the run (over every pool process) crash."""
    for n in range(limit):
        try:
            os.close(os.open(os.path.join(marks, str(n)), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        raise RuntimeError("grader outage")
    return quick_grade(task, workspace, trajectory)


@pytest.mark.fault
def test_local_pools_retry_the_attempts_a_crashing_grader_ended(tmp_path, tiny_model, clamp_task):
    from loop_helpers import FakeTrainer

    (tmp_path / "marks").mkdir()
    grader = functools.partial(crash_first, 2, str(tmp_path / "marks"))
    cfg = loop_config(tiny_model, steps=1, infra_retries=2, grader=grader)
    out = tmp_path / "run"
    summary = run(cfg, FakeTrainer(tiny_model), [clamp_task], out)
    records = read_trajectories(out / "trajectories.jsonl")
    failed = [r for r in records if r.infra_failure]
    assert [r.infra_failure for r in failed] == ["grader"] * 2 and summary["infra_retried"] == 2
    by_id = {r.id: r for r in records}
    for r in records:
        if r.retry:  # stamped in the pool process; it replaces the attempt before it in its slot
            before = by_id[r.retry_of]
            assert before.infra_failure == "grader" and r.seed == before.seed + RETRY_SEED_STEP
            assert slot(r) == slot(before) and r.retry == (before.retry or 0) + 1
    assert {r.retry_of for r in records if r.retry} == {r.id for r in failed}
    valid = [r for r in records if r.infra_failure is None]
    assert len(valid) == 2 and len(records) == 4  # the group of two trained full
