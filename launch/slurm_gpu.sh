#!/usr/bin/env bash
# Submit a normstudy run to SLURM: one process per node (all its GPUs) or one per GPU. Before it
# submits, jax[cuda12] is installed into the job's environment if it lacks a CUDA backend
# (--no-install refuses instead); the job refuses to start when its python finds no GPU; its log
# goes to logs/normstudy-JOBID.out (sbatch detaches it from this shell), appended across requeues.
# Each task takes its GPUs from what SLURM shows it on the node (normstudy.engine.sharding's
# slurm_device_ids); a run stopped by its time limit or a preemption (it checkpoints on SLURM's
# TERM) is requeued, up to --max-requeues times, and resumes from its checkpoint.
usage="usage: launch/slurm_gpu.sh --config FILE[:VARIANT] --workdir DIR [--nodes 2]
       [--gpus-per-node 8] [--per-gpu] [--partition P] [--account A] [--qos Q]
       [--cpus-per-gpu N] [--mem 64G] [--time 24:00:00] [--max-requeues 3] [--venv .venv]
       [--no-install] [--shared-workdir] [--dry-run] [-- --config.a.b=value ...]"
set -euo pipefail
source "$(dirname "$0")/common.sh"

config="" workdir="" nodes=1 gpus=8 per_gpu=0 partition="" time_limit="24:00:00" venv=".venv"
install=1 shared=0 account="" qos="" cpus_per_gpu="" mem="" max_requeues=3
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need_value "$@"; config="$2"; shift 2 ;;
    --workdir) need_value "$@"; workdir="$2"; shift 2 ;;
    --nodes) need_value "$@"; nodes="$2"; shift 2 ;;
    --gpus-per-node) need_value "$@"; gpus="$2"; shift 2 ;;
    --per-gpu) per_gpu=1; shift ;;
    --partition) need_value "$@"; partition="$2"; shift 2 ;;
    --account) need_value "$@"; account="$2"; shift 2 ;;
    --qos) need_value "$@"; qos="$2"; shift 2 ;;
    --cpus-per-gpu) need_value "$@"; cpus_per_gpu="$2"; shift 2 ;;
    --mem) need_value "$@"; mem="$2"; shift 2 ;;
    --max-requeues) need_value "$@"; max_requeues="$2"; shift 2 ;;
    --time) need_value "$@"; time_limit="$2"; shift 2 ;;
    --venv) need_value "$@"; venv="$2"; shift 2 ;;
    --no-install) install=0; shift ;;
    --shared-workdir) shared=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    --) shift; break ;;
    *) echo "$usage" >&2; die "unknown option '$1'" ;;
  esac
done
[ -n "$config" ] && [ -n "$workdir" ] || { echo "$usage" >&2; die "--config and --workdir are required"; }
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "--nodes=$nodes is not a positive integer"
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node=$gpus is not a positive integer"
[[ "$max_requeues" =~ ^[0-9]+$ ]] || die "--max-requeues=$max_requeues is not an integer >= 0"
[ -z "$cpus_per_gpu" ] || [[ "$cpus_per_gpu" =~ ^[1-9][0-9]*$ ]] \
  || die "--cpus-per-gpu=$cpus_per_gpu is not a positive integer"
[ -f "${config%%:*}" ] || die "config file '${config%%:*}' does not exist"

repo="$(cd "$(dirname "$0")/.." && pwd)"
# A workdir on several nodes must be one directory they all see: on node-local disks each node
# would keep its own part of the checkpoints. gs:// is shared; a path is if its file system is
# a network or cluster one (or the user says so).
if [ "$nodes" -gt 1 ] && [ "$shared" = 0 ]; then
  case "$workdir" in
    gs://*) ;;
    *)
      existing="$workdir"
      while [ ! -e "$existing" ]; do existing="$(dirname "$existing")"; done
      fs="$(stat -f -c %T "$existing" 2>/dev/null || echo unknown)"
      case "$fs" in
        nfs*|lustre|gpfs|beegfs|cifs|smb*|ceph*|fuse*|panfs|wekafs|9p) ;;
        *) die "--workdir=$workdir is on a node-local file system ($fs) and the job has $nodes" \
             "nodes: use gs:// or a directory every node shares (or pass --shared-workdir)" ;;
      esac ;;
  esac
fi
# `make install` installs jax's CPU build: a GPU job with it trains on the CPU without a word.
if ! "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(0 if \
    any(u.find_spec(m) for m in ('jax_cuda12_plugin', 'jax_cuda13_plugin')) else 1)" >/dev/null 2>&1; then
  [ "$install" = 1 ] || die "$venv's jax has no CUDA backend: run $venv/bin/pip install -e '.[gpu]' first"
  # jax[cuda12] (setup.py's gpu extra) at the version this environment has, so the CUDA build
  # computes what the CPU one was tested with.
  jax_version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("jax"))' \
    2>/dev/null || true)"
  run "$venv/bin/python" -m pip install -q "jax[cuda12]${jax_version:+==$jax_version}" -e "$repo"
fi
tasks_per_node=1
[ "$per_gpu" = 1 ] && tasks_per_node="$gpus"
# The command's words, shell-quoted once, are positional parameters of each task's shell: no
# user text sits inside the quoted task script (labels may hold quotes and spaces).
args=("$venv/bin/python" -m normstudy.main --config="$config" --workdir="$workdir" "$@")
quoted_args="$(printf '%q ' "${args[@]}")"
# Which GPUs each task uses is decided on the node, from what SLURM shows the task there
# (normstudy.engine.sharding.slurm_device_ids): one task per node, every GPU it is shown; one per
# GPU, the one it is bound to, or its SLURM_LOCALID-th of the node's list. CUDA_VISIBLE_DEVICES is
# never rewritten: on a node without device cgroups a job given GPUs 4-7 keeps them.
mode=node
[ "$per_gpu" = 1 ] && mode=task
logs="$repo/logs"
[ "$DRY_RUN" = 1 ] || mkdir -p "$logs"
# The job's python must find the GPUs before anything trains (a CPU jax trains on the CPU).
gpu_check="$(printf '%q' "$venv/bin/python") -c 'import jax, sys; sys.exit(jax.default_backend() != \"gpu\")' \
>/dev/null || { echo \"error: the job's python finds no GPU (jax.default_backend() is not gpu)\" >&2; exit 2; }"
python_q="$(printf '%q' "$venv/bin/python")"
workdir_q="$(printf '%q' "$workdir")"
# After the step: a run that says it was preempted (SLURM's TERM at the time limit or a
# preemption; it checkpointed) goes back in the queue and resumes; any other end is final.
requeue="status=\$($python_q -c 'import sys; from normstudy.records import rundir; print(rundir.RunDir(sys.argv[1]).status() or \"\")' $workdir_q 2>/dev/null)
if [ \"\$status\" = preempted ] && [ \"\${SLURM_RESTART_COUNT:-0}\" -lt $max_requeues ]; then
  echo \"normstudy: the run was preempted (checkpointed): requeueing job \$SLURM_JOB_ID (restart \$((\${SLURM_RESTART_COUNT:-0} + 1)) of $max_requeues)\"
  scontrol requeue \"\$SLURM_JOB_ID\"
elif [ \"\$status\" = preempted ]; then
  echo \"normstudy: the run was preempted $max_requeues times: not requeued (submit the same command to resume)\" >&2
fi
exit \$code"
script="#!/bin/bash
#SBATCH --job-name=normstudy
#SBATCH --output=$logs/normstudy-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$tasks_per_node
#SBATCH --gpus-per-node=$gpus
#SBATCH --time=$time_limit
#SBATCH --signal=TERM@120
${partition:+#SBATCH --partition=$partition
}${account:+#SBATCH --account=$account
}${qos:+#SBATCH --qos=$qos
}${cpus_per_gpu:+#SBATCH --cpus-per-gpu=$cpus_per_gpu
}${mem:+#SBATCH --mem=$mem
}cd $(printf "%q" "$repo")
$gpu_check
export NORMSTUDY_SLURM_GPUS=$mode
srun --kill-on-bad-exit=1 --label $quoted_args
code=\$?
$requeue
"
if [ "$DRY_RUN" = 1 ]; then
  echo "sbatch <<'SCRIPT'"
  echo "$script"
  echo "SCRIPT"
  # What each task will use, decided on the node (on stderr: stdout is the script).
  if [ "$per_gpu" = 1 ]; then
    echo "each task: the one GPU it is shown, or its SLURM_LOCALID-th of the node's list" >&2
  else
    echo "each task: every GPU of its node it is shown" >&2
  fi
  echo "the job's devices: $((nodes * gpus)) GPUs in $((nodes * tasks_per_node)) processes" >&2
else
  echo "$script" | sed 's/^/#   /'
  sbatch <<<"$script"
fi
echo "the job runs detached; its log: $logs/normstudy-JOBID.out" >&2
