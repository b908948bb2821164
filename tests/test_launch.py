"""Launch scripts: --dry-run prints the exact commands; bad usage is one line and exit 2."""

import json
import os
import re
import sys
import subprocess
import shutil
import time

import pytest

from normstudy.experiments.search import DEFAULT_ROUNDS
import runs


def _launch(script, *args):
  return subprocess.run(["bash", os.path.join(runs.REPO, "launch", script), *args],
                        cwd=runs.REPO, capture_output=True, text=True, timeout=runs.bound(120))


def _words(line):
  """The argv a printed (shell-quoted) command line stands for, as bash reads it."""
  out = subprocess.run(["bash", "-c", 'eval "words=($1)"; printf "%s\\0" "${words[@]}"', "_",
                        line], capture_output=True, text=True, check=True).stdout
  return out.split("\0")[:-1]


def test_tpu_pod_dry_run_prints_every_step():
  result = _launch("tpu_pod.sh", "--name", "pod1", "--zone", "us-central2-b", "--config",
                   "configs/seed_figure.py:pre_norm_clip1", "--workdir", "gs://bucket/study",
                   "--create", "--follow", "--delete", "--collect", "runs/pod1", "--dry-run",
                   "--", "--config.train.num_steps=100")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].startswith("gcloud compute tpus tpu-vm create pod1 --zone=us-central2-b "
                             "--accelerator-type=v4-32")
  assert any(l.startswith("git -C ") and "archive" in l for l in lines)
  guard, install, train, follow = [_words(l) for l in lines if " ssh pod1 " in l]
  assert "--worker=all" in install and "--worker=all" in train and "--worker=0" in follow
  assert "--worker=all" in guard and "a run is already going" in guard[-1]
  assert "setsid nohup bash -c" in train[-1] and "> run.log 2>&1 < /dev/null &" in train[-1]
  assert "normstudy.main --config=configs/seed_figure.py:pre_norm_clip1" in train[-1].replace(
      "\\", "")
  assert "tail -n +1 --pid=$(cat ~/normstudy/run.pid) -F ~/normstudy/run.log" == follow[-1]
  assert lines[-2].startswith("gcloud storage rsync") and lines[-2].endswith("runs/pod1")
  assert lines[-1] == "gcloud compute tpus tpu-vm delete pod1 --zone=us-central2-b --quiet"
  assert "detached on every worker" in result.stderr


@pytest.mark.slow
def test_tpu_pod_workers_run_detached_with_every_argument_intact(tmp_path):
  """The command each worker runs, run here by bash with a stand-in python: it returns at once,
  the run goes on with its pid in run.pid and its output in run.log, labels with quotes and
  spaces intact, and NORMSTUDY_TPU_POD set (every worker joins one distributed job)."""
  label = "--config.label=a b's \"run\""
  result = _launch("tpu_pod.sh", "--name", "pod1", "--zone", "z", "--config",
                   "configs/seed_figure.py:pre_norm_clip1", "--workdir", "gs://b/s",
                   "--dry-run", "--", label)
  train = _words(next(l for l in result.stdout.splitlines() if "setsid" in l))[-1]
  python = tmp_path / "normstudy" / ".venv" / "bin" / "python"
  python.parent.mkdir(parents=True)
  python.write_text('#!/bin/bash\nsleep 0.5\necho "pod=$NORMSTUDY_TPU_POD"\n'
                    'printf "%s\\n" "$@"\n')
  python.chmod(0o755)
  subprocess.run(["bash", "-c", train], env=dict(os.environ, HOME=str(tmp_path)), check=True,
                 timeout=runs.bound(10))
  pid = int((tmp_path / "normstudy" / "run.pid").read_text())
  while os.path.exists(f"/proc/{pid}"):  # the detached run, still going after bash returned
    time.sleep(0.1)
  assert (tmp_path / "normstudy" / "run.log").read_text().splitlines() == [
      "pod=1", "-m", "normstudy.main", "--config=configs/seed_figure.py:pre_norm_clip1",
      "--workdir=gs://b/s", label]


FAKE_GCLOUD = """#!/bin/bash
# Stands in for gcloud: `... ssh NAME --command CMD` runs the command that starts the run (the one
# with setsid) here, its output read through a pipe as ssh reads the remote session's: the pipe
# ends only when every process holding it has closed it. Everything else succeeds at once.
command=""
while [ $# -gt 0 ]; do
  if [ "$1" = --command ]; then command="$2"; fi
  shift
done
case "$command" in *setsid*) bash -c "$command" | cat ;; esac
exit 0
"""


def test_tpu_pod_returns_as_soon_as_every_worker_has_started_the_run(tmp_path):
  """A fake gcloud whose session lasts as long as anything holds its output, and a run that
  takes 30 s: the launch returns in under 2 s, the run going on detached."""
  import shutil
  repo = tmp_path / "repo"
  shutil.copytree(os.path.join(runs.REPO, "launch"), repo / "launch")
  venv_python = repo / ".venv" / "bin" / "python"  # the launching machine's: answers at once
  venv_python.parent.mkdir(parents=True)
  venv_python.write_text("#!/bin/sh\necho 0.0\n")
  venv_python.chmod(0o755)
  for command in (["init", "-q"], ["add", "-A"],
                  ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
    subprocess.run(["git", "-C", str(repo), *command], check=True, capture_output=True)
  home = tmp_path / "home"
  worker_python = home / "normstudy" / ".venv" / "bin" / "python"  # the run: 30 s
  worker_python.parent.mkdir(parents=True)
  worker_python.write_text("#!/bin/sh\nsleep 30\n")
  worker_python.chmod(0o755)
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  (fake_bin / "gcloud").write_text(FAKE_GCLOUD)
  (fake_bin / "gcloud").chmod(0o755)
  start = time.monotonic()
  launch = subprocess.Popen(
      ["bash", str(repo / "launch" / "tpu_pod.sh"), "--name", "p", "--zone", "z", "--config",
       "c", "--workdir", "gs://b/s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True,
      env=dict(os.environ, HOME=str(home), PATH=f"{fake_bin}:{os.environ['PATH']}"))
  try:
    _, stderr = launch.communicate(timeout=10)
  except subprocess.TimeoutExpired:
    os.killpg(launch.pid, 9)
    launch.communicate()
    pytest.fail("tpu_pod.sh waited for the run: it had not returned after 10 s")
  elapsed = time.monotonic() - start
  pid = int((home / "normstudy" / "run.pid").read_text())
  try:
    assert launch.returncode == 0, stderr
    assert elapsed < 2, elapsed
    assert os.path.exists(f"/proc/{pid}")  # the run goes on after the launch returned
  finally:
    os.killpg(os.getpgid(pid), 9) if os.path.exists(f"/proc/{pid}") else None


def test_tpu_pod_waits_for_the_run_only_when_following_it():
  result = _launch("tpu_pod.sh", "--name", "p", "--zone", "z", "--config", "c", "--workdir",
                   "gs://b/s", "--delete", "--dry-run")
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr.strip() == ("error: --collect and --delete wait for the run to end: add "
                                   "--follow or --watch")


def test_slurm_dry_run_prints_the_batch_script():
  result = _launch("slurm_gpu.sh", "--config", "configs/lm.py:small", "--workdir", "runs/lm",
                   "--nodes", "4", "--gpus-per-node", "8", "--per-gpu", "--shared-workdir",
                   "--dry-run")
  assert result.returncode == 0, result.stderr
  out = result.stdout[result.stdout.index("sbatch <<'SCRIPT'"):]  # after the jax[cuda12] install
  assert "#SBATCH --nodes=4" in out and "#SBATCH --ntasks-per-node=8" in out
  assert "CUDA_VISIBLE_DEVICES" not in out  # SLURM's, never rewritten (issue 86)
  assert "export NORMSTUDY_SLURM_GPUS=task" in out
  for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=TERM@120"):
    assert line in out.splitlines()
  assert "srun --kill-on-bad-exit=1 --label " in out
  assert "-m normstudy.main --config=configs/lm.py:small --workdir=runs/lm" in out
  passed = _launch("slurm_gpu.sh", "--config", "configs/lm.py:small", "--workdir", "runs/lm",
                   "--account", "proj1", "--qos", "high", "--cpus-per-gpu", "12", "--mem",
                   "200G", "--partition", "gpu", "--dry-run")
  assert passed.returncode == 0, passed.stderr
  for line in ("#SBATCH --account=proj1", "#SBATCH --qos=high", "#SBATCH --cpus-per-gpu=12",
               "#SBATCH --mem=200G", "#SBATCH --partition=gpu"):
    assert line in passed.stdout.splitlines()
  bare = _launch("slurm_gpu.sh", "--config", "configs/lm.py:small", "--workdir", "runs/lm",
                 "--dry-run").stdout
  assert "--account" not in bare and "--qos" not in bare and "--mem" not in bare


@pytest.mark.parametrize("mode, shown, on_node, local, expected", [
    # One task per node: every GPU it is shown, numbered from 0 as CUDA numbers them.
    ("node", "0,1,2,3,4,5,6,7", None, 0, list(range(8))),
    ("node", "0,1,2,3", None, 0, [0, 1, 2, 3]),  # a 4-GPU node, whatever the login node said
    ("node", "4,5,6,7", None, 0, [0, 1, 2, 3]),  # no cgroups, the job owns GPUs 4-7
    ("node", None, "4", 0, [0, 1, 2, 3]),  # no CUDA_VISIBLE_DEVICES: SLURM's count
    # One task per GPU, bound (--gpus-per-task, --gpu-bind, per-task cgroups): the one shown.
    ("task", "0", None, 3, [0]),
    ("task", "6", None, 2, [0]),
    # One task per GPU shown the node's list: its SLURM_LOCALID-th (cgroups or none).
    ("task", "0,1,2,3", None, 2, [2]),
    ("task", "4,5,6,7", None, 3, [3]),  # ordinal 3 is GPU 7, the job's own
])
def test_a_slurm_task_takes_its_gpus_from_what_slurm_shows_it(mode, shown, on_node, local,
                                                              expected):
  """launch/slurm_gpu.sh's rule, evaluated on the node (issue 86): CUDA numbers the devices
  CUDA_VISIBLE_DEVICES lists 0..n-1, so the ordinal a task uses is a position in SLURM's list."""
  from normstudy.engine import sharding
  env = {sharding.SLURM_GPUS_ENV: mode, "SLURM_LOCALID": str(local)}
  if shown is not None:
    env["CUDA_VISIBLE_DEVICES"] = shown
  if on_node is not None:
    env["SLURM_GPUS_ON_NODE"] = on_node
  assert sharding.local_device_ids(env) == expected
  if shown is not None and mode == "task":  # the physical GPU: the job's own, never another's
    assert shown.split(",")[expected[0]] in shown.split(",")
    if len(shown.split(",")) > 1:
      assert shown.split(",")[expected[0]] == shown.split(",")[local]
  assert sharding.local_device_ids({**env, sharding.LOCAL_DEVICES_ENV: "5"}) == [5]  # outright


@pytest.mark.parametrize("env, message", [
    ({"NORMSTUDY_SLURM_GPUS": "task", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_LOCALID": "2"},
     "SLURM task 2 of its node is shown 2 GPUs (CUDA_VISIBLE_DEVICES=0,1): one task per GPU "
     "needs at most as many tasks per node as GPUs"),
    ({"NORMSTUDY_SLURM_GPUS": "node", "CUDA_VISIBLE_DEVICES": ""},
     "this SLURM task is shown no GPU (CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE are unset or "
     "empty): ask for GPUs (--gpus-per-node)"),
    ({"NORMSTUDY_SLURM_GPUS": "gpu"}, "NORMSTUDY_SLURM_GPUS='gpu' is not allowed; allowed: node, "
     "task"),
])
def test_a_slurm_task_the_rule_cannot_place_is_refused_in_one_line(env, message):
  from normstudy.engine import sharding
  from normstudy.errors import UserError
  with pytest.raises(UserError) as refused:
    sharding.local_device_ids(env)
  assert str(refused.value) == message


def test_processes_holding_different_numbers_of_devices_are_refused():
  """Nodes with 4 GPUs and with 2 in one job: a mesh of 6 no per-process axis splits evenly."""
  import types
  from normstudy.engine import sharding
  from normstudy.errors import UserError
  devices = [types.SimpleNamespace(process_index=p) for p in [0] * 4 + [1] * 2]
  with pytest.raises(UserError, match=r"different numbers of devices \(process 0: 4, process "
                     r"1: 2\)"):
    sharding.check_even_devices(devices)
  sharding.check_even_devices([types.SimpleNamespace(process_index=p) for p in [0, 0, 1, 1]])


def test_a_multi_task_job_outside_srun_says_so_in_one_line(tmp_path):
  """`sbatch --ntasks=2` running `python -m normstudy.main` in its script (no srun step): one
  line, not JAX's ValueError about coordinator_address."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  env.update(SLURM_JOB_ID="77", SLURM_NTASKS="2", SLURM_PROCID="0", SLURM_LOCALID="0")
  result = subprocess.run([sys.executable, "-m", "normstudy.main", "--config=configs/lm.py:small",
                           f"--workdir={tmp_path / 'run'}", "--config.train.num_steps=2"],
                          cwd=runs.REPO, env=env, capture_output=True, text=True,
                          timeout=runs.bound(120))
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [
      "error: this SLURM job has 2 tasks but this process runs outside an srun step "
      "(SLURM_STEP_NODELIST is unset): start each task with srun (launch/slurm_gpu.sh does), or "
      "ask for one task"]
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("per_gpu", [False, True])
def test_each_slurm_task_is_told_its_devices_and_the_mesh_spans_the_job(tmp_path, per_gpu):
  """The batch script's srun line, run as each task of a simulated job (SLURM's variables, local
  processes on 127.0.0.1, CPU devices standing in for the GPUs a task sees; SLURM's
  CUDA_VISIBLE_DEVICES as a node without cgroups sets it for a job owning GPUs 4-7): one task
  per node uses every device it is shown; per GPU, its SLURM_LOCALID-th of the list. The
  variable is left as SLURM set it."""
  import json
  import random
  import re
  layout = (["--nodes", "1", "--gpus-per-node", "2", "--per-gpu"] if per_gpu
            else ["--nodes", "2", "--gpus-per-node", "4", "--shared-workdir"])
  result = _launch("slurm_gpu.sh", "--config", "configs/lm.py:small", "--workdir", "w",
                   "--venv", ".venv", "--dry-run", *layout)
  assert result.returncode == 0, result.stderr
  mode = re.search(r"export NORMSTUDY_SLURM_GPUS=(\w+)", result.stdout).group(1)
  tasks = 2
  shown = "4,5" if per_gpu else "4,5,6,7"
  seen = len(shown.split(","))
  job = str(random.randrange(4096))  # JAX's coordinator port comes from the job id
  flags = os.environ.get("XLA_FLAGS", "")
  procs = []
  for task in range(tasks):
    env = dict(os.environ, SLURM_JOB_ID=job, SLURM_STEP_NODELIST="localhost",
               SLURM_NTASKS=str(tasks), SLURM_PROCID=str(task),
               SLURM_LOCALID=str(task if per_gpu else 0), CUDA_VISIBLE_DEVICES=shown,
               NORMSTUDY_SLURM_GPUS=mode, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
               XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={seen}",
               PYTHONPATH=os.path.join(runs.REPO, "tests"), JAX_PLATFORMS="cpu")
    procs.append(subprocess.Popen(
        [os.path.join(runs.REPO, ".venv", "bin", "python"),
         os.path.join(runs.REPO, "tests", "slurm_probe.py")], cwd=runs.REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  for task, proc in enumerate(procs):
    out, err = proc.communicate(timeout=runs.bound(120))
    assert proc.returncode == 0, err[-2000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["joined"] and got["process_index"] == task and got["process_count"] == tasks
    assert got["cuda_visible_devices"] == shown  # as SLURM set it
    assert got["devices"] == got["mesh"] == tasks * got["local_devices"]
    assert got["local_device_ids"] == ([task] if per_gpu else list(range(4)))
    # JAX's persistent cache serves process 0 alone: off, so every process starts together.
    assert got["compile_cache"] is None


def test_a_preempted_slurm_run_is_requeued_and_a_finished_one_is_not(tmp_path):
  """The batch script's end, run here: a fake srun leaves the run's run.json as the run would
  (preempted by SLURM's TERM at the time limit, or finished); a fake scontrol records the
  requeue. Preempted: requeued, until SLURM_RESTART_COUNT reaches --max-requeues."""
  import json
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  workdir = tmp_path / "run"
  (fake_bin / "srun").write_text(
      "#!/bin/sh\nmkdir -p \"$RUN\"\nprintf '{\"status\": \"%s\"}' \"$ENDS\" > \"$RUN/run.json\"\n")
  (fake_bin / "scontrol").write_text("#!/bin/sh\necho \"$@\" >> \"$CALLS\"\n")
  for tool in ("srun", "scontrol"):
    (fake_bin / tool).chmod(0o755)
  result = _launch("slurm_gpu.sh", "--config", "configs/lm.py:small", "--workdir", str(workdir),
                   "--venv", os.path.join(runs.REPO, ".venv"), "--max-requeues", "2", "--dry-run")
  script = result.stdout[result.stdout.index("sbatch <<'SCRIPT'"):].splitlines()[1:-1]
  body = "\n".join(l for l in script if "default_backend" not in l)  # no GPU here
  for ends, restarts, requeued in (("preempted", "0", True), ("preempted", "1", True),
                                   ("preempted", "2", False), ("finished", "0", False)):
    calls = tmp_path / f"calls_{ends}_{restarts}"
    ran = subprocess.run(["bash"], input=body, capture_output=True, text=True,
                         timeout=runs.bound(60), cwd=runs.REPO,
                         env=dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}", RUN=str(workdir),
                                  ENDS=ends, CALLS=str(calls), SLURM_JOB_ID="4242",
                                  SLURM_RESTART_COUNT=restarts))
    assert ran.returncode == 0, ran.stderr
    assert json.loads((workdir / "run.json").read_text())["status"] == ends
    if requeued:
      assert calls.read_text().split() == ["requeue", "4242"]
      assert f"requeueing job 4242 (restart {int(restarts) + 1} of 2)" in ran.stdout
    else:
      assert not calls.exists()
    limit = "the run was preempted 2 times: not requeued (submit the same command to resume)"
    assert (limit in ran.stderr) == (ends == "preempted" and not requeued)


def test_sweep_starts_one_job_per_variant():
  result = _launch("sweep.sh", "--config", "configs/seed_figure.py", "--workdir", "runs/sweep",
                   "--dry-run", "--", "--", "--config.train.num_steps=10")
  assert result.returncode == 0, result.stderr
  jobs = [l for l in result.stdout.splitlines() if "normstudy.main" in l]
  variants = ("pre_norm_clip10", "pre_norm_clip1", "post_norm_deepnorm_clip1",
              "pre_norm_attn_relax_clip1")
  assert len(jobs) == 4
  for job, variant in zip(jobs, variants):
    assert f"--config=configs/seed_figure.py:{variant} --workdir=runs/sweep/{variant} " \
           "--config.train.num_steps=10" in job
  slurm = _launch("sweep.sh", "--config", "configs/seed_figure.py", "--workdir", "runs/s",
                  "--launcher", "slurm", "--dry-run", "--", "--nodes", "2",
                  "--shared-workdir")
  assert slurm.stdout.count("sbatch <<'SCRIPT'") == 4 and "#SBATCH --nodes=2" in slurm.stdout


def test_a_grid_goes_to_slurm_as_a_job_array_then_its_analysis():
  result = _launch("sweep.sh", "--config", "configs/survival.py", "--workdir", "runs/g",
                   "--grid", "--shares", "4", "--launcher", "slurm", "--dry-run", "--",
                   "--time", "2:00:00", "--", "--config.train.num_steps=10")
  assert result.returncode == 0, result.stderr
  array, final = result.stdout.split("sbatch --dependency=afterok:<array job id>")
  assert "#SBATCH --array=1-4" in array and "#SBATCH --time=2:00:00" in array
  command = ("-m normstudy.sweep --config=configs/survival.py --workdir=runs/g "
             "--config.train.num_steps=10")
  assert f"{command} --programs=$SLURM_ARRAY_TASK_ID/4" in array
  assert f"{command} \n" in final and "--programs" not in final  # the whole sweep: the record
  local = _launch("sweep.sh", "--config", "configs/survival.py", "--workdir", "runs/g", "--grid",
                  "--shares", "2", "--dry-run")
  lines = [l for l in local.stdout.splitlines() if "normstudy.sweep" in l]
  assert [l.split()[-1] for l in lines] == ["--programs=1/2", "--programs=2/2",
                                            "--workdir=runs/g"]


def test_a_search_goes_to_slurm_as_a_job_array_per_round_each_after_the_one_before():
  search = ("--search=optimizer.learning_rate:0.1,1", "--rounds", "3")
  result = _launch("sweep.sh", "--config", "configs/survival.py", "--workdir", "runs/s",
                   "--grid", "--shares", "4", "--launcher", "slurm", "--dry-run", "--", "--",
                   *search)
  assert result.returncode == 0, result.stderr
  jobs = result.stdout.split("sbatch ")[1:]
  assert [job.splitlines()[0] for job in jobs] == [
      "--parsable <<'SCRIPT'",
      "--parsable --dependency=afterok:<round 1 array job id> <<'SCRIPT'",
      "--parsable --dependency=afterok:<round 2 array job id> <<'SCRIPT'",
      "--dependency=afterok:<round 3 array job id> <<'SCRIPT'"]
  command = ("-m normstudy.sweep --config=configs/survival.py --workdir=runs/s "
             "--search=optimizer.learning_rate:0.1\\,1 --rounds 3")
  for r, job in enumerate(jobs[:3], start=1):
    assert "#SBATCH --array=1-4" in job
    assert f"{command} --round={r} --programs=$SLURM_ARRAY_TASK_ID/4" in job
  assert f"{command} \n" in jobs[3] and "--programs" not in jobs[3]  # the whole search
  # Without --rounds: the search's default number of rounds, locally one share at a time.
  local = _launch("sweep.sh", "--config", "configs/survival.py", "--workdir", "runs/s", "--grid",
                  "--shares", "2", "--dry-run", "--", "--", search[0])
  lines = [l.split()[-2:] for l in local.stdout.splitlines() if "normstudy.sweep" in l]
  expected = [[f"--round={r}", f"--programs={i}/2"] for r in range(1, DEFAULT_ROUNDS + 1)
              for i in (1, 2)]
  assert lines[:-1] == expected and "--programs" not in lines[-1][-1]
  # A probe round (--probe_decades not 0) is one more round to share; 0 adds none.
  for probe, rounds in (("--probe_decades=0.125", 3), ("--probe_decades=0", 2),
                        ("--probe_decades=0.0", 2)):
    probed = _launch("sweep.sh", "--config", "configs/survival.py", "--workdir", "runs/s",
                     "--grid", "--shares", "1", "--dry-run", "--", "--", search[0], "--rounds=2",
                     probe)
    assert [l.split()[-2] for l in probed.stdout.splitlines() if "--round=" in l] == [
        f"--round={r}" for r in range(1, rounds + 1)], probe


@pytest.mark.parametrize("script,args,message", [
    ("tpu_pod.sh", (), "--name, --zone, --config and --workdir are required"),
    ("tpu_pod.sh", ("--name", "p", "--zone", "z", "--config", "c", "--workdir", "/local"),
     "--workdir=/local must be a gs:// path every worker can write"),
    ("slurm_gpu.sh", ("--config", "c", "--workdir", "w", "--nodes", "zero"),
     "--nodes=zero is not a positive integer"),
    ("slurm_gpu.sh", ("--config", "configs/nope.py:v", "--workdir", "w"),
     "config file 'configs/nope.py' does not exist"),
    ("sweep.sh", ("--config", "configs/nope.py", "--workdir", "w"),
     "config file 'configs/nope.py' does not exist"),
    ("sweep.sh", ("--bogus",), "unknown option '--bogus'"),
    # An option without its value (last, or followed by the next option).
    ("slurm_gpu.sh", ("--config", "c", "--workdir", "w", "--nodes"),
     "--nodes needs a value (nodes ...); see --help"),
    ("slurm_gpu.sh", ("--config", "c", "--partition", "--workdir", "w"),
     "--partition needs a value (partition ...); see --help"),
    ("sweep.sh", ("--config",), "--config needs a value (config ...); see --help"),
    ("tpu_pod.sh", ("--name", "p", "--zone"), "--zone needs a value (zone ...); see --help"),
    ("tpu_pod.sh", ("--status",), "--status needs --name and --zone"),
    ("tpu_pod.sh", ("--logs", "--worker", "0"), "--logs needs --workdir (the run's gs:// directory)"),
    ("tpu_pod.sh", ("--name", "p", "--zone", "z", "--status", "--stop"),
     "--stop and --status: one action at a time"),
    ("tpu_pod.sh", ("--name", "p", "--zone", "z", "--config", "c", "--workdir", "gs://b/s",
                    "--spot"), "--spot and --queued say how the slice is created: add --create "
     "(or --watch)"),
    ("tpu_pod.sh", ("--name", "p", "--zone", "z", "--config", "c", "--workdir", "gs://b/s",
                    "--watch", "--poll", "0"), "--poll=0 is not a positive number of seconds"),
    ("slurm_gpu.sh", ("--config", "c", "--workdir", "w", "--max-requeues", "-1"),
     "--max-requeues=-1 is not an integer >= 0"),
    ("sweep.sh", ("--config", "configs/survival.py", "--workdir", "w", "--grid"),
     "--grid needs --shares N, a positive integer (got '')"),
    ("sweep.sh", ("--config", "configs/survival.py", "--workdir", "w", "--grid", "--shares", "2",
                  "--", "--", "--search=optimizer.learning_rate:0.1,1", "--rounds=zero"),
     "--rounds=zero is not a positive integer"),
])
def test_bad_usage_is_one_error_line(script, args, message):
  result = _launch(script, *args)
  assert result.returncode == 2
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert errors == [f"error: {message}"]


def test_slurm_batch_script_passes_arguments_with_quotes_and_spaces_intact(tmp_path):
  label = "--config.label=clip 1's \"rerun\" $HOME"
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  fake_python = venv / "bin" / "python"  # prints the arguments it was given, one per line
  fake_python.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n")
  fake_python.chmod(0o755)
  fake_bin = tmp_path / "bin"
  fake_bin.mkdir()
  # One task, here: srun's own options dropped.
  (fake_bin / "srun").write_text("#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec \"$@\"\n")
  (fake_bin / "srun").chmod(0o755)
  result = _launch("slurm_gpu.sh", "--config", "configs/lm.py:small", "--workdir", "runs/lm",
                   "--venv", str(venv), "--per-gpu", "--dry-run", "--", label)
  assert result.returncode == 0, result.stderr
  script = "\n".join(result.stdout.splitlines()[1:-1])  # between the heredoc markers
  check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
  assert check.returncode == 0, check.stderr
  ran = subprocess.run(["bash"], input=script, capture_output=True, text=True, timeout=runs.bound(60),
                       env=dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}",
                                SLURM_LOCALID="0"))
  assert ran.returncode == 0, ran.stderr
  assert ran.stdout.splitlines() == ["-m", "normstudy.main", "--config=configs/lm.py:small",
                                     "--workdir=runs/lm", label]


def test_slurm_installs_jax_cuda_or_refuses_and_refuses_a_node_local_workdir_on_many_nodes(
    tmp_path):
  """make install installs jax's CPU build: a GPU job with it once trained on the CPU without a
  word; a local workdir on several nodes splits the checkpoints across their disks (issue 44)."""
  import importlib.util
  if importlib.util.find_spec("jax_cuda12_plugin") or importlib.util.find_spec("jax_cuda13_plugin"):
    pytest.skip("this environment's jax has a CUDA backend")
  venv = os.path.join(runs.REPO, ".venv")
  args = ("--config", "configs/lm.py:small", "--workdir", "runs/lm", "--venv", venv)
  planned = _launch("slurm_gpu.sh", *args, "--dry-run")
  assert planned.returncode == 0, planned.stderr
  import importlib.metadata
  assert _words(planned.stdout.splitlines()[0]) == [
      f"{venv}/bin/python", "-m", "pip", "install", "-q",
      f"jax[cuda12]=={importlib.metadata.version('jax')}", "-e", runs.REPO]
  assert f"#SBATCH --output={runs.REPO}/logs/normstudy-%j.out" in planned.stdout
  assert "its log: " in planned.stderr
  refused = _launch("slurm_gpu.sh", *args, "--no-install")
  assert refused.returncode == 2 and refused.stdout == ""
  assert refused.stderr.strip().splitlines()[-1] == (
      f"error: {venv}'s jax has no CUDA backend: run {venv}/bin/pip install -e '.[gpu]' first")
  local = _launch("slurm_gpu.sh", *args, "--nodes", "2", "--dry-run",
                  "--workdir", str(tmp_path / "runs" / "lm"))
  assert local.returncode == 2 and local.stdout == ""
  assert local.stderr.strip().startswith(f"error: --workdir={tmp_path}/runs/lm is on a "
                                         "node-local file system")
  assert local.stderr.strip().endswith("has 2 nodes: use gs:// or a directory every node "
                                       "shares (or pass --shared-workdir)")
  for ok in (("--workdir", "gs://b/lm"), ("--shared-workdir",)):
    assert _launch("slurm_gpu.sh", *args, "--nodes", "2", "--dry-run", *ok).returncode == 0


def test_the_slurm_job_refuses_to_start_when_its_python_finds_no_gpu(tmp_path):
  """The batch script's first command, run here with this CPU environment's python: exit 2
  and one line, before srun starts anything."""
  result = _launch("slurm_gpu.sh", "--config", "configs/lm.py:small", "--workdir", "runs/lm",
                   "--venv", os.path.join(runs.REPO, ".venv"), "--dry-run")
  check = next(l for l in result.stdout.splitlines() if "default_backend" in l)
  ran = subprocess.run(["bash", "-c", check], capture_output=True, text=True, timeout=runs.bound(60),
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert ran.returncode == 2
  assert ran.stderr.strip().splitlines()[-1] == (
      "error: the job's python finds no GPU (jax.default_backend() is not gpu)")


@pytest.mark.parametrize("accelerator, runtime", [
    ("v4-32", "tpu-ubuntu2204-base"), ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")])
def test_tpu_pod_installs_a_python_3_11_venv_with_this_stack_on_the_generations_runtime(
    accelerator, runtime):
  """The runtime images' Python is 3.10 (normstudy needs >= 3.11) and each generation has its
  own image; every worker gets this machine's versions and joins one distributed job (issue 44)."""
  result = _launch("tpu_pod.sh", "--name", "pod1", "--zone", "z", "--config",
                   "configs/seed_figure.py:pre_norm_clip1", "--workdir", "gs://b/s",
                   "--accelerator", accelerator, "--create", "--dry-run")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].endswith(f"--accelerator-type={accelerator} --version={runtime}")
  _, install, train = [_words(l)[-1] for l in lines if " ssh pod1 " in l]
  assert "uv venv -q --allow-existing --python 3.11" in install and "-c ~/normstudy-pod1-constraints.txt" in install
  import importlib.metadata
  assert f"'jax[tpu]=={importlib.metadata.version('jax')}'" in install
  assert "NORMSTUDY_TPU_POD=1\\ .venv/bin/python\\ -m\\ normstudy.main" in train


def test_tpu_pod_refuses_an_accelerator_without_a_known_runtime():
  result = _launch("tpu_pod.sh", "--name", "p", "--zone", "z", "--config", "c", "--workdir",
                   "gs://b/s", "--accelerator", "v9-8", "--dry-run")
  assert result.returncode == 2
  assert result.stderr.strip() == ("error: --accelerator=v9-8: no default runtime for it; pass "
                                   "--version")


def test_the_gpu_benchmark_appends_each_run_dated_with_its_device(tmp_path):
  """benchmarks/gpu.sh, with a stand-in nvidia-smi and Python: each run writes a directory of its
  own, named by the UTC time and the GPU; the committed results and earlier runs stay as they
  were."""
  import shutil
  repo = tmp_path / "repo"
  shutil.copytree(os.path.join(runs.REPO, "benchmarks"), repo / "benchmarks",
                  ignore=shutil.ignore_patterns("__pycache__"))
  (repo / "docs" / "gpu").mkdir(parents=True)
  first = repo / "docs" / "gpu" / "results.json"
  first.write_text('{"device": "the first run"}')
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "nvidia-smi").write_text(
      "#!/bin/sh\ncase \"$*\" in *noheader*) echo 'NVIDIA H100 80GB HBM3' ;; "
      "*) printf 'name, memory.total\\nNVIDIA H100 80GB HBM3, 81559 MiB\\n' ;; esac\n")
  python = fake / "python"  # writes the JSON it is asked for; -c goes to the real Python
  python.write_text(f"""#!/bin/bash
if [ "$1" = -c ]; then exec {sys.executable} "$@"; fi
call="$*"
while [ $# -gt 0 ]; do [ "$1" = --json ] && json="$2"; shift; done
echo '{{"gpt_125m_bf16": {{"ms_per_step": 12.5}}, "call": "'"$call"'"}}' > "$json"
echo "measured by $call"
""")
  for path in (fake / "nvidia-smi", python):
    path.chmod(0o755)
  env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", PYTHON=str(python))
  made = []
  for _ in range(2):
    result = subprocess.run(["bash", str(repo / "benchmarks" / "gpu.sh")], env=env,
                            capture_output=True, text=True, timeout=runs.bound(60))
    assert result.returncode == 0, result.stderr
    made = sorted(os.listdir(repo / "docs" / "gpu" / "runs"))
  assert len(made) == 2 and all(re.fullmatch(
      r"\d{4}-\d\d-\d\dT\d{6}Z_NVIDIA-H100-80GB-HBM3(-again)?", m) for m in made), made
  for name in made:
    run = repo / "docs" / "gpu" / "runs" / name
    assert "NVIDIA H100 80GB HBM3" in (run / "results.txt").read_text()
    called = json.loads((run / "attention.json").read_text())["call"]
    assert called.startswith("benchmarks/gpu.py attention --json ") and "--step_ms 12.5" in called
    assert json.loads((run / "results.json").read_text())["call"].startswith(
        "benchmarks/gpu.py --json ")
  assert first.read_text() == '{"device": "the first run"}'


def test_the_gpu_ladder_plans_one_lease_and_refuses_what_does_not_fit(tmp_path, monkeypatch,
                                                                        capsys):
  """--dry-run (issue 86): 2 arms x 4 rungs, each rung's rates and seeds in as few programs as
  keep every memory plan within 0.9 of an 80 GB H100 (the 24 x 1024 rung's 11 runs, 75 GiB
  together, in two programs of 6); no checkpoint written (train.checkpoint_every=-1) unless
  --keep-checkpoints, whose disk is the largest sweep's last states (12 bytes a parameter a
  run, +10%); every compile counted; an estimate within 10 minutes; a short disk or budget, or a
  GPU too small for one run, is one line; without a GPU the real run is refused in one line."""
  import types
  from configs import ladder
  from normstudy.engine import memory
  result = subprocess.run(["bash", "benchmarks/gpu_ladder.sh", "--dry-run"], cwd=runs.REPO,
                          capture_output=True, text=True, timeout=runs.bound(120))
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert len([l for l in lines if "seeds) in one program" in l]) == 6
  assert len([l for l in lines if "in 2 programs of 6" in l]) == 2
  total = float(re.search(r"estimated total: ([\d.]+) min", result.stdout).group(1))
  assert 0 < total <= 10
  assert "disk needed: 0.0 GiB (no checkpoints" in result.stdout
  top = ladder.get_config("pre_norm_clip1")
  top.model.update(num_layers=24, d_model=1024, d_ff=4096, num_heads=16, dtype="float16")
  one_gpu = {"runs": 1, "data": 1, "fsdp": 1, "tensor": 1}
  usable = 81559 / 1024 * 0.9 * 2**30
  assert memory.plan(top, one_gpu, num_runs=11).total > usable  # why the rung is split
  assert memory.plan(top, one_gpu, num_runs=6).total <= usable
  assert "24 x 1024 (16 heads, 304.0M parameters): 11 runs" in result.stdout
  gpu_ladder = runs.benchmark("lease")  # its ladder part
  programs = gpu_ladder.plan()
  assert sum(p.parts for p in programs) == 10
  split = [p for p in programs if p.parts > 1][0]
  assert "--max_runs_per_program=6" in split.argv("w")
  assert "--config.train.checkpoint_every=-1" in split.argv("w")
  assert "--config.train.checkpoint_every=0" in split.argv("w", keep=True)
  # Every compile: the estimate of a program grows by COMPILES_PER_PROGRAM compile times a part.
  measured = json.load(open(os.path.join(runs.REPO, "docs", "gpu", "results.json")))
  faster = json.loads(json.dumps(measured))
  faster["section_seconds"]["paper_size_fp16"] -= 4 * 2.0  # 2 s less compile an arm
  saved = gpu_ladder.estimate_seconds(split, measured) - gpu_ladder.estimate_seconds(split, faster)
  assert saved == pytest.approx(split.parts * gpu_ladder.COMPILES_PER_PROGRAM * 2.0)
  assert gpu_ladder.COMPILES_PER_PROGRAM >= 2
  want = memory.parameter_count(types.SimpleNamespace(**dict(top.model))) * 12 * 11 * 1.1 / 2**30
  monkeypatch.setattr(gpu_ladder.shutil, "disk_usage", lambda path: types.SimpleNamespace(
      free=10 * 2**30))
  monkeypatch.setattr(sys, "argv", ["lease.py", f"--workdir={tmp_path / 'w'}",
                                    "--keep-checkpoints"])
  assert gpu_ladder.main() == 2
  assert capsys.readouterr().err.strip() == (
      f"error: {tmp_path} has 10.0 GiB free and the ladder needs {want:.1f} GiB")
  assert not (tmp_path / "w").exists()
  monkeypatch.setattr(sys, "argv", ["lease.py", "ladder", "--budget_minutes=1"])
  assert gpu_ladder.main() == 2
  assert capsys.readouterr().err.strip().startswith("error: the estimate, ")
  monkeypatch.setattr(sys, "argv", ["lease.py", "--dry-run", "--gpu_memory_gib=2"])
  assert gpu_ladder.main() == 2
  assert re.match(r"^error: pre_norm_clip1 at 24 x 1024: one run plans .* more than the 1.8 GiB "
                  r"the GPU gives XLA$", capsys.readouterr().err.strip())
  no_gpu = subprocess.run(["bash", "benchmarks/gpu_ladder.sh"], cwd=runs.REPO,
                          capture_output=True, text=True, timeout=runs.bound(60),
                          env=dict(os.environ, PATH="/usr/bin:/bin"))
  if shutil.which("nvidia-smi") is None:
    assert no_gpu.returncode == 2
    assert no_gpu.stderr.strip().startswith("error: no nvidia-smi here")


FAKE_SLICE_GCLOUD = r'''#!/usr/bin/env python3
"""Stands in for gcloud, with a slice that lives and dies: its state in FAKE_STATE/state (the
test writes PREEMPTED there), gs://b/... kept in FAKE_BUCKET/..., every call logged to
FAKE_STATE/calls. ssh runs the command here as the slice's one worker (the install skipped: the
worker's environment is the test's); a slice that is not READY does not answer."""
import os, shutil, subprocess, sys
args = sys.argv[1:]
home = os.environ["FAKE_STATE"]
with open(os.path.join(home, "calls"), "a") as f:
  f.write(" ".join(args) + "\n")
state = os.path.join(home, "state")
local = lambda url: url.replace("gs://b", os.environ["FAKE_BUCKET"], 1)
if args[:3] == ["compute", "tpus", "tpu-vm"]:
  verb = args[3]
  if verb == "create":  # new disks: no run.log, no run.pid
    for name in ("run.log", "run.pid"):
      path = os.path.join(os.environ["HOME"], "normstudy", name)
      os.path.exists(path) and os.remove(path)
    open(state, "w").write("READY")
  elif verb == "delete":
    os.path.exists(state) and os.remove(state)
  elif verb == "describe":
    if not os.path.exists(state):
      sys.exit("ERROR: NOT_FOUND")
    print(open(state).read())
  elif verb == "ssh":
    if not os.path.exists(state) or open(state).read() != "READY":
      sys.exit(255)
    command = args[args.index("--command") + 1]
    if "uv venv" not in command:
      sys.exit(subprocess.run(["bash", "-c", command]).returncode)
elif args[:2] == ["storage", "cp"]:
  source, target = [local(a) for a in args[2:] if not a.startswith("-")]
  os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
  shutil.copyfile(source, target)
elif args[:2] == ["storage", "cat"]:
  if not os.path.exists(local(args[2])):
    sys.exit(1)
  sys.stdout.write(open(local(args[2])).read())
'''


@pytest.mark.slow
def test_a_preempted_spot_slice_is_recreated_and_the_run_resumes_from_its_checkpoint(tmp_path):
  """launch/tpu_pod.sh --create --spot --watch against a fake gcloud: the run (normstudy.main,
  real, its gs:// workdir a local directory) starts; after its first checkpoint the slice is
  preempted (its state PREEMPTED, the run killed with it); the watch deletes the slice, creates
  it again as Spot, launches the same run, which resumes from the checkpoint and finishes; the
  log copy in the bucket holds both lives. Then --status, --logs and a second launch's guard."""
  import json
  from normstudy.records import rundir
  bucket, state, home, fake_bin = (tmp_path / n for n in ("bucket", "state", "home", "bin"))
  for d in (bucket, state, fake_bin):
    d.mkdir()
  (fake_bin / "gcloud").write_text(FAKE_SLICE_GCLOUD)
  (fake_bin / "gcloud").chmod(0o755)
  worker_python = home / "normstudy" / ".venv" / "bin" / "python"  # gs://b -> the bucket dir
  worker_python.parent.mkdir(parents=True)
  worker_python.write_text(
      '#!/bin/bash\nunset NORMSTUDY_TPU_POD  # one worker: no pod to join here\n'
      'args=(); for a in "$@"; do args+=("${a/gs:\\/\\/b/$FAKE_BUCKET}"); done\n'
      f'cd {runs.REPO} && exec {sys.executable} "${{args[@]}}"\n')
  worker_python.chmod(0o755)
  env = dict(os.environ, HOME=str(home), PATH=f"{fake_bin}:{os.environ['PATH']}",
             FAKE_STATE=str(state), FAKE_BUCKET=str(bucket), NORMSTUDY_LOG_COPY_EVERY="1",
             NORMSTUDY_WORKER_ID="0")
  common = ["--name", "p", "--zone", "z", "--workdir", "gs://b/run"]
  launch = subprocess.Popen(
      ["bash", os.path.join(runs.REPO, "launch", "tpu_pod.sh"), *common, "--config",
       "configs/seed_figure.py:pre_norm_clip1", "--create", "--spot", "--watch", "--poll", "1",
       "--", *runs.tiny_args(tmp_path / "tfds", num_steps=6000, every=500)],
      cwd=runs.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  try:
    deadline = time.monotonic() + runs.bound(120)
    copy = bucket / "run" / "launch_logs" / "worker-0.log"
    # A checkpoint, and the bucket's copy of the log holding the first life's start.
    while not (rundir.checkpointed_steps(str(bucket / "run" / "checkpoints")) and copy.exists()
               and "steps 1..6000" in copy.read_text()):
      assert time.monotonic() < deadline and launch.poll() is None, launch.stderr.read()
      time.sleep(0.05)
    (state / "state").write_text("PREEMPTED")  # the slice goes, and its run with it
    pid = int((home / "normstudy" / "run.pid").read_text())
    os.killpg(pid, 9)
    out, err = launch.communicate(timeout=runs.bound(180))
  finally:
    if launch.poll() is None:
      os.killpg(launch.pid, 9)
  assert launch.returncode == 0, err[-3000:]
  calls = (state / "calls").read_text().splitlines()
  creates = [c for c in calls if c.startswith("compute tpus tpu-vm create p ")]
  assert len(creates) == 2 and all(c.endswith("--spot") for c in creates)
  order = [c.split()[3] for c in calls if c.startswith("compute tpus tpu-vm ")
           and c.split()[3] in ("create", "delete")]
  assert order == ["create", "delete", "create"]
  assert "slice p is PREEMPTED: recreating it (1 of 10)" in err
  assert "the run ended: finished" in err
  record = json.loads((bucket / "run" / "run.json").read_text())
  assert record["status"] == "finished"
  log = (home / "normstudy" / "run.log").read_text()  # the second life's, from the bucket's copy on
  assert "steps 1..6000" in log.split("resumed")[0]  # the first life's lines come first
  resumed = re.search(r"resumed .* from the checkpoint at step (\d+)", log)
  assert resumed and int(resumed.group(1)) >= 500
  steps = [json.loads(l)["step"] for l in (bucket / "run" / "metrics.jsonl").read_text().splitlines()
           if '"loss"' in l]
  assert steps == sorted(set(steps)) and steps[-1] == 6000  # no step twice, to the end
  deadline = time.monotonic() + runs.bound(30)  # the copier's last copy, once the run ended
  while "finished: step 6000" not in (bucket / "run" / "launch_logs" / "worker-0.log").read_text():
    assert time.monotonic() < deadline
    time.sleep(0.2)
  logs = subprocess.run(["bash", "launch/tpu_pod.sh", "--workdir", "gs://b/run", "--logs"],
                        cwd=runs.REPO, env=env, capture_output=True, text=True)
  assert logs.returncode == 0 and "resumed" in logs.stdout and "finished: step 6000" in logs.stdout
  status = subprocess.run(["bash", "launch/tpu_pod.sh", *common, "--status"], cwd=runs.REPO,
                          env=env, capture_output=True, text=True)
  assert status.stdout.splitlines()[0] == "slice p (z): READY"
  assert ": no run going" in status.stdout and '"finished"' in status.stdout
  # A second launch while a run is going is refused on the worker, before anything is copied.
  sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
  (home / "normstudy" / "run.pid").write_text(str(sleeper.pid))
  try:
    again = subprocess.run(["bash", "launch/tpu_pod.sh", *common, "--config", "c"],
                           cwd=runs.REPO, env=env, capture_output=True, text=True)
  finally:
    sleeper.kill()
  assert again.returncode == 2
  assert [l for l in again.stderr.splitlines() if l.startswith("error:")] == [
      f"error: a run is already going on {os.uname().nodename} (pid {sleeper.pid}): "
      "launch/tpu_pod.sh --name p --zone z --stop first"]
  assert "archive" not in again.stdout


def test_tpu_pod_creates_through_a_queued_resource_and_deletes_it_the_same_way():
  result = _launch("tpu_pod.sh", "--name", "p", "--zone", "z", "--config", "c", "--workdir",
                   "gs://b/s", "--accelerator", "v5litepod-16", "--create", "--queued", "--spot",
                   "--follow", "--delete", "--dry-run")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0] == ("gcloud compute tpus queued-resources create p --node-id=p --zone=z "
                      "--accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite "
                      "--spot")
  assert lines[-1] == "gcloud compute tpus queued-resources delete p --zone=z --force --quiet"


def test_the_seed_figure_lease_plans_steps_memory_time_and_disk(monkeypatch, capsys):
  """`make gpu-seed-figure DRY_RUN=1` (issue 86): the most steps (a multiple of 10) a 9-minute
  budget holds after the process, its analysis and every compile (3 programs: the two Pre-Norm
  clips share one), each arm stepping at its measured time; every program's memory plan within
  0.9 of an 80 GB H100; records only on disk. A GPU too small, or a budget too short, is one
  line."""
  gpu_ladder = gpu_seed_figure = runs.benchmark("lease")  # its ladder and seed-figure parts
  from normstudy.engine import memory
  result = subprocess.run(["make", "-s", "gpu-seed-figure", "DRY_RUN=1"], cwd=runs.REPO,
                          capture_output=True, text=True, timeout=runs.bound(120))
  assert result.returncode == 0, result.stderr
  measured = json.load(open(os.path.join(runs.REPO, "docs", "gpu", "results.json")))
  paper = measured["paper_size_fp16"]
  step = sum(r["ms_per_step"] for r in paper.values()) / 1e3  # all four arms, one step each
  compiles = 3 * gpu_ladder.COMPILES_PER_PROGRAM * gpu_ladder.compile_seconds(measured)
  steps = int((9 * 60 - gpu_ladder.PROCESS_SECONDS - 30 - compiles) / step) // 10 * 10
  assert f"): {steps} steps an arm, 4 arms in 3 programs" in result.stdout
  assert "pre_norm_clip10 + pre_norm_clip1: memory plan" in result.stdout
  assert "no checkpoints" in result.stdout and "of a 9-min budget" in result.stdout
  config = gpu_seed_figure.arm_config("post_norm_deepnorm_clip1", steps)
  assert (config.model.num_layers, config.model.d_model, config.model.max_len,
          config.model.dtype, config.train.checkpoint_every) == (24, 1024, 512, "float16", -1)
  one = memory.plan(config, {"runs": 1, "data": 1, "fsdp": 1, "tensor": 1}, num_runs=1,
                    platform="gpu")
  assert f"post_norm_deepnorm_clip1: memory plan {one.describe()}" in result.stdout
  for argv, message in (
      (["--dry-run", "--gpu_memory_gib=40"], r"^error: pre_norm_clip10 and pre_norm_clip1 at "
       r"MERT's size plans .* more than the 36 GiB the GPU gives XLA$"),
      (["--dry-run", "--budget_minutes=1"], r"^error: --budget_minutes=1 leaves no time to "
       r"train after \d+ s of start-up and compiles$")):
    monkeypatch.setattr(sys, "argv", ["lease.py", "seed-figure", *argv])
    assert gpu_seed_figure.main() == 2
    assert re.match(message, capsys.readouterr().err.strip())
