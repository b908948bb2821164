"""A run's side effects while it trains (`Recorder`): its records, sent to its writers
(normstudy.engine.writers: metrics.jsonl, TensorBoard, W&B), and its run.json (a
normstudy.records.schema.RunInfo); and the program's progress line (`Progress`).

Process 0 of a multi-process run keeps them; the others keep none.
"""

import collections
from concurrent import futures
import dataclasses
import os
import time
from typing import Any

from absl import logging
import jax
import numpy as np

from normstudy.core import labels
from normstudy.core import life
from normstudy.core import optimizer as optimizer_lib
from normstudy.core import telemetry
from normstudy.engine import logs
from normstudy.engine import schedule
from normstudy.engine import writers as writers_lib
from normstudy.records import keys
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
    self.told = False  # whether logs.tell_rate has heard its first steady rate

  def steady_rate(self):
    """Steps per second in the steady state, or None before one interval after the first."""
    recent = sorted(self.intervals[-self.RATE_INTERVALS:])
    return 1.0 / recent[len(recent) // 2] if recent else None

  def report(self, step, losses: dict, stopped: dict):
    """A line when `step` reaches a multiple of `every` not yet reported (a block of steps is
    reported once, at its last step), the last step, and early (the comment below). Between
    lines the heartbeat (normstudy.engine.logs) knows the step."""
    logs.doing(f"training after step {step}/{self.num_steps}")
    # Besides every `every` steps: the first step (its interval is the compilation) and, a tenth
    # of `every` later, the first steady rate, so the first ETA comes within seconds of the
    # compile rather than `every` steps on (step 200 of 2000 otherwise).
    due = step == self.num_steps or step // self.every != self.last[0] // self.every
    early = step > self.last[0] and (
        self.reports == 0 or (self.reports == 1 and step - self.last[0] >= self.every // 10))
    if not (due or early):
      return
    now = time.perf_counter()
    self.reports += 1
    if self.reports > 1 and step > self.last[0]:
      self.intervals.append((now - self.last[1]) / (step - self.last[0]))
    self.last = (step, now)
    rate = self.steady_rate()
    if rate is not None and not self.told:
      self.told = True
      logs.tell_rate(1.0 / (rate * len(self.names)))
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


# --- The recording chain: a resolved dispatch's steps into each run's records and life.


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


def open_recorders(setup, carry) -> tuple:
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
    recorders.append(Recorder(
        run, resume_step, info, pool, is_writer, stopped=k in carry.stopped))
    if horizons[k] < run.config.train.num_steps:
      hp = {name: float(values[k]) for name, values in hparams.items()}
      final = float(optimizer_lib.learning_rate(run.config.optimizer.schedule, hp, horizons[k]))
      logging.warning("%s: extended to %d steps; the learning-rate schedule keeps the horizon "
                      "of %d steps it started with, so the steps after it run at its final "
                      "rate %g", run.name, run.config.train.num_steps, int(horizons[k]), final)


def stopping(resolved) -> frozenset:
  """The runs that stop (finish or halt) at a step of `resolved` (None: none)."""
  stopping_ = set()
  for one in resolved or ():
    values = one.values
    ending = values[keys.ACTIVE] & (values[keys.STATUS] != life.CODE_RUNNING)
    stopping_.update(np.flatnonzero(ending))
  return frozenset(int(k) for k in stopping_)


def record_of(one: Resolved, k, loss_scaled: bool) -> dict:
  """Run k's record of the resolved step `one`."""
  values = one.values
  record = {keys.STEP: one.step, **{key: values[key][k] for key in keys.STEP_KEYS}}
  record.update({key: values[key][k] for key in values
                 if key not in keys.STEP_KEYS + keys.CONTROL_KEYS})
  if one.eval_losses is not None:
    record[keys.EVAL_LOSS] = one.eval_losses[k]
  for key, sizes in (one.update_sizes or {}).items():
    record[key] = float(sizes[k])
  if values.get(keys.TELEMETRY) is not None:
    record.update(telemetry.flatten(jax.tree.map(lambda x: x[k], values["telemetry"])))
    if loss_scaled:
      record[keys.FP16_OVERFLOWS] = values[keys.SKIPPED_TOTAL][k]
  if k in one.sites:
    record[keys.NONFINITE_AT] = one.sites[k].sentence()
  return record


def record(setup, recorders: list, carry, resolved: list,
           checkpointed: bool = False, progress=None) -> Any:
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


def record_step(setup, recorders: list, carry, one: Resolved, checkpointed: bool,
                at: float) -> tuple:
  """Writes the records of one resolved step; returns ({run name: loss} of the runs it
  stepped, the carry with the lives of the runs that stopped at it)."""
  step, values = one.step, one.values
  log_due = schedule.due(setup.config.train.log_every, step, setup.last_steps)
  loss_scaled = setup.abstract.loss_scale.dynamic
  losses = {}
  for k, recorder in enumerate(recorders):
    if not values[keys.ACTIVE][k]:
      continue
    code = int(values[keys.STATUS][k])
    record_ = record_of(one, k, loss_scaled)
    if worth_recording(record_, code, log_due=log_due, checkpointed=checkpointed,
                       has_telemetry=values.get(keys.TELEMETRY) is not None):
      record_[keys.TOKENS_PER_SEC] = recorder.tokens_per_sec(step, setup.tokens_per_step, at)
      recorder.write(record_)
    losses[recorder.run.name] = float(record_[keys.LOSS])
    if code != life.CODE_RUNNING:
      carry = run_stopped(setup, recorder, carry, k, code, record_,
                          one.sites.get(k, schema.BACKWARD_ONLY))
  return losses, carry


def run_stopped(setup, recorder, carry, k: int, code: int, record_: dict,
                site: schema.Site) -> Any:
  """Run k finished or halted with the step of `record_`: its status into run.json; the
  carry with it stopped (and, when the single run halts, the line it stops with)."""
  status = life.status_of(code)
  carry = carry._replace(stopped={**carry.stopped, k: status})
  if status == schema.FINISHED:
    recorder.set_status(status, last_step=record_[keys.STEP],
                        finished_num_steps=recorder.run.config.train.num_steps)
    return carry
  kind, reason, sentence = life.halt_description(recorder.run.config, code, record_)
  recorder.set_status(status, last_step=record_[keys.STEP], halt_step=record_[keys.STEP],
                      halt_kind=kind.value, halt_reason=reason, nonfinite_at=site.sentence(),
                      nonfinite_site=site.as_json())
  sentence += f"; first non-finite: {site.sentence()}"
  logging.warning("%s halted: %s", recorder.run.name, sentence)
  if not setup.single:
    return carry
  good = (f"the newest checkpoint (step {carry.last_saved}) holds the last good state"
          if carry.last_saved else "no checkpoint was saved yet")
  return carry._replace(halted_line=f"{sentence}; {good}")
