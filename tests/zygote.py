"""A fork server for the tests' command processes (tests/runs.run_module).

Most of what a tiny end-to-end command costs in the suite is the process's start: Python, then
JAX, Flax, Optax, Orbax and normstudy's layers imported again in every one of about 150
processes (1.5-2.5 s each on 2 cores). This server imports them once and forks a child per
command, so each command still runs in a process of its own, with its own exit status, its own
output and the module run as `python -m` runs it (`runpy.run_module(name, run_name="__main__",
alter_sys=True)`, `sys.path[0]` the working directory), but starts with the libraries already
imported. No XLA backend is started here (nothing is computed), so a child starts XLA itself,
with the XLA_FLAGS and compilation cache of the environment the server was started with.

What a child cannot have is a different environment at import: tests/runs.py sends a command
here only when its environment, working directory and options are exactly those this server was
started with (starting another when the test process's environment has changed), and starts a
real `python -m` otherwise. The tests of what a command imports (tests/test_imports.py,
tests/test_notebook_env.py) start their own interpreters; the signal tests' commands
(tests/runs.start_module) are forked here too, and take their signals as real processes do.

Protocol, JSON lines on this process's stdin and stdout; children run side by side:
  -> {"module", "args", "env", "stdout", "stderr"}   (the paths receive the child's fds 1 and 2)
  <- {"forked": pid}   at once, in the order of the requests
  <- {"pid": pid, "returncode": code}   when a child ends: its exit status, or -N if signal N
     ended it
The server ends when its stdin closes.
"""

import gc
import json
import os
import sys

# What every command shares (and `python -m normstudy.<command>` would import anyway). Not the
# entry modules themselves: runpy warns when the module it runs is already imported. The
# analysis (pandas, scipy, matplotlib's figures) is here too: every sweep, study, search share
# and analysis imports it, 1.3 s of such a child. Its libraries leave threads behind at import
# (pyarrow's jemalloc background thread, scipy's OpenBLAS workers), which a fork does not copy;
# both libraries register fork handlers that reset their state in the child (pthread_atfork).
# Measured (2026-12-04, tests/test_search.py, test_sensitivity.py, test_techniques_table.py and
# test_ladder.py, two workers, two alternating rounds): 63.7 and 68.8 s without it, 57.6 and
# 53.5 s with it.
# TensorFlow Datasets (without TensorFlow) is what a training command imports when it loads its
# data, 0.2 s a child; importing it defines one absl flag of its own (tfds_debug_list_dir, for
# its community catalog), which a child then has before its flags are parsed.
PRELOAD = ("numpy", "jax", "jax.numpy", "flax.linen", "optax", "orbax.checkpoint",
           "ml_collections.config_flags", "absl.app", "matplotlib", "normstudy.cli",
           "normstudy.experiments.planning", "normstudy.experiments.search_runner",
           "normstudy.analysis", "matplotlib.figure", "matplotlib.backends.backend_agg",
           "tensorflow_datasets")


# Environment variables the preloaded modules set when imported (normstudy's library defaults,
# e.g. EPATH_USE_TF): a child's environment is its command's, with these as an import would set
# them.
SET_AT_IMPORT = {}


def exit_status(code) -> int:
  """What the interpreter makes of SystemExit(code) (Python's handle_system_exit)."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xFF
  print(code, file=sys.stderr)
  return 1


def _child(request) -> None:
  """Runs in the forked child; never returns."""
  import atexit
  import runpy
  import signal
  import threading
  status = 1
  try:
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
      os.dup2(fd, target)
      os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    for name, value in SET_AT_IMPORT.items():  # what the preloaded imports would set again
      os.environ.setdefault(name, value)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [request["module"], *request["args"]]  # runpy sets argv[0] to the module's file
    try:
      runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
      status = 0
    except SystemExit as e:
      status = exit_status(e.code)
    except BaseException:  # pylint: disable=broad-except
      sys.excepthook(*sys.exc_info())  # what the interpreter prints for an uncaught exception
      status = 1
    # The interpreter's own shutdown: non-daemon threads joined, then atexit's functions.
    threading._shutdown()  # pylint: disable=protected-access
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except
        pass
    os._exit(status)  # pylint: disable=protected-access


def main() -> None:
  import importlib
  import select
  sys.path[0] = os.getcwd()  # as `python -m` has it, not this file's folder
  before = dict(os.environ)
  for name in PRELOAD:
    importlib.import_module(name)
  SET_AT_IMPORT.update({k: v for k, v in os.environ.items() if before.get(k) != v})
  # The imported libraries' objects live as long as any child: frozen, Python's full
  # collections in a child do not walk them (about 0.25-0.3 s of a tiny command's 1.6-1.8 s,
  # 2026-12-04), and a child's collections do not write to their shared pages.
  gc.collect()
  gc.freeze()
  replies = os.fdopen(os.dup(1), "w", buffering=1)
  print(json.dumps({"ready": os.getpid()}), file=replies)
  pending, children, open_ = b"", set(), True
  while open_ or children:
    # Children are reaped by polling (every 10 ms while any is alive), not on SIGCHLD, so a
    # child never starts with this server's handler installed.
    readable = select.select([0] if open_ else [], [], [], 0.01 if children else None)[0]
    for pid in list(children):
      done, wait_status = os.waitpid(pid, os.WNOHANG)
      if done:
        children.discard(pid)
        print(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(wait_status)}),
              file=replies)
    if not readable:
      continue
    chunk = os.read(0, 1 << 16)
    open_ = bool(chunk)
    pending += chunk
    while b"\n" in pending:
      line, pending = pending.split(b"\n", 1)
      request = json.loads(line)
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        replies.close()
        _child(request)
      children.add(pid)
      print(json.dumps({"forked": pid}), file=replies)


if __name__ == "__main__":
  main()
