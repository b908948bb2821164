"""The runs of a study or a sweep: a config file's variants (arms) times the sweep's axes.

  arms   the one config named by --config=FILE:VARIANT; else the file's variants: for
         normstudy.study its STUDY_VARIANTS (default: all of VARIANTS), for normstudy.sweep its
         SWEEP_VARIANTS (default: all of VARIANTS); a file without VARIANTS is one arm
  axes   {dotted.field: [values]}: the file's SWEEP (if it declares one), updated by --axis flags

A file may also declare SWEEP_SETTINGS, {dotted.field: value} applied to every run of a sweep of
it before the command line's overrides (shorter runs, sparser logs: what makes a grid of many runs
affordable).

Each grid point is one run: the arm's config with the command-line overrides, then the point's
values, applied through `config.override` (the same typed assignment as the command line). A
run's directory is `<workdir>/<arm>/<point>` (or `<workdir>/<point>` for a single arm, and
`<workdir>/<arm>` without axes), its point named from the axes (`lr0.001_seed1`), and its label
the arm's label plus the point. `normstudy.train.train_programs` then groups the runs into
programs: points that differ only in data fields (learning rate, seed, clip, ...) share one.
"""

import ast
import dataclasses
import importlib.util
import itertools
import os

from normstudy import config as config_lib
from normstudy import errors
from normstudy import rundir

# Short names of common axes in run directory names; others use the field's last part.
SHORT_NAMES = {"optimizer.learning_rate": "lr", "optimizer.clip_norm": "clip",
               "optimizer.weight_decay": "wd", "optimizer.warmup_steps": "warmup",
               "train.seed": "seed", "model.num_layers": "layers", "model.d_model": "width"}


@dataclasses.dataclass
class Point:
  """One run of the grid: its relative name, arm, the axis values it sets, and its config."""
  name: str
  arm: str
  overrides: dict
  config: object


def load_config_module(path: str):
  if not os.path.isfile(path):
    raise errors.UserError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location("normstudy_config_file", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


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


def _short(field: str) -> str:
  return SHORT_NAMES.get(field, field.split(".")[-1])


def _format(value) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


def point_name(values: dict) -> str:
  """'lr0.001_seed1' for {"optimizer.learning_rate": 0.001, "train.seed": 1}."""
  parts = []
  for field, value in values.items():
    text = _format(value)
    parts.append(f"{_short(field)}{text}" if isinstance(value, (int, float)) and not isinstance(
        value, bool) else f"{_short(field)}-{text}")
  return "_".join(parts)


def point_label(values: dict) -> str:
  return ", ".join(f"{_short(field)}={_format(value)}" for field, value in values.items())


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
  """The file's SWEEP axes, updated by --axis flags (a flag replaces a file axis of its field)."""
  axes = {field: list(values) for field, values in getattr(module, "SWEEP", {}).items()}
  for text in axis_flags:
    field, values = parse_axis(text)
    axes[field] = values
  for field, values in axes.items():
    if len(set(map(repr, values))) != len(values):
      raise errors.UserError(f"axis {field} repeats a value: {values}")
  return axes


def points(path: str, variant, axes: dict, overrides: dict, module=None,
           sweep: bool = False) -> list:
  """Every run of the grid: arms x the product of the axes, in order. For a sweep, the file's
  SWEEP_SETTINGS apply first, then `overrides` (the command line's), then the point's values."""
  module = module or load_config_module(path)
  arms = arms_of(path, variant, module, sweep)
  settings = dict(getattr(module, "SWEEP_SETTINGS", {})) if sweep else {}
  grid = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())] or [{}]
  out = []
  for arm, get_config in arms.items():
    for values in grid:
      config = get_config()
      config_lib.apply_overrides(config, settings)
      config_lib.apply_overrides(config, overrides)
      for field, value in values.items():
        config_lib.override(config, field, value)
      if values:
        config.label = f"{config.label or '{auto}'} | {point_label(values)}"
      config.lock()
      if len(arms) > 1 or variant is not None and not values:
        name = f"{arm}/{point_name(values)}" if values else arm
      else:
        name = point_name(values) or arm
      out.append(Point(name, arm, values, config))
  return out


def write_sweep(workdir: str, axes: dict, points_: list, statuses: dict) -> str:
  """DIR/sweep.json: {"axes": {...}, "runs": [{"name", "arm", "overrides", "status"}, ...]}."""
  path = os.path.join(workdir, rundir.SWEEP)
  rundir.write_json(path, {
      "axes": axes,
      "runs": [{"name": p.name, "arm": p.arm, "overrides": p.overrides,
                "status": statuses.get(p.name, "running")} for p in points_],
  })
  return path
