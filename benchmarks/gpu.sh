#!/usr/bin/env bash
# Throughput on one GPU (benchmarks/gpu.py): the 125M-parameter causal LM in bfloat16 (tokens/s,
# MFU), the seed figure's arms at the paper's size (24 layers, width 1024) in float16, and the
# K-run vmapped sweep against K sequential runs at the seed size, K = 8 and 64.
#
#   bash benchmarks/gpu.sh [--steps 20] [--ks 8,64] [--sections matmul,gpt_125m_bf16,...]
#
# Then `benchmarks/gpu.py attention`: one layer's attention core at the 125M shape, normstudy's
# against jax's and cuDNN's fused kernel, set against the 125M step just measured
# (docs/gpu/attention.json).
#
# Needs a Python with this package's requirements and a CUDA jaxlib (`pip install -e .` then
# `pip install "jax[cuda12]"`), or PYTHON pointing at one. Each run appends a directory of its
# own, docs/gpu/runs/<UTC date and time>_<GPU>/ (results.json, results.txt: what it printed,
# attention.json, attention.txt), the GPU named in each; no earlier result is overwritten
# (docs/gpu/results.json and attention.json are the first run's, an H200). Goals
# (docs/throughput.md): MFU >= 45% for the 125M model; K = 64 vmapped >= 10x the sequential
# run-steps/s.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "error: no nvidia-smi here: this benchmark needs an NVIDIA GPU" >&2
  exit 2
fi
device="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr -cs 'A-Za-z0-9' '-' \
  | sed 's/-*$//')"
out="docs/gpu/runs/$(date -u +%Y-%m-%dT%H%M%SZ)_${device:-gpu}"
while [ -e "$out" ]; do out="$out-again"; done  # two runs in one second: neither overwritten
mkdir -p "$out"
echo "this run's results: $out/" >&2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/results.txt"
status=0  # a failed part does not stop the rest; the script exits with the first failure
"$PYTHON" benchmarks/gpu.py --json "$out/results.json" "$@" 2>&1 | grep -v -i "warning" |
  tee -a "$out/results.txt" || status=$?
step_ms=$("$PYTHON" -c 'import json, sys; r = json.load(open(sys.argv[1])).get("gpt_125m_bf16")
print(r["ms_per_step"] if r else "")' "$out/results.json" 2>/dev/null || true)
"$PYTHON" benchmarks/gpu.py attention --json "$out/attention.json" ${step_ms:+--step_ms "$step_ms"} 2>&1 |
  grep -v -i "warning" | tee "$out/attention.txt" || { failed=$?; [ "$status" -ne 0 ] || status=$failed; }
exit "$status"
