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

Tool calls: a served model whose chat template defines a call syntax (`flywheel.models.chat_formats`:
Qwen2.5 and Qwen3's `<tool_call>`, Llama 3.1 and 3.2's JSON, Mistral's `[TOOL_CALLS]`) answers a request
that offers `tools` with OpenAI `tool_calls` read from its text, and reads a conversation's `tool_calls`
and `tool` messages through its template; other models' tagged actions and fenced shell blocks become
calls of the offered tools, as before. The syntax (and, for a torch model, which forward generates) is
printed on stderr at start.

Log-probs (`"logprobs": true`): `--logprobs-mode processed`, the default, reports each token's log-prob
under the distribution it was sampled from (after temperature and top-p: 0 for a greedy token), the
numbers the engine records with no extra work and the ones the trainer's replay compares against, which a
pool that follows the trainer must report (so `--follow` takes no other); `raw` reports the model's own
softmax, as vLLM does by default (its `logprobs_mode`), at the price of one more forward per answer. A
request chooses for itself with the non-standard field `"logprobs_mode": "raw"` (or `"processed"`).

`--api-key KEY` (or the environment variable `FLYWHEEL_API_KEY`, which keeps the key out of the process
list) makes every request without `Authorization: Bearer KEY` get 401, except `GET /health`, which then
answers only `status` and `policy_version` (`flywheel.serve.auth`); an OpenAI client passes it as its
`api_key`, the loop's `http` backend as `[loop] pool_api_key`. Serving on a host other than loopback
without a key prints one warning line on stderr.

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
from flywheel.serve.auth import exposure_warning
from flywheel.settings import API_KEY_ENV


def serve(
    model: str = typer.Option(..., "--model", help=f"{SPECS}."),
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
    logprobs_mode: str = typer.Option(
        "processed",
        "--logprobs-mode",
        help="Whose log-probs `logprobs: true` returns unless the request says: processed (the sampling "
        "distribution's, what the trainer replays) or raw (the model's own, as vLLM's default; one more "
        "forward per answer).",
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar=API_KEY_ENV,
        show_envvar=True,
        help="Answer only requests that carry 'Authorization: Bearer KEY' (GET /health answers anyone, with "
        "its status and weights version only).",
    ),
) -> None:
    """Serve MODEL at http://HOST:PORT/v1 (chat completions, models) until interrupted."""
    opts = {"draft": draft, "draft_tokens": draft_tokens} if draft else {}
    if draft:
        require_torch(model, "--draft")
    config = ServerConfig(
        batch_window_s=batch_window_ms / 1000,
        max_batch=max_batch,
        logprobs_mode=logprobs_mode,
        api_key=api_key,
    )
    if logprobs_mode == "raw":
        _check_raw(model, follow)
    policy, follower = _load(model, follow, opts)
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
        if warning := exposure_warning(host, api_key):
            typer.echo(warning, err=True)
        for line in _described(policy, server):
            typer.echo(line, err=True)
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        typer.echo("stopping", err=True)
    finally:
        server.close()


def _load(model: str, follow: str, opts: dict):
    """The policy to serve and, with `follow`, the follower that keeps its weights at the store's newest."""
    if not follow:
        return get_model(model, **opts), None
    from flywheel.serve.follow import load_following  # loads torch: only when following

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return load_following(model, follow, **opts)


def _check_raw(model: str, follow: str) -> None:
    """Refuse `--logprobs-mode raw` where it cannot serve: a model without weights in process, or a server
    that feeds the trainer, whose replay compares against the sampling distribution's log-probs."""
    require_torch(model, "--logprobs-mode raw")
    if follow:
        raise FlywheelError(
            "--logprobs-mode raw: a server that follows the trainer reports the sampling distribution's "
            "log-probs, which its replay compares against (a request may still ask for raw ones)"
        )


def _described(policy, server) -> list[str]:
    """What a user should know about how the model is served: its forward, its tool-call syntax."""
    lines = [f"forward: {policy.path}"] if isinstance(getattr(policy, "path", None), str) else []
    if server.syntax is not None:
        lines.append(f"tool calls: the chat template's {server.syntax.name} syntax")
    elif getattr(policy, "tokenizer", None) is not None:
        lines.append("tool calls: the chat template defines none; tagged actions and shell blocks are read")
    return lines


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
