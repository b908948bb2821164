"""The techniques table: each technique's critical learning rate against its baseline's, in
every dtype searched, with its cost (`make techniques`).

  python -m normstudy.techniques --workdir=DIR [--config=configs/techniques.py]

DIR holds one analysed search per dtype (any subdirectory with critical_lr.csv: `normstudy.sweep
--config=configs/techniques.py --search=...`, which analyses itself; its dtype read from its
runs) and, optionally, DIR/recipe: the arms at the recipe's learning rate (their eval loss and
step time). Each technique's baseline comes from the config file's EXPERIMENT (its
techniques.baselines). Writes DIR/techniques.csv and DIR/techniques.png
(normstudy.analysis.techniques_report has the statistics).

With a config whose techniques name spike handlers (configs/spike_handling.py) and a DIR that is
an analysed grid rather than searches (runs.csv, `make spike-handling`), it writes
DIR/spike_handling.csv alone: each technique against its baseline on runs of the same learning
rate and seed (the measures its techniques name: "recovery" by default, "failure" for runs that
spike and fail, configs/spike_failure.py).
"""

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors
from normstudy.records import schema

FLAGS = flags.FLAGS
RECIPE = "recipe"


def define_flags():
  flags.DEFINE_string("workdir", None, "Directory holding a search per dtype and recipe/.")
  flags.DEFINE_string("config", "configs/techniques.py",
                      "The config file whose EXPERIMENT's techniques name each technique's "
                      "baseline.")
  flags.mark_flags_as_required(["workdir"])


def searches(workdir: str) -> dict:
  """{dtype: directory} of every analysed search directly below `workdir`, in name order;
  UserError when two hold the same dtype."""
  import os
  import pandas as pd
  found = {}
  for name in sorted(os.listdir(workdir)):
    directory = os.path.join(workdir, name)
    if name == RECIPE or not os.path.isfile(os.path.join(directory, schema.CRITICAL_LR)):
      continue
    dtypes = pd.read_csv(os.path.join(directory, schema.RUN_TABLE)).dtype.dropna().unique()
    if len(dtypes) != 1:
      raise errors.UserError(f"{directory} holds runs of dtypes {list(dtypes)}; a search here "
                             "is one dtype's")
    if dtypes[0] in found:
      raise errors.UserError(f"{directory} and {found[dtypes[0]]} both hold {dtypes[0]} "
                             "searches; keep one")
    found[dtypes[0]] = directory
  return found


def main(argv):
  import os
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not os.path.isdir(FLAGS.workdir):
    raise errors.UserError(f"--workdir={FLAGS.workdir} is not a directory")
  from normstudy.experiments import grid
  declared = grid.load_experiment(FLAGS.config).techniques
  if declared is None or not isinstance(declared.baselines, dict) or not declared.baselines:
    raise errors.UserError(f"--config={FLAGS.config} declares no techniques against baselines "
                           "(EXPERIMENT's techniques=Techniques(baselines={technique: baseline "
                           "arm}), configs/techniques.py shows it)")
  baselines = declared.baselines
  found = searches(FLAGS.workdir)
  handlers = tuple(declared.spike_handling)
  from normstudy.analysis import techniques_report
  measure_set = declared.measures
  if measure_set not in techniques_report.MEASURE_SETS:
    raise errors.UserError(f"--config={FLAGS.config}: Techniques' measures={measure_set!r} is "
                           f"not allowed; allowed: {', '.join(techniques_report.MEASURE_SETS)}")
  if not found and handlers and os.path.isfile(os.path.join(FLAGS.workdir, schema.RUN_TABLE)):
    # A grid of long runs (configs/spike_handling.py, configs/spike_failure.py): the
    # spike-handling comparison alone, with the measures the file names.
    for name, path in techniques_report.analyze_spike_grid(
        FLAGS.workdir, baselines, handlers, FLAGS.workdir,
        techniques_report.MEASURE_SETS[measure_set]).items():
      print(f"{name}: {path}")
    return
  if not found:
    raise errors.UserError(f"--workdir={FLAGS.workdir} holds no analysed search (a "
                           "subdirectory with critical_lr.csv): run make techniques")
  recipe = os.path.join(FLAGS.workdir, RECIPE)
  recipe = recipe if os.path.isfile(os.path.join(recipe, "speed.csv")) else None
  for name, path in techniques_report.analyze(found, recipe, baselines, FLAGS.workdir,
                                       handlers).items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  cli.run(main, define_flags)
