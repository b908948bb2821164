#!/usr/bin/env bash
# Throughput on one GPU (benchmarks/gpu.py): the 125M-parameter causal LM in bfloat16 (tokens/s,
# MFU), the seed figure's arms at the paper's size (24 layers, width 1024) in float16, and the
# K-run vmapped sweep against K sequential runs at the seed size, K = 8 and 64.
#
#   bash benchmarks/gpu.sh [--steps 20] [--ks 8,64]
#
# Needs a Python with this package's requirements and a CUDA jaxlib (`pip install -e .` then
# `pip install "jax[cuda12]"`), or PYTHON pointing at one. Writes docs/gpu/results.json and
# docs/gpu/results.txt (what it printed), the GPU named in both. Goals (docs/throughput.md):
# MFU >= 45% for the 125M model; K = 64 vmapped >= 10x the sequential run-steps/s.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "error: no nvidia-smi here: this benchmark needs an NVIDIA GPU" >&2
  exit 2
fi
mkdir -p docs/gpu
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee docs/gpu/results.txt
"$PYTHON" benchmarks/gpu.py --json docs/gpu/results.json "$@" 2>&1 | grep -v -i "warning" |
  tee -a docs/gpu/results.txt
