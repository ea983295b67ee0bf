"""`flywheel report`: one self-contained HTML page from run directories (`flywheel.report`)."""

from __future__ import annotations

from pathlib import Path

import typer


def report(
    runs: list[Path] = typer.Argument(
        ..., help="Run directories: an eval, a training run, a calibration, the demo's runs/demo, or several."
    ),
    out: Path = typer.Option(..., "--out", help="The HTML file to write (plots, styles and script inline)."),
    title: str = typer.Option("", "--title", help="The page's title (default: the run directories)."),
) -> None:
    """Write one HTML page: success against cost, learning curves, calibration, and every attempt."""
    from flywheel.report import write_report

    path = write_report(runs, out, title)
    typer.echo(f"{path} ({path.stat().st_size / 1024:.0f} KB)")
