"""A run directory: the files a run writes, their names, and the questions asked of them.

  <run>/config.json            the resolved config
  <run>/run.json               label, arm, arm_label, dataset, entropy floor, parameter count,
                               and the run's life (normstudy.life): status, last_step,
                               halt_step, halt_reason, nonfinite_at (a sentence) and
                               nonfinite_site ({"layer": int or null, "site": str})
  <run>/metrics.jsonl          one record per logged step (normstudy.metrics)
  <run>/events.out.tfevents.*  the same scalars for TensorBoard
  <run>/checkpoints/<step>/    orbax: the train state (a single run's; a sweep keeps its
                               stacked checkpoints once, under <sweep>/checkpoints/)
  <study>/study.json           a study's variants in legend order
  <sweep>/sweep.json           a sweep's axes and its runs with their status

A directory in use is locked (`lock`): a second process gets one line naming the holder.
"""

import contextlib
import fcntl
import json
import os
import re
import shutil

from normstudy.errors import UserError
from normstudy.errors import WorkdirBusy

CONFIG = "config.json"
RUN = "run.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
DAMAGED_CHECKPOINTS = "checkpoints_damaged"
STUDY = "study.json"
SWEEP = "sweep.json"
LOCK = ".normstudy.lock"

# Fields a continued run may change: they do not alter the trajectory already recorded (the mesh
# included: a checkpoint restores onto any layout, and results do not depend on it). num_steps
# may grow; the learning-rate schedule stays the one the run started with (docs/reference.md,
# "Reliability": continuing a run).
CHANGEABLE_FIELDS = (
    "label", "data.data_dir", "mesh.runs", "mesh.data", "mesh.fsdp", "mesh.tensor",
    "train.num_steps", "train.log_every", "train.eval_every",
    "train.checkpoint_every", "train.max_to_keep", "train.on_nonfinite",
    "train.max_consecutive_skips", "train.telemetry_every", "train.tensorboard",
    "train.wandb_project",
)


def read_json(path: str) -> dict:
  """The object in a JSON file; {} when there is none. A damaged file is a UserError."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is damaged ({e.__class__.__name__}: {e}); move it away") from None


def write_json(path: str, obj) -> None:
  """Replaces `path` atomically (tmp + rename), so a reader never sees half a file. Strict JSON:
  a NaN or infinity is a bug here (ValueError), never written as `NaN`/`Infinity`."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True, default=str, allow_nan=False)
  os.replace(tmp, path)


def config_json(config) -> dict:
  """A config as the plain JSON object config.json holds."""
  return json.loads(config.to_json_best_effort())


def flatten(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


# Fields whose runs from before the field existed behaved as another value than its default: a
# run saved without train.eval_seed was evaluated on its own seed's masks (-1), not seed 0's.
BEFORE_THE_FIELD = {"train.eval_seed": -1}


def config_differences(old: dict, new: dict, changeable=CHANGEABLE_FIELDS) -> list[str]:
  """'field: old -> new' for every field that differs and may not change between sessions. A
  field the saved config lacks (it was written before the field existed) differs only if the
  new value is not what such a run did: the field's default, or BEFORE_THE_FIELD's value."""
  from normstudy import config as config_lib  # the schema; rundir is read without it too
  old_flat, new_flat = flatten(old), flatten(new)
  defaults = {**flatten(config_json(config_lib.default_config())), **BEFORE_THE_FIELD}
  return [f"{k}: {old_flat.get(k, '<absent>')!r} -> {new_flat.get(k, '<absent>')!r}"
          for k in sorted(set(old_flat) | set(new_flat))
          if old_flat.get(k) != new_flat.get(k) and k not in changeable
          and not (k not in old_flat and k in defaults and new_flat.get(k) == defaults[k])]


class RunDir:
  """The files of one run directory."""

  def __init__(self, path: str):
    self.path = path

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  @property
  def metrics_path(self) -> str:
    return self.file(METRICS)

  @property
  def checkpoints(self) -> str:
    return self.file(CHECKPOINTS)

  def saved_config(self) -> dict:
    return read_json(self.file(CONFIG))

  def info(self) -> dict:
    return read_json(self.file(RUN))

  def write_config(self, config_json: dict) -> None:
    write_json(self.file(CONFIG), config_json)

  def update_info(self, **fields) -> dict:
    info = {**self.info(), **fields}
    write_json(self.file(RUN), info)
    return info

  def status(self):
    """The run's recorded status (normstudy.life.STATUSES), or None if it never started."""
    return self.info().get("status")


def checkpointed_steps(checkpoint_dir: str) -> list[int]:
  """The steps with a checkpoint (orbax's step directories) in `checkpoint_dir`, a local path
  or a URL (normstudy.storage.remote of a staged one)."""
  if "://" in checkpoint_dir:
    from etils import epath  # a bucket's listing (normstudy.storage configures the backend)
    directory = epath.Path(checkpoint_dir)
    names = [p.name for p in directory.iterdir()] if directory.exists() else []
  else:
    names = os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
  return sorted(int(name) for name in names if name.isdigit())


EVENTS_PREFIX = "events.out.tfevents."


def purge_events_after(directory: str, step: int) -> int:
  """Rewrites the TensorBoard event files of `directory` without the values logged after
  `step`, as TensorBoard's own purge_step would; returns how many events were dropped. Imports
  TensorFlow: call it where TensorFlow is loaded anyway (the run's writer thread)."""
  files = [name for name in os.listdir(directory) if name.startswith(EVENTS_PREFIX)]
  if not files:
    return 0
  import tensorflow as tf
  dropped = 0
  for name in files:
    path = os.path.join(directory, name)
    events, torn = [], False
    try:
      for raw in tf.data.TFRecordDataset(path):
        events.append(tf.compat.v1.Event.FromString(raw.numpy()))
    except tf.errors.DataLossError:  # a torn tail: the writer was killed mid-record
      torn = True
    kept = [e for e in events if not (e.HasField("summary") and e.step > step)]
    if len(kept) == len(events) and not torn:
      continue
    dropped += len(events) - len(kept)
    with tf.io.TFRecordWriter(path + ".tmp") as writer:
      for event in kept:
        writer.write(event.SerializeToString())
    os.replace(path + ".tmp", path)
  return dropped


def check_writable(path: str, what: str) -> None:
  """UserError unless `path` is a writable directory or could be created as one: its nearest
  existing ancestor is a writable directory. Creates nothing. A URL workdir (gs://...) is refused:
  the run directory's files are written with local file operations, which would make a directory
  named 'gs:' here and record nothing in the bucket: the entry commands stage a URL workdir
  (normstudy.storage.staged) and pass its local stage here."""
  scheme = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", path)
  if scheme and what == "--workdir":  # a TFDS data_dir may be a bucket: tfds writes it itself
    raise UserError(f"{what}={path!r}: a URL workdir is written through its local stage; "
                    "open it with normstudy.storage.staged (the commands do)")
  path = os.path.abspath(path)
  if os.path.islink(path) and not os.path.exists(path):
    raise UserError(f"{what}={path!r} is a symlink to {os.readlink(path)!r}, which does not "
                    "exist; create its target or choose another directory")
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{what}={path!r} exists and is not a directory")
  probe = path
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise UserError(f"{what}={path!r} cannot be created: {probe} is a file")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise UserError(f"{what}={path!r} is not writable ({probe} is read-only or not ours)")


# What a directory holds, by the file its command writes at its root.
_KIND_FILES = (("sweep", SWEEP), ("study", STUDY), ("run", RUN), ("run", METRICS))


def directory_kind(path: str):
  """('sweep' | 'study' | 'run', the file that says so) for a directory a command wrote, else
  None (absent, empty, or another directory)."""
  for kind, name in _KIND_FILES:
    if os.path.exists(os.path.join(path, name)):
      return kind, name
  return None


def check_kind(path: str, kind: str, what: str = "--workdir") -> None:
  """UserError when `path` holds another kind of directory than `kind`: a run trained into a
  sweep's or a study's root would sit among its runs and be counted as one, a sweep or study
  into a run directory would train around it."""
  found = directory_kind(path)
  if found is None or found[0] == kind:
    return
  inside = (f", or {os.path.join(path, '<run>')} to continue one of its runs"
            if kind == "run" else "")
  raise UserError(f"{what}={path!r} holds a {found[0]} ({found[1]}); a {kind} goes into a "
                  f"directory of its own: choose another {what}{inside}")


def ensure_directory(path: str, what: str = "--workdir") -> None:
  """Creates `path` (and its parents); one line if that is impossible (a file in the way, a
  read-only mount, no permission)."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{what}={path!r} exists and is not a directory")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UserError(f"{what}={path!r} cannot be created: {e.strerror}") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise UserError(f"{what}={path!r} is not writable")


@contextlib.contextmanager
def made_for(path: str, what: str = "--workdir"):
  """`ensure_directory(path)` for what runs inside; if that fails while the directory, made by
  this call, holds nothing but its lock, the directory goes too: a run that stopped before it
  wrote anything leaves no trace (a dataset build that filled the disk once left a workdir
  holding only its lock)."""
  existed = os.path.isdir(path)
  ensure_directory(path, what)
  try:
    yield
  except BaseException:
    if not existed and set(os.listdir(path)) <= {LOCK}:
      shutil.rmtree(path, ignore_errors=True)
    raise


class Lock:
  """An exclusive lock on a directory for a process's life: `fcntl.flock` on `<dir>/LOCK`,
  which the kernel releases when the process dies (a SIGKILLed run leaves no stale lock)."""

  def __init__(self, directory: str):
    self.path = os.path.join(directory, LOCK)
    self._file = None

  def acquire(self) -> "Lock":
    f = open(self.path, "a+", encoding="utf-8")
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      f.seek(0)
      holder = f.read().strip()
      f.close()
      holder = f"process {holder}" if holder else "another process"
      raise WorkdirBusy(f"{os.path.dirname(self.path)} is in use by {holder}; wait for it to "
                        "finish or stop it, or choose another --workdir") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    self._file = f
    return self

  def release(self) -> None:
    if self._file is not None:
      self._file.close()  # closing the descriptor releases the flock
      self._file = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
    return False
