"""A sweep's programs side by side: one worker process per equal share of the cores.

On XLA:CPU one process does not keep two cores busy with programs this small, so two programs
in two processes, each pinned to one core, train more run-steps per second than the same
programs one after another in one two-core process (benchmarks/workers.py measures it;
docs/throughput.md).

Determinism: XLA:CPU's results depend on the size of its thread pool (how it splits a dot's
sums), so each worker starts XLA on all of the sweep's cores and only then pins itself to its
share: its programs compute bit for bit what they compute in one process, with any number of
workers, and what normstudy.main computes for each run alone.

Stops: a worker dies with the sweep's process (PR_SET_PDEATHSIG). SIGTERM or SIGINT to the sweep
is passed on to the workers, whose programs checkpoint and stop (errors.Preempted) as in one
process; programs not yet started do not start. A worker killed by a signal (the out-of-memory
killer, a kill) stops the sweep with one line naming its program (errors.WorkerKilled); its runs
continue from their newest checkpoints with the same command. The workers are processes this
module starts itself, so it knows each one's pid, program and exit status.
"""

import ctypes
import multiprocessing
from multiprocessing import connection
import os
import pickle
import shlex
import signal
import sys
import traceback

from absl import logging

from normstudy.engine.logs import quiet_library_logs
from normstudy.errors import Preempted
from normstudy.errors import WorkerKilled

_PR_SET_PDEATHSIG = 1


def available_cores() -> list:
  return sorted(os.sched_getaffinity(0))


def count(num_programs: int, requested: int, side_by_side: bool) -> int:
  """Workers for a grid of `num_programs` programs: `requested` when >= 1 (at most one per
  core), else one per core up to one per program; always 1 when programs may not train side by
  side (normstudy.engine.platform: off the CPU, one accelerator)."""
  if not side_by_side or num_programs < 2:
    return 1
  cores = len(available_cores())
  return max(1, min(cores, requested if requested >= 1 else num_programs))


class NotStarted(Preempted):
  """A program that did not start because the sweep was stopping."""


def _start(cores, verbosity):
  """A worker's set-up, before it takes any call."""
  try:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):  # not Linux: a killed sweep may leave its workers running
    pass
  # Between programs a stop is the sweep's to handle; during one, normstudy.engine.train's handlers.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  logging.use_absl_handler()
  quiet_library_logs()
  logging.set_verbosity(verbosity)
  # XLA:CPU splits work by the size of its thread pool, fixed when its client starts, and its
  # results' last bits follow that split, not the cores the threads run on. The client starts
  # here, on the sweep's cores, before the worker is pinned to its share: a program computes
  # bit for bit what it computes in one process on the whole machine (normstudy.main's run).
  import jax  # pylint: disable=import-outside-toplevel
  jax.devices()
  os.sched_setaffinity(0, cores)


def _sendable(error: BaseException) -> BaseException:
  """The error as it can cross to the sweep: itself with its traceback as a note, or (if it
  does not pickle) a RuntimeError with its text."""
  remote = "".join(traceback.format_exception(error))
  try:
    pickle.dumps(error)
  except Exception:  # noqa: BLE001 (any pickling failure)
    error = RuntimeError(remote)
  else:
    error.add_note(f"in a worker process:\n{remote}")
  return error


def _worker(cores, fn, calls, tasks, results, stop, verbosity):
  """A worker's life: set-up, then calls[i] for each i from `tasks` until its None, each
  reported on its own pipe `results` as ("start", index) and ("done", index, error or None). A
  pipe's send is complete when it returns, so a worker killed mid-call has already said which
  call it was."""
  _start(cores, verbosity)
  for index in iter(tasks.get, None):
    args = calls[index]
    if stop.is_set():
      results.send(("done", index, NotStarted(
          "stopped before this program started; run the same command to continue")))
      continue
    results.send(("start", index))
    try:
      fn(*args)
    except BaseException as e:  # noqa: BLE001 (every failure goes to the sweep)
      stop.set()  # before this worker takes the next call
      results.send(("done", index, _sendable(e)))
    else:
      results.send(("done", index, None))


def _killed(slot: int, process, index, calls, describe) -> WorkerKilled:
  code = process.exitcode
  how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
         else f"exited with code {code}")
  program = (f"while it trained {describe(calls[index])}" if index is not None
             else "between programs")
  return WorkerKilled(
      f"worker process {slot + 1} (pid {process.pid}) was {how} {program}; its runs continue "
      f"from their newest checkpoints: run the same command ({shlex.join(sys.orig_argv)})")


def run(fn, calls: list, num_workers: int, describe=repr, on_done=None) -> None:
  """fn(*args) for every args in `calls`, in `num_workers` spawned processes, each pinned to
  its own share of len(cores) // num_workers cores. After a failure or a stop signal no further
  call starts; once every started call has returned, raises Preempted after a signal, else the
  first failure (WorkerKilled for a worker that died: `describe(args)` names its call).
  `on_done(i)` is called here after each call (calls[i]) that returns without failing."""
  cores = available_cores()
  share = len(cores) // num_workers
  context = multiprocessing.get_context("spawn")
  # The queue carries call indices only: it is a pipe, and the calls themselves (each program's
  # runs and configs) outgrow its buffer (64 KiB on Linux; a search's round of 72 runs did),
  # which would block this put with no worker yet reading. Each worker gets `calls` at start.
  tasks, stop = context.SimpleQueue(), context.Event()
  for item in list(range(len(calls))) + [None] * num_workers:
    tasks.put(item)
  pipes = [context.Pipe(duplex=False) for _ in range(num_workers)]
  processes = [context.Process(
      target=_worker, name=f"normstudy-worker-{slot + 1}",
      args=(cores[slot * share:(slot + 1) * share], fn, calls, tasks, pipes[slot][1], stop,
            logging.get_verbosity())) for slot in range(num_workers)]
  signalled = []

  def forward(signum, frame):
    del frame
    signalled.append(signum)
    if len(signalled) == 1:
      logging.warning("%s received: passing it to the workers", signal.Signals(signum).name)
    stop.set()
    for process in processes:
      if process.is_alive():
        os.kill(process.pid, signal.SIGTERM)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    for process, (_, sender) in zip(processes, pipes):
      process.start()
      sender.close()  # the worker's end: a worker's exit then ends its pipe here
    failures = _collect(processes, [reader for reader, _ in pipes], stop, calls, describe,
                        on_done)
  finally:
    for process in processes:
      process.join()
    for s, handler in previous.items():
      signal.signal(s, handler)
  if signalled and any(isinstance(e, Preempted) for _, e in failures):
    raise _stopped(signal.Signals(signalled[0]).name, failures, calls, describe)
  # The first real failure; a NotStarted only if nothing else failed.
  errors_ = sorted((e for _, e in failures), key=lambda e: isinstance(e, NotStarted))
  if errors_:
    raise errors_[0]


def _stopped(name: str, failures: list, calls: list, describe) -> Preempted:
  """After a stop signal: one line per program that stopped at its checkpoint (logged), and
  one Preempted that counts them and the programs that had not started."""
  # A worker killed between programs has no call (index None): its line comes last.
  stopped = sorted(((i, e) for i, e in failures if not isinstance(e, NotStarted)),
                   key=lambda item: (item[0] is None, item[0] or 0))
  for index, error in stopped:
    where = describe(calls[index]) if index is not None else "between programs"
    logging.warning("%s: %s", where, str(error).split("\n")[0])
  waiting = sum(isinstance(e, NotStarted) for _, e in failures)
  return Preempted(
      f"{name}: {len(stopped)} program(s) stopped, each at its checkpoint (one line each "
      f"above), {waiting} not started; run the same command to continue")


def _collect(processes, readers, stop, calls, describe, on_done=None) -> list:
  """Every call's outcome, until each worker's pipe has ended (it exited): the failures as
  (call index, error), in the order they came (a worker that ended without reporting its call
  done, or with a non-zero exit, is a WorkerKilled)."""
  running, failures, open_ = {}, [], dict(enumerate(readers))
  while open_:
    for reader in connection.wait(list(open_.values())):
      slot = readers.index(reader)
      try:
        kind, index, *error = reader.recv()
      except EOFError:  # the worker has exited: everything it sent was read before this
        del open_[slot]
        processes[slot].join()
        if processes[slot].exitcode != 0 or slot in running:
          index = running.pop(slot, None)
          failures.append((index, _killed(slot, processes[slot], index, calls, describe)))
          stop.set()
        continue
      if kind == "start":
        running[slot] = index
      else:
        running.pop(slot, None)
        if error[0] is not None:
          failures.append((index, error[0]))
        elif on_done is not None:
          on_done(index)
  return failures
