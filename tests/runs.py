"""Helpers for end-to-end tests: run normstudy commands as a user would, in subprocesses."""

import json
import os
import signal
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
    # No per-layer telemetry, which configs/seed_figure.py's variants take every 10 or 25 steps:
    # a third program to compile, steps taken out of the blocks, and seven layer figures per
    # analysis (a quarter of a tiny sweep's command). The tests whose point it is turn it back
    # on: test_sweep.py's killed and resumed sweep command (its records and layer figures), the
    # in-process sweeps there, test_telemetry.py.
    "--config.train.telemetry_every=0",
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


# The interpreter as a terminal starts it, Ctrl-C at its default, whatever this process was
# given: a shell's background job (`cmd &` without job control, as a CI script may start the
# suite) ignores SIGINT, and an ignored signal stays ignored through exec. A tiny Python puts
# the default back, then execs the interpreter with the arguments that follow.
WITH_CTRL_C = (sys.executable, "-c", "import os, signal, sys; "
               "signal.signal(signal.SIGINT, signal.SIG_DFL); "
               "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def benchmark(name: str):
  """A script of benchmarks/ (`name` without .py) imported as a module, for its definitions."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(
      f"benchmark_{name}", os.path.join(REPO, "benchmarks", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


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
  return _checked(result, module, args, check)


def _checked(result, module, args, check: bool):
  """`result`, or (with `check`) an AssertionError with its output when it exited non-zero."""
  if check and result.returncode != 0:
    raise AssertionError(f"{module} {' '.join(args)} exited {result.returncode}:\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
  return result


def run_inline(module, *args, check=True, environ=None):
  """`python -m module args` as run_module runs it (the same result: exit status, stdout and
  stderr as the process writes them), but in this test process: for a test of several commands
  of one program structure that asserts nothing about a process (no signal, environment, import
  or compilation-cache claim). The compiled steps a process keeps by structure
  (normstudy.engine.execution) then serve every later command of the test, where each forked
  command traces its steps and loads them from the disk cache again (2-3 s a tiny command).

  `environ`: variables set for the command and restored after it, for those a command reads
  when it runs (not at import, which has happened here already).

  What the command leaves behind is cleared before the next: the flags its entry defined
  (absl's global FLAGS); the output streams and its log handler's; the working directory, the
  environment and sys.modules' entry of the module. Output is captured at the file
  descriptors, so the libraries' native output lands where a process's would."""
  import runpy
  import tempfile
  import zygote
  from absl import app  # noqa: F401  (its own flags are defined on import, before any command)
  from absl import flags
  from absl import logging as absl_logging
  # The flags an entry defines (its own, registered under its file's path as runpy runs it,
  # normstudy.cli's and the config file's overrides); a library's (grain's, defined on first
  # import) stay, as they would in a process.
  entry = {flag.name for defining, defined in flags.FLAGS.flags_by_module_dict().items()
           if defining.startswith(("normstudy", REPO)) for flag in defined}
  entry |= {name for name in flags.FLAGS if name.startswith("config.")}  # ml_collections' own
  for name in entry & set(flags.FLAGS):  # (deleting one edits the module's list of flags)
    delattr(flags.FLAGS, name)
  flags.FLAGS.unparse_flags()
  handler = absl_logging.get_absl_handler().python_handler
  saved = {"argv": sys.argv, "stdout": sys.stdout, "stderr": sys.stderr,
           "handler": handler.stream, "cwd": os.getcwd(), "fds": (os.dup(1), os.dup(2)),
           "environ": dict(os.environ),
           # A command ignores Ctrl-C once its work is done (normstudy.cli.run): left so, this
           # process would pass SIG_IGN on to every process it starts later (a Ctrl-C test's).
           "signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}}
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout = open(os.dup(1), "w", buffering=1, encoding="utf-8")  # noqa: SIM115
    sys.stderr = open(os.dup(2), "w", buffering=1, encoding="utf-8")  # noqa: SIM115
    handler.setStream(sys.stderr)
    status = 1
    try:
      os.environ.update(environ or {})
      os.chdir(REPO)
      sys.argv = [module, *args]
      # Run as `python -m` runs it, which finds the module not imported yet (runpy warns
      # otherwise); a test's own import of it is put back afterwards.
      imported = sys.modules.pop(module, None)
      try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        status = 0
      except SystemExit as e:
        status = zygote.exit_status(e.code)
      except Exception:  # noqa: BLE001 (printed as the interpreter prints an uncaught one)
        sys.excepthook(*sys.exc_info())
      finally:
        if imported is not None:
          sys.modules[module] = imported
    finally:
      for stream in (sys.stdout, sys.stderr):
        stream.flush()
        stream.close()
      os.dup2(saved["fds"][0], 1)
      os.dup2(saved["fds"][1], 2)
      for fd in saved["fds"]:
        os.close(fd)
      sys.argv, sys.stdout, sys.stderr = saved["argv"], saved["stdout"], saved["stderr"]
      handler.setStream(saved["handler"])
      os.chdir(saved["cwd"])
      os.environ.clear()
      os.environ.update(saved["environ"])
      for signum, handler_before in saved["signals"].items():
        signal.signal(signum, handler_before)
    outputs = []
    for f in (out, err):
      f.seek(0)
      outputs.append(f.read().decode("utf-8", errors="replace"))
  result = subprocess.CompletedProcess([sys.executable, "-m", module, *args], status, *outputs)
  return _checked(result, module, args, check)


# Variables that none of the fork server's preloaded modules (tests/zygote.py's PRELOAD) reads
# when imported, only later, when used: a command whose environment differs from the server's
# in these alone is forked all the same (the child gets the command's whole environment before
# it runs), not started as a real `python -m` that imports everything again (about 2.5 s of CPU
# each; the gs://, wandb and multi-device tests start about 25 such processes).
# - XLA_FLAGS: XLA parses it when a process creates its first backend, which the server never
#   does (a child forked with --xla_force_host_platform_device_count sees its devices:
#   tests/test_fork_server.py); jax's cache key reads it at each compile.
# - The gs:// emulator's: gcsfs is imported by the child, after its environment is set;
#   tensorstore reads its endpoint when it opens a bucket; normstudy.records.storage reads the
#   emulator's host when it names the endpoint (its import-time default of the gcsfs flag is set
#   by tests/gcs.py's environment itself); the stage variables when a workdir is staged.
# - wandb's: wandb is imported by the child.
# Not HOME, XDG_*, PYTHONPATH or JAX_*: matplotlib, Python and jax read those at import.
READ_AT_USE = frozenset({
    "PYTEST_CURRENT_TEST", "XLA_FLAGS", "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "NORMSTUDY_STAGE_DIR", "NORMSTUDY_STAGES",
    "WANDB_MODE", "WANDB_SILENT"})


def _at_import(env):
  """An environment but for what no preloaded import reads (READ_AT_USE; the child gets the
  command's whole environment once it is forked)."""
  return {k: v for k, v in env.items() if k not in READ_AT_USE}


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
