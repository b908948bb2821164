"""Run every variant a config file lists, then the analysis.

  python -m normstudy.study --config=configs/seed_figure.py --workdir=DIR [--config.a.b=value ...]

A config file lists its variants as data, `VARIANTS = {name: (label, {dotted.field: value})}`;
each trains into DIR/<variant> with its settings, then the command-line overrides, applied.
Variants that differ only in data fields (learning rate, clip, seed, ...) train in one program
(normstudy.train). A variant that halts is a result: the others go on, the figure shows where it
stopped, and the command exits 0. Finished and halted runs are skipped, unfinished ones resumed.
"""

import os

from absl import flags
from absl import logging
from ml_collections import config_flags

from normstudy import cli
from normstudy import errors
from normstudy import grid
from normstudy import rundir
from normstudy import train

FLAGS = flags.FLAGS


def run_grid(path: str, variant, axes: dict, workdir: str, overrides: dict,
             allow_config_change: bool = False, module=None,
             max_runs: int = train.MAX_RUNS_PER_PROGRAM):
  """Trains every point of a grid into `workdir` (checked before anything is written), then
  analyses it. Returns (points, statuses by point name, analysis outputs)."""
  from normstudy import analysis  # the analysis package needs no training stack
  points = grid.points(path, variant, axes, overrides, module, sweep=bool(axes))
  runs = [train.Run(p.name, p.config, os.path.join(workdir, p.name), p.arm, p.overrides)
          for p in points]
  for group in train.group_runs(runs, max_runs):
    train.preflight(group, train.program_checkpoints(workdir, group), allow_config_change)
  rundir.ensure_directory(workdir)
  with train.lock(workdir):
    if axes:
      grid.write_sweep(workdir, axes, points, {})
    else:
      rundir.write_json(os.path.join(workdir, rundir.STUDY), {
          "config": path, "variants": [p.name for p in points], "overrides": dict(overrides)})
    train.train_programs(runs, workdir, allow_config_change, max_runs)
    df = analysis.load_runs(workdir)  # read once, for the analysis and the statuses
    outputs = analysis.analyze(workdir, df=df)
    statuses = analysis.statuses(workdir, df)
    if axes:
      outputs["sweep"] = grid.write_sweep(workdir, axes, points, statuses)
  for point in points:
    logging.info("%s: %s", point.name, statuses.get(point.name, "missing"))
  return points, statuses, outputs


def run_study(path: str, workdir: str, overrides: dict, allow_config_change: bool = False):
  """Trains every variant of a config file into workdir/<variant>, then analyses the study;
  returns the analysis outputs {name: path}."""
  module = grid.load_config_module(path)
  if not getattr(module, "VARIANTS", None):
    raise errors.UserError(f"{path} lists no VARIANTS; normstudy.study runs a file's variants")
  return run_grid(path, None, {}, workdir, overrides, allow_config_change, module)[2]


def define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Config file listing VARIANTS (no :variant).", lock_config=True)
  flags.DEFINE_string("workdir", None, "Study directory; one subdirectory per variant.")
  flags.DEFINE_bool("allow_config_change", False,
                    "Continue runs whose saved config differs in model, optimizer or data.")
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  path = config_flags.get_config_filename(FLAGS["config"])
  if ":" in path and os.path.isfile(path.split(":", 1)[0]):
    variant = path.split(":", 1)[1]
    raise errors.UserError(
        f"normstudy.study runs every variant of a config file; drop ':{variant}' from "
        f"--config={path} (normstudy.main --config={path} runs that one variant)")
  outputs = run_study(path, FLAGS.workdir, config_flags.get_override_values(FLAGS["config"]),
                      FLAGS.allow_config_change)
  for name, out in outputs.items():
    print(f"{name}: {out}")


if __name__ == "__main__":
  cli.run(main, define_flags)
