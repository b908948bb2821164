"""The size ladder's statistics: how an arm's critical learning rate moves with model size, and
whether the ladder's small end predicts its largest rung (issue 42; Wortsman et al. 2023, "Small-
scale proxies for large-scale Transformer training instabilities": the learning rate where
instabilities begin falls with size along a regular trend, so a ladder of small models can
locate a large model's cliff).

The model, per arm, dtype and size axis (d_model on a width ladder, num_layers on a depth
ladder, parameters over every rung): log10 critical_lr = a + b log10 size + e, e independent
with one variance, fitted by least squares (`fit`). Its checks:
  held out  `heldout`: the fit without the largest rung predicts that rung, with the 95% t
            prediction interval of a new observation (Montgomery & Peck, Introduction to
            Linear Regression Analysis, section 2.5), and says whether the measured value falls
            inside; with 3 rungs left the interval has 1 degree of freedom and is wide, as it
            should be (tests/test_ladder.py: coverage of the true value in a simulated ladder
            with a known power law). Beside it, what a flat law (no size effect: the mean of
            the other rungs, its t prediction interval with n - 1 degrees of freedom) predicts
            for the same rung and whether it would also pass: a held-out test that both laws
            pass does not tell a size effect from none
  interaction `interaction`: two arms measured at the same rungs, whether their ratio changes
            with size: the least-squares slope of log10(critical_lr_a / critical_lr_b) against
            log10 size, its t-test against 0 (n - 2 degrees of freedom)
  extrapolation `predict`: the fit over every rung at a size outside the ladder (the paper's
            24 x 1024) with its prediction interval; beyond the rungs it is a trend check, not a
            prediction (a trend measured over one decade need not hold over three: the optimal
            rate's trend bends at scale), and `within` says which it is

Every interval's scatter is the residual SD floored by the rungs' own measurement SD (`fit`:
a search quantises its estimates, and rungs exactly on a line would otherwise give zero-width
intervals). Everything works on log10 values; intervals come back as learning rates.
"""

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.records import schema

LEVEL = 0.95

LADDER_COLUMNS = list(schema.LADDER_COLUMNS)
FIT_COLUMNS = ["arm", "dtype", "axis", "slope", "slope_low", "slope_high", "heldout_predicted",
               "heldout_low", "heldout_high", "heldout_measured", "heldout_inside", "rungs",
               "intercept", "residual_sd", "interval_sd", "flat_predicted", "flat_low",
               "flat_high", "flat_inside"]


@dataclasses.dataclass(frozen=True)
class Fit:
  """log10 y = intercept + slope log10 x, by least squares over n rungs."""
  intercept: float
  slope: float
  slope_low: float
  slope_high: float
  residual_sd: float  # NaN with 2 rungs (no degree of freedom left)
  n: int
  x_mean: float  # of log10 x
  sxx: float  # sum of squared deviations of log10 x
  residuals: tuple  # log10 y minus the fit, per rung in the order given
  sd: float = math.nan  # what the intervals use: residual_sd, floored by the rungs' own SD

  def prediction(self, x: float) -> tuple[float, float, float]:
    """(predicted y, low, high) at size x: the 95% t interval of a new observation."""
    lx = math.log10(x)
    centre = self.intercept + self.slope * lx
    if self.n < 3 or not np.isfinite(self.sd):
      return 10 ** centre, math.nan, math.nan
    half = (scipy_stats.t.ppf(0.5 + LEVEL / 2, self.n - 2) * self.sd
            * math.sqrt(1 + 1 / self.n + (lx - self.x_mean) ** 2 / self.sxx))
    return 10 ** centre, 10 ** (centre - half), 10 ** (centre + half)


def measurement_sd(lows, highs) -> np.ndarray:
  """Each rung's standard error of log10 critical learning rate, from its 95% interval
  ((log10 high - log10 low) / (2 x 1.96)); NaN where the interval is not finite."""
  lows, highs = np.asarray(lows, dtype=float), np.asarray(highs, dtype=float)
  with np.errstate(divide="ignore", invalid="ignore"):
    return (np.log10(highs) - np.log10(lows)) / (2 * scipy_stats.norm.ppf(0.975))


def fit(sizes, critical_lrs, measured_sd=None) -> Fit:
  """The least-squares line of log10 critical_lrs on log10 sizes, with the slope's 95% t
  interval (n - 2 degrees of freedom). ValueError for fewer than two distinct sizes.

  `measured_sd` (each rung's standard error in log10, `measurement_sd`) floors the scatter the
  intervals use: sd = max(residual SD, the rungs' root-mean-square measurement SD). A search's
  estimates are quantised (its bisection lattice and probe offsets), so three rungs can lie
  exactly on a line and leave no residual; a zero-width interval would then claim a precision
  no rung has (the CPU ladder's DeepNorm width rungs did)."""
  x = np.log10(np.asarray(sizes, dtype=float))
  y = np.log10(np.asarray(critical_lrs, dtype=float))
  if len(np.unique(x)) < 2:
    raise ValueError(f"a fit over sizes needs two distinct sizes, got {list(sizes)}")
  n, x_mean = len(x), float(x.mean())
  sxx = float(np.sum((x - x_mean) ** 2))
  slope = float(np.sum((x - x_mean) * (y - y.mean())) / sxx)
  intercept = float(y.mean() - slope * x_mean)
  residuals = y - (intercept + slope * x)
  if n > 2:
    residual_sd = float(math.sqrt(np.sum(residuals ** 2) / (n - 2)))
    sd = residual_sd
    if measured_sd is not None:
      known = np.asarray(measured_sd, dtype=float)
      known = known[np.isfinite(known)]
      if len(known):
        sd = max(sd, float(math.sqrt(np.mean(known ** 2))))
    half = scipy_stats.t.ppf(0.5 + LEVEL / 2, n - 2) * sd / math.sqrt(sxx)
  else:
    residual_sd = sd = half = math.nan
  return Fit(intercept, slope, slope - half, slope + half, residual_sd, n, x_mean, sxx,
             tuple(float(r) for r in residuals), sd)


def heldout(sizes, critical_lrs, measured_sd=None) -> dict:
  """The largest rung predicted by the fit over the others: {"predicted", "low", "high",
  "measured", "inside"} (inside: the measured value within the 95% prediction interval; None
  when the interval cannot be formed, fewer than 3 rungs left)."""
  sizes, lrs = np.asarray(sizes, dtype=float), np.asarray(critical_lrs, dtype=float)
  largest = int(np.argmax(sizes))
  rest = np.arange(len(sizes)) != largest
  floor = None if measured_sd is None else np.asarray(measured_sd, dtype=float)[rest]
  predicted, low, high = fit(sizes[rest], lrs[rest], floor).prediction(sizes[largest])
  measured = float(lrs[largest])
  inside = bool(low <= measured <= high) if np.isfinite(low) else None
  flat = flat_prediction(lrs[rest], floor)
  return {"predicted": predicted, "low": low, "high": high, "measured": measured,
          "inside": inside, "flat_predicted": flat[0], "flat_low": flat[1],
          "flat_high": flat[2],
          "flat_inside": bool(flat[1] <= measured <= flat[2]) if np.isfinite(flat[1]) else None}


def flat_prediction(critical_lrs, measured_sd=None) -> tuple[float, float, float]:
  """What a law without a size effect predicts for a new rung: (the geometric mean of
  `critical_lrs`, low, high), the 95% t prediction interval of a new observation around the mean
  of their log10 values (n - 1 degrees of freedom), its scatter floored by the rungs' own
  measurement SD as `fit`'s is."""
  y = np.log10(np.asarray(critical_lrs, dtype=float))
  n = len(y)
  centre = float(y.mean())
  if n < 2:
    return 10 ** centre, math.nan, math.nan
  sd = float(y.std(ddof=1))
  if measured_sd is not None:
    known = np.asarray(measured_sd, dtype=float)
    known = known[np.isfinite(known)]
    if len(known):
      sd = max(sd, float(math.sqrt(np.mean(known ** 2))))
  half = scipy_stats.t.ppf(0.5 + LEVEL / 2, n - 1) * sd * math.sqrt(1 + 1 / n)
  return 10 ** centre, 10 ** (centre - half), 10 ** (centre + half)


def interaction(sizes, critical_lrs_a, critical_lrs_b, measured_sd=None) -> dict:
  """Whether arm a's critical learning rate over arm b's changes with size (the same rungs,
  paired by position): {"slope" (decades of the ratio per decade of size), "slope_low",
  "slope_high", "t", "df", "p"}: the least-squares slope of log10(a / b) on log10 size and its
  two-sided t-test against 0."""
  ratio = np.asarray(critical_lrs_a, dtype=float) / np.asarray(critical_lrs_b, dtype=float)
  line = fit(sizes, ratio, measured_sd)
  df = line.n - 2
  if df < 1 or not np.isfinite(line.sd):
    return {"slope": line.slope, "slope_low": math.nan, "slope_high": math.nan, "t": math.nan,
            "df": float(df), "p": math.nan}
  se = line.sd / math.sqrt(line.sxx)
  if se == 0:
    t = 0.0 if line.slope == 0 else math.copysign(math.inf, line.slope)
  else:
    t = line.slope / se
  p = float(2 * scipy_stats.t.sf(abs(t), df)) if np.isfinite(t) else (0.0 if t else 1.0)
  return {"slope": line.slope, "slope_low": line.slope_low, "slope_high": line.slope_high,
          "t": t, "df": float(df), "p": p}


def predict(sizes, critical_lrs, size: float, measured_sd=None) -> dict:
  """The fit over every rung at `size`: {"predicted", "low", "high", "within"} (within: the
  size lies inside the ladder's range, where the fit interpolates)."""
  predicted, low, high = fit(sizes, critical_lrs, measured_sd).prediction(size)
  return {"predicted": predicted, "low": low, "high": high,
          "within": bool(min(sizes) <= size <= max(sizes))}


def _ladders(table: pd.DataFrame):
  """(axis, rows) per size axis of one arm and dtype's rungs: d_model over the rungs that share
  the most common depth, num_layers over those that share the most common width, params over
  every rung; an axis with fewer than two sizes is left out."""
  if table.num_layers.nunique() and len(table):
    depth = table.num_layers.mode().iloc[0]
    width = table.d_model.mode().iloc[0]
    for axis, rows in (("d_model", table[table.num_layers == depth]),
                       ("num_layers", table[table.d_model == width]), ("params", table)):
      if rows[axis].nunique() >= 2:
        yield axis, rows


def fit_table(ladder: pd.DataFrame) -> pd.DataFrame:
  """ladder_fit.csv from ladder.csv's rows (LADDER_COLUMNS): per arm, dtype and axis the slope
  with its interval and the held-out test of the largest rung; rungs without a finite critical
  learning rate are left out."""
  out = []
  usable = ladder[np.isfinite(ladder.critical_lr) & (ladder.critical_lr > 0)]
  for (arm, dtype), table in usable.groupby(["arm", "dtype"], sort=False):
    for axis, rows in _ladders(table):
      own = measurement_sd(rows.critical_lr_low, rows.critical_lr_high)
      line = fit(rows[axis], rows.critical_lr, own)
      held = (heldout(rows[axis].to_numpy(), rows.critical_lr.to_numpy(), own) if len(rows) >= 3
              else {"predicted": math.nan, "low": math.nan, "high": math.nan,
                    "measured": math.nan, "inside": None, "flat_predicted": math.nan,
                    "flat_low": math.nan, "flat_high": math.nan, "flat_inside": None})
      out.append({"arm": arm, "dtype": dtype, "axis": axis, "slope": line.slope,
                  "slope_low": line.slope_low, "slope_high": line.slope_high,
                  "heldout_predicted": held["predicted"], "heldout_low": held["low"],
                  "heldout_high": held["high"], "heldout_measured": held["measured"],
                  "heldout_inside": held["inside"], "rungs": len(rows),
                  "intercept": line.intercept, "residual_sd": line.residual_sd,
                  "interval_sd": line.sd, "flat_predicted": held["flat_predicted"],
                  "flat_low": held["flat_low"], "flat_high": held["flat_high"],
                  "flat_inside": held["flat_inside"]})
  return pd.DataFrame(out, columns=FIT_COLUMNS)


TEST_COLUMNS = ["dtype", "axis", "arm_a", "arm_b", "rungs", "slope", "slope_low", "slope_high",
                "t", "df", "p", "p_holm", "verdict"]


def interaction_table(ladder: pd.DataFrame) -> pd.DataFrame:
  """ladder_tests.csv: per dtype and axis, every pair of arms measured at the same rungs: the
  slope of the log10 ratio of their critical learning rates on log10 size and its t-test
  (`interaction`), Holm-adjusted over all pairs, axes and dtypes."""
  from normstudy.analysis import stats
  out = []
  usable = ladder[np.isfinite(ladder.critical_lr) & (ladder.critical_lr > 0)]
  for dtype, table in usable.groupby("dtype", sort=False):
    arms = list(dict.fromkeys(table.arm))
    for i, arm_a in enumerate(arms):
      for arm_b in arms[i + 1:]:
        for axis, rows in _ladders(table[table.arm == arm_a]):
          a = rows.set_index(["num_layers", "d_model"]).critical_lr
          b = table[table.arm == arm_b].set_index(["num_layers", "d_model"]).critical_lr
          shared = [k for k in a.index if k in b.index]
          if len(shared) < 3:
            continue
          sizes = rows.set_index(["num_layers", "d_model"], drop=False)[axis][shared]
          own = {arm: table[table.arm == arm].set_index(["num_layers", "d_model"])
                 for arm in (arm_a, arm_b)}
          sd_a, sd_b = (measurement_sd(own[arm].critical_lr_low[shared],
                                       own[arm].critical_lr_high[shared])
                        for arm in (arm_a, arm_b))
          got = interaction(sizes.to_numpy(), a[shared].to_numpy(), b[shared].to_numpy(),
                            np.sqrt(sd_a ** 2 + sd_b ** 2))
          out.append({"dtype": dtype, "axis": axis, "arm_a": arm_a, "arm_b": arm_b,
                      "rungs": len(shared), **got})
  table = pd.DataFrame(out, columns=TEST_COLUMNS[:-2])
  table["p_holm"] = stats.holm(table.p) if len(table) else []
  test = "t-test of the slope of log10 ratio on log10 size"
  table["verdict"] = [stats.verdict_holm(test, str(r.rungs), r.p, r.p_holm, "changes with size")
                      for r in table.itertuples()]
  return table


def clip_table(rungs: list) -> pd.DataFrame:
  """ladder_clip.csv (schema.LADDER_CLIP_COLUMNS) from ladder_runs.search_rungs' rungs: per
  rung and arm the mean over its probes of the share of logged steps the gradient clip acted
  on (grad_norm > clip_norm; runs.csv's clipped_fraction), over every probe and over the probes
  the failure rule left alive (no failed_at). A clip that acts on most steps of one
  parametrization and on none of another makes their arms differ in more than the
  parametrization (issue 85)."""
  rows = []
  for size, runs, clip_norms in rungs:
    for arm, probes in runs.groupby("arm", sort=False):
      alive = (probes[probes.failed_at.isna()] if "failed_at" in probes
               else probes.iloc[:0])
      rows.append({**size, "arm": arm, "clip_norm": clip_norms.get(arm, math.nan),
                   "runs": len(probes), "clipped_fraction": float(probes.clipped_fraction.mean()),
                   "alive": len(alive),
                   "clipped_fraction_alive": (float(alive.clipped_fraction.mean()) if len(alive)
                                              else math.nan)})
  table = pd.DataFrame(rows, columns=list(schema.LADDER_CLIP_COLUMNS))
  return table.sort_values(["dtype", "arm", "num_layers", "d_model"], kind="stable")


def with_extrapolation(fits: pd.DataFrame, ladder: pd.DataFrame, targets: dict) -> pd.DataFrame:
  """fits (fit_table's) with each line's prediction at `targets[axis]` (the paper's size):
  `target`, `extrapolated`, `extrapolated_low`, `extrapolated_high` and `extrapolation`
  ("within the ladder" or "beyond the ladder: a trend check")."""
  fits = fits.copy()
  for column in ("target", "extrapolated", "extrapolated_low", "extrapolated_high"):
    fits[column] = math.nan
  fits["extrapolation"] = ""
  usable = ladder[np.isfinite(ladder.critical_lr) & (ladder.critical_lr > 0)]
  for i, r in zip(fits.index, fits.itertuples()):
    table = usable[(usable.arm == r.arm) & (usable.dtype == r.dtype)]
    rows = dict(_ladders(table)).get(r.axis)
    if rows is None or r.axis not in targets or len(rows) < 3:
      continue
    got = predict(rows[r.axis].to_numpy(), rows.critical_lr.to_numpy(), targets[r.axis],
                  measurement_sd(rows.critical_lr_low, rows.critical_lr_high))
    fits.loc[i, ["target", "extrapolated", "extrapolated_low", "extrapolated_high"]] = [
        targets[r.axis], got["predicted"], got["low"], got["high"]]
    fits.loc[i, "extrapolation"] = ("within the ladder" if got["within"]
                                    else "beyond the ladder: a trend check")
  return fits


def figure(ladder: pd.DataFrame, fits: pd.DataFrame):
  """Critical learning rate against size per axis (log-log): each arm's rungs with their
  intervals and its fitted line, one line style per dtype."""
  from matplotlib.figure import Figure
  from normstudy.analysis.plots import style
  axes_names = list(dict.fromkeys(fits.axis)) or ["params"]
  fig = Figure(figsize=(5 * len(axes_names), 4.2), layout="constrained")
  panels = np.atleast_1d(fig.subplots(1, len(axes_names)))
  arms = list(dict.fromkeys(ladder.arm))
  dtypes = list(dict.fromkeys(ladder.dtype))
  for ax, axis in zip(panels, axes_names):
    for r in fits[fits.axis == axis].itertuples():
      look = style(arms.index(r.arm))
      table = ladder[(ladder.arm == r.arm) & (ladder.dtype == r.dtype)]
      rows = dict(_ladders(table[np.isfinite(table.critical_lr)])).get(axis)
      if rows is None:
        continue
      marker = "os^v"[dtypes.index(r.dtype) % 4]
      ax.errorbar(rows[axis], rows.critical_lr,
                  yerr=[rows.critical_lr - rows.critical_lr_low,
                        rows.critical_lr_high - rows.critical_lr],
                  color=look["color"], marker=marker, linestyle="none", capsize=2)
      x = np.geomspace(rows[axis].min(), rows[axis].max(), 20)
      ax.plot(x, 10 ** (r.intercept + r.slope * np.log10(x)), color=look["color"],
              linestyle="-" if dtypes.index(r.dtype) == 0 else "--",
              label=f"{r.arm} ({r.dtype}): slope {r.slope:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel("critical learning rate (50% fail)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # no fitted arm on this axis: no legend
      ax.legend(fontsize=6)
  fig.suptitle("Critical learning rate against size (the ladder)")
  return fig


def analyze(ladder: pd.DataFrame, targets: dict, workdir: str, rungs=()) -> dict:
  """Writes ladder.csv, ladder_fit.csv (with the extrapolation to `targets`), ladder_tests.csv,
  ladder.png (+ .svg) and, from `rungs` (ladder_runs.search_rungs'), ladder_clip.csv into
  `workdir`; returns their paths."""
  import os
  from normstudy.analysis.plots import save
  fits = with_extrapolation(fit_table(ladder), ladder, targets)
  outputs = {"ladder": os.path.join(workdir, schema.LADDER),
             "ladder_fit": os.path.join(workdir, "ladder_fit.csv"),
             "ladder_tests": os.path.join(workdir, "ladder_tests.csv"),
             "ladder_figure": os.path.join(workdir, "ladder.png")}
  ladder.to_csv(outputs["ladder"], index=False)
  fits.to_csv(outputs["ladder_fit"], index=False)
  interaction_table(ladder).to_csv(outputs["ladder_tests"], index=False)
  save(figure(ladder, fits), outputs["ladder_figure"])
  if rungs:
    outputs["ladder_clip"] = os.path.join(workdir, schema.LADDER_CLIP)
    clip_table(list(rungs)).to_csv(outputs["ladder_clip"], index=False)
  return outputs
