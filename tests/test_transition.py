"""The failure threshold as a noisy transition (normstudy.analysis.transition) and the search
that feeds it (normstudy.experiments.search's probe round): the fit against scipy's optimiser and a
brute-force profile, and the coverage of its intervals in simulated worlds whose failure
probability is a known logistic function of the learning rate."""

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as scipy_stats

from normstudy.analysis import transition
from normstudy.experiments import search


def _negative_loglik(params, x, y):
  center, slope = params
  z = slope * (x - center)
  return -float(np.sum(y * z - np.logaddexp(0.0, z)))


def test_the_fit_is_scipys_maximum_likelihood_and_its_profile_interval():
  rng = np.random.default_rng(4)
  x = rng.uniform(-1.0, 0.0, 60)
  y = (rng.random(60) < 1 / (1 + np.exp(-12.0 * (x + 0.5)))).astype(float)
  fit = transition.fit(x, y)
  best = optimize.minimize(_negative_loglik, [-0.5, 5.0], args=(x, y), method="Nelder-Mead",
                           options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 20000})
  assert fit.center == pytest.approx(best.x[0], abs=1e-4)
  assert fit.width == pytest.approx(transition.WIDTH_PER_SLOPE / best.x[1], rel=1e-3)
  # The interval's ends: where the profile (the best slope for each center, by scipy) has
  # fallen 1.92 below the maximum.
  def drop(center):
    profiled = optimize.minimize_scalar(lambda b: _negative_loglik([center, b], x, y),
                                        bounds=(0, transition.MAX_SLOPE), method="bounded")
    return profiled.fun - best.fun - transition.CUTOFF
  low = optimize.brentq(drop, best.x[0] - 1, best.x[0])
  high = optimize.brentq(drop, best.x[0], best.x[0] + 1)
  assert fit.center_low == pytest.approx(low, abs=2 * transition.GRID_STEP)
  assert fit.center_high == pytest.approx(high, abs=2 * transition.GRID_STEP)
  assert 1 / (1 + math.exp(0)) == pytest.approx(fit.probability(fit.center))


def test_separated_probes_put_the_center_in_the_gap_at_the_steepest_slope():
  x = np.array([-1.0, -0.8, -0.6, -0.5, -0.4, -0.2])
  y = np.array([0, 0, 0, 1, 1, 1], dtype=float)
  fit = transition.fit(x, y)
  # Complete separation: the likelihood rises with the slope up to its cap, the center anywhere
  # in the gap; gentler curves centred a little outside it are within the interval too.
  assert -0.6 < fit.center < -0.5 and fit.center_low < -0.6 and fit.center_high > -0.5
  assert fit.width == fit.width_low == pytest.approx(
      transition.WIDTH_PER_SLOPE / transition.MAX_SLOPE)
  assert math.isfinite(fit.width_high)
  assert transition.fit(x, np.zeros(6)) is None and transition.fit(x, np.ones(6)) is None


def _simulated_search(center, width, rng, rounds, probe_decades, seeds=6):
  """Every probe (log10 lr, failed) of a search of `seeds` points whose failures are drawn from
  P(fail) = sigmoid(slope (log10 lr - center))."""
  slope = transition.WIDTH_PER_SLOPE / width
  probes = []

  def train_round(k, todo):
    del k
    out = {}
    for point, values in todo.items():
      for v in values:
        failed = bool(rng.random() < 1 / (1 + math.exp(-slope * (math.log10(v) - center))))
        out.setdefault(point, {})[v] = failed
        probes.append((math.log10(v), failed))
    return out

  spec = search.Search.parse("optimizer.learning_rate:0.1,1", rounds, probe_decades)
  search.run(spec, list(range(seeds)), train_round)
  return np.array(probes, dtype=float).T


@pytest.mark.slow
@pytest.mark.parametrize("critical,width", [(0.25, 0.15), (0.25, 0.4), (0.4, 0.05),
                                            (0.2, 0.25)])
def test_the_intervals_cover_the_truth_at_least_90_percent_of_the_time(critical, width):
  """300 searches as make survival runs them (6 seeds, 4 rounds from [0.1, 1], probes 1/8
  decade either side): the 95% intervals of the center and of the width each cover the truth
  in at least 90% of them."""
  rng = np.random.default_rng(int(critical * 1000 + width * 100))
  center = math.log10(critical)
  covered_center = covered_width = fitted = 0
  for _ in range(300):
    x, y = _simulated_search(center, width, rng, rounds=4, probe_decades=0.125)
    fit = transition.fit(x, y)
    if fit is None:
      continue
    fitted += 1
    covered_center += fit.center_low <= center <= fit.center_high
    covered_width += fit.width_low <= width <= fit.width_high
  assert fitted >= 295
  assert covered_center / fitted >= 0.90
  assert covered_width / fitted >= 0.90


def test_the_probe_round_trains_either_side_of_each_midpoint_and_changes_no_bracket():
  spec = search.Search.parse("optimizer.learning_rate:0.1,1", 3, 0.125)
  assert spec.total_rounds == 4
  trained = {}

  def train_round(k, todo):
    trained[k] = todo
    return {p: {v: v >= 0.3 for v in values} for p, values in todo.items()}

  history = search.run(spec, ["a"], train_round)
  final = history["a"][-1]
  assert len(history["a"]) == 3 and final.established
  assert trained[4]["a"] == pytest.approx([final.midpoint * 10 ** -0.125,
                                           final.midpoint * 10 ** 0.125], rel=1e-5)
  assert search.run(spec, ["a"], train_round, last_round=2)["a"] == history["a"][:2]
  with pytest.raises(Exception, match=r"--probe_decades=-0.1 is not allowed"):
    search.Search.parse("optimizer.learning_rate:0.1,1", 3, -0.1)


@pytest.mark.parametrize("probes, failed_at, beyond_the_slope_grid",
                         [(24, range(3), False), (30, [*range(13), 27], True)])
def test_probes_whose_failures_fall_with_the_rate_are_no_transition_across_them(
    probes, failed_at, beyond_the_slope_grid):
  """Failures at the low rates, survivals at the high ones: the rising curve describes them
  best as a near-constant failure rate, its center far outside the probes with a shallow slope,
  beyond the center's grid and (the second case) the slope's too; both raised an IndexError
  until 2026-12-05. The center's interval is then open at both ends and the width's above."""
  x = np.linspace(-1.1, 0.1, probes)
  y = np.zeros(len(x))
  y[list(failed_at)] = 1
  # The premise, in plain numpy: the logistic likelihood's maximum over a wide grid lies far
  # beyond the probes' center grid, at a slope below the slope grid's least.
  c = np.linspace(-40, 40, 801)[:, None, None]
  slopes = np.geomspace(1e-3, transition.MAX_SLOPE, 200)[None, :, None]
  z = slopes * (x - c)
  likelihood = np.sum(y * z - np.logaddexp(0, z), axis=-1)
  best_c, best_slope = np.unravel_index(likelihood.argmax(), likelihood.shape)
  assert c.ravel()[best_c] > x.max() + transition.MARGIN
  assert slopes.ravel()[best_slope] < transition.MIN_SLOPE
  fit = transition.fit(x, y)
  assert math.isnan(fit.center_low) and math.isnan(fit.center_high)
  assert fit.width_high == math.inf and fit.width > x.max() - x.min()
  assert fit.runs == len(x) and fit.failed == len(failed_at)
  if beyond_the_slope_grid:  # no slope on the grid is inside: every slope below its least is
    assert fit.width_low == pytest.approx(transition.WIDTH_PER_SLOPE / transition.MIN_SLOPE)
  statistic, p = transition.same_center_lrt((x, y), (x, (x > -0.5).astype(float)))
  assert statistic >= 0 and 0 <= p <= 1


def test_the_equivalence_factor_is_where_the_log_ratios_profile_falls_by_the_tost_cutoff():
  # Brute force: for a fixed log ratio d, the best common center and two slopes by scipy; the
  # two one-sided likelihood-ratio tests at 5% rule out every d whose profile lies more than
  # chi2(1, 0.90) / 2 below the maximum, and the factor is 10^max|d| of those not ruled out.
  rng = np.random.default_rng(21)

  def arm(center, n=40):
    x = rng.uniform(center - 0.5, center + 0.5, n)
    return x, (rng.random(n) < 1 / (1 + np.exp(-12.0 * (x - center)))).astype(float)

  a, b = arm(-0.6), arm(-0.5)

  def best(d):
    def negative(params):
      center, slope_a, slope_b = params
      return (_negative_loglik([center, slope_a], *a)
              + _negative_loglik([center - d, slope_b], *b))
    starts = [[-0.6, 10.0, 10.0], [-0.5, 20.0, 5.0]]
    return min(optimize.minimize(negative, s, method="L-BFGS-B",
                                 bounds=[(-3, 2), (0, transition.MAX_SLOPE),
                                         (0, transition.MAX_SLOPE)]).fun for s in starts)

  fa, fb = transition.fit(*a), transition.fit(*b)
  top = -best(fa.center - fb.center)
  cutoff = scipy_stats.chi2.ppf(0.90, 1) / 2
  drop = lambda d: -best(d) - (top - cutoff)  # noqa: E731
  centre = fa.center - fb.center
  low = optimize.brentq(drop, centre - 1.0, centre)
  high = optimize.brentq(drop, centre, centre + 1.0)
  factor = transition.equivalence_factor(a, b)
  assert math.log10(factor) == pytest.approx(max(abs(low), abs(high)),
                                             abs=3 * transition.GRID_STEP)
  # Ratios beyond the factor are ruled out; 0 is not (the arms are 0.1 decades apart).
  assert math.log10(factor) > abs(centre)
