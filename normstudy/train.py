"""The training loop: config -> a run directory with metrics, checkpoints and the resolved config.

  <workdir>/config.json            the resolved config
  <workdir>/run.json               label, dataset, entropy floor, parameter count
  <workdir>/metrics.jsonl          one record per logged step (normstudy.metrics)
  <workdir>/events.out.tfevents.*  the same scalars for TensorBoard (clu metric writers)
  <workdir>/checkpoints/<step>/    orbax: train state + data-iterator position

Starting again in the same workdir resumes from the newest checkpoint that restores; records
after it are dropped first, so `metrics.jsonl` never holds a step twice and a resumed run's
records equal an uninterrupted run's. SIGTERM/SIGINT finish the current step, checkpoint it and
stop (normstudy.errors.Preempted); a non-finite step halts or is skipped as
`config.train.on_nonfinite` says (normstudy.errors.RunHalted).
"""

import contextlib
import json
import os
import signal
import threading
import time

from absl import logging
from clu import metric_writers
from clu import periodic_actions
import jax
import numpy as np

from normstudy import checkpoints
from normstudy import config as config_lib
from normstudy import data as data_lib
from normstudy import metrics as metrics_lib
from normstudy import sharding
from normstudy import steps as steps_lib
from normstudy.errors import Preempted
from normstudy.errors import RunHalted
from normstudy.errors import UserError

RECORD_KEYS = ("loss", "grad_norm", "clipped", "lr", "loss_scale", "skipped", "skipped_total")

# Fields a continued run may change: they do not alter the trajectory already recorded (the mesh
# included: a checkpoint restores onto any layout, and results do not depend on it).
CHANGEABLE_FIELDS = (
    "label", "data.data_dir", "mesh.data", "mesh.fsdp", "mesh.tensor",
    "train.num_steps", "train.log_every", "train.eval_every",
    "train.checkpoint_every", "train.max_to_keep", "train.on_nonfinite",
    "train.max_consecutive_skips", "train.telemetry_every",
)


def _write_json(path, obj):
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def _flatten(tree, prefix=""):
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def config_differences(old: dict, new: dict) -> list[str]:
  """'field: old -> new' for every field that differs and may not change between sessions."""
  old_flat, new_flat = _flatten(old), _flatten(new)
  return [f"{k}: {old_flat.get(k, '<absent>')!r} -> {new_flat.get(k, '<absent>')!r}"
          for k in sorted(set(old_flat) | set(new_flat))
          if old_flat.get(k) != new_flat.get(k) and k not in CHANGEABLE_FIELDS]


def preflight(config, workdir: str, allow_config_change: bool = False) -> None:
  """Every check that must pass before anything is created or written (raises UserError)."""
  mesh_sizes = dict(zip(sharding.AXES, sharding.mesh_shape(config.mesh, jax.device_count())))
  config_lib.validate(config, data_parallel=mesh_sizes["data"] * mesh_sizes["fsdp"])
  sharding.check_divisible(config, mesh_sizes)
  saved_path = os.path.join(workdir, "config.json")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f"--workdir={workdir!r} exists and is not a directory")
  if os.path.exists(saved_path) and not allow_config_change:
    with open(saved_path, encoding="utf-8") as f:
      saved = json.load(f)
    differences = config_differences(saved, json.loads(config.to_json_best_effort()))
    if differences:
      raise UserError(
          f"{workdir} holds a run with another config ({'; '.join(differences)}); choose another "
          "--workdir, or pass --allow_config_change to continue this run with the new config")


def due_telemetry(train_cfg, step: int) -> bool:
  every = train_cfg.get("telemetry_every", 0)
  return bool(every) and step % every == 0


def telemetry_record(telemetry: dict, values: dict, float16: bool) -> dict:
  """Per-layer arrays -> `<metric>/layer_<i>` keys; globals as they are."""
  record = {}
  for name in steps_lib.TELEMETRY_LAYER_METRICS:
    for i, value in enumerate(telemetry[name]):
      record[f"{name}/layer_{i}"] = value
  record["output_logit_max"] = telemetry["output_logit_max"]
  record["log_z_mean"] = telemetry["log_z_mean"]
  if float16:
    record["fp16_overflows"] = values["skipped_total"]
  return record


def evaluate(eval_step, params, eval_batches) -> float:
  """Mean loss per predicted token over the fixed validation batches."""
  totals = [eval_step(params, batch) for batch in eval_batches]
  loss_sum = sum(float(t["loss_sum"]) for t in totals)
  count = sum(float(t["count"]) for t in totals)
  return loss_sum / max(count, 1.0)


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
  names = ["SIGINT", "SIGTERM"]
  previous = {}

  def handler(signum, frame):
    del frame
    if received["signal"] is None:
      received["signal"] = signal.Signals(signum).name
      logging.warning("%s received: finishing the current step, then checkpointing",
                      received["signal"])

  for name in names:
    previous[name] = signal.signal(getattr(signal, name), handler)
  try:
    yield received
  finally:
    for name, old in previous.items():
      signal.signal(getattr(signal, name), old)


class _Halting:
  """Decides, step by step, whether a non-finite step stops the run."""

  def __init__(self, config):
    self.float16 = config.model.dtype == "float16"
    self.policy = config.train.on_nonfinite
    self.max_skips = config.train.max_consecutive_skips
    self.min_scale = config.optimizer.loss_scale.min_scale
    self.consecutive = 0

  def check(self, step: int, values: dict, last_good: int | None) -> None:
    good = (f"the newest checkpoint (step {last_good}) holds the last good state"
            if last_good else "no checkpoint was saved yet")
    if self.float16:
      if values["scale_underflow"]:
        raise RunHalted(
            f"fp16 gradients overflowed again at step {step} with the loss scale at its minimum "
            f"({self.min_scale:g}, config.optimizer.loss_scale.min_scale); {good}")
      return
    if not values["skipped"]:
      self.consecutive = 0
      return
    self.consecutive += 1
    what = f"non-finite gradient at step {step} (loss={values['loss']}, " \
           f"grad_norm={values['grad_norm']})"
    if self.policy == "halt":
      raise RunHalted(f"{what}; config.train.on_nonfinite=halt; {good}")
    if self.consecutive > self.max_skips:
      raise RunHalted(f"{what}: {self.consecutive} consecutive skipped updates, more than "
                      f"config.train.max_consecutive_skips={self.max_skips}; {good}")


def train_and_evaluate(config, workdir: str, allow_config_change: bool = False) -> dict:
  """Trains `config` in `workdir` (resuming if it holds a checkpoint); returns the last record."""
  preflight(config, workdir, allow_config_change)
  is_writer = jax.process_index() == 0
  train_cfg = config.train

  try:
    splits = data_lib.load_splits(config)
  except ValueError as e:  # no files match, a tokenizer that does not fit: the user's to fix
    raise UserError(str(e)) from None
  train_iter = data_lib.train_iterator(config, splits)
  eval_batches = data_lib.eval_batches(config, splits)

  os.makedirs(workdir, exist_ok=True)
  mesh = sharding.make_mesh(config.mesh)
  state, shardings = sharding.create_state(config, mesh)
  mngr = checkpoints.manager(workdir, train_cfg.max_to_keep)
  try:
    start_step, restored = checkpoints.restore_latest(
        mngr, checkpoints.abstract(state), train_iter)
  except checkpoints.CheckpointError:
    mngr.close()  # orbax's background threads must stop before the process exits
    raise
  if restored is not None:
    state = restored
    logging.info("resumed %s from the checkpoint at step %d", workdir, start_step)
  start_step = start_step or 0
  last_saved = start_step or None

  tokens_per_step = train_cfg.batch_size * config.model.max_len
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  if is_writer:
    _write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))
    _write_json(os.path.join(workdir, "run.json"), {
        "label": config.label or os.path.basename(os.path.normpath(workdir)),
        "dataset": splits.source,
        "entropy_floor": splits.entropy_floor,
        "num_params": num_params,
        "tokens_per_step": tokens_per_step,
    })
    log = metrics_lib.MetricsLog(workdir, start_step if restored is not None else None)
    writer = metric_writers.AsyncWriter(metric_writers.SummaryWriter(workdir))
  else:  # only process 0 writes records; the others still report progress to their logs
    log, writer = metrics_lib.NullLog(), metric_writers.MultiWriter([])
  report = periodic_actions.ReportProgress(
      num_train_steps=train_cfg.num_steps, writer=writer,
      every_steps=max(1, train_cfg.num_steps // 10), every_secs=None)
  halting = _Halting(config)

  train_step = sharding.jit_train_step(config, mesh, shardings)
  # A second compiled step for telemetry steps, so the others pay nothing for it.
  telemetry_step = sharding.jit_train_step(config, mesh, shardings, telemetry=True)
  float16 = config.model.dtype == "float16"
  eval_step = sharding.jit_eval_step(config, mesh, shardings)
  eval_batches = [sharding.global_batch(mesh, b) for b in eval_batches]

  def due(every, step):
    return (every and step % every == 0) or step == train_cfg.num_steps

  last_record = None
  pending = None  # (step, device metrics, extra fields) of the step whose successor is in flight
  timer = (start_step, time.perf_counter())

  def write_pending():
    """Fetches the pending step's metrics (its successor is already dispatched), logs them, and
    stops the run if the step calls for it."""
    nonlocal pending, timer, last_record
    if pending is None:
      return
    step, device_metrics, extra = pending
    pending = None
    values = jax.device_get(device_metrics)
    telemetry = values.get("telemetry")
    if due(train_cfg.log_every, step) or step == 1 or extra or values["skipped"] or telemetry:
      now = time.perf_counter()
      record = {"step": step, **{k: values[k] for k in RECORD_KEYS}}
      record["tokens_per_sec"] = (step - timer[0]) * tokens_per_step / max(now - timer[1], 1e-9)
      timer = (step, now)
      record.update(extra)
      if telemetry:
        record.update(telemetry_record(telemetry, values, float16))
      last_record = {k: metrics_lib.plain(v) for k, v in record.items()}
      if is_writer:
        log.write(record)
        writer.write_scalars(step, {k: float(v) for k, v in record.items() if k != "step"})
    halting.check(step, values, last_saved)

  def save(step):
    nonlocal last_saved
    write_pending()
    log.flush()
    checkpoints.save(mngr, step, state, train_iter)
    last_saved = step

  logging.info("training %s: steps %d..%d, %d parameters, %d tokens/step, mesh %s",
               workdir, start_step + 1, train_cfg.num_steps, num_params, tokens_per_step,
               dict(mesh.shape))
  try:
    with stop_signals() as stop:
      for step in range(start_step + 1, train_cfg.num_steps + 1):
        step_fn = telemetry_step if due_telemetry(train_cfg, step) else train_step
        state, device_metrics = step_fn(state, sharding.global_batch(mesh, next(train_iter)))
        write_pending()
        pending = (step, device_metrics, {})
        report(step)
        if due(train_cfg.eval_every, step):
          pending[2]["eval_loss"] = evaluate(eval_step, state.params, eval_batches)
          write_pending()
          logging.info("step %d: loss %.4f, eval_loss %.4f, loss_scale %g, skipped %d", step,
                       last_record["loss"], last_record["eval_loss"],
                       last_record["loss_scale"], last_record["skipped_total"])
        preempted = stop["signal"] or (
            jax.process_count() > 1 and mngr.reached_preemption(step))
        if due(train_cfg.checkpoint_every, step) or preempted:
          save(step)
        if preempted:
          raise Preempted(f"{stop['signal'] or 'preemption notice'} at step {step}: checkpoint "
                          f"saved in {workdir}; run the same command to continue")
      write_pending()
  finally:
    mngr.wait_until_finished()
    mngr.close()
    log.close()
    writer.flush()
    writer.close()
  return last_record
