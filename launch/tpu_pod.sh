#!/usr/bin/env bash
# Run normstudy on every worker of a Cloud TPU VM pod: the code and this machine's versions
# copied once, a Python 3.11 environment with jax[tpu] on every worker, the run detached there
# (a dropped ssh connection does not stop it) with its log in ~/normstudy/run.log on each worker;
# --follow streams worker 0's log until the run ends (then --collect and --delete may follow).
usage="usage: launch/tpu_pod.sh --name NAME --zone ZONE --config FILE[:VARIANT] --workdir gs://BUCKET/DIR
       [--accelerator v4-32] [--version RUNTIME] [--create] [--follow] [--collect LOCAL_DIR]
       [--delete] [--dry-run] [-- --config.a.b=value ...]"
set -euo pipefail
source "$(dirname "$0")/common.sh"

name="" zone="" config="" workdir="" accelerator="v4-32" version=""
create=0 delete=0 collect="" follow=0
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
    --follow) follow=1; shift ;;
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
# The run is detached on the workers: what waits for its end (collecting, deleting the pod) must
# follow it.
if [ "$follow" = 0 ] && { [ -n "$collect" ] || [ "$delete" = 1 ]; }; then
  die "--collect and --delete wait for the run to end: add --follow"
fi

# Each TPU generation has its own runtime image (Cloud TPU docs, "TPU software versions").
if [ -z "$version" ]; then
  case "$accelerator" in
    v4-*) version="tpu-ubuntu2204-base" ;;
    v5litepod-*) version="v2-alpha-tpuv5-lite" ;;
    v5p-*) version="v2-alpha-tpuv5" ;;
    v6e-*) version="v2-alpha-tpuv6e" ;;
    *) die "--accelerator=$accelerator: no default runtime for it; pass --version" ;;
  esac
fi

repo="$(cd "$(dirname "$0")/.." && pwd)"
tpu=(gcloud compute tpus tpu-vm)
if [ "$create" = 1 ]; then
  run "${tpu[@]}" create "$name" --zone="$zone" --accelerator-type="$accelerator" --version="$version"
fi
# The code travels as a git archive of HEAD: what is committed is what runs.
archive="/tmp/normstudy-$name.tar.gz"
run git -C "$repo" archive --format=tar.gz -o "$archive" HEAD
# The versions of this machine's environment, so every worker trains with the same stack.
constraints="/tmp/normstudy-$name-constraints.txt"
jax_version="$("$repo/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("jax"))' \
  2>/dev/null || true)"
jax_tpu="jax[tpu]${jax_version:+==$jax_version}"
if [ "$DRY_RUN" = 0 ]; then
  # Every package pinned (constraints, so nothing extra installs): the workers resolve nothing
  # of their own.
  "$repo/.venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null \
    | grep -vE '^(-e |libtpu)' > "$constraints" || true
fi
run "${tpu[@]}" scp "$archive" "$constraints" "$name:~/" --zone="$zone" --worker=all
# The runtime images' Python is 3.10 and normstudy needs >= 3.11: uv brings a 3.11 venv, then
# jax[tpu] at this machine's jax version (libtpu with it) and normstudy, every version pinned by
# the constraints.
run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command \
  "mkdir -p ~/normstudy && tar -xzf ~/$(basename "$archive") -C ~/normstudy && \
(command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh) && \
~/.local/bin/uv venv -q --python 3.11 ~/normstudy/.venv && \
~/.local/bin/uv pip install -q --python ~/normstudy/.venv/bin/python '$jax_tpu' -e ~/normstudy \
-c ~/$(basename "$constraints")"
# NORMSTUDY_TPU_POD: every worker joins one jax.distributed job (JAX reads the pod's workers
# from the TPU VM's metadata; normstudy.engine.sharding.initialize_distributed). setsid and
# nohup detach it from the ssh session; its output goes to run.log, its pid to run.pid. The
# braces put only the run in the background: with `cd && setsid ... &` the whole list was a
# background subshell that kept ssh's output open, and ssh waited for the run to end.
train="NORMSTUDY_TPU_POD=1 .venv/bin/python -m normstudy.main --config=$(printf '%q' "$config") \
--workdir=$(printf '%q' "$workdir")"
for override in "$@"; do train+=" $(printf '%q' "$override")"; done
command="cd ~/normstudy && { setsid nohup bash -c $(printf '%q' "$train") > run.log 2>&1 < /dev/null & \
echo \$! > ~/normstudy/run.pid; }"
run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command "$command"
echo "the run is detached on every worker; its log: ~/normstudy/run.log on each" >&2
if [ "$follow" = 1 ]; then
  # Worker 0's log until its process exits (tail --pid), whatever becomes of this connection.
  run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=0 --command \
    "tail -n +1 --pid=\$(cat ~/normstudy/run.pid) -F ~/normstudy/run.log"
fi
if [ -n "$collect" ]; then
  run gcloud storage rsync --recursive --exclude='.*/checkpoints/.*' "$workdir" "$collect"
fi
if [ "$delete" = 1 ]; then
  run "${tpu[@]}" delete "$name" --zone="$zone" --quiet
fi
