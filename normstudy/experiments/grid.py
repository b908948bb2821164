"""The runs of a study or a sweep: a config file's variants (arms) times the sweep's axes.

  arms   the one config named by --config=FILE:VARIANT; else the file's variants: for
         normstudy.study its STUDY_VARIANTS (default: all of VARIANTS), for normstudy.sweep its
         SWEEP_VARIANTS (default: all of VARIANTS); a file without VARIANTS is one arm
  axes   {dotted.field: [values]}: the file's SWEEP (if it declares one), updated by --axis flags

A file may also declare SWEEP_SETTINGS, {dotted.field: value} applied to every run of a sweep of
it before the command line's overrides (shorter runs, sparser logs: what makes a grid of many runs
affordable). The names are the older module tables; a file that declares an EXPERIMENT
(normstudy.records.experiment) has them from it (`load_config_module`: its arms, sweep_arms,
study_arms, axes and settings), so the rest of this module reads either alike.

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
import types

from normstudy import errors
from normstudy.core import config as config_lib
from normstudy.core import labels
from normstudy.records import experiment as experiment_lib
from normstudy.records import names
from normstudy.records import rundir
from normstudy.records import schema
from normstudy.records import storage

# Runs per program beyond which a grid's runs of one structure are split into several programs;
# 0 = no limit. On XLA:CPU a run-step costs about the same whatever K (benchmarks/sweep.py
# --program_sizes measures it), so by default one program takes every run of a structure; a
# limit bounds a program's memory.
MAX_RUNS_PER_PROGRAM = 0


@dataclasses.dataclass
class Run:
  """One run: its name (in logs and sweep.json; relative to the grid's directory for a run of
  a grid), its config and its directory. For a run of a study or sweep also its arm (variant),
  the axis values it sets (`point`), every override that turns the arm's config into this run's
  (`overrides`: the file's SWEEP_SETTINGS, the command line's, the point's and the label, in
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


def load_config_module(path: str):
  """The namespace of the config file at `path` (its get_config, VARIANTS, SWEEP, ...), run as
  a script is run: the file imports what it builds on as any module does (`from configs import
  seed_figure`: configs/ is a package)."""
  if not os.path.isfile(path):
    raise errors.UserError(f"config file {path!r} does not exist")
  # The file --config named is loaded once: ml_collections' config_flags (1.1) loads it as the
  # module "config_config" when the flag parses; a command reads that module's tables rather
  # than running the file a second time.
  parsed = sys.modules.get(experiment_lib.CONFIG_MODULE)
  if parsed is not None and os.path.realpath(getattr(parsed, "__file__", "") or "") == (
      os.path.realpath(path)):
    module = types.SimpleNamespace(**vars(parsed))
  else:
    module = types.SimpleNamespace(**runpy.run_path(path))
  declared = getattr(module, "EXPERIMENT", None)
  if declared is not None:
    if not isinstance(declared, experiment_lib.Experiment):
      raise errors.UserError(f"{path}: EXPERIMENT is a {type(declared).__name__}, not a "
                             "normstudy.records.experiment.Experiment")
    older = [name for name in _TABLES if hasattr(module, name)]
    if older:
      raise errors.UserError(f"{path} declares EXPERIMENT and {', '.join(older)}: declare the "
                             "experiment once (EXPERIMENT's arms, axes, settings, ...)")
    if declared.report and declared.report not in experiment_lib.REPORTS:
      raise errors.UserError(f"{path}: EXPERIMENT's report={declared.report!r} is not allowed; "
                             f"allowed: {', '.join(map(repr, experiment_lib.REPORTS))} or ''")
    for name, value in declared.tables().items():
      setattr(module, name, value)
  check_tables(module, path)
  return module


# The module tables a file may declare instead of EXPERIMENT (files written before it).
_TABLES = ("VARIANTS", "SWEEP_VARIANTS", "STUDY_VARIANTS", "SWEEP", "SWEEP_SETTINGS")


def _is_names(value) -> bool:
  return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def check_tables(module, path: str) -> None:
  """UserError naming the table when a config file's VARIANTS ({name: (label, {field: value})}),
  STUDY_VARIANTS or SWEEP_VARIANTS (names), SWEEP ({field: [values]}) or SWEEP_SETTINGS ({field:
  value}) has another shape, before anything is planned."""
  shapes = {
      "VARIANTS": ("{name: (label, {dotted.field: value})}", lambda v: isinstance(v, dict) and all(
          isinstance(k, str) and isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], dict)
          for k, e in v.items())),
      "STUDY_VARIANTS": ("a list of VARIANTS' names", _is_names),
      "SWEEP_VARIANTS": ("a list of VARIANTS' names", _is_names),
      "SWEEP": ("{dotted.field: [value, ...]}", lambda v: isinstance(v, dict) and all(
          isinstance(k, str) and isinstance(vs, (list, tuple)) and len(vs) > 0
          for k, vs in v.items())),
      "SWEEP_SETTINGS": ("{dotted.field: value}", lambda v: isinstance(v, dict) and all(
          isinstance(k, str) for k in v)),
  }
  for name, (shape, ok) in shapes.items():
    value = getattr(module, name, None)
    if value is not None and not ok(value):
      text = repr(value)
      raise errors.UserError(f"{path}: {name} = {text[:60] + '...' if len(text) > 60 else text}"
                             f" is not {shape}")


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


def arms_of(path: str, variant, module=None, sweep: bool = False) -> dict:
  """{arm name: get_config} of a config file: the one `variant`, or the variants a study
  (STUDY_VARIANTS) or a sweep (SWEEP_VARIANTS) of the file runs, by default all of VARIANTS."""
  module = module or load_config_module(path)
  if variant is not None:
    return {variant: lambda: module.get_config(variant)}
  variants = getattr(module, "VARIANTS", None)
  if not variants:
    name = os.path.splitext(os.path.basename(path))[0]
    return {name: module.get_config}
  chosen = getattr(module, "SWEEP_VARIANTS" if sweep else "STUDY_VARIANTS", None) or variants
  unknown = [v for v in chosen if v not in variants]
  if unknown:
    raise errors.UserError(f"{path}: {'SWEEP' if sweep else 'STUDY'}_VARIANTS names "
                           f"{', '.join(unknown)}, not in VARIANTS ({', '.join(variants)})")
  return {v: (lambda v=v: module.get_config(v)) for v in chosen}


def axes_of(module, axis_flags) -> dict:
  """The file's SWEEP axes, updated by --axis flags (a flag replaces a file axis of its field).
  UserError for a field given by two --axis flags, and for an axis whose values repeat one
  another by value (1 and 1.0 are one value: they would train one run twice)."""
  axes = {field: list(values) for field, values in getattr(module, "SWEEP", {}).items()}
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


def file_axes(module, axis_flags) -> list:
  """The fields of the file's SWEEP that no --axis flag replaces."""
  flagged = {parse_axis(text)[0] for text in axis_flags}
  return [field for field in getattr(module, "SWEEP", {}) if field not in flagged]


def points(path: str, variant, axes: dict, overrides: dict, module=None,
           sweep: bool = False, workdir: str = "", only=None) -> list:
  """Every run of the grid (Runs, each in `workdir`/<its name>): arms x the product of the
  axes, in order; with `only`, the runs of those (arm, axis values) pairs alone, named as in the
  whole grid. For a sweep, the file's SWEEP_SETTINGS apply first, then `overrides` (the command
  line's), then the point's values. Each arm's config is built once and copied for its points."""
  module = module or load_config_module(path)
  arms = arms_of(path, variant, module, sweep)
  if only is None:
    grid = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())] or [{}]
    only = [(arm, values) for arm in arms for values in grid]
  settings = dict(getattr(module, "SWEEP_SETTINGS", {})) if sweep else {}
  named_arms = variant is not None or bool(getattr(module, "VARIANTS", None))
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
  """What a study or sweep runs: the config file (`path`, its loaded `module`), the one variant
  or None (every arm), the axes and which of them the file declared, and the command line's
  overrides. Without axes it is a study (the file's STUDY_VARIANTS); `study`: a study over
  axes all the same (normstudy.study --seeds: its variants as they are, no SWEEP_SETTINGS),
  recorded as a sweep is (sweep.json: each run's command)."""
  path: str
  variant: str | None
  axes: dict
  overrides: dict
  module: object
  file_axes: tuple = ()
  study: bool = False
  part: str = ""  # a declared experiment's part (normstudy.records.experiment.Part)

  @property
  def spec(self) -> str:
    return f"{self.path}:{self.variant}" if self.variant else self.path

  @property
  def settings(self) -> dict:
    """The file's SWEEP_SETTINGS, applied to every run of a sweep ({} for a study)."""
    return dict(getattr(self.module, "SWEEP_SETTINGS", {})) if self.is_sweep else {}

  @property
  def is_sweep(self) -> bool:
    return bool(self.axes) and not self.study

  def runs(self, workdir: str) -> list:
    """Every run of the grid, in `workdir`."""
    return points(self.path, self.variant, self.axes, self.overrides, self.module,
                  sweep=self.is_sweep, workdir=workdir)

  def describe(self, runs: list, num_programs: int, side_by_side: int, cores: int) -> list:
    """What the grid will run, in lines for the terminal before anything trains: its axes (and
    which came from the file's SWEEP), the number of runs and programs, how many programs train
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
      lines.append("the file's SWEEP_SETTINGS, applied to every run before --config overrides: "
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
  module = types.SimpleNamespace(**vars(spec.module))
  module.SWEEP = dict(part.axes)
  module.SWEEP_SETTINGS = {**getattr(spec.module, "SWEEP_SETTINGS", {}), **part.settings}
  return dataclasses.replace(spec, axes=dict(part.axes), module=module,
                             file_axes=tuple(part.axes), part=name)


def search_points(spec: Grid) -> dict:
  """{name: run} of the points a search bisects: the grid of `spec`, whose axes leave out the
  searched field (a sweep's: the file's SWEEP_SETTINGS apply)."""
  return {run.name: run for run in points(spec.path, spec.variant, spec.axes, spec.overrides,
                                          spec.module, sweep=True)}


def write_sweep(workdir: str, grid: Grid, runs: list, statuses: dict,
                search: schema.SearchRecord | None = None) -> str:
  """DIR/sweep.json (a schema.SweepRecord): the sweep's --config, its axes and which came from
  the file's SWEEP, the file's SWEEP_SETTINGS, the command line's overrides, and per run its
  name, arm, axis values, the overrides that reproduce it with normstudy.main, that command,
  its status as its training left it and, once it has records, its outcome by the failure rule;
  a search's record (normstudy.experiments.search_runner) when it bisected a field."""
  path = os.path.join(workdir, schema.SWEEP)
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
  declared = getattr(grid.module, "EXPERIMENT", None)
  experiment = None
  if declared is not None:
    experiment = {**declared.as_json(), **({"part": grid.part} if grid.part else {})}
  record = schema.SweepRecord(
      config=grid.spec, axes=grid.axes, axes_from_file=list(grid.file_axes),
      settings=grid.settings, overrides=dict(grid.overrides), runs=swept, search=search,
      experiment=experiment)
  rundir.write_json(path, record.as_json())
  return path
