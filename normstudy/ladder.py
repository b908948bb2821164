"""The size ladder, trained, collected and analysed: how each arm's critical learning rate
moves with size, and whether the small rungs predict the largest.

  python -m normstudy.ladder --config=configs/ladder.py --workdir=DIR   # train, then analyse
  python -m normstudy.ladder --workdir=DIR [--target_layers=24 --target_d_model=1024]

With --config, the rungs of the file's EXPERIMENT's Ladder (normstudy.core.experiment: its
rungs, (num_layers, d_model) pairs, in each of its dtypes) are trained first, each a
critical-learning-rate search (its search) of the experiment's arms run as its own `normstudy.sweep`
into DIR/<dtype>/L<layers>_d<width>; DIR/ladder.json lists each rung's command, so one rung can be
re-run alone. Re-running resumes: a finished rung trains nothing again. Extra --sweep_arg flags
reach every rung's sweep (e.g. --sweep_arg=--workers=1). Then the analysis:
every directory below DIR holding an analysed critical-learning-rate search (critical_lr.csv and
sweep.json: `normstudy.sweep --search=...` then `normstudy.analyze`) is a rung; its size is
read from its runs' config. Writes into DIR: ladder.csv (per rung and arm: dtype, num_layers,
d_model, params, the critical learning rate and its interval), ladder_fit.csv (per arm, dtype
and axis: the slope of log critical rate on log size, the held-out largest rung, the
extrapolation to the target size), ladder_tests.csv (whether two arms' ratio changes with size)
and ladder.png (normstudy.analysis.ladder_report has the statistics).

A Ladder that declares learning_rates instead of a search (configs/ladder_sensitivity.py) trains
each rung as a sweep over that learning-rate grid; every directory below DIR holding an analysed
grid (runs.csv and sweep.json, no critical_lr.csv) is then a rung of Wortsman's LR sensitivity:
ladder_sensitivity.csv, ladder_sensitivity_tests.csv, ladder_sensitivity.png and
ladder_sensitivity.md (normstudy.analysis.ladder_sensitivity).
"""

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Directory whose subdirectories are the rungs' searches.")
  flags.DEFINE_string("config", None, "A ladder config file (configs/ladder.py): train its "
                      "rungs into --workdir before the analysis.")
  flags.DEFINE_list("dtypes", None, "With --config: only these of the file's Ladder's dtypes.")
  flags.DEFINE_multi_string("sweep_arg", [], "With --config: an argument for every rung's "
                            "normstudy.sweep (repeatable).")
  flags.DEFINE_integer("target_layers", 24, "The extrapolation's depth (MERT's: 24).")
  flags.DEFINE_integer("target_d_model", 1024, "The extrapolation's width (MERT's: 1024); its "
                       "MLP is 4x as wide.")
  flags.DEFINE_integer("target_steps", 100_000, "A headroom ladder's extrapolation: the step "
                       "(MERT's horizon: 100,000).")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  import os
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  for name in ("target_layers", "target_d_model", "target_steps"):
    if getattr(FLAGS, name) < 1:
      raise errors.UserError(f"--{name}={getattr(FLAGS, name)}: it must be an integer >= 1")
  from normstudy.experiments import ladder_runs
  if FLAGS.config is not None:
    _train(ladder_runs)
  elif FLAGS.dtypes is not None or FLAGS.sweep_arg:
    raise errors.UserError("--dtypes and --sweep_arg need --config=FILE (the ladder to train)")
  if not os.path.isdir(FLAGS.workdir):
    raise errors.UserError(f"--workdir={FLAGS.workdir} is not a directory")
  table = ladder_runs.ladder_table(FLAGS.workdir)
  sensitive = ladder_runs.sensitivity_rungs(FLAGS.workdir)
  from normstudy.analysis import headroom_ladder
  for name, path in headroom_ladder.analyze(FLAGS.workdir, FLAGS.target_d_model,
                                            FLAGS.target_layers, FLAGS.target_steps).items():
    print(f"{name}: {path}")
  if table.empty and not sensitive:
    raise errors.UserError(f"--workdir={FLAGS.workdir} holds no analysed search (a directory "
                           "with critical_lr.csv and sweep.json) and no analysed learning-rate "
                           "grid (runs.csv and sweep.json): run the rungs and normstudy.analyze "
                           "first (make ladder, make ladder-sensitivity)")
  if not table.empty:
    from normstudy.analysis import ladder_report as analysis
    model = ladder_runs.first_model(FLAGS.workdir)
    model.update(num_layers=FLAGS.target_layers, d_model=FLAGS.target_d_model,
                 d_ff=4 * FLAGS.target_d_model)
    targets = {"num_layers": FLAGS.target_layers, "d_model": FLAGS.target_d_model,
               "params": ladder_runs.parameters(model)}
    for name, path in analysis.analyze(table, targets, FLAGS.workdir,
                                       ladder_runs.search_rungs(FLAGS.workdir)).items():
      print(f"{name}: {path}")
    transfer = ladder_runs.recorded_transfer(FLAGS.workdir)
    if transfer is not None:
      from normstudy.analysis import transfer as transfer_analysis
      if not os.path.isfile(transfer["reference"]):
        raise errors.UserError(f"{FLAGS.workdir}/ladder.json compares with the sp ladder "
                               f"{transfer['reference']}, which is not a file (run from the "
                               "repository root, or make ladder)")
      import pandas as pd
      reference = transfer_analysis.with_own_controls(
          pd.read_csv(transfer["reference"]), table, set(transfer["arms"].values()))
      for name, path in transfer_analysis.analyze(
          table, reference, transfer["arms"], ladder_runs.arm_parametrizations(FLAGS.workdir),
          targets, FLAGS.workdir).items():
        print(f"{name}: {path}")
  if sensitive:
    from normstudy.analysis import ladder_sensitivity
    for name, path in ladder_sensitivity.analyze(sensitive, FLAGS.workdir).items():
      print(f"{name}: {path}")


def _train(ladder_runs) -> None:
  """Every rung of --config, checked (its file, --dtypes, the workdir) before anything is
  written, then trained in turn."""
  from normstudy.experiments import grid
  from normstudy.records import rundir
  declared = grid.load_experiment(FLAGS.config)
  parts = ladder_runs.ladder_parts(declared, FLAGS.config, grid.load_experiment)
  transfer = ladder_runs.transfer_spec(declared)
  heldout = ladder_runs.headroom_heldout(declared, FLAGS.config)
  declared = sorted({d for _, path, part in parts for d in ladder_runs.ladder_spec(part, path)["dtypes"]})
  unknown = [d for d in FLAGS.dtypes or () if d not in declared]
  if unknown:
    raise errors.UserError(f"--dtypes={','.join(FLAGS.dtypes)}: {', '.join(unknown)} is not "
                           f"among {FLAGS.config}'s Ladder's dtypes ({', '.join(declared)})")
  rundir.check_writable(FLAGS.workdir, "--workdir")
  rungs = []
  for name, path, part in parts:
    own = ladder_runs.ladder_spec(part, path)["dtypes"]
    chosen = [d for d in FLAGS.dtypes if d in own] if FLAGS.dtypes else None
    if chosen != []:
      rungs += ladder_runs.plan_rungs(path, part, chosen, name)
  fit = [r for r in rungs if (r.num_layers, r.d_model) not in heldout]
  held = [r for r in rungs if (r.num_layers, r.d_model) in heldout]
  ladder_runs.train_rungs(fit, FLAGS.workdir, tuple(FLAGS.sweep_arg), transfer=transfer,
                          recorded=rungs)
  if held:
    from normstudy.analysis import headroom_ladder
    points = [(r.d_model, r.num_layers, declared.ladder.rung_steps(r.num_layers, r.d_model))
              for r in held]
    prediction = headroom_ladder.write_prediction(FLAGS.workdir, points)
    print(f"[ladder] the held-out rungs' headroom, predicted before they train "
          f"({headroom_ladder.PREDICTION}, {len(prediction)} rows)", flush=True)
    ladder_runs.train_rungs(held, FLAGS.workdir, tuple(FLAGS.sweep_arg), transfer=transfer,
                            recorded=rungs)


if __name__ == "__main__":
  cli.run(main, define_flags)
