"""The sidekick's side of a delegation: its episode's spec, its batches, its report to the lead.

Delegations of concurrent lead episodes run together: the sidekick's model is used by one thread
(`SidekickBatches`), which gathers the delegations that are waiting and runs their episodes as one batch
under the harness (batched generation, concurrent tools), so a pair evaluated 64 at a time asks its
sidekick for up to 64 episodes at once rather than one after another. A delegation made while a batch runs
waits for the next one.

A delegation's episode (`sidekick_spec`) is the lead's task told the lead's instruction, in the lead's
workspace; its report (`sidekick_report`) is what the lead reads back; a sidekick whose model raised is a
`model_error` record (`crashed`), never a crashed attempt.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from flywheel.harness import EpisodeSpec, get_effort
from flywheel.harness.cost import pricing_for
from flywheel.harness.effort import Effort
from flywheel.record import Trajectory


class SidekickBatches:
    """One thread that owns the sidekick's model: it takes the delegations waiting (those that arrive within
    `gather_s` of the first), runs them together with `run_batch`, hands each caller its record, and
    repeats. `run` blocks its caller (a lead episode's tool thread) until its episode has ended."""

    def __init__(self, run_batch: Callable[[list[EpisodeSpec]], list[Trajectory]], gather_s: float = 0.05):
        self._run_batch, self.gather_s = run_batch, gather_s
        self._queue: queue.Queue[tuple[EpisodeSpec, Future] | None] = queue.Queue()
        self.sizes: list[int] = []  # each batch's size, in order
        self._thread = threading.Thread(target=self._serve, name="fusion-sidekick", daemon=True)
        self._thread.start()

    def run(self, spec: EpisodeSpec) -> Trajectory:
        future: Future[Trajectory] = Future()
        self._queue.put((spec, future))
        return future.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (first := self._queue.get()) is not None:
            batch, closing = [first], False
            deadline = time.monotonic() + self.gather_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    item = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self.sizes.append(len(batch))
            try:
                records = self._run_batch([spec for spec, _ in batch])
            except BaseException as e:  # never leave a lead episode waiting: its tool call raises instead
                for _, future in batch:
                    future.set_exception(e)
            else:
                for (_, future), record in zip(batch, records, strict=True):
                    future.set_result(record)
            if closing:
                return


def crashed(spec: EpisodeSpec, model: str, error: Exception) -> Trajectory:
    """The record of a sidekick episode whose model raised."""
    return Trajectory(
        id=spec.id,
        task_id=spec.task.id,
        effort=spec.effort.name,
        seed=spec.seed,
        index=spec.index,
        model=model,
        ending="model_error",
        error=f"the sidekick crashed: {error!r}"[:500],
        infra_failure="model_server",
    )


def sidekick_spec(
    lead: EpisodeSpec, instruction: str, k: int, workspace: Path, effort: str | Effort | None
) -> EpisodeSpec:
    """The `k`-th delegation's episode: the lead's task, told the lead's instruction, in the lead's
    workspace, at `effort` (a level's name or the level itself; None: the lead's); its id is the lead's
    with `/sidekick<k>` after it."""
    task = replace(
        lead.task, instruction=f"{lead.task.instruction.strip()}\n\nYour lead asks:\n{instruction}"
    )
    variant = f"{lead.variant}/sidekick{k}" if lead.variant else f"sidekick{k}"
    return replace(
        lead,
        task=task,
        effort=(get_effort(effort) if isinstance(effort, str) else effort) or lead.effort,
        variant=variant,
        workspace=workspace,
    )


def sidekick_report(record: Trajectory, diff: str, k: int, limit: int = 1200) -> str:
    """What the lead reads after delegation `k`: the sidekick's ending, its diff, its tests, its last word.

    Its price is the sidekick's tokens' (no measured seconds), so that a deterministic run's lead reads the
    same report in every run."""
    ending = f"{record.ending}" + (f" ({record.error})" if record.error else "")
    tests = [t for t in record.turns if t["role"] == "tool" and t.get("name") == "run_tests"]
    last = next((t for t in reversed(record.turns) if t["role"] == "assistant"), None)
    said = (last.get("text") or "") if last else ""
    if last and not said and last.get("tool_calls"):
        said = "; ".join(f"{c['name']} {c.get('arguments') or {}}" for c in last["tool_calls"])
    price = pricing_for(record.model).cost(record.prompt_tokens, record.completion_tokens, 0.0)
    parts = [
        f"sidekick report (delegation {k}): it ended with {ending} after {record.n_turns} turns; "
        f"its tokens cost ${price:.6f}.",
        "its changes (a diff against the repository before this delegation):",
        _cut(diff, limit) if diff else "(no changes)",
        f"it ran the tests {len(tests)} time(s)" + ("; the last result:" if tests else "."),
        *([_cut(tests[-1]["text"], limit)] if tests else []),
        "its last message:",
        _cut(said, limit) or "(none)",
    ]
    return "\n".join(parts)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit // 2]}\n[...]\n{text[-limit // 2 :]}"
