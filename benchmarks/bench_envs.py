"""Task environments: build time cold and warm, disk, and what an environment adds to a sandbox start.

    python benchmarks/bench_envs.py [--requirements "requests==2.32.3 attrs==25.3.0"] [--runs 50]

Three builds of one requirement set, each in a fresh environment cache directory (`$FLYWHEEL_ENV_CACHE`):
cold (empty uv cache: every package downloaded), warm (uv's cache kept, the environment made again) and
reuse (the environment already built: `ensure` only finds it). Then `true` and `python -c pass` in the
sandbox, `--runs` times each, without an environment and with the built one mounted, interleaved in one
process; medians and p95 in milliseconds, and the ratio. Cold builds download from the package index.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from flywheel.protocols import Environment
from flywheel.sandbox import get_sandbox
from flywheel.sandbox.envs import ensure


def du_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout.split()
    return int(out[0]) / 1024 if out else 0.0


def timed_build(environment: Environment) -> float:
    start = time.perf_counter()
    ensure(environment, label="bench")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requirements", default="requests==2.32.3 attrs==25.3.0")
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    environment = Environment(requirements=tuple(args.requirements.split()))
    root = Path(tempfile.mkdtemp(prefix="bench-envs-"))
    os.environ["FLYWHEEL_ENV_CACHE"] = str(root)
    try:
        cold = timed_build(environment)
        built = ensure(environment)
        env_mb, cache_mb = du_mb(built.path), du_mb(root / "uv-cache")
        shutil.rmtree(built.path)
        warm = timed_build(environment)
        reuse = timed_build(environment)
        total_mb = du_mb(root)

        sandbox = get_sandbox()
        ws = Path(tempfile.mkdtemp(prefix="bench-envs-ws-"))
        times: dict[str, list[float]] = {}
        for _ in range(args.runs):
            for argv_name, argv in (("true", ["true"]), ("python", ["python", "-c", "pass"])):
                for env_name, env in (("without", None), ("with", environment)):
                    result = sandbox.run(ws, argv, environment=env)
                    assert result.exit_code == 0, result.output
                    times.setdefault(f"{argv_name} {env_name}", []).append(result.wall_s * 1000)
        shutil.rmtree(ws, ignore_errors=True)
        starts = {
            k: {"median_ms": statistics.median(v), "p95_ms": sorted(v)[int(0.95 * (len(v) - 1))]}
            for k, v in times.items()
        }
        for name in ("true", "python"):
            with_, without = starts[f"{name} with"]["median_ms"], starts[f"{name} without"]["median_ms"]
            starts[f"{name} ratio with/without"] = round(with_ / without, 3)
        print(
            json.dumps(
                {
                    "sandbox": sandbox.name,
                    "requirements": list(environment.requirements),
                    "build_s": {
                        "cold": round(cold, 2),
                        "warm_uv_cache": round(warm, 2),
                        "reuse": round(reuse, 4),
                    },
                    "disk_mb": {
                        "environment": round(env_mb, 1),
                        "uv_cache": round(cache_mb, 1),
                        "all": round(total_mb, 1),
                    },
                    "start": starts,
                },
                indent=1,
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
