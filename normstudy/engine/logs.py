"""What a normstudy process prints: its own lines, not its libraries' routine ones.

`quiet_library_logs()` (every command, and every worker process of a sweep) keeps INFO lines of
the libraries off the terminal, and drops the tracebacks that background threads of orbax and
tensorstore print for a failure the main thread reports in one line (a full disk, a damaged
checkpoint).
"""

import logging as std_logging
import sys
import threading

from absl import logging

from normstudy import errors


# INFO lines from these packages drown the progress lines a researcher watches for.
_QUIET_PACKAGES = ("/orbax/", "/jax/", "/jaxlib/", "/tensorflow_datasets/", "/grain/", "/etils/")
_QUIET_MESSAGES = (
    "Using custom data configuration",
    # orbax reads a damaged checkpoint's arrays in parallel; after the first failure (which
    # normstudy reports in one line) the others end as unretrieved asyncio task errors.
    "Task exception was never retrieved",
)


# Every line of these: gcsfs logs each retry of an unreachable or refusing bucket with chained
# tracebacks before it raises; normstudy.records.storage reports the failure in one line.
_SILENT_PACKAGES = ("/gcsfs/",)


class _LibraryNoise(std_logging.Filter):

  def filter(self, record):
    path = record.pathname.replace("\\", "/")
    if record.levelno < std_logging.WARNING and any(p in path for p in _QUIET_PACKAGES):
      return False
    if any(p in path for p in _SILENT_PACKAGES):
      return False
    if record.exc_info and errors.environment_problem(record.exc_info[1]):
      # orbax reports a full disk from each of its background threads and asyncio tasks (logged
      # from orbax's or asyncio's modules), with a traceback; the same error reaches the main
      # thread, which reports it in one line.
      return False
    return not any(m in str(record.msg) for m in _QUIET_MESSAGES)


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
  sys.unraisablehook = _ignore_closed_loop_callbacks
  threading.excepthook = _quiet_thread_environment_errors
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _LibraryNoise) for f in handler.filters):
    handler.addFilter(_LibraryNoise())
  logging.set_verbosity(logging.INFO)
