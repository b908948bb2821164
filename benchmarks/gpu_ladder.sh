#!/usr/bin/env bash
# The ladder's next width rungs on one GPU within one lease (`benchmarks/lease.py ladder` has the
# plan): 4 x 256, 4 x 512, 4 x 1024 and 24 x 1024 (16 heads of 64) for plain Pre-LN and DeepNorm
# in float16, one vmapped program per (arm, rung). It prints its programs, estimated time and
# disk need first and refuses in one line when either does not fit; outputs append to
# docs/gpu/ladder/<UTC time>_<GPU>/.
#
#   bash benchmarks/gpu_ladder.sh [--dry-run] [--keep-checkpoints] [--workdir DIR]
#
# --dry-run needs no GPU: the plan and its estimate from docs/gpu/results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
dry=0
for arg in "$@"; do [ "$arg" = --dry-run ] && dry=1; done
if [ "$dry" = 0 ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "error: no nvidia-smi here: the GPU ladder needs an NVIDIA GPU (--dry-run prints its plan)" >&2
  exit 2
fi
exec "$PYTHON" benchmarks/lease.py ladder "$@"
