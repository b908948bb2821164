"""The training loop: config -> a run directory with metrics, checkpoints and the resolved config.

  <workdir>/config.json            the resolved config
  <workdir>/run.json               label, dataset, entropy floor, parameter count
  <workdir>/metrics.jsonl          one record per logged step (normstudy.metrics)
  <workdir>/events.out.tfevents.*  the same scalars for TensorBoard (clu metric writers)
  <workdir>/checkpoints/<step>/    orbax: train state + data-iterator position

Starting again in the same workdir resumes from the newest checkpoint; records after it are
dropped first, so `metrics.jsonl` never holds a step twice.
"""

import json
import os
import time

from absl import logging
from clu import metric_writers
from clu import periodic_actions
import jax
import numpy as np

from normstudy import checkpoints
from normstudy import data as data_lib
from normstudy import metrics as metrics_lib
from normstudy import steps as steps_lib

RECORD_KEYS = ("loss", "grad_norm", "clipped", "lr", "loss_scale", "skipped", "skipped_total")


def _write_json(path, obj):
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def evaluate(eval_step, params, eval_batches) -> float:
  """Mean loss per predicted token over the fixed validation batches."""
  totals = [eval_step(params, batch) for batch in eval_batches]
  loss_sum = sum(float(t["loss_sum"]) for t in totals)
  count = sum(float(t["count"]) for t in totals)
  return loss_sum / max(count, 1.0)


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config` in `workdir` (resuming if it holds a checkpoint); returns the last record."""
  is_writer = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  train_cfg = config.train

  splits = data_lib.load_splits(config)
  train_iter = data_lib.train_iterator(config, splits)
  eval_batches = data_lib.eval_batches(config, splits)

  state = steps_lib.create_train_state(config)
  mngr = checkpoints.manager(workdir, train_cfg.max_to_keep)
  start_step, restored = checkpoints.restore_latest(
      mngr, checkpoints.abstract(state), train_iter)
  if restored is not None:
    state = restored
    logging.info("resumed %s from the checkpoint at step %d", workdir, start_step)
  start_step = start_step or 0

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
  report = periodic_actions.ReportProgress(
      num_train_steps=train_cfg.num_steps, writer=writer,
      every_steps=max(1, train_cfg.num_steps // 10), every_secs=None)

  train_step = jax.jit(steps_lib.make_train_step(config), donate_argnums=0)
  eval_step = jax.jit(steps_lib.make_eval_step(config))

  def should(every, step):
    return (every and step % every == 0) or step == train_cfg.num_steps

  last_record = None
  pending = None  # (step, device metrics) of the step before the one in flight
  timer = (start_step, time.perf_counter())

  def write_pending():
    """Fetches the pending step's metrics (its successor is already dispatched) and logs them."""
    nonlocal pending, timer, last_record
    if pending is None:
      return
    step, device_metrics, extra = pending
    pending = None
    values = jax.device_get(device_metrics)
    if not (should(train_cfg.log_every, step) or step == 1 or extra):
      return
    now = time.perf_counter()
    record = {"step": step, **{k: values[k] for k in RECORD_KEYS}}
    record["tokens_per_sec"] = (step - timer[0]) * tokens_per_step / max(now - timer[1], 1e-9)
    timer = (step, now)
    record.update(extra)
    last_record = {k: metrics_lib._plain(v) for k, v in record.items()}
    if is_writer:
      log.write(record)
      writer.write_scalars(step, {k: float(v) for k, v in record.items() if k != "step"})

  logging.info("training %s: steps %d..%d, %d parameters, %d tokens/step",
               workdir, start_step + 1, train_cfg.num_steps, num_params, tokens_per_step)
  for step in range(start_step + 1, train_cfg.num_steps + 1):
    state, device_metrics = train_step(state, next(train_iter))
    write_pending()
    pending = (step, device_metrics, {})
    report(step)
    if should(train_cfg.eval_every, step):
      pending[2]["eval_loss"] = evaluate(eval_step, state.params, eval_batches)
      write_pending()
      logging.info("step %d: loss %.4f, eval_loss %.4f, loss_scale %g, skipped %d", step,
                   last_record["loss"], last_record["eval_loss"], last_record["loss_scale"],
                   last_record["skipped_total"])
    if should(train_cfg.checkpoint_every, step):
      write_pending()
      log.flush()
      checkpoints.save(mngr, step, state, train_iter)
  write_pending()
  mngr.wait_until_finished()
  mngr.close()
  log.close()
  writer.flush()
  writer.close()
  return last_record
