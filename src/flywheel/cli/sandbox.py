"""`flywheel sandbox run WORKSPACE -- CMD ...`: run one command inside the sandbox; `check`: what holds here."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from flywheel.errors import FlywheelError

app = typer.Typer(help="Run commands inside the sandbox.", no_args_is_help=True)


@app.command("run")
def run(
    workspace: Path = typer.Argument(..., help="Directory mounted read-write at /workspace (the cwd)."),
    command: list[str] = typer.Argument(None, help="The command and its arguments, after `--`."),
    timeout: float = typer.Option(60.0, "--timeout", help="Wall-clock limit in seconds (exit 124 when hit)."),
    memory_mb: int = typer.Option(2048, "--memory-mb", help="Memory limit in MiB."),
    max_procs: int = typer.Option(64, "--max-procs", help="Processes and threads alive at once."),
    disk_mb: int = typer.Option(
        512, "--disk-mb", help="The workspace's total size in MiB (exit 153 past it)."
    ),
    output_bytes: int = typer.Option(16_384, "--output-bytes", help="Output kept (head and tail)."),
    backend: str = typer.Option(
        None, "--backend", help="Sandbox backend: bwrap or fallback (default: best)."
    ),
) -> None:
    """Run CMD in a sandbox on WORKSPACE; print its output and exit with its exit code.

    A limit this host cannot enforce is named in one warning line on stderr (see `flywheel sandbox check`).
    """
    from flywheel.protocols import Limits
    from flywheel.sandbox import get_sandbox, warn_unenforced

    if not workspace.is_dir():
        raise FlywheelError(f"{workspace}: workspace is not a directory")
    if not command:
        raise FlywheelError("no command given (usage: flywheel sandbox run WORKSPACE -- CMD ...)")
    if timeout <= 0 or min(memory_mb, max_procs, disk_mb) <= 0 or output_bytes < 0:
        raise FlywheelError(
            "--timeout, --memory-mb, --max-procs and --disk-mb must be positive, --output-bytes not negative"
        )
    limits = Limits(
        timeout_s=timeout,
        memory_mb=memory_mb,
        max_procs=max_procs,
        disk_mb=disk_mb,
        output_bytes=output_bytes,
    )
    sandbox = get_sandbox(backend)
    warn_unenforced()
    result = sandbox.run(workspace, command, limits=limits)
    sys.stdout.write(result.output)
    sys.stdout.flush()
    if result.timed_out:
        typer.echo(f"flywheel: command timed out after {timeout:g} s", err=True)
    raise typer.Exit(result.exit_code)


@app.command("check")
def check() -> None:
    """Print what enforces each sandbox limit on this host for this user; exit 1 if one is not enforced."""
    from flywheel.sandbox import default_backend, enforced_limits, unenforced_warning

    enforced = enforced_limits()
    typer.echo(f"backend    {default_backend()}")
    for limit, mechanism in enforced.items():
        typer.echo(f"{limit:<10} {mechanism}")
    raise typer.Exit(1 if unenforced_warning(enforced) else 0)
