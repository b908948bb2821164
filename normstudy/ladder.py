"""The size ladder, collected and analysed: how each arm's critical learning rate moves with
size, and whether the small rungs predict the largest.

  python -m normstudy.ladder --workdir=DIR [--target_layers=24 --target_d_model=1024]

Every directory below DIR holding an analysed critical-learning-rate search (critical_lr.csv and
sweep.json: `normstudy.sweep --search=...` then `normstudy.analyze`) is a rung; its size is
read from its runs' config. Writes into DIR: ladder.csv (per rung and arm: dtype, num_layers,
d_model, params, the critical learning rate and its interval), ladder_fit.csv (per arm, dtype
and axis: the slope of log critical rate on log size, the held-out largest rung, the
extrapolation to the target size), ladder_tests.csv (whether two arms' ratio changes with size)
and ladder.png (normstudy.analysis.ladder has the statistics).
"""

from absl import flags

from normstudy import cli
from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Directory whose subdirectories are the rungs' searches.")
  flags.DEFINE_integer("target_layers", 24, "The extrapolation's depth (MERT's: 24).")
  flags.DEFINE_integer("target_d_model", 1024, "The extrapolation's width (MERT's: 1024); its "
                       "MLP is 4x as wide.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  import os
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  for name in ("target_layers", "target_d_model"):
    if getattr(FLAGS, name) < 1:
      raise errors.UserError(f"--{name}={getattr(FLAGS, name)}: it must be an integer >= 1")
  if not os.path.isdir(FLAGS.workdir):
    raise errors.UserError(f"--workdir={FLAGS.workdir} is not a directory")
  from normstudy.analysis import ladder as analysis
  from normstudy.experiments import ladder
  table = ladder.ladder_table(FLAGS.workdir)
  if table.empty:
    raise errors.UserError(f"--workdir={FLAGS.workdir} holds no analysed search (a directory "
                           "with critical_lr.csv and sweep.json): run the rungs' searches and "
                           "normstudy.analyze first (make ladder)")
  model = ladder.first_model(FLAGS.workdir)
  model.update(num_layers=FLAGS.target_layers, d_model=FLAGS.target_d_model,
               d_ff=4 * FLAGS.target_d_model)
  targets = {"num_layers": FLAGS.target_layers, "d_model": FLAGS.target_d_model,
             "params": ladder.parameters(model)}
  for name, path in analysis.analyze(table, targets, FLAGS.workdir).items():
    print(f"{name}: {path}")


if __name__ == "__main__":
  cli.run(main, define_flags)
