"""Orchestration: which runs train together, in what order, under which locks.

  train_and_evaluate(config, workdir)   normstudy.main's one run (K = 1)
  run_grid(path, variant, axes, ...)    a study's or sweep's runs, then the analysis
  train_programs(runs, root)            runs grouped into programs, one after another or side
                                        by side in worker processes (normstudy.workers)

Runs whose configs differ only in per-run fields (normstudy.per_run) share one compiled program
(`group_runs`); normstudy.train trains one program. Every check that can fail (`preflight`) runs
for every run before anything is written.
"""

import contextlib
import dataclasses
import hashlib
import json
import os

from absl import logging
import jax

from normstudy import data as data_lib
from normstudy import grid
from normstudy import labels
from normstudy import life
from normstudy import per_run
from normstudy import platform
from normstudy import rundir
from normstudy import sharding
from normstudy import train
from normstudy import validation
from normstudy import workers as workers_lib
from normstudy.errors import UserError

@dataclasses.dataclass
class Run:
  """One run: its name (in logs and sweep.json), its config and its directory; for a run of a
  study or sweep, its arm (variant), the arm's label (without the point), the axis values it
  sets (`point`) and the overrides that reproduce it with normstudy.main (all in run.json)."""
  name: str
  config: object
  directory: str
  arm: str = ""
  arm_label: str = ""
  point: dict = dataclasses.field(default_factory=dict)
  overrides: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def of_point(cls, point: grid.Point, workdir: str) -> "Run":
    return cls(point.name, point.config, os.path.join(workdir, point.name), point.arm,
               labels.resolve(point.config, template=point.arm_template), point.point,
               point.overrides)


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
    rundir.check_writable(run.directory, "--workdir")
    data_dir = run.config.data.data_dir
    if run.config.data.name != "text_files":
      rundir.check_writable(os.path.expanduser(data_dir) if data_dir else data_lib.default_dir(),
                            "config.data.data_dir")
    if checkpointed and not allow_config_change:
      _check_saved_config(run, checkpointed)


def _check_saved_config(run: Run, checkpointed: list) -> None:
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
  run = Run(os.path.basename(os.path.normpath(workdir)) or workdir, config, workdir)
  checkpoint_dir = rundir.RunDir(workdir).checkpoints
  preflight([run], checkpoint_dir, allow_config_change)
  rundir.ensure_directory(workdir)
  with lock(workdir):
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


def needs_training(run: Run) -> bool:
  return life.needs_training(rundir.RunDir(run.directory).info(), run.config.train.num_steps)


def train_programs(runs: list, root: str, allow_config_change: bool = False,
                   max_runs: int = grid.MAX_RUNS_PER_PROGRAM, workers: int = 1) -> dict:
  """Trains every run (grouped into programs) with stacked checkpoints under
  `root/checkpoints/<program>/`; returns {run name: status}. `workers`: programs at a time, each
  in a worker process on its share of the cores (normstudy.workers; 0: one per core, up to one
  per program; 1: one after another in this process). A run that halts is a result: the others
  go on. Runs recorded as finished or halted are not trained again."""
  groups = group_runs(runs, max_runs)
  for group in groups:  # every run checked before any starts
    preflight(group, program_checkpoints(root, group), allow_config_change)
  calls = []
  for i, group in enumerate(groups, start=1):
    names = ", ".join(run.name for run in group)
    if any(needs_training(run) for run in group):
      calls.append((i, len(groups), group, root))
    else:
      logging.info("[program %d/%d] %s: finished earlier, skipped", i, len(groups), names)
  num_workers = worker_count(len(calls), workers)  # the bits do not depend on it
  if num_workers > 1:
    _prepare_data([call[2] for call in calls])
    workers_lib.run(_train_group, calls, num_workers)
  else:
    for call in calls:
      _train_group(*call)
  return {run.name: rundir.RunDir(run.directory).status() for run in runs}


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
    for run in group:
      rundir.ensure_directory(run.directory)
      locks.enter_context(lock(run.directory))
    train.train_program(group, program_checkpoints(root, group))


@dataclasses.dataclass
class Grid:
  """What a study or sweep runs: the config file (`path`, its loaded `module`), the one variant
  or None (every arm), the axes and which of them the file declared, and the command line's
  overrides."""
  path: str
  variant: str | None
  axes: dict
  overrides: dict
  module: object
  file_axes: tuple = ()

  @property
  def spec(self) -> str:
    return f"{self.path}:{self.variant}" if self.variant else self.path

  def points(self) -> list:
    return grid.points(self.path, self.variant, self.axes, self.overrides, self.module,
                       sweep=bool(self.axes))


def describe(spec: Grid, max_runs: int = grid.MAX_RUNS_PER_PROGRAM,
             workers: int = 0) -> list[str]:
  """What a sweep will run, in lines for the terminal before anything trains: its axes (and
  which came from the file's SWEEP), the number of runs and programs, how many programs train
  at a time, and the settings the file applies."""
  points = spec.points()
  programs = group_runs([Run(p.name, p.config, "") for p in points], max_runs)
  arms = list(dict.fromkeys(p.arm for p in points))
  axes = " x ".join(f"{field} ({len(values)}: {', '.join(map(grid.flag_value, values))}; "
                    f"{'from the file' if field in spec.file_axes else '--axis'})"
                    for field, values in spec.axes.items())
  lines = [f"grid: {len(arms)} arm(s) x {axes} = {len(points)} runs in {len(programs)} "
           "program(s)"]
  side_by_side = worker_count(len(programs), workers)
  if side_by_side > 1:
    lines.append(f"programs: {side_by_side} at a time, each in a worker process on "
                 f"{len(workers_lib.available_cores()) // side_by_side} core(s) (--workers)")
  settings = getattr(spec.module, "SWEEP_SETTINGS", {})
  if settings:
    lines.append(f"the file's SWEEP_SETTINGS, applied to every run before --config overrides: "
                 + ", ".join(f"{k}={grid.flag_value(v)}" for k, v in settings.items()))
  return lines


def worker_count(num_programs: int, requested: int = 0) -> int:
  """Programs trained at a time for a grid of `num_programs` (normstudy.workers.count)."""
  return workers_lib.count(num_programs, requested,
                          platform.choices(jax.devices()).worker_processes)


def run_grid(spec: Grid, workdir: str, allow_config_change: bool = False,
             max_runs: int = grid.MAX_RUNS_PER_PROGRAM, workers: int = 0):
  """Trains every point of a grid into `workdir` (checked before anything is written), then
  analyses it. `workers`: programs at a time (0: one per core, up to one per program). Returns
  (points, statuses by point name, analysis outputs)."""
  from normstudy import analysis  # the analysis package needs no training stack
  rundir.check_writable(workdir, "--workdir")  # before its runs' directories are named
  points = spec.points()
  runs = [Run.of_point(p, workdir) for p in points]
  for group in group_runs(runs, max_runs):
    preflight(group, program_checkpoints(workdir, group), allow_config_change)
  rundir.ensure_directory(workdir)
  settings = dict(getattr(spec.module, "SWEEP_SETTINGS", {})) if spec.axes else {}

  def record(statuses):
    if spec.axes:
      return grid.write_sweep(workdir, spec.spec, spec.axes, spec.file_axes, settings,
                              spec.overrides, points, statuses)
    return rundir.write_json(os.path.join(workdir, rundir.STUDY), {
        "config": spec.path, "variants": [p.name for p in points],
        "overrides": dict(spec.overrides)})

  with lock(workdir):
    record({})
    train_programs(runs, workdir, allow_config_change, max_runs, workers)
    df = analysis.load_runs(workdir)  # read once, for the analysis and the statuses
    outputs = analysis.analyze(workdir, df=df)
    statuses = analysis.statuses(workdir, df)
    if spec.axes:
      outputs["sweep"] = record(statuses)
  for point in points:
    logging.info("%s: %s", point.name, statuses.get(point.name, "missing"))
  return points, statuses, outputs
