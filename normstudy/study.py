"""Run every arm of a config file's experiment, then the analysis.

  python -m normstudy.study --config=configs/seed_figure.py --workdir=DIR [--seeds=0,1,2]
      [--config.a.b=value ...]

A config file's EXPERIMENT lists its arms as data, `arms={name: (label, {dotted.field: value})}`
(normstudy.core.experiment); each of its study_arms (default: all) trains into DIR/<arm> with
its settings, then the command-line overrides, applied.
Variants that differ only in per-run fields (learning rate, clip, seed, ...) train in one program
(normstudy.experiments.planning). A variant that halts is a result: the others go on, the figure
shows where it stopped, and the command exits 0. Finished and halted runs are skipped, unfinished
ones resumed. With --seeds each variant trains once per seed (DIR/<variant>/seed<k>; an arm's
seeds share one program), the figure draws each arm's median and range over its seeds, and
arms.csv gives each arm's figures as median and range (sweep.json: each run's command).
"""

import os

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags
from ml_collections import config_flags

from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file(
      "config", None, "Config file whose EXPERIMENT lists the arms (no :arm).", lock_config=True)
  flags.DEFINE_string("workdir", None, "Study directory; one subdirectory per variant.")
  flags.DEFINE_bool("allow_config_change", False,
                    "Continue runs whose saved config differs in model, optimizer or data.")
  flags.DEFINE_list("seeds", [], "Train each variant once per seed (e.g. 0,1,2; default: the "
                    "file's EXPERIMENT.seeds): each arm drawn "
                    "as the median and range over them. Default: each variant once, at its "
                    "config's train.seed.")
  cli.define_workers_flag()
  cli.define_print_config_flag()
  flags.declare_key_flag("print_config")  # defined in normstudy.cli; listed in --help
  flags.declare_key_flag("workers")  # defined in normstudy.cli; listed in this command's --help
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
  from normstudy.experiments import grid  # the model stack, once --help is past
  declared = grid.load_experiment(path)
  if not declared.arms:
    raise errors.UserError(f"{path}: EXPERIMENT lists no arms; normstudy.study runs a file's "
                           "arms")
  cli.check_workers(FLAGS.workers)
  if FLAGS["seeds"].present and not FLAGS.seeds:  # `--seeds=` is no seed, not every variant
    raise errors.UserError("--seeds= names no seed; allowed: distinct integers >= 0, e.g. "
                           "--seeds=0,1,2 (leave the flag out for the file's own seeds)")
  seeds = _seeds(FLAGS.seeds if FLAGS["seeds"].present
                 else [str(seed) for seed in declared.seeds])
  from normstudy.records import storage
  storage.check_workdir(FLAGS.workdir)
  from normstudy import analysis
  from normstudy.experiments import planning  # the training stack, once the command line is good
  spec = grid.Grid(path, None, {"train.seed": seeds} if seeds else {},
                   config_flags.get_override_values(FLAGS["config"]), declared, study=True)
  if FLAGS.print_config:
    print(cli.runs_config_text(spec.runs(FLAGS.workdir)))
    return
  with storage.staged(FLAGS.workdir) as workdir:  # gs://: through a local stage
    plan = planning.plan(spec, workdir, FLAGS.allow_config_change, workers=FLAGS.workers)
    print("\n".join(cli.grid_config_changes(plan.runs, set())), flush=True)
    _, outputs = planning.run_grid(plan, analysis.analyze)
    outputs = {name: storage.remote(out) for name, out in outputs.items()}
  for name, out in outputs.items():
    print(f"{name}: {out}")


def _seeds(values: list) -> list:
  """--seeds as distinct integers >= 0; UserError otherwise."""
  allowed = "allowed: distinct integers >= 0, e.g. --seeds=0,1,2"
  try:
    seeds = [int(v) for v in values]
  except ValueError:
    raise errors.UserError(f"--seeds={','.join(values)} is not allowed; {allowed}") from None
  if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
    raise errors.UserError(f"--seeds={','.join(values)} is not allowed; {allowed}")
  return seeds


if __name__ == "__main__":
  cli.run(main, define_flags)
