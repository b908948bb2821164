"""Does the critical learning rate transfer? The ladder under a parametrization against the
standard parametrization's ladder (`make ladder-mup`; normstudy.core.parametrizations).

Per arm, dtype and size axis (d_model on the width rungs, num_layers on the depth rungs), with the
ladder's model (normstudy.analysis.ladder_report: log10 critical_lr = a + b log10 size, least squares, its
scatter floored by the rungs' own measurement SD):
  slope = 0        the t-test of the slope (n - 2 degrees of freedom): a parametrization under
                   which the rate transfers has slope 0
  slope = sp's     the t-test of the slope of log10(critical_lr / sp's critical_lr) at the rungs
                   both measured (normstudy.analysis.ladder_report.interaction): whether the
                   parametrization changed how the rate moves with size
both families Holm-adjusted together over every row. The held-out rung: the largest rung against
the fit over the others (the ladder's `heldout`), against a flat law (slope 0) and against a law
with sp's slope through the other rungs, each with its 95% t prediction interval; and the fit over
every rung extrapolated to the target size (a trend check beyond the ladder).
"""

import math
import os

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.analysis import ladder_report as ladder_stats

COLUMNS = ["parametrization", "arm", "dtype", "axis", "slope", "low", "high", "rungs",
           "p_slope_zero", "p_slope_zero_holm", "sp_arm", "sp_slope", "sp_low", "sp_high",
           "slope_vs_sp", "p_same_as_sp", "p_same_as_sp_holm", "heldout_measured",
           "heldout_predicted", "heldout_low", "heldout_high", "heldout_inside",
           "flat_predicted", "flat_low", "flat_high", "flat_inside", "sp_slope_predicted",
           "sp_slope_low", "sp_slope_high", "sp_slope_inside", "target", "extrapolated",
           "extrapolated_low", "extrapolated_high"]
AXES = ("d_model", "num_layers")
TABLE = "ladder_parametrization.csv"


def slope_test(line: ladder_stats.Fit) -> float:
  """The two-sided p of the t-test of a fitted slope against 0 (n - 2 degrees of freedom, the
  fit's floored scatter); NaN with fewer than 3 rungs."""
  df = line.n - 2
  if df < 1 or not np.isfinite(line.sd):
    return math.nan
  se = line.sd / math.sqrt(line.sxx)
  if se == 0:
    return 1.0 if line.slope == 0 else 0.0
  return float(2 * scipy_stats.t.sf(abs(line.slope / se), df))


def slope_law_prediction(sizes, critical_lrs, slope: float, at: float, measured_sd=None):
  """What a law of the given `slope` through the rungs predicts at size `at`: (predicted, low,
  high), the flat law's t prediction interval (normstudy.analysis.ladder_report.flat_prediction) of the
  detrended values log10 y - slope log10 x, moved back along the slope. slope 0 is the flat law."""
  x = np.log10(np.asarray(sizes, dtype=float))
  detrended = 10 ** (np.log10(np.asarray(critical_lrs, dtype=float)) - slope * x)
  centre, low, high = ladder_stats.flat_prediction(detrended, measured_sd)
  shift = 10 ** (slope * math.log10(at))
  return centre * shift, low * shift, high * shift


def _rungs(table: pd.DataFrame, arm: str, dtype: str, axis: str) -> pd.DataFrame:
  rows = table[(table.arm == arm) & (table.dtype == dtype) & np.isfinite(table.critical_lr)
               & (table.critical_lr > 0)]
  return dict(ladder_stats._ladders(rows)).get(axis, rows.iloc[0:0])


def with_own_controls(reference: pd.DataFrame, ladder: pd.DataFrame, sp_arms) -> pd.DataFrame:
  """sp's rungs for the comparison: `reference` (the committed sp ladder's ladder.csv rows),
  with the ladder's own rows of the arms in `sp_arms` (an sp control trained beside the
  parametrized arms, configs/ladder_sp_control.py) replacing it at the same arm, dtype and size
  and adding the rungs it lacks (4 x 256, 4 x 512, 32 layers)."""
  key = ["arm", "dtype", "num_layers", "d_model"]
  own = ladder[ladder.arm.isin(list(sp_arms))]
  if own.empty:
    return reference
  kept = reference.merge(own[key], on=key, how="left", indicator=True)
  kept = reference[(kept["_merge"] == "left_only").to_numpy()]
  return pd.concat([kept, own[reference.columns]], ignore_index=True)


def transfer_table(ladder: pd.DataFrame, reference: pd.DataFrame, arms: dict,
                   parametrizations: dict, targets: dict) -> pd.DataFrame:
  """ladder_parametrization.csv (COLUMNS) from the parametrized ladder's ladder.csv rows,
  sp's (`reference`, the same columns), `arms` {arm: its sp arm} and `parametrizations`
  {arm: name}."""
  from normstudy.analysis import stats
  out = []
  for arm, sp_arm in arms.items():
    for dtype in dict.fromkeys(ladder[ladder.arm == arm].dtype):
      for axis in AXES:
        rows = _rungs(ladder, arm, dtype, axis)
        if len(rows) < 3:
          continue
        own_sd = ladder_stats.measurement_sd(rows.critical_lr_low, rows.critical_lr_high)
        line = ladder_stats.fit(rows[axis], rows.critical_lr, own_sd)
        sp_rows = _rungs(reference, sp_arm, dtype, axis)
        sp_line = (ladder_stats.fit(sp_rows[axis], sp_rows.critical_lr,
                                    ladder_stats.measurement_sd(sp_rows.critical_lr_low,
                                                                sp_rows.critical_lr_high))
                   if len(sp_rows) >= 3 else None)
        key = ["num_layers", "d_model"]
        mine, theirs = rows.set_index(key, drop=False), sp_rows.set_index(key, drop=False)
        shared = [k for k in mine.index if k in theirs.index]
        same = {"slope": math.nan, "p": math.nan}
        if len(shared) >= 3:
          sd = np.sqrt(
              ladder_stats.measurement_sd(mine.critical_lr_low[shared],
                                          mine.critical_lr_high[shared]) ** 2
              + ladder_stats.measurement_sd(theirs.critical_lr_low[shared],
                                            theirs.critical_lr_high[shared]) ** 2)
          same = ladder_stats.interaction(mine[axis][shared].to_numpy(),
                                          mine.critical_lr[shared].to_numpy(),
                                          theirs.critical_lr[shared].to_numpy(), sd)
        sizes, lrs = rows[axis].to_numpy(), rows.critical_lr.to_numpy()
        held = ladder_stats.heldout(sizes, lrs, own_sd)
        largest = int(np.argmax(sizes))
        rest = np.arange(len(sizes)) != largest
        sp_law = ((math.nan,) * 3 if sp_line is None else slope_law_prediction(
            sizes[rest], lrs[rest], sp_line.slope, sizes[largest], own_sd[rest]))
        extrapolated = (ladder_stats.predict(sizes, lrs, targets[axis], own_sd)
                        if axis in targets else {"predicted": math.nan, "low": math.nan,
                                                 "high": math.nan})
        out.append({
            "parametrization": parametrizations.get(arm, "sp"), "arm": arm, "dtype": dtype,
            "axis": axis, "slope": line.slope, "low": line.slope_low, "high": line.slope_high,
            "rungs": len(rows), "p_slope_zero": slope_test(line), "sp_arm": sp_arm,
            "sp_slope": math.nan if sp_line is None else sp_line.slope,
            "sp_low": math.nan if sp_line is None else sp_line.slope_low,
            "sp_high": math.nan if sp_line is None else sp_line.slope_high,
            "slope_vs_sp": same["slope"], "p_same_as_sp": same["p"],
            "heldout_measured": held["measured"], "heldout_predicted": held["predicted"],
            "heldout_low": held["low"], "heldout_high": held["high"],
            "heldout_inside": held["inside"], "flat_predicted": held["flat_predicted"],
            "flat_low": held["flat_low"], "flat_high": held["flat_high"],
            "flat_inside": held["flat_inside"], "sp_slope_predicted": sp_law[0],
            "sp_slope_low": sp_law[1], "sp_slope_high": sp_law[2],
            "sp_slope_inside": (bool(sp_law[1] <= held["measured"] <= sp_law[2])
                                if np.isfinite(sp_law[1]) else None),
            "target": targets.get(axis, math.nan), "extrapolated": extrapolated["predicted"],
            "extrapolated_low": extrapolated["low"], "extrapolated_high": extrapolated["high"]})
  table = pd.DataFrame(out, columns=[c for c in COLUMNS if not c.endswith("_holm")])
  # One family: every "slope = 0" and "slope = sp's" test of the table.
  ps = list(table.p_slope_zero) + list(table.p_same_as_sp)
  finite = [i for i, p in enumerate(ps) if np.isfinite(p)]
  adjusted = [math.nan] * len(ps)
  for i, q in zip(finite, stats.holm([ps[i] for i in finite]) if finite else []):
    adjusted[i] = float(q)
  table["p_slope_zero_holm"] = adjusted[:len(table)]
  table["p_same_as_sp_holm"] = adjusted[len(table):]
  return table[COLUMNS]


def figure(ladder: pd.DataFrame, reference: pd.DataFrame, table: pd.DataFrame):
  """ladder_parametrization.png: per size axis and dtype (panels), each parametrized arm's rungs
  with their intervals and fitted line (solid) beside its sp arm's (dashed, open markers)."""
  from matplotlib.figure import Figure
  from normstudy.analysis.plots import style
  panels_of = list(dict.fromkeys(zip(table.axis, table.dtype)))
  fig = Figure(figsize=(4.2 * max(1, len(panels_of)), 4.0), layout="constrained")
  axes = np.atleast_1d(fig.subplots(1, max(1, len(panels_of))))
  arms = list(dict.fromkeys(table.arm))
  for ax, (axis, dtype) in zip(axes, panels_of):
    for r in table[(table.axis == axis) & (table.dtype == dtype)].itertuples():
      look = style(arms.index(r.arm))
      for source, arm, line, fill in ((ladder, r.arm, "-", look["color"]),
                                      (reference, r.sp_arm, "--", "none")):
        rows = _rungs(source, arm, dtype, axis).sort_values(axis)
        if rows.empty:
          continue
        ax.errorbar(rows[axis], rows.critical_lr,
                    yerr=[rows.critical_lr - rows.critical_lr_low,
                          rows.critical_lr_high - rows.critical_lr],
                    color=look["color"], marker="o", markerfacecolor=fill, linestyle=line,
                    capsize=2, label=(f"{arm}: slope {r.slope:.2f}" if line == "-" else
                                      f"  sp ({arm}): slope {r.sp_slope:.2f}"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel("critical learning rate (50% fail)")
    ax.set_title(f"{axis}, {dtype}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=5)
  fig.suptitle("Critical learning rate against size, under each parametrization and under sp")
  return fig


def analyze(ladder: pd.DataFrame, reference: pd.DataFrame, arms: dict, parametrizations: dict,
            targets: dict, workdir: str) -> dict:
  """Writes ladder_parametrization.csv and ladder_parametrization.png (+ .svg) into `workdir`;
  returns their paths."""
  from normstudy.analysis.plots import save
  path = os.path.join(workdir, TABLE)
  table = transfer_table(ladder, reference, arms, parametrizations, targets)
  table.to_csv(path, index=False)
  picture = os.path.join(workdir, "ladder_parametrization.png")
  save(figure(ladder, reference, table), picture)
  return {"ladder_parametrization": path, "ladder_parametrization_figure": picture}
