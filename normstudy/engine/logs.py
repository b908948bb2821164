"""What a normstudy process prints: its own lines on the terminal, its libraries' in a log file.

`quiet_library_logs()` (every command, and every worker process of a sweep) sorts the log
records: normstudy's own lines (and those of the user's config files and scripts) reach the
terminal; the libraries' (jax, orbax, tensorstore, gcsfs, tensorflow_datasets, asyncio, ...) at
WARNING and below are kept for the log file (gcsfs's errors too), as are the tracebacks that
background threads of orbax and tensorstore log for a failure the main thread reports (a full
disk, a damaged checkpoint; whatever orbax's checkpoint writers hand to the main thread). The
libraries' other ERROR lines still reach the terminal.

`library_output_to(path)` (around the training of a run or a sweep's program: normstudy.
experiments.planning) opens that log file (`normstudy.log`, normstudy.records.schema.
LIBRARY_LOG): the library records kept so far and those to come are appended to it, and so is
everything native code writes to the process's stderr while training (XLA's "Very slow
compile?" banner, tensorstore's and gRPC's own logging), which no Python filter can reach.

`--verbosity=1` (absl's flag: debug) turns all of this off: every line on the terminal.

`compiling(what)` wraps the call that compiles a program in two lines: when compilation starts,
and when it ended, with its time and whether the compile cache supplied it.
"""

import collections
import contextlib
import logging as std_logging
import os
import site
import sys
import threading
import time

from absl import logging

from normstudy import errors


# Library records logged before a log file is open (a gs:// workdir's staging, the data build),
# kept for it; the newest of them if there are many.
_EARLY_RECORDS = 2000
_QUIET_MESSAGES = (
    "Using custom data configuration",
    # orbax reads a damaged checkpoint's arrays in parallel; after the first failure (which
    # normstudy reports in one line) the others end as unretrieved asyncio task errors.
    "Task exception was never retrieved",
)
# Every line of these goes to the file, errors too: gcsfs logs each retry of an unreachable or
# refusing bucket, then its giving up, with chained tracebacks before it raises; normstudy.records
# .storage reports the failure in one line.
_FILE_ONLY_PACKAGES = ("/gcsfs/",)
# orbax (0.12.8) logs a failure of one of its checkpoint writer threads with its traceback from
# these two files, and keeps the exception for the main thread, which raises it from the next
# save or wait_until_finished, where normstudy reports it: one line for a failure of the machine
# (normstudy.engine.checkpoints names the consequences of a full disk), the traceback for a bug.
# The thread's copy goes to the file whatever the exception (a truncated metadata file's
# JSONDecodeError, say).
_REPORTED_BY_THE_MAIN_THREAD = ("/orbax/checkpoint/_src/futures/future.py",
                                "/orbax/checkpoint/_src/checkpointers/async_checkpointer.py")
_OWN_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _installed_prefixes() -> tuple:
  """Where installed code lives: the standard library and site-packages (of a venv and of the
  Python it was made from). normstudy's own package is not a library even when installed."""
  prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
  try:
    prefixes.update(site.getsitepackages())
  except AttributeError:  # an old virtualenv's site module
    pass
  return tuple(os.path.abspath(p) + os.sep for p in prefixes if p)


class _State:
  """The process's log file (None until library_output_to opens one) and the library records
  kept until then."""

  def __init__(self):
    self.file = None
    self.early = collections.deque(maxlen=_EARLY_RECORDS)
    self.announced = set()  # the log files this process has named on the terminal
    self.lock = threading.Lock()
    self.prefixes = _installed_prefixes()
    self.said_at = time.monotonic()  # when the terminal last got a line
    self.heartbeat = None  # the Heartbeat of the program training in this process
    self.compiled_s = 0.0  # seconds spent in `compiling` (a sweep's ETA leaves them out)
    self.rate_listener = None  # told a program's first steady seconds per run-step


_state = _State()


def verbose() -> bool:
  """Whether the user asked for every line on the terminal (`--verbosity=1` or more)."""
  return logging.get_verbosity() >= logging.DEBUG


def is_library_record(record) -> bool:
  """Whether a log record comes from installed code (a library, the standard library) rather
  than from normstudy or the user's own files (config files, scripts)."""
  path = os.path.abspath(record.pathname)
  if path.startswith(_OWN_PACKAGE + os.sep):
    return False
  return path.startswith(_state.prefixes)


def _keep(line: str) -> None:
  with _state.lock:
    if _state.file is not None:
      try:
        _state.file.write(line + "\n")
      except OSError:  # a full disk or a file-size limit: the log is not worth a traceback in
        _state.file = None  # every library's logging call; the run's own error says why
    else:
      _state.early.append(line)


class _LibraryLines(std_logging.Filter):
  """On the absl handler: passes the lines meant for the terminal, keeps the rest for the log
  file (formatted as the terminal would have shown them)."""

  def __init__(self, formatter):
    super().__init__()
    self.formatter = formatter

  def filter(self, record):
    if verbose():
      return True
    to_file = False
    path = record.pathname.replace("\\", "/")
    if record.exc_info and errors.environment_problem(record.exc_info[1]):
      # orbax reports a full disk from each of its background threads and asyncio tasks (logged
      # from orbax's or asyncio's modules), with a traceback; the same error reaches the main
      # thread, which reports it in one line.
      to_file = True
    elif record.exc_info and path.endswith(_REPORTED_BY_THE_MAIN_THREAD):
      to_file = True
    elif any(m in str(record.msg) for m in _QUIET_MESSAGES):
      to_file = True
    elif is_library_record(record) and (record.levelno <= std_logging.WARNING or any(
        p in path for p in _FILE_ONLY_PACKAGES)):
      to_file = True
    if to_file:
      _keep(self.formatter.format(record))
    else:
      _state.said_at = time.monotonic()
    return not to_file


def _ignore_closed_loop_callbacks(unraisable):
  # After orbax gives up on a damaged checkpoint, tensorstore reads still in flight complete
  # into orbax's closed event loop; each would print a traceback for a failure already reported.
  if isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(
      unraisable.exc_value):
    return
  sys.__unraisablehook__(unraisable)


def _quiet_thread_environment_errors(args):
  # A background writer thread that hits a full disk: the main thread reports it in one line.
  if not errors.environment_problem(args.exc_value):
    threading.__excepthook__(args)


def quiet_library_logs():
  """Installs the sorting of log records (module docstring) on absl's handler, at INFO unless
  the user asked for more."""
  sys.unraisablehook = _ignore_closed_loop_callbacks
  threading.excepthook = _quiet_thread_environment_errors
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _LibraryLines) for f in handler.filters):
    handler.addFilter(_LibraryLines(handler.python_handler.formatter))
  if not verbose():
    logging.set_verbosity(logging.INFO)


@contextlib.contextmanager
def library_output_to(path: str):
  """While inside: library records (the kept ones first) and the process's native stderr go
  to `path` (appended, created if needed), and normstudy's lines to the terminal as before.
  Nested or with --verbosity=1: does nothing. Names the file in one line the first time.
  Yields the path written to, or None."""
  if verbose() or _state.file is not None:
    yield None
    return
  if path not in _state.announced:
    _state.announced.add(path)
    logging.info("the libraries' own output (XLA, orbax, tensorstore, gcsfs; warnings and below) "
                 "goes to %s (--verbosity=1 shows it here)", path)
  log = open(path, "a", encoding="utf-8", buffering=1)
  handler = logging.get_absl_handler().python_handler
  python_stderr, handler_stream = sys.stderr, handler.stream
  for stream in (sys.stdout, sys.stderr, handler_stream):
    _flush(stream)
  terminal_fd = os.dup(2)
  terminal = os.fdopen(terminal_fd, "w", buffering=1, encoding="utf-8",
                       errors="backslashreplace")
  with _state.lock:
    _state.file = log
    for line in _state.early:
      log.write(line + "\n")
    _state.early.clear()
  os.dup2(log.fileno(), 2)  # native code's stderr (fd 2) now writes to the log file
  # Python's writes still reach the terminal: the streams that wrote to fd 2 write to its copy
  # (a notebook's or a test's own stderr object is left as it is).
  if _writes_to_fd2(python_stderr):
    sys.stderr = terminal
  if handler_stream is python_stderr:
    handler.stream = sys.stderr
  elif _writes_to_fd2(handler_stream):
    handler.stream = terminal
  try:
    yield path
  finally:
    for stream in (sys.stderr, handler.stream):
      _flush(stream)
    os.dup2(terminal_fd, 2)
    sys.stderr = python_stderr
    handler.stream = handler_stream
    with _state.lock:
      _state.file = None
    terminal.close()
    log.close()


def _flush(stream) -> None:
  try:
    stream.flush()
  except (AttributeError, OSError, ValueError):  # not a file, or closed
    pass


def _writes_to_fd2(stream) -> bool:
  try:
    return stream.fileno() == 2
  except (AttributeError, OSError, ValueError):  # not a file, or detached
    return False


class _CompileCacheEvents:
  """Counts jax's compile-cache hits and misses (jax.monitoring events, jax 0.10), from the
  first use on."""

  def __init__(self):
    self.hits = self.misses = 0
    self.registered = False

  def listen(self, event, **unused_kwargs):
    if event == "/jax/compilation_cache/cache_hits":
      self.hits += 1
    elif event == "/jax/compilation_cache/cache_misses":
      self.misses += 1

  def counts(self):
    if not self.registered:
      import jax  # pylint: disable=import-outside-toplevel
      jax.monitoring.register_event_listener(self.listen)
      self.registered = True
    return self.hits, self.misses


_cache_events = _CompileCacheEvents()


@contextlib.contextmanager
def compiling(what: str, tag: str = ""):
  """A line before the call inside (which compiles `what`; `tag`: the program's, "[program
  2/5]") and one after it: how long it took and where the program came from (compiled, the
  compile cache, or both for a program of several executables); the heartbeat says "compiling"
  meanwhile. Only the compilation is timed: jax dispatches the program's run asynchronously."""
  hits, misses = _cache_events.counts()
  logging.info("%scompiling %s ...", f"{tag} " if tag else "", what)
  doing(f"compiling {what}")
  start = time.perf_counter()
  yield
  doing("training")
  took = time.perf_counter() - start
  new_hits, new_misses = _cache_events.hits - hits, _cache_events.misses - misses
  if new_hits and not new_misses:
    source = "loaded from the compile cache"
  elif new_hits:
    source = f"compiled ({new_hits} part(s) from the compile cache)"
  else:
    source = "compiled"
  logging.info("%s%s: %s in %.1fs", f"{tag} " if tag else "", what, source, took)
  _state.compiled_s += took


def compile_seconds() -> float:
  """The seconds this process has spent in `compiling` so far (a sweep's ETA leaves them out
  of a program's steady time)."""
  return _state.compiled_s


class Heartbeat:
  """A line at least every `every` seconds while a program trains: when the terminal has had
  no line for that long (a long compile, slow steps on a loaded machine), one saying what the
  program is doing, for how long, and since when the program started ("[program 2/5] compiling
  the train step (4 run(s)): 60s at this, 75s since the program started": a step's time alone
  would read as the total). `beat` is called by the heartbeat's thread each second (and by
  tests, on their own clock)."""

  def __init__(self, tag: str = "", every: float = 30.0, clock=time.monotonic):
    self.tag, self.every, self.clock = tag, every, clock
    self.what, self.since = "preparing (data, parameters, checkpoints)", clock()
    self.started = self.since  # the program's start: the line says its total too

  def doing(self, what: str) -> None:
    if what != self.what:
      self.what, self.since = what, self.clock()

  def beat(self) -> str | None:
    now = self.clock()
    if now - max(_state.said_at, self.since) < self.every:
      return None
    line = (f"{self.tag + ' ' if self.tag else ''}{self.what}: {now - self.since:.0f}s at "
            f"this, {now - self.started:.0f}s since the program started")
    logging.info("%s", line)
    _state.said_at = now  # also when the filter is not installed (a notebook, a test)
    return line


def doing(what: str) -> None:
  """Tells this process's heartbeat (if a program is training) what the program does now."""
  if _state.heartbeat is not None:
    _state.heartbeat.doing(what)


@contextlib.contextmanager
def rates_to(listener):
  """While inside, `listener(seconds per run-step)` hears the steady rate a program training in
  this process first measures (a sweep's first estimate of its whole time, before any program
  has finished: normstudy.experiments.planning)."""
  previous, _state.rate_listener = _state.rate_listener, listener
  try:
    yield
  finally:
    _state.rate_listener = previous


def tell_rate(seconds_per_run_step: float) -> None:
  if _state.rate_listener is not None:
    _state.rate_listener(seconds_per_run_step)


@contextlib.contextmanager
def heartbeat(tag: str = "", every: float = 30.0):
  """While inside, a Heartbeat's thread keeps the terminal from going quiet for `every`
  seconds (a study's compile on a loaded machine can take ten minutes)."""
  beat, stop = Heartbeat(tag, every), threading.Event()
  previous, _state.heartbeat = _state.heartbeat, beat

  def keep_beating():
    while not stop.wait(min(1.0, every / 4)):
      beat.beat()

  thread = threading.Thread(target=keep_beating, name="normstudy-heartbeat", daemon=True)
  thread.start()
  try:
    yield beat
  finally:
    stop.set()
    thread.join()
    _state.heartbeat = previous
