"""Turn run directories into figures, a summary table and written observations.

  df = load_runs("runs/seed_figure")      # long form: run, label, step, metric, value
  plot_comparison(df, "fig.png")          # loss (+ eval, entropy floor) and the fp16 loss scale
  summarize(df)                           # one row per run, with its status
  analyze("runs/seed_figure")             # everything above, written into the directory

Modules: `runs` (loading), `detectors` (spikes, divergence, loss-scale collapse), `report`
(summary and prose), `plots` (figures). Needs numpy, pandas and matplotlib, not the training
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


def analyze(workdir: str, smoothing: float = DEFAULT_SMOOTHING) -> dict:
  """Writes loss_comparison.png (+ .svg), summary.csv, observations.md and, with telemetry,
  layers_<metric>.png into `workdir`; returns their paths."""
  if not os.path.isdir(workdir):
    raise NoRunsError(f"{workdir!r} is not a directory")
  df = load_runs(workdir)
  if df.empty:
    raise NoRunsError(f"no run with a metrics.jsonl below {workdir!r}")
  figure = plot_comparison(df, os.path.join(workdir, "loss_comparison.png"), smoothing)
  table = os.path.join(workdir, "summary.csv")
  summary = summarize(df)
  summary.to_csv(table, index=False)
  observations = write_observations(df, summary, os.path.join(workdir, "observations.md"))
  return {"figure": figure, "summary": table, "observations": observations,
          **plot_layers(df, workdir)}
