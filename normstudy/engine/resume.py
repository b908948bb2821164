"""Where a program continues: the newest checkpoint that restores, replayed from an earlier one
(or from the start) when records were lost after it, with the configs' per-run fields applied
(normstudy.engine.train's `restore`)."""

from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from normstudy.core import life
from normstudy.core import per_run
from normstudy.core import steps as steps_lib
from normstudy.engine import checkpoints
from normstudy.engine import sharding
from normstudy.records import metrics as metrics_lib
from normstudy.records import rundir
from normstudy.records import schema
from normstudy.records import storage


def restore(setup, carry) -> Any:
  """Restores the newest checkpoint that restores (replaying from an earlier one, or from the
  start, if records were lost after it) and applies the configs' per-run fields to it; marks
  the runs stopped before it. Sets the step to continue after (0: from the start)."""
  try:
    start_step, restored = checkpoints.restore_latest(setup.mngr, setup.abstract)
  except checkpoints.CheckpointError:
    setup.mngr.close()  # orbax's background threads must stop before the process exits
    raise
  if restored is not None:
    replay = _replay_from(setup, restored)
    if replay is not None:  # records were lost: recompute them from an earlier state
      checkpoints.discard_after(setup.mngr, replay)
      start_step = replay
      restored = checkpoints.restore(setup.mngr, replay, setup.abstract) if replay else None
  if restored is None:
    if not setup.mngr.all_steps():
      _warn_starting_over(setup)
    return carry
  restored = _from_configs(restored, [run.config for run in setup.runs], setup.mesh)
  logging.info("resumed %s from the checkpoint at step %d",  # the gs:// URL of a staged one
               storage.remote(setup.checkpoint_dir), start_step)
  stopped = {k: life.status_of(code)  # stopped before the checkpoint we resumed from
             for k, code in enumerate(np.asarray(jax.device_get(restored.status)))
             if code != life.CODE_RUNNING}
  return carry._replace(state=setup.steps.hold(restored), start_step=start_step,
                        last_saved=start_step, stopped=stopped)


def _warn_starting_over(setup) -> None:
  """One line per run whose directory holds records but no checkpoint to continue them from
  (checkpoints deleted, or a kill before the first was complete): it starts over, and its
  records move aside (normstudy.records.metrics.MetricsLog)."""
  for run in setup.runs:
    directory = rundir.RunDir(run.directory)
    count, first, last = metrics_lib.recorded_span(directory.metrics_path)
    if count:
      logging.warning("%s: %s holds %d records (steps %d-%d) but %s has no checkpoint to "
                      "continue them from; starting over from step 1, the old records moved to "
                      "%s", run.name, schema.METRICS, count, first, last,
                      storage.remote(setup.checkpoint_dir), schema.METRICS_BEFORE_RESTART)


def _replay_from(setup, restored):
  """None if every run's records reach the restored state; else the step to replay from: the
  newest checkpoint before the first lost record, or 0 (the initial state, a pure function
  of the config). Each run that lost records is reported in one line."""
  run_steps = np.asarray(jax.device_get(restored.step))
  lost = {}
  for k, run in enumerate(setup.runs):
    first = metrics_lib.first_lost_step(rundir.RunDir(run.directory).metrics_path,
                                        int(run_steps[k]))
    if first is not None:
      lost[run.name] = first
  if not lost:
    return None
  first = min(lost.values())
  replay = max((s for s in setup.mngr.all_steps() if s < first), default=0)
  for name, step in lost.items():
    logging.warning("%s: %s has lost or damaged records from step %d on (the checkpoint is "
                    "at step %d); replaying from %s to regenerate them", name, schema.METRICS,
                    step, int(run_steps.max()),
                    f"the checkpoint of step {replay}" if replay else "the start")
  return replay


def _from_configs(state, configs, mesh):
  """The restored state with the (possibly changed) configs' per-run fields applied
  (normstudy.core.per_run.apply_to_restored; the schedule keeps its horizon, so the rate never
  jumps). A run restored as finished whose config now asks for more steps runs again."""
  horizons = np.asarray(jax.device_get(state.hparams["schedule_steps"]))
  values = jax.device_put(per_run.stacked_values(configs, horizons),
                          sharding.runs_sharding(mesh))
  state = per_run.apply_to_restored(state, values)
  done = steps_lib.reached_end(state.step, state.opt_step, state.limits)
  more = jnp.logical_and(state.status == life.CODE_FINISHED, ~done)
  return state.replace(status=jnp.where(more, life.CODE_RUNNING, state.status))
