#!/usr/bin/env bash
# Run the GPU bench from the repository root: bash bench/gpu/run.sh [STEP ...]
# Env: OUT (./gpu-out), ARTIFACTS (bench/gpu/carry/artifacts); the rest: bench/gpu/gpu_bench.py and README.md.
# Installs .whl/*.whl (when that folder exists) into /tmp/site and puts it on PYTHONPATH (gpu_bench.py does it).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OUT="${OUT:-./gpu-out}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
exec "${PYTHON:-python3}" bench/gpu/gpu_bench.py "$@"
