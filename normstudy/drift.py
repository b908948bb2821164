"""Failure as a drift: time to failure as the quantity, a law over the horizon, a held-out
horizon predicted before it is run, and the answer at MERT's 100K steps (`make drift`).

  python -m normstudy.drift --config=configs/drift.py --workdir=DIR [--workers=N]
  python -m normstudy.drift --workdir=DIR        # the analysis alone, from what DIR holds
  python -m normstudy.drift --workdir=docs/drift --from_tables   # the edge law's forms alone

With --config, in order (re-running resumes: finished sweeps train nothing again):
  1. DIR/drift.json: the experiment the file declares (normstudy.experiments.drift_runs);
  2. the fit: every arm over the experiment's axes (learning rates and seeds) for its Drift's
     num_steps, one `normstudy.sweep` into DIR/fit;
  3. the prediction: each arm's law fitted (normstudy.analysis.law), and for each held-out
     arm the rates where it predicts the Heldout's fractions of runs failing by its steps, with
     the predicted fractions and lr*(steps), written to DIR/horizon_prediction.csv
     before any held-out run trains (never rewritten);
  4. the held-out runs at those rates, one sweep per arm into DIR/heldout/<arm>;
  5. the analysis (normstudy.analysis.horizon_report): law_fit.csv, critical_lr_law.csv,
     law_tests.csv, horizon_heldout.csv, drift.csv and its summaries, drift.png, drift.md.
Every sweep's command is recorded in drift.json. After the analysis, and alone with
--from_tables (from DIR's drift.csv and critical_lr_law.csv, e.g. the committed docs/drift):
the edge law's forms judged out of sample (edge_law_oos.csv), each form's lr*(H)
(critical_lr_forms.csv), their spread in critical_lr_law.csv, and margin.csv against
--best_rates (normstudy.analysis.edge_law).
"""

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors

FLAGS = flags.FLAGS
# The seed figure's sensitivity sweep (make sensitivity): each arm's best final eval loss over
# 1e-3 .. 3e-1 and the range of rates within 0.1 nats of it, committed.
BEST_RATES = "docs/sensitivity/summary.csv"


def define_flags():
  flags.DEFINE_string("workdir", None, "The experiment's directory.")
  flags.DEFINE_string("config", None, "A drift experiment file (configs/drift.py): train it "
                      "into --workdir before the analysis.")
  flags.DEFINE_multi_string("sweep_arg", [], "With --config: an argument for every sweep it runs "
                            "(repeatable), e.g. --sweep_arg=--config.model.d_model=32.")
  flags.DEFINE_bool("from_tables", False, "Only the edge law's forms, spread and margin, from "
                    "--workdir's drift.csv and critical_lr_law.csv (a committed drift "
                    "directory, without its runs).")
  flags.DEFINE_string("best_rates", BEST_RATES, "A learning-rate sweep's summary.csv (arm, "
                      "best_lr, lr_range_low, lr_range_high): margin.csv's best-learning rates; "
                      "'' for none.")
  cli.define_workers_flag()
  flags.declare_key_flag("workers")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  import os
  import time
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  cli.check_workers(FLAGS.workers)
  best_rates = FLAGS.best_rates or None
  if best_rates is not None and not os.path.isfile(best_rates):
    raise errors.UserError(f"--best_rates={best_rates} is not a file (a learning-rate sweep's "
                           "summary.csv, e.g. docs/sensitivity/summary.csv; '' for none)")
  start = time.monotonic()
  if FLAGS.from_tables:
    _from_tables(best_rates)
    return
  if FLAGS.config is not None:
    _train()
  elif FLAGS.sweep_arg:
    raise errors.UserError("--sweep_arg needs --config=FILE (the experiment to train)")
  elif not os.path.isdir(FLAGS.workdir):
    raise errors.UserError(f"--workdir={FLAGS.workdir} is not a directory (train it first: "
                           "--config=configs/drift.py)")
  from normstudy.analysis import horizon_report
  from normstudy.analysis import runs as runs_lib
  print("[drift] the analysis: each arm's law and its intervals, the tests between arms (2000 "
        "permutations a pair) and the held-out test's bootstrap (1000 draws an arm); about 2 "
        "minutes on 2 cores", flush=True)
  try:
    outputs = horizon_report.analyze(FLAGS.workdir, best_rates)
  except runs_lib.NoRunsError as e:
    raise errors.UserError(str(e)) from None
  for name, path in outputs.items():
    print(f"{name}: {path}")
  print(f"[drift] done in {time.monotonic() - start:.0f}s")


def _from_tables(best_rates) -> None:
  import os
  if FLAGS.config is not None:
    raise errors.UserError("--from_tables re-derives from a drift directory's tables; drop "
                           "--config")
  missing = [name for name in ("drift.csv", "critical_lr_law.csv")
             if not os.path.isfile(os.path.join(FLAGS.workdir, name))]
  if missing:
    raise errors.UserError(f"--workdir={FLAGS.workdir} holds no {' and no '.join(missing)} "
                           "(a drift directory: make drift, or docs/drift)")
  from normstudy.analysis import edge_law
  print("[drift] the edge law's forms fitted to each arm and each horizon's censored runs; "
        "about 20 s on 2 cores", flush=True)
  for name, path in edge_law.write(FLAGS.workdir, best_rates).items():
    print(f"{name}: {path}")


def _train() -> None:
  """The experiment checked and recorded before anything trains, then the fit, the prediction
  and the held-out runs (module docstring)."""
  from normstudy.analysis import horizon_report
  from normstudy.experiments import drift_runs
  from normstudy.experiments import grid
  from normstudy.records import rundir
  plan = drift_runs.experiment(FLAGS.config, grid.load_experiment(FLAGS.config))
  rundir.check_writable(FLAGS.workdir, "--workdir")
  plan = drift_runs.write_plan(FLAGS.workdir, plan)
  extra = tuple(FLAGS.sweep_arg)
  drift_runs.train_fit(plan, FLAGS.workdir, FLAGS.workers, extra)
  prediction = horizon_report.predict(FLAGS.workdir)
  print("[drift] the held-out prediction (horizon_prediction.csv, written before the held-out "
        "runs):")
  print(prediction.to_string(index=False))
  drift_runs.train_heldout(plan, FLAGS.workdir, drift_runs.rates_of(prediction), FLAGS.workers,
                           extra)


if __name__ == "__main__":
  cli.run(main, define_flags)
