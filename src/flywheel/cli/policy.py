"""The policy a command names: its model from the options, and the harness settings it runs under.

Shared by `flywheel eval`, `flywheel solve` and `flywheel tasks curate`: one policy (`--model`) or a
Fusion pair (`--lead` and `--sidekick`), the torch engine's options (`--device`, `--dtype`, `--draft`,
`--threads`), and the harness settings a `flywheel sft` base learned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flywheel.errors import FlywheelError
from flywheel.models import get_model, is_torch, require_torch

if TYPE_CHECKING:
    from flywheel.harness import HarnessConfig
    from flywheel.protocols import Model


def check_roles(model: str | None, lead: str | None, sidekick: str | None) -> None:
    """Exactly one policy: `--model`, or `--lead` with `--sidekick` (Fusion)."""
    if bool(lead) != bool(sidekick) or bool(model) == bool(lead):
        raise FlywheelError("give --model, or --lead and --sidekick (Fusion)")


def engine_options(device: str, dtype: str, draft: str, draft_tokens: int, spec: str) -> dict[str, Any]:
    """The torch engine's options from `--device`, `--dtype` and `--draft` (refused unless `spec`, the
    policy that would use it, runs on the torch engine)."""
    from flywheel.models.hf import resolve_device, resolve_dtype

    engine = {"device": resolve_device(device, "--device").type, "dtype": resolve_dtype(dtype, "--dtype")}
    if draft:
        require_torch(spec, "--draft")
        engine.update(draft=draft, draft_tokens=draft_tokens)
    return engine


def set_threads(threads: int, *specs: str | None) -> None:
    """Give torch `threads` intra-op threads (0: its default) when one of `specs` runs on the torch engine."""
    if threads and any(is_torch(spec) for spec in specs if spec):
        import torch

        torch.set_num_threads(threads)


def model_from_options(spec: str, base_url: str | None, seed: int, engine: dict | None = None) -> Model:
    """The model named by `spec`: `base_url` for `openai:NAME`, `seed` for the scripted ones, `engine` (a
    torch engine model's device, dtype, draft) for the torch engine's."""
    opts = {"base_url": base_url} if spec.startswith("openai:") else {}
    if is_torch(spec):
        opts.update(engine or {})
    return get_model(spec, seed=seed, **opts) if spec.startswith("scripted") else get_model(spec, **opts)


def load_policy(
    spec: str,
    base_url: str | None,
    seed: int,
    temperature: float,
    top_p: float,
    cohorts: int,
    action_format: str = "auto",
    engine: dict | None = None,
) -> tuple[Model, HarnessConfig]:
    """The model named by `spec` and the harness settings it runs under (`action_format` other than
    "auto" wins over what the model says and what an SFT base learned; `engine`: a torch engine model's
    device and dtype)."""
    from flywheel.harness import HarnessConfig
    from flywheel.harness.agent import ACTION_FORMATS

    if action_format not in ACTION_FORMATS:
        raise FlywheelError(f"bad --action-format {action_format!r}: use {', '.join(ACTION_FORMATS)}")
    policy = model_from_options(spec, base_url, seed, engine)
    from flywheel.models.shipped import BASES, base_dir

    learned = {}
    if spec.startswith("hf:") or spec in BASES:  # a `flywheel sft` base runs under the harness it learned
        from flywheel.sft import trained_harness

        learned = trained_harness(f"hf:{base_dir(spec)}" if spec in BASES else spec)
    if action_format != "auto":
        learned["action_format"] = action_format
    return policy, HarnessConfig(temperature=temperature, top_p=top_p, cohorts=cohorts, **learned)
