"""Every technique against its own baseline, by the critical learning rate and by its cost: the
table of `make techniques` (issue 43).

Inputs, each an analysed sweep directory (normstudy.analyze wrote its CSVs):
  one search per dtype   critical_lr.csv (each arm's transition fitted to every probe: the
                         critical learning rate and its 95% profile-likelihood interval),
                         critical_lr_points.csv (each seed's final bracket) and runs.csv (every
                         probe: learning rate and status)
  the recipe sweep       every arm at the recipe's learning rate, a few seeds: speed.csv's final
                         eval loss (normstudy.analysis.speed), and each run's step time from
                         its metrics.jsonl

techniques.csv, one row per technique and dtype (TECHNIQUE_COLUMNS):
  critical_lr, critical_lr_low, critical_lr_high   the technique's fitted critical learning rate
  ratio        its critical learning rate over its baseline's (fitted 50% points)
  p, p_holm    the likelihood-ratio test that the technique and its baseline share one 50% point
               (normstudy.analysis.transition.same_center_lrt: every probe of both arms, so it
               holds with few seeds), Holm-adjusted over the family: every technique in every
               dtype
  margin       for a pair the test does not separate, the factor within which the two are
               equivalent at 95%: two one-sided likelihood-ratio tests on the profile of the
               log ratio of the two 50% points (transition.equivalence_factor); NaN for a
               separated pair, where a margin means nothing
  loss_at_recipe   the mean final eval loss over the recipe sweep's seeds
  step_time_ratio  the technique's median step time over its baseline's (the recipe sweep's
               runs, two to a program, each program on its own core: > 1 is slower)
and beside them: test, n (seeds and probes of each arm), the baseline's critical learning rate,
loss_at_recipe_baseline and separated (p_holm < 0.05). No t-test on the seeds' bracket
midpoints: they sit on the search's lattice, so coinciding seeds give a variance of 0.
techniques_summary.csv holds the same one row per technique, a column per dtype (`summary`).
"""

import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import critical_lr
from normstudy.analysis import stats
from normstudy.analysis import transition
from normstudy.records import keys
from normstudy.records import schema

TECHNIQUES = "techniques.csv"
TECHNIQUE_COLUMNS = ["technique", "label", "baseline", "dtype", "critical_lr", "critical_lr_low",
                     "critical_lr_high", "ratio", "p", "p_holm", "margin", "loss_at_recipe",
                     "step_time_ratio"]
EXTRA_COLUMNS = ["test", "n", "baseline_critical_lr", "loss_at_recipe_baseline", "separated"]
TEST = "likelihood-ratio test of one 50% point"


def _probes(runs: pd.DataFrame, arm: str) -> tuple:
  return critical_lr._probes(runs[runs.arm == arm])


def compare_searches(found: pd.DataFrame, points: pd.DataFrame, runs: pd.DataFrame,
                     baselines: dict, dtype: str) -> list:
  """One search's rows: each technique of `baselines` ({technique: baseline arm}) present in
  `found` (critical_lr.csv) against its baseline. `points` is critical_lr_points.csv and
  `runs` runs.csv of the same search."""
  by_arm = found.set_index("arm")
  rows = []
  for technique, baseline in baselines.items():
    if technique not in by_arm.index or baseline not in by_arm.index:
      continue
    mine, base = by_arm.loc[technique], by_arm.loc[baseline]
    a, b = _probes(runs, technique), _probes(runs, baseline)
    fa, fb = transition.fit(*a), transition.fit(*b)
    tested = critical_lr.compare(points[points.arm == technique],
                                 points[points.arm == baseline])
    rows.append({
        "technique": technique, "label": mine.label, "baseline": baseline, "dtype": dtype,
        "critical_lr": mine.critical_lr, "critical_lr_low": mine.critical_lr_low,
        "critical_lr_high": mine.critical_lr_high,
        "ratio": 10 ** (fa.center - fb.center) if fa is not None and fb is not None
        else math.nan,
        "p": transition.same_center_lrt(a, b)[1], "test": TEST,
        "n": f"{tested['n_a']} and {tested['n_b']} seeds, {len(a[1])} and {len(b[1])} probes",
        "equivalence_factor": transition.equivalence_factor(a, b),
        "baseline_critical_lr": base.critical_lr})
  return rows


def step_times(loaded, run_names) -> dict:
  """{run: its median seconds per token}, from the tokens-per-second records after the first
  (the first interval compiled the step); NaN for a run without them. Every arm of a sweep
  trains the same tokens a step, so their ratio is the ratio of step times."""
  out = {}
  for run in run_names:
    tps = loaded.series(run, keys.TOKENS_PER_SEC).iloc[1:]
    tps = tps[np.isfinite(tps) & (tps > 0)]
    out[run] = float(np.median(1.0 / tps)) if len(tps) else math.nan
  return out


def recipe_costs(speed: pd.DataFrame, loaded) -> pd.DataFrame:
  """Per arm of the recipe sweep: its mean final eval loss over seeds (speed.csv's, with the
  95% t interval) and the median step time of its runs (`step_times`, seconds per token)."""
  times = step_times(loaded, loaded.names)
  arms = {run: loaded[run].info.arm for run in loaded.names}
  per_arm = pd.Series(times).groupby(pd.Series(arms)).median()
  costs = speed.set_index("arm")[["final_eval_loss", "final_eval_loss_low",
                                  "final_eval_loss_high"]].rename(
      columns=lambda c: c.replace("final_eval_loss", "loss_at_recipe"))
  costs["step_time"] = per_arm.reindex(costs.index)
  return costs


def table(rows: list, costs: pd.DataFrame | None) -> pd.DataFrame:
  """techniques.csv from every search's rows (`compare_searches`) and the recipe's costs: Holm
  over the whole family, margins for the pairs not separated, costs against the baseline's."""
  out = pd.DataFrame(rows)
  if out.empty:
    return pd.DataFrame(columns=TECHNIQUE_COLUMNS + EXTRA_COLUMNS)
  out["p_holm"] = stats.holm(out.p.tolist())
  out["separated"] = out.p_holm < stats.ALPHA
  out["margin"] = np.where(out.separated, math.nan, out.equivalence_factor)
  for column in ("loss_at_recipe", "loss_at_recipe_baseline", "step_time_ratio"):
    out[column] = math.nan
  if costs is not None:
    for i, r in out.iterrows():
      if r.technique in costs.index:
        out.loc[i, "loss_at_recipe"] = costs.loc[r.technique, "loss_at_recipe"]
      if r.baseline in costs.index:
        out.loc[i, "loss_at_recipe_baseline"] = costs.loc[r.baseline, "loss_at_recipe"]
      if r.technique in costs.index and r.baseline in costs.index:
        out.loc[i, "step_time_ratio"] = (costs.loc[r.technique, "step_time"]
                                         / costs.loc[r.baseline, "step_time"])
  out = out.sort_values(["dtype", "ratio"], ascending=[True, False], kind="stable")
  return out[TECHNIQUE_COLUMNS + EXTRA_COLUMNS].reset_index(drop=True)


# What spike handling is asked to change (marin #1368/#1390, OLMo-core's StabilityMonitor): per
# pair of runs at the same learning rate and seed, (measure, runs.csv column, which pairs count).
TIME_TO_FAILURE = ("time to failure (step)", "failed_at", "both failed")
LOSS_SPIKES = ("loss spikes", "loss_spikes", "all")
LARGEST_SPIKE = ("largest loss spike (nats above trend)", "largest_spike", "all")
SKIPS_WITHHELD = ("updates skip-step withheld", "spike_skips", "all")
SPIKE_MEASURES = (
    TIME_TO_FAILURE,
    LOSS_SPIKES,
    ("final loss of survivors", "final_loss", "both finished"),
)
# A run long enough to spike and recover (configs/spike_handling.py) answers more: how large the
# spikes are, the held-out loss after recovery, and whether skip-step acted at all.
RECOVERY_MEASURES = SPIKE_MEASURES + (
    LARGEST_SPIKE,
    ("final eval loss of survivors", "final_eval_loss", "both finished"),
    SKIPS_WITHHELD,
)
# Runs that spike and then fail (configs/spike_failure.py) answer the first question for every
# pair, not only for pairs where both failed: the steps each run lasted with a survivor counted to
# its end (the restricted mean time to failure, which a censored run does not bias), and
# whether it failed at all.
FAILURE_MEASURES = (
    TIME_TO_FAILURE,
    ("steps before failure, survivors to their end", "steps_survived", "all"),
    ("runs that failed (share)", "failed", "all"),
    LOSS_SPIKES,
    LARGEST_SPIKE,
    SKIPS_WITHHELD,
)
# What a config file's SPIKE_MEASURES may name (configs/spike_handling.py: "recovery", the
# default; configs/spike_failure.py: "failure").
MEASURE_SETS = {"recovery": RECOVERY_MEASURES, "failure": FAILURE_MEASURES}
SPIKE_COLUMNS = ["technique", "baseline", "dtype", "measure", "pairs", "technique_mean",
                 "baseline_mean", "difference", "test", "p", "p_holm", "verdict"]


def spike_handling(runs: pd.DataFrame, techniques_: list, baselines: dict,
                   dtype: str, measures=SPIKE_MEASURES) -> list:
  """Rows of spike_handling.csv for one search's runs (runs.csv): each technique of
  `techniques_` (skip-step, update clipping) against its baseline on the runs both trained at the
  same learning rate and seed (every search's first round trains LOW and HIGH for every arm and
  seed), per `measures` (SPIKE_MEASURES; RECOVERY_MEASURES for a grid of long runs): the means,
  their difference and the exact paired permutation test (n pairs; counts and steps are not
  normal). A measure the runs did not record (an older runs.csv) is left out."""
  rows = []
  keys_ = ["learning_rate", "seed"]
  failed = runs.status.isin(schema.FAILED)
  runs = runs.assign(failed=failed.astype(float))
  if "steps" in runs:  # a failed run lasted to its failure, a survivor to its end
    runs = runs.assign(steps_survived=runs.failed_at.where(
        failed & runs.failed_at.notna(), runs.steps).astype(float))
  for technique in techniques_:
    baseline = baselines.get(technique)
    mine, base = runs[runs.arm == technique], runs[runs.arm == baseline]
    if mine.empty or base.empty:
      continue
    pairs = mine.merge(base, on=keys_, suffixes=("_t", "_b"))
    ended = pairs.outcome_t.ne("unfinished") & pairs.outcome_b.ne("unfinished")
    # Failed by the failure rule (halted or diverged); a run that survived but did not learn
    # ("not learning") is a survivor here.
    failed_t, failed_b = (pairs[f"status_{s}"].isin(schema.FAILED) for s in ("t", "b"))
    for measure, column, which in measures:
      if f"{column}_t" not in pairs:
        continue
      if which == "both failed":
        chosen = pairs[ended & failed_t & failed_b]
      elif which == "both finished":
        chosen = pairs[ended & ~failed_t & ~failed_b]
      else:
        chosen = pairs[ended]
      a = chosen[f"{column}_t"].to_numpy(dtype=float)
      b = chosen[f"{column}_b"].to_numpy(dtype=float)
      keep = np.isfinite(a) & np.isfinite(b)
      a, b = a[keep], b[keep]
      rows.append({"technique": technique, "baseline": baseline, "dtype": dtype,
                   "measure": measure, "pairs": len(a),
                   "technique_mean": float(a.mean()) if len(a) else math.nan,
                   "baseline_mean": float(b.mean()) if len(b) else math.nan,
                   "difference": float((a - b).mean()) if len(a) else math.nan,
                   "test": "exact paired permutation test",
                   "p": stats.paired_permutation(a, b) if len(a) else math.nan})
  return rows


def spike_table(rows: list) -> pd.DataFrame:
  """spike_handling.csv: the rows with Holm over the family and a verdict each."""
  out = pd.DataFrame(rows, columns=SPIKE_COLUMNS[:-2])
  out["p_holm"] = stats.holm(out.p.tolist()) if len(out) else []
  out["verdict"] = [stats.verdict_holm(r.test, f"{r.pairs} pairs", r.p, r.p_holm)
                    for r in out.itertuples()]
  return out


def summary(techniques: pd.DataFrame) -> pd.DataFrame:
  """techniques_summary.csv: one row per technique (`arm`, its label and baseline), and per dtype
  D the columns critical_lr_D, ratio_D, p_D, p_holm_D, margin_D and separated_D, then the cost
  (loss_at_recipe, loss_at_recipe_baseline, step_time_ratio: the recipe ran in one dtype), in
  the order of the first dtype's ranking. What docs/results.md's technique table quotes."""
  rows = {}
  for r in techniques.itertuples():
    row = rows.setdefault(r.technique, {"arm": r.technique, "label": r.label,
                                        "baseline": r.baseline,
                                        "loss_at_recipe": r.loss_at_recipe,
                                        "loss_at_recipe_baseline": r.loss_at_recipe_baseline,
                                        "step_time_ratio": r.step_time_ratio})
    for column in ("critical_lr", "ratio", "p", "p_holm", "margin", "separated"):
      row[f"{column}_{r.dtype}"] = getattr(r, column)
  return pd.DataFrame(list(rows.values()))


def figure(techniques: pd.DataFrame):
  """Each technique's critical learning rate over its baseline's, one panel per dtype, with the
  technique's interval divided by the baseline's fitted value; filled markers are separated
  (Holm), hollow ones not."""
  from matplotlib.figure import Figure
  dtypes = list(dict.fromkeys(techniques.dtype)) or ["float16"]
  names = list(dict.fromkeys(techniques.technique))
  fig = Figure(figsize=(5 * len(dtypes), 0.32 * len(names) + 1.6), layout="constrained")
  panels = np.atleast_1d(fig.subplots(1, len(dtypes), sharey=True))
  for ax, dtype in zip(panels, dtypes):
    rows = techniques[techniques.dtype == dtype].set_index("technique")
    for y, name in enumerate(names):
      if name not in rows.index:
        continue
      r = rows.loc[name]
      base = r.baseline_critical_lr
      if np.isfinite(r.critical_lr_low) and np.isfinite(base):
        ax.plot([r.critical_lr_low / base, r.critical_lr_high / base], [y, y], color="C0",
                lw=2, alpha=0.6)
      ax.plot(r.ratio, y, "o", color="C0", markerfacecolor="C0" if r.separated else "white")
    ax.axvline(1.0, color="0.5", lw=1)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter
    from matplotlib.ticker import NullFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(dtype)
    ax.set_xlabel("critical learning rate / baseline's\n(filled: separated, Holm p < 0.05)")
    ax.grid(alpha=0.3, axis="x", which="both")
  panels[0].set_yticks(range(len(names)))
  panels[0].set_yticklabels(names, fontsize=8)
  fig.suptitle("Each technique against its baseline: the critical learning rate")
  return fig


def analyze(searches: dict, recipe_dir: str | None, baselines: dict, workdir: str,
            spike_handlers=()) -> dict:
  """Reads each search ({dtype: directory}) and the recipe sweep (or None), writes
  techniques.csv, techniques_summary.csv, spike_handling.csv (for `spike_handlers`) and
  techniques.png (+ .svg) into `workdir`; returns their paths."""
  from normstudy.analysis import runs as runs_lib
  from normstudy.analysis.plots import save
  rows, spikes = [], []
  for dtype, directory in searches.items():
    runs = pd.read_csv(os.path.join(directory, schema.RUN_TABLE))
    rows += compare_searches(pd.read_csv(os.path.join(directory, schema.CRITICAL_LR)),
                             pd.read_csv(os.path.join(directory, "critical_lr_points.csv")),
                             runs, baselines, dtype)
    spikes += spike_handling(runs, list(spike_handlers), baselines, dtype)
  costs = None
  if recipe_dir is not None:
    costs = recipe_costs(pd.read_csv(os.path.join(recipe_dir, "speed.csv")),
                         runs_lib.load_runs(recipe_dir))
  result = table(rows, costs)
  outputs = {"techniques": os.path.join(workdir, TECHNIQUES),
             "techniques_summary": os.path.join(workdir, "techniques_summary.csv"),
             "spike_handling": os.path.join(workdir, "spike_handling.csv"),
             "techniques_figure": os.path.join(workdir, "techniques.png")}
  result.to_csv(outputs["techniques"], index=False)
  summary(result).to_csv(outputs["techniques_summary"], index=False)
  spike_table(spikes).to_csv(outputs["spike_handling"], index=False)
  save(figure(result), outputs["techniques_figure"])
  return outputs


def analyze_spike_grid(directory: str, baselines: dict, spike_handlers, workdir: str,
                       measures=RECOVERY_MEASURES) -> dict:
  """A grid of long runs (configs/spike_handling.py: every arm at the same learning rates and
  seeds, analysed by normstudy.sweep into `directory`): spike_handling.csv with `measures`
  (RECOVERY_MEASURES; FAILURE_MEASURES for runs that spike and fail), per dtype of its
  runs.csv, into `workdir`; returns its path."""
  runs = pd.read_csv(os.path.join(directory, schema.RUN_TABLE))
  rows = []
  for dtype in runs.dtype.dropna().unique():
    rows += spike_handling(runs[runs.dtype == dtype], list(spike_handlers), baselines, dtype,
                           measures)
  path = os.path.join(workdir, "spike_handling.csv")
  spike_table(rows).to_csv(path, index=False)
  return {"spike_handling": path}
