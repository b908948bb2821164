"""The ladder's statistics (normstudy.analysis.ladder) against scipy, the matrix form of least
squares, and simulated ladders whose power law is known."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from normstudy.analysis import ladder

WIDTHS = np.array([32.0, 64.0, 128.0, 256.0])


def test_the_fit_is_least_squares_on_log_log():
  lrs = np.array([0.61, 0.35, 0.24, 0.11])
  line = ladder.fit(WIDTHS, lrs)
  ref = scipy_stats.linregress(np.log10(WIDTHS), np.log10(lrs))
  assert (line.slope, line.intercept) == pytest.approx((ref.slope, ref.intercept))
  half = scipy_stats.t.ppf(0.975, 2) * ref.stderr
  assert (line.slope_low, line.slope_high) == pytest.approx((ref.slope - half, ref.slope + half))
  fitted = ref.intercept + ref.slope * np.log10(WIDTHS)
  np.testing.assert_allclose(line.residuals, np.log10(lrs) - fitted, atol=1e-12)
  # The prediction interval of a new observation, from the matrix form: s^2 (1 + x0 (X'X)^-1 x0).
  X = np.column_stack([np.ones(4), np.log10(WIDTHS)])
  s2 = np.sum(np.asarray(line.residuals) ** 2) / 2
  x0 = np.array([1.0, math.log10(1024)])
  se = math.sqrt(s2 * (1 + x0 @ np.linalg.inv(X.T @ X) @ x0))
  centre = x0 @ np.linalg.lstsq(X, np.log10(lrs), rcond=None)[0]
  t = scipy_stats.t.ppf(0.975, 2)
  assert line.prediction(1024) == pytest.approx(
      (10 ** centre, 10 ** (centre - t * se), 10 ** (centre + t * se)))
  with pytest.raises(ValueError, match="two distinct sizes"):
    ladder.fit([64, 64], [0.1, 0.2])


def test_the_held_out_rung_is_predicted_from_the_others():
  lrs = np.array([0.61, 0.35, 0.24, 0.11])
  held = ladder.heldout(WIDTHS, lrs)
  predicted, low, high = ladder.fit(WIDTHS[:3], lrs[:3]).prediction(256)
  assert (held["predicted"], held["low"], held["high"]) == pytest.approx((predicted, low, high))
  assert held["measured"] == 0.11 and held["inside"] == (low <= 0.11 <= high)
  assert ladder.heldout(WIDTHS[:3], lrs[:3])["inside"] is None  # 2 rungs: no interval
  far = ladder.heldout(WIDTHS, np.array([0.4, 0.2, 0.1, 5.0]))
  assert far["inside"] is False and far["predicted"] == pytest.approx(0.05, rel=1e-9)


@pytest.mark.parametrize("noise", ["normal", "t3"])
def test_the_held_out_interval_covers_a_known_power_law(noise):
  """Simulated ladders: log10 critical lr = 0.3 - 0.7 log10 width plus noise of 0.06 decades
  per measured rung (normal, or Student t with 3 degrees of freedom: heavier tails than the
  interval assumes). The 95% prediction interval from three rungs covers the true value at the
  fourth in at least 90% of ladders, and the measured value about as often as it claims."""
  rng = np.random.default_rng(7)
  truth = 0.3 - 0.7 * np.log10(WIDTHS)
  covered_true = covered_measured = 0
  trials = 4000
  for _ in range(trials):
    e = (rng.normal(size=4) if noise == "normal" else rng.standard_t(3, size=4) / math.sqrt(3))
    measured = 10 ** (truth + 0.06 * e)
    held = ladder.heldout(WIDTHS, measured)
    covered_true += held["low"] <= 10 ** truth[-1] <= held["high"]
    covered_measured += bool(held["inside"])
  assert covered_true / trials >= 0.9
  if noise == "normal":  # exact under the model: 95% +- 3 standard errors
    assert abs(covered_measured / trials - 0.95) < 3 * math.sqrt(0.95 * 0.05 / trials)


def test_a_ratio_that_changes_with_size_is_the_interaction():
  a = np.array([0.40, 0.30, 0.20, 0.12])
  b = np.array([0.20, 0.17, 0.13, 0.10])
  got = ladder.interaction(WIDTHS, a, b)
  ref = scipy_stats.linregress(np.log10(WIDTHS), np.log10(a / b))
  assert got["slope"] == pytest.approx(ref.slope) and got["p"] == pytest.approx(ref.pvalue)
  assert got["df"] == 2
  same = ladder.interaction(WIDTHS, 2 * b, b)  # a constant ratio
  assert same["slope"] == pytest.approx(0, abs=1e-12) and same["p"] == pytest.approx(1.0)


def test_extrapolation_says_whether_it_is_within_the_ladder():
  lrs = 10 ** (0.3 - 0.7 * np.log10(WIDTHS))
  inside = ladder.predict(WIDTHS, lrs * [1.02, 0.98, 1.01, 0.99], 100)
  outside = ladder.predict(WIDTHS, lrs * [1.02, 0.98, 1.01, 0.99], 1024)
  assert inside["within"] and not outside["within"]
  assert outside["predicted"] == pytest.approx(10 ** (0.3 - 0.7 * math.log10(1024)), rel=0.05)
  assert outside["high"] / outside["low"] > inside["high"] / inside["low"]  # wider away


def test_the_fit_table_fits_each_ladder_on_its_own_axis():
  rows = []
  arms = {"pre_norm_clip1": (0.3, -0.7), "post_norm_deepnorm_clip1": (0.6, -0.5)}
  for arm, (a, b) in arms.items():
    for layers, width in [(4, 32), (4, 64), (4, 128), (4, 256), (8, 64), (16, 64), (24, 64)]:
      params = 12 * layers * width ** 2
      rows.append({"arm": arm, "dtype": "float16", "num_layers": layers, "d_model": width,
                   "params": params, "critical_lr": 10 ** (a + b * math.log10(params)),
                   "critical_lr_low": math.nan, "critical_lr_high": math.nan})
  table = ladder.fit_table(pd.DataFrame(rows, columns=ladder.LADDER_COLUMNS))
  assert list(table.columns) == ladder.FIT_COLUMNS
  got = table.set_index(["arm", "axis"])
  # Exact power laws in params: slope b in params, 2b in width (params ~ width^2), b in depth.
  assert got.loc[("pre_norm_clip1", "params"), "slope"] == pytest.approx(-0.7)
  assert got.loc[("pre_norm_clip1", "d_model"), "slope"] == pytest.approx(-1.4)
  assert got.loc[("pre_norm_clip1", "num_layers"), "slope"] == pytest.approx(-0.7)
  assert got.loc[("post_norm_deepnorm_clip1", "d_model"), "rungs"] == 4
  assert got.loc[("post_norm_deepnorm_clip1", "num_layers"), "rungs"] == 4  # 4, 8, 16, 24 at 64
  assert got.loc[("pre_norm_clip1", "params"), "heldout_measured"] == pytest.approx(
      10 ** (0.3 - 0.7 * math.log10(12 * 4 * 256 ** 2)))  # the largest: 4 x 256
