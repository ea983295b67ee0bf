"""A served model that follows the trainer's weight store (`flywheel serve --follow STORE`).

`load_following` loads a torch model (hf:PATH, smollm2-135m or a shipped base) in bf16, opens the store
(a path, `file://` or `s3://` URL; S3 endpoint and keys from the usual environment variables, see
`flywheel.sync.store`) and binds a `flywheel.sync.follow.Follower` to the model's tensors, loaded to the
latest published version (a LoRA run's store: its base, then the latest adapters merged in,
`flywheel.sync.adapters`). The server (`flywheel.serve.http`) then applies each version published after
in place between generation batches. A store that cannot be opened or read at start is refused
(`FlywheelError`); an empty one is waited on: the model's own weights are served, with no version, until
the first is published.

This module imports torch; `flywheel.serve` does not re-export it, so serving a model that follows
nothing does not load it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from flywheel.errors import FlywheelError
from flywheel.models import get_model, require_torch
from flywheel.sync import Retry, StoreError, open_store
from flywheel.sync.follow import Follower

log = logging.getLogger(__name__)

FOLLOW_POLL_S = 0.5  # how often a following server looks for a new version


def load_following(model: str, url: str, **opts: Any) -> tuple[Any, Follower]:
    """The torch model `model` in bf16 with a `Follower` of the store at `url`, loaded to its latest."""
    require_torch(model, "--follow")
    try:
        store = open_store(url, retry=Retry(attempts=3), read_retry=Retry(attempts=3))
    except (StoreError, OSError, ValueError, ImportError) as e:
        raise FlywheelError(f"cannot open the weight store {url}: {e}") from None
    policy = get_model(model, dtype=torch.bfloat16, **opts)
    cached = getattr(policy, "weights", None)  # the torch engine's packed matrices and prefix store
    follower = Follower(
        policy.model,
        store,
        name=model,
        poll_s=FOLLOW_POLL_S,
        prepare=cached.refresh if cached is not None else None,
    )
    try:
        version = follower.start()
    except StoreError as e:
        raise FlywheelError(f"cannot read the weight store {url}: {e}") from None
    if version is None:
        log.info("weights: nothing published in %s yet; serving %s until the first version", url, model)
    else:
        log.info("weights: serving version %d from %s", version, url)
    return policy, follower
