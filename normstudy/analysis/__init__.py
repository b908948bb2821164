"""Turn run directories into figures, a summary table and written observations.

  loaded = load_runs("runs/seed_figure")  # .table: run, label, step, metric, value; .runs
  plot_comparison(loaded, "fig.png")      # loss (+ eval, entropy floor) and the fp16 loss scale
  summarize(loaded)                       # one row per run, with its status
  analyze("runs/seed_figure")             # everything above, written into the directory

Modules: `runs` (loading), `detectors` (spikes, divergence, loss-scale collapse), `report`
(summary and prose), `plots` (figures), `sensitivity` (learning-rate sweeps), `survival`
(failure against learning rate, the critical learning rate), `speed` (eval loss over seeds at
one learning rate), `depth` (convergence and early update size against depth), `stats`
(Fisher's exact test, Welch's t-test, the logistic fit, the likelihood-ratio test; every
comparison's wording). Reads what runs write through normstudy.records, which defines it; needs
numpy, pandas and matplotlib, not the training stack, so a notebook can install normstudy
without replacing its jax or TensorFlow. The command is `python -m normstudy.analyze`.
"""

import dataclasses
import os
from typing import Callable

from normstudy.analysis.detectors import observe
from normstudy.analysis.detectors import scale_collapses
from normstudy.analysis.detectors import spikes
from normstudy.analysis.plots import DEFAULT_SMOOTHING
from normstudy.analysis.plots import plot_comparison
from normstudy.analysis.plots import plot_heads
from normstudy.analysis.plots import plot_layers
from normstudy.analysis.report import arm_spread
from normstudy.analysis.report import compare_runs
from normstudy.analysis.report import describe_run
from normstudy.analysis.report import summarize
from normstudy.analysis.report import write_observations
from normstudy.analysis.runs import NoRunsError
from normstudy.analysis.runs import Run
from normstudy.analysis.runs import Runs
from normstudy.analysis.runs import layer_values
from normstudy.analysis.runs import load_runs
from normstudy.analysis.runs import localize
from normstudy.analysis.runs import outcome_at
from normstudy.analysis.runs import seed_groups
from normstudy.analysis.runs import series
from normstudy.analysis.runs import smooth
from normstudy.analysis import critical_lr
from normstudy.analysis import depth
from normstudy.analysis import headroom
from normstudy.analysis import interaction
from normstudy.analysis import outcomes_table
from normstudy.analysis import sensitivity
from normstudy.analysis import sensitivity_plots
from normstudy.analysis import speed
from normstudy.analysis import update_spikes as spikes_lib
from normstudy.analysis import stats
from normstudy.analysis import survival
from normstudy.records import schema

# Above this many runs, per-step figures and per-run prose are unreadable: a sweep is read
# through its sensitivity figures and tables instead.
MAX_RUNS_PER_FIGURE = 12


@dataclasses.dataclass(frozen=True)
class Report:
  """One kind of analysis: the runs it `applies_to` (a predicate of the loaded runs) and how it
  is written: `write(loaded, summary, workdir)` -> (outputs {name: path}, sections of
  observations.md [(heading, text)], the table summary.csv holds)."""
  name: str
  applies_to: Callable
  write: Callable


def _sweep_report(loaded, summary, workdir, grid_survival: bool = True, runs=None):
  """A learning-rate sweep: per-arm summary.csv (sensitivity.summarize), runs.csv (a study's
  summary plus the sweep's columns), deaths.csv (sensitivity.deaths), its figures, and survival
  (analysis.survival, unless `grid_survival` is False) and sensitivity sections. `runs`:
  sensitivity.table's, if already built."""
  runs = sensitivity.table(loaded, summary) if runs is None else runs
  by_arm = sensitivity.summarize(runs)
  died = sensitivity.deaths(runs)
  outputs = {"run_table": os.path.join(workdir, schema.RUN_TABLE),
             "deaths": os.path.join(workdir, "deaths.csv")}
  summary.merge(runs.drop(columns=["status", "outcome", "recoveries", "final_eval_loss",
                                   "nonfinite_at", "halt_reason",
                                   "entropy_floor"]), on="run", how="left").to_csv(
      outputs["run_table"], index=False)
  died.to_csv(outputs["deaths"], index=False)
  outputs.update(sensitivity_plots.plot_all(runs, died, workdir))
  sections = [("Learning-rate sensitivity", sensitivity.observations(runs, by_arm, died))]
  if grid_survival:
    survived, survival_text = survival.analyze(loaded, runs, workdir)
    outputs.update(survived)
    sections.insert(0, ("Survival", survival_text))
  return outputs, sections, by_arm


def _search_report(loaded, summary, workdir):
  """A search (normstudy.experiments.search): critical_lr.csv, its points, tests and figure
  (analysis.critical_lr), how every run ended (outcomes.csv, analysis.outcomes_table), then the
  learning-rate sweep's report of the runs it trained without the grid's survival tables: a
  search's learning rates follow each point's outcomes, so the grid's per-learning-rate tests
  and logistic fit answer nothing its design asks."""
  runs = sensitivity.table(loaded, summary)
  outputs, text = critical_lr.analyze(loaded, runs, workdir)
  ended = outcomes_table.table(runs)
  outputs["outcomes"] = os.path.join(workdir, "outcomes.csv")
  ended.to_csv(outputs["outcomes"], index=False)
  text += "\n\n" + outcomes_table.observations(ended)
  swept, sections, table = _sweep_report(loaded, summary, workdir, grid_survival=False,
                                         runs=runs)
  return {**outputs, **swept}, [("Critical learning rate (search)", text), *sections], table


def _speed_report(loaded, summary, workdir):
  """Seeds at one learning rate: speed.csv and speed.png (analysis.speed) and a section."""
  outputs, text = speed.analyze(loaded, summary, workdir)
  return outputs, [("Learning speed", text)], summary


def _depth_report(loaded, summary, workdir):
  """Depths and seeds at one learning rate: depth.csv, depth_tests.csv, depth_updates.csv and
  depth.png (analysis.depth) and a section."""
  outputs, text = depth.analyze(loaded, summary, workdir)
  return outputs, [("Depth", text)], summary


# The reports, in order; the first that applies to a directory's runs writes it. Runs no report
# applies to (a study) get the per-run summary alone.
REPORTS = (
    Report("critical learning rate by search", critical_lr.is_search, _search_report),
    Report("learning-rate sweep", sensitivity.is_sweep, _sweep_report),
    Report("depth", depth.is_depth_sweep, _depth_report),
    Report("learning speed", speed.is_speed_sweep, _speed_report),
)


def unfinished_note(loaded: Runs, summary) -> str:
  """"" when every run ended; else a paragraph naming the runs that stopped before their last
  step (running or preempted: killed, or stopped by a signal), each with the step it reached:
  a study or sweep analysed while unfinished says so before any comparison."""
  from normstudy.records import schema
  stopped = summary[summary.status.isin([schema.RUNNING, schema.PREEMPTED])]
  if stopped.empty:
    return ""
  reached = []
  for row in stopped.itertuples():
    of = loaded.runs[row.run].num_steps
    reached.append(f"{row.run} (step {int(row.steps)}" + (f" of {of})" if of else ")"))
  return (f"{len(stopped)} of {len(summary)} runs stopped before their last step: "
          f"{'; '.join(reached[:12])}{'; ...' if len(reached) > 12 else ''}. Their curves and "
          "tables end where they stopped; comparisons of final values are not of the same "
          "horizon. The same training command continues them.")


def analyze(workdir: str, smoothing: float = DEFAULT_SMOOTHING, loaded: Runs | None = None
            ) -> dict:
  """Writes the analysis of every run below `workdir` into it; returns the paths written.

  Always summary.csv and observations.md; the first of REPORTS that applies adds its tables,
  figures and sections (a learning-rate sweep: lr_sensitivity.png, lr_attn_logit.png,
  deaths.png, deaths.csv, runs.csv, survival.csv, survival_tests.csv, survival.png, and a
  per-arm summary.csv; seeds at one learning rate: speed.csv and speed.png). With few enough
  runs to read them, the per-step figures: loss_comparison.png (+ .svg) and, with telemetry,
  layers_<metric>.png and headroom.png; with telemetry, headroom.csv (analysis.headroom); arms
  that differ only in their seeds (normstudy.study --seeds) also
  arms.csv, each figure's median and range over the seeds. `loaded`: the runs already loaded
  from `workdir`.
  """
  if not os.path.isdir(workdir):
    raise NoRunsError(f"{workdir!r} is not a directory")
  loaded = load_runs(workdir) if loaded is None else loaded
  if not len(loaded):
    raise NoRunsError(f"no run with a metrics.jsonl below {workdir!r}")
  summary = summarize(loaded)
  outputs, sections, table = {}, [], summary
  unfinished = unfinished_note(loaded, summary)
  experiment = loaded.experiment or {}
  declared = "" if experiment.get("part") else experiment.get("report")  # a part: by the data
  if declared:  # the experiment says which report its directory gets
    report = next(r for r in REPORTS if r.name == declared)
  else:  # a directory that does not say: the first report that applies to its runs
    report = next((r for r in REPORTS if r.applies_to(loaded)), None)
  if report is not None:
    outputs, sections, table = report.write(loaded, summary, workdir)
  table.to_csv(os.path.join(workdir, "summary.csv"), index=False)
  groups = seed_groups(loaded)
  if groups is not None:  # arms over seeds: each figure with its spread
    outputs["arms"] = os.path.join(workdir, "arms.csv")
    arm_spread(summary, loaded, groups).to_csv(outputs["arms"], index=False)
  spike_outputs, spike_text = spikes_lib.analyze(loaded, workdir)
  outputs.update(spike_outputs)
  if spike_text:
    sections = [*sections, ("Update-norm spikes", spike_text)]
  few = len(loaded) <= MAX_RUNS_PER_FIGURE
  room = headroom.table(loaded)
  if not room.empty:  # telemetry: each series' headroom to the format's limit
    outputs["headroom"] = os.path.join(workdir, "headroom.csv")
    room.to_csv(outputs["headroom"], index=False)
    if few:
      outputs["headroom_figure"] = headroom.plot(room, os.path.join(workdir, "headroom.png"))
      sections = [*sections, ("Float16 headroom", headroom.observations(room))]
  if few:
    outputs["figure"] = plot_comparison(loaded, os.path.join(workdir, "loss_comparison.png"),
                                        smoothing)
    outputs.update(plot_layers(loaded, workdir))
    outputs.update(plot_heads(loaded, workdir))
  if unfinished:
    sections = [("Unfinished runs", unfinished), *sections]
  outputs["summary"] = os.path.join(workdir, "summary.csv")
  outputs["observations"] = write_observations(
      loaded, summary, os.path.join(workdir, "observations.md"), sections, per_run=few)
  return outputs
