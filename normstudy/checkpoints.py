"""Orbax checkpoints of a run: `<workdir>/checkpoints/<step>/{state,data}`.

`state` is the whole TrainState (parameters, optimizer and loss-scale state, counters, RNG);
`data` is the training iterator's position, saved through grain's orbax handler.
"""

import os

from absl import logging
import grain
import jax
import orbax.checkpoint as ocp

ITEMS = ("state", "data")


def manager(workdir: str, max_to_keep: int) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, "checkpoints")),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, enable_async_checkpointing=True, create=True),
      item_names=ITEMS)


def save(mngr: ocp.CheckpointManager, step: int, state, train_iter) -> None:
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=grain.checkpoint.CheckpointSave(train_iter)))


def restore_latest(mngr: ocp.CheckpointManager, abstract_state, train_iter):
  """Restores the newest checkpoint that can be read, newest first.

  Returns (step, state) with `train_iter` moved to the saved position, or (None, None) when the
  directory holds no checkpoint. A checkpoint that fails to restore (truncated or missing files)
  is reported and the previous one tried; if none restores, raises `CheckpointError` and leaves
  the files where they are.
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
    return step, restored["state"]
  raise CheckpointError(
      f"no checkpoint under {mngr.directory} can be restored: {'; '.join(failures)}. "
      "The files were left untouched; move them away to start the run afresh.")


class CheckpointError(RuntimeError):
  """No checkpoint of a workdir can be restored."""


def abstract(tree):
  """The shape/dtype/sharding skeleton orbax restores into."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      tree)
