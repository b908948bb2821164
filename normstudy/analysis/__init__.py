"""Turn run directories into figures, a summary table and written observations.

  df = load_runs("runs/seed_figure")      # long form: run, label, step, metric, value
  plot_comparison(df, "fig.png")          # loss (+ eval, entropy floor) and the fp16 loss scale
  summarize(df)                           # one row per run, with its status
  analyze("runs/seed_figure")             # everything above, written into the directory

Modules: `runs` (loading), `detectors` (spikes, divergence, loss-scale collapse), `report`
(summary and prose), `plots` (figures), `sensitivity` (learning-rate sweeps), `survival`
(failure against learning rate, the critical learning rate), `speed` (eval loss over seeds at
one learning rate), `stats` (Fisher's exact test, Welch's t-test, the logistic fit, the
likelihood-ratio test; every comparison's wording). Needs numpy, pandas and matplotlib, not the training
stack, so a notebook can install normstudy without replacing its jax or TensorFlow. The command
is `python -m normstudy.analyze`.
"""

import os

from normstudy.analysis.detectors import divergence_step
from normstudy.analysis.detectors import observe
from normstudy.analysis.detectors import scale_collapses
from normstudy.analysis.detectors import spikes
from normstudy.analysis.plots import DEFAULT_SMOOTHING
from normstudy.analysis.plots import plot_comparison
from normstudy.analysis.plots import plot_layers
from normstudy.analysis.report import compare_runs
from normstudy.analysis.report import describe_run
from normstudy.analysis.report import summarize
from normstudy.analysis.report import write_observations
from normstudy.analysis.runs import NoRunsError
from normstudy.analysis.runs import layer_values
from normstudy.analysis.runs import load_runs
from normstudy.analysis.runs import localize
from normstudy.analysis.runs import series
from normstudy.analysis.runs import smooth
from normstudy.analysis import sensitivity
from normstudy.analysis import sensitivity_plots
from normstudy.analysis import speed
from normstudy.analysis import stats
from normstudy.analysis import survival

# Above this many runs, per-step figures and per-run prose are unreadable: a sweep is read
# through its sensitivity figures and tables instead.
MAX_RUNS_PER_FIGURE = 12


def statuses(workdir: str, df=None) -> dict:
  """{run: status} of every run below `workdir` (finished, halted, diverged, preempted,
  running), as the summary judges them; `df`: the runs already loaded from it."""
  df = load_runs(workdir) if df is None else df
  if df.empty:
    return {}
  summary = summarize(df)
  return dict(zip(summary.run, summary.status))


def analyze(workdir: str, smoothing: float = DEFAULT_SMOOTHING, df=None) -> dict:
  """Writes the analysis of every run below `workdir` into it; returns the paths written.

  A study: loss_comparison.png (+ .svg), summary.csv (one row per run), observations.md and, with
  telemetry, layers_<metric>.png. A learning-rate sweep (runs that vary
  optimizer.learning_rate): lr_sensitivity.png, lr_attn_logit.png, deaths.png, summary.csv (one
  row per arm: sensitivity.summarize), deaths.csv (how runs die: sensitivity.deaths), runs.csv
  (one row per run, as a study's summary.csv, plus the sweep's columns), survival.csv,
  survival_tests.csv and survival.png (analysis.survival) and observations.md led by survival
  and sensitivity. A sweep of seeds at one learning rate: speed.csv and speed.png
  (analysis.speed). The per-step figures only when there are few enough runs to read them.
  """
  if not os.path.isdir(workdir):
    raise NoRunsError(f"{workdir!r} is not a directory")
  df = load_runs(workdir) if df is None else df  # `df`: the runs already loaded from it
  if df.empty:
    raise NoRunsError(f"no run with a metrics.jsonl below {workdir!r}")
  summary = summarize(df)
  outputs = {}
  extra = []
  table = os.path.join(workdir, "summary.csv")
  if sensitivity.is_sweep(df):
    runs = sensitivity.table(df, summary)
    by_arm = sensitivity.summarize(runs)
    died = sensitivity.deaths(runs)
    by_arm.to_csv(table, index=False)
    outputs["run_table"] = os.path.join(workdir, "runs.csv")
    summary.merge(runs.drop(columns=["status", "final_eval_loss", "nonfinite_at", "halt_reason",
                                     "entropy_floor"]), on="run", how="left").to_csv(
        outputs["run_table"], index=False)
    outputs["deaths"] = os.path.join(workdir, "deaths.csv")
    died.to_csv(outputs["deaths"], index=False)
    outputs.update(sensitivity_plots.plot_all(runs, died, workdir))
    survived, survival_text = survival.analyze(df, runs, workdir)
    outputs.update(survived)
    extra.append(("Survival", survival_text))
    extra.append(("Learning-rate sensitivity", sensitivity.observations(runs, by_arm, died)))
  elif speed.is_speed_sweep(df):
    summary.to_csv(table, index=False)
    sped, speed_text = speed.analyze(df, summary, workdir)
    outputs.update(sped)
    extra.append(("Learning speed", speed_text))
  else:
    summary.to_csv(table, index=False)
  if df.run.nunique() <= MAX_RUNS_PER_FIGURE:
    outputs["figure"] = plot_comparison(df, os.path.join(workdir, "loss_comparison.png"),
                                        smoothing)
    outputs.update(plot_layers(df, workdir))
  outputs["summary"] = table
  outputs["observations"] = write_observations(
      df, summary, os.path.join(workdir, "observations.md"), extra,
      per_run=df.run.nunique() <= MAX_RUNS_PER_FIGURE)
  return outputs
