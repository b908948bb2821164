"""The training loop: run configs -> run directories with records, checkpoints and configs.

One program trains K runs whose configs differ only in data fields (learning rate, clip norm,
weight decay, warm-up, Adam's betas and eps, seed: normstudy.steps.RUN_DATA_FIELDS). Their
states are stacked on a leading axis and one vmapped, jitted step advances all of them; each run
keeps its own loss scale, skip counter and life, and a run that finishes or halts is frozen while
the others go on. `normstudy.main` is K = 1; `normstudy.sweep` and `normstudy.study` group their
runs into programs (`group_runs`) and train them one after another.

Each run writes its own directory (normstudy.rundir). Starting again resumes from the newest
checkpoint that restores: each run's records after it are dropped first, so a resumed run's
records equal an uninterrupted run's. SIGTERM/SIGINT finish the current step, checkpoint it and
stop (errors.Preempted).

The loop processes step N-1's metrics after step N is dispatched, as nanodo does; before
dispatching N it only checks whether N-1 was non-finite, since the state after a skipped step
still has the parameters that failed, which `locate` re-runs to say where the failure started.
"""

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from concurrent import futures

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from normstudy import checkpoints
from normstudy import config as config_lib
from normstudy import data as data_lib
from normstudy import labels
from normstudy import metrics as metrics_lib
from normstudy import optimizer as optimizer_lib
from normstudy import rundir
from normstudy import sharding
from normstudy import steps as steps_lib
from normstudy import telemetry
from normstudy import validation
from normstudy.errors import Preempted
from normstudy.errors import RunHalted
from normstudy.errors import UserError

RECORD_KEYS = ("loss", "grad_norm", "clipped", "lr", "loss_scale", "skipped", "skipped_total")


@dataclasses.dataclass
class Run:
  """One run: its name (in logs and sweep.json), its config and its directory; for a run of a
  study or sweep, its arm (variant) and the axis values it sets (recorded in run.json)."""
  name: str
  config: object
  directory: str
  arm: str = ""
  overrides: dict = dataclasses.field(default_factory=dict)


def config_json(config) -> dict:
  return json.loads(config.to_json_best_effort())


def preflight(runs: list, checkpoint_dir: str, allow_config_change: bool = False) -> None:
  """Every check that must pass before anything is created or written (raises UserError).

  A run directory with a checkpointed step holds a run, and a new config must match its
  config.json (fields that may change excepted); one with no checkpoint is not a run yet, and
  any config may take it."""
  sizes = sharding.mesh_shape(runs[0].config.mesh, jax.device_count())
  checkpointed = rundir.checkpointed_steps(checkpoint_dir)
  for run in runs:
    validation.validate(run.config)
    sharding.check_divisible(run.config, sizes, num_runs=len(runs))
    path = run.directory
    rundir.check_writable(path, "--workdir")
    data_dir = run.config.data.data_dir
    if run.config.data.name != "text_files":
      rundir.check_writable(os.path.expanduser(data_dir) if data_dir else data_lib.default_dir(),
                            "config.data.data_dir")
    if not checkpointed or allow_config_change:
      continue
    saved = rundir.RunDir(path).saved_config()
    if not saved:
      raise UserError(
          f"{path} has checkpoints (steps {', '.join(map(str, checkpointed[-2:]))}) but no "
          f"{rundir.CONFIG}, so its config cannot be checked; restore that file, or pass "
          "--allow_config_change to continue it with this config")
    differences = rundir.config_differences(saved, config_json(run.config))
    if differences:
      raise UserError(
          f"{path} holds a run with another config ({'; '.join(differences)}); choose another "
          "--workdir, or pass --allow_config_change to continue this run with the new config")


def due_telemetry(train_cfg, step: int) -> bool:
  every = train_cfg.get("telemetry_every", 0)
  return bool(every) and step % every == 0


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


def halt_description(config, status: int, record: dict) -> tuple[str, str]:
  """(short reason for run.json, the sentence of the halt line) of a halted run's last record."""
  step = record["step"]
  values = f"loss={record['loss']}, grad_norm={record['grad_norm']}"
  if status == steps_lib.HALTED_SCALE:
    min_scale = config.optimizer.loss_scale.min_scale
    return (f"loss scale at its minimum ({min_scale:g})",
            f"fp16 gradients overflowed again at step {step} with the loss scale at its minimum "
            f"({min_scale:g}, config.optimizer.loss_scale.min_scale)")
  if status == steps_lib.HALTED_SKIPS:
    limit = config.train.max_consecutive_skips
    return (f"{limit + 1} consecutive skipped updates",
            f"non-finite gradient at step {step} ({values}): {limit + 1} consecutive skipped "
            f"updates, more than config.train.max_consecutive_skips={limit}")
  return ("non-finite gradient",
          f"non-finite gradient at step {step} ({values}); config.train.on_nonfinite=halt")


class Recorder:
  """One run's side effects: its records (metrics.jsonl), TensorBoard scalars and run.json.
  Processes other than 0 keep none of them.

  TensorBoard scalars (config.train.tensorboard) are written by clu's SummaryWriter on the
  writer thread (`writer_pool`), created there on first use: it imports TensorFlow (~4 s of CPU),
  which then overlaps with compilation instead of delaying the start."""

  def __init__(self, run: Run, resume_step, info: dict, writer_pool, is_writer: bool,
               stopped: bool = False):
    self.run = run
    self.dir = rundir.RunDir(run.directory)
    self.is_writer = is_writer
    self.status = self.dir.status() if stopped else "running"
    self.last_record = None
    self.timer = (resume_step or 0, time.perf_counter())  # (step, time) of the last record
    self._pool = writer_pool
    self._writer = None  # touched only on the writer thread
    self._tensorboard = bool(run.config.train.tensorboard)
    if is_writer:
      self.dir.write_config(config_json(run.config))
      self.dir.update_info(**info, status=self.status)
      self.log = metrics_lib.MetricsLog(run.directory, resume_step)
      self._pool.submit(self._open_writer, resume_step or 0)
    else:
      self.log = metrics_lib.NullLog()

  def _open_writer(self, resume_step):
    # Steps after the resumed one are recomputed: drop them from earlier sessions' event files,
    # so TensorBoard shows one value per step.
    rundir.purge_events_after(self.run.directory, resume_step)
    if self._tensorboard:
      from clu import metric_writers  # imports TensorFlow
      self._writer = metric_writers.SummaryWriter(self.run.directory)

  def _scalars(self, step, scalars):
    self._writer.write_scalars(step, scalars)

  def write(self, record: dict) -> None:
    self.last_record = {k: metrics_lib.plain(v) for k, v in record.items()}
    if not self.is_writer:
      return
    self.log.write(self.last_record)
    if not self._tensorboard:
      return
    scalars = {k: float(v) for k, v in self.last_record.items()
               if k != "step" and isinstance(v, (int, float))}
    self._pool.submit(self._scalars, record["step"], scalars)

  def set_status(self, status: str, **fields) -> None:
    self.status = status
    if self.is_writer:
      self.dir.update_info(status=status, **fields)

  def flush(self) -> None:
    self.log.flush()

  def _close_writer(self):
    if self._writer is not None:
      self._writer.flush()
      self._writer.close()

  def close(self) -> None:
    self.log.close()
    if self.is_writer:
      self._pool.submit(self._close_writer).result()


class _Progress:
  """One log line per interval for the whole program: step, rate and ETA (over the last
  interval, so compilation does not distort them), runs alive and halted, best and worst loss."""

  def __init__(self, runs, start_step, num_steps):
    self.names = [run.name for run in runs]
    self.num_steps = num_steps
    self.every = max(1, num_steps // 20)
    self.last = (start_step, time.perf_counter())

  def report(self, step, losses: dict, stopped: dict):
    if step % self.every and step != self.num_steps:
      return
    now = time.perf_counter()
    rate = (step - self.last[0]) / max(now - self.last[1], 1e-9)
    self.last = (step, now)
    eta = (self.num_steps - step) / rate if rate > 0 else 0.0
    halted = sum(1 for s in stopped.values() if s == "halted")
    parts = [f"step {step}/{self.num_steps}", f"{rate:.2f} steps/s", f"ETA {eta:.0f}s"]
    if len(self.names) > 1:
      parts.append(f"runs alive {len(self.names) - len(stopped)}/{len(self.names)}, "
                   f"halted {halted}")
    finite = {n: v for n, v in losses.items() if np.isfinite(v)}
    if len(finite) == 1:
      parts.append(f"loss {next(iter(finite.values())):.4f}")
    elif finite:
      best, worst = min(finite, key=finite.get), max(finite, key=finite.get)
      parts.append(f"loss best {finite[best]:.4f} ({best}), worst {finite[worst]:.4f} ({worst})")
    logging.info("%s", " | ".join(parts))


def _stack(batches: list) -> dict:
  return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


def _from_configs(state, configs, mesh):
  """The restored state with the (possibly changed) configs' per-run data: hyperparameters
  (except the schedule's horizon, which stays the one the run started with, so the rate never
  jumps), limits and loss-scale settings (not the scale itself). A run restored as finished
  whose config now asks for more steps runs again (an extension)."""
  horizons = np.asarray(jax.device_get(state.hparams["schedule_steps"]))
  values = jax.device_put(sharding.stacked_values(configs, horizons),
                          sharding.runs_sharding(mesh))
  ls = values["loss_scale"]
  state = state.replace(
      hparams=values["hparams"], limits=values["limits"],
      loss_scale=state.loss_scale.replace(growth_interval=ls["growth_interval"],
                                          min_scale=ls["min_scale"]))
  limits = state.limits
  counted = jnp.where(limits["count_skipped_steps"], state.step, state.opt_step)
  more = jnp.logical_and(state.status == steps_lib.FINISHED, counted < limits["num_steps"])
  return state.replace(status=jnp.where(more, steps_lib.RUNNING, state.status))


class Program:
  """K runs that share one compiled program, and the loop that trains them: their stacked state
  (restored from the newest checkpoint that restores), the compiled steps, the checkpoint manager,
  one Recorder per run, and the pending step, whose metrics are processed after its successor is
  dispatched. `single`: the one run of normstudy.main, which stops with RunHalted when the run
  halts (its newest checkpoint then holds the last good state); otherwise the others go on, and
  the frozen run is saved with them."""

  def __init__(self, runs: list, checkpoint_dir: str, single: bool = False):
    self.runs, self.checkpoint_dir, self.single = runs, checkpoint_dir, single
    configs = [run.config for run in runs]
    self.config = config = configs[0]
    self.train_cfg = config.train
    self.float16 = config.model.dtype == "float16"
    try:
      splits = data_lib.load_splits(config)
    except ValueError as e:  # no files match, a tokenizer that does not fit: the user's to fix
      raise UserError(str(e)) from None
    self.train_data = [data_lib.train_batches(c, splits) for c in configs]
    eval_data = _stack([_stack(data_lib.eval_batches(c, splits)) for c in configs])

    for run in runs:
      rundir.ensure_directory(run.directory)
    self.mesh = mesh = sharding.make_mesh(config.mesh)
    self.state, self.shardings = sharding.create_states(configs, mesh)
    self.mngr = checkpoints.manager(checkpoint_dir, self.train_cfg.max_to_keep)
    try:
      start_step, restored = checkpoints.restore_latest(self.mngr,
                                                        checkpoints.abstract(self.state))
    except checkpoints.CheckpointError:
      self.mngr.close()  # orbax's background threads must stop before the process exits
      raise
    if restored is not None:
      replay = self._replay_from(restored)
      if replay is not None:  # records were lost: recompute them from an earlier state
        checkpoints.discard_after(self.mngr, replay)
        start_step = replay or None
        restored = (checkpoints.restore(self.mngr, replay, checkpoints.abstract(self.state))
                    if replay else None)
    if restored is not None:
      self.state = _from_configs(restored, configs, mesh)
      logging.info("resumed %s from the checkpoint at step %d", checkpoint_dir, start_step)
    self.start_step = start_step or 0
    self.last_saved = start_step or None
    self.stopped = {}  # run index -> "finished" | "halted"
    for k, status in enumerate(np.asarray(jax.device_get(self.state.status))):
      if status != steps_lib.RUNNING:  # stopped before the checkpoint we resumed from
        self.stopped[k] = "finished" if status == steps_lib.FINISHED else "halted"

    self.tokens_per_step = self.train_cfg.batch_size * config.model.max_len
    self.num_params = sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(self.state.params))
    is_writer = jax.process_index() == 0
    self.pool = futures.ThreadPoolExecutor(max_workers=1) if is_writer else None
    horizons = np.asarray(jax.device_get(self.state.hparams["schedule_steps"]))
    self.recorders = []
    for k, run in enumerate(runs):
      info = {"label": labels.resolve(run.config), "name": run.name, "arm": run.arm or run.name,
              "overrides": run.overrides, "dataset": splits.source,
              "entropy_floor": splits.entropy_floor, "num_params": self.num_params,
              "tokens_per_step": self.tokens_per_step, "schedule_steps": int(horizons[k])}
      self.recorders.append(Recorder(run, start_step if restored is not None else None, info,
                                     self.pool, is_writer, stopped=k in self.stopped))
      if horizons[k] < run.config.train.num_steps:
        self._warn_extension(k, run, int(horizons[k]))

    k = len(runs)
    self.train_step = sharding.jit_train_step(config, mesh, self.shardings, num_runs=k)
    # A second compiled step for telemetry steps, so the others pay nothing for it.
    self.telemetry_step = sharding.jit_train_step(config, mesh, self.shardings,
                                                  telemetry_on=True, num_runs=k)
    self.eval_step = sharding.jit_eval_step(config, mesh, self.shardings, num_runs=k)
    self.locate_step = None  # compiled on the first non-finite step
    self.eval_batches = [sharding.global_batch(mesh, jax.tree.map(lambda x: x[:, i], eval_data))
                         for i in range(self.train_cfg.eval_steps)]
    self.num_steps = max(c.train.num_steps for c in configs)  # runs of a program may differ
    self.last_steps = {c.train.num_steps for c in configs}
    self.progress = _Progress(runs, self.start_step, self.num_steps)
    self.pending = None  # {"step", "metrics" (device), "batch", "eval"}: the newest step
    self.halted_line = None  # set when the single run halts

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
                      "at step %d); replaying from %s to regenerate them", name, rundir.METRICS,
                      step, int(run_steps.max()),
                      f"the checkpoint of step {replay}" if replay else "the start")
    return replay

  def train(self) -> list:
    """The loop; returns the Recorders (status, last record) in the order of the runs."""
    cfg = self.train_cfg
    logging.info("training %d run(s) in one program: steps %d..%d, %d parameters each, "
                 "%d tokens/step, mesh %s", len(self.runs), self.start_step + 1, self.num_steps,
                 self.num_params, self.tokens_per_step, dict(self.mesh.shape))
    step = self.start_step
    try:
      with stop_signals() as stop:
        batch = self._batch(step + 1)
        while len(self.stopped) < len(self.runs):
          values = None
          if self.pending is not None:  # the step before: was it finite, did its runs stop?
            values, sites = self._resolve()
            if self._ends_with(values):
              self._write(values, sites)
              break
          step += 1
          step_fn = self.telemetry_step if due_telemetry(cfg, step) else self.train_step
          self.state, device_metrics = step_fn(self.state, batch)
          if values is not None:
            self._write(values, sites)
          self.pending = {"step": step, "metrics": device_metrics, "batch": batch}
          batch = self._batch(step + 1)  # prepared while the device runs this step
          if self._due(cfg.eval_every, step):
            self.pending["eval"] = self._evaluate()
          preempted = stop["signal"] or (jax.process_count() > 1
                                         and self.mngr.reached_preemption(step))
          if self._due(cfg.checkpoint_every, step) or preempted:
            self._save(step)
          if preempted:
            for k, recorder in enumerate(self.recorders):
              if k not in self.stopped:
                recorder.set_status("preempted", last_step=step)
            raise Preempted(f"{stop['signal'] or 'preemption notice'} at step {step}: "
                            f"checkpoint saved in {self.checkpoint_dir}; run the same command "
                            "to continue")
        if self.halted_line is not None:
          raise RunHalted(self.halted_line)
        if step > self.start_step and self.last_saved != step:
          self._save(step)
    finally:
      self.close()
    return self.recorders

  def close(self):
    self.mngr.wait_until_finished()
    self.mngr.close()
    for recorder in self.recorders:
      recorder.close()
    if self.pool is not None:
      self.pool.shutdown()

  def _warn_extension(self, k, run, horizon):
    hp = {name: float(values[k]) for name, values in jax.device_get(self.state.hparams).items()}
    final = float(optimizer_lib.learning_rate(run.config.optimizer.schedule, hp, horizon))
    logging.warning("%s: extended to %d steps; the learning-rate schedule keeps the horizon of "
                    "%d steps it started with, so the steps after it run at its final rate %g",
                    run.name, run.config.train.num_steps, horizon, final)

  def _batch(self, step):
    return sharding.global_batch(self.mesh, _stack([ds[step - 1] for ds in self.train_data]))

  def _due(self, every, step):
    return (every and step % every == 0) or step in self.last_steps

  def _evaluate(self):
    """Each run's mean loss per predicted token over its fixed validation batches."""
    totals = jax.device_get([self.eval_step(self.state.params, b) for b in self.eval_batches])
    loss_sum = sum(t["loss_sum"] for t in totals)
    count = sum(t["count"] for t in totals)
    return loss_sum / np.maximum(count, 1.0)

  def _resolve(self):
    """Fetches the pending step's metrics; locates the failure of runs whose step was
    non-finite (the state still holds their parameters before that step)."""
    values = jax.device_get(self.pending["metrics"])
    failed = np.asarray(values["skipped"]) & np.asarray(values["active"])
    sites = {}
    if failed.any():
      if self.locate_step is None:
        self.locate_step = sharding.jit_locate_step(self.config, self.mesh, self.shardings,
                                                    num_runs=len(self.runs))
      flags = jax.device_get(self.locate_step(self.state, self.pending["batch"]))
      for k in np.flatnonzero(failed):
        sites[k] = telemetry.first_nonfinite(jax.tree.map(lambda x, k=k: x[k], flags))
    return values, sites

  def _ends_with(self, values) -> bool:
    """Whether no run is left running after the pending step."""
    stopping = values["active"] & (values["status"] != steps_lib.RUNNING)
    return len(self.stopped) + int(np.sum(stopping)) == len(self.runs)

  def _write(self, values, sites, force: bool = False):
    """Writes the pending step's records and marks the runs that stopped with it. `force`: a
    checkpointed step, always recorded (so a resume can tell whether records were lost)."""
    step = self.pending["step"]
    tel = values.get("telemetry")
    losses = {}
    for k, recorder in enumerate(self.recorders):
      if not values["active"][k]:
        continue
      status = int(values["status"][k])
      record = {"step": step, **{key: values[key][k] for key in RECORD_KEYS}}
      record.update({key: values[key][k] for key in values
                     if key not in RECORD_KEYS + ("active", "status", "telemetry")})
      if self.pending.get("eval") is not None:
        record["eval_loss"] = self.pending["eval"][k]
      if tel is not None:
        record.update(telemetry.flatten(jax.tree.map(lambda x, k=k: x[k], tel)))
        if self.float16:
          record["fp16_overflows"] = values["skipped_total"][k]
      if k in sites:
        record["nonfinite_at"] = sites[k]
      if (force or self._due(self.train_cfg.log_every, step) or step == 1
          or "eval_loss" in record or record["skipped"] or tel is not None
          or status != steps_lib.RUNNING):
        last_step, last_time = recorder.timer
        now = time.perf_counter()
        record["tokens_per_sec"] = (step - last_step) * self.tokens_per_step / max(
            now - last_time, 1e-9)
        recorder.timer = (step, now)
        recorder.write(record)
      losses[recorder.run.name] = float(record["loss"])
      if status == steps_lib.FINISHED:
        self.stopped[k] = "finished"
        recorder.set_status("finished", last_step=step)
      elif status != steps_lib.RUNNING:
        self.stopped[k] = "halted"
        self._halted(k, recorder, status, record, sites.get(k, telemetry.BACKWARD_ONLY))
    self.pending = None
    self.progress.report(step, losses, self.stopped)

  def _halted(self, k, recorder, status, record, where):
    reason, sentence = halt_description(recorder.run.config, status, record)
    recorder.set_status("halted", last_step=record["step"], halt_step=record["step"],
                        halt_reason=reason, nonfinite_at=where)
    sentence += f"; first non-finite: {where}"
    logging.warning("%s halted: %s", recorder.run.name, sentence)
    if self.single:
      good = (f"the newest checkpoint (step {self.last_saved}) holds the last good state"
              if self.last_saved else "no checkpoint was saved yet")
      self.halted_line = f"{sentence}; {good}"

  def _save(self, step):
    if self.pending is not None:
      self._write(*self._resolve(), force=True)
    if self.halted_line is not None:  # a halted single run keeps its last good checkpoint
      raise RunHalted(self.halted_line)
    for recorder in self.recorders:
      recorder.flush()
    checkpoints.save(self.mngr, step, self.state)
    self.last_saved = step


def train_runs(runs: list, checkpoint_dir: str, single: bool = False) -> list:
  """Trains runs that share a program (normstudy.train.Program); returns their Recorders."""
  return Program(runs, checkpoint_dir, single).train()


def lock(directory: str):
  """The directory's lock for this program's life; only process 0 of a multi-process run takes
  it (all processes share the directory)."""
  return rundir.Lock(directory) if jax.process_index() == 0 else contextlib.nullcontext()


def train_and_evaluate(config, workdir: str, allow_config_change: bool = False) -> dict:
  """Trains one run in `workdir` (resuming if it holds a checkpoint); returns its last record.
  Raises RunHalted when the run halts."""
  run = Run(os.path.basename(os.path.normpath(workdir)) or workdir, config, workdir)
  preflight([run], rundir.RunDir(workdir).checkpoints, allow_config_change)
  rundir.ensure_directory(workdir)
  with lock(workdir):
    recorder, = train_runs([run], rundir.RunDir(workdir).checkpoints, single=True)
  return recorder.last_record


def program_key(config) -> str:
  """What must be equal for runs to share one compiled program: the config without its per-run
  data fields (normstudy.steps.RUN_DATA_FIELDS) and label."""
  flat = rundir.flatten(config_json(config))
  for field in steps_lib.RUN_DATA_FIELDS + ("label",):
    flat.pop(field, None)
  return json.dumps(flat, sort_keys=True, default=str)


# Runs per program beyond which a sweep is split into several programs of the same structure;
# 0 = no limit. On XLA:CPU a run-step costs about the same whatever K (the seed figure's size:
# 52, 59 and 59 ms at K = 2, 18, 36; benchmarks/sweep.py --program_sizes), so by default one
# program takes every run of a structure; a limit bounds a program's memory.
MAX_RUNS_PER_PROGRAM = 0


def group_runs(runs: list, max_runs: int = MAX_RUNS_PER_PROGRAM) -> list:
  """The runs split into programs (lists of runs), in order of first appearance: runs that
  differ only in data fields share one, split into equal parts of at most `max_runs` runs
  (0 = no limit)."""
  groups = {}
  for run in runs:
    groups.setdefault(program_key(run.config), []).append(run)
  programs = []
  for group in groups.values():
    parts = -(-len(group) // max_runs) if max_runs > 0 else 1
    size = -(-len(group) // parts)
    programs += [group[i:i + size] for i in range(0, len(group), size)]
  return programs


def group_name(group: list) -> str:
  """A stable directory name for a program's stacked checkpoints."""
  import hashlib
  names = "\n".join(run.name for run in group)
  digest = hashlib.sha1(names.encode()).hexdigest()[:8]
  first = group[0].name.replace("/", "_")
  return f"{first}+{len(group) - 1}_{digest}" if len(group) > 1 else f"{first}_{digest}"


def program_checkpoints(root: str, group: list) -> str:
  """Where a program of a study or sweep in `root` keeps its stacked checkpoints."""
  return os.path.join(root, rundir.CHECKPOINTS, group_name(group))


def needs_training(run: Run) -> bool:
  """False for a run recorded as halted, or finished at its config's num_steps."""
  info = rundir.RunDir(run.directory).info()
  if info.get("status") == "halted":
    return False
  return not (info.get("status") == "finished"
              and info.get("last_step") == run.config.train.num_steps)


def train_programs(runs: list, root: str, allow_config_change: bool = False,
                   max_runs: int = MAX_RUNS_PER_PROGRAM) -> dict:
  """Trains every run (grouped into programs, one program after another) with stacked
  checkpoints under `root/checkpoints/<program>/`; returns {run name: status}. A run that halts
  is a result: the others go on. Runs recorded as finished or halted are not trained again."""
  groups = group_runs(runs, max_runs)
  for group in groups:  # every run checked before any starts
    preflight(group, program_checkpoints(root, group), allow_config_change)
  for i, group in enumerate(groups, start=1):
    names = ", ".join(run.name for run in group)
    if not any(needs_training(run) for run in group):
      logging.info("[program %d/%d] %s: finished earlier, skipped", i, len(groups), names)
      continue
    logging.info("[program %d/%d] %d run(s): %s", i, len(groups), len(group), names)
    with contextlib.ExitStack() as locks:
      for run in group:
        rundir.ensure_directory(run.directory)
        locks.enter_context(lock(run.directory))
      train_runs(group, program_checkpoints(root, group))
  return {run.name: rundir.RunDir(run.directory).status() for run in runs}
