"""`flywheel delta encode|apply|inspect`: weight deltas between safetensors files.

Inputs must hold floating-point tensors; any that are not bf16 are cast to bf16 (round to nearest) with a
note on stderr, since deltas carry the bf16 weights inference serves. Integer tensors are refused. Outputs
are written to a temporary file beside the target and renamed, so a failure never leaves a partial file.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from flywheel.errors import FlywheelError
from flywheel.files import writing

app = typer.Typer(help="Encode, apply and inspect bf16 weight deltas.", no_args_is_help=True)


def load_bf16(path: Path) -> dict:
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise FlywheelError(f"{path}: no such file")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise FlywheelError(f"{path}: not a safetensors file ({str(exc).splitlines()[0]})") from None
    cast = sorted(n for n, t in tensors.items() if t.dtype != torch.bfloat16)
    for name in cast:
        if not tensors[name].is_floating_point():
            raise FlywheelError(
                f"{path}: tensor {name} has dtype {tensors[name].dtype}; deltas carry bf16 weights only"
            )
        tensors[name] = tensors[name].to(torch.bfloat16)
    if cast:
        typer.echo(f"note: {path}: cast {len(cast)} non-bf16 tensors to bf16 (e.g. {cast[0]})", err=True)
    return {n: t.contiguous() for n, t in tensors.items()}


def read_blob(path: Path) -> bytes:
    if not path.is_file():
        raise FlywheelError(f"{path}: no such file")
    return path.read_bytes()


@app.command()
def encode(
    old: Path = typer.Argument(..., help="The base weights (safetensors)."),
    new: Path = typer.Argument(..., help="The new weights (safetensors), same tensor names and shapes."),
    out: Path = typer.Option(..., "--out", help="Where to write the delta."),
    version: int = typer.Option(1, help="Version number of NEW."),
    base_version: int = typer.Option(0, help="Version number of OLD."),
    mode: str = typer.Option("auto", help="Value coding: auto, diff, xor or raw."),
    level: int = typer.Option(1, help="zstd level."),
) -> None:
    """Write the delta that turns OLD into NEW, bitwise."""
    from flywheel.sync.codec import encode_delta, summarize

    if mode not in ("auto", "diff", "xor", "raw"):
        raise FlywheelError(f"--mode {mode!r}: expected auto, diff, xor or raw")
    blob = encode_delta(
        load_bf16(old),
        load_bf16(new),
        version=version,
        base_version=base_version,
        value_mode=mode,
        level=level,
    )  # type: ignore[arg-type]
    with writing(out) as tmp:
        tmp.write_bytes(blob)
    s = summarize(blob)
    typer.echo(
        f"{out}: {s['bytes']} bytes, {s['changed']} of {s['weights']} weights changed ({s['changed_fraction']:.4%})"
    )


@app.command()
def apply(
    base: Path = typer.Argument(..., help="The base weights (safetensors)."),
    delta: Path = typer.Argument(..., help="The delta to apply."),
    out: Path = typer.Option(..., "--out", help="Where to write the result (safetensors)."),
    expect_base: int | None = typer.Option(
        None, help="Refuse a delta whose base version differs (default: trust the delta's)."
    ),
) -> None:
    """Apply DELTA to BASE, verify the result against the delta's checksums, write OUT."""
    from safetensors.torch import save_file

    from flywheel.sync.codec import apply_delta, read_manifest

    blob = read_blob(delta)
    manifest = read_manifest(blob)
    weights = load_bf16(base)
    base_v = expect_base if expect_base is not None else int(manifest.get("base_version", -1))
    version = apply_delta(weights, blob, expect_base=base_v)
    with writing(out) as tmp:
        save_file(weights, tmp, metadata={"format": "pt", "flywheel_version": str(version)})
    typer.echo(f"{out}: version {version}")


@app.command()
def inspect(
    delta: Path = typer.Argument(..., help="A delta (or anchor) file."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print one line per tensor."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
) -> None:
    """Print a delta's changed fraction, size and bits per changed weight."""
    from flywheel.sync.codec import summarize

    s = summarize(read_blob(delta))
    if as_json:
        typer.echo(json.dumps(s if verbose else {k: v for k, v in s.items() if k != "tensors"}))
        return
    bpc = f"{s['bits_per_changed']:.2f}" if s["bits_per_changed"] else "-"
    typer.echo(f"{s['kind']} {s['base_version']} -> {s['version']} ({s['value_mode']})")
    typer.echo(f"  changed     {s['changed']} of {s['weights']} weights ({s['changed_fraction']:.4%})")
    typer.echo(
        f"  bytes       {s['bytes']} ({s['bytes'] / max(1, s['full_bf16_bytes']):.4%} of the full bf16 checkpoint)"
    )
    typer.echo(f"  bits/changed {bpc}")
    if verbose:
        for t in s["tensors"]:
            typer.echo(
                f"  {t['name']}: {t['changed']}/{t['numel']} ({t['changed'] / max(1, t['numel']):.3%})"
            )
