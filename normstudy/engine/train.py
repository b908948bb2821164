"""The training loop of one program: K runs that share one compiled step.

  train_program(runs, checkpoint_dir)   read top to bottom: data, mesh and state, restore,
                                        recorders, the loop, the final checkpoint

A `Program` is the K runs while they train; its methods are the loop's parts, each changing the
program's state where that state belongs: `restore` (where to continue), `open_recorders`,
`loop`, and the periodic actions `evaluate`, `save_checkpoint` and `record_step` (records,
telemetry and the runs' lives).

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
from typing import Any

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
  program = Program(runs, checkpoint_dir, single, tag)
  try:
    program.restore()
    program.open_recorders()
    logging.info("training %d run(s) in one program: steps %d..%d, %d tokens/step, mesh %s; "
                 "progress every %d steps", len(runs), program.start_step + 1,
                 program.num_steps, program.tokens_per_step, dict(program.mesh.shape),
                 max(1, program.num_steps // 20))
    with stop_signals() as stop:
      step, preempted_by = program.loop(stop)
    if program.halted_line is not None:
      raise RunHalted(program.halted_line)
    if preempted_by is not None:
      for k, recorder in enumerate(program.recorders):
        if k not in program.stopped:
          recorder.set_status(schema.PREEMPTED, last_step=step)
      raise Preempted(f"{preempted_by} at step {step}: checkpoint saved in {checkpoint_dir}; "
                      "run the same command to continue")
    if step > program.start_step and program.last_saved != step:
      program.save_checkpoint(step)
  finally:
    program.close()
  return program.recorders


class Program:
  """The K runs of one program while they train (the loop's working state), and the loop.

  Set up here: the runs and their first config (`config`, its structure every run's), the data,
  the mesh, the compiled steps (`steps`: how the runs step and hold their state), the initial
  `state` and the checkpoint manager; `loss_scaled`: whether the state scales fp16 losses. Then
  `restore` sets where training continues (`start_step`, `last_saved`, the runs `stopped`
  before it), `open_recorders` the `recorders`, and the loop the `pending` step, the runs that
  stop (`stopped`: run index -> status) and, when the single run halts, its `halted_line`."""

  def __init__(self, runs: list, checkpoint_dir: str, single: bool, tag: str = ""):
    """Data, mesh, the compiled steps, the initial state and the checkpoint manager (the runs'
    directories exist: normstudy.experiments made them). `tag` begins each progress line."""
    configs = [run.config for run in runs]
    self.runs, self.config, self.checkpoint_dir = runs, configs[0], checkpoint_dir
    self.single, self.tag = single, tag
    try:
      self.splits = sources.load_splits(self.config)
    except ValueError as e:  # no files match, a tokenizer that does not fit: the user's to fix
      raise UserError(str(e)) from None
    eval_data = _stack([_stack(batches_lib.eval_batches(c, self.splits)) for c in configs])
    self.mesh = sharding.make_mesh(self.config.mesh)
    self.steps = execution.ProgramSteps(self.config, self.mesh, len(runs))
    self.abstract = self.steps.abstract(configs)
    self.loss_scaled = self.abstract.loss_scale.dynamic
    self.state = self.steps.initial(configs)
    self.mngr = checkpoints.manager(checkpoint_dir, self.config.train.max_to_keep)
    self.train_data = [batches_lib.train_batches(c, self.splits) for c in configs]
    self.eval_batches = [
        sharding.global_batch(self.mesh, jax.tree.map(lambda x, i=i: x[:, i], eval_data))
        for i in range(self.config.train.eval_steps)]
    # f(x; theta_0) on the first eval batch while update sizes are measured: the base of the
    # accumulated update. The initial state is a pure function of the configs, so a program
    # that resumes has it too.
    self.initial_outputs = (
        self.steps.outputs(self.steps.params(self.state), self.eval_batches[0])
        if self.config.train.update_size_steps else None)
    self.last_steps = frozenset(c.train.num_steps for c in configs)  # runs may differ
    self.start_step, self.last_saved = 0, None
    self.resolved_at = (0, time.perf_counter())  # the last step whose records were written, when
    self.stopped = {}  # run index -> life status
    self.recorders, self.pool = [], None
    self.pending: PendingStep | None = None
    self.halted_line = None  # set when the single run halts
    self.announced_compile = False  # the first dispatch's compile lines (compiling_first)
    # The output logits on the first eval batch after the newest step, while update sizes are
    # measured (train.update_size_steps).
    self.outputs = None

  @property
  def tokens_per_step(self) -> int:
    return self.config.train.batch_size * self.config.model.max_len

  @property
  def num_steps(self) -> int:
    return max(self.last_steps)

  def due(self, every: int, step: int) -> bool:
    """Every `every`-th step (0: never) and each run's last step."""
    return bool(every and step % every == 0) or step in self.last_steps

  def batch(self, step: int):
    return sharding.global_batch(self.mesh, _stack([ds[step - 1] for ds in self.train_data]))

  def close(self):
    checkpoints.finish(self.mngr, checkpoints.state_bytes(self.abstract))
    for recorder in self.recorders:
      recorder.close()
    if self.pool is not None:
      self.pool.shutdown()

  def restore(self) -> None:
    """Restores the newest checkpoint that restores (replaying from an earlier one, or from the
    start, if records were lost after it) and applies the configs' per-run fields to it; marks
    the runs stopped before it. Sets the step to continue after (0: from the start)."""
    try:
      start_step, restored = checkpoints.restore_latest(self.mngr, self.abstract)
    except checkpoints.CheckpointError:
      self.mngr.close()  # orbax's background threads must stop before the process exits
      raise
    if restored is not None:
      replay = self._replay_from(restored)
      if replay is not None:  # records were lost: recompute them from an earlier state
        checkpoints.discard_after(self.mngr, replay)
        start_step = replay
        restored = checkpoints.restore(self.mngr, replay, self.abstract) if replay else None
    if restored is None:
      return
    restored = _from_configs(restored, [run.config for run in self.runs], self.mesh)
    self.state = self.steps.hold(restored)
    logging.info("resumed %s from the checkpoint at step %d",  # the gs:// URL of a staged one
                 storage.remote(self.checkpoint_dir), start_step)
    self.start_step = self.last_saved = start_step
    for k, code in enumerate(np.asarray(jax.device_get(restored.status))):
      if code != life.CODE_RUNNING:  # stopped before the checkpoint we resumed from
        self.stopped[k] = life.status_of(code)

  def _replay_from(self, restored):
    """None if every run's records reach the restored state; else the step to replay from: the
    newest checkpoint before the first lost record, or 0 (the initial state, a pure function
    of the config). Each run that lost records is reported in one line."""
    run_steps = np.asarray(jax.device_get(restored.step))
    lost = {}
    for k, run in enumerate(self.runs):
      first = metrics_lib.first_lost_step(rundir.RunDir(run.directory).metrics_path,
                                          int(run_steps[k]))
      if first is not None:
        lost[run.name] = first
    if not lost:
      return None
    first = min(lost.values())
    replay = max((s for s in self.mngr.all_steps() if s < first), default=0)
    for name, step in lost.items():
      logging.warning("%s: %s has lost or damaged records from step %d on (the checkpoint is "
                      "at step %d); replaying from %s to regenerate them", name, schema.METRICS,
                      step, int(run_steps.max()),
                      f"the checkpoint of step {replay}" if replay else "the start")
    return replay

  def open_recorders(self) -> None:
    """One Recorder per run (run.json with the run's facts, config.json, its records from the
    restored step on); warns of runs extended past their schedule's horizon."""
    is_writer = jax.process_index() == 0
    self.pool = futures.ThreadPoolExecutor(max_workers=1) if is_writer else None
    hparams = self.steps.host_values(self.state, lambda state: state.hparams)
    horizons = np.asarray(hparams["schedule_steps"])
    num_params = sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(self.abstract.params))
    resume_step = self.start_step if self.last_saved is not None else None
    splits = self.splits
    for k, run in enumerate(self.runs):
      label = labels.resolve(run.config)
      info = schema.RunInfo(
          label=label, name=run.name, arm=run.arm or run.name,
          arm_label=run.arm_label or label, point=run.point, overrides=run.overrides,
          dataset=splits.source, entropy_floor=splits.entropy_floor,
          unigram_entropy=splits.unigram_entropy, masked_loss_floor=splits.masked_loss_floor,
          masked_loss_floor_stderr=splits.masked_loss_floor_stderr, num_params=num_params,
          tokens_per_step=self.tokens_per_step, schedule_steps=int(horizons[k]),
          checkpoints=os.path.relpath(self.checkpoint_dir, run.directory), program_index=k)
      self.recorders.append(recorder_lib.Recorder(
          run, resume_step, info, self.pool, is_writer, stopped=k in self.stopped))
      if horizons[k] < run.config.train.num_steps:
        hp = {name: float(values[k]) for name, values in hparams.items()}
        final = float(optimizer_lib.learning_rate(run.config.optimizer.schedule, hp,
                                                  horizons[k]))
        logging.warning("%s: extended to %d steps; the learning-rate schedule keeps the horizon "
                        "of %d steps it started with, so the steps after it run at its final "
                        "rate %g", run.name, run.config.train.num_steps, int(horizons[k]), final)

  def telemetry_due(self, step: int) -> bool:
    every = self.config.train.telemetry_every
    return bool(every) and step % every == 0

  def steps_alone(self, step: int) -> bool:
    """Whether `step` is dispatched alone through the one-step programs: it takes telemetry,
    measures an update size, or the config steps one at a time (train.steps_per_dispatch 1).
    Every other step goes through the block program, a block of one included, so a plain step
    is always the same compiled computation however the steps are split into blocks."""
    cfg = self.config.train
    return (cfg.steps_per_dispatch <= 1 or self.telemetry_due(step)
            or step <= cfg.update_size_steps or step > self.num_steps)

  def dispatch_end(self, step: int) -> int:
    """The last step of the dispatch that begins at `step`: `step` itself when it goes alone;
    otherwise the block's: at most steps_per_dispatch steps, ending at the first step that
    evaluates, checkpoints or ends a run, or before a step that goes alone."""
    cfg = self.config.train
    if self.steps_alone(step):
      return step
    last = min(step + cfg.steps_per_dispatch - 1, self.num_steps)
    for s in range(step, last):
      if (self.due(cfg.eval_every, s) or self.due(cfg.checkpoint_every, s)
          or self.steps_alone(s + 1)):
        return s
    return last

  def stage(self, step: int) -> tuple:
    """(first, last, work) of the dispatch that begins at `step`: the batch of a step alone
    (first is None), or a block's batches staged on the devices (ProgramSteps.block_work)."""
    if self.steps_alone(step):
      return None, step, self.batch(step)
    last = self.dispatch_end(step)
    batches = [_stack([ds[s - 1] for ds in self.train_data]) for s in range(step, last + 1)]
    return step, last, self.steps.block_work(batches, self.config.train.steps_per_dispatch)

  def loop(self, stop: dict):
    """Steps until every run has stopped, the single run halted, or a stop signal arrived;
    returns (the last step dispatched, the signal's name or None). Steps go one at a time or
    in blocks (dispatch_end); a stop signal is acted on after the current dispatch."""
    train_cfg = self.config.train
    progress = recorder_lib.Progress(self.runs, self.start_step, self.num_steps, tag=self.tag)
    step = self.start_step
    self.resolved_at = (step, time.perf_counter())
    work = self.stage(step + 1)
    if step < train_cfg.update_size_steps:
      self.outputs = self.steps.outputs(self.steps.params(self.state), self.eval_batches[0])
    else:  # resumed past the measured steps
      self.initial_outputs = None
    while len(self.stopped) < len(self.runs) and self.halted_line is None:
      resolved = None
      if self.pending is not None:  # the dispatch before: was it finite, did its runs stop?
        resolved = self.resolve()
        if self.all_stop_with(resolved):
          self.record(resolved, progress=progress)
          break
      first, step, batch = work
      stopped = frozenset(self.stopped) | self.stopping(resolved)
      with self.compiling_first(first is not None):
        if first is not None:
          self.state, device_metrics = self.steps.step_block(self.state, batch, stopped)
        else:
          self.state, device_metrics = self.steps.step(self.state, batch,
                                                       self.telemetry_due(step), stopped)
      if resolved is not None:
        self.record(resolved, progress=progress)
      self.pending = PendingStep(step, device_metrics, None if first is not None else batch,
                                 first=first)
      if step <= train_cfg.update_size_steps:
        self.pending.update_sizes = self.measure_update()
      work = self.stage(step + 1)  # prepared while the device runs this dispatch
      if self.due(train_cfg.eval_every, step):
        self.pending.eval_losses = self.evaluate()
      preempted_by = stop["signal"] or (
          "preemption notice" if jax.process_count() > 1
          and self.mngr.reached_preemption(step) else None)
      if self.due(train_cfg.checkpoint_every, step) or preempted_by:
        self.save_checkpoint(step, progress)
      if preempted_by and self.halted_line is None:
        return step, preempted_by
    return step, None

  def compiling_first(self, block: bool):
    """Around the loop's first dispatch, which compiles the train step (or block) or loads it
    from the compile cache: a line before and one after with its time (normstudy.engine.logs
    .compiling); nothing around the others."""
    if self.announced_compile:
      return contextlib.nullcontext()
    self.announced_compile = True
    runs = f"{len(self.runs)} run(s)" + (", stepped one at a time" if self.steps.one_at_a_time
                                         else "")
    what = (f"the block of {self.config.train.steps_per_dispatch} train steps" if block
            else "the train step")
    return logs.compiling(f"{what} ({runs})")

  def measure_update(self):
    """Each run's update size of the step just dispatched (normstudy.core.steps.update_size) on
    the first eval batch, the same rows and masks for every run, and its accumulated update
    (the same size measured from the initial parameters): {record key: device array [K]}."""
    after = self.steps.outputs(self.steps.params(self.state), self.eval_batches[0])
    sizes = {keys.UPDATE_SIZE: _update_size(self.outputs, after),
             keys.ACCUMULATED_UPDATE: _update_size(self.initial_outputs, after)}
    if self.pending.step >= self.config.train.update_size_steps:  # the logits can go
      self.outputs = self.initial_outputs = None
    else:
      self.outputs = after
    return sizes

  def evaluate(self):
    """Each run's mean loss per predicted token over its fixed validation batches."""
    totals = jax.device_get([self.steps.eval(self.steps.params(self.state), b)
                             for b in self.eval_batches])
    loss_sum = sum(t["loss_sum"] for t in totals)
    count = sum(t["count"] for t in totals)
    return loss_sum / np.maximum(count, 1.0)

  def resolve(self) -> list:
    """Fetches the pending dispatch's metrics (and update sizes, in the same transfer) and
    says where each failed run's step went non-finite: a single step's failures are located
    now (the state still holds their parameters before that step), a block's were located in
    the block. Returns a Resolved per step."""
    pending = self.pending
    values, pending.update_sizes = jax.device_get((pending.metrics, pending.update_sizes))
    if not pending.is_block:
      failed = np.asarray(values["skipped"]) & np.asarray(values["active"])
      sites = {}
      if failed.any():
        flags = jax.device_get(self.steps.locate(self.state, pending.batch))
        for k in np.flatnonzero(failed):
          sites[k] = telemetry.first_nonfinite(jax.tree.map(lambda x, k=k: x[k], flags))
      return [Resolved(pending.step, values, sites, pending.eval_losses, pending.update_sizes)]
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

  @staticmethod
  def stopping(resolved) -> frozenset:
    """The runs that stop (finish or halt) at a step of `resolved` (None: none)."""
    stopping = set()
    for one in resolved or ():
      values = one.values
      stopping.update(np.flatnonzero(values["active"] & (values["status"] != life.CODE_RUNNING)))
    return frozenset(int(k) for k in stopping)

  def all_stop_with(self, resolved) -> bool:
    """Whether no run is left running after the resolved steps."""
    return len(set(self.stopped) | self.stopping(resolved)) == len(self.runs)

  def record_of(self, one: Resolved, k) -> dict:
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
      if self.loss_scaled:
        record[keys.FP16_OVERFLOWS] = values[keys.SKIPPED_TOTAL][k]
    if k in one.sites:
      record[keys.NONFINITE_AT] = one.sites[k].sentence()
    return record

  def record(self, resolved: list, checkpointed: bool = False, progress=None):
    """Writes the resolved steps' records (the pending dispatch's) and advances the lives of
    the runs that stopped with them. `checkpointed`: the last step is being checkpointed, so
    it is recorded whatever else."""
    losses = {}
    # A block's steps come back together: each is timed as if the block's wall time since the
    # dispatch before was spread evenly over its steps, so a record's tokens/s is the rate
    # since that run's previous record, as it is when steps go one at a time.
    now = time.perf_counter()
    since, previous = self.resolved_at
    for one in resolved:
      at = previous + (now - previous) * (one.step - since) / max(resolved[-1].step - since, 1)
      losses.update(self.record_step(one, checkpointed and one is resolved[-1], at))
    self.resolved_at = (resolved[-1].step, now)
    self.pending = None
    if progress is not None:
      progress.report(resolved[-1].step, losses, self.stopped)

  def record_step(self, one: Resolved, checkpointed: bool, at: float) -> dict:
    """Writes the records of one resolved step; returns {run name: loss} of the runs it
    stepped."""
    step, values = one.step, one.values
    log_due = self.due(self.config.train.log_every, step)
    losses = {}
    for k, recorder in enumerate(self.recorders):
      if not values["active"][k]:
        continue
      code = int(values["status"][k])
      record = self.record_of(one, k)
      if worth_recording(record, code, log_due=log_due, checkpointed=checkpointed,
                         has_telemetry=values.get("telemetry") is not None):
        record[keys.TOKENS_PER_SEC] = recorder.tokens_per_sec(step, self.tokens_per_step, at)
        recorder.write(record)
      losses[recorder.run.name] = float(record[keys.LOSS])
      if code != life.CODE_RUNNING:
        self.run_stopped(k, code, record, one.sites.get(k, schema.BACKWARD_ONLY))
    return losses

  def run_stopped(self, k: int, code: int, record: dict, site: schema.Site):
    """Run k finished or halted with the step of `record`."""
    recorder = self.recorders[k]
    status = life.status_of(code)
    self.stopped[k] = status
    if status == schema.FINISHED:
      recorder.set_status(status, last_step=record[keys.STEP],
                          finished_num_steps=recorder.run.config.train.num_steps)
      return
    reason, sentence = life.halt_description(recorder.run.config, code, record)
    recorder.set_status(status, last_step=record[keys.STEP], halt_step=record[keys.STEP],
                        halt_reason=reason, nonfinite_at=site.sentence(),
                        nonfinite_site=site.as_json())
    sentence += f"; first non-finite: {site.sentence()}"
    logging.warning("%s halted: %s", recorder.run.name, sentence)
    if self.single:
      good = (f"the newest checkpoint (step {self.last_saved}) holds the last good state"
              if self.last_saved else "no checkpoint was saved yet")
      self.halted_line = f"{sentence}; {good}"

  def save_checkpoint(self, step: int, progress=None) -> None:
    """Records the pending step (always), then checkpoints the stacked state at `step`, unless
    the single run halted: its newest checkpoint stays the last good state."""
    if self.pending is not None:
      self.record(self.resolve(), checkpointed=True, progress=progress)
    if self.halted_line is not None:
      return
    for recorder in self.recorders:
      recorder.flush()
    checkpoints.save(self.mngr, step, self.steps.stacked(self.state))
    self.last_saved = step


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
