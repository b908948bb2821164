"""Run every variant a config file lists, then the analysis.

  python -m normstudy.study --config=configs/seed_figure.py --workdir=DIR [--config.a.b=value ...]

Each variant trains into DIR/<variant> with the overrides applied; finished runs are skipped,
unfinished ones resumed. Then DIR/loss_comparison.png and DIR/summary.csv are written.
"""

import importlib.util
import json
import os

from absl import flags
from absl import logging
from ml_collections import config_flags

from normstudy import analysis
from normstudy import cli
from normstudy import errors
from normstudy import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file listing VARIANTS (no :variant).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory; one subdirectory per variant.")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False,
    "Continue runs whose saved config differs in model, optimizer or data.")
flags.mark_flags_as_required(["config", "workdir"])


def load_config_module(path: str):
  if not os.path.isfile(path):
    raise errors.UserError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location("normstudy_study_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not getattr(module, "VARIANTS", None):
    raise errors.UserError(f"{path} lists no VARIANTS; normstudy.study runs a file's variants")
  return module


def variant_configs(path: str, overrides: dict):
  """{variant: config} for every variant of the file, each with the command-line overrides."""
  module = load_config_module(path)
  configs = {}
  for variant in module.VARIANTS:
    config = module.get_config(variant)
    try:
      config.update_from_flattened_dict(overrides)
    except (KeyError, AttributeError, TypeError) as e:
      raise errors.UserError(f"override does not fit variant {variant}: {e}") from None
    config.lock()
    configs[variant] = config
  return configs


def finished_step(run_dir: str):
  """The newest checkpointed step of a run directory, or None."""
  ckpt_dir = os.path.join(run_dir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    return None
  steps = [int(name) for name in os.listdir(ckpt_dir) if name.isdigit()]
  return max(steps, default=None)


def run_study(path: str, workdir: str, overrides: dict, allow_config_change: bool = False):
  configs = variant_configs(path, overrides)
  for variant, config in configs.items():  # every variant checked before any starts
    train.preflight(config, os.path.join(workdir, variant), allow_config_change)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, analysis.STUDY_FILE), "w", encoding="utf-8") as f:
    json.dump({"config": path, "variants": list(configs), "overrides": {
        k: v for k, v in overrides.items()}}, f, indent=2, default=str)
  for i, (variant, config) in enumerate(configs.items(), start=1):
    run_dir = os.path.join(workdir, variant)
    if finished_step(run_dir) == config.train.num_steps:
      logging.info("[%d/%d] %s: finished earlier, skipped", i, len(configs), variant)
      continue
    logging.info("[%d/%d] %s: %s", i, len(configs), variant, config.label)
    train.train_and_evaluate(config, run_dir, allow_config_change)
  outputs = analysis.analyze(workdir)
  for name, out in outputs.items():
    print(f"{name}: {out}")


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  path = config_flags.get_config_filename(flags.FLAGS["config"])
  run_study(path, _WORKDIR.value, config_flags.get_override_values(flags.FLAGS["config"]),
            _ALLOW_CONFIG_CHANGE.value)


if __name__ == "__main__":
  cli.run(main)
