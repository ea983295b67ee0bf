"""`flywheel delta encode|apply|inspect` on real safetensors files, through the real entry point."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file, save_file
from sync_helpers import bitwise, make_weights, ulp_step


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def flywheel(capsys):
    """Run `flywheel delta ...` through the CLI's own `main`, in process (importing torch once)."""
    from flywheel.cli import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main(["delta", *args])
        out = capsys.readouterr()
        return Result(int(exit_info.value.code or 0), out.out, out.err)

    return run


def test_encode_apply_inspect(tmp_path, flywheel):
    old = make_weights()
    new = ulp_step(old, 0.05)
    save_file(old, tmp_path / "old.safetensors")
    save_file({n: t.float() for n, t in new.items()}, tmp_path / "new.safetensors")  # fp32: cast exactly back
    r = flywheel(
        "encode",
        str(tmp_path / "old.safetensors"),
        str(tmp_path / "new.safetensors"),
        "--out",
        str(tmp_path / "d.fwd"),
    )
    assert r.returncode == 0, r.stderr
    assert "cast 4 non-bf16 tensors" in r.stderr
    r = flywheel(
        "apply",
        str(tmp_path / "old.safetensors"),
        str(tmp_path / "d.fwd"),
        "--out",
        str(tmp_path / "out.safetensors"),
    )
    assert r.returncode == 0, r.stderr
    assert bitwise(load_file(tmp_path / "out.safetensors"), new)
    r = flywheel("inspect", str(tmp_path / "d.fwd"), "--json")
    summary = json.loads(r.stdout)
    assert summary["changed"] == sum(
        int((old[n].view(torch.int16) != new[n].view(torch.int16)).sum()) for n in old
    )
    assert "bits/changed" in flywheel("inspect", str(tmp_path / "d.fwd"), "--verbose").stdout


def test_bad_input_exits_2_without_output(tmp_path, flywheel):
    old = make_weights()
    save_file(old, tmp_path / "old.safetensors")
    save_file({"other": torch.zeros(3, dtype=torch.bfloat16)}, tmp_path / "other.safetensors")
    out = tmp_path / "out.safetensors"
    cases = [
        (
            "encode",
            str(tmp_path / "missing.safetensors"),
            str(tmp_path / "old.safetensors"),
            "--out",
            str(tmp_path / "d"),
        ),
        (
            "encode",
            str(tmp_path / "old.safetensors"),
            str(tmp_path / "other.safetensors"),
            "--out",
            str(tmp_path / "d"),
        ),
        ("inspect", str(tmp_path / "old.safetensors")),
    ]
    save_file(ulp_step(old, 0.1), tmp_path / "new.safetensors")
    assert (
        flywheel(
            "encode",
            str(tmp_path / "old.safetensors"),
            str(tmp_path / "new.safetensors"),
            "--out",
            str(tmp_path / "d.fwd"),
        ).returncode
        == 0
    )
    blob = bytearray((tmp_path / "d.fwd").read_bytes())
    blob[-7] ^= 0x10
    (tmp_path / "bad.fwd").write_bytes(bytes(blob))
    cases.append(("apply", str(tmp_path / "old.safetensors"), str(tmp_path / "bad.fwd"), "--out", str(out)))
    cases.append(("apply", str(tmp_path / "other.safetensors"), str(tmp_path / "d.fwd"), "--out", str(out)))
    for args in cases:
        r = flywheel(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "d").exists() and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.fwd",
        "d.fwd",
        "new.safetensors",
        "old.safetensors",
        "other.safetensors",
    ]
