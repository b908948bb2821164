"""What reaches the terminal and what the run's log file keeps (normstudy.engine.logs): the
libraries' routine records and native stderr in the file, normstudy's lines and the libraries'
errors on the terminal, nothing diverted at --verbosity=1, and the compile lines. The same end
to end, with XLA's own compile logging: tests/test_integrity.py
(test_help_and_clip_none_and_a_quiet_start)."""

import json
import logging as std_logging
import os
import sys

from absl import logging
import gcsfs.core
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from normstudy.engine import logs


def _record(pathname, level, msg):
  return std_logging.LogRecord("somewhere", level, pathname, 1, msg, None, None)


@pytest.fixture
def handler(monkeypatch):
  """absl's handler with normstudy's filter; call it in the test (after capfd took stderr) to
  write to the sys.stderr the test captures (absl's took the sys.stderr of its import)."""
  logs.quiet_library_logs()
  absl_handler = logging.get_absl_handler()

  def capturing():
    monkeypatch.setattr(absl_handler.python_handler, "stream", sys.stderr)
    return absl_handler
  return capturing


def test_a_record_is_a_librarys_when_installed_code_logged_it():
  assert logs.is_library_record(_record(gcsfs.core.__file__, std_logging.INFO, "x"))
  assert logs.is_library_record(_record(json.__file__, std_logging.INFO, "x"))  # the stdlib
  assert not logs.is_library_record(_record(logs.__file__, std_logging.INFO, "x"))
  assert not logs.is_library_record(_record(__file__, std_logging.INFO, "x"))  # user code


def test_library_lines_and_native_stderr_go_to_the_log_file(tmp_path, capfd, handler):
  handler = handler()
  path = tmp_path / "normstudy.log"
  library = gcsfs.core.__file__
  handler.handle(_record(library, std_logging.WARNING, "logged before the file opened"))
  with logs.library_output_to(str(path)) as written:
    assert written == str(path)
    handler.handle(_record(library, std_logging.WARNING, "retrying the bucket"))
    handler.handle(_record(library, std_logging.INFO, "routine info"))
    handler.handle(_record(library, std_logging.ERROR, "gcsfs out of retries"))
    handler.handle(_record(np.__file__, std_logging.ERROR, "a library's error"))
    handler.handle(_record(logs.__file__, std_logging.INFO, "normstudy's progress"))
    os.write(2, b"a native banner\n")  # what XLA's C++ logging does
  os.write(2, b"native, after the file closed\n")
  terminal = capfd.readouterr().err
  kept = path.read_text()
  for line in ("logged before the file opened", "retrying the bucket", "routine info",
               "gcsfs out of retries", "a native banner"):
    assert line in kept and line not in terminal
  for line in ("a library's error", "normstudy's progress", "native, after the file closed"):
    assert line in terminal and line not in kept


def test_an_orbax_writer_threads_traceback_goes_to_the_file(tmp_path, capfd, handler):
  # orbax keeps a writer thread's exception for the main thread, which reports it; the thread's
  # own record (with its traceback) is kept in the file, whatever the exception.
  handler = handler()
  orbax = os.path.dirname(ocp.__file__)
  try:
    json.loads('{"a": "b')
  except json.JSONDecodeError:
    exc_info = sys.exc_info()
  records = [(os.path.join(orbax, "_src", "futures", "future.py"), "_SignalingThread.run()"),
             (os.path.join(orbax, "_src", "checkpointers", "async_checkpointer.py"),
              "Failed to run 3 Handler Commit operations")]
  with logs.library_output_to(str(tmp_path / "normstudy.log")):
    for path, msg in records:
      record = _record(path, std_logging.ERROR, msg)
      record.exc_info = exc_info
      handler.handle(record)
    elsewhere = _record(np.__file__, std_logging.ERROR, "another library's failure")
    elsewhere.exc_info = exc_info
    handler.handle(elsewhere)
  terminal = capfd.readouterr().err
  kept = (tmp_path / "normstudy.log").read_text()
  for _, msg in records:
    assert msg in kept and msg not in terminal
  assert kept.count("JSONDecodeError") == 2
  assert "another library's failure" in terminal and "JSONDecodeError" in terminal


def test_verbosity_1_keeps_every_line_on_the_terminal(tmp_path, capfd, handler):
  handler = handler()
  before = logging.get_verbosity()
  logging.set_verbosity(logging.DEBUG)
  try:
    with logs.library_output_to(str(tmp_path / "normstudy.log")) as written:
      assert written is None
      handler.handle(_record(gcsfs.core.__file__, std_logging.WARNING, "retrying the bucket"))
      os.write(2, b"a native banner\n")
  finally:
    logging.set_verbosity(before)
  terminal = capfd.readouterr().err
  assert "retrying the bucket" in terminal and "a native banner" in terminal
  assert not (tmp_path / "normstudy.log").exists()


def test_compiling_says_when_it_starts_ends_and_where_the_program_came_from(caplog):
  jax.devices()  # the backend's own start-up lines are not this test's
  caplog.set_level(std_logging.INFO)
  with logs.compiling("the test's step"):
    jax.jit(lambda x: x * 3.0 + 1.25)(np.arange(7.0)).block_until_ready()
  with logs.compiling("a cached step"):  # as jax's compile cache reports a hit (jax 0.10)
    jax.monitoring.record_event("/jax/compilation_cache/cache_hits")
  messages = [r.getMessage() for r in caplog.records if r.pathname == logs.__file__]
  assert messages[0] == "compiling the test's step ..."
  assert messages[1].startswith("the test's step: compiled in ")
  assert float(messages[1].rsplit(" ", 1)[1].rstrip("s")) >= 0
  assert messages[2:] == ["compiling a cached step ...",
                          messages[3]] and messages[3].startswith(
                              "a cached step: loaded from the compile cache in ")


def test_a_program_compiling_says_so_with_its_tag_and_then_every_interval(caplog):
  """Issue 78, item 16: `make study` printed nothing for 10.5 minutes on a loaded machine (a
  213 s compile, then 50 steps). A line when each program starts compiling, with its tag, and,
  while the terminal has had no line for the heartbeat's interval, one saying what the program
  is doing and for how long (the real thread, at 0.2 s instead of 30 s)."""
  import time
  caplog.set_level(std_logging.INFO)
  with logs.heartbeat("[program 2/5]", every=0.2):
    with logs.compiling("the train step (4 run(s))", "[program 2/5]"):
      time.sleep(0.75)  # a compile that takes more than three intervals
  messages = [r.getMessage() for r in caplog.records if r.pathname == logs.__file__]
  assert messages[0] == "[program 2/5] compiling the train step (4 run(s)) ..."
  beats = [m for m in messages if m.startswith("[program 2/5] compiling the train step "
                                               "(4 run(s)): ") and m.endswith("s since the program started")]
  assert len(beats) >= 2, messages
  assert messages[-1].startswith("[program 2/5] the train step (4 run(s)): compiled in ")


def test_the_heartbeat_speaks_only_after_an_interval_of_silence(monkeypatch, caplog):
  """On a simulated clock: nothing while lines come; after 30 s without one, what the program
  does (the step it last resolved) and since when; then again 30 s later."""
  clock = {"now": 990.0}  # the program starts 10 s before its step 40
  caplog.set_level(std_logging.INFO)
  monkeypatch.setattr(logs._state, "said_at", 1000.0)
  beat = logs.Heartbeat("[program 1/2]", every=30.0, clock=lambda: clock["now"])
  clock["now"] = 1000.0
  beat.doing("training after step 40/1000")
  # Issue 88, item 17: the time at this step alone once read as the total; both are said.
  for now, expected in ((1029.0, None),
                        (1030.0, "[program 1/2] training after step 40/1000: 30s at this, "
                                 "40s since the program started"),
                        (1045.0, None),
                        (1060.0, "[program 1/2] training after step 40/1000: 60s at this, "
                                 "70s since the program started")):
    clock["now"] = now
    assert beat.beat() == expected
  logs._state.said_at = 1070.0  # a progress line reached the terminal
  clock["now"] = 1099.0
  assert beat.beat() is None
