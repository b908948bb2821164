"""A sweep's programs side by side: one worker process per equal share of the cores.

On XLA:CPU one process does not keep two cores busy with programs this small; two programs in
two processes, each pinned to one core, train 1.5x the run-steps per second of the same programs
one after another in one two-core process (benchmarks/workers.py, the seed figure's size).

Determinism: XLA:CPU's results depend on the size of its thread pool (how it splits a dot's
sums), so each worker starts XLA on all of the sweep's cores and only then pins itself to its
share: its programs compute bit for bit what they compute in one process, with any number of
workers, and what normstudy.main computes for each run alone.

Stops: a worker dies with the sweep's process (PR_SET_PDEATHSIG). SIGTERM or SIGINT to the sweep
is passed on to the workers, whose programs checkpoint and stop (errors.Preempted) as in one
process; programs not yet started do not start.
"""

import concurrent.futures
import ctypes
import multiprocessing
import os
import signal

from absl import logging
import jax

from normstudy import cli
from normstudy.errors import Preempted

_PR_SET_PDEATHSIG = 1
_STOP = None  # the workers' shared "stop requested" event, set in each worker


def available_cores() -> list:
  return sorted(os.sched_getaffinity(0))


def count(num_programs: int, requested: int, side_by_side: bool) -> int:
  """Workers for a grid of `num_programs` programs: `requested` when >= 1 (at most one per
  core), else one per core up to one per program; always 1 when programs may not train side by
  side (normstudy.platform: off the CPU, one accelerator)."""
  if not side_by_side or num_programs < 2:
    return 1
  cores = len(available_cores())
  return max(1, min(cores, requested if requested >= 1 else num_programs))


def _start_worker(shares, claimed, stop, verbosity):
  global _STOP
  with claimed.get_lock():
    index = claimed.value
    claimed.value += 1
  try:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):  # not Linux: a killed sweep may leave its workers running
    pass
  # Between programs a stop is the sweep's to handle; during one, normstudy.train's handlers.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  _STOP = stop
  logging.use_absl_handler()
  cli.quiet_library_logs()
  logging.set_verbosity(verbosity)
  # XLA:CPU splits work by the size of its thread pool, fixed when its client starts, and its
  # results' last bits follow that split, not the cores the threads run on. The client starts
  # here, on the sweep's cores, before the worker is pinned to its share: a program computes
  # bit for bit what it computes in one process on the whole machine (normstudy.main's run).
  jax.devices()
  os.sched_setaffinity(0, shares[index % len(shares)])


class NotStarted(Preempted):
  """A program that did not start because the sweep was stopping."""


def _call(fn, args):
  if _STOP.is_set():
    raise NotStarted("stopped before this program started; run the same command to continue")
  try:
    return fn(*args)
  except BaseException:
    _STOP.set()  # before this worker takes the next call
    raise


def run(fn, calls: list, num_workers: int) -> None:
  """fn(*args) for every args in `calls`, in `num_workers` spawned processes, each pinned to
  its own share of len(cores) // num_workers cores. After a failure or a stop signal no further
  call starts; once every started call has returned, raises Preempted after a signal, else the
  first failure."""
  cores = available_cores()
  share = len(cores) // num_workers
  shares = [cores[i * share:(i + 1) * share] for i in range(num_workers)]
  context = multiprocessing.get_context("spawn")
  stop = context.Event()
  pool = concurrent.futures.ProcessPoolExecutor(
      num_workers, mp_context=context, initializer=_start_worker,
      initargs=(shares, context.Value("i", 0), stop, logging.get_verbosity()))

  signalled = []

  def forward(signum, frame):
    del frame
    signalled.append(signum)
    if len(signalled) == 1:
      logging.warning("%s received: passing it to the workers", signal.Signals(signum).name)
    stop.set()
    for process in list(getattr(pool, "_processes", {}).values()):  # CPython's executor
      if process.is_alive():
        os.kill(process.pid, signal.SIGTERM)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  failures = []
  try:
    futures = [pool.submit(_call, fn, args) for args in calls]
    for future in concurrent.futures.as_completed(futures):
      try:
        future.result()
      except Exception as e:  # noqa: BLE001 (every failure is reported after the others end)
        failures.append(e)
        stop.set()
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
    for s, handler in previous.items():
      signal.signal(s, handler)
  if signalled:
    failures.sort(key=lambda e: (not isinstance(e, Preempted), isinstance(e, NotStarted)))
  else:
    failures = [e for e in failures if not isinstance(e, NotStarted)] + failures
  if failures:
    raise failures[0]
