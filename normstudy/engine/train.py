"""The training loop of one program: K runs that share one compiled step.

  train_program(runs, checkpoint_dir)   read top to bottom: data, mesh and state, restore,
                                        recorders, the loop, the final checkpoint

The loop is functions over two values: a `Setup` (what it reads and never changes: the runs,
data, mesh, compiled steps, checkpoint manager) and a `Carry` (what it carries from one dispatch
to the next: the state, the pending dispatch, the runs that stopped, the step last saved),
replaced rather than changed, as nanodo's loop keeps its state in locals. Its parts: `restore`
(where to continue), `open_recorders`, `loop`, and the periodic actions `evaluate`,
`save_checkpoint` and `record_step` (records, telemetry and the runs' lives).

The K runs' configs differ only in per-run fields (normstudy.core.per_run); each keeps its own
loss scale, skip counter and life (normstudy.core.life): a run that finishes or halts is frozen
while the others go on. How the K runs step, and the form their state is held in, is
normstudy.engine.execution's (ProgramSteps); the loop only hands that state back to it. Grouping
runs into programs and running several programs is normstudy.experiments'; a run is a
normstudy.experiments.grid.Run (.name, .config, .directory, .arm, .arm_label, .point,
.overrides).

Starting again resumes from the newest checkpoint that restores: each run's records after it are
dropped first, so a resumed run's records equal an uninterrupted run's. SIGTERM/SIGINT finish the
current dispatch, checkpoint it and stop (errors.Preempted).

A dispatch is one step or a block of plain steps in one compiled loop (train.steps_per_dispatch;
`dispatch_end` says where a block ends: before anything the host must do between two steps).
The loop processes dispatch N-1's metrics after dispatch N is issued, as nanodo does; before
issuing N it only checks whether N-1 was non-finite and which runs stopped, since the state after
a skipped single step still has the parameters that failed, which the locate step re-runs to say
where the failure started (a block locates its failures itself).
"""

import contextlib
import dataclasses
import signal
import threading
import time
from typing import Any, NamedTuple

from absl import logging
import jax
import numpy as np

from normstudy.core import steps as steps_lib
from normstudy.core import telemetry
from normstudy.data import batches as batches_lib
from normstudy.data import sources
from normstudy.engine import checkpoints
from normstudy.engine import execution
from normstudy.engine import logs
from normstudy.engine import recorder as recorder_lib
from normstudy.engine import resume
from normstudy.engine import schedule
from normstudy.engine import sharding
from normstudy.errors import Preempted
from normstudy.errors import RunHalted
from normstudy.errors import UserError
from normstudy.records import keys
from normstudy.records import schema

@dataclasses.dataclass(frozen=True)
class PendingStep:
  """The newest dispatch, whose metrics are processed after its successor is dispatched: one
  step, or a block of steps `first`..`step` (normstudy.core.steps.make_train_block). Its last
  step's number, its metrics (device arrays [K], a block's [K, steps]), a single step's batch
  (for the locate step; a block locates its own failures) and, on an eval step, each run's
  eval loss."""
  step: int
  metrics: Any
  batch: Any
  eval_losses: Any = None
  update_sizes: Any = None  # {record key: [K]} on the first train.update_size_steps steps
  first: int | None = None  # a block's first step; None for a single step

  @property
  def is_block(self) -> bool:
    return self.first is not None


def _stack(batches: list) -> dict:
  return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


@contextlib.contextmanager
def stop_signals():
  """Yields a dict whose "signal" is set to the name of the first SIGTERM/SIGINT received.

  Single-process runs only: a multi-process run must stop every process at the same step, so
  there SIGTERM is left to JAX's preemption notifier, which all processes consult at each step
  (CheckpointManager.reached_preemption), and SIGINT keeps its default."""
  received = {"signal": None}
  if threading.current_thread() is not threading.main_thread() or jax.process_count() > 1:
    yield received
    return
  previous = {}

  def handler(signum, frame):
    # Only a flag: a handler that writes (a log line) can interrupt a write in progress and
    # re-enter it ("reentrant call inside BufferedWriter"); the loop says what it does.
    del frame
    if received["signal"] is None:
      received["signal"] = signal.Signals(signum).name

  for name in ("SIGINT", "SIGTERM"):
    previous[name] = signal.signal(getattr(signal, name), handler)
  try:
    yield received
  finally:
    for name, old in previous.items():
      signal.signal(getattr(signal, name), old)


def train_program(runs: list, checkpoint_dir: str, single: bool = False, tag: str = "") -> list:
  """Trains runs that share a program; returns their Recorders (status, last record) in the
  order of the runs. `single`: normstudy.main's one run, which stops with RunHalted when it
  halts (its newest checkpoint then holds the last good state); otherwise a halted run is
  frozen and saved with the others, which go on. `tag` ("program 2/5") begins each progress
  line. Raises Preempted on SIGTERM/SIGINT."""
  with logs.heartbeat(tag):  # a line at least every 30 s, whatever the program is doing
    return _train_program(runs, checkpoint_dir, single, tag)


def _train_program(runs: list, checkpoint_dir: str, single: bool, tag: str) -> list:
  setup = set_up(runs, checkpoint_dir, single, tag)
  recorders, pool = [], None
  try:
    carry = resume.restore(setup, initial_carry(setup))
    recorders, pool = recorder_lib.open_recorders(setup, carry)
    if carry.start_step >= setup.num_steps:  # its checkpoint and records checked: done
      logging.info("finished at step %d already: nothing to train (more steps: "
                   "--config.train.num_steps=N with N > %d continues it)", carry.start_step,
                   setup.num_steps)
    else:
      logging.info("training %d run(s) in one program: steps %d..%d, %d tokens/step, mesh %s; "
                   "progress every %d steps", len(runs), carry.start_step + 1,
                   setup.num_steps, setup.tokens_per_step, dict(setup.mesh.shape),
                   max(1, setup.num_steps // 20))
    with stop_signals() as stop:
      carry, step, preempted_by = loop(setup, recorders, carry, stop)
    if carry.halted_line is not None:
      raise RunHalted(carry.halted_line)
    if preempted_by is not None:
      for k, recorder in enumerate(recorders):
        if k not in carry.stopped:
          recorder.set_status(schema.PREEMPTED, last_step=step)
      raise Preempted(f"{preempted_by} at step {step}: checkpoint saved in {checkpoint_dir}; "
                      "run the same command to continue")
    keeps_state = setup.config.train.checkpoint_every >= 0  # -1: no state at all
    if step > carry.start_step and carry.last_saved != step and keeps_state:
      save_checkpoint(setup, recorders, carry, step)
  finally:
    checkpoints.finish(setup.mngr, checkpoints.state_bytes(setup.abstract))
    for recorder in recorders:
      recorder.close()
    if pool is not None:
      pool.shutdown()
  return recorders


@dataclasses.dataclass(frozen=True)
class Setup:
  """What the loop of one program reads and never changes: the runs and their first config
  (`config`, its structure every run's), the data, the mesh, the compiled steps (`steps`: how
  the runs step and hold their state), the state's abstract form, the checkpoint manager, the
  fixed validation batches and each run's last step (runs may differ)."""
  runs: list
  config: Any
  checkpoint_dir: str
  single: bool
  tag: str
  splits: Any
  mesh: Any
  steps: execution.ProgramSteps
  abstract: Any
  mngr: Any
  train_data: list
  eval_batches: list
  last_steps: frozenset

  @property
  def tokens_per_step(self) -> int:
    return self.config.train.batch_size * self.config.model.max_len

  @property
  def num_steps(self) -> int:
    return max(self.last_steps)

  def batch(self, step: int):
    return sharding.global_batch(self.mesh, _stack([ds[step - 1] for ds in self.train_data]))


class Carry(NamedTuple):
  """What the loop carries from one dispatch to the next, replaced and never changed in place:
  the train state, the step it continued after, the step last checkpointed, the runs that
  stopped ({run index: life status}), the dispatch whose metrics wait (`pending`), the single
  run's halt line, the last step whose records were written and when, and the logits the update
  sizes are measured from (train.update_size_steps)."""
  state: Any
  start_step: int
  last_saved: int | None
  stopped: dict
  pending: PendingStep | None = None
  halted_line: str | None = None
  resolved_at: tuple = (0, 0.0)
  outputs: Any = None
  initial_outputs: Any = None


def set_up(runs: list, checkpoint_dir: str, single: bool, tag: str) -> Setup:
  """Data, mesh, the compiled steps and the checkpoint manager (the runs' directories exist:
  normstudy.experiments made them). `tag` begins each progress line."""
  configs = [run.config for run in runs]
  config = configs[0]
  try:
    splits = sources.load_splits(config)
  except ValueError as e:  # no files match, a tokenizer that does not fit: the user's to fix
    raise UserError(str(e)) from None
  eval_data = _stack([_stack(batches_lib.eval_batches(c, splits)) for c in configs])
  mesh = sharding.make_mesh(config.mesh)
  steps = execution.ProgramSteps(config, mesh, len(runs))
  return Setup(
      runs=runs, config=config, checkpoint_dir=checkpoint_dir, single=single, tag=tag,
      splits=splits, mesh=mesh, steps=steps, abstract=steps.abstract(configs),
      mngr=checkpoints.manager(checkpoint_dir, config.train.max_to_keep),
      train_data=[batches_lib.train_batches(c, splits) for c in configs],
      eval_batches=[sharding.global_batch(mesh, jax.tree.map(lambda x, i=i: x[:, i], eval_data))
                    for i in range(config.train.eval_steps)],
      last_steps=frozenset(c.train.num_steps for c in configs))


def initial_carry(setup: Setup) -> Carry:
  """The initial state (a pure function of the configs) and, while update sizes are measured,
  f(x; theta_0) on the first eval batch: the base of the accumulated update (a program that
  resumes has it too)."""
  state = setup.steps.initial([run.config for run in setup.runs])
  initial_outputs = (setup.steps.outputs(setup.steps.params(state), setup.eval_batches[0])
                     if setup.config.train.update_size_steps else None)
  return Carry(state, start_step=0, last_saved=None, stopped={},
               initial_outputs=initial_outputs)


def stage(setup: Setup, step: int) -> tuple:
  """(first, last, work) of the dispatch that begins at `step`: the batch of a step alone
  (first is None), or a block's batches staged on the devices (ProgramSteps.block_work)."""
  train_cfg = setup.config.train
  if schedule.steps_alone(train_cfg, setup.last_steps, step):
    return None, step, setup.batch(step)
  last = schedule.dispatch_end(train_cfg, setup.last_steps, step)
  batches = [_stack([ds[s - 1] for ds in setup.train_data]) for s in range(step, last + 1)]
  return step, last, setup.steps.block_work(batches, train_cfg.steps_per_dispatch)


def loop(setup: Setup, recorders: list, carry: Carry, stop: dict) -> tuple:
  """Steps until every run has stopped, the single run halted, or a stop signal arrived;
  returns (the carry, the last step dispatched, the signal's name or None). Steps go one at a
  time or in blocks (dispatch_end); a stop signal is acted on after the current dispatch."""
  train_cfg, runs, steps = setup.config.train, setup.runs, setup.steps
  progress = recorder_lib.Progress(runs, carry.start_step, setup.num_steps, tag=setup.tag)
  step = carry.start_step
  carry = carry._replace(resolved_at=(step, time.perf_counter()))
  work = stage(setup, step + 1)
  if step < train_cfg.update_size_steps:
    carry = carry._replace(outputs=steps.outputs(steps.params(carry.state),
                                                 setup.eval_batches[0]))
  else:  # resumed past the measured steps
    carry = carry._replace(initial_outputs=None)
  announced = False  # the first dispatch's compile lines
  while len(carry.stopped) < len(runs) and carry.halted_line is None:
    resolved = None
    if carry.pending is not None:  # the dispatch before: was it finite, did its runs stop?
      resolved = resolve(setup, carry)
      if len(set(carry.stopped) | recorder_lib.stopping(resolved)) == len(runs):  # none left
        carry = recorder_lib.record(setup, recorders, carry, resolved, progress=progress)
        break
    first, step, batch = work
    stopped = frozenset(carry.stopped) | recorder_lib.stopping(resolved)
    with (_compiling(setup, first is not None) if not announced
          else contextlib.nullcontext()):
      announced = True
      if first is not None:
        state, device_metrics = steps.step_block(carry.state, batch, stopped)
      else:
        state, device_metrics = steps.step(carry.state, batch,
                                           schedule.telemetry_due(train_cfg, step), stopped)
    carry = carry._replace(state=state)
    if resolved is not None:
      carry = recorder_lib.record(setup, recorders, carry, resolved, progress=progress)
    update_sizes = None
    if step <= train_cfg.update_size_steps:
      update_sizes, carry = measure_update(setup, carry, step)
    work = stage(setup, step + 1)  # prepared while the device runs this dispatch
    eval_losses = (evaluate(setup, carry.state)
                   if schedule.due(train_cfg.eval_every, step, setup.last_steps) else None)
    carry = carry._replace(pending=PendingStep(
        step, device_metrics, None if first is not None else batch, eval_losses=eval_losses,
        update_sizes=update_sizes, first=first))
    preempted_by = stop["signal"] or (
        "preemption notice" if jax.process_count() > 1
        and setup.mngr.reached_preemption(step) else None)
    if preempted_by:
      logging.warning("%s received: checkpointing step %d, then stopping", preempted_by, step)
    if schedule.due(train_cfg.checkpoint_every, step, setup.last_steps) or preempted_by:
      carry = save_checkpoint(setup, recorders, carry, step, progress)
    if preempted_by and carry.halted_line is None:
      return carry, step, preempted_by
  return carry, step, None


def _compiling(setup: Setup, block: bool):
  """Around the loop's first dispatch, which compiles the train step (or block) or loads it from
  the compile cache: a line before and one after with its time (normstudy.engine.logs
  .compiling)."""
  runs = f"{len(setup.runs)} run(s)" + (", stepped one at a time"
                                        if setup.steps.one_at_a_time else "")
  what = (f"the block of {setup.config.train.steps_per_dispatch} train steps" if block
          else "the train step")
  return logs.compiling(f"{what} ({runs})", setup.tag)


def measure_update(setup: Setup, carry: Carry, step: int) -> tuple:
  """(each run's update size of the step just dispatched (normstudy.core.steps.update_size) on
  the first eval batch, the same rows and masks for every run, and its accumulated update (the
  same size measured from the initial parameters): {record key: device array [K]}, the carry
  with the logits the next measurement starts from)."""
  after = setup.steps.outputs(setup.steps.params(carry.state), setup.eval_batches[0])
  sizes = {keys.UPDATE_SIZE: _update_size(carry.outputs, after),
           keys.ACCUMULATED_UPDATE: _update_size(carry.initial_outputs, after)}
  if step >= setup.config.train.update_size_steps:  # the logits can go
    return sizes, carry._replace(outputs=None, initial_outputs=None)
  return sizes, carry._replace(outputs=after)


def evaluate(setup: Setup, state):
  """Each run's mean loss per predicted token over its fixed validation batches."""
  steps = setup.steps
  totals = jax.device_get([steps.eval(steps.params(state), b) for b in setup.eval_batches])
  loss_sum = sum(t["loss_sum"] for t in totals)
  count = sum(t["count"] for t in totals)
  return loss_sum / np.maximum(count, 1.0)


def resolve(setup: Setup, carry: Carry) -> list:
  """Fetches the pending dispatch's metrics (and update sizes, in the same transfer) and
  says where each failed run's step went non-finite: a single step's failures are located
  now (the state still holds their parameters before that step), a block's were located in
  the block. Returns a Resolved per step."""
  pending = carry.pending
  values, update_sizes = jax.device_get((pending.metrics, pending.update_sizes))
  if not pending.is_block:
    failed = np.asarray(values[keys.SKIPPED]) & np.asarray(values[keys.ACTIVE])
    sites = {}
    if failed.any():
      flags = jax.device_get(setup.steps.locate(carry.state, pending.batch))
      for k in np.flatnonzero(failed):
        sites[k] = telemetry.first_nonfinite(jax.tree.map(lambda x, k=k: x[k], flags))
    return [recorder_lib.Resolved(pending.step, values, sites, pending.eval_losses,
                                  update_sizes)]
  flags = values.pop(keys.SITES)
  resolved = []
  for j, step in enumerate(range(pending.first, pending.step + 1)):
    at = {key: np.asarray(value)[:, j] for key, value in values.items()}
    failed = at[keys.SKIPPED] & at[keys.ACTIVE]
    sites = {k: telemetry.first_nonfinite(jax.tree.map(lambda x, k=k: x[k, j], flags))
             for k in np.flatnonzero(failed)}
    resolved.append(recorder_lib.Resolved(step, at, sites,
                                          pending.eval_losses if step == pending.step else None))
  return resolved


def save_checkpoint(setup: Setup, recorders: list, carry: Carry, step: int,
                    progress=None) -> Carry:
  """Records the pending step (always), then checkpoints the stacked state at `step`, unless
  the single run halted: its newest checkpoint stays the last good state."""
  if carry.pending is not None:
    carry = recorder_lib.record(setup, recorders, carry, resolve(setup, carry), checkpointed=True,
                   progress=progress)
  if carry.halted_line is not None:
    return carry
  for recorder in recorders:
    recorder.flush()
  checkpoints.save(setup.mngr, step, setup.steps.stacked(carry.state))
  return carry._replace(last_saved=step)


_update_size = jax.jit(steps_lib.update_size)
