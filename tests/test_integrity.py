"""Nothing lost, nothing silently wrong: the workdir lock, the schedule of an extended run, lost
records regenerated, one value per step in TensorBoard, and one line for what the machine or the
user got wrong. Each scenario first reproduces the failure a user met."""

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess

import pytest

from normstudy import errors
from normstudy.core import per_run
from normstudy.engine import checkpoints
from normstudy.experiments import grid
from normstudy.experiments import preflight
from normstudy.records import rundir
from normstudy.records import schema
import runs

LM = "configs/lm.py:tiny"


def _error_lines(result):
  return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_the_lock_names_its_holder_and_is_released(tmp_path):
  held = rundir.Lock(str(tmp_path)).acquire()
  with pytest.raises(errors.WorkdirBusy, match=f"in use by process {os.getpid()};"):
    rundir.Lock(str(tmp_path)).acquire()
  held.release()
  rundir.Lock(str(tmp_path)).acquire().release()


def test_a_workdir_without_a_checkpoint_takes_a_new_config(make_config, tmp_path):
  config = make_config()
  workdir = tmp_path / "run"
  workdir.mkdir()
  other = make_config(max_len=8)
  rundir.RunDir(str(workdir)).write_config(rundir.config_json(other))
  run = grid.Run("run", config, str(workdir))
  checkpoints = str(workdir / "checkpoints")
  preflight.preflight([run], checkpoints)  # no finished step: not a run yet
  os.makedirs(os.path.join(checkpoints, "3"))
  with pytest.raises(errors.UserError, match=r"model.max_len: 8 -> 16"):
    preflight.preflight([run], checkpoints)
  os.remove(workdir / "config.json")
  with pytest.raises(errors.UserError, match=r"has checkpoints \(steps 3\) but no config.json"):
    preflight.preflight([run], checkpoints)


def test_workdir_and_data_dir_that_cannot_be_written(make_config, tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  config = make_config()
  run = grid.Run("run", config, str(blocker / "run"))
  with pytest.raises(errors.UserError, match=r"--workdir='.*a_file/run' cannot be created: .*"
                                             r"a_file is a file"):
    preflight.preflight([run], str(blocker / "run" / "checkpoints"))
  config.data.data_dir = str(blocker / "tfds")
  run = grid.Run("run", config, str(tmp_path / "run"))
  with pytest.raises(errors.UserError, match=r"config.data.data_dir='.*a_file/tfds' cannot be"):
    preflight.preflight([run], str(tmp_path / "run" / "checkpoints"))
  assert not (tmp_path / "run").exists()


def test_the_machines_failures_are_one_line():
  full = OSError(errno.ENOSPC, "No space left on device", "/runs/x/metrics.jsonl")
  assert errors.environment_problem(full).startswith(
      "disk full while writing /runs/x/metrics.jsonl; free space")
  orbax = ValueError('RESOURCE_EXHAUSTED: Error writing local file "/r/checkpoints/3/x": '
                     "No space left on device [os_error_code='28']")
  assert errors.environment_problem(orbax).startswith("disk full while writing /r/checkpoints/3")
  try:
    try:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 68719476736 bytes.")
    except RuntimeError as inner:
      raise ValueError("while compiling the train step") from inner
  except ValueError as outer:
    line = errors.environment_problem(outer)
  assert line.startswith("out of memory (RESOURCE_EXHAUSTED: Out of memory allocating")
  assert "config.model.max_len" in line and "\n" not in line
  read_only = OSError(errno.EROFS, "Read-only file system", "/mnt/ro/run.json")
  assert errors.environment_problem(read_only) == (
      "cannot write /mnt/ro/run.json: Read-only file system")
  assert errors.environment_problem(KeyError("a bug")) is None


class _FailingManager:
  """Stands in for orbax's CheckpointManager whose background writer failed with `error`."""

  def __init__(self, directory, error):
    self.directory, self.error, self.closed = directory, error, False

  def wait_until_finished(self):
    raise self.error

  def close(self):
    self.closed = True


def test_a_checkpoint_that_could_not_fit_is_a_full_disk_whatever_orbax_raised(tmp_path):
  # A full disk can surface as a consequence, e.g. orbax reading back a metadata file the disk
  # left truncated; the free space of the checkpoint's filesystem decides.
  free = shutil.disk_usage(tmp_path).free
  truncated = json.JSONDecodeError("Unterminated string starting at", '{"a": "b', 6)
  with pytest.raises(OSError) as caught:
    checkpoints.finish(_FailingManager(str(tmp_path), truncated), checkpoint_bytes=2 * free)
  assert caught.value.errno == errno.ENOSPC and caught.value.__cause__ is truncated
  assert errors.environment_problem(caught.value).startswith(f"disk full while writing {tmp_path}")
  # It would have fitted: a bug, raised as it was.
  with pytest.raises(json.JSONDecodeError) as caught:
    checkpoints.finish(_FailingManager(str(tmp_path), truncated), checkpoint_bytes=1)
  assert caught.value is truncated
  # Already a full disk: left as orbax raised it.
  named = ValueError("Error writing local file: No space left on device [os_error_code='28']")
  with pytest.raises(ValueError) as caught:
    checkpoints.finish(_FailingManager(str(tmp_path), named), checkpoint_bytes=2 * free)
  assert caught.value is named


@pytest.mark.slow
def test_a_second_run_on_a_busy_workdir_is_refused_and_touches_nothing(tmp_path):
  workdir = tmp_path / "run"
  # Far more steps than it takes while the second process starts: it is stopped below.
  args = (f"--config={LM}", f"--workdir={workdir}",
          *runs.tiny_args(tmp_path / "tfds", num_steps=10**6, every=10**7))
  first = runs.start_module("normstudy.main", *args)
  try:
    assert runs.wait_for_records(first, workdir, 5)
    before = {name: (workdir / name).read_bytes() for name in ("config.json", "run.json")}
    second = runs.run_module("normstudy.main", *args, check=False)
    assert second.returncode == 2
    assert _error_lines(second) == [
        f"error: {workdir} is in use by process {first.pid}; wait for it to finish or stop it, "
        "or choose another --workdir"]
    assert "Traceback" not in second.stderr
    assert {name: (workdir / name).read_bytes() for name in before} == before
  finally:
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=runs.bound(120))
  assert first.returncode == 0, stderr[-2000:]
  steps = [r["step"] for r in runs.records(workdir)]
  assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 5


def _lm_args(tmp_path, workdir, num_steps, extra=()):
  return (f"--config={LM}", f"--workdir={workdir}",
          *runs.tiny_args(tmp_path / "tfds", num_steps=num_steps, every=3),
          "--config.optimizer.schedule=linear", "--config.optimizer.end_learning_rate=1e-4",
          "--config.train.max_to_keep=3", *extra)


def _corrupt(step_dir):
  damaged = 0
  for root, _, files in os.walk(step_dir):
    for name in files:
      path = os.path.join(root, name)
      if os.path.getsize(path) > 0 and "/d/" in path.replace(os.sep, "/"):
        with open(path, "r+b") as f:
          f.truncate(os.path.getsize(path) // 3)
        damaged += 1
  assert damaged


@pytest.mark.slow
def test_extension_keeps_the_schedule_even_through_a_damaged_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  runs.run_inline("normstudy.main", *_lm_args(tmp_path, workdir, 6))
  first = runs.trajectory(workdir)
  extended = runs.run_inline("normstudy.main", *_lm_args(tmp_path, workdir, 9))
  assert "keeps the horizon of 6 steps it started with" in extended.stderr
  recs = runs.trajectory(workdir)
  assert recs[:6] == first
  rates = [r["lr"] for r in recs]
  assert rates[6:] == pytest.approx([1e-4] * 3)  # the schedule's final rate, no jump back up
  assert max(rates[2:]) == rates[2]  # from the peak on, never rising again
  assert runs.read_json(workdir / "run.json")["schedule_steps"] == 6
  # The newest checkpoint damaged during a further extension: steps 7-9 are recomputed from
  # step 6 with the same schedule as the records they replace.
  _corrupt(workdir / "checkpoints" / "9")
  runs.run_inline("normstudy.main", *_lm_args(tmp_path, workdir, 12))
  again = runs.trajectory(workdir)
  assert again[:9] == recs
  assert [r["lr"] for r in again[9:]] == pytest.approx([1e-4] * 3)


def _tensorboard_steps(workdir, tag="loss"):
  """(step, count) of a scalar tag across every event file of a run directory."""
  import tensorflow as tf
  counts = {}
  for name in os.listdir(workdir):
    if name.startswith(schema.EVENTS_PREFIX):
      for raw in tf.data.TFRecordDataset(str(workdir / name)):
        event = tf.compat.v1.Event.FromString(raw.numpy())
        for value in event.summary.value:
          if value.tag == tag:
            counts[event.step] = counts.get(event.step, 0) + 1
  return counts


@pytest.mark.slow
def test_lost_records_are_regenerated_and_tensorboard_keeps_one_value_per_step(tmp_path):
  workdir = tmp_path / "run"
  args = _lm_args(tmp_path, workdir, 6, extra=("--config.train.tensorboard=True",))
  runs.run_inline("normstudy.main", *args)
  reference = runs.trajectory(workdir)
  assert [r["step"] for r in reference] == list(range(1, 7))
  metrics = workdir / "metrics.jsonl"

  # A torn last line of a finished run: the record of step 6 is regenerated from step 3.
  text = metrics.read_text()
  metrics.write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])
  result = runs.run_inline("normstudy.main", *args)
  lines = [l for l in result.stderr.splitlines() if "lost or damaged records" in l]
  assert len(lines) == 1 and "from step 6 on" in lines[0]
  assert "replaying from the checkpoint of step 3" in lines[0]
  assert runs.trajectory(workdir) == reference
  assert _tensorboard_steps(workdir) == {step: 1 for step in range(1, 7)}

  # A damaged line in the middle: regenerated from the start (no checkpoint before step 2).
  lines = metrics.read_text().splitlines()
  lines[1] = "{not json"
  metrics.write_text("\n".join(lines) + "\n")
  result = runs.run_inline("normstudy.main", *args)
  assert "from step 2 on" in result.stderr and "replaying from the start" in result.stderr
  assert runs.trajectory(workdir) == reference

  # A deleted metrics.jsonl: every record is regenerated.
  metrics.unlink()
  runs.run_inline("normstudy.main", *args)
  assert runs.trajectory(workdir) == reference
  assert _tensorboard_steps(workdir) == {step: 1 for step in range(1, 7)}

  # A deleted config.json: the run's config can no longer be checked, so it is refused.
  (workdir / "config.json").unlink()
  listing = sorted(os.listdir(workdir))
  refused = runs.run_inline("normstudy.main", *args, check=False)
  assert refused.returncode == 2
  assert len(_error_lines(refused)) == 1 and "but no config.json" in _error_lines(refused)[0]
  assert sorted(os.listdir(workdir)) == listing


@contextlib.contextmanager
def _small_filesystem(path, megabytes, free_bytes):
  """A tmpfs of `megabytes` at `path`, filled by `path/filler` but for `free_bytes`; yields the
  filler (unlink it to free the space), unmounted afterwards."""
  path.mkdir()
  result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
                           str(path)], capture_output=True, text=True)
  if result.returncode != 0:
    pytest.skip(f"cannot mount a small filesystem here ({result.stderr.strip()[:80]})")
  try:
    filler = path / "filler"
    filler.write_bytes(b"\0" * (megabytes * 2**20 - free_bytes))
    yield filler
  finally:
    subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_run_resumes(tmp_path):
  disk = tmp_path / "disk"
  # ~120 KB left: records fit, not a checkpoint
  with _small_filesystem(disk, 3, 120 * 2**10) as filler:
    args = (f"--config={LM}", f"--workdir={disk / 'run'}",
            *runs.tiny_args(tmp_path / "tfds", num_steps=6, every=3))
    full = runs.run_module("normstudy.main", *args, check=False)
    assert full.returncode == 2
    assert len(_error_lines(full)) == 1 and _error_lines(full)[0].startswith("error: disk full")
    assert "Traceback" not in full.stderr and len(full.stderr.splitlines()) < 20, full.stderr
    filler.unlink()
    runs.run_module("normstudy.main", *args)
    assert [r["step"] for r in runs.records(disk / "run")] == list(range(1, 7))


@pytest.mark.slow
def test_a_dataset_build_that_fills_the_disk_is_one_line_and_leaves_no_workdir(tmp_path):
  disk = tmp_path / "disk"
  # two pages left: not the dataset's files
  with _small_filesystem(disk, 1, 8 * 2**10) as filler:
    workdir = tmp_path / "run"
    args = (f"--config={LM}", f"--workdir={workdir}",
            *runs.tiny_args(disk / "tfds", num_steps=2, every=2))
    full = runs.run_module("normstudy.main", *args, check=False)
    assert full.returncode == 2 and "Traceback" not in full.stderr
    assert _error_lines(full) == [
        f"error: disk full while building the dataset synthetic in config.data.data_dir="
        f"'{disk / 'tfds'}'; free space on that filesystem, or set --config.data.data_dir to "
        "another, then run the same command"]
    assert not workdir.exists()  # once left holding its lock
    filler.unlink()
    runs.run_module("normstudy.main", *args)
    assert [r["step"] for r in runs.records(workdir)] == [1, 2]


@pytest.mark.slow
def test_help_and_clip_none_and_a_quiet_start(tmp_path):
  helped = runs.run_module("normstudy.main", "--help")
  assert "--workdir" in helped.stdout
  workdir = tmp_path / "run"
  # XLA's compiler logs each compilation natively (to fd 2) when asked to: what its "Very slow
  # compile?" banner takes, and what no Python log filter can reach.
  # (Compiled here, not loaded from the compile cache, so there is a compilation to log.)
  xla_logging = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="cpu_compiler=1",
                     JAX_ENABLE_COMPILATION_CACHE="false")
  result = runs.run_module("normstudy.main", f"--config={LM}", f"--workdir={workdir}",
                           *runs.tiny_args(tmp_path / "tfds", num_steps=2, every=2),
                           "--config.optimizer.clip_norm=None", env=xla_logging)
  assert runs.read_json(workdir / "config.json")["optimizer"]["clip_norm"] == 0.0
  assert not any(r["clipped"] for r in runs.records(workdir))
  assert "oneDNN" not in result.stderr and "absl::InitializeLog" not in result.stderr
  assert "Traceback" not in result.stderr and "deprecat" not in result.stderr.lower()
  # Compilation is announced on the terminal with its time; XLA's own lines and the libraries'
  # routine ones (orbax's checkpoint manager, tfds) are in the run's log file instead.
  library_log = (workdir / schema.LIBRARY_LOG).read_text()
  assert re.search(r"\] compiling the (block of \d+ train steps|train step) \(1 run\(s\)\) "
                   r"\.\.\.\n", result.stderr), result.stderr
  assert re.search(r"\(1 run\(s\)\): (compiled|loaded from the compile cache) in "
                   r"\d+\.\ds\n", result.stderr), result.stderr
  assert f"goes to {workdir / schema.LIBRARY_LOG} (--verbosity=1 shows it here)" in result.stderr
  for library_line in ("cpu_compiler.cc", "checkpoint_manager.py"):
    assert library_line in library_log
    assert library_line not in result.stderr.split("goes to")[1]


def test_a_field_the_saved_config_predates_is_no_difference_at_its_default():
  from normstudy.core import config as config_lib
  saved = rundir.config_json(config_lib.default_config())
  del saved["model"]["remat"]  # written before model.remat existed
  current = config_lib.default_config()
  assert per_run.config_differences(saved, rundir.config_json(current)) == []
  current.model.remat = "block"
  assert per_run.config_differences(saved, rundir.config_json(current)) == [
      "model.remat: '<absent>' -> 'block'"]


def test_an_unstaged_url_workdir_is_refused_in_one_line_and_nothing_is_made(tmp_path,
                                                                           monkeypatch):
  # The commands stage a URL (normstudy.records.storage, tests/test_gcs.py); the library's checks
  # never write one through local file operations (which made a local 'gs:' directory).
  monkeypatch.chdir(tmp_path)
  for url in ("gs://bucket/run", "s3://bucket/run"):
    with pytest.raises(errors.UserError, match=r"^--workdir='(gs|s3)://bucket/run': a URL "
                                               r"workdir is written through its local stage"):
      rundir.check_writable(url, "--workdir")
  assert list(tmp_path.iterdir()) == []


def test_hang_bounds_scale_with_the_load(monkeypatch):
  # A subprocess timeout bounds a hang: on a machine loaded 15x per core it waits 15x as long.
  monkeypatch.delenv("NORMSTUDY_TEST_TIMEOUT_SCALE", raising=False)
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
  monkeypatch.setattr(os, "getloadavg", lambda: (30.0, 20.0, 10.0))
  assert runs.bound(600) == 600 * 15
  monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
  assert runs.bound(600) == 600
  monkeypatch.setenv("NORMSTUDY_TEST_TIMEOUT_SCALE", "3")
  assert runs.bound(120) == 360
