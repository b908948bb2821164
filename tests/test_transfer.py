"""ladder_parametrization.csv (normstudy.analysis.transfer) against independent computations:
scipy's linregress for the slope tests, a plain Holm transcription, and exact lines."""

import math

import numpy as np
import pandas as pd
from scipy import stats

from normstudy.analysis import transfer


def _rows(arm, dtype, widths, lrs, halfwidth=1e-4):
  return [{"arm": arm, "dtype": dtype, "num_layers": 4, "d_model": w, "params": 1000 * w,
           "critical_lr": lr, "critical_lr_low": lr * (1 - halfwidth),
           "critical_lr_high": lr * (1 + halfwidth)} for w, lr in zip(widths, lrs)]


def _holm(ps):
  order = np.argsort(ps)
  out, running = np.empty(len(ps)), 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
    out[i] = running
  return out


def test_slopes_tests_and_predictions_match_independent_computations():
  widths = [16, 32, 64, 128]
  rng = np.random.default_rng(0)
  mup = 0.5 * np.exp(0.05 * rng.normal(size=4))  # flat, with noise
  sp = 0.5 * (np.array(widths) / 32.0) ** -0.8 * np.exp(0.05 * rng.normal(size=4))
  ladder = pd.DataFrame(_rows("a_mup", "float16", widths, mup))
  reference = pd.DataFrame(_rows("a", "float16", widths, sp))
  table = transfer.transfer_table(ladder, reference, {"a_mup": "a"}, {"a_mup": "mup"},
                                  {"d_model": 1024})
  assert list(table.columns) == transfer.COLUMNS
  (row,) = table.itertuples()
  x = np.log10(widths)
  own = stats.linregress(x, np.log10(mup))
  assert row.parametrization == "mup" and row.axis == "d_model" and row.rungs == 4
  assert math.isclose(row.slope, own.slope, rel_tol=1e-9)
  assert math.isclose(row.p_slope_zero, own.pvalue, rel_tol=1e-6)
  ratio = stats.linregress(x, np.log10(mup / sp))
  assert math.isclose(row.slope_vs_sp, ratio.slope, rel_tol=1e-9)
  assert math.isclose(row.p_same_as_sp, ratio.pvalue, rel_tol=1e-6)
  holm = _holm(np.array([own.pvalue, ratio.pvalue]))
  assert math.isclose(row.p_slope_zero_holm, holm[0], rel_tol=1e-6)
  assert math.isclose(row.p_same_as_sp_holm, holm[1], rel_tol=1e-6)
  # sp's slope, through the three smaller rungs, at the largest: the mean of the detrended
  # values moved along sp's slope.
  b = stats.linregress(x, np.log10(sp)).slope
  centre = np.mean(np.log10(mup[:3]) - b * x[:3]) + b * x[3]
  assert math.isclose(row.sp_slope_predicted, 10 ** centre, rel_tol=1e-9)
  assert row.heldout_measured == mup[3]


def test_a_law_of_the_data_s_own_slope_predicts_an_exact_line_exactly():
  widths = np.array([16.0, 32.0, 64.0, 128.0])
  lrs = 0.3 * (widths / 16) ** -0.5
  predicted, low, high = transfer.slope_law_prediction(widths[:3], lrs[:3], -0.5, 128.0)
  assert math.isclose(predicted, lrs[3], rel_tol=1e-12)
  assert low <= predicted <= high


def test_the_ladders_own_sp_control_replaces_and_extends_the_committed_reference():
  """sp's rungs for the comparison: the committed reference where the ladder trained no sp
  control, the ladder's own control where it did (the same sitting), and the rungs only the
  control has (4 x 256, 4 x 512); other arms of the ladder are not sp's."""
  reference = pd.DataFrame(_rows("a", "float16", [16, 32, 64, 128], [0.8, 0.6, 0.4, 0.3])
                           + _rows("b", "float16", [16, 32], [0.9, 0.7]))
  ladder = pd.DataFrame(_rows("a", "float16", [64, 128, 256, 512], [0.41, 0.29, 0.2, 0.15])
                        + _rows("a_mup", "float16", [16, 512], [0.5, 0.5]))
  merged = transfer.with_own_controls(reference, ladder, {"a", "b"})
  got = {(r.arm, r.d_model): r.critical_lr for r in merged.itertuples()}
  expected = {("a", 16): 0.8, ("a", 32): 0.6, ("a", 64): 0.41, ("a", 128): 0.29,
              ("a", 256): 0.2, ("a", 512): 0.15, ("b", 16): 0.9, ("b", 32): 0.7}
  assert got == expected and len(merged) == len(expected)
  assert list(merged.columns) == list(reference.columns)
  # Without a control in the ladder the reference is used as committed.
  alone = transfer.with_own_controls(reference, ladder[ladder.arm == "a_mup"], {"a", "b"})
  assert alone.equals(reference)
