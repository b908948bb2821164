"""Where a run's records go, each sink behind one interface (`Writer`): metrics.jsonl (what the
analysis reads), TensorBoard event files and a Weights & Biases run. The recorder writes each
record to every writer of its run (`MultiWriter`); a new sink is a Writer added in `for_run`,
and no loop code changes.

A writer receives every record the loop keeps (plain Python values, the step included) and
takes what it can show: metrics.jsonl all of it, TensorBoard and W&B the numbers. `flush` makes
what was written durable (called before each checkpoint is saved), `close` ends the run's
session.
"""

import logging as std_logging
import os
import uuid

from absl import logging

from normstudy.records import metrics as metrics_lib
from normstudy.records import rundir
from normstudy.records import schema


class Writer:
  """A sink of a run's records."""

  def write(self, step: int, record: dict) -> None:
    raise NotImplementedError

  def flush(self) -> None:
    """Makes every record so far durable (before a checkpoint is saved)."""

  def close(self) -> None:
    """Flushes and ends the writer's session."""


def scalars(record: dict) -> dict:
  """The record's numbers as floats, without the step: what a dashboard plots."""
  return {k: float(v) for k, v in record.items()
          if k != "step" and isinstance(v, (int, float))}


class MultiWriter(Writer):
  """Every record to each of `writers`, in order."""

  def __init__(self, writers):
    self.writers = list(writers)

  def write(self, step: int, record: dict) -> None:
    for writer in self.writers:
      writer.write(step, record)

  def flush(self) -> None:
    for writer in self.writers:
      writer.flush()

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


class MetricsFile(Writer):
  """metrics.jsonl (normstudy.records.metrics): every record, a line each, strict JSON; on a
  resume the records after `resume_step` are dropped first."""

  def __init__(self, directory: str, resume_step):
    self.log = metrics_lib.MetricsLog(directory, resume_step)

  def write(self, step: int, record: dict) -> None:
    self.log.write(record)

  def flush(self) -> None:
    self.log.flush()

  def close(self) -> None:
    self.log.close()


def purge_events_after(directory: str, step: int) -> int:
  """Rewrites the TensorBoard event files of `directory` without the values logged after
  `step`, as TensorBoard's own purge_step would; returns how many events were dropped. Imports
  TensorFlow: call it where TensorFlow is loaded anyway (the run's writer thread)."""
  files = [name for name in os.listdir(directory) if name.startswith(schema.EVENTS_PREFIX)]
  if not files:
    return 0
  import tensorflow as tf
  dropped = 0
  for name in files:
    path = os.path.join(directory, name)
    events, torn = [], False
    try:
      for raw in tf.data.TFRecordDataset(path):
        events.append(tf.compat.v1.Event.FromString(raw.numpy()))
    except tf.errors.DataLossError:  # a torn tail: the writer was killed mid-record
      torn = True
    kept = [e for e in events if not (e.HasField("summary") and e.step > step)]
    if len(kept) == len(events) and not torn:
      continue
    dropped += len(events) - len(kept)
    with tf.io.TFRecordWriter(path + ".tmp") as writer:
      for event in kept:
        writer.write(event.SerializeToString())
    os.replace(path + ".tmp", path)
  return dropped


class TensorBoard(Writer):
  """A run's TensorBoard scalars (clu's SummaryWriter), written on the writer thread (`pool`)
  and created there on first use: it imports TensorFlow (seconds of CPU), which then overlaps
  with compilation instead of delaying the start. `enabled` False (config.train.tensorboard)
  writes no event file but still purges recomputed steps from earlier sessions' files."""

  def __init__(self, directory: str, resume_step: int, pool, enabled: bool):
    self.directory, self.pool, self.enabled = directory, pool, enabled
    self._writer = None  # touched only on the writer thread
    pool.submit(self._open, resume_step)

  def _open(self, resume_step):
    # Steps after the resumed one are recomputed: drop them from earlier sessions' event files,
    # so TensorBoard shows one value per step.
    purge_events_after(self.directory, resume_step)
    if self.enabled:
      from clu import metric_writers  # imports TensorFlow
      self._writer = metric_writers.SummaryWriter(self.directory)

  def write(self, step: int, record: dict) -> None:
    if self.enabled:
      values = scalars(record)
      self.pool.submit(lambda: self._writer.write_scalars(step, values))

  def _close(self):
    if self._writer is not None:
      self._writer.flush()
      self._writer.close()

  def close(self) -> None:
    self.pool.submit(self._close).result()


class WandB(Writer):
  """A run's records in Weights & Biases (config.train.wandb_project; the `wandb` extra), the
  numbers of metrics.jsonl at their steps, on the writer thread (`pool`: wandb.init takes about a
  second). The wandb run's id lives in run.json, so a resumed run continues the same wandb run;
  steps it recomputes after its checkpoint carry the values already sent (resumes are
  bit-exact), which wandb keeps once. WANDB_MODE=offline keeps everything in <run>/wandb/."""

  def __init__(self, run, label: str, run_dir: rundir.RunDir, pool):
    self.pool = pool
    self._run = None
    run_id = run_dir.info().wandb_run_id
    if run_id is None:
      run_id = uuid.uuid4().hex[:12]
      run_dir.update_info(wandb_run_id=run_id)
    pool.submit(self._open, run, label, run_id)

  def _open(self, run, label, run_id):
    import wandb
    _wandb_lines_to_the_log(wandb)
    mode = wandb_mode()
    where = os.path.join(run.directory, "wandb")
    sync = (f"records kept offline in {where}; send them later with `wandb sync "
            f"{where}/offline-run-*`")
    if mode == "offline" and not os.environ.get("WANDB_MODE"):
      logging.warning("wandb: no API key (WANDB_API_KEY or `wandb login`): %s", sync)
    kwargs = dict(project=run.config.train.wandb_project, id=run_id, name=label,
                  dir=run.directory, config=rundir.config_json(run.config), resume="allow",
                  reinit="create_new")
    try:
      self._run = wandb.init(mode=mode, **kwargs)
    except Exception as e:  # noqa: BLE001 (no network, a refused key: wandb's own errors)
      if mode == "offline":
        raise
      logging.warning("wandb: cannot reach the server (%s): %s", " ".join(str(e).split())[:120],
                      sync)
      self._run = wandb.init(mode="offline", **kwargs)

  def write(self, step: int, record: dict) -> None:
    values = scalars(record)
    self.pool.submit(lambda: self._run.log(values, step=step))

  def close(self) -> None:
    self.pool.submit(lambda: self._run is not None and self._run.finish()).result()


def _wandb_lines_to_the_log(wandb) -> None:
  """wandb prints some 30 lines of its own on the terminal (its version, where it keeps the
  run, the run's summary, how to sync it): they go to a Python logger instead, whose records
  come from installed code, so normstudy.engine.logs keeps them for the run's normstudy.log;
  normstudy's one line about the mode stays on the terminal, and wandb's errors reach it.
  (wandb 0.19-0.31: `wandb.termsetup(settings, logger)` with silent settings sends termlog,
  termwarn and termerror to `logger`; setup first, whose first call would reset it.)"""
  if not hasattr(wandb, "termsetup"):
    return
  wandb.setup()
  wandb.termsetup(wandb.Settings(silent=True), std_logging.getLogger("normstudy.wandb"))


def wandb_mode() -> str:
  """WANDB_MODE when set; else "online" when an API key is known (WANDB_API_KEY, or the netrc
  entry `wandb login` writes), "offline" otherwise: records are then kept in the run's wandb/
  directory for `wandb sync`, and the writer says so in one line instead of sending nothing
  without a word."""
  if os.environ.get("WANDB_MODE"):
    return os.environ["WANDB_MODE"]
  if os.environ.get("WANDB_API_KEY"):
    return "online"
  import netrc
  host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]
  try:
    found = netrc.netrc().authenticators(host)
  except (OSError, netrc.NetrcParseError):
    found = None
  return "online" if found else "offline"


def for_run(run, run_dir: rundir.RunDir, resume_step, label: str, pool) -> MultiWriter:
  """The writers of a run that process 0 keeps: metrics.jsonl, TensorBoard (purging recomputed
  steps even when config.train.tensorboard is off) and, with config.train.wandb_project, W&B."""
  train_cfg = run.config.train
  writers = [MetricsFile(run.directory, resume_step),
             TensorBoard(run.directory, resume_step or 0, pool, bool(train_cfg.tensorboard))]
  if train_cfg.get("wandb_project"):
    writers.append(WandB(run, label, run_dir, pool))
  return MultiWriter(writers)
