"""`flywheel serve`: any model behind an OpenAI-compatible HTTP API, until Ctrl-C or SIGTERM.

`scripted-lead` is served too (`flywheel.models.get_model`), so a Fusion lead can be an `openai:` model
on loopback: like the scripted oracles it reads the task from `Request.meta`, which a client sends with
`openai:NAME?send_meta=true`.

`--follow STORE` (a path, `file://` or `s3://` URL; S3 endpoint and keys from the usual environment
variables, see `flywheel.sync.store`) makes the server an inference pool that follows the trainer: the
model (a torch model: hf:PATH, smollm2-135m or a shipped base) is loaded in bf16, the latest published
weights are loaded over it, and each version published after is applied in place between generation
batches (`flywheel.serve.follow`). The version served is in every completion (`policy_version`), in
`GET /health`, and on stderr at each update. A store that cannot be read at start is refused (exit 2);
an empty one is waited on (the model's own weights are served, with no version, until the first).

`--draft SPEC` serves a torch model with exact speculative decoding (`flywheel.models.speculative`):
`lookup` (the context's own continuations, no model; 1.3-1.45x at batch 1 on agent turns), `layers:N` or
a model with the same vocabulary. It pays for one client at a time (an agent's session): a lookup draft
batches concurrent requests as the plain engine does but gains nothing there, and with a model draft
requests run one at a time, so many concurrent clients are served faster without one.
"""

from __future__ import annotations

import logging
import signal
import sys

import typer

from flywheel.errors import FlywheelError
from flywheel.models import SPECS, get_model, require_torch
from flywheel.serve import ServerConfig, serve_model


def serve(
    model: str = typer.Option(..., "--model", help=f"{SPECS} (or scripted-lead)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    max_batch: int = typer.Option(64, "--max-batch", min=1, help="Requests per model call, at most."),
    batch_window_ms: float = typer.Option(
        5.0, "--batch-window-ms", min=0.0, help="How long a batch waits to fill."
    ),
    follow: str = typer.Option(
        "", "--follow", help="Weight store (path, file:// or s3://) whose published versions to serve."
    ),
    draft: str = typer.Option(
        "",
        "--draft",
        help="Speculative decoding for a torch model: lookup[:N], layers:N or a model with its vocabulary. "
        "It pays for one client at a time, not for many at once (a model draft runs requests one by one).",
    ),
    draft_tokens: int = typer.Option(4, "--draft-tokens", min=1, help="Tokens the draft proposes per round."),
) -> None:
    """Serve MODEL at http://HOST:PORT/v1 (chat completions, models) until interrupted."""
    opts = {"draft": draft, "draft_tokens": draft_tokens} if draft else {}
    if draft:
        require_torch(model, "--draft")
    follower = None
    if follow:
        from flywheel.serve.follow import load_following  # loads torch: only when following

        logging.basicConfig(
            stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
        )
        policy, follower = load_following(model, follow, **opts)
    else:
        policy = get_model(model, **opts)
    config = ServerConfig(batch_window_s=batch_window_ms / 1000, max_batch=max_batch)
    try:
        server, thread = serve_model(policy, host, port, config, follower)
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
