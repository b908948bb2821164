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
  """`python -m module args` in the repo, its output captured; `timeout` is scaled by bound().

  The process is forked from this test process's command server (tests/zygote.py: the
  libraries imported once; started again when this process's environment has changed) when the
  command runs in this process's environment with no other subprocess option; a real `python
  -m` for a test's own environment or options, or with NORMSTUDY_TEST_FORK_SERVER=0."""
  env = dict(env or os.environ, PYTHONUNBUFFERED="1")
  command = [sys.executable, "-m", module, *args]
  server = None if kwargs else _ForkServer.for_env(env)
  if server is not None:
    proc = server.start(command, module, args, env)
    try:
      stdout, stderr = proc.communicate(timeout=bound(timeout))
    except subprocess.TimeoutExpired:  # as subprocess.run does: kill the child, then wait
      proc.kill()
      proc.communicate()
      raise
    result = subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
  else:
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=bound(timeout), **kwargs)
  if check and result.returncode != 0:
    raise AssertionError(f"{module} {' '.join(args)} exited {result.returncode}:\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
  return result


def _at_import(env):
  """An environment but for pytest's name of the running test, which no import reads (the child
  gets the command's whole environment once it is forked)."""
  return {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}


class _ForkServer:
  """This process's tests/zygote.py, started on first use with the environment it then serves."""

  _server = None

  @classmethod
  def for_env(cls, env):
    if os.environ.get("NORMSTUDY_TEST_FORK_SERVER", "1") == "0":
      return None
    if _at_import(env) != _at_import(dict(os.environ, PYTHONUNBUFFERED="1")):
      return None  # a test's own environment: what a child imports may depend on it
    server = cls._server
    if server is None or server.proc.poll() is not None or (
        _at_import(server.env) != _at_import(env)):  # e.g. a module imported in-process set one
      if server is not None:
        server.retire()  # it ends when its children have
      cls._server = cls(env)
    return cls._server

  def __init__(self, env):
    import atexit
    import tempfile
    self.env = env
    self.folder = tempfile.mkdtemp(prefix="normstudy_fork_server_")
    self.log = open(os.path.join(self.folder, "server.log"), "wb")  # its own warnings, if any
    self.proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "zygote.py")],
                                 cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self.log, bufsize=0)
    atexit.register(self.close)
    self.count, self.ended, self.pending = 0, {}, b""
    if self._reply(timeout=bound(300)) is None:
      raise RuntimeError(f"the test fork server did not start; its log: {self.folder}/server.log")

  def _read(self, timeout):
    """The server's next reply, None if none came within `timeout` seconds; an ended child's
    exit status is kept in self.ended."""
    import select
    while b"\n" not in self.pending:  # its own line buffer: select sees only the pipe's bytes
      if not select.select([self.proc.stdout], [], [], max(0.0, timeout))[0]:
        return None
      chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
      if not chunk:
        raise RuntimeError(f"the test fork server ended; its log: {self.folder}/server.log")
      self.pending += chunk
    line, self.pending = self.pending.split(b"\n", 1)
    reply = json.loads(line)
    if "returncode" in reply:
      self.ended[reply["pid"]] = reply["returncode"]
    return reply

  def _reply(self, timeout):
    """The next reply to a request ({"ready"} or {"forked"}), children's ends kept on the way."""
    import time
    deadline = time.monotonic() + timeout
    while True:
      reply = self._read(deadline - time.monotonic())
      if reply is None or "returncode" not in reply:
        return reply

  def returncode(self, pid, timeout):
    """The child's exit status once it ends; None if it is still running after `timeout`."""
    import time
    deadline = time.monotonic() + timeout
    while pid not in self.ended:
      if self._read(deadline - time.monotonic()) is None:
        return None
    return self.ended[pid]

  def start(self, command, module, args, env):
    self.count += 1
    out = os.path.join(self.folder, f"{self.count}.out")
    err = os.path.join(self.folder, f"{self.count}.err")
    self.proc.stdin.write(json.dumps({"module": module, "args": list(args), "env": env,
                                      "stdout": out, "stderr": err}).encode() + b"\n")
    reply = self._reply(timeout=bound(60))
    if reply is None:
      raise RuntimeError(f"the test fork server did not fork; its log: {self.folder}/server.log")
    return _ForkedProcess(self, command, reply["forked"], out, err)

  def retire(self):
    """No more requests; the server exits once its running children have ended."""
    if not self.proc.stdin.closed:
      self.proc.stdin.close()

  def close(self):
    import shutil
    self.retire()
    self.proc.wait()
    self.log.close()
    shutil.rmtree(self.folder, ignore_errors=True)


class _ForkedProcess:
  """What the tests use of subprocess.Popen (pid, returncode, poll, wait, communicate, signals)
  for a child of the fork server; its output is read once it ends."""

  def __init__(self, server, args, pid, out, err):
    self.server, self.args, self.pid, self.returncode = server, args, pid, None
    self._paths = (out, err)

  def poll(self):
    if self.returncode is None:
      self.returncode = self.server.returncode(self.pid, timeout=0)
    return self.returncode

  def wait(self, timeout=None):
    if self.returncode is None:
      self.returncode = self.server.returncode(self.pid, 1e9 if timeout is None else timeout)
      if self.returncode is None:
        raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, timeout=None):
    try:
      self.wait(timeout)
    except subprocess.TimeoutExpired as e:
      e.output, e.stderr = self._outputs(keep=True)
      raise
    return self._outputs()

  def _outputs(self, keep=False):
    outputs = []
    for path in self._paths:
      with open(path, encoding="utf-8", errors="replace") as f:
        outputs.append(f.read())
      if not keep:
        os.remove(path)
    return tuple(outputs)

  def send_signal(self, signum):
    if self.poll() is None:  # never a pid that has ended (and may be reused)
      os.kill(self.pid, signum)

  def terminate(self):
    import signal
    self.send_signal(signal.SIGTERM)

  def kill(self):
    import signal
    self.send_signal(signal.SIGKILL)


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
  """Starts a normstudy command in the background (for signal tests): a child of the fork
  server, as run_module's, or a real `python -m` (subprocess.Popen, stdout and stderr piped)."""
  import subprocess as sp
  env = dict(env or os.environ, PYTHONUNBUFFERED="1")
  server = None if kwargs else _ForkServer.for_env(env)
  if server is not None:
    return server.start([sys.executable, "-m", module, *args], module, args, env)
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
