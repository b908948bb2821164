#!/usr/bin/env bash
# One job per variant of a config file's study (its STUDY_VARIANTS, else VARIANTS), locally, on
# SLURM, or on TPU pods: normstudy.study's runs as separate jobs.
usage="usage: launch/sweep.sh --config FILE --workdir DIR [--launcher local|slurm|tpu]
       [--dry-run] [-- LAUNCHER OPTIONS ... -- --config.a.b=value ...]"
set -euo pipefail
source "$(dirname "$0")/common.sh"

config="" workdir="" launcher="local"
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need_value "$@"; config="$2"; shift 2 ;;
    --workdir) need_value "$@"; workdir="$2"; shift 2 ;;
    --launcher) need_value "$@"; launcher="$2"; shift 2 ;;
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
variants=$("$python" -c "
import importlib.util, sys
spec = importlib.util.spec_from_file_location('sweep_config', sys.argv[1])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
print(' '.join(getattr(module, 'STUDY_VARIANTS', None) or getattr(module, 'VARIANTS', ())))" "$config")
[ -n "$variants" ] || die "$config lists no VARIANTS"

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
