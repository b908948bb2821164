"""When will my run overflow? Each series' headroom to float16's limit, its trend, and where
the trend reaches 0, with a 95% interval (normstudy.analysis.headroom_trend).

  python -m normstudy.forecast --workdir=RUN [--trend=log_step|step] [--since=STEP] [--out=DIR]
  python -m normstudy.forecast --workdir=DIR [--workdir=DIR2 ...] --validate [--out=OUT]

--workdir is a run's directory, or a directory of runs (each forecast in turn; repeat the flag
for more), local or gs://; a run that is still training can be read while it trains. The trend is fitted to the telemetry after
--since (default: the run's warm-up); with --out, the lines are also written to DIR/forecast.csv
(one row per run and series: headroom now, the trend and its interval, the crossing and its
interval; inf where never). --validate scores forecasts made at 10%, 25% and 50% of
every run's planned steps below the directories against what happened (concordance, interval
coverage, the fail-by-the-end call; both trends) and writes forecast_validation.csv and
forecasts.csv into --out (default: the first --workdir).
"""

import math
import os

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors

FLAGS = flags.FLAGS
# normstudy.analysis.headroom_trend's TRENDS (a test checks they agree): --help must not wait for the
# analysis stack's import.
TRENDS = ("log_step", "step")


def define_flags():
  flags.DEFINE_multi_string("workdir", None, "A run's directory, or a directory of runs "
                            "(repeatable).")
  flags.DEFINE_enum("trend", TRENDS[0], TRENDS, "The headroom's trend: a line in ln(step) "
                    "(the value grows as a power of the step) or in the step (exponentially).")
  flags.DEFINE_integer("since", None, "Fit the trend to telemetry after this step (default: "
                       "the run's warm-up).")
  flags.DEFINE_bool("validate", False, "Score forecasts made at 10%, 25% and 50% of each run "
                    "below --workdir against what happened (forecast_validation.csv, "
                    "forecasts.csv).")
  flags.DEFINE_string("out", None, "A directory for forecast.csv (with --validate: for its "
                      "tables; default the first --workdir).")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.since is not None and FLAGS.since < 0:
    raise errors.UserError(f"--since={FLAGS.since} is not allowed; allowed: a step >= 0")
  from normstudy.records import storage
  for workdir in FLAGS.workdir:
    storage.check_workdir(workdir)  # gs://: the scheme, the bucket, the endpoint, in one line
    if not storage.is_url(workdir) and not os.path.isdir(workdir):
      raise errors.UserError(f"--workdir={workdir} is not a directory (a run's, or one "
                             "holding runs)")
  if FLAGS.out is not None and "://" in FLAGS.out:
    raise errors.UserError(f"--out={FLAGS.out} is not allowed; allowed: a local directory (the "
                           "tables are small: copy them where you like)")
  if FLAGS.out is not None and os.path.exists(FLAGS.out) and not os.path.isdir(FLAGS.out):
    raise errors.UserError(f"--out={FLAGS.out} is a file; --out is the directory the tables "
                           "go into")
  from normstudy.analysis import runs as runs_lib  # pandas, once the command line is good
  loaded = {}
  for workdir in FLAGS.workdir:
    try:
      # gs://: the run files (records and configs, no checkpoints) copied to a local directory.
      loaded[workdir] = runs_lib.load_runs(runs_lib.localize(workdir))
    except runs_lib.NoRunsError as e:
      raise errors.UserError(str(e)) from None
    if not len(loaded[workdir]):
      raise errors.UserError(f"--workdir={workdir} holds no run (a directory with a "
                             "metrics.jsonl)")
  if FLAGS.validate:
    _validate(loaded)
  else:
    shown, made = 0, []
    for workdir, runs in loaded.items():
      count, rows = _forecast(workdir, runs)
      shown, made = shown + count, made + rows
    if not shown:
      raise errors.UserError(f"--workdir={','.join(FLAGS.workdir)}: no run has telemetry to "
                             "forecast from (train.telemetry_every > 0)")
    if FLAGS.out is not None:
      import pandas as pd
      os.makedirs(FLAGS.out, exist_ok=True)
      path = os.path.join(FLAGS.out, "forecast.csv")
      pd.DataFrame(made).to_csv(path, index=False)
      print(f"forecast: {path}")


def _forecast(workdir: str, loaded) -> tuple:
  """Prints each run's forecasts; returns (how many runs had telemetry, the forecasts as rows:
  run, series and the Forecast's fields)."""
  import dataclasses
  from normstudy.analysis import headroom_trend as forecast_lib
  from normstudy.analysis import headroom as headroom_lib
  rows, shown = [], 0
  for run, facts in loaded.runs.items():
    series = headroom_lib.run_series(loaded, run)
    name = _run_name(workdir, run)
    if series.empty:
      print(f"{name}: no telemetry (train.telemetry_every > 0 records the series)")
      continue
    since = FLAGS.since if FLAGS.since is not None else facts.warmup_steps
    last = int(series.step.max())
    least = series[(series.series == headroom_lib.LEAST) & (series.step == last)].iloc[0]
    state = (f"failed at step {facts.outcome.failed_at}" if facts.outcome.failed
             else f"{facts.status} at step {last:,}")
    print(f"{name} ({state}; telemetry after step {since:,}, trend in "
          f"{'ln(step)' if FLAGS.trend == 'log_step' else 'step'}): least headroom "
          f"{least.headroom:.1f} bits ({least.layer})")
    made = forecast_lib.run_forecasts(series, after=since, trend=FLAGS.trend)
    for forecast in made:
      print("  " + forecast_lib.describe(forecast))
      rows.append({"run": name, **dataclasses.asdict(forecast)})
    first = forecast_lib.earliest(made)
    if first is None:
      print(f"  fewer than {forecast_lib.MIN_POINTS} telemetry points after step {since:,}: "
            "no trend yet")
    elif math.isinf(first.crossing):
      print(f"  no series' trend reaches 0 (the earliest its interval allows: "
            f"{_when(min(f.early for f in made))})")
    else:
      planned = f" of {facts.num_steps:,} planned" if facts.num_steps else ""
      print(f"  first to reach 0: {first.series} at step {first.crossing:,.0f}{planned} "
            f"(95% interval {_when(first.early)} to {_when(first.late)})")
    shown += 1
  return shown, rows


def _run_name(workdir: str, run: str) -> str:
  """A run's path as the user gave its directory (a gs:// URL kept as one)."""
  if "://" in workdir:
    return workdir.rstrip("/") if run == "." else f"{workdir.rstrip('/')}/{run}"
  return os.path.normpath(os.path.join(workdir, run))


def _when(step: float) -> str:
  from normstudy.analysis import headroom_trend as forecast_lib
  return f"beyond {forecast_lib.HORIZON_CAP:.0e}" if math.isinf(step) else f"{step:,.0f}"


def _validate(loaded: dict) -> None:
  from normstudy.analysis import headroom_trend as forecast_lib
  from normstudy.analysis import headroom as headroom_lib
  outcomes = {}
  for workdir, runs in loaded.items():
    outcomes.update(_outcomes(workdir, runs, forecast_lib, headroom_lib))
  if not outcomes:
    raise errors.UserError(f"--workdir={','.join(FLAGS.workdir)}: no run has telemetry to "
                           "validate forecasts on")
  table, made = forecast_lib.validate(outcomes)
  out = FLAGS.out or FLAGS.workdir[0]
  os.makedirs(out, exist_ok=True)
  paths = {"validation": os.path.join(out, "forecast_validation.csv"),
           "forecasts": os.path.join(out, "forecasts.csv")}
  table.to_csv(paths["validation"], index=False)
  made.to_csv(paths["forecasts"], index=False)
  failed = sum(o.failed_at is not None for o in outcomes.values())
  print(f"forecasts of {len(outcomes)} runs ({failed} failed) made at "
        f"{', '.join(f'{f:.0%}' for f in forecast_lib.FRACTIONS)} of their planned steps:")
  print(table.to_string(index=False))
  for name, path in paths.items():
    print(f"{name}: {path}")


def _outcomes(workdir: str, loaded, forecast_lib, headroom_lib) -> dict:
  """{run's path: what happened to it} for the runs of one directory with telemetry."""
  outcomes = {}
  for run, facts in loaded.runs.items():
    rows = headroom_lib.run_series(loaded, run)
    loss = loaded.series(run, "loss")
    if rows.empty or not facts.num_steps or not len(loss):
      continue
    if not facts.outcome.failed and int(loss.index.max()) < facts.num_steps:
      continue  # still training or stopped early: what happens to it is not known yet
    outcomes[_run_name(workdir, run)] = forecast_lib.Outcome(
        rows=rows, failed_at=facts.outcome.failed_at if facts.outcome.failed else None,
        last_step=int(loss.index.max()), num_steps=int(facts.num_steps),
        warmup=int(facts.warmup_steps))
  return outcomes


if __name__ == "__main__":
  cli.run(main, define_flags)
