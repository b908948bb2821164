#!/usr/bin/env bash
# Run normstudy on every worker of a Cloud TPU VM slice, for the slice's whole life: created
# (on demand, Spot, or through a queued resource), the code and this machine's versions copied
# once, a Python 3.11 environment with jax[tpu] on every worker, the run detached there (a
# dropped ssh connection does not stop it) with its log appended to ~/normstudy/run.log on each
# worker and copied to the workdir's bucket as it goes (WORKDIR/launch_logs/worker-N.log). Later, from
# any machine: --status, --logs, --stop (the run checkpoints). --watch stays with the run and,
# when the slice is preempted (a preempted Spot VM must be deleted and created again: Cloud TPU
# docs, "Spot VMs"), recreates it and launches the same run, which resumes from its checkpoint
# in the bucket (Levanter's launch.py keeps a run alive the same way).
usage="usage: launch/tpu_pod.sh --name NAME --zone ZONE --config FILE[:VARIANT] --workdir gs://BUCKET/DIR
       [--accelerator v4-32] [--version RUNTIME] [--create [--spot | --queued]] [--watch
       [--poll 60] [--max-recreates 10]] [--follow] [--collect LOCAL_DIR] [--delete] [--dry-run]
       [-- --config.a.b=value ...]
       launch/tpu_pod.sh --name NAME --zone ZONE [--workdir gs://BUCKET/DIR] --status | --stop
       launch/tpu_pod.sh --workdir gs://BUCKET/DIR --logs [--worker 0]"
set -euo pipefail
source "$(dirname "$0")/common.sh"

name="" zone="" config="" workdir="" accelerator="v4-32" version=""
create=0 delete=0 collect="" follow=0 spot=0 queued=0 watch=0 poll=60 max_recreates=10
action=launch worker=0
while [ $# -gt 0 ]; do
  case "$1" in
    --name) need_value "$@"; name="$2"; shift 2 ;;
    --zone) need_value "$@"; zone="$2"; shift 2 ;;
    --config) need_value "$@"; config="$2"; shift 2 ;;
    --workdir) need_value "$@"; workdir="$2"; shift 2 ;;
    --accelerator) need_value "$@"; accelerator="$2"; shift 2 ;;
    --version) need_value "$@"; version="$2"; shift 2 ;;
    --create) create=1; shift ;;
    --spot) spot=1; shift ;;
    --queued) queued=1; shift ;;
    --watch) watch=1; shift ;;
    --poll) need_value "$@"; poll="$2"; shift 2 ;;
    --max-recreates) need_value "$@"; max_recreates="$2"; shift 2 ;;
    --delete) delete=1; shift ;;
    --follow) follow=1; shift ;;
    --collect) need_value "$@"; collect="$2"; shift 2 ;;
    --status|--logs|--stop)
      [ "$action" = launch ] || die "$1 and --$action: one action at a time"
      action="${1#--}"; shift ;;
    --worker) need_value "$@"; worker="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    --) shift; break ;;
    *) echo "$usage" >&2; die "unknown option '$1'" ;;
  esac
done
case "$action" in
  launch)
    [ -n "$name" ] && [ -n "$zone" ] && [ -n "$config" ] && [ -n "$workdir" ] || {
      echo "$usage" >&2; die "--name, --zone, --config and --workdir are required"; } ;;
  status|stop)
    [ -n "$name" ] && [ -n "$zone" ] || { echo "$usage" >&2; die "--$action needs --name and --zone"; } ;;
  logs)
    [ -n "$workdir" ] || { echo "$usage" >&2; die "--logs needs --workdir (the run's gs:// directory)"; } ;;
esac
if [ -n "$workdir" ]; then
  case "$workdir" in gs://*) ;; *) die "--workdir=$workdir must be a gs:// path every worker can write" ;; esac
fi
workdir="${workdir%/}"
# The run is detached on the workers: what waits for its end (collecting, deleting the slice)
# must follow it, or watch it.
if [ "$follow" = 0 ] && [ "$watch" = 0 ] && { [ -n "$collect" ] || [ "$delete" = 1 ]; }; then
  die "--collect and --delete wait for the run to end: add --follow or --watch"
fi
if { [ "$spot" = 1 ] || [ "$queued" = 1 ]; } && [ "$create" = 0 ] && [ "$watch" = 0 ]; then
  die "--spot and --queued say how the slice is created: add --create (or --watch)"
fi
[[ "$poll" =~ ^[1-9][0-9]*$ ]] || die "--poll=$poll is not a positive number of seconds"
[[ "$max_recreates" =~ ^[0-9]+$ ]] || die "--max-recreates=$max_recreates is not an integer >= 0"
[[ "$worker" =~ ^[0-9]+$ ]] || die "--worker=$worker is not a worker number (0, 1, ...)"

tpu=(gcloud compute tpus tpu-vm)
# Whether a process is going, on a worker: it exists and is not a zombie (an exited run whose
# parent, the ssh session, is gone stays one until init reaps it). PID_ is replaced.
going='{ s_=$(ps -o stat= -p PID_ 2>/dev/null); case "$s_" in ""|Z*) false ;; *) true ;; esac; }'
# Each worker's pid file and the test "is the run going": one definition for every action.
alive="${going//PID_/\"\$(cat ~/normstudy/run.pid 2>/dev/null)\"}"

if [ "$action" = logs ]; then
  # The copy each worker keeps in the bucket (a minute behind at most; whole once the run ends).
  run gcloud storage cat "$workdir/launch_logs/worker-$worker.log"
  exit 0
fi
if [ "$action" = status ]; then
  state="$("${tpu[@]}" describe "$name" --zone="$zone" --format='value(state)' 2>/dev/null)" \
    || state="not found"
  echo "slice $name ($zone): ${state:-unknown}"
  if [ "$state" = READY ]; then
    run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command \
      "if $alive; then echo \"\$(hostname): the run is going (pid \$(cat ~/normstudy/run.pid))\"; \
else echo \"\$(hostname): no run going\"; fi; tail -n 1 ~/normstudy/run.log 2>/dev/null || true"
  fi
  if [ -n "$workdir" ]; then
    run gcloud storage cat "$workdir/run.json" 2>/dev/null || echo "$workdir/run.json: not written yet"
  fi
  exit 0
fi
if [ "$action" = stop ]; then
  # SIGTERM: every worker checkpoints its step and exits (normstudy.engine.train), run.json says
  # "preempted", and the same launch resumes it.
  run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command \
    "if $alive; then kill -TERM \"\$(cat ~/normstudy/run.pid)\" && echo \"\$(hostname): stopping \
(the run checkpoints its step)\"; else echo \"\$(hostname): no run going\"; fi"
  exit 0
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

create_slice() {
  local kind=()
  [ "$spot" = 1 ] && kind=(--spot)
  if [ "$queued" = 1 ]; then
    # A queued resource waits for capacity instead of failing at once (Cloud TPU docs, "Manage
    # queued resources"); the slice exists once its state is ACTIVE.
    run gcloud compute tpus queued-resources create "$name" --node-id="$name" --zone="$zone" \
      --accelerator-type="$accelerator" --runtime-version="$version" "${kind[@]}"
    if [ "$DRY_RUN" = 0 ]; then
      local state=""
      until [ "$state" = ACTIVE ]; do
        state="$(gcloud compute tpus queued-resources describe "$name" --zone="$zone" \
          --format='value(state.state)' 2>/dev/null || echo unknown)"
        case "$state" in
          FAILED|SUSPENDED) die "queued resource $name is $state: see gcloud compute tpus queued-resources describe $name --zone=$zone" ;;
          ACTIVE) ;;
          *) echo "queued resource $name: $state (waiting for capacity)" >&2; sleep "$poll" ;;
        esac
      done
    fi
  else
    run "${tpu[@]}" create "$name" --zone="$zone" --accelerator-type="$accelerator" \
      --version="$version" "${kind[@]}"
  fi
}

delete_slice() {
  if [ "$queued" = 1 ]; then
    run gcloud compute tpus queued-resources delete "$name" --zone="$zone" --force --quiet
  else
    run "${tpu[@]}" delete "$name" --zone="$zone" --quiet
  fi
}

archive="/tmp/normstudy-$name.tar.gz"
constraints="/tmp/normstudy-$name-constraints.txt"
jax_version="$("$repo/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("jax"))' \
  2>/dev/null || true)"
jax_tpu="jax[tpu]${jax_version:+==$jax_version}"

install_code() {
  # The code travels as a git archive of HEAD: what is committed is what runs.
  run git -C "$repo" archive --format=tar.gz -o "$archive" HEAD
  if [ "$DRY_RUN" = 0 ]; then
    # Every package pinned (constraints, so nothing extra installs): the workers resolve nothing
    # of their own.
    "$repo/.venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null \
      | grep -vE '^(-e |libtpu)' > "$constraints" || true
  fi
  run "${tpu[@]}" scp "$archive" "$constraints" "$name:~/" --zone="$zone" --worker=all
  # The runtime images' Python is 3.10 and normstudy needs >= 3.11: uv brings a 3.11 venv, then
  # jax[tpu] at this machine's jax version (libtpu with it) and normstudy, every version pinned
  # by the constraints.
  run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command \
    "mkdir -p ~/normstudy && tar -xzf ~/$(basename "$archive") -C ~/normstudy && \
(command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh) && \
~/.local/bin/uv venv -q --allow-existing --python 3.11 ~/normstudy/.venv && \
~/.local/bin/uv pip install -q --python ~/normstudy/.venv/bin/python '$jax_tpu' -e ~/normstudy \
-c ~/$(basename "$constraints")"
}

# NORMSTUDY_TPU_POD: every worker joins one jax.distributed job (JAX reads the slice's workers
# from the TPU VM's metadata; normstudy.engine.sharding.initialize_distributed). setsid and nohup
# detach it from the ssh session; its output is appended to run.log (a relaunch keeps the log
# of the runs before it), its pid goes to run.pid. Beside it, a copier puts run.log in the
# bucket every minute and once more when the run ends. The braces put only the run in the
# background: with `cd && setsid ... &` the whole list was a background subshell that kept
# ssh's output open, and ssh waited for the run to end.
train="NORMSTUDY_TPU_POD=1 .venv/bin/python -m normstudy.main --config=$(printf '%q' "$config") \
--workdir=$(printf '%q' "$workdir")"
for override in "$@"; do train+=" $(printf '%q' "$override")"; done
worker_id='${NORMSTUDY_WORKER_ID:-$(curl -sf --max-time 2 -H Metadata-Flavor:Google http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || hostname)}'
log_copy="gcloud storage cp -q ~/normstudy/run.log $(printf '%q' "$workdir")/launch_logs/worker-\$worker.log"
copier="worker=$worker_id; while ${going//PID_/\$0}; do $log_copy; \
for i in \$(seq \${NORMSTUDY_LOG_COPY_EVERY:-60}); do ${going//PID_/\$0} || break; sleep 1; done; \
done; $log_copy"
# A recreated slice has new disks: its run.log starts from the bucket's copy, so the log keeps
# every life of the run.
fetch_log="{ [ -f run.log ] || gcloud storage cp -q $(printf '%q' "$workdir")/launch_logs/worker-\$worker.log run.log \
>/dev/null 2>&1 || true; }"
start="cd ~/normstudy && worker=$worker_id && $fetch_log && { setsid nohup bash -c $(printf '%q' "$train") >> run.log 2>&1 < /dev/null & \
echo \$! > ~/normstudy/run.pid; } && { setsid nohup bash -c $(printf '%q' "$copier") \
\"\$(cat ~/normstudy/run.pid)\" > /dev/null 2>&1 < /dev/null & }"
# A second launch while a run is going would put two runs in one workdir and lose the first
# one's pid: refused on every worker before anything is copied there.
guard="if $alive; then echo \"error: a run is already going on \$(hostname) (pid \
\$(cat ~/normstudy/run.pid)): launch/tpu_pod.sh --name $name --zone $zone --stop first\" >&2; exit 2; fi"

launch_run() {
  run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command "$guard"
  install_code
  run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command "$start"
  echo "the run is detached on every worker; its log: ~/normstudy/run.log on each, copied to $workdir/launch_logs/" >&2
}

# The run's recorded status (run.json in the bucket), or "" before it has one.
run_status() {
  gcloud storage cat "$workdir/run.json" 2>/dev/null | python3 -c \
    'import json, sys; print(json.load(sys.stdin).get("status", ""))' 2>/dev/null || true
}

watch_run() {
  # Levanter's loop: while the run has not ended, a slice that is gone or preempted is deleted,
  # created again and the same run launched, which resumes from its newest checkpoint. A slice
  # that is up with no run going (stopped with --stop, or crashed) ends the watch after two
  # looks a poll apart (a preemption's SIGTERM comes a little before the state says so).
  local recreates=0 idle=0 state status going
  while :; do
    sleep "$poll"
    status="$(run_status)"
    case "$status" in
      finished|halted|diverged) echo "the run ended: $status ($workdir/run.json)" >&2; return 0 ;;
    esac
    state="$("${tpu[@]}" describe "$name" --zone="$zone" --format='value(state)' 2>/dev/null)" \
      || state=NOT_FOUND
    if [ "$state" = READY ]; then
      going="$("${tpu[@]}" ssh "$name" --zone="$zone" --worker=0 --command \
        "if $alive; then echo yes; else echo no; fi" 2>/dev/null)" || going=unknown
      if [ "$going" = no ]; then
        idle=$((idle + 1))
        if [ "$idle" -ge 2 ]; then
          echo "the slice is up and no run is going (status: ${status:-none}): not a preemption;" \
            "the same command resumes it" >&2
          return 1
        fi
      else
        idle=0
      fi
      continue
    fi
    case "$state" in
      CREATING|STARTING|RESTARTING|REPAIRING) continue ;;
    esac
    recreates=$((recreates + 1))
    if [ "$recreates" -gt "$max_recreates" ]; then
      die "slice $name is $state after $max_recreates recreations (--max-recreates): stopped watching"
    fi
    echo "slice $name is $state: recreating it ($recreates of $max_recreates); the run resumes" \
      "from its checkpoint in $workdir" >&2
    [ "$state" = NOT_FOUND ] || delete_slice
    create_slice
    launch_run
    idle=0
  done
}

[ "$create" = 1 ] && create_slice
launch_run
if [ "$follow" = 1 ]; then
  # Worker 0's log until its process exits (tail --pid), whatever becomes of this connection.
  run "${tpu[@]}" ssh "$name" --zone="$zone" --worker=0 --command \
    "tail -n +1 --pid=\$(cat ~/normstudy/run.pid) -F ~/normstudy/run.log"
fi
if [ "$watch" = 1 ]; then
  if [ "$DRY_RUN" = 1 ]; then
    echo "then every $poll s: the run's status ($workdir/run.json) and the slice's state; a" \
      "preempted or missing slice is deleted, created and the run launched again (at most" \
      "$max_recreates times)" >&2
  else
    watch_run
  fi
fi
if [ -n "$collect" ]; then
  run gcloud storage rsync --recursive --exclude='.*/checkpoints/.*' "$workdir" "$collect"
fi
if [ "$delete" = 1 ]; then
  delete_slice
fi
