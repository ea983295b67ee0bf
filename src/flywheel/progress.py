"""Progress bars on stderr for long work (quiet when stderr is not a terminal and FLYWHEEL_PROGRESS=0)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def progress(description: str, total: int) -> Iterator:
    """Yields `advance(n=1, **fields)`; `fields` are shown after the bar (e.g. success=0.41)."""
    disabled = os.environ.get("FLYWHEEL_PROGRESS") == "0"
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=disabled,
        transient=False,
    )
    with bar:
        task = bar.add_task(description, total=total, info="")

        def advance(n: int = 1, **fields: object) -> None:
            info = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
            bar.update(task, advance=n, **({"info": info} if fields else {}))

        yield advance
