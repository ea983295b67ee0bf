"""Progress on stderr for long work.

On a terminal: a live bar. Otherwise (a log file, CI): one plain line at most every
FLYWHEEL_PROGRESS_EVERY seconds (default 30) and one at the end, so a log shows where long work stands.
FLYWHEEL_PROGRESS=0 silences both.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def _info(fields: dict[str, object]) -> str:
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())


@contextmanager
def progress(description: str, total: int) -> Iterator:
    """Yields `advance(n=1, **fields)`; `fields` are shown after the bar (e.g. success=0.41)."""
    if os.environ.get("FLYWHEEL_PROGRESS") == "0":
        yield lambda n=1, **fields: None
        return
    console = Console(stderr=True)
    if not console.is_terminal:
        with _lines(description, total) as advance:
            yield advance
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    )
    with bar:
        task = bar.add_task(description, total=total, info="")

        def advance(n: int = 1, **fields: object) -> None:
            bar.update(task, advance=n, **({"info": _info(fields)} if fields else {}))

        yield advance


@contextmanager
def _lines(description: str, total: int) -> Iterator:
    """Plain progress lines for a stderr that is not a terminal."""
    try:
        every = float(os.environ.get("FLYWHEEL_PROGRESS_EVERY", "30"))
    except ValueError:
        every = 30.0
    start = last = time.monotonic()
    state = {"done": 0, "info": ""}

    def emit() -> None:
        elapsed = int(time.monotonic() - start)
        info = f"  {state['info']}" if state["info"] else ""
        print(
            f"{description}: {state['done']}/{total}  {elapsed // 60}:{elapsed % 60:02d}{info}",
            file=sys.stderr,
            flush=True,
        )

    def advance(n: int = 1, **fields: object) -> None:
        nonlocal last
        state["done"] += n
        if fields:
            state["info"] = _info(fields)
        if time.monotonic() - last >= every:
            last = time.monotonic()
            emit()

    yield advance
    emit()
