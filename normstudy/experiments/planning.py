"""A study's or sweep's runs, planned once and trained: grouped into programs, every check run
before anything is written (`plan`), then trained (`train_plan`), recorded and analysed
(`run_grid`); and normstudy.main's one run (`train_and_evaluate`).

Runs whose configs differ only in per-run fields (normstudy.core.per_run) share one compiled
program (`group_runs`); normstudy.engine.train trains one program; programs train one after
another or side by side in worker processes (normstudy.experiments.workers). The analysis is
the caller's (`run_grid`'s `analyze`): the commands that draw pass it.
"""

import contextlib
import dataclasses
import hashlib
import os
import time

from absl import logging
import jax

from normstudy import errors
from normstudy.core import per_run
from normstudy.data import sources
from normstudy.engine import logs
from normstudy.engine import platform
from normstudy.engine import train
from normstudy.experiments import grid
from normstudy.experiments import workers as workers_lib
from normstudy.experiments.preflight import preflight
from normstudy.records import rundir
from normstudy.records import schema


def lock(directory: str):
  """The directory's lock for this program's life; only process 0 of a multi-process run takes
  it (all processes share the directory)."""
  return rundir.Lock(directory) if jax.process_index() == 0 else contextlib.nullcontext()


def train_and_evaluate(config, workdir: str, allow_config_change: bool = False) -> dict:
  """Trains one run in `workdir` (resuming if it holds a checkpoint); returns its last record.
  Raises RunHalted when the run halts."""
  rundir.check_kind(workdir, "run")
  run = grid.Run(os.path.basename(os.path.normpath(workdir)) or workdir, config, workdir)
  checkpoint_dir = rundir.RunDir(workdir).checkpoints
  preflight([run], checkpoint_dir, allow_config_change)
  with rundir.made_for(workdir), lock(workdir), library_log(workdir):
    recorder, = train.train_program([run], checkpoint_dir, single=True)
  return recorder.last_record


def library_log(directory: str):
  """The libraries' output (normstudy.engine.logs) into `directory`'s normstudy.log while a
  program trains (process 0 of a multi-process run; the others' stay on their terminals)."""
  if jax.process_index() != 0:
    return contextlib.nullcontext()
  return logs.library_output_to(os.path.join(directory, schema.LIBRARY_LOG))


# What must be equal for runs to share one compiled program (the config without its per-run
# fields and label), defined beside the per-run fields.
program_key = per_run.program_key


def group_runs(runs: list, max_runs: int = grid.MAX_RUNS_PER_PROGRAM) -> list:
  """The runs split into programs (lists of runs), in order of first appearance: runs that
  differ only in per-run fields share one, split into equal parts of at most `max_runs` runs
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


def program_checkpoints(root: str, group: list) -> str:
  """Where a program of a study or sweep in `root` keeps its stacked checkpoints: a stable
  name from its runs' names."""
  names = "\n".join(run.name for run in group)
  digest = hashlib.sha1(names.encode()).hexdigest()[:8]
  first = group[0].name.replace("/", "_")
  name = f"{first}+{len(group) - 1}_{digest}" if len(group) > 1 else f"{first}_{digest}"
  return os.path.join(root, schema.CHECKPOINTS, name)


def needs_training(run: grid.Run) -> bool:
  return rundir.RunDir(run.directory).info().needs_training(run.config.train.num_steps)


@dataclasses.dataclass
class Plan:
  """A study's or sweep's runs, worked out once and then trained as they are: the grid, its
  directory, its runs, their programs (lists of runs, in order), the programs that still need
  training (`todo`, (index, program) pairs) and how many train at a time (`workers`)."""
  grid: grid.Grid
  workdir: str
  runs: list
  programs: list
  todo: list
  workers: int

  def describe(self) -> list[str]:
    return self.grid.describe(self.runs, len(self.programs), self.workers,
                              len(workers_lib.available_cores()))


def plan(spec: grid.Grid, workdir: str, allow_config_change: bool = False,
         max_runs: int = grid.MAX_RUNS_PER_PROGRAM, workers: int = 0) -> Plan:
  """The grid's runs in `workdir`, grouped into programs, every run checked (UserError before
  anything is written). `workers`: programs at a time (0: one per core, up to one per
  program; 1: one after another in this process)."""
  rundir.check_writable(workdir, "--workdir")  # before its runs' directories are named
  rundir.check_kind(workdir, "sweep" if spec.axes else "study")
  runs = spec.runs(workdir)
  return plan_programs(spec, workdir, runs, allow_config_change, max_runs, workers)


def plan_programs(spec, workdir, runs, allow_config_change=False,
                  max_runs: int = grid.MAX_RUNS_PER_PROGRAM, workers: int = 0) -> Plan:
  """`runs` (of the grid `spec`, in `workdir`) grouped into programs, every run checked before
  any starts; the programs that need training, and how many train at a time."""
  programs = group_runs(runs, max_runs)
  for group in programs:  # every run checked before any starts
    preflight(group, program_checkpoints(workdir, group), allow_config_change)
  todo = [(i, group) for i, group in enumerate(programs, start=1)
          if any(needs_training(run) for run in group)]
  return Plan(spec, workdir, runs, programs, todo, worker_count(len(todo), workers))


def share(plan_: Plan, index: int, count: int) -> Plan:
  """The plan cut to the index-th of `count` shares of its programs (1-based; program i goes to
  share (i - 1) % count + 1, so shares of a grid's programs balance), for one task of a cluster
  job array. The programs keep their numbers, directories and locks, so shares run side by side
  into the same directory, and the sweep without a share afterwards finds their runs trained."""
  mine = [(i, group) for i, group in plan_.todo if (i - 1) % count == index - 1]
  return dataclasses.replace(plan_, todo=mine, workers=worker_count(len(mine), plan_.workers))


def train_share(plan_: Plan) -> dict:
  """Trains a share of a plan (`share`): its programs only, without the sweep's lock or record
  (other shares train beside it; the sweep run whole afterwards writes sweep.json and the
  analysis). Returns {run name: status} of the share's runs."""
  rundir.ensure_directory(plan_.workdir)
  return train_plan(dataclasses.replace(plan_,
                                        runs=[run for _, group in plan_.todo for run in group]))


def train_plan(plan_: Plan, pool: workers_lib.Pool | None = None) -> dict:
  """Trains the plan's programs that need it; returns {run name: status} as their training
  left them (normstudy.core.life: finished, halted, preempted, running). Programs side by side
  train in `pool`'s workers when given (a search's rounds: the workers keep what they compiled),
  else in workers started for this plan."""
  todo = {i for i, _ in plan_.todo}
  for i, group in enumerate(plan_.programs, start=1):
    if i not in todo:
      logging.info("[program %d/%d] %s: finished earlier, skipped", i, len(plan_.programs),
                   ", ".join(run.name for run in group))
  calls = [(i, len(plan_.programs), group, plan_.workdir) for i, group in plan_.todo]
  overall = _OverallProgress(calls, plan_.workers)
  if plan_.workers > 1:
    _prepare_data([group for _, group in plan_.todo])
    if pool is not None:
      pool.run(_train_group, calls, plan_.workers, describe=_describe_call,
               on_done=overall.done, on_start=overall.start, on_rate=overall.rate)
    else:
      workers_lib.run(_train_group, calls, plan_.workers, describe=_describe_call,
                      on_done=overall.done, on_start=overall.start, on_rate=overall.rate)
  else:
    for i, call in enumerate(calls):
      overall.start(i)
      with logs.rates_to(lambda spr, i=i: overall.rate(i, spr)):
        compiled_s = _train_group(*call)
      overall.done(i, compiled_s)
  return {run.name: rundir.RunDir(run.directory).status() for run in plan_.runs}


def program_work(group: list) -> int:
  """A program's work for the ETA: the steps its runs train (run-steps)."""
  return sum(run.config.train.num_steps for run in group)


def remaining_seconds(work: list, workers: int, running: dict, finished: dict,
                      now: float) -> float | None:
  """The seconds until every program has trained, or None before one has finished.

  `work`: each program's run-steps (program_work); `running`: {program: (start, first on its
  worker)}; `finished`: {program: (seconds it took, seconds of it compiling, first on its
  worker)}. A run-step takes the finished programs' steady seconds (their time less their
  compiling) over their run-steps; a program adds the mean compile of the finished programs
  that were, like it, first on their worker or not (a worker keeps what it compiled). Each
  running program keeps its worker; the waiting ones go in order to whichever worker frees
  first, as the pool hands them out; the answer is when the last ends. (The time so far over
  the runs done would count neither the programs under way on the other workers nor the first
  programs' compile.)"""
  if not finished:
    return None
  done_work = sum(work[i] for i in finished)
  per_unit = sum(took - compiled for took, compiled, _ in finished.values()) / max(done_work, 1)
  compiled = {first: [c for _, c, f in finished.values() if f == first] for first in (True, False)}
  def compile_of(first: bool) -> float:
    seen = compiled[first] or compiled[not first]
    return sum(seen) / len(seen)
  loads = sorted(max(start + per_unit * work[i] + compile_of(first) - now, 0.0)
                 for i, (start, first) in running.items())
  loads = [0.0] * max(max(workers, 1) - len(loads), 0) + loads
  for i in range(len(work)):
    if i in running or i in finished:
      continue
    loads.sort()
    loads[0] += per_unit * work[i] + compile_of(False)
  return max(loads)


class _OverallProgress:
  """The sweep-wide lines: a first estimate when a program first steps steadily (`rate`),
  then after each program the programs done, the runs of those programs, time so far and the
  ETA of remaining_seconds (from when each program started, on which worker, and how long the
  finished ones compiled)."""

  def __init__(self, calls, workers: int = 1):
    self.runs = [len(group) for _, _, group, _ in calls]
    self.work = [program_work(group) for _, _, group, _ in calls]
    self.workers = workers
    self.running, self.finished = {}, {}
    self.used_workers = set()
    self.started = time.perf_counter()
    self.estimated = False  # whether `rate` has said the first estimate

  def start(self, index: int, worker: int = 0) -> None:
    """Program calls[index] started on `worker`."""
    self.running[index] = (time.perf_counter(), worker not in self.used_workers)
    self.used_workers.add(worker)

  def rate(self, index: int, seconds_per_run_step: float) -> str | None:
    """Program calls[index] steps steadily at `seconds_per_run_step`: before any program has
    finished, logs (and returns) the sweep's first estimate of its training time, once."""
    if self.estimated or self.finished or len(self.runs) < 2:
      return None
    self.estimated = True
    side_by_side = min(self.workers, len(self.runs))
    seconds = sum(self.work) * seconds_per_run_step / side_by_side
    line = (f"[sweep] first estimate: about {seconds:.0f}s to train its {len(self.runs)} "
            f"programs ({sum(self.work):,} run-steps at program {index + 1}'s steady "
            f"{seconds_per_run_step * 1e3:.3g} ms a run-step, {side_by_side} at a time), plus "
            "the compiles of the programs still to start; refined as each program finishes")
    logging.info("%s", line)
    return line

  def done(self, index: int, compiled_s: float = 0.0) -> str | None:
    """Program calls[index] finished (`compiled_s` of it compiling): logs (and returns) the
    sweep-wide line."""
    now = time.perf_counter()
    start, first = self.running.pop(index, (self.started, True))
    self.finished[index] = (now - start, min(compiled_s or 0.0, now - start), first)
    if len(self.runs) < 2:
      return None
    runs_done = sum(self.runs[i] for i in self.finished)
    eta = remaining_seconds(self.work, self.workers, self.running, self.finished, now)
    line = (f"[sweep] programs {len(self.finished)}/{len(self.runs)} done, runs "
            f"{runs_done}/{sum(self.runs)} | {now - self.started:.0f}s so far | ETA {eta:.0f}s")
    logging.info("%s", line)
    return line


def _describe_call(call) -> str:
  index, total, group, _ = call
  return f"program {index}/{total} ({', '.join(run.name for run in group)})"


def _prepare_data(groups: list) -> None:
  """Builds (or finds) each program's dataset here, once: worker processes building the same
  one at the same time would race for its directory."""
  seen = set()
  for group in groups:
    config = group[0].config
    key = repr((config.data.to_dict(), config.model.vocab_size, config.model.max_len))
    if key not in seen:
      seen.add(key)
      sources.load_splits(config)


def _train_group(index: int, total: int, group: list, root: str) -> float:
  names = ", ".join(run.name for run in group)
  logging.info("[program %d/%d] %d run(s): %s", index, total, len(group), names)
  with contextlib.ExitStack() as locks:
    for run in group:  # the run's directory, once: normstudy.engine.train expects it
      locks.enter_context(rundir.made_for(run.directory))
      locks.enter_context(lock(run.directory))
    locks.enter_context(library_log(root))
    compiled = logs.compile_seconds()
    train.train_program(group, program_checkpoints(root, group),
                        tag=f"[program {index}/{total}]" if total > 1 else "")
  return logs.compile_seconds() - compiled  # for the sweep's ETA (_OverallProgress)


def worker_count(num_programs: int, requested: int = 0) -> int:
  """Programs trained at a time for a grid of `num_programs` (normstudy.experiments.workers
  .count)."""
  return workers_lib.count(num_programs, requested,
                          platform.choices(jax.devices()).worker_processes)


def run_grid(plan_: Plan, analyze):
  """Trains a plan into its directory, records it (sweep.json or study.json, with the statuses
  its training left), then analyses it (`analyze(workdir)` -> {name: path}, the command's: e.g.
  normstudy.analysis.analyze). Returns (statuses by run name, analysis outputs)."""
  spec, workdir = plan_.grid, plan_.workdir
  began = os.times()
  rundir.ensure_directory(workdir)
  with lock(workdir):
    spec.record(workdir, plan_.runs, {})
    with recorded_on_stop(lambda: spec.record(workdir, plan_.runs, recorded_statuses(plan_.runs))):
      statuses = train_plan(plan_)
    outputs = analyze(workdir)
    recorded = spec.record(workdir, plan_.runs, statuses)
    if spec.axes:
      outputs["sweep"] = recorded
  for run in plan_.runs:
    logging.info("%s: %s", run.name, statuses.get(run.name) or "missing")
  logging.info("%s", time_used(began, os.times()))
  return statuses, outputs


def time_used(began, ended) -> str:
  """The wall and CPU time between two os.times() (this process and the workers it has
  joined), against the cores: a wall time far above CPU / cores means the machine was busy
  with other work, not that training was slow."""
  wall = ended.elapsed - began.elapsed
  cpu = sum(getattr(ended, f) - getattr(began, f)
            for f in ("user", "system", "children_user", "children_system"))
  cores = len(workers_lib.available_cores())
  return (f"took {wall:.0f}s wall, {cpu:.0f}s CPU on {cores} core(s): "
          f"{100 * cpu / max(wall * cores, 1e-9):.0f}% of the cores busy with this")


def recorded_statuses(runs: list) -> dict:
  """{run name: its recorded status} of the runs that started (normstudy.records.schema)."""
  found = {run.name: rundir.RunDir(run.directory).status() for run in runs}
  return {name: status for name, status in found.items() if status}


@contextlib.contextmanager
def recorded_on_stop(record):
  """Calls `record()` (sweep.json or study.json with the runs' statuses) when training stops
  by a signal or a killed worker, so the record says which runs were preempted, then lets the
  stop go on."""
  try:
    yield
  except (errors.Preempted, errors.WorkerKilled):
    record()
    raise
