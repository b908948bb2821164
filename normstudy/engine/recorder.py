"""A run's side effects while it trains (`Recorder`): its records, sent to its writers
(normstudy.engine.writers: metrics.jsonl, TensorBoard, W&B), and its run.json (a
normstudy.records.schema.RunInfo); and the program's progress line (`Progress`).

Process 0 of a multi-process run keeps them; the others keep none.
"""

import collections
import dataclasses
import time

from absl import logging
import numpy as np

from normstudy.engine import logs
from normstudy.engine import writers as writers_lib
from normstudy.records import metrics as metrics_lib
from normstudy.records import rundir
from normstudy.records import schema
from normstudy.records import storage


class Recorder:
  """One run's side effects: its records (to its writers) and run.json. `run` has .name,
  .config and .directory; `info` holds run.json's facts (schema.RUN_FACTS), written with the
  run's status (its recorded one if it stopped before `resume_step`, else running) over what
  run.json held. Processes other than 0 (`is_writer` False) keep none of them."""

  def __init__(self, run, resume_step, info: schema.RunInfo, writer_pool, is_writer: bool,
               stopped: bool = False):
    self.run = run
    self.dir = rundir.RunDir(run.directory)
    self.is_writer = is_writer
    self.status = self.dir.status() if stopped else schema.RUNNING
    self.last_record = None
    self.timer = (resume_step or 0, time.perf_counter())  # (step, time) of the last record
    self.writer = writers_lib.MultiWriter([])
    if is_writer:
      self.dir.write_config(rundir.config_json(run.config))
      facts = {name: getattr(info, name) for name in schema.RUN_FACTS + schema.RUN_PLACE}
      self.dir.write_info(dataclasses.replace(self.dir.info(), **facts, status=self.status))
      self.writer = writers_lib.for_run(run, self.dir, resume_step, info.label or run.name,
                                        writer_pool)

  def write(self, record: dict) -> None:
    self.last_record = {k: metrics_lib.plain(v) for k, v in record.items()}
    self.writer.write(record["step"], self.last_record)

  def tokens_per_sec(self, step: int, tokens_per_step: int, now: float | None = None) -> float:
    """Tokens per second since the last record; restarts the timer at `step`, taken at `now`
    (default: the clock now)."""
    last_step, last_time = self.timer
    now = time.perf_counter() if now is None else now
    self.timer = (step, now)
    return (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)

  def set_status(self, status: str, **fields) -> None:
    """The run's status and life's fields (RunInfo's) into run.json."""
    self.status = status
    if self.is_writer:
      self.dir.update_info(status=status, **fields)

  def flush(self) -> None:
    """Makes the records durable: flushed to disk, and uploaded if the run's workdir is a URL
    (called before each checkpoint is saved, so a bucket's records always reach its
    checkpoints)."""
    self.writer.flush()
    if self.is_writer:
      storage.push(self.dir.path)

  def close(self) -> None:
    self.writer.close()
    if self.is_writer:
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
    """A line when `step` reaches a multiple of `every` not yet reported (a block of steps is
    reported once, at its last step) or the last step. Between lines the heartbeat
    (normstudy.engine.logs) knows the step."""
    logs.doing(f"training after step {step}/{self.num_steps}")
    if step != self.num_steps and step // self.every == self.last[0] // self.every:
      return
    now = time.perf_counter()
    self.reports += 1
    if self.reports > 1 and step > self.last[0]:
      self.intervals.append((now - self.last[1]) / (step - self.last[0]))
    self.last = (step, now)
    rate = self.steady_rate()
    halted = sum(1 for s in stopped.values() if s == schema.HALTED)
    parts = [f"step {step}/{self.num_steps}"]
    if rate is None:
      parts.append("ETA after the first interval (this one compiled the step)")
    else:
      parts += [f"{rate:.2f} steps/s", f"ETA {(self.num_steps - step) / rate:.0f}s"]
    if self.tag:
      parts.insert(0, self.tag)
    if len(stopped) == len(self.names):  # the program's last line: how its runs ended
      ended = collections.Counter(stopped.values())
      parts.append(("runs ended: " if len(self.names) > 1 else "run ended: ")
                   + ", ".join(f"{n} {status}" for status, n in sorted(ended.items())))
    elif len(self.names) > 1:
      parts.append(f"runs alive {len(self.names) - len(stopped)}/{len(self.names)}, "
                   f"halted {halted}")
    finite = {n: v for n, v in losses.items() if np.isfinite(v)}
    if len(finite) == 1:
      parts.append(f"loss {next(iter(finite.values())):.4f}")
    elif finite:
      best, worst = min(finite, key=finite.get), max(finite, key=finite.get)
      parts.append(f"loss best {finite[best]:.4f} ({best}), worst {finite[worst]:.4f} ({worst})")
    logging.info("%s", " | ".join(parts))
