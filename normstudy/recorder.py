"""A run's side effects while it trains: its records (metrics.jsonl), TensorBoard scalars, an
optional Weights & Biases run and run.json (`Recorder`), and the program's progress line
(`Progress`).

Process 0 of a multi-process run keeps them; the others keep none.
"""

import time

from absl import logging
import numpy as np

from normstudy import life
from normstudy import metrics as metrics_lib
from normstudy import rundir
from normstudy import storage


class _TensorBoard:
  """A run's TensorBoard scalars (clu's SummaryWriter), written on the writer thread (`pool`)
  and created there on first use: it imports TensorFlow (seconds of CPU), which then overlaps with
  compilation instead of delaying the start. `enabled` False (config.train.tensorboard) writes
  no event file but still purges recomputed steps from earlier sessions' files."""

  def __init__(self, directory: str, resume_step: int, pool, enabled: bool):
    self.directory, self.pool, self.enabled = directory, pool, enabled
    self._writer = None  # touched only on the writer thread
    pool.submit(self._open, resume_step)

  def _open(self, resume_step):
    # Steps after the resumed one are recomputed: drop them from earlier sessions' event files,
    # so TensorBoard shows one value per step.
    rundir.purge_events_after(self.directory, resume_step)
    if self.enabled:
      from clu import metric_writers  # imports TensorFlow
      self._writer = metric_writers.SummaryWriter(self.directory)

  def write(self, step: int, record: dict) -> None:
    if self.enabled:
      scalars = {k: float(v) for k, v in record.items()
                 if k != "step" and isinstance(v, (int, float))}
      self.pool.submit(lambda: self._writer.write_scalars(step, scalars))

  def _close(self):
    if self._writer is not None:
      self._writer.flush()
      self._writer.close()

  def close(self) -> None:
    self.pool.submit(self._close).result()


class _WandB:
  """A run's records in Weights & Biases (config.train.wandb_project; the `wandb` extra), the
  keys of metrics.jsonl at their steps, on the writer thread (`pool`: wandb.init takes about a
  second). The wandb run's id lives in run.json, so a resumed run continues the same wandb run;
  steps it recomputes after its checkpoint carry the values already sent (resumes are
  bit-exact), which wandb keeps once. WANDB_MODE=offline keeps everything in <run>/wandb/."""

  def __init__(self, run, label: str, run_dir, pool):
    self.pool = pool
    self._run = None
    run_id = run_dir.info().get("wandb_run_id")
    if run_id is None:
      import uuid
      run_id = uuid.uuid4().hex[:12]
      run_dir.update_info(wandb_run_id=run_id)
    pool.submit(self._open, run, label, run_id)

  def _open(self, run, label, run_id):
    import wandb
    self._run = wandb.init(project=run.config.train.wandb_project, id=run_id, name=label,
                           dir=run.directory, config=rundir.config_json(run.config),
                           resume="allow", reinit="create_new")

  def write(self, step: int, record: dict) -> None:
    scalars = {k: float(v) for k, v in record.items()
               if k != "step" and isinstance(v, (int, float))}
    self.pool.submit(lambda: self._run.log(scalars, step=step))

  def close(self) -> None:
    self.pool.submit(lambda: self._run is not None and self._run.finish()).result()


class Recorder:
  """One run's side effects: its records (metrics.jsonl), TensorBoard scalars and run.json.
  `run` has .name, .config and .directory; `info` goes into run.json with the run's status
  (its recorded one if it stopped before `resume_step`, else running). Processes other than 0
  (`is_writer` False) keep none of them."""

  def __init__(self, run, resume_step, info: dict, writer_pool, is_writer: bool,
               stopped: bool = False):
    self.run = run
    self.dir = rundir.RunDir(run.directory)
    self.is_writer = is_writer
    self.status = self.dir.status() if stopped else life.RUNNING
    self.last_record = None
    self.timer = (resume_step or 0, time.perf_counter())  # (step, time) of the last record
    self._tensorboard = None
    self._wandb = None
    self.log = metrics_lib.NullLog()
    if is_writer:
      self.dir.write_config(rundir.config_json(run.config))
      self.dir.update_info(**info, status=self.status)
      self.log = metrics_lib.MetricsLog(run.directory, resume_step)
      self._tensorboard = _TensorBoard(run.directory, resume_step or 0, writer_pool,
                                       bool(run.config.train.tensorboard))
      if run.config.train.get("wandb_project"):
        self._wandb = _WandB(run, info.get("label") or run.name, self.dir, writer_pool)

  def write(self, record: dict) -> None:
    self.last_record = {k: metrics_lib.plain(v) for k, v in record.items()}
    if self.is_writer:
      self.log.write(self.last_record)
      self._tensorboard.write(record["step"], self.last_record)
      if self._wandb is not None:
        self._wandb.write(record["step"], self.last_record)

  def tokens_per_sec(self, step: int, tokens_per_step: int) -> float:
    """Tokens per second since the last record; restarts the timer at `step`."""
    last_step, last_time = self.timer
    now = time.perf_counter()
    self.timer = (step, now)
    return (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)

  def set_status(self, status: str, **fields) -> None:
    self.status = status
    if self.is_writer:
      self.dir.update_info(status=status, **fields)

  def flush(self) -> None:
    """Makes the records durable: fsynced, and uploaded if the run's workdir is a URL (called
    before each checkpoint is saved, so a bucket's records always reach its checkpoints)."""
    self.log.flush()
    if self.is_writer:
      storage.push(self.dir.path)

  def close(self) -> None:
    self.log.close()
    if self.is_writer:
      self._tensorboard.close()
      if self._wandb is not None:
        self._wandb.close()
      storage.push(self.dir.path)


class Progress:
  """One log line per interval for the whole program: which program (`tag`), step, rate and ETA,
  runs alive and halted, best and worst loss.

  The rate is the steady state's: the median of the last RATE_INTERVALS intervals' seconds per
  step, leaving out the first interval (which holds the step's compilation) and so any one that
  compiled a telemetry or eval step; until a steady interval exists the ETA is not given."""

  RATE_INTERVALS = 5

  def __init__(self, runs, start_step, num_steps, tag: str = ""):
    self.names = [run.name for run in runs]
    self.num_steps = num_steps
    self.every = max(1, num_steps // 20)
    self.last = (start_step, time.perf_counter())
    self.tag = tag
    self.reports = 0
    self.intervals = []  # seconds per step of each interval after the first

  def steady_rate(self):
    """Steps per second in the steady state, or None before one interval after the first."""
    recent = sorted(self.intervals[-self.RATE_INTERVALS:])
    return 1.0 / recent[len(recent) // 2] if recent else None

  def report(self, step, losses: dict, stopped: dict):
    if step % self.every and step != self.num_steps:
      return
    now = time.perf_counter()
    self.reports += 1
    if self.reports > 1 and step > self.last[0]:
      self.intervals.append((now - self.last[1]) / (step - self.last[0]))
    self.last = (step, now)
    rate = self.steady_rate()
    halted = sum(1 for s in stopped.values() if s == life.HALTED)
    parts = [f"step {step}/{self.num_steps}"]
    if rate is None:
      parts.append("ETA after the first interval (this one compiled the step)")
    else:
      parts += [f"{rate:.2f} steps/s", f"ETA {(self.num_steps - step) / rate:.0f}s"]
    if self.tag:
      parts.insert(0, self.tag)
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
