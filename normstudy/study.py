"""Run every variant a config file lists, then the analysis.

  python -m normstudy.study --config=configs/seed_figure.py --workdir=DIR [--config.a.b=value ...]

A config file lists its variants as data, `VARIANTS = {name: (label, {dotted.field: value})}`;
each trains into DIR/<variant> with its settings, then the command-line overrides, applied.
Variants that differ only in data fields (learning rate, clip, seed, ...) train in one program
(normstudy.train). A variant that halts is a result: the others go on, the figure shows where it
stopped, and the command exits 0. Finished and halted runs are skipped, unfinished ones resumed.
"""

import importlib.util
import os

from absl import flags
from absl import logging
from ml_collections import config_flags

from normstudy import cli
from normstudy import config as config_lib
from normstudy import errors
from normstudy import rundir
from normstudy import train

FLAGS = flags.FLAGS


def load_config_module(path: str):
  if not os.path.isfile(path):
    raise errors.UserError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location("normstudy_config_file", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def variant_configs(path: str, overrides: dict, module=None) -> dict:
  """{variant: config} for every variant of the file, each with the command-line overrides."""
  module = module or load_config_module(path)
  if not getattr(module, "VARIANTS", None):
    raise errors.UserError(f"{path} lists no VARIANTS; normstudy.study runs a file's variants")
  configs = {}
  for variant in module.VARIANTS:
    config = module.get_config(variant)
    config_lib.apply_overrides(config, overrides)
    config.lock()
    configs[variant] = config
  return configs


def run_study(path: str, workdir: str, overrides: dict, allow_config_change: bool = False):
  """Trains every variant into workdir/<variant>, then analyses the study; returns the
  analysis outputs {name: path}."""
  from normstudy import analysis  # the analysis package needs no training stack
  configs = variant_configs(path, overrides)
  runs = [train.Run(variant, config, os.path.join(workdir, variant))
          for variant, config in configs.items()]
  for group in train.group_runs(runs):  # every run checked before anything is written
    train.preflight(group, train.program_checkpoints(workdir, group), allow_config_change)
  rundir.ensure_directory(workdir)
  with train.lock(workdir):
    rundir.write_json(os.path.join(workdir, rundir.STUDY), {
        "config": path, "variants": list(configs), "overrides": dict(overrides)})
    statuses = train.train_programs(runs, workdir, allow_config_change)
    for name, status in statuses.items():
      logging.info("%s: %s", name, status)
    return analysis.analyze(workdir)


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
    file, variant = path.split(":", 1)
    raise errors.UserError(
        f"normstudy.study runs every variant of a config file; drop ':{variant}' from "
        f"--config={path} (normstudy.main --config={path} runs that one variant)")
  outputs = run_study(path, FLAGS.workdir, config_flags.get_override_values(FLAGS["config"]),
                      FLAGS.allow_config_change)
  for name, out in outputs.items():
    print(f"{name}: {out}")


if __name__ == "__main__":
  cli.run(main, define_flags)
