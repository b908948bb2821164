"""The training loop of one program: K runs that share one compiled step.

  train_program(runs, checkpoint_dir)   read top to bottom: data, mesh and state, restore,
                                        recorders, compilation, the loop, the final checkpoint

The K runs' configs differ only in per-run fields (normstudy.per_run); each keeps its own loss
scale, skip counter and life (normstudy.life): a run that finishes or halts is frozen while the
others go on. How the K runs step, and the form their state is held in, is
normstudy.execution's (ProgramSteps); the loop only hands that state back to it. Grouping runs
into programs and running several programs is normstudy.orchestrate's; a run is a
normstudy.grid.Run (.name, .config, .directory, .arm, .arm_label, .point, .overrides).

Starting again resumes from the newest checkpoint that restores: each run's records after it are
dropped first, so a resumed run's records equal an uninterrupted run's. SIGTERM/SIGINT finish the
current step, checkpoint it and stop (errors.Preempted).

The loop processes step N-1's metrics after step N is dispatched, as nanodo does; before
dispatching N it only checks whether N-1 was non-finite, since the state after a skipped step
still has the parameters that failed, which the locate step re-runs to say where the failure
started. Periodic work is one named action each: `evaluate`, `save_checkpoint`, `record_step`
(records, telemetry and the runs' lives).
"""

import contextlib
import dataclasses
import signal
import threading
from concurrent import futures
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from normstudy import checkpoints
from normstudy import data as data_lib
from normstudy import execution
from normstudy import labels
from normstudy import life
from normstudy import metrics as metrics_lib
from normstudy import optimizer as optimizer_lib
from normstudy import per_run
from normstudy import recorder as recorder_lib
from normstudy import rundir
from normstudy import sharding
from normstudy import steps as steps_lib
from normstudy import telemetry
from normstudy.errors import Preempted
from normstudy.errors import RunHalted
from normstudy.errors import UserError

RECORD_KEYS = ("loss", "grad_norm", "clipped", "lr", "loss_scale", "skipped", "skipped_total")
# Step metrics that steer the loop and are not recorded as such.
CONTROL_KEYS = ("active", "status", "telemetry")


@dataclasses.dataclass
class PendingStep:
  """The newest dispatched step, whose metrics are processed after its successor is dispatched:
  its number, its metrics (device arrays [K]), its batch (for the locate step) and, on an eval
  step, each run's eval loss."""
  step: int
  metrics: Any
  batch: Any
  eval_losses: Any = None
  update_sizes: Any = None  # [K] on the first train.update_size_steps steps


def worth_recording(record: dict, code: int, *, log_due: bool, checkpointed: bool,
                    has_telemetry: bool) -> bool:
  """Whether a run's record of a step goes into metrics.jsonl: every log_every-th step and the
  first; any step with an eval loss, telemetry, an update size, a skipped update or a change of
  the run's life; and a checkpointed step (so a resume can tell whether records were lost)."""
  return (checkpointed or log_due or record["step"] == 1 or "eval_loss" in record
          or "update_size" in record or has_telemetry or bool(record["skipped"])
          or code != life.CODE_RUNNING)


@dataclasses.dataclass
class Program:
  """The K runs of one program while they train (the loop's working state)."""
  runs: list
  config: Any  # the first run's: its structure is every run's
  checkpoint_dir: str
  single: bool  # normstudy.main's one run: it stops with RunHalted when the run halts
  mesh: Any
  steps: execution.ProgramSteps  # compiled steps; how the runs step and hold their state
  state: Any  # as `steps` holds it (steps.stacked(state) is the stacked [K, ...] state)
  mngr: Any
  train_data: list
  eval_batches: list
  start_step: int
  splits: Any  # the data's splits (normstudy.data.TokenSplits): source and entropy floor
  last_steps: frozenset  # each run's num_steps (runs of a program may differ)
  recorders: list = dataclasses.field(default_factory=list)
  pool: Any = None
  stopped: dict = dataclasses.field(default_factory=dict)  # run index -> life status
  pending: PendingStep | None = None
  last_saved: int | None = None
  halted_line: str | None = None  # set when the single run halts
  tag: str = ""  # which program of a sweep, on each progress line
  # The output logits on the first eval batch after the newest step, while update sizes are
  # measured (train.update_size_steps).
  outputs: Any = None

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
    self.mngr.wait_until_finished()
    self.mngr.close()
    for recorder in self.recorders:
      recorder.close()
    if self.pool is not None:
      self.pool.shutdown()


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
  program = _setup(runs, checkpoint_dir, single)
  program.tag = tag
  try:
    program.start_step = restore(program)
    open_recorders(program)
    logging.info("training %d run(s) in one program: steps %d..%d, %d tokens/step, mesh %s",
                 len(runs), program.start_step + 1, program.num_steps,
                 program.tokens_per_step, dict(program.mesh.shape))
    with stop_signals() as stop:
      step, preempted_by = _loop(program, stop)
    if program.halted_line is not None:
      raise RunHalted(program.halted_line)
    if preempted_by is not None:
      for k, recorder in enumerate(program.recorders):
        if k not in program.stopped:
          recorder.set_status(life.PREEMPTED, last_step=step)
      raise Preempted(f"{preempted_by} at step {step}: checkpoint saved in {checkpoint_dir}; "
                      "run the same command to continue")
    if step > program.start_step and program.last_saved != step:
      save_checkpoint(program, step)
  finally:
    program.close()
  return program.recorders


def _setup(runs, checkpoint_dir, single) -> Program:
  """Data, mesh, the compiled steps, the initial state and the checkpoint manager (the runs'
  directories exist: normstudy.orchestrate made them)."""
  configs = [run.config for run in runs]
  config = configs[0]
  try:
    splits = data_lib.load_splits(config)
  except ValueError as e:  # no files match, a tokenizer that does not fit: the user's to fix
    raise UserError(str(e)) from None
  eval_data = _stack([_stack(data_lib.eval_batches(c, splits)) for c in configs])
  mesh = sharding.make_mesh(config.mesh)
  steps = execution.ProgramSteps(config, mesh, len(runs))
  program = Program(
      runs=runs, config=config, checkpoint_dir=checkpoint_dir, single=single, mesh=mesh,
      steps=steps, state=steps.initial(configs),
      mngr=checkpoints.manager(checkpoint_dir, config.train.max_to_keep),
      train_data=[data_lib.train_batches(c, splits) for c in configs],
      eval_batches=[sharding.global_batch(mesh, jax.tree.map(lambda x: x[:, i], eval_data))
                    for i in range(config.train.eval_steps)],
      start_step=0, splits=splits,
      last_steps=frozenset(c.train.num_steps for c in configs))
  return program


def restore(program: Program) -> int:
  """Restores the newest checkpoint that restores (replaying from an earlier one, or from the
  start, if records were lost after it) and applies the configs' per-run fields to it; marks
  the runs stopped before it. Returns the step to continue after (0: from the start)."""
  abstract = program.steps.abstract([run.config for run in program.runs])
  try:
    start_step, restored = checkpoints.restore_latest(program.mngr, abstract)
  except checkpoints.CheckpointError:
    program.mngr.close()  # orbax's background threads must stop before the process exits
    raise
  if restored is not None:
    replay = _replay_from(program, restored)
    if replay is not None:  # records were lost: recompute them from an earlier state
      checkpoints.discard_after(program.mngr, replay)
      start_step = replay
      restored = checkpoints.restore(program.mngr, replay, abstract) if replay else None
  if restored is None:
    program.last_saved = None
    return 0
  restored = _from_configs(restored, [run.config for run in program.runs], program.mesh)
  program.state = program.steps.hold(restored)
  logging.info("resumed %s from the checkpoint at step %d", program.checkpoint_dir, start_step)
  program.last_saved = start_step
  for k, code in enumerate(np.asarray(jax.device_get(restored.status))):
    if code != life.CODE_RUNNING:  # stopped before the checkpoint we resumed from
      program.stopped[k] = life.status_of(code)
  return start_step


def _from_configs(state, configs, mesh):
  """The restored state with the (possibly changed) configs' per-run fields applied
  (normstudy.per_run.apply_to_restored; the schedule keeps its horizon, so the rate never
  jumps). A run restored as finished whose config now asks for more steps runs again."""
  horizons = np.asarray(jax.device_get(state.hparams["schedule_steps"]))
  values = jax.device_put(per_run.stacked_values(configs, horizons),
                          sharding.runs_sharding(mesh))
  state = per_run.apply_to_restored(state, values)
  limits = state.limits
  counted = jnp.where(limits["count_skipped_steps"], state.step, state.opt_step)
  more = jnp.logical_and(state.status == life.CODE_FINISHED, counted < limits["num_steps"])
  return state.replace(status=jnp.where(more, life.CODE_RUNNING, state.status))


def _replay_from(program: Program, restored):
  """None if every run's records reach the restored state; else the step to replay from: the
  newest checkpoint before the first lost record, or 0 (the initial state, a pure function
  of the config). Each run that lost records is reported in one line."""
  run_steps = np.asarray(jax.device_get(restored.step))
  lost = {}
  for k, run in enumerate(program.runs):
    first = metrics_lib.first_lost_step(rundir.RunDir(run.directory).metrics_path,
                                        int(run_steps[k]))
    if first is not None:
      lost[run.name] = first
  if not lost:
    return None
  first = min(lost.values())
  replay = max((s for s in program.mngr.all_steps() if s < first), default=0)
  for name, step in lost.items():
    logging.warning("%s: %s has lost or damaged records from step %d on (the checkpoint is "
                    "at step %d); replaying from %s to regenerate them", name, rundir.METRICS,
                    step, int(run_steps.max()),
                    f"the checkpoint of step {replay}" if replay else "the start")
  return replay


def open_recorders(program: Program) -> None:
  """One Recorder per run (run.json with the run's facts, config.json, its records from the
  restored step on); warns of runs extended past their schedule's horizon."""
  is_writer = jax.process_index() == 0
  program.pool = futures.ThreadPoolExecutor(max_workers=1) if is_writer else None
  hparams = program.steps.host_values(program.state, lambda state: state.hparams)
  horizons = np.asarray(hparams["schedule_steps"])
  shapes = program.steps.abstract([run.config for run in program.runs])
  num_params = sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(shapes.params))
  resume_step = program.start_step if program.last_saved is not None else None
  splits = program.splits
  for k, run in enumerate(program.runs):
    label = labels.resolve(run.config)
    info = {"label": label, "name": run.name, "arm": run.arm or run.name,
            "arm_label": run.arm_label or label, "point": run.point,
            "overrides": run.overrides, "dataset": splits.source,
            "entropy_floor": splits.entropy_floor, "unigram_entropy": splits.unigram_entropy,
            "masked_loss_floor": splits.masked_loss_floor,
            "masked_loss_floor_stderr": splits.masked_loss_floor_stderr, "num_params": num_params,
            "tokens_per_step": program.tokens_per_step, "schedule_steps": int(horizons[k])}
    program.recorders.append(recorder_lib.Recorder(
        run, resume_step, info, program.pool, is_writer, stopped=k in program.stopped))
    if horizons[k] < run.config.train.num_steps:
      hp = {name: float(values[k]) for name, values in hparams.items()}
      final = float(optimizer_lib.learning_rate(run.config.optimizer.schedule, hp, horizons[k]))
      logging.warning("%s: extended to %d steps; the learning-rate schedule keeps the horizon "
                      "of %d steps it started with, so the steps after it run at its final "
                      "rate %g", run.name, run.config.train.num_steps, int(horizons[k]), final)


def _loop(program: Program, stop: dict):
  """Steps until every run has stopped, the single run halted, or a stop signal arrived;
  returns (the last step dispatched, the signal's name or None)."""
  train_cfg = program.config.train
  progress = recorder_lib.Progress(program.runs, program.start_step, program.num_steps,
                                   tag=program.tag)
  step = program.start_step
  batch = program.batch(step + 1)
  if step < train_cfg.update_size_steps:
    program.outputs = program.steps.outputs(program.steps.params(program.state),
                                            program.eval_batches[0])
  while len(program.stopped) < len(program.runs) and program.halted_line is None:
    resolved = None
    if program.pending is not None:  # the step before: was it finite, did its runs stop?
      resolved = _resolve(program)
      if _all_stop_with(program, resolved[0]):
        record_step(program, *resolved, progress=progress)
        break
    step += 1
    telemetry_due = bool(train_cfg.telemetry_every) and step % train_cfg.telemetry_every == 0
    step_fn = program.steps.telemetry if telemetry_due else program.steps.train
    program.state, device_metrics = step_fn(program.state, batch)
    if resolved is not None:
      record_step(program, *resolved, progress=progress)
    program.pending = PendingStep(step, device_metrics, batch)
    if step <= train_cfg.update_size_steps:
      program.pending.update_sizes = measure_update(program)
    batch = program.batch(step + 1)  # prepared while the device runs this step
    if program.due(train_cfg.eval_every, step):
      program.pending.eval_losses = evaluate(program)
    preempted_by = stop["signal"] or (
        "preemption notice" if jax.process_count() > 1
        and program.mngr.reached_preemption(step) else None)
    if program.due(train_cfg.checkpoint_every, step) or preempted_by:
      save_checkpoint(program, step, progress)
    if preempted_by and program.halted_line is None:
      return step, preempted_by
  return step, None


_update_size = jax.jit(steps_lib.update_size)


def measure_update(program: Program):
  """Each run's update size of the step just dispatched (normstudy.steps.update_size) on the
  first eval batch, the same rows and masks for every run; device arrays [K]."""
  after = program.steps.outputs(program.steps.params(program.state), program.eval_batches[0])
  sizes = _update_size(program.outputs, after)
  last = program.pending.step >= program.config.train.update_size_steps
  program.outputs = None if last else after  # the last measured step lets the logits go
  return sizes


def evaluate(program: Program):
  """Each run's mean loss per predicted token over its fixed validation batches."""
  totals = jax.device_get([program.steps.eval(program.steps.params(program.state), b)
                           for b in program.eval_batches])
  loss_sum = sum(t["loss_sum"] for t in totals)
  count = sum(t["count"] for t in totals)
  return loss_sum / np.maximum(count, 1.0)


def _resolve(program: Program):
  """Fetches the pending step's metrics (and update sizes, in the same transfer); locates the
  failure of runs whose step was non-finite (the state still holds their parameters before that
  step). Returns (values, {run index: life.Site})."""
  pending = program.pending
  values, pending.update_sizes = jax.device_get((pending.metrics, pending.update_sizes))
  failed = np.asarray(values["skipped"]) & np.asarray(values["active"])
  sites = {}
  if failed.any():
    flags = jax.device_get(program.steps.locate(program.state, pending.batch))
    for k in np.flatnonzero(failed):
      sites[k] = telemetry.first_nonfinite(jax.tree.map(lambda x, k=k: x[k], flags))
  return values, sites


def _all_stop_with(program: Program, values) -> bool:
  """Whether no run is left running after the pending step."""
  stopping = values["active"] & (values["status"] != life.CODE_RUNNING)
  return len(program.stopped) + int(np.sum(stopping)) == len(program.runs)


def _record_of(program: Program, values, sites, k) -> dict:
  """Run k's record of the pending step."""
  pending = program.pending
  record = {"step": pending.step, **{key: values[key][k] for key in RECORD_KEYS}}
  record.update({key: values[key][k] for key in values
                 if key not in RECORD_KEYS + CONTROL_KEYS})
  if pending.eval_losses is not None:
    record["eval_loss"] = pending.eval_losses[k]
  if pending.update_sizes is not None:
    record["update_size"] = float(pending.update_sizes[k])
  if values.get("telemetry") is not None:
    record.update(telemetry.flatten(jax.tree.map(lambda x: x[k], values["telemetry"])))
    if program.config.model.dtype == "float16":
      record["fp16_overflows"] = values["skipped_total"][k]
  if k in sites:
    record["nonfinite_at"] = sites[k].sentence()
  return record


def record_step(program: Program, values, sites, checkpointed: bool = False, progress=None):
  """Writes the pending step's records and advances the lives of the runs that stopped with
  it. `checkpointed`: the step is being checkpointed, so it is recorded whatever else."""
  step = program.pending.step
  log_due = program.due(program.config.train.log_every, step)
  losses = {}
  for k, recorder in enumerate(program.recorders):
    if not values["active"][k]:
      continue
    code = int(values["status"][k])
    record = _record_of(program, values, sites, k)
    if worth_recording(record, code, log_due=log_due, checkpointed=checkpointed,
                       has_telemetry=values.get("telemetry") is not None):
      record["tokens_per_sec"] = recorder.tokens_per_sec(step, program.tokens_per_step)
      recorder.write(record)
    losses[recorder.run.name] = float(record["loss"])
    if code != life.CODE_RUNNING:
      _stopped(program, k, code, record, sites.get(k, life.BACKWARD_ONLY))
  program.pending = None
  if progress is not None:
    progress.report(step, losses, program.stopped)


def _stopped(program: Program, k: int, code: int, record: dict, site: life.Site):
  """Run k finished or halted with the step of `record`."""
  recorder = program.recorders[k]
  status = life.status_of(code)
  program.stopped[k] = status
  if status == life.FINISHED:
    recorder.set_status(status, last_step=record["step"])
    return
  reason, sentence = life.halt_description(recorder.run.config, code, record)
  recorder.set_status(status, last_step=record["step"], halt_step=record["step"],
                      halt_reason=reason, nonfinite_at=site.sentence(),
                      nonfinite_site=site.as_json())
  sentence += f"; first non-finite: {site.sentence()}"
  logging.warning("%s halted: %s", recorder.run.name, sentence)
  if program.single:
    good = (f"the newest checkpoint (step {program.last_saved}) holds the last good state"
            if program.last_saved else "no checkpoint was saved yet")
    program.halted_line = f"{sentence}; {good}"


def save_checkpoint(program: Program, step: int, progress=None) -> None:
  """Records the pending step (always), then checkpoints the stacked state at `step`, unless
  the single run halted: its newest checkpoint stays the last good state."""
  if program.pending is not None:
    record_step(program, *_resolve(program), checkpointed=True, progress=progress)
  if program.halted_line is not None:
    return
  for recorder in program.recorders:
    recorder.flush()
  checkpoints.save(program.mngr, step, program.steps.stacked(program.state))
  program.last_saved = step
