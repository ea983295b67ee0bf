"""The `local` backend: the trainer in the driver process (one thread), each pool its own process.

Pools are started through a multiprocessing `forkserver` that has imported torch and the engine once, so
starting (or restarting) a pool costs a fork and a model load, not an interpreter start. Each pool has its
own two one-way pipes (work in, events out); a pool that dies, even mid-message, damages only its own
pipe. A dead pool is detected by its process sentinel: the complete events it sent before dying are still
read and kept, then the driver is told it is lost (its leased work is reissued elsewhere). A pool whose
driver dies sees its work pipe close and exits.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.util
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from flywheel.loop.dispatch import WorkItem
from flywheel.loop.host import ThreadedHost, TrainerHost
from flywheel.loop.pool import PoolSpec, pool_process
from flywheel.sandbox import sweep_dead
from flywheel.sandbox.workspaces import new_workspace

Event = tuple[str, str, Any]
# imported once by the forkserver, so a pool (re)start is a fork plus a model load
PRELOAD = [
    "flywheel.loop.pool", "flywheel.models.torch_engine", "flywheel.models.hf", "flywheel.harness",
    "flywheel.verify", "flywheel.sync", "transformers.models.llama.modeling_llama",
]  # fmt: skip


@dataclass
class Handle:
    spec: PoolSpec
    proc: Any
    work: Connection
    results: Connection
    lost: bool = False


UNIX_PATH_ROOM = 107 - len("/listener-xxxxxxxx")  # a socket's path, 108 bytes with its NUL, under the dir


def private_mp_tempdir() -> None:
    """Put multiprocessing's temporary directory (the forkserver's listening socket) inside this process's
    own directory (`sandbox.workspaces`), so a driver killed with SIGKILL leaves nothing the next flywheel
    process does not sweep; removed at a clean exit, before that directory is released. Once per process,
    and only where multiprocessing has not made its own yet."""
    config = mp.current_process()._config  # where `multiprocessing.util.get_temp_dir` keeps its choice
    if config.get("tempdir") is None:
        path = str(new_workspace("pymp-"))
        if len(path) > UNIX_PATH_ROOM:  # the socket would not bind: leave multiprocessing its own choice
            os.rmdir(path)
            return
        config["tempdir"] = path
        multiprocessing.util.Finalize(
            None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True}, exitpriority=1
        )


def context() -> Any:
    private_mp_tempdir()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class LocalBackend(ThreadedHost):
    """Pools as local processes; the trainer host in a worker thread of the driver."""

    def __init__(self, host_args: dict[str, Any], trainer: Any, cfg: Any = None) -> None:
        self.ctx = context()
        self.pools: dict[str, Handle] = {}
        self.host = TrainerHost(trainer, **host_args)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")

    # -- pools

    def start_pool(self, spec: PoolSpec) -> None:
        work_r, work_w = self.ctx.Pipe(duplex=False)
        res_r, res_w = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(
            target=pool_process, args=(spec, work_r, res_w), name=spec.pool_id, daemon=True
        )
        proc.start()
        work_r.close()
        res_w.close()
        self.pools[spec.pool_id] = Handle(spec, proc, work_w, res_r)

    def pid(self, pool_id: str) -> int | None:
        return self.pools[pool_id].proc.pid

    def submit(self, pool_id: str, items: list[WorkItem]) -> None:
        with contextlib.suppress(OSError):  # dead: its sentinel reports it on the next poll
            self.pools[pool_id].work.send(items)

    def poll(self, timeout: float) -> list[Event]:
        live = [h for h in self.pools.values() if not h.lost]
        waitables: list[Any] = [h.results for h in live] + [h.proc.sentinel for h in live]
        ready = set(wait(waitables, timeout)) if waitables else set()
        events: list[Event] = []
        for h in live:
            if h.results in ready:
                events += self.drain(h)
            if not h.lost and (h.proc.sentinel in ready or not h.proc.is_alive()):
                events += self.drain(h)
                events.append(("lost", h.spec.pool_id, f"exit code {h.proc.exitcode}"))
                self.forget(h)
        return events

    def drain(self, h: Handle) -> list[Event]:
        """Every complete event waiting on the pool's pipe (stops at EOF or a torn message)."""
        out: list[Event] = []
        try:
            while not h.lost and h.results.poll():
                out.append(h.results.recv())
        except Exception as exc:  # EOF, or a message torn by the pool's death (any unpickling error)
            if h.proc.is_alive():
                h.proc.kill()
            out.append(("lost", h.spec.pool_id, f"pipe closed: {type(exc).__name__}"))
            self.forget(h)
        return out

    def forget(self, h: Handle) -> None:
        h.lost = True
        for conn in (h.work, h.results):
            conn.close()
        h.proc.join(timeout=5)

    def close(self) -> None:
        for h in self.pools.values():
            if not h.lost:
                with contextlib.suppress(OSError):
                    h.work.send(None)
        for h in self.pools.values():
            h.proc.join(timeout=10)
            if h.proc.is_alive():
                h.proc.kill()
                h.proc.join(timeout=5)
            if not h.lost:
                self.forget(h)
        self.worker.shutdown(wait=True)
        sweep_dead()  # what a pool killed here left: its workspaces, a command still running in its cgroups
