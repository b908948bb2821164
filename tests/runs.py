"""Helpers for end-to-end tests: run normstudy commands as a user would, in subprocesses."""

import json
import os
import subprocess
import sys

from normstudy.records import metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A model small enough that a subprocess run is dominated by start-up, not training: one layer
# (a second one costs 15-25% of a subprocess run's compilation; what depth changes is tested
# in-process, test_model.py, test_telemetry.py, test_techniques.py).
TINY = (
    "--config.model.num_layers=1", "--config.model.d_model=16", "--config.model.num_heads=2",
    "--config.model.d_ff=32", "--config.model.max_len=16", "--config.model.vocab_size=32",
    "--config.train.batch_size=4", "--config.data.train_tokens=16384",
    "--config.data.validation_tokens=4096", "--config.train.eval_steps=2",
    # No TensorFlow import per process; the TensorBoard tests turn it back on.
    "--config.train.tensorboard=False",
)


def tiny_args(data_dir, num_steps=6, every=3):
  return TINY + (f"--config.data.data_dir={data_dir}", f"--config.train.num_steps={num_steps}",
                 f"--config.train.eval_every={every}", f"--config.train.checkpoint_every={every}",
                 "--config.optimizer.warmup_steps=2")


def bound(seconds: float) -> float:
  """A bound on a hang, not a performance assertion: `seconds` (what the step takes on an idle
  2-core machine, with a wide margin) times how oversubscribed the machine is now (its 1-minute
  load per core, at least 1), or times NORMSTUDY_TEST_TIMEOUT_SCALE when set. Under a load of
  15-30 on 2 cores, fixed 600 s bounds once failed the TPU-compile and gs:// tests (issue 46)."""
  scale = os.environ.get("NORMSTUDY_TEST_TIMEOUT_SCALE")
  if scale is None:
    scale = max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))
  return seconds * float(scale)


def run_module(module, *args, check=True, timeout=600, env=None, **kwargs):
  """`python -m module args` in the repo, its output captured; `timeout` is scaled by bound()."""
  env = dict(env or os.environ, PYTHONUNBUFFERED="1")
  result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=bound(timeout), **kwargs)
  if check and result.returncode != 0:
    raise AssertionError(f"{module} {' '.join(args)} exited {result.returncode}:\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
  return result


def records(run_dir):
  """The records of a run, each line parsed as strict JSON (no NaN or Infinity literals), the
  non-finite values' strings read back as floats (normstudy.records.metrics)."""
  def strict(name):
    raise AssertionError(f"{run_dir}/metrics.jsonl holds the non-JSON literal {name}")
  with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  for line in lines:
    json.loads(line, parse_constant=strict)
  return [metrics.decode(line) for line in lines]


def read_json(path):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def start_module(module, *args, env=None, **kwargs):
  """Starts a normstudy command in the background (for signal tests)."""
  import subprocess as sp
  env = dict(env or os.environ, PYTHONUNBUFFERED="1")
  return sp.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env, stdout=sp.PIPE,
                  stderr=sp.PIPE, text=True, **kwargs)


def wait_for_records(proc, run_dir, count, timeout=300):
  """Waits until metrics.jsonl holds at least `count` lines; False if the process ended first."""
  import time
  path = os.path.join(run_dir, "metrics.jsonl")
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      return False
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        if sum(1 for _ in f) >= count:
          return True
    time.sleep(0.005)
  raise TimeoutError(f"{path} did not reach {count} records")


def trajectory(run_dir):
  """The records without wall-clock measurements: what must be identical across a resume."""
  return [{k: v for k, v in r.items() if k != "tokens_per_sec"} for r in records(run_dir)]
