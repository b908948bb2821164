"""The runs of a study or a sweep: a config file's arms times the sweep's axes.

  arms   the one config named by --config=FILE:ARM; else the arms of the file's EXPERIMENT
         (normstudy.core.experiment): for normstudy.study its study_arms (default: all), for
         normstudy.sweep its sweep_arms (default: all)
  axes   {dotted.field: [values]}: the experiment's axes, updated by --axis flags

A sweep applies the experiment's settings ({dotted.field: value}: shorter runs, sparser logs,
what makes a grid of many runs affordable) to every run before the command line's overrides.

Each grid point is one run: the arm's config with the command-line overrides, then the point's
values, applied through `config.override` (the same typed assignment as the command line). A
run's directory is `<workdir>/<arm>/<point>` (or `<workdir>/<point>` for a single arm, and
`<workdir>/<arm>` without axes), its point named from the axes (`lr0.001_seed1`), and its label
the arm's label plus the point. normstudy.experiments.planning then plans them once (`plan`:
grouped into programs, points that differ only in data fields such as learning rate, seed or
clip sharing one; every check run) and trains the plan.
"""

import ast
import copy
import dataclasses
import itertools
import os
import runpy
import shlex
import sys

from normstudy import errors
from normstudy.core import config as config_lib
from normstudy.core import experiment as experiment_lib
from normstudy.core import labels
from normstudy.records import names
from normstudy.records import rundir
from normstudy.records import schema
from normstudy.records import storage

# Runs per program beyond which a grid's runs of one structure are split into several programs;
# 0 = no limit. On XLA:CPU a run-step costs about the same whatever K (benchmarks/grids.py
# --program_sizes measures it), so by default one program takes every run of a structure; a
# limit bounds a program's memory.
MAX_RUNS_PER_PROGRAM = 0


@dataclasses.dataclass
class Run:
  """One run: its name (in logs and sweep.json; relative to the grid's directory for a run of
  a grid), its config and its directory. For a run of a study or sweep also its arm (variant),
  the axis values it sets (`point`), every override that turns the arm's config into this run's
  (`overrides`: the experiment's settings, the command line's, the point's and the label, in
  that order), the `--config` that names its arm (`spec`) and the arm's label template without
  the point (`arm_template`); all of it goes into its run.json."""
  name: str
  config: object
  directory: str = ""
  arm: str = ""
  point: dict = dataclasses.field(default_factory=dict)
  overrides: dict = dataclasses.field(default_factory=dict)
  spec: str = ""
  arm_template: str = ""

  @property
  def arm_label(self) -> str:
    """The arm's label, without the point ("" for a run outside a grid)."""
    return labels.resolve(self.config, template=self.arm_template) if self.arm_template else ""

  def command(self, workdir: str) -> str:
    """The normstudy.main command line that trains this run alone into `workdir`."""
    parts = ["python", "-m", "normstudy.main", f"--config={self.spec}", f"--workdir={workdir}"]
    parts += [f"--config.{field}={flag_value(value)}" for field, value in self.overrides.items()]
    return " ".join(shlex.quote(part) for part in parts)


def flag_value(value) -> str:
  """A value as `--config.<field>=` reads it back to the same value (floats by repr, which
  round-trips exactly)."""
  return repr(value) if isinstance(value, float) else str(value)


def load_experiment(path: str) -> experiment_lib.Experiment:
  """The Experiment the config file at `path` exports, checked (`check_experiment`). The file
  runs as a script is run: it imports what it builds on as any module does (`from configs
  import seed_figure`: configs/ is a package)."""
  if not os.path.isfile(path):
    raise errors.UserError(f"config file {path!r} does not exist")
  # The file --config named is loaded once: ml_collections' config_flags (1.1) loads it as the
  # module "config_config" when the flag parses; a command reads that module's EXPERIMENT
  # rather than running the file a second time.
  parsed = sys.modules.get(experiment_lib.CONFIG_MODULE)
  if parsed is not None and os.path.realpath(getattr(parsed, "__file__", "") or "") == (
      os.path.realpath(path)):
    namespace = vars(parsed)
  else:
    namespace = runpy.run_path(path)
  declared = namespace.get("EXPERIMENT")
  if not isinstance(declared, experiment_lib.Experiment):
    raise errors.UserError(
        f"{path} exports no EXPERIMENT (a normstudy.core.experiment.Experiment"
        + (f"; it holds a {type(declared).__name__}" if declared is not None else "")
        + "): a config file declares what it runs there, and `get_config = "
        "EXPERIMENT.get_config`; configs/seed_figure.py shows both")
  check_experiment(declared, path)
  return declared


def _is_names(value) -> bool:
  return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def check_experiment(declared: experiment_lib.Experiment, path: str) -> None:
  """UserError naming the field when an Experiment's arms ({name: (label, {field: value})}),
  study_arms or sweep_arms (names of its arms), axes ({field: [values]}), settings ({field:
  value}), report or base has another shape, before anything is planned."""
  shapes = {
      "arms": ("{name: (label, {dotted.field: value})}", lambda v: isinstance(v, dict) and all(
          isinstance(k, str) and isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], dict)
          for k, e in v.items())),
      "study_arms": ("a list of its arms' names", _is_names),
      "sweep_arms": ("a list of its arms' names", _is_names),
      "axes": ("{dotted.field: [value, ...]}", lambda v: isinstance(v, dict) and all(
          isinstance(k, str) and isinstance(vs, (list, tuple)) and len(vs) > 0
          for k, vs in v.items())),
      "settings": ("{dotted.field: value}", lambda v: isinstance(v, dict) and all(
          isinstance(k, str) for k in v)),
  }
  for name, (shape, ok) in shapes.items():
    value = getattr(declared, name)
    if not ok(value):
      text = repr(value)
      raise errors.UserError(f"{path}: EXPERIMENT's {name}="
                             f"{text[:60] + '...' if len(text) > 60 else text} is not {shape}")
  for name in ("study_arms", "sweep_arms", "default_arm"):
    value = getattr(declared, name)
    unknown = [arm for arm in ([value] if isinstance(value, str) and value else value)
               if arm not in declared.arms]
    if unknown:
      raise errors.UserError(f"{path}: EXPERIMENT's {name} names {', '.join(unknown)}, not "
                             f"among its arms ({', '.join(declared.arms)})")
  if declared.report and declared.report not in experiment_lib.REPORTS:
    raise errors.UserError(f"{path}: EXPERIMENT's report={declared.report!r} is not allowed; "
                           f"allowed: {', '.join(map(repr, experiment_lib.REPORTS))} or ''")
  if not callable(declared.base):
    raise errors.UserError(f"{path}: EXPERIMENT declares no base config (Experiment(base=F), "
                           "F() -> the config every arm starts from)")


def _value(text: str):
  """A command-line value: a Python literal (1e-3, 3, True) or, failing that, the string."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def parse_axis(text: str) -> tuple[str, list]:
  """'optimizer.learning_rate=1e-3,3e-3' -> ('optimizer.learning_rate', [0.001, 0.003])."""
  field, sep, values = text.partition("=")
  parts = [v.strip() for v in values.split(",")]
  if not sep or not field or not all(parts):
    raise errors.UserError(f"--axis={text!r} is not of the form dotted.field=value1,value2,...")
  return field.strip(), [_value(v) for v in parts]


def arms_of(path: str, variant, declared=None, sweep: bool = False) -> dict:
  """{arm name: get_config} of a config file: the one `variant`, or the arms a study
  (study_arms) or a sweep (sweep_arms) of its experiment runs, by default all of them."""
  declared = declared or load_experiment(path)
  if variant is not None:
    return {variant: lambda: declared.get_config(variant)}
  if not declared.arms:
    return {os.path.splitext(os.path.basename(path))[0]: declared.get_config}
  chosen = (declared.sweep_arms if sweep else declared.study_arms) or declared.arms
  return {arm: (lambda arm=arm: declared.get_config(arm)) for arm in chosen}


def axes_of(declared, axis_flags) -> dict:
  """The experiment's axes, updated by --axis flags (a flag replaces an axis of its field).
  UserError for a field given by two --axis flags, and for an axis whose values repeat one
  another by value (1 and 1.0 are one value: they would train one run twice)."""
  axes = {field: list(values) for field, values in declared.axes.items()}
  flagged = set()
  for text in axis_flags:
    field, values = parse_axis(text)
    if field in flagged:
      raise errors.UserError(f"--axis={field}=... is given twice; give each axis once, with all "
                             "its values")
    flagged.add(field)
    axes[field] = values
  for field, values in axes.items():
    for i, value in enumerate(values):
      same = [other for other in values[i + 1:] if other == value]
      if same:
        raise errors.UserError(f"axis {field} repeats a value: {value!r} and {same[0]!r} are "
                               f"the same {field} (values: {values})")
  return axes


def file_axes(declared, axis_flags) -> list:
  """The fields of the experiment's axes that no --axis flag replaces."""
  flagged = {parse_axis(text)[0] for text in axis_flags}
  return [field for field in declared.axes if field not in flagged]


def points(path: str, variant, axes: dict, overrides: dict, declared=None,
           sweep: bool = False, workdir: str = "", only=None, settings=None) -> list:
  """Every run of the grid (Runs, each in `workdir`/<its name>): arms x the product of the
  axes, in order; with `only`, the runs of those (arm, axis values) pairs alone, named as in the
  whole grid. For a sweep, the experiment's settings (or `settings`) apply first, then
  `overrides` (the command line's), then the point's values. Each arm's config is built once
  and copied for its points."""
  declared = declared or load_experiment(path)
  arms = arms_of(path, variant, declared, sweep)
  if only is None:
    grid = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())] or [{}]
    only = [(arm, values) for arm in arms for values in grid]
  settings = dict(declared.settings if settings is None else settings) if sweep else {}
  named_arms = variant is not None or bool(declared.arms)
  built, out = {}, []
  for arm, values in only:
    if arm not in built:
      built[arm] = arms[arm]()
      config_lib.check_is_config(built[arm], repr(path))
    config = copy.deepcopy(built[arm])
    applied = {**settings, **overrides, **values}
    config_lib.apply_overrides(config, applied)
    arm_template = config.label or "{auto}"
    if values:  # the point names the run: a seed figure's "| Run N" would contradict it
      arm_template = names.without_run_number(arm_template)
      config.label = f"{arm_template} | {names.point_label(values)}"
      applied["label"] = config.label
    config.lock()
    if len(arms) > 1 or variant is not None and not values:
      name = f"{arm}/{names.point_name(values)}" if values else arm
    else:
      name = names.point_name(values) or arm
    spec = f"{path}:{arm}" if named_arms else path
    out.append(Run(name, config, os.path.join(workdir, name) if workdir else "", arm, values,
                   applied, spec, arm_template))
  _check_distinct(out)
  return out


def _check_distinct(points_: list) -> None:
  """UserError if two points would share a run directory (values that differ but print alike)."""
  seen = {}
  for point in points_:
    if point.name in seen:
      raise errors.UserError(f"the grid points {seen[point.name]} and {point.point} would share "
                             f"the run directory {point.name!r}; make the axis values differ "
                             "in their first 6 significant digits")
    seen[point.name] = point.point


@dataclasses.dataclass
class Grid:
  """What a study or sweep runs: the config file (`path`, its `experiment`), the one arm or
  None (every arm), the axes and which of them the file declared, and the command line's
  overrides. Without axes it is a study (the experiment's study_arms); `study`: a study over
  axes all the same (normstudy.study --seeds: its arms as they are, no settings), recorded as
  a sweep is (sweep.json: each run's command); `part`: which of the experiment's parts."""
  path: str
  variant: str | None
  axes: dict
  overrides: dict
  experiment: experiment_lib.Experiment
  file_axes: tuple = ()
  study: bool = False
  part: str = ""  # a declared experiment's part (normstudy.core.experiment.Part)

  @property
  def spec(self) -> str:
    return f"{self.path}:{self.variant}" if self.variant else self.path

  @property
  def settings(self) -> dict:
    """The experiment's settings (and its part's), applied to every run of a sweep ({} for a
    study)."""
    if not self.is_sweep:
      return {}
    part = self.experiment.parts[self.part].settings if self.part else {}
    return {**self.experiment.settings, **part}

  @property
  def is_sweep(self) -> bool:
    return bool(self.axes) and not self.study

  def runs(self, workdir: str) -> list:
    """Every run of the grid, in `workdir`."""
    return points(self.path, self.variant, self.axes, self.overrides, self.experiment,
                  sweep=self.is_sweep, workdir=workdir, settings=self.settings)

  def describe(self, runs: list, num_programs: int, side_by_side: int, cores: int) -> list:
    """What the grid will run, in lines for the terminal before anything trains: its axes (and
    which came from the file), the number of runs and programs, how many programs train
    at a time (`side_by_side`, on `cores` cores), and the settings the file applies."""
    arms = list(dict.fromkeys(run.arm for run in runs))
    axes = " x ".join(f"{field} ({len(values)}: {', '.join(map(flag_value, values))}; "
                      f"{'from the file' if field in self.file_axes else '--axis'})"
                      for field, values in self.axes.items())
    lines = [f"grid: {len(arms)} arm(s) x {axes} = {len(runs)} runs in {num_programs} "
             "program(s)"]
    if side_by_side > 1:
      lines.append(f"programs: {side_by_side} at a time, each in a worker process on "
                   f"{cores // side_by_side} core(s) (--workers)")
    if self.settings:
      lines.append("the experiment's settings, applied to every run before --config overrides: "
                   + ", ".join(f"{k}={flag_value(v)}" for k, v in self.settings.items()))
    return lines

  def record(self, workdir: str, runs: list, statuses: dict) -> str:
    """Writes what the grid ran into `workdir`: sweep.json (write_sweep) for a sweep, study.json
    (a schema.StudyRecord: the file, the variants and the overrides) for a study; returns its
    path."""
    if self.axes:
      return write_sweep(workdir, self, runs, statuses)
    path = os.path.join(workdir, schema.STUDY)
    rundir.write_json(path, schema.StudyRecord(self.path, [run.name for run in runs],
                                               dict(self.overrides)).as_json())
    return path


def for_part(spec: Grid, name: str, part) -> Grid:
  """The grid of part `name` of the file's declared experiment: the same arms and overrides,
  the part's axes in place of the experiment's and its settings added to them."""
  return dataclasses.replace(spec, axes=dict(part.axes),
                             file_axes=tuple(part.axes), part=name)


def search_points(spec: Grid) -> dict:
  """{name: run} of the points a search bisects: the grid of `spec`, whose axes leave out the
  searched field (a sweep's: the experiment's settings apply)."""
  return {run.name: run for run in points(spec.path, spec.variant, spec.axes, spec.overrides,
                                          spec.experiment, sweep=True,
                                          settings=spec.settings)}


def write_sweep(workdir: str, grid: Grid, runs: list, statuses: dict,
                search: schema.SearchRecord | None = None) -> str:
  """DIR/sweep.json (a schema.SweepRecord): the sweep's --config, its axes and which came from
  the file, the experiment's settings, the command line's overrides, and per run its
  name, arm, axis values, the overrides that reproduce it with normstudy.main, that command,
  its status as its training left it and, once it has records, its outcome by the failure rule;
  a search's record (normstudy.experiments.search_runner) when it bisected a field."""
  path = os.path.join(workdir, schema.SWEPT)
  # A staged workdir's commands name its URL, not this host's stage.
  reproduce = storage.remote(os.path.normpath(workdir)) + "_reproduced"
  swept = []
  for r in runs:
    status = statuses.get(r.name, schema.RUNNING)
    ended = rundir.RunDir(r.directory).outcome() if status != schema.RUNNING else None
    swept.append(schema.SweepRun(r.name, r.arm, r.point, r.overrides,
                                 r.command(os.path.join(reproduce, r.name)), status,
                                 ended.kind if ended else None,
                                 ended.failed_at if ended else None))
  experiment = {**grid.experiment.as_json(), **({"part": grid.part} if grid.part else {})}
  record = schema.SweepRecord(
      config=grid.spec, axes=grid.axes, axes_from_file=list(grid.file_axes),
      settings=grid.settings, overrides=dict(grid.overrides), runs=swept, search=search,
      experiment=experiment)
  rundir.write_json(path, record.as_json())
  return path
