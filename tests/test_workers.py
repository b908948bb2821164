"""A sweep's programs side by side in worker processes (normstudy.experiments.workers): how many,
and that a sweep trained that way, stopped by SIGTERM and resumed, gives the uninterrupted
trajectories."""

import os
import re
import signal

import pytest

from normstudy import errors
from normstudy.experiments import workers
import runs


def test_worker_count_follows_the_grid_and_the_cores(monkeypatch):
  monkeypatch.setattr(workers, "available_cores", lambda: [0, 1, 2, 3])
  assert workers.count(1, 0, True) == 1          # one program: this process
  assert workers.count(3, 0, True) == 3          # one per program ...
  assert workers.count(9, 0, True) == 4          # ... up to one per core
  assert workers.count(9, 2, True) == 2          # as asked
  assert workers.count(9, 1, True) == 1
  assert workers.count(9, 16, True) == 4         # never more than the cores
  assert workers.count(9, 0, False) == 1          # one accelerator: one process


def test_the_first_failure_is_raised_and_later_programs_do_not_start(tmp_path):
  started = tmp_path / "started"
  calls = [(str(started), "first"), (str(started), "second")]
  with pytest.raises(ValueError, match="first"):
    workers.run(_fail, calls, 1)
  assert started.read_text() == "first"


def test_calls_larger_than_a_pipe_buffer_reach_the_workers(tmp_path):
  # A search's round of 72 runs outgrew the 64 KiB pipe the calls once went through, and the
  # sweep blocked before any worker started.
  out = tmp_path / "sizes"
  calls = [(str(out), "x" * 200_000) for _ in range(4)]
  workers.run(_record_size, calls, 2)
  assert sorted(out.read_text().split()) == ["200000"] * 4


def test_a_pool_keeps_its_workers_across_runs(tmp_path):
  # A search's rounds run in one pool: the second run's calls go to the processes of the first,
  # which keep what they compiled.
  out = tmp_path / "pids"
  with workers.Pool() as pool:
    pool.run(_record_pid, [(str(out), "round1")] * 4, 2)
    after_first = list(pool.processes)
    pool.run(_record_pid, [(str(out), "round2")] * 3, 2)
    assert pool.processes == after_first and all(p.is_alive() for p in after_first)
  lines = [line.split() for line in out.read_text().split("\n") if line]
  pids = {str(p.pid) for p in after_first}
  assert sorted(name for name, _ in lines) == ["round1"] * 4 + ["round2"] * 3
  assert {pid for _, pid in lines} <= pids and len(pids) == 2
  assert not any(p.is_alive() for p in after_first)  # closed: none left


def test_a_failure_in_a_pool_run_is_raised_and_its_later_calls_do_not_start(tmp_path):
  started = tmp_path / "started"
  with workers.Pool() as pool:
    pool.run(_record_pid, [(str(tmp_path / "pids"), "warm")], 1)
    with pytest.raises(ValueError, match="first"):
      pool.run(_fail, [(str(started), "first"), (str(started), "second")], 1)
  assert started.read_text() == "first"


def _record_pid(out, name):
  with open(out, "a", encoding="utf-8") as f:
    f.write(f"{name} {os.getpid()}\n")


def _record_size(out, payload):
  with open(out, "a", encoding="utf-8") as f:
    f.write(f"{len(payload)}\n")


def _fail(started, name):
  with open(started, "a", encoding="utf-8") as f:
    f.write(name)
  raise ValueError(name)


@pytest.mark.slow  # a spawned worker starting JAX
def test_a_killed_worker_is_one_line_naming_its_call_and_later_calls_do_not_start(tmp_path):
  started = tmp_path / "started"
  calls = [(str(started), "first"), (str(started), "second")]
  with pytest.raises(errors.WorkerKilled) as caught:
    workers.run(_die, calls, 1, describe=lambda call: f"call {call[1]}")
  message = str(caught.value)
  assert "\n" not in message
  assert message.startswith("worker process 1 (pid ")
  assert "was killed by SIGKILL while it trained call first; its runs continue" in message
  assert message.endswith(")") and "run the same command (" in message
  assert started.read_text() == "first"  # the second never started


def _die(started, name):
  with open(started, "a", encoding="utf-8") as f:
    f.write(name)
  os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_sweep_in_two_workers_resumes_after_sigterm_to_the_same_trajectories(tmp_path):
  # Two programs (two placements): trained in one process, and trained one per worker, stopped
  # and resumed in one process: the worker-trained steps before the stop and the one-process
  # steps after it are the one-process trajectory, bit for bit (so normstudy.main reproduces a
  # worker-trained run: test_sweep.py).
  args = ("--config=configs/seed_figure.py:pre_norm_clip1", "--axis=model.placement=pre_ln,post_ln",
          "--axis=optimizer.learning_rate=1e-3", "--axis=train.seed=0",
          *runs.tiny_args(tmp_path / "tfds", num_steps=300, every=100),
          # A size at which XLA:CPU's results depend on its thread pool (a worker pinned before
          # XLA starts computes other last bits than one process on two cores).
          "--config.model.d_model=32", "--config.model.d_ff=64", "--config.train.batch_size=8",
          "--config.train.telemetry_every=0")  # the file's SWEEP_SETTINGS turn it on
  names = ("lr0.001_seed0_placement-pre_ln", "lr0.001_seed0_placement-post_ln")
  # The workers start from a compilation cache of their own: XLA:CPU bakes its thread pool's
  # size into what it compiles, so programs the one-process reference compiled (and stored in
  # the tests' shared cache) would hide a worker that computes with other bits.
  worker_env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "worker_cache"))
  reference = tmp_path / "reference"
  result = runs.run_module("normstudy.sweep", *args, "--workers=1", f"--workdir={reference}")
  assert result.stdout.splitlines()[-1] == "runs: 2 finished"
  # Each progress line names its program; the sweep-wide line counts programs and runs.
  assert re.search(r"\[program 2/2\] \| step 300/300 \| [\d.]+ steps/s \| ETA 0s", result.stderr)
  assert re.search(r"\[sweep\] programs 1/2 done, runs 1/2 \| \d+s so far \| ETA \d+s",
                   result.stderr)
  # Issue 88, item 17: a first estimate of the whole from the first steady rate a worker
  # sends, before the sweep-wide line; the last lines say its wall and CPU time.
  assert re.search(r"\[sweep\] first estimate: about \d+s to train its 2 programs",
                   result.stderr)
  assert (result.stderr.index("[sweep] first estimate")
          < result.stderr.index("[sweep] programs 1/2 done"))
  assert re.search(r"took \d+s wall, \d+s CPU on \d+ core\(s\): \d+% of the cores busy",
                   result.stderr)
  stopped = tmp_path / "stopped"
  proc = runs.start_module("normstudy.sweep", *args, "--workers=2", f"--workdir={stopped}",
                           env=worker_env)
  assert runs.wait_for_records(proc, stopped / names[0], 3)  # records every 5 steps
  proc.send_signal(signal.SIGTERM)
  stdout, stderr = proc.communicate(timeout=runs.bound(120))
  assert proc.returncode == 0, stderr[-3000:]
  assert "programs: 2 at a time, each in a worker process" in stdout
  assert "SIGTERM received: passed it to the workers" in stderr
  # A worker parses no flags: absl once began its lines with "WARNING: Logging before flag
  # parsing goes to stderr." (issue 78's own bad inputs).
  assert "Logging before flag parsing" not in stderr
  # Every program's stop, one line each with its step, then one line for the sweep; every
  # stopped run preempted in its run.json and in sweep.json (once left at "running").
  assert stderr.strip().splitlines()[-1] == (
      "preempted: SIGTERM: 2 program(s) stopped, each at its checkpoint (one line each above), "
      "0 not started; run the same command to continue")
  for i, name in enumerate(names, start=1):
    assert re.search(rf"program {i}/2 \({name}\): SIGTERM at step \d+", stderr), stderr[-3000:]
    assert runs.read_json(stopped / name / "run.json")["status"] == "preempted"
  sweep = runs.read_json(stopped / "sweep.json")
  assert [r["status"] for r in sweep["runs"]] == ["preempted", "preempted"]
  runs.run_module("normstudy.sweep", *args, "--workers=1", f"--workdir={stopped}")
  for name in names:
    resumed, uninterrupted = runs.trajectory(stopped / name), runs.trajectory(reference / name)
    steps = {r["step"] for r in uninterrupted}
    # Bit-equal at every recorded step; a stopped run also recorded the step it stopped at.
    assert [r for r in resumed if r["step"] in steps] == uninterrupted, name
    assert len(resumed) - len(uninterrupted) <= 1
    assert runs.read_json(stopped / name / "run.json")["status"] == "finished"
  # No worker outlives its sweep.
  assert not [p for p in os.popen("ps -eo args").read().splitlines()
              if "multiprocessing.spawn" in p and str(tmp_path) in p]


@pytest.mark.slow
def test_workers_flag_is_checked_before_anything_is_written(tmp_path):
  result = runs.run_module("normstudy.sweep", "--config=configs/seed_figure.py:pre_norm_clip1",
                           f"--workdir={tmp_path / 'wd'}", "--workers=-1", check=False)
  assert result.returncode == 2
  assert result.stderr.strip() == ("error: --workers=-1 is not allowed; allowed: 0 (one per core, "
                                   "up to one per program) or an integer >= 1")
  assert not (tmp_path / "wd").exists()
  assert issubclass(workers.NotStarted, errors.Preempted)


def test_a_stop_signal_is_said_at_once_and_the_wait_every_30_seconds(caplog):
  """Issue 88, item 17: after SIGTERM a study said nothing for minutes while its workers
  finished. The collecting loop says what happens at its first tick after the signal, then a
  line every 30 s while programs are still stopping, and nothing before a signal."""
  import logging
  from normstudy.experiments import workers
  now = [0.0]
  signalled = []
  announce = workers.StopAnnouncer(signalled, clock=lambda: now[0])
  caplog.set_level(logging.WARNING)
  assert announce(2) is None  # no signal yet
  signalled.append(signal.SIGTERM)
  now[0] = 5.0
  first = announce(2)
  assert first.startswith("SIGTERM received: passed it to the workers; each of the 2 running "
                          "program(s) stops at its next step and saves a checkpoint")
  said = []
  for t in range(6, 70):
    now[0] = float(t)
    said.append(announce(1))
  lines = [line for line in said if line]
  assert lines == ["waiting for 1 program(s) to stop at a checkpoint: 30s since SIGTERM",
                   "waiting for 1 program(s) to stop at a checkpoint: 60s since SIGTERM"]
  assert [r.getMessage() for r in caplog.records] == [first, *lines]


def test_the_time_used_counts_the_workers_cpu_against_the_cores(monkeypatch):
  """Issue 88, item 17: "~8 min on 2 cores" could not tell a busy machine from a fault. The
  line counts this process's and its joined workers' CPU seconds against wall x cores."""
  from normstudy.experiments import planning
  monkeypatch.setattr(planning.workers_lib, "available_cores", lambda: [0, 1])
  began = os.times_result((1.0, 0.5, 0.0, 0.0, 100.0))
  ended = os.times_result((11.0, 1.5, 310.5, 8.5, 400.0))  # 300 s wall, 330 s of CPU
  assert planning.time_used(began, ended) == (
      "took 300s wall, 330s CPU on 2 core(s): 55% of the cores busy with this")


_STAGE = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from normstudy.experiments import workers
workers.stop_with_parent()
out = sys.argv[1]
def stop(signum, frame):
  open(out, "w").write("SIGTERM")
  sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(out + ".ready", "w").close()
time.sleep(120)
open(out, "w").write("finished")
"""

_PARENT = """
import sys
sys.path.insert(0, {repo!r})
from normstudy.errors import Preempted
from normstudy.experiments import workers
try:
  print(workers.run_commands([[sys.executable, "-c", {stage!r}, out]
                              for out in sys.argv[1:]]))
except Preempted as e:
  print("preempted:", e)
"""


def _wait_ready(paths):
  import time
  deadline = time.time() + runs.bound(60)
  while not all(os.path.exists(f"{p}.ready") for p in paths):
    assert time.time() < deadline, "the stages did not start"
    time.sleep(0.05)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_stage_stops_with_its_ladder_never_an_orphan(tmp_path, how):
  """A ladder's rungs and a drift's stages are sweeps in processes of their own: a SIGTERM to
  the ladder once ended it and left its sweep training as an orphan. SIGTERM is passed on to
  every stage (each stops at its checkpoint) and the parent says it was preempted; a parent
  killed outright takes its stages down with a SIGTERM (PR_SET_PDEATHSIG)."""
  import subprocess
  import sys
  stage = _STAGE.format(repo=runs.REPO)
  outs = [str(tmp_path / "a"), str(tmp_path / "b")]
  parent = subprocess.Popen([sys.executable, "-c", _PARENT.format(repo=runs.REPO, stage=stage),
                             *outs], stdout=subprocess.PIPE, text=True)
  _wait_ready(outs)
  parent.send_signal(getattr(signal, how))
  stdout, _ = parent.communicate(timeout=runs.bound(60))
  if how == "SIGTERM":
    assert stdout.startswith("preempted: SIGTERM: passed to the 2 process(es) it was running")
  import time
  deadline = time.time() + runs.bound(30)
  while not all(os.path.exists(p) for p in outs) and time.time() < deadline:
    time.sleep(0.05)
  assert [open(p).read() for p in outs] == ["SIGTERM", "SIGTERM"]
