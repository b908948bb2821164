"""Orbax checkpoints of a run: `<workdir>/checkpoints/<step>/{state,data}`.

`state` is the whole TrainState (parameters, optimizer and loss-scale state, counters, RNG);
`data` is the training iterator's position, saved through grain's orbax handler.
"""

import os
import shutil

from absl import logging
import grain
import jax
import orbax.checkpoint as ocp

from normstudy.errors import UserError

ITEMS = ("state", "data")


def manager(workdir: str, max_to_keep: int) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, "checkpoints")),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, enable_async_checkpointing=True, create=True,
          # A save cut short by SIGKILL leaves a *.orbax-checkpoint-tmp directory behind.
          cleanup_tmp_directories=True),
      item_names=ITEMS)


def save(mngr: ocp.CheckpointManager, step: int, state, train_iter) -> None:
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=grain.checkpoint.CheckpointSave(train_iter)))


def restore_latest(mngr: ocp.CheckpointManager, abstract_state, train_iter):
  """Restores the newest checkpoint that can be read, newest first.

  Returns (step, state) with `train_iter` moved to the saved position, or (None, None) when the
  directory holds no checkpoint. A checkpoint that fails to restore (truncated or missing files)
  is reported and the previous one tried. Once an older one restores, the damaged newer ones are
  moved to `<workdir>/checkpoints_damaged/` (kept for inspection, out of the way of new saves). If
  none restores, raises `CheckpointError` and leaves the files where they are.
  """
  steps = sorted(mngr.all_steps(), reverse=True)
  if not steps:
    return None, None
  failures = []
  for step in steps:
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          data=grain.checkpoint.CheckpointRestore(train_iter)))
    except Exception as e:  # orbax raises many types for damaged files
      reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      logging.warning("checkpoint at step %d cannot be restored (%s); trying an older one",
                      step, reason)
      failures.append(f"step {step} ({reason})")
      continue
    if failures:
      _move_aside(mngr, [s for s in steps if s > step])
    return step, restored["state"]
  raise CheckpointError(
      f"no checkpoint under {mngr.directory} can be restored: {'; '.join(failures)}. "
      "The files were left untouched; move them away to start the run afresh.")


def _move_aside(mngr: ocp.CheckpointManager, steps) -> None:
  directory = str(mngr.directory)
  damaged = os.path.join(os.path.dirname(directory), "checkpoints_damaged")
  os.makedirs(damaged, exist_ok=True)
  for step in steps:
    target = os.path.join(damaged, str(step))
    if os.path.exists(target):
      shutil.rmtree(target)
    shutil.move(os.path.join(directory, str(step)), target)
    logging.warning("moved the damaged checkpoint of step %d to %s", step, target)
  mngr.reload()


class CheckpointError(UserError):
  """No checkpoint of a workdir can be restored."""


def abstract(tree):
  """The shape/dtype/sharding skeleton orbax restores into."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      tree)
