#!/usr/bin/env bash
# Submit a normstudy run to SLURM: one process per node (all its GPUs) or one per GPU.
usage="usage: launch/slurm_gpu.sh --config FILE[:VARIANT] --workdir DIR [--nodes 2]
       [--gpus-per-node 8] [--per-gpu] [--partition P] [--time 24:00:00] [--venv .venv]
       [--dry-run] [-- --config.a.b=value ...]"
set -euo pipefail
source "$(dirname "$0")/common.sh"

config="" workdir="" nodes=1 gpus=8 per_gpu=0 partition="" time_limit="24:00:00" venv=".venv"
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need_value "$@"; config="$2"; shift 2 ;;
    --workdir) need_value "$@"; workdir="$2"; shift 2 ;;
    --nodes) need_value "$@"; nodes="$2"; shift 2 ;;
    --gpus-per-node) need_value "$@"; gpus="$2"; shift 2 ;;
    --per-gpu) per_gpu=1; shift ;;
    --partition) need_value "$@"; partition="$2"; shift 2 ;;
    --time) need_value "$@"; time_limit="$2"; shift 2 ;;
    --venv) need_value "$@"; venv="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    --) shift; break ;;
    *) echo "$usage" >&2; die "unknown option '$1'" ;;
  esac
done
[ -n "$config" ] && [ -n "$workdir" ] || { echo "$usage" >&2; die "--config and --workdir are required"; }
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "--nodes=$nodes is not a positive integer"
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node=$gpus is not a positive integer"
[ -f "${config%%:*}" ] || die "config file '${config%%:*}' does not exist"

repo="$(cd "$(dirname "$0")/.." && pwd)"
# `make install` installs jax's CPU build: a GPU job with it trains on the CPU without a word.
if [ "$DRY_RUN" = 0 ] && ! "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(0 if \
    any(u.find_spec(m) for m in ('jax_cuda12_plugin', 'jax_cuda13_plugin')) else 1)"; then
  die "$venv's jax has no CUDA backend: run $venv/bin/pip install -e '.[gpu]' first"
fi
case "$workdir" in
  gs://*) ;;
  *) [ "$nodes" -gt 1 ] && echo "warning: --workdir=$workdir is a local path on $nodes nodes: use a" \
       "directory every node shares (or gs://), or each node keeps its own part of the checkpoints" >&2 ;;
esac
tasks_per_node=1
[ "$per_gpu" = 1 ] && tasks_per_node="$gpus"
# The command's words, shell-quoted once, are positional parameters of each task's shell: no
# user text sits inside the quoted task script (labels may hold quotes and spaces).
args=("$venv/bin/python" -m normstudy.main --config="$config" --workdir="$workdir" "$@")
quoted_args="$(printf '%q ' "${args[@]}")"
# JAX reads SLURM_* itself (jax.distributed.initialize() with no arguments); per GPU, each task
# sees only its own device.
visible=""
[ "$per_gpu" = 1 ] && visible='export CUDA_VISIBLE_DEVICES=$SLURM_LOCALID; '
script="#!/bin/bash
#SBATCH --job-name=normstudy
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$tasks_per_node
#SBATCH --gpus-per-node=$gpus
#SBATCH --time=$time_limit
#SBATCH --signal=TERM@120
${partition:+#SBATCH --partition=$partition
}cd $(printf "%q" "$repo")
srun bash -c '${visible}exec \"\$@\"' normstudy $quoted_args
"
if [ "$DRY_RUN" = 1 ]; then
  echo "sbatch <<'SCRIPT'"
  echo "$script"
  echo "SCRIPT"
else
  echo "$script" | sed 's/^/#   /'
  sbatch <<<"$script"
fi
