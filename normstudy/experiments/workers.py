"""A sweep's programs side by side: one worker process per equal share of the cores.

On XLA:CPU one process does not keep two cores busy with programs this small, so two programs
in two processes, each pinned to one core, train more run-steps per second than the same
programs one after another in one two-core process (benchmarks/grids.py workers measures it;
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

import contextlib
import ctypes
import multiprocessing
from multiprocessing import connection
import os
import pickle
import shlex
import signal
import sys
import time
import traceback

from absl import flags
from absl import logging

from normstudy.engine import logs
from normstudy.engine.logs import quiet_library_logs
from normstudy.errors import Preempted
from normstudy.errors import WorkerKilled

_PR_SET_PDEATHSIG = 1


# Set by run_commands for its children: the pid whose death stops them (normstudy.cli.run).
PARENT_ENV = "NORMSTUDY_STOP_WITH_PARENT"


def stop_with_parent() -> None:
  """In a command started by run_commands: SIGTERM when that parent dies (kill -9 included),
  so a stage never trains on as an orphan; nothing elsewhere."""
  parent = os.environ.pop(PARENT_ENV, "")
  if not parent:
    return
  try:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
  except (OSError, AttributeError):  # not Linux
    return
  if str(os.getppid()) != parent:  # it died before the prctl took hold
    os.kill(os.getpid(), signal.SIGTERM)


def run_commands(commands: list) -> list:
  """Runs each command (an argv) in its own process, side by side, and returns their exit
  codes: a ladder's rungs and a drift's stages are sweeps in processes of their own. SIGTERM to
  this process is passed on to each (a sweep checkpoints and stops) and, once all have stopped,
  raised as Preempted; each gets SIGTERM if this process dies (stop_with_parent). Ctrl-C in a
  terminal reaches them from the terminal itself."""
  import subprocess  # pylint: disable=import-outside-toplevel
  env = {**os.environ, PARENT_ENV: str(os.getpid())}
  processes = [subprocess.Popen(command, env=env) for command in commands]
  got = []

  def forward(signum, frame):
    del frame  # no logging in a handler: it can re-enter a write it interrupted
    got.append(signum)
    for process in processes:
      if process.poll() is None:
        process.send_signal(signum)

  previous = signal.signal(signal.SIGTERM, forward)
  try:
    codes = [process.wait() for process in processes]
  finally:
    signal.signal(signal.SIGTERM, previous)
  if got:
    raise Preempted(f"SIGTERM: passed to the {len(processes)} process(es) it was running, "
                    "each stopped at its checkpoint; run the same command to continue")
  return codes


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
  # A worker parses no command line: its lines would each begin with absl's "Logging before
  # flag parsing goes to stderr" otherwise.
  flags.FLAGS.mark_as_parsed()
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


def _worker(cores, tasks, results, stop, verbosity):
  """A worker's life: set-up, then each task (run, index, fn, args) from `tasks` until its
  None, each reported on its own pipe `results` as ("start", run, index) and ("done", run,
  index, error) or ("done", run, index, None, what fn returned), and between them ("rate", run,
  index, seconds per run-step) when its program first steps steadily. A pipe's send is complete
  when it returns, so a worker killed mid-call has already said which call it was. The process
  lives as long as its pool: what it keeps between calls (XLA's client, the compiled steps of
  its programs) serves the next ones."""
  _start(cores, verbosity)
  for run_id, index, fn, args in iter(tasks.get, None):
    if stop.is_set():
      results.send(("done", run_id, index, NotStarted(
          "stopped before this program started; run the same command to continue")))
      continue
    results.send(("start", run_id, index))
    try:
      with logs.rates_to(lambda spr, r=run_id, i=index: results.send(("rate", r, i, spr))):
        value = fn(*args)
    except BaseException as e:  # noqa: BLE001 (every failure goes to the sweep)
      stop.set()  # before this worker takes the next call
      results.send(("done", run_id, index, _sendable(e)))
    else:
      results.send(("done", run_id, index, None, value))


def _killed(slot: int, process, index, calls, describe) -> WorkerKilled:
  code = process.exitcode
  how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
         else f"exited with code {code}")
  program = (f"while it trained {describe(calls[index])}" if index is not None
             else "between programs")
  return WorkerKilled(
      f"worker process {slot + 1} (pid {process.pid}) was {how} {program}; its runs continue "
      f"from their newest checkpoints: run the same command ({shlex.join(sys.orig_argv)})")


def run(fn, calls: list, num_workers: int, describe=repr, on_done=None, on_start=None,
        on_rate=None) -> None:
  """fn(*args) for every args in `calls`, in `num_workers` spawned processes, each pinned to
  its own share of len(cores) // num_workers cores (a Pool used once). After a failure or a
  stop signal no further call starts; once every started call has returned, raises Preempted
  after a signal, else the first failure (WorkerKilled for a worker that died: `describe(args)`
  names its call). `on_start(i, worker)` is called here when a worker starts calls[i],
  `on_done(i, value)` after each call that returns `value` without failing, `on_rate(i,
  seconds per run-step)` when calls[i]'s program first steps steadily."""
  with Pool() as pool:
    pool.run(fn, calls, num_workers, describe, on_done, on_start, on_rate)


class Pool:
  """Worker processes kept across several `run`s, e.g. a search's rounds:

    with Pool() as pool:
      pool.run(fn, calls, num_workers)   # starts num_workers processes on its first use
      pool.run(fn, more_calls, ...)      # the same processes

  Each worker starts XLA once and keeps the compiled steps of the programs it trained
  (normstudy.engine.execution), so a later round's program of the same structure is neither
  traced nor loaded from the compile cache again: on 2 CPU cores, about 8 s a program at the
  seed size (docs/throughput.md). Which worker trains a call does not change its bits (each
  computes what one process computes). Closing puts an end to the workers: an idle one exits,
  one still in a call is stopped after a grace period."""

  def __init__(self):
    self.processes, self.readers, self.started_runs = [], [], 0
    self._context = multiprocessing.get_context("spawn")
    self._tasks = self._stop = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def _start(self, num_workers: int) -> None:
    self._tasks, self._stop = self._context.Queue(), self._context.Event()
    self.processes, self.readers = _start_workers(self._context, num_workers, self._tasks,
                                                  self._stop)

  def run(self, fn, calls: list, num_workers: int, describe=repr, on_done=None,
          on_start=None, on_rate=None) -> None:
    """fn(*args) for every args in `calls` in the pool's workers (`num_workers` of them start
    on the first run; later runs use those), with `run`'s semantics."""
    if not self.processes:
      self._start(num_workers)
    for slot, process in enumerate(self.processes):
      if not process.is_alive():  # it died while the pool waited between runs
        raise _killed(slot, process, None, calls, describe)
    self.started_runs += 1
    run_id = self.started_runs
    self._stop.clear()
    for index, args in enumerate(calls):
      self._tasks.put((run_id, index, fn, args))
    signalled = []
    with _forwarding_signals(self.processes, self._stop, signalled):
      failures = _collect(self.processes, self.readers, self._stop, run_id, calls, describe,
                          on_done, on_start, on_tick=StopAnnouncer(signalled), on_rate=on_rate)
    if signalled and any(isinstance(e, Preempted) for _, e in failures):
      raise _stopped(signal.Signals(signalled[0]).name, failures, calls, describe)
    # The first real failure; a NotStarted only if nothing else failed.
    errors_ = sorted((e for _, e in failures), key=lambda e: isinstance(e, NotStarted))
    if errors_:
      raise errors_[0]

  def close(self, grace_s: float = 60.0) -> None:
    """Ends the workers: each takes a None after its last call and exits; one that has not
    exited after `grace_s` seconds (it was in a call when the sweep stopped on an error of its
    own) is terminated."""
    if not self.processes:
      return
    for _ in self.processes:
      self._tasks.put(None)
    for process in self.processes:
      process.join(grace_s)
      if process.is_alive():
        process.terminate()
        process.join()
    # Calls still queued (a run whose workers all died) have no reader left: drop them rather
    # than wait for the feeder thread to push them into a full pipe.
    self._tasks.cancel_join_thread()
    self._tasks.close()
    self.processes = []


def _start_workers(context, num_workers: int, tasks, stop) -> tuple:
  """(processes, the pipes' reading ends) of `num_workers` workers, each pinned to its share of
  the available cores, taking calls from `tasks` (a Queue, not a pipe written here: its feeder
  thread sends each call, whose runs and configs outgrow a pipe's 64 KiB buffer as a search's
  round of 72 runs did, while this process goes on to read the workers' reports)."""
  cores = available_cores()
  share = len(cores) // num_workers
  pipes = [context.Pipe(duplex=False) for _ in range(num_workers)]
  processes = [context.Process(
      target=_worker, name=f"normstudy-worker-{slot + 1}",
      args=(cores[slot * share:(slot + 1) * share], tasks, pipes[slot][1], stop,
            logging.get_verbosity())) for slot in range(num_workers)]
  for process, (_, sender) in zip(processes, pipes):
    process.start()
    sender.close()  # the worker's end: a worker's exit then ends its pipe here
  return processes, [reader for reader, _ in pipes]


@contextlib.contextmanager
def _forwarding_signals(processes: list, stop, signalled: list):
  """While a run's calls are collected, SIGINT and SIGTERM are passed to the workers (each
  checkpoints and stops) and appended to `signalled`; the handlers before are put back."""
  def forward(signum, frame):
    # No logging here: a handler that writes can re-enter a write it interrupted. The workers
    # each say what they do with the signal.
    del frame
    signalled.append(signum)
    stop.set()
    for process in processes:
      if process.is_alive():
        os.kill(process.pid, signal.SIGTERM)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


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


class StopAnnouncer:
  """Said from the collecting loop, not from the signal handler (a handler that writes can
  re-enter a write it interrupted): once a stop signal is in `signalled`, a line at once saying
  what happens next, then one every `every` seconds until the programs have stopped (a worker
  finishing a compile can take minutes)."""

  def __init__(self, signalled: list, every: float = 30.0, clock=time.monotonic):
    self.signalled, self.every, self.clock = signalled, every, clock
    self.since = self.said_at = None

  def __call__(self, running: int) -> str | None:
    """`running`: the programs still in a worker. Returns the line said, if any."""
    if not self.signalled:
      return None
    now, name = self.clock(), signal.Signals(self.signalled[0]).name
    if self.since is None:
      self.since = self.said_at = now
      line = (f"{name} received: passed it to the workers; each of the {running} running "
              "program(s) stops at its next step and saves a checkpoint (one compiling "
              "finishes its compile first)")
    elif now - self.said_at >= self.every and running:
      self.said_at = now
      line = (f"waiting for {running} program(s) to stop at a checkpoint: "
              f"{now - self.since:.0f}s since {name}")
    else:
      return None
    logging.warning("%s", line)
    return line


def _collect(processes, readers, stop, run_id, calls, describe, on_done=None,
             on_start=None, on_tick=None, on_rate=None) -> list:
  """Every call's outcome, until each call of this run has reported done or no worker is left:
  the failures as (call index, error), in the order they came (a worker that exits during a run
  was killed: a WorkerKilled for the call it was in, if any). `on_tick(programs running)` is
  called at least once a second."""
  running, failures, done = {}, [], 0
  open_ = {slot: reader for slot, reader in enumerate(readers) if processes[slot].is_alive()}
  while open_ and done < len(calls):
    ready = connection.wait(list(open_.values()), timeout=1.0)
    if on_tick is not None:
      on_tick(len(running))
    for reader in ready:
      slot = readers.index(reader)
      try:
        kind, from_run, index, *outcome = reader.recv()  # done: (error,) or (None, value)
      except EOFError:  # the worker has exited: everything it sent was read before this
        del open_[slot]
        processes[slot].join()
        index = running.pop(slot, None)
        failures.append((index, _killed(slot, processes[slot], index, calls, describe)))
        done += index is not None
        stop.set()
        continue
      if from_run != run_id:
        raise RuntimeError(f"worker {slot + 1} reported call {index} of run {from_run} during "
                           f"run {run_id}")
      if kind == "start":
        running[slot] = index
        if on_start is not None:
          on_start(index, slot)
      elif kind == "rate":
        if on_rate is not None:
          on_rate(index, outcome[0])
      else:
        running.pop(slot, None)
        done += 1
        if outcome[0] is not None:
          failures.append((index, outcome[0]))
        elif on_done is not None:
          on_done(index, outcome[1])
  return failures
