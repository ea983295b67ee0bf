"""`flywheel serve`: any model behind an OpenAI-compatible HTTP API, until Ctrl-C or SIGTERM.

`scripted-lead` is served too (`flywheel.fusion.load_model`), so a Fusion lead can be an `openai:` model
on loopback: like the scripted oracles it reads the task from `Request.meta`, which a client sends with
`openai:NAME?send_meta=true`."""

from __future__ import annotations

import signal

import typer

from flywheel.errors import FlywheelError
from flywheel.models import SPECS


def serve(
    model: str = typer.Option(..., "--model", help=f"{SPECS} (or scripted-lead)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    max_batch: int = typer.Option(64, "--max-batch", min=1, help="Requests per model call, at most."),
    batch_window_ms: float = typer.Option(
        5.0, "--batch-window-ms", min=0.0, help="How long a batch waits to fill."
    ),
) -> None:
    """Serve MODEL at http://HOST:PORT/v1 (chat completions, models) until interrupted."""
    from flywheel.fusion import load_model
    from flywheel.models.server import ServerConfig, serve_model

    policy = load_model(model)
    config = ServerConfig(batch_window_s=batch_window_ms / 1000, max_batch=max_batch)
    try:
        server, thread = serve_model(policy, host, port, config)
    except OSError as e:
        raise FlywheelError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    # Both stop it, even where SIGINT was ignored at start (a background job of a non-interactive shell).
    # Installed before the "serving" line, so a signal sent as soon as a client has read it is not lost.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        typer.echo(f"serving {server.model_name} at {server.url}")
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        typer.echo("stopping", err=True)
    finally:
        server.close()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
