#!/usr/bin/env bash
# The prepared GPU check (benchmarks/gpu/README.md): engine vs `generate`, one RL step vs TRL, and SmolLM2-135M
# SFT then RL on toybugs, each part under its own time cap, figures in $OUT/gpu_check.json.
#
#   bash benchmarks/gpu/check.sh [--smoke] [--out DIR]    # DIR: $OUT if set, else runs/gpu-check
#   bash benchmarks/gpu/check.sh --stage                  # make the wheels and weights to copy (network)
#
# Python: $PYTHON if set, else .venv/bin/python where it exists, else python3 (the GPU machine's).
set -euo pipefail

started=$(date +%s.%N)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
if [[ -n "${PYTHON:-}" ]]; then
    py=$PYTHON
elif [[ -x .venv/bin/python ]]; then
    py=.venv/bin/python
else
    py=python3
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$py" benchmarks/gpu/check.py --started "$started" "$@"
