"""A run directory's files: reading and writing them, the questions asked of them, and the
workdir checks the commands make before they write (normstudy.records.schema names the files and
types what they hold).

A directory in use is locked (`Lock`): a second process gets one line naming the holder.
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil

from normstudy.errors import UserError
from normstudy.errors import WorkdirBusy
from normstudy.records import keys
from normstudy.records import metrics as metrics_lib
from normstudy.records import outcomes
from normstudy.records import schema


def read_json(path: str) -> dict:
  """The object in a JSON file; {} when there is none. A damaged file, or one holding something
  other than an object (null, a list: every file normstudy writes holds an object), is a
  UserError."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      found = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is damaged ({e.__class__.__name__}: {e}); move it away") from None
  if not isinstance(found, dict):
    raise UserError(f"{path} is damaged: it holds {json.dumps(found)[:40]} where a JSON object "
                    "is expected; move it away")
  return found


def read_sweep(directory: str) -> schema.SweepRecord:
  """The sweep.json of a sweep's directory."""
  return schema.SweepRecord.from_json(read_json(os.path.join(directory, schema.SWEPT)))


def read_config(run_dir: str) -> dict:
  """The config.json of a run's directory, as the plain object it holds."""
  return read_json(os.path.join(run_dir, schema.CONFIG))


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


class RunDir:
  """The files of one run directory (normstudy.records.schema)."""

  def __init__(self, path: str):
    self.path = path

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  @property
  def metrics_path(self) -> str:
    return self.file(schema.METRICS)

  @property
  def checkpoints(self) -> str:
    return self.file(schema.CHECKPOINTS)

  def saved_config(self) -> dict:
    return read_json(self.file(schema.CONFIG))

  def info(self) -> schema.RunInfo:
    """run.json (an empty RunInfo before the run started)."""
    return schema.RunInfo.from_json(read_json(self.file(schema.RUN)))

  def write_config(self, config_json: dict) -> None:
    write_json(self.file(schema.CONFIG), config_json)

  def write_info(self, info: schema.RunInfo) -> None:
    write_json(self.file(schema.RUN), info.as_json())

  def update_info(self, **fields) -> schema.RunInfo:
    """run.json with `fields` (RunInfo's) replaced."""
    info = dataclasses.replace(self.info(), **fields)
    self.write_info(info)
    return info

  def status(self):
    """The run's recorded status (normstudy.records.schema), or None if it never started."""
    return self.info().status

  def records(self) -> list:
    """The records of metrics.jsonl (none without the file), damaged lines skipped."""
    if not os.path.exists(self.metrics_path):
      return []
    return list(metrics_lib.read_records(self.metrics_path, skip_damaged=True))

  def outcome(self, horizon: int | None = None) -> outcomes.Outcome:
    """How the run ended by the failure rule (normstudy.records.outcomes.judge), at `horizon`
    (None: its end): what a search judges each run by, and what the analysis reports."""
    records = self.records()
    warmup = self.saved_config().get("optimizer", {}).get("warmup_steps", 0)
    return outcomes.judge(
        [r[keys.STEP] for r in records], [r.get(keys.LOSS, float("nan")) for r in records],
        [r.get(keys.SKIPPED, False) for r in records],
        {r[keys.STEP]: r[keys.EVAL_LOSS] for r in records if keys.EVAL_LOSS in r},
        self.info(), warmup, horizon)


def checkpointed_steps(checkpoint_dir: str) -> list[int]:
  """The steps with a checkpoint (orbax's step directories) in `checkpoint_dir`, a local path
  or a URL (normstudy.records.storage.remote of a staged one)."""
  if "://" in checkpoint_dir:
    from etils import epath  # a bucket's listing (normstudy.records.storage configures the backend)
    directory = epath.Path(checkpoint_dir)
    names = [p.name for p in directory.iterdir()] if directory.exists() else []
  else:
    names = os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
  return sorted(int(name) for name in names if name.isdigit())


def check_writable(path: str, what: str) -> None:
  """UserError unless `path` is a writable directory or could be created as one: its nearest
  existing ancestor is a writable directory. Creates nothing. A URL workdir (gs://...) is refused:
  the run directory's files are written with local file operations, which would make a directory
  named 'gs:' here and record nothing in the bucket: the entry commands stage a URL workdir
  (normstudy.records.storage.staged) and pass its local stage here."""
  scheme = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", path)
  if scheme and what == "--workdir":  # a TFDS data_dir may be a bucket: tfds writes it itself
    raise UserError(f"{what}={path!r}: a URL workdir is written through its local stage; "
                    "open it with normstudy.records.storage.staged (the commands do)")
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
_KIND_FILES = (("sweep", schema.SWEPT), ("study", schema.STUDY), ("run", schema.RUN),
               ("run", schema.METRICS))


def directory_kind(path: str):
  """('sweep' | 'study' | 'run', the file that says so) for a directory a command wrote, else
  None (absent, empty, or another directory)."""
  for kind, name in _KIND_FILES:
    if os.path.exists(os.path.join(path, name)):
      return kind, name
  return None


# What normstudy writes at the top of a workdir from the start (a run's files, a sweep's or
# study's record, its lock and log, stacked checkpoints), and what a run's directory holds, which
# a sweep's or study's arms put one or two levels down (a cluster share's runs before the
# sweep's record). A non-empty directory with neither is someone else's (a repository's root,
# a folder of notes) and is not trained into.
_WRITTEN = frozenset({schema.RUN, schema.CONFIG, schema.METRICS, schema.SWEPT, schema.STUDY,
                      schema.CHECKPOINTS, schema.DAMAGED_CHECKPOINTS, schema.LOCK,
                      schema.LIBRARY_LOG, schema.DRIFT_PLAN, schema.LAUNCH_LOGS})
_A_RUN = frozenset({schema.RUN, schema.CONFIG, schema.METRICS})


def _holds_normstudy(path: str) -> bool:
  """True for an absent or empty directory, or one normstudy writes into (_WRITTEN at its top,
  a run's files one or two levels down)."""
  try:
    entries = os.listdir(path)
  except OSError:
    return True  # absent (or unreadable: ensure_directory says so)
  return not entries or bool(_WRITTEN.intersection(entries)) or _runs_below(path, 2)


def _runs_below(path: str, depth: int) -> bool:
  """Whether a directory up to `depth` levels below `path` holds a run's files."""
  for entry in sorted(os.listdir(path))[:256]:  # a sweep's arms and points: a few
    below = os.path.join(path, entry)
    try:
      inside = os.listdir(below) if os.path.isdir(below) else []
    except OSError:
      continue
    if _A_RUN.intersection(inside) or (depth > 1 and inside and _runs_below(below, depth - 1)):
      return True
  return False


def check_kind(path: str, kind: str, what: str = "--workdir") -> None:
  """UserError when `path` holds another kind of directory than `kind`: a run trained into a
  sweep's or a study's root would sit among its runs and be counted as one, a sweep or study
  into a run directory would train around it."""
  found = directory_kind(path)
  if found is None and not _holds_normstudy(path):
    entries = sorted(os.listdir(path))
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    raise UserError(f"{what}={path!r} holds files normstudy did not write ({shown}); a {kind} "
                    f"goes into a new or empty directory, or one normstudy wrote: choose another "
                    f"{what}")
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
  wrote anything leaves no trace (not a workdir holding only its lock after a dataset build
  that filled the disk; a compile that fails leaves the libraries' log beside it)."""
  existed = os.path.isdir(path)
  ensure_directory(path, what)
  try:
    yield
  except BaseException:
    if not existed and set(os.listdir(path)) <= {schema.LOCK, schema.LIBRARY_LOG}:
      shutil.rmtree(path, ignore_errors=True)
    raise


class Lock:
  """An exclusive lock on a directory for a process's life: `fcntl.flock` on `<dir>/LOCK`,
  which the kernel releases when the process dies (a SIGKILLed run leaves no stale lock)."""

  def __init__(self, directory: str):
    self.path = os.path.join(directory, schema.LOCK)
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
