#!/usr/bin/env bash
# Run normstudy on every worker of a Cloud TPU VM pod.
usage="usage: launch/tpu_pod.sh --name NAME --zone ZONE --config FILE[:VARIANT] --workdir gs://BUCKET/DIR
       [--accelerator v4-32] [--version tpu-ubuntu2204-base] [--create] [--delete]
       [--collect LOCAL_DIR] [--dry-run] [-- --config.a.b=value ...]"
set -euo pipefail
source "$(dirname "$0")/common.sh"

name="" zone="" config="" workdir="" accelerator="v4-32" version="tpu-ubuntu2204-base"
create=0 delete=0 collect=""
while [ $# -gt 0 ]; do
  case "$1" in
    --name) need_value "$@"; name="$2"; shift 2 ;;
    --zone) need_value "$@"; zone="$2"; shift 2 ;;
    --config) need_value "$@"; config="$2"; shift 2 ;;
    --workdir) need_value "$@"; workdir="$2"; shift 2 ;;
    --accelerator) need_value "$@"; accelerator="$2"; shift 2 ;;
    --version) need_value "$@"; version="$2"; shift 2 ;;
    --create) create=1; shift ;;
    --delete) delete=1; shift ;;
    --collect) need_value "$@"; collect="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    --) shift; break ;;
    *) echo "$usage" >&2; die "unknown option '$1'" ;;
  esac
done
[ -n "$name" ] && [ -n "$zone" ] && [ -n "$config" ] && [ -n "$workdir" ] || {
  echo "$usage" >&2; die "--name, --zone, --config and --workdir are required"; }
case "$workdir" in gs://*) ;; *) die "--workdir=$workdir must be a gs:// path every worker can write" ;; esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
tpu=(gcloud compute tpus tpu-vm)
if [ "$create" = 1 ]; then
  run "${tpu[@]}" create "$name" --zone="$zone" --accelerator-type="$accelerator" --version="$version"
fi
# The code travels as a git archive of HEAD: what is committed is what runs.
archive="/tmp/normstudy-$name.tar.gz"
run git -C "$repo" archive --format=tar.gz -o "$archive" HEAD
run "${tpu[@]}" scp "$archive" "$name:~/normstudy.tar.gz" --zone="$zone" --worker=all
run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command \
  "mkdir -p ~/normstudy && tar -xzf ~/normstudy.tar.gz -C ~/normstudy && pip install -q -e ~/normstudy[tpu]"
# No distributed flags: on a pod, normstudy lets JAX detect the workers itself.
command="cd ~/normstudy && python3 -m normstudy.main --config=$config --workdir=$workdir"
for override in "$@"; do command+=" $(printf '%q' "$override")"; done
run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command "$command"
if [ -n "$collect" ]; then
  run gcloud storage rsync --recursive --exclude='.*/checkpoints/.*' "$workdir" "$collect"
fi
if [ "$delete" = 1 ]; then
  run "${tpu[@]}" delete "$name" --zone="$zone" --quiet
fi
