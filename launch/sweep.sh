#!/usr/bin/env bash
# One job per variant of a config file's study (its EXPERIMENT's study arms, else all), locally, on
# SLURM, or on TPU pods: normstudy.study's runs as separate jobs. With --grid: a sweep's grid
# (the file's SWEEP and any --axis in the normstudy options) as --shares tasks, each training
# its share of the grid's programs (normstudy.sweep --programs=I/N), then the sweep run whole,
# which trains nothing left and writes sweep.json and the analysis: locally one after another,
# on SLURM a job array and a job that depends on it. A search (--search=FIELD:LOW,HIGH among the
# normstudy options) goes one round at a time: an array per round (--round=r), each after the
# one before, then the analysis.
usage="usage: launch/sweep.sh --config FILE --workdir DIR [--launcher local|slurm|tpu]
       [--grid --shares N] [--dry-run] [-- LAUNCHER OPTIONS ... -- --config.a.b=value ...]"
set -euo pipefail
source "$(dirname "$0")/common.sh"

config="" workdir="" launcher="local" grid=0 shares=""
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need_value "$@"; config="$2"; shift 2 ;;
    --workdir) need_value "$@"; workdir="$2"; shift 2 ;;
    --launcher) need_value "$@"; launcher="$2"; shift 2 ;;
    --grid) grid=1; shift ;;
    --shares) need_value "$@"; shares="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    --) shift; break ;;
    *) echo "$usage" >&2; die "unknown option '$1'" ;;
  esac
done
[ -n "$config" ] && [ -n "$workdir" ] || { echo "$usage" >&2; die "--config and --workdir are required"; }
[ -f "$config" ] || die "config file '$config' does not exist"
case "$launcher" in local|slurm|tpu) ;; *) die "--launcher=$launcher is not one of: local, slurm, tpu" ;; esac

# Options before a second `--` go to the launcher, the rest to normstudy.
launcher_opts=() overrides=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher_opts+=("$1"); shift; done
[ $# -gt 0 ] && shift
overrides=("$@")

here="$(dirname "$0")"
python="${PYTHON:-$here/../.venv/bin/python}"
[ -x "$python" ] || python=python3

if [ "$grid" = 1 ]; then
  [[ "$shares" =~ ^[1-9][0-9]*$ ]] || die "--grid needs --shares N, a positive integer (got '${shares}')"
  case "$launcher" in local|slurm) ;; *) die "--grid runs on --launcher local or slurm" ;; esac
  # A search (--search among the normstudy options) is shared one round at a time: round r's
  # shares need every earlier round's runs, so round r's array waits for round r-1's.
  # With --probe_decades (not 0) a probe round follows the --rounds rounds.
  searching=0 rounds="" probing=0
  for ((k = 0; k < ${#overrides[@]}; k++)); do
    case "${overrides[k]}" in
      --search|--search=*) searching=1 ;;
      --rounds=*) rounds="${overrides[k]#--rounds=}" ;;
      --rounds) rounds="${overrides[k + 1]:-}" ;;
      --probe_decades=*) [[ "${overrides[k]#--probe_decades=}" =~ ^0*\.?0*$ ]] || probing=1 ;;
      --probe_decades) [[ "${overrides[k + 1]:-0}" =~ ^0*\.?0*$ ]] || probing=1 ;;
    esac
  done
  if [ "$searching" = 1 ]; then
    [ -n "$rounds" ] || rounds=$("$python" -c "from normstudy.experiments import search; print(search.DEFAULT_ROUNDS)")
    [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds=$rounds is not a positive integer"
    rounds=$((rounds + probing))
    round_flags=()
    for r in $(seq 1 "$rounds"); do round_flags+=("--round=$r"); done
  else
    round_flags=("")  # a grid: one array, no --round
  fi
  sweep=("$python" -m normstudy.sweep --config="$config" --workdir="$workdir" "${overrides[@]}")
  if [ "$launcher" = local ]; then
    for round_flag in "${round_flags[@]}"; do
      for i in $(seq 1 "$shares"); do
        run "${sweep[@]}" ${round_flag:+"$round_flag"} --programs="$i/$shares"
      done
    done
    run "${sweep[@]}"
    exit 0
  fi
  repo="$(cd "$here/.." && pwd)"
  # The job's shell starts in the repository: the interpreter by its absolute path.
  [[ "$python" == */* ]] && sweep[0]="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")"
  quoted="$(printf '%q ' "${sweep[@]}")"
  time_limit="24:00:00" partition=""
  set -- "${launcher_opts[@]}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --time) need_value "$@"; time_limit="$2"; shift 2 ;;
      --partition) need_value "$@"; partition="$2"; shift 2 ;;
      *) die "--grid on slurm takes --time and --partition; not '$1'" ;;
    esac
  done
  header="#SBATCH --time=$time_limit
#SBATCH --signal=TERM@120
${partition:+#SBATCH --partition=$partition
}cd $(printf "%q" "$repo")"
  final="#!/bin/bash
#SBATCH --job-name=normstudy-grid-analysis
$header
exec $quoted
"
  job="" previous="array job id"
  for round_flag in "${round_flags[@]}"; do
    name="normstudy-grid" && [ -n "$round_flag" ] && name="normstudy-search-round${round_flag#--round=}"
    array="#!/bin/bash
#SBATCH --job-name=$name
#SBATCH --array=1-$shares
$header
exec $quoted${round_flag:+$round_flag }--programs=\$SLURM_ARRAY_TASK_ID/$shares
"
    if [ "$DRY_RUN" = 1 ]; then
      echo "sbatch --parsable${job:+ --dependency=afterok:<$previous>} <<'SCRIPT'"
      echo "$array"; echo "SCRIPT"
      job="dry" previous="${round_flag:+round ${round_flag#--round=} }array job id"
    else
      job=$(sbatch --parsable ${job:+--dependency="afterok:$job"} <<<"$array")
      echo "submitted job array $job ($shares tasks${round_flag:+, search ${round_flag#--}})"
    fi
  done
  if [ "$DRY_RUN" = 1 ]; then
    echo "sbatch --dependency=afterok:<$previous> <<'SCRIPT'"; echo "$final"; echo "SCRIPT"
  else
    sbatch --dependency="afterok:$job" <<<"$final"
  fi
  exit 0
fi
variants=$("$python" -c "
import sys
from normstudy.experiments import grid
declared = grid.load_experiment(sys.argv[1])  # its EXPERIMENT's study arms
print(' '.join(declared.study_arms or declared.arms))" "$config")
[ -n "$variants" ] || die "$config declares no arms (its EXPERIMENT's)"

flag=()
[ "$DRY_RUN" = 1 ] && flag=(--dry-run)
for variant in $variants; do
  echo "# $variant"
  case "$launcher" in
    local) run "$python" -m normstudy.main --config="$config:$variant" \
             --workdir="$workdir/$variant" "${overrides[@]}" ;;
    slurm) "$here/slurm_gpu.sh" "${flag[@]}" "${launcher_opts[@]}" --config "$config:$variant" \
             --workdir "$workdir/$variant" -- "${overrides[@]}" ;;
    tpu) "$here/tpu_pod.sh" "${flag[@]}" "${launcher_opts[@]}" --config "$config:$variant" \
           --workdir "$workdir/$variant" -- "${overrides[@]}" ;;
  esac
done
