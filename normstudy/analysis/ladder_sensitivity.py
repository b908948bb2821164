"""Learning-rate sensitivity along a size ladder: how robustly each arm learns at each rung, and
whether that changes with size (issue 42, item 3).

Each rung is a learning-rate grid of the ladder's arms over seeds (`normstudy.sweep
--axis=optimizer.learning_rate=...` then `normstudy.analyze`, as `make ladder-sensitivity` runs
them); its runs.csv holds one row per run with the final eval loss counted at the loss at
initialisation for a run that failed (`effective_loss`, normstudy.analysis.sensitivity.table).

The metric is Wortsman et al.'s (2023, "Small-scale proxies for large-scale Transformer training
instabilities", section 3.1): for one curve of final loss l(eta) over the grid, with l0 the loss
at initialisation, the mean over the grid of min(l(eta), l0) - min over the grid of l(eta)
(normstudy.analysis.sensitivity.lr_sensitivity). Here it is computed per seed (each seed's own
curve), and a rung's value is the mean over seeds with its 95% t interval (n = seeds): the
seeds are the replicates, so the interval says how well the grid pins the number down.

Tests (n = seeds; paired by seed, since seed s of every arm at a rung sees the same data order):
  against the baseline  each arm's per-seed sensitivity against the first arm's at the same rung:
            the paired t-test and, beside it, the exact paired permutation test (with 3 seeds
            its smallest p is 0.25, so only the t-test can separate anything); Holm over every
            arm x rung comparison, on the t-test's p
  with size  each arm's sensitivity against log10 parameters: the least-squares slope of the
            rungs' means with its t-test (n = rungs, n - 2 degrees of freedom: the rung is what
            carries the size), and the same for each arm's paired difference from the baseline
            (the size x arm interaction); Holm over the arms, per family. Beside it, p_seeds:
            the same slope's test on every seed's value (n = rungs x seeds), valid only if each
            rung's seeds scatter around the line, which 3 rungs cannot check
"""

import math
import os

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.analysis import sensitivity
from normstudy.analysis import stats
from normstudy.records import schema

COLUMNS = list(schema.LADDER_SENSITIVITY_COLUMNS)
TEST_COLUMNS = ["dtype", "test", "arm", "baseline", "num_layers", "d_model", "n", "estimate",
                "p", "p_permutation", "p_holm", "p_seeds", "n_seeds"]


def per_seed(runs: pd.DataFrame) -> pd.DataFrame:
  """One row per arm and seed of one rung's runs.csv: the seed's LR sensitivity
  (sensitivity.lr_sensitivity of that seed's curve, with the arm's mean loss at initialisation
  as l0). Seeds that did not run the whole grid are left out."""
  rows = []
  grid = runs.learning_rate.nunique()
  for arm, curve in runs.groupby("arm", sort=False):
    loss_init = float(curve.loss_init.mean())
    for seed, rows_ in curve.groupby("seed"):
      if rows_.learning_rate.nunique() == grid:
        rows.append({"arm": arm, "seed": seed, "lr_sensitivity": sensitivity.lr_sensitivity(
            rows_.learning_rate, rows_.effective_loss, loss_init)["lr_sensitivity"]})
  return pd.DataFrame(rows, columns=["arm", "seed", "lr_sensitivity"])


def rung_rows(runs: pd.DataFrame, size: dict) -> list:
  """ladder_sensitivity.csv's rows for one rung: per arm the mean of its seeds' sensitivities
  with the 95% t interval, the best learning rate and loss of the seeds' mean curve, the runs
  that failed, and the training text's unigram entropy (what a model that learns gets below).
  `size`: dtype, num_layers, d_model, params."""
  seeds = per_seed(runs)
  out = []
  for arm, curve in runs.groupby("arm", sort=False):
    values = seeds[seeds.arm == arm].lr_sensitivity.to_numpy()
    mean, low, high = stats.mean_interval(values)
    per_lr = curve.groupby("learning_rate").effective_loss.mean()
    best = sensitivity.lr_sensitivity(per_lr.index, per_lr.to_numpy(),
                                      float(curve.loss_init.mean()))
    entropy = curve.unigram_entropy.dropna()
    out.append({"arm": arm, **size, "seeds": len(values),
                "lr_sensitivity": mean, "lr_sensitivity_low": low, "lr_sensitivity_high": high,
                "best_lr": best["best_lr"], "best_loss": best["best_loss"],
                "unigram_entropy": float(entropy.iloc[0]) if len(entropy) else math.nan,
                "failed_runs": int(curve.status.isin(schema.FAILED).sum()),
                "runs": len(curve)})
  return out


def _slope_test(x, y) -> tuple[float, float]:
  """(slope, two-sided p) of the least-squares line of y on x (t-test, n - 2 df)."""
  x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
  if len(x) < 3 or np.ptp(x) == 0:
    return math.nan, math.nan
  fitted = scipy_stats.linregress(x, y)
  return float(fitted.slope), float(fitted.pvalue)


def _size_row(dtype: str, test: str, arm: str, baseline: str, pairs: list) -> dict:
  """A size test from [(log10 params, value)] of every seed at every rung: the slope and its
  t-test on the rungs' means (n = rungs: the rung is the unit that carries the size), with the
  same test on every seed's value beside it (p_seeds, n = rungs x seeds: it holds only if each
  rung's seeds scatter around the line, which 3 rungs cannot check)."""
  table = pd.DataFrame(pairs, columns=["x", "y"])
  means = table.groupby("x").y.mean()
  slope, p = _slope_test(means.index, means.to_numpy())
  _, p_seeds = _slope_test(table.x, table.y)
  return {"dtype": dtype, "test": test, "arm": arm, "baseline": baseline, "n": len(means),
          "estimate": slope, "p": p, "p_seeds": p_seeds, "n_seeds": len(table)}


def tests(rungs: list) -> pd.DataFrame:
  """ladder_sensitivity_tests.csv from [(size dict, per_seed table)], the rungs in size order;
  the first arm of each rung is the baseline. One row per test (the module's docstring):
  test = "against baseline" (estimate: mean paired difference, arm minus baseline), "size
  trend" (estimate: slope per decade of parameters) or "size x arm" (the slope of the paired
  difference)."""
  rows = []
  for dtype in dict.fromkeys(size["dtype"] for size, _ in rungs):
    mine = [(size, seeds) for size, seeds in rungs if size["dtype"] == dtype]
    baseline = mine[0][1].arm.iloc[0]
    arms = list(dict.fromkeys(a for _, seeds in mine for a in seeds.arm))
    pairs, trend, interaction = [], [], []
    # [(log10 params, value)] per arm: its seeds' sensitivities, and their paired differences
    # from the baseline's.
    values_at = {arm: [] for arm in arms}
    ds = {arm: [] for arm in arms}
    for size, seeds in mine:
      base = seeds[seeds.arm == baseline].set_index("seed").lr_sensitivity
      for arm in arms:
        values = seeds[seeds.arm == arm].set_index("seed").lr_sensitivity
        values_at[arm] += [(math.log10(size["params"]), v) for v in values]
        if arm == baseline:
          continue
        shared = sorted(set(values.index) & set(base.index))
        a, b = values.loc[shared].to_numpy(), base.loc[shared].to_numpy()
        ds[arm] += [(math.log10(size["params"]), d) for d in a - b]
        _, _, p = stats.paired_t(a, b)
        pairs.append({"dtype": dtype, "test": "against baseline", "arm": arm,
                      "baseline": baseline, "num_layers": size["num_layers"],
                      "d_model": size["d_model"], "n": len(shared),
                      "estimate": float(np.mean(a - b)) if len(shared) else math.nan, "p": p,
                      "p_permutation": stats.paired_permutation(a, b)})
    for arm in arms:
      trend.append(_size_row(dtype, "size trend", arm, "", values_at[arm]))
      if arm != baseline:
        interaction.append(_size_row(dtype, "size x arm", arm, baseline, ds[arm]))
    for family in (pairs, trend, interaction):
      for row, p_holm in zip(family, stats.holm([r["p"] for r in family])):
        row["p_holm"] = p_holm
      rows += family
  tested = pd.DataFrame(rows, columns=TEST_COLUMNS)
  for column in ("num_layers", "d_model", "n", "n_seeds"):
    tested[column] = tested[column].astype("Int64")
  return tested


def figure(curves: list):
  """Final eval loss against learning rate (failed runs at their loss at init), the seeds'
  mean with their range, one panel per rung, one line per arm; the unigram entropy dotted.
  `curves`: [(size dict, runs.csv table)]."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.6), squeeze=False,
                           sharey=True)
  for ax, (size, runs) in zip(axes[0], curves):
    for arm, curve in runs.groupby("arm", sort=False):
      by_lr = curve.groupby("learning_rate").effective_loss
      mean, low, high = by_lr.mean(), by_lr.min(), by_lr.max()
      line, = ax.plot(mean.index, mean.to_numpy(), marker="o", ms=3,
                      label=curve.arm_label.iloc[0] if "arm_label" in curve else arm)
      ax.fill_between(mean.index, low.to_numpy(), high.to_numpy(), alpha=0.15,
                      color=line.get_color())
    entropy = runs.unigram_entropy.dropna()
    if len(entropy):
      ax.axhline(float(entropy.iloc[0]), color="gray", ls=":", lw=1,
                 label="unigram entropy (no exact floor on real text)")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_title(f"{size['num_layers']} x {size['d_model']}, {size['dtype']} "
                 f"({size['params'] / 1e3:.0f}K params)", fontsize=9)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("final eval loss (failed: loss at init)")
  axes[0][-1].legend(fontsize=7)
  fig.suptitle("Learning-rate sensitivity along the ladder (mean and range over seeds)",
               fontsize=10)
  fig.tight_layout()
  return fig


def observations(table: pd.DataFrame, tested: pd.DataFrame) -> str:
  """Sentences: per rung the arms' sensitivities with intervals, which differ from the
  baseline (paired t, n, p, Holm p, with the permutation p), and whether any arm's sensitivity
  or its difference from the baseline moves with size."""
  parts = ["LR sensitivity (Wortsman et al. 2023: the mean over the learning-rate grid of "
           "min(final loss, loss at init) - best loss, per seed; lower is more robust), mean "
           "over seeds with its 95% t interval. A difference is claimed only at Holm-adjusted "
           f"p < {stats.ALPHA}."]
  for (dtype, layers, width), rung in table.groupby(["dtype", "num_layers", "d_model"],
                                                    sort=False):
    text = f"{layers} x {width}, {dtype}: " + "; ".join(
        f"{r.arm} {r.lr_sensitivity:.3f}"
        + (f" ({r.lr_sensitivity_low:.3f} to {r.lr_sensitivity_high:.3f}, n = {r.seeds})"
           if np.isfinite(r.lr_sensitivity_low) else f" (n = {r.seeds}: no interval)")
        + f", best {r.best_loss:.3f} at {r.best_lr:g}" for r in rung.itertuples()) + "."
    against = tested[(tested.test == "against baseline") & (tested.dtype == dtype)
                     & (tested.num_layers == layers) & (tested.d_model == width)]
    for r in against.itertuples():
      text += (f" {r.arm} against {r.baseline}: "
               + stats.verdict_holm("paired t-test", str(r.n), r.p, r.p_holm)
               + f", exact permutation p = {stats.format_p(r.p_permutation)}.")
    parts.append(text)
  for kind, what in (("size trend", "its sensitivity changes with size"),
                     ("size x arm", "its difference from the baseline changes with size")):
    rows = tested[tested.test == kind]
    if len(rows):
      parts.append(f"Whether {what} (slope per decade of parameters, on the rungs' means): "
                   + "; ".join(
          f"{r.arm} ({r.dtype}) {r.estimate:+.3f}, "
          + stats.verdict_holm("least-squares slope t-test", str(r.n), r.p, r.p_holm,
                               "separated from 0")
          + f" (on every seed's value, n = {r.n_seeds}: p = {stats.format_p(r.p_seeds)})"
          for r in rows.itertuples()) + ".")
  return "\n\n".join(parts)


def analyze(rungs: list, workdir: str) -> dict:
  """Writes ladder_sensitivity.csv, ladder_sensitivity_tests.csv, ladder_sensitivity.png and
  ladder_sensitivity.md into `workdir` from [(size dict, runs.csv table)], one per rung; returns
  {name: path}."""
  rungs = sorted(rungs, key=lambda r: (r[0]["dtype"], r[0]["params"]))
  table = pd.DataFrame([row for size, runs in rungs for row in rung_rows(runs, size)],
                       columns=COLUMNS)
  tested = tests([(size, per_seed(runs)) for size, runs in rungs])
  paths = {name: os.path.join(workdir, f"ladder_sensitivity{suffix}") for name, suffix in (
      ("ladder_sensitivity", ".csv"), ("ladder_sensitivity_tests", "_tests.csv"),
      ("ladder_sensitivity_figure", ".png"), ("ladder_sensitivity_observations", ".md"))}
  table.to_csv(paths["ladder_sensitivity"], index=False)
  tested.to_csv(paths["ladder_sensitivity_tests"], index=False)
  from matplotlib import pyplot as plt
  from normstudy.analysis.plots import save
  fig = figure(rungs)
  save(fig, paths["ladder_sensitivity_figure"])  # and its vector copies (plots.save)
  plt.close(fig)
  with open(paths["ladder_sensitivity_observations"], "w", encoding="utf-8") as f:
    f.write("# Learning-rate sensitivity along the ladder\n\n" + observations(table, tested)
            + "\n")
  return paths
