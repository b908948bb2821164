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
import os
import signal
import threading
import time
from concurrent import futures
from typing import Any, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from normstudy.core import labels
from normstudy.core import life
from normstudy.core import optimizer as optimizer_lib
from normstudy.core import per_run
from normstudy.core import steps as steps_lib
from normstudy.core import telemetry
from normstudy.data import batches as batches_lib
from normstudy.data import sources
from normstudy.engine import checkpoints
from normstudy.engine import execution
from normstudy.engine import logs
from normstudy.engine import recorder as recorder_lib
from normstudy.engine import sharding
from normstudy.errors import Preempted
from normstudy.errors import RunHalted
from normstudy.errors import UserError
from normstudy.records import keys
from normstudy.records import metrics as metrics_lib
from normstudy.records import rundir
from normstudy.records import schema
from normstudy.records import storage

# Step metrics that steer the loop and are not recorded as such.
CONTROL_KEYS = ("active", "status", "telemetry", "sites")


@dataclasses.dataclass
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


@dataclasses.dataclass
class Resolved:
  """One step's metrics on the host ([K] each), where each run that failed at it first went
  non-finite ({run index: schema.Site}), and its eval losses and update sizes if it has them."""
  step: int
  values: dict
  sites: dict
  eval_losses: Any = None
  update_sizes: Any = None


def worth_recording(record: dict, code: int, *, log_due: bool, checkpointed: bool,
                    has_telemetry: bool) -> bool:
  """Whether a run's record of a step goes into metrics.jsonl: every log_every-th step and the
  first; any step with an eval loss, telemetry, an update size, a skipped update or a change of
  the run's life; and a checkpointed step (so a resume can tell whether records were lost)."""
  return (checkpointed or log_due or record[keys.STEP] == 1 or keys.EVAL_LOSS in record
          or keys.UPDATE_SIZE in record or has_telemetry or bool(record[keys.SKIPPED])
          or code != life.CODE_RUNNING)


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
    del frame
    if received["signal"] is None:
      received["signal"] = signal.Signals(signum).name
      logging.warning("%s received: finishing the current step, then checkpointing",
                      received["signal"])

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
    carry = restore(setup, initial_carry(setup))
    recorders, pool = open_recorders(setup, carry)
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


def restore(setup: Setup, carry: Carry) -> Carry:
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
    return carry
  restored = _from_configs(restored, [run.config for run in setup.runs], setup.mesh)
  logging.info("resumed %s from the checkpoint at step %d",  # the gs:// URL of a staged one
               storage.remote(setup.checkpoint_dir), start_step)
  stopped = {k: life.status_of(code)  # stopped before the checkpoint we resumed from
             for k, code in enumerate(np.asarray(jax.device_get(restored.status)))
             if code != life.CODE_RUNNING}
  return carry._replace(state=setup.steps.hold(restored), start_step=start_step,
                        last_saved=start_step, stopped=stopped)


def _replay_from(setup: Setup, restored):
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


def open_recorders(setup: Setup, carry: Carry) -> tuple:
  """(one Recorder per run, their writer thread pool): run.json with the run's facts,
  config.json, its records from the restored step on; warns of runs extended past their
  schedule's horizon."""
  is_writer = jax.process_index() == 0
  pool = futures.ThreadPoolExecutor(max_workers=1) if is_writer else None
  hparams = setup.steps.host_values(carry.state, lambda state: state.hparams)
  num_params = sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(setup.abstract.params))
  resume_step = carry.start_step if carry.last_saved is not None else None
  recorders = []
  try:
    _open_each(setup, carry, recorders, pool, is_writer, hparams, num_params, resume_step)
  except BaseException:  # the ones opened are closed, as the loop's end closes them
    for recorder in recorders:
      recorder.close()
    if pool is not None:
      pool.shutdown()
    raise
  return recorders, pool


def _open_each(setup, carry, recorders, pool, is_writer, hparams, num_params, resume_step):
  """Appends each run's Recorder to `recorders` (open_recorders)."""
  splits, horizons = setup.splits, np.asarray(hparams["schedule_steps"])
  for k, run in enumerate(setup.runs):
    label = labels.resolve(run.config)
    info = schema.RunInfo(
        label=label, name=run.name, arm=run.arm or run.name,
        arm_label=run.arm_label or label, point=run.point, overrides=run.overrides,
        dataset=splits.source, entropy_floor=splits.entropy_floor,
        unigram_entropy=splits.unigram_entropy, masked_loss_floor=splits.masked_loss_floor,
        masked_loss_floor_stderr=splits.masked_loss_floor_stderr, num_params=num_params,
        tokens_per_step=setup.tokens_per_step, schedule_steps=int(horizons[k]),
        checkpoints=os.path.relpath(setup.checkpoint_dir, run.directory), program_index=k)
    recorders.append(recorder_lib.Recorder(
        run, resume_step, info, pool, is_writer, stopped=k in carry.stopped))
    if horizons[k] < run.config.train.num_steps:
      hp = {name: float(values[k]) for name, values in hparams.items()}
      final = float(optimizer_lib.learning_rate(run.config.optimizer.schedule, hp, horizons[k]))
      logging.warning("%s: extended to %d steps; the learning-rate schedule keeps the horizon "
                      "of %d steps it started with, so the steps after it run at its final "
                      "rate %g", run.name, run.config.train.num_steps, int(horizons[k]), final)


def due(every: int, step: int, last_steps: frozenset) -> bool:
  """Every `every`-th step (0: never) and each run's last step; never for -1 (a checkpoint
  interval that keeps no state at all)."""
  if every < 0:
    return False
  return bool(every and step % every == 0) or step in last_steps


def telemetry_due(train_cfg, step: int) -> bool:
  every = train_cfg.telemetry_every
  return bool(every) and step % every == 0


def steps_alone(train_cfg, last_steps: frozenset, step: int) -> bool:
  """Whether `step` is dispatched alone through the one-step programs: it takes telemetry,
  measures an update size, or the config steps one at a time (train.steps_per_dispatch 1).
  Every other step goes through the block program, a block of one included, so a plain step
  is always the same compiled computation however the steps are split into blocks."""
  return (train_cfg.steps_per_dispatch <= 1 or telemetry_due(train_cfg, step)
          or step <= train_cfg.update_size_steps or step > max(last_steps))


def dispatch_end(train_cfg, last_steps: frozenset, step: int) -> int:
  """The last step of the dispatch that begins at `step`: `step` itself when it goes alone;
  otherwise the block's: at most steps_per_dispatch steps, ending at the first step that
  evaluates, checkpoints or ends a run, or before a step that goes alone."""
  if steps_alone(train_cfg, last_steps, step):
    return step
  last = min(step + train_cfg.steps_per_dispatch - 1, max(last_steps))
  for s in range(step, last):
    if (due(train_cfg.eval_every, s, last_steps) or due(train_cfg.checkpoint_every, s, last_steps)
        or steps_alone(train_cfg, last_steps, s + 1)):
      return s
  return last


def stage(setup: Setup, step: int) -> tuple:
  """(first, last, work) of the dispatch that begins at `step`: the batch of a step alone
  (first is None), or a block's batches staged on the devices (ProgramSteps.block_work)."""
  train_cfg = setup.config.train
  if steps_alone(train_cfg, setup.last_steps, step):
    return None, step, setup.batch(step)
  last = dispatch_end(train_cfg, setup.last_steps, step)
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
      if len(set(carry.stopped) | stopping(resolved)) == len(runs):  # no run left running
        carry = record(setup, recorders, carry, resolved, progress=progress)
        break
    first, step, batch = work
    stopped = frozenset(carry.stopped) | stopping(resolved)
    with (_compiling(setup, first is not None) if not announced
          else contextlib.nullcontext()):
      announced = True
      if first is not None:
        state, device_metrics = steps.step_block(carry.state, batch, stopped)
      else:
        state, device_metrics = steps.step(carry.state, batch,
                                           telemetry_due(train_cfg, step), stopped)
    carry = carry._replace(state=state)
    if resolved is not None:
      carry = record(setup, recorders, carry, resolved, progress=progress)
    pending = PendingStep(step, device_metrics, None if first is not None else batch,
                          first=first)
    if step <= train_cfg.update_size_steps:
      pending.update_sizes, carry = measure_update(setup, carry, step)
    carry = carry._replace(pending=pending)
    work = stage(setup, step + 1)  # prepared while the device runs this dispatch
    if due(train_cfg.eval_every, step, setup.last_steps):
      pending.eval_losses = evaluate(setup, carry.state)
    preempted_by = stop["signal"] or (
        "preemption notice" if jax.process_count() > 1
        and setup.mngr.reached_preemption(step) else None)
    if due(train_cfg.checkpoint_every, step, setup.last_steps) or preempted_by:
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
    failed = np.asarray(values["skipped"]) & np.asarray(values["active"])
    sites = {}
    if failed.any():
      flags = jax.device_get(setup.steps.locate(carry.state, pending.batch))
      for k in np.flatnonzero(failed):
        sites[k] = telemetry.first_nonfinite(jax.tree.map(lambda x, k=k: x[k], flags))
    return [Resolved(pending.step, values, sites, pending.eval_losses, update_sizes)]
  flags = values.pop("sites")
  resolved = []
  for j, step in enumerate(range(pending.first, pending.step + 1)):
    at = {key: np.asarray(value)[:, j] for key, value in values.items()}
    failed = at["skipped"] & at["active"]
    sites = {k: telemetry.first_nonfinite(jax.tree.map(lambda x, k=k: x[k, j], flags))
             for k in np.flatnonzero(failed)}
    resolved.append(Resolved(step, at, sites,
                             pending.eval_losses if step == pending.step else None))
  return resolved


def stopping(resolved) -> frozenset:
  """The runs that stop (finish or halt) at a step of `resolved` (None: none)."""
  stopping_ = set()
  for one in resolved or ():
    values = one.values
    stopping_.update(np.flatnonzero(values["active"] & (values["status"] != life.CODE_RUNNING)))
  return frozenset(int(k) for k in stopping_)


def record_of(one: Resolved, k, loss_scaled: bool) -> dict:
  """Run k's record of the resolved step `one`."""
  values = one.values
  record = {keys.STEP: one.step, **{key: values[key][k] for key in keys.STEP_KEYS}}
  record.update({key: values[key][k] for key in values
                 if key not in keys.STEP_KEYS + CONTROL_KEYS})
  if one.eval_losses is not None:
    record[keys.EVAL_LOSS] = one.eval_losses[k]
  for key, sizes in (one.update_sizes or {}).items():
    record[key] = float(sizes[k])
  if values.get("telemetry") is not None:
    record.update(telemetry.flatten(jax.tree.map(lambda x: x[k], values["telemetry"])))
    if loss_scaled:
      record[keys.FP16_OVERFLOWS] = values[keys.SKIPPED_TOTAL][k]
  if k in one.sites:
    record[keys.NONFINITE_AT] = one.sites[k].sentence()
  return record


def record(setup: Setup, recorders: list, carry: Carry, resolved: list,
           checkpointed: bool = False, progress=None) -> Carry:
  """Writes the resolved steps' records (the pending dispatch's) and advances the lives of
  the runs that stopped with them; returns the carry with nothing pending. `checkpointed`: the
  last step is being checkpointed, so it is recorded whatever else."""
  losses = {}
  # A block's steps come back together: each is timed as if the block's wall time since the
  # dispatch before was spread evenly over its steps, so a record's tokens/s is the rate
  # since that run's previous record, as it is when steps go one at a time.
  now = time.perf_counter()
  since, previous = carry.resolved_at
  for one in resolved:
    at = previous + (now - previous) * (one.step - since) / max(resolved[-1].step - since, 1)
    written, carry = record_step(setup, recorders, carry, one,
                                 checkpointed and one is resolved[-1], at)
    losses.update(written)
  carry = carry._replace(resolved_at=(resolved[-1].step, now), pending=None)
  if progress is not None:
    progress.report(resolved[-1].step, losses, carry.stopped)
  return carry


def record_step(setup: Setup, recorders: list, carry: Carry, one: Resolved, checkpointed: bool,
                at: float) -> tuple:
  """Writes the records of one resolved step; returns ({run name: loss} of the runs it
  stepped, the carry with the lives of the runs that stopped at it)."""
  step, values = one.step, one.values
  log_due = due(setup.config.train.log_every, step, setup.last_steps)
  loss_scaled = setup.abstract.loss_scale.dynamic
  losses = {}
  for k, recorder in enumerate(recorders):
    if not values["active"][k]:
      continue
    code = int(values["status"][k])
    record_ = record_of(one, k, loss_scaled)
    if worth_recording(record_, code, log_due=log_due, checkpointed=checkpointed,
                       has_telemetry=values.get("telemetry") is not None):
      record_[keys.TOKENS_PER_SEC] = recorder.tokens_per_sec(step, setup.tokens_per_step, at)
      recorder.write(record_)
    losses[recorder.run.name] = float(record_[keys.LOSS])
    if code != life.CODE_RUNNING:
      carry = run_stopped(setup, recorder, carry, k, code, record_,
                          one.sites.get(k, schema.BACKWARD_ONLY))
  return losses, carry


def run_stopped(setup: Setup, recorder, carry: Carry, k: int, code: int, record_: dict,
                site: schema.Site) -> Carry:
  """Run k finished or halted with the step of `record_`: its status into run.json; the
  carry with it stopped (and, when the single run halts, the line it stops with)."""
  status = life.status_of(code)
  carry = carry._replace(stopped={**carry.stopped, k: status})
  if status == schema.FINISHED:
    recorder.set_status(status, last_step=record_[keys.STEP],
                        finished_num_steps=recorder.run.config.train.num_steps)
    return carry
  reason, sentence = life.halt_description(recorder.run.config, code, record_)
  recorder.set_status(status, last_step=record_[keys.STEP], halt_step=record_[keys.STEP],
                      halt_reason=reason, nonfinite_at=site.sentence(),
                      nonfinite_site=site.as_json())
  sentence += f"; first non-finite: {site.sentence()}"
  logging.warning("%s halted: %s", recorder.run.name, sentence)
  if not setup.single:
    return carry
  good = (f"the newest checkpoint (step {carry.last_saved}) holds the last good state"
          if carry.last_saved else "no checkpoint was saved yet")
  return carry._replace(halted_line=f"{sentence}; {good}")


def save_checkpoint(setup: Setup, recorders: list, carry: Carry, step: int,
                    progress=None) -> Carry:
  """Records the pending step (always), then checkpoints the stacked state at `step`, unless
  the single run halted: its newest checkpoint stays the last good state."""
  if carry.pending is not None:
    carry = record(setup, recorders, carry, resolve(setup, carry), checkpointed=True,
                   progress=progress)
  if carry.halted_line is not None:
    return carry
  for recorder in recorders:
    recorder.flush()
  checkpoints.save(setup.mngr, step, setup.steps.stacked(carry.state))
  return carry._replace(last_saved=step)


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


_update_size = jax.jit(steps_lib.update_size)
