"""Orchestration: which runs train together, in what order, under which locks.

  train_and_evaluate(config, workdir)   normstudy.main's one run (K = 1)
  plan(grid, workdir, ...)              a study's or sweep's runs, worked out once: expanded,
                                        grouped into programs, every check run (a Plan)
  run_grid(plan)                        trains a plan, records it, then the analysis
  train_programs(runs, root)            runs grouped into programs and trained

Runs whose configs differ only in per-run fields (normstudy.per_run) share one compiled program
(`group_runs`); normstudy.train trains one program; programs train one after another or side by
side in worker processes (normstudy.workers). Every check that can fail (`preflight`) runs for
every run before anything is written.
"""

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import time

from absl import logging
import jax

from normstudy import data as data_lib
from normstudy import errors
from normstudy import execution
from normstudy import grid
from normstudy import life
from normstudy import memory
from normstudy import per_run
from normstudy import platform
from normstudy import rundir
from normstudy import sharding
from normstudy import storage
from normstudy import train
from normstudy import validation
from normstudy import workers as workers_lib
from normstudy.errors import UserError

def preflight(runs: list, checkpoint_dir: str, allow_config_change: bool = False) -> None:
  """Every check that must pass before anything is created or written (raises UserError).

  A run directory with a checkpointed step holds a run, and a new config must match its
  config.json (fields that may change excepted); one with no checkpoint is not a run yet, and
  any config may take it."""
  sizes = sharding.mesh_shape(runs[0].config.mesh, jax.device_count())
  checkpointed = rundir.checkpointed_steps(storage.remote(checkpoint_dir))
  files_checked = set()
  for run in runs:
    validation.validate(run.config)
    sharding.check_divisible(run.config, sizes, num_runs=len(runs))
    check_memory(run.config, sizes, len(runs))
    rundir.check_writable(run.directory, "--workdir")
    data_dir = run.config.data.data_dir
    if run.config.data.name != "text_files":
      data_dir = os.path.expanduser(data_dir) if data_dir else data_lib.default_dir()
      rundir.check_writable(data_dir, "config.data.data_dir")
      if not storage.is_url(data_dir):  # the dataset's cache, not the run: making it is safe
        rundir.ensure_directory(data_dir, "config.data.data_dir")
    check_tracking(run.config)
    corpus = json.dumps([run.config.data.to_dict(), run.config.model.max_len], default=str)
    if corpus not in files_checked:  # once per corpus, not per run
      data_lib.check_files(run.config)
      _warn_small_synthetic(run.config)
      files_checked.add(corpus)
    if checkpointed and not allow_config_change:
      _check_saved_config(run, checkpointed)


def _warn_small_synthetic(config) -> None:
  """One warning when a synthetic split is asked for fewer tokens than a document holds: the
  split is one whole document, which the run then reads over and over."""
  data_cfg = config.data
  if data_cfg.name != "synthetic":
    return
  for split in ("train", "validation"):
    asked = data_cfg[f"{split}_tokens"]
    held = data_lib.synthetic_tokens(asked)
    if held >= 2 * asked:
      logging.warning("config.data.%s_tokens=%d is less than one synthetic document: the %s "
                      "split holds %d tokens (%d rows of config.model.max_len=%d)", split, asked,
                      split, held, held // config.model.max_len, config.model.max_len)


def check_tracking(config) -> None:
  """UserError when config.train.wandb_project asks for Weights & Biases and wandb is not
  installed (the `wandb` extra)."""
  if config.train.wandb_project and importlib.util.find_spec("wandb") is None:
    raise UserError(f"config.train.wandb_project={config.train.wandb_project!r} needs wandb, "
                    "which is not installed: pip install -e '.[wandb]'")


def memory_limit() -> tuple[int | None, str]:
  """(bytes one device's share of a program may use, what they are): on the CPU the host's
  memory shared by its local devices; on an accelerator the device's own, if it says."""
  device = jax.local_devices()[0]
  if device.platform == "cpu":
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // jax.local_device_count(), "this host's memory" + (
        f" shared by {jax.local_device_count()} devices" if jax.local_device_count() > 1 else "")
  stats = device.memory_stats() or {}
  return stats.get("bytes_limit"), f"the memory of one {device.device_kind}"


def check_memory(config, sizes: dict, num_runs: int) -> None:
  """UserError when the memory plan (normstudy.memory, a floor of what the step needs) of one
  device exceeds what it has."""
  limit, what = memory_limit()
  one_at_a_time = execution.steps_one_at_a_time(jax.devices(), sizes["runs"], num_runs)
  needed = memory.plan(config, sizes, num_runs, one_at_a_time)
  if limit is not None and needed.total > limit:
    m = config.model
    raise UserError(
        f"a run of num_layers={m.num_layers}, d_model={m.d_model}, d_ff={m.d_ff}, "
        f"max_len={m.max_len}, vocab_size={m.vocab_size}, "
        f"batch_size={config.train.batch_size} needs at least {needed.describe()} per device, "
        f"more than the {limit / memory.GIB:.3g} GiB of {what}; make the model, "
        "config.train.batch_size or config.model.max_len smaller, set config.model.remat, or "
        "use more devices")


def _check_saved_config(run: grid.Run, checkpointed: list) -> None:
  saved = rundir.RunDir(run.directory).saved_config()
  if not saved:
    raise UserError(
        f"{run.directory} has checkpoints (steps {', '.join(map(str, checkpointed[-2:]))}) but "
        f"no {rundir.CONFIG}, so its config cannot be checked; restore that file, or pass "
        "--allow_config_change to continue it with this config")
  differences = rundir.config_differences(saved, rundir.config_json(run.config))
  if differences:
    raise UserError(
        f"{run.directory} holds a run with another config ({'; '.join(differences)}); choose "
        "another --workdir, or pass --allow_config_change to continue this run with the new "
        "config")


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
  with rundir.made_for(workdir), lock(workdir):
    recorder, = train.train_program([run], checkpoint_dir, single=True)
  return recorder.last_record


def program_key(config) -> str:
  """What must be equal for runs to share one compiled program: the config without its per-run
  fields (normstudy.per_run.RUN_DATA_FIELDS) and label."""
  flat = rundir.flatten(rundir.config_json(config))
  for field in per_run.RUN_DATA_FIELDS + ("label",):
    flat.pop(field, None)
  return json.dumps(flat, sort_keys=True, default=str)


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
  return os.path.join(root, rundir.CHECKPOINTS, name)


def needs_training(run: grid.Run) -> bool:
  return life.needs_training(rundir.RunDir(run.directory).info(), run.config.train.num_steps)


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
  return _plan_programs(spec, workdir, runs, allow_config_change, max_runs, workers)


def _plan_programs(spec, workdir, runs, allow_config_change, max_runs, workers) -> Plan:
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


def train_programs(runs: list, root: str, allow_config_change: bool = False,
                   max_runs: int = grid.MAX_RUNS_PER_PROGRAM, workers: int = 1) -> dict:
  """Trains every run (grouped into programs, checked first) with stacked checkpoints under
  `root/checkpoints/<program>/`; returns {run name: status}. `workers` as `plan`'s. A run that
  halts is a result: the others go on. Runs recorded as finished or halted are not trained
  again."""
  return train_plan(_plan_programs(None, root, runs, allow_config_change, max_runs, workers))


def train_plan(plan_: Plan) -> dict:
  """Trains the plan's programs that need it; returns {run name: status} as their training
  left them (normstudy.life: finished, halted, preempted, running)."""
  todo = {i for i, _ in plan_.todo}
  for i, group in enumerate(plan_.programs, start=1):
    if i not in todo:
      logging.info("[program %d/%d] %s: finished earlier, skipped", i, len(plan_.programs),
                   ", ".join(run.name for run in group))
  calls = [(i, len(plan_.programs), group, plan_.workdir) for i, group in plan_.todo]
  overall = _OverallProgress(calls)
  if plan_.workers > 1:
    _prepare_data([group for _, group in plan_.todo])
    workers_lib.run(_train_group, calls, plan_.workers, describe=_describe_call,
                    on_done=overall.done)
  else:
    for call in calls:
      _train_group(*call)
      overall.done()
  return {run.name: rundir.RunDir(run.directory).status() for run in plan_.runs}


class _OverallProgress:
  """The sweep-wide line after each program: programs done, runs trained, time so far and an
  ETA from the programs done so far (runs of the remaining programs at their mean time a run)."""

  def __init__(self, calls):
    self.runs = [len(group) for _, _, group, _ in calls]
    self.finished = 0
    self.started = time.perf_counter()

  def done(self):
    self.finished += 1
    if len(self.runs) < 2:
      return
    elapsed = time.perf_counter() - self.started
    runs_done = sum(self.runs[:self.finished])  # programs finish about in order; a guide
    left = sum(self.runs) - runs_done
    eta = elapsed / max(runs_done, 1) * left
    logging.info("[sweep] programs %d/%d done, runs %d/%d | %.0fs so far | ETA %.0fs",
                 self.finished, len(self.runs), runs_done, sum(self.runs), elapsed, eta)


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
      data_lib.load_splits(config)


def _train_group(index: int, total: int, group: list, root: str) -> None:
  names = ", ".join(run.name for run in group)
  logging.info("[program %d/%d] %d run(s): %s", index, total, len(group), names)
  with contextlib.ExitStack() as locks:
    for run in group:  # the run's directory, once: normstudy.train expects it
      locks.enter_context(rundir.made_for(run.directory))
      locks.enter_context(lock(run.directory))
    train.train_program(group, program_checkpoints(root, group),
                        tag=f"[program {index}/{total}]" if total > 1 else "")


def worker_count(num_programs: int, requested: int = 0) -> int:
  """Programs trained at a time for a grid of `num_programs` (normstudy.workers.count)."""
  return workers_lib.count(num_programs, requested,
                          platform.choices(jax.devices()).worker_processes)


def run_grid(plan_: Plan):
  """Trains a plan into its directory, records it (sweep.json or study.json, with the statuses
  its training left), then analyses it. Returns (statuses by run name, analysis outputs)."""
  from normstudy import analysis  # the analysis package needs no training stack
  spec, workdir = plan_.grid, plan_.workdir
  rundir.ensure_directory(workdir)
  with lock(workdir):
    spec.record(workdir, plan_.runs, {})
    with _recorded_on_stop(lambda: spec.record(workdir, plan_.runs, _statuses(plan_.runs))):
      statuses = train_plan(plan_)
    outputs = analysis.analyze(workdir)
    recorded = spec.record(workdir, plan_.runs, statuses)
    if spec.axes:
      outputs["sweep"] = recorded
  for run in plan_.runs:
    logging.info("%s: %s", run.name, statuses.get(run.name) or "missing")
  return statuses, outputs


def _statuses(runs: list) -> dict:
  """{run name: its recorded status} of the runs that started (normstudy.life)."""
  found = {run.name: rundir.RunDir(run.directory).status() for run in runs}
  return {name: status for name, status in found.items() if status}


@contextlib.contextmanager
def _recorded_on_stop(record):
  """Calls `record()` (sweep.json or study.json with the runs' statuses) when training stops
  by a signal or a killed worker, so the record says which runs were preempted, then lets the
  stop go on."""
  try:
    yield
  except (errors.Preempted, errors.WorkerKilled):
    record()
    raise


def search_points(spec: grid.Grid) -> dict:
  """{name: run} of the points a search bisects: the grid of `spec`, whose axes leave out the
  searched field (a sweep's: the file's SWEEP_SETTINGS apply)."""
  return {run.name: run for run in grid.points(spec.path, spec.variant, spec.axes,
                                               spec.overrides, spec.module, sweep=True)}


def search_runs(spec: grid.Grid, field: str, workdir: str, todo: dict, points: dict) -> list:
  """[(point name, value, run)] of one round: each point's values, each a run named by the
  searched value first (`lr0.1778_seed0`)."""
  out = []
  for name, values in todo.items():
    point = points[name]
    for value in values:
      axes = {field: [value], **{f: [v] for f, v in point.point.items()}}
      run, = [r for r in grid.points(spec.path, spec.variant, axes, spec.overrides, spec.module,
                                     sweep=True, workdir=workdir) if r.arm == point.arm]
      out.append((name, value, run))
  return out


def run_search(spec: grid.Grid, search_, workdir: str, allow_config_change: bool = False,
               max_runs: int = grid.MAX_RUNS_PER_PROGRAM, workers: int = 0, describe=None):
  """Bisects `search_.field` per point of `spec` (normstudy.search): each round's runs are
  planned (grouped into programs, every run checked) and trained as a grid's; sweep.json
  records every run and each point's bracket after every round; then the analysis. A round
  already trained (a resumed or extended search) is replayed from its runs' records: finished
  and halted runs are not trained again. Returns (statuses by run name, analysis outputs)."""
  from normstudy import analysis
  from normstudy import search as search_lib
  rundir.check_writable(workdir, "--workdir")
  rundir.check_kind(workdir, "sweep")
  points = search_points(spec)
  # Round 1's runs are checked before anything is written; later rounds differ from them
  # only in the searched value.
  first = search_runs(spec, search_.field, workdir,
                      {n: [search_.low, search_.high] for n in points}, points)
  _plan_programs(spec, workdir, [run for _, _, run in first], allow_config_change, max_runs,
                 workers)
  if describe is not None:
    describe([f"search: {search_.field} in [{search_.low:g}, {search_.high:g}] for each of "
              f"{len(points)} point(s), {search_.rounds} round(s) (round 1 checks the bracket, "
              f"each later one halves it): at most {len(points) * (search_.rounds + 1)} runs"])
  all_runs, statuses, recorded = [], {}, {"search": None}

  def train_round(k, todo):
    round_runs = search_runs(spec, search_.field, workdir, todo, points)
    plan_ = _plan_programs(spec, workdir, [run for _, _, run in round_runs],
                           allow_config_change, max_runs, workers)
    logging.info("search round %d/%d: %d run(s), %d to train", k, search_.rounds,
                 len(round_runs), sum(len(group) for _, group in plan_.todo))
    all_runs.extend(run for _, _, run in round_runs)
    with _recorded_on_stop(lambda: grid.write_sweep(  # this round's runs too, as they stopped
        workdir, spec, all_runs, {**statuses, **_statuses(all_runs)},
        search=recorded["search"])):
      statuses.update(train_plan(plan_))
    return _round_outcomes(round_runs)

  def record(history):  # sweep.json after every round: a killed search shows how far it got
    search_record = {**search_.as_json(), "points": [
        {"name": name, "arm": p.arm, "point": p.point,
         "brackets": [b.as_json() for b in history[name]]} for name, p in points.items()]}
    recorded["search"] = search_record
    return grid.write_sweep(workdir, spec, all_runs, statuses, search=search_record)

  rundir.ensure_directory(workdir)
  with lock(workdir):
    history = search_lib.run(search_, list(points), train_round, after_round=record)
    outputs = analysis.analyze(workdir)
    outputs["sweep"] = record(history)
  return statuses, outputs


def _round_outcomes(round_runs: list) -> dict:
  """{point: {value: failed}} of a trained round (`search_runs`), judged from the runs' records
  by normstudy.analysis.detectors.run_status."""
  from normstudy.analysis import detectors
  outcomes = {}
  for name, value, run in round_runs:
    status = detectors.run_status(run.directory)
    if status not in (*detectors.FAILED, life.FINISHED):  # a preemption raises before this
      raise RuntimeError(f"{run.name} ended {status!r}, neither finished nor failed")
    outcomes.setdefault(name, {})[value] = status in detectors.FAILED
  return outcomes


def search_share(spec: grid.Grid, search_, workdir: str, round_: int, index: int, count: int,
                 allow_config_change: bool = False, max_runs: int = grid.MAX_RUNS_PER_PROGRAM,
                 workers: int = 0, describe=None) -> dict:
  """Trains the index-th of `count` shares (`share`) of search round `round_`'s programs: one
  task of a cluster job array (launch/sweep.sh --grid). The rounds before it are replayed from
  their runs' records, so they must all be trained (UserError naming the round otherwise,
  before anything is written); which runs round `round_` trains follows from them as in
  `run_search`. No lock of the sweep and no sweep.json: other shares train beside this one,
  and the search run whole afterwards trains nothing left and writes the record and the
  analysis. `describe(lines)` is told the share's programs. Returns {run name: status} of the
  share's runs."""
  from normstudy import search as search_lib
  rundir.check_writable(workdir, "--workdir")
  rundir.check_kind(workdir, "sweep")
  points = search_points(spec)
  trained = {}

  def train_round(k, todo):
    round_runs = search_runs(spec, search_.field, workdir, todo, points)
    plan_ = _plan_programs(spec, workdir, [run for _, _, run in round_runs],
                           allow_config_change, max_runs, workers)
    if k < round_:
      if plan_.todo:
        left = sum(1 for _, group in plan_.todo for run in group if needs_training(run))
        raise UserError(f"--round={round_}: round {k} of the search has {left} run(s) not "
                        f"trained yet; train its shares first (--round={k} --programs=I/N)")
      return _round_outcomes(round_runs)
    mine = share(plan_, index, count)
    if describe is not None:
      describe([f"share {index}/{count} of round {round_}: programs "
                f"{', '.join(str(i) for i, _ in mine.todo) or 'none left to train'}"])
    trained.update(train_share(mine))
    return {}

  search_lib.run(dataclasses.replace(search_, rounds=round_), list(points), train_round)
  return trained
