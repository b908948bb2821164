"""Orbax checkpoints of a program's stacked train state: `<dir>/<step>/state`.

`state` is the whole TrainState of every run of the program (parameters, optimizer and
loss-scale state, counters, RNG, hyperparameters, each run's life). The data position needs no
saving: a run at step s reads batch s - 1 (normstudy.data.sources).
"""

import contextlib
import errno
import math
import os
import shutil
import warnings

from absl import logging
from etils import epath
import jax
import orbax.checkpoint as ocp

from normstudy import errors
from normstudy.errors import UserError
from normstudy.records import schema
from normstudy.records import storage

ITEMS = (schema.CHECKPOINT_ITEM,)


def manager(directory: str, max_to_keep: int) -> ocp.CheckpointManager:
  """Orbax's manager of `directory`; a staged workdir's checkpoints are written straight to its
  URL (normstudy.records.storage.remote), never to the stage."""
  location = storage.remote(directory)
  return ocp.CheckpointManager(
      location if storage.is_url(location) else os.path.abspath(location),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, enable_async_checkpointing=True, create=True,
          # A save cut short by SIGKILL leaves a *.orbax-checkpoint-tmp directory behind.
          cleanup_tmp_directories=True),
      item_names=ITEMS)


def state_bytes(abstract_state) -> int:
  """The bytes a checkpoint of `abstract_state` (arrays or their shapes and dtypes) holds."""
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(abstract_state))


@contextlib.contextmanager
def _writing(mngr: ocp.CheckpointManager, checkpoint_bytes: int):
  """Names a failed write a full disk when the checkpoint could not fit.

  A save that runs out of space fails in whichever of orbax's writer threads notices first,
  and that is not always the write that got ENOSPC: a reader of a metadata file that a full disk
  left truncated raises a JSONDecodeError (orbax 0.12.8), which orbax hands to the main thread.
  So an error that does not name a full disk itself is re-raised as one, from the original,
  when the checkpoint's local filesystem has less free space than one checkpoint takes; any
  other failure is left as it is (a bug keeps its traceback)."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-exception-caught
    directory = os.fspath(mngr.directory)
    if errors.environment_problem(e) is not None or storage.is_url(directory):
      raise
    try:
      free = shutil.disk_usage(directory).free
    except OSError:
      raise e from None
    if free >= checkpoint_bytes:
      raise
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), directory) from e


def save(mngr: ocp.CheckpointManager, step: int, state) -> None:
  """Starts the checkpoint of `state` at `step` in the background (a failure of the save before
  it surfaces here or in `finish`)."""
  with _writing(mngr, state_bytes(state)):
    mngr.save(step, args=ocp.args.Composite(
        **{schema.CHECKPOINT_ITEM: ocp.args.StandardSave(state)}))


def finish(mngr: ocp.CheckpointManager, checkpoint_bytes: int) -> None:
  """Waits for the checkpoints in flight, then closes the manager."""
  with _writing(mngr, checkpoint_bytes):
    mngr.wait_until_finished()
  mngr.close()


def _reason(error: Exception) -> str:
  """One short line for why orbax could not read a checkpoint (its messages can hold kilobytes
  of escaped TensorStore JSON)."""
  text = " ".join(str(error).split())
  for marker in ("Error opening", "Error reading", "NOT_FOUND", "DATA_LOSS", "FAILED_PRECONDITION",
                 "OUT_OF_RANGE", "INVALID_ARGUMENT"):
    if marker in text:
      text = text[text.index(marker):]
      break
  text = text.split(" [source locations]")[0].split("; [tensorstore_spec")[0]
  return f"{type(error).__name__}: {text[:160]}" + ("..." if len(text) > 160 else "")


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  """The state saved at `step`."""
  return mngr.restore(step, args=ocp.args.Composite(
      **{schema.CHECKPOINT_ITEM: ocp.args.StandardRestore(abstract_state)}))[schema.CHECKPOINT_ITEM]


def read_on_host(directory: str, step: int):
  """The state saved at `step` in the checkpoints `directory`, as numpy arrays on the host
  (no abstract state: for reading a finished run's parameters)."""
  with warnings.catch_warnings():  # orbax 0.12: "Sharding info not provided": numpy arrays here
    warnings.simplefilter("ignore", UserWarning)
    return ocp.PyTreeCheckpointer().restore(
        os.path.join(directory, str(step), schema.CHECKPOINT_ITEM))


def discard_after(mngr: ocp.CheckpointManager, step: int) -> None:
  """Deletes the checkpoints after `step` (a replay recomputes them)."""
  for later in [s for s in mngr.all_steps() if s > step]:
    mngr.delete(later)


def restore_latest(mngr: ocp.CheckpointManager, abstract_state):
  """Restores the newest checkpoint that can be read, newest first.

  Returns (step, state), or (None, None) when the directory holds no checkpoint. A checkpoint that
  fails to restore (truncated or missing files) is reported in one line and the previous one
  tried. Once an older one restores, the damaged newer ones are moved to
  `<dir>/../checkpoints_damaged/` (kept for inspection, out of the way of new saves). If none
  restores, raises `CheckpointError` and leaves the files where they are.
  """
  steps = sorted(mngr.all_steps(), reverse=True)
  if not steps:
    return None, None
  failures = []
  for step in steps:
    try:
      state = restore(mngr, step, abstract_state)
    except Exception as e:  # orbax raises many types for damaged files
      reason = _reason(e)
      logging.warning("the checkpoint of step %d in %s cannot be restored (%s); trying an older "
                      "one", step, mngr.directory, reason)
      failures.append(f"step {step} ({reason})")
      continue
    if failures:
      _move_aside(mngr, [s for s in steps if s > step])
    return step, state
  raise CheckpointError(
      f"no checkpoint under {mngr.directory} can be restored: {'; '.join(failures)}. "
      "The files were left untouched; move them away to start the run afresh.")


def _move_aside(mngr: ocp.CheckpointManager, steps) -> None:
  directory = epath.Path(mngr.directory)  # a local path or a bucket's (a copy there)
  damaged = directory.parent / schema.DAMAGED_CHECKPOINTS
  damaged.mkdir(parents=True, exist_ok=True)
  for step in steps:
    target = damaged / str(step)
    if target.exists():
      target.rmtree()
    if storage.is_url(os.fspath(directory)):  # object storage renames by copying
      _copy_tree(directory / str(step), target)
      (directory / str(step)).rmtree()
    else:
      shutil.move(os.fspath(directory / str(step)), os.fspath(target))
    logging.warning("moved the damaged checkpoint of step %d to %s", step, target)
  mngr.reload()


def _copy_tree(source, target) -> None:
  for root, _, files in source.walk():
    relative = os.path.relpath(os.fspath(root), os.fspath(source))
    for name in files:
      destination = target / relative / name if relative != "." else target / name
      destination.parent.mkdir(parents=True, exist_ok=True)
      destination.write_bytes((root / name).read_bytes())


class CheckpointError(UserError):
  """No checkpoint of a workdir can be restored."""
