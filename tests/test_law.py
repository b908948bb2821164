"""The survival law over the learning rate (normstudy.analysis.law): the censored fit against
closed forms (the exponential law's events over exposure; least squares without censoring), the
profile intervals against scipy's constrained optimum, the coverage of its intervals in
simulated worlds with a known law, the floor's test, and the tests between arms."""

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as scipy_stats

from normstudy.analysis import law

# The drift experiment's design (configs/drift.py): 7 rates 1/6 decade apart, 3 seeds.
LRS = np.array([10 ** (e / 6) for e in range(-10, -3)])


def _world(a, b, sigma, name, rng, horizon, seeds=3, lrs=LRS):
  """Runs whose failure times follow ln T = a + b log10 lr + sigma W, censored at `horizon`."""
  x = np.repeat(np.log10(lrs), seeds)
  w = (rng.standard_normal(len(x)) if name == "lognormal"
       else np.log(rng.exponential(size=len(x))))  # ln of Exp(1): minimum extreme value
  t = np.exp(a + b * x + sigma * w)
  failed = t <= horizon
  return law.Data.of(10 ** x, np.where(failed, t, horizon), failed)


def test_the_exponential_law_with_censoring_is_events_over_exposure():
  # sigma held at 1, the Weibull law is the exponential: at each rate the hazard's maximum
  # likelihood is (failures) / (total time at risk), failures and survivors' times alike. Two
  # rates, two parameters: the fit reproduces each rate's closed form exactly.
  lrs = [0.1] * 5 + [0.01] * 6
  times = [30, 55, 90, 200, 200, 400, 800, 1000, 1000, 1000, 1000]
  failed = [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0]
  fitted = law.fit(law.Data.of(lrs, times, failed), "weibull", fixed_sigma=1.0)
  for lr, span in ((0.1, slice(0, 5)), (0.01, slice(5, 11))):
    hazard = sum(failed[span]) / sum(times[span])
    mean_time = fitted.median_time(lr) / math.log(2)  # the exponential's median is ln 2 / rate
    assert mean_time == pytest.approx(1 / hazard, rel=1e-6)
  assert fitted.sigma == 1.0


def test_without_censoring_the_lognormal_law_is_least_squares():
  rng = np.random.default_rng(0)
  x = np.repeat(np.log10(LRS), 4)
  log_t = 2.0 - 3.0 * x + 0.3 * rng.standard_normal(len(x))
  fitted = law.fit(law.Data.of(10 ** x, np.exp(log_t), np.ones(len(x), bool)))
  slope, intercept = np.polyfit(x, log_t, 1)
  residuals = log_t - (intercept + slope * x)
  assert (fitted.a, fitted.b) == (pytest.approx(intercept, abs=1e-5),
                                  pytest.approx(slope, abs=1e-5))
  # Maximum likelihood's variance divides by n, not n - 2.
  assert fitted.sigma == pytest.approx(math.sqrt(np.mean(residuals ** 2)), rel=1e-4)


def test_the_cutoff_makes_the_uncensored_lognormal_interval_the_t_interval():
  # Without censoring the log-normal law is a regression, and its profile likelihood for a
  # coefficient is n/2 ln(1 + t^2 / (n - 2)) at Student's t statistic t: the cutoff at t(0.975,
  # n - 2) is the exact 95% t interval of the median at a rate, computed here by least squares.
  rng = np.random.default_rng(1)
  x = np.repeat(np.log10(LRS), 3)
  log_t = 2.0 - 3.0 * x + 0.3 * rng.standard_normal(len(x))
  fitted = law.fit(law.Data.of(10 ** x, np.exp(log_t), np.ones(len(x), bool)))
  n, x0 = len(x), math.log10(0.05)
  slope, intercept = np.polyfit(x, log_t, 1)
  s2 = np.sum((log_t - intercept - slope * x) ** 2) / (n - 2)
  se = math.sqrt(s2 * (1 / n + (x0 - x.mean()) ** 2 / np.sum((x - x.mean()) ** 2)))
  half = scipy_stats.t.ppf(0.975, n - 2) * se
  low, high = fitted.median_time_interval(0.05)
  centre = intercept + slope * x0
  assert (math.log(low), math.log(high)) == (pytest.approx(centre - half, abs=1e-3),
                                             pytest.approx(centre + half, abs=1e-3))
  assert law.cutoff(n) > law.CUTOFF and law.cutoff(10_000) == pytest.approx(law.CUTOFF, rel=1e-3)


def _negative(theta, name, data):
  a, b, log_sigma = theta
  value, _, _ = law.log_likelihood(name, np.log(data.t), data.event, a + b * data.x, log_sigma)
  return -float(value.sum())


@pytest.mark.parametrize("name", law.LAWS)
def test_fit_and_profile_interval_against_scipys_constrained_optimum(name):
  rng = np.random.default_rng(3)
  data = _world(1.0, -4.0, 0.3, name, rng, horizon=960)
  fitted = law.fit(data, name)
  best = optimize.minimize(_negative, [fitted.a + 0.2, fitted.b - 0.3, -1.0],
                           args=(name, data), method="Nelder-Mead",
                           options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 40000})
  assert -best.fun == pytest.approx(fitted.loglik, abs=1e-6)
  # The interval of lr*(H): where the largest likelihood among laws with x*(H) = q (a = ln H -
  # sigma w50 - b q, by scipy's SLSQP) has fallen by the cutoff from the maximum.
  horizon, w50 = 1920.0, law.median_quantile(name)

  def drop(q):
    constraint = {"type": "eq", "fun": lambda th: th[0] - (
        math.log(horizon) - math.exp(th[2]) * w50 - th[1] * q)}
    held = optimize.minimize(_negative, [fitted.a, fitted.b, math.log(fitted.sigma)],
                             args=(name, data), constraints=[constraint], method="SLSQP",
                             options={"ftol": 1e-12, "maxiter": 500})
    return -held.fun - (fitted.loglik - law.cutoff(data.failures))

  estimate = math.log10(fitted.critical_lr(horizon))
  low, high = fitted.critical_lr_interval(horizon)
  assert math.log10(low) == pytest.approx(optimize.brentq(drop, estimate - 1, estimate),
                                          abs=2e-3)
  assert math.log10(high) == pytest.approx(optimize.brentq(drop, estimate, estimate + 1),
                                           abs=2e-3)
  # The median time and the failure probability agree with the law's formulas.
  assert fitted.failure_probability(fitted.critical_lr(horizon), horizon) == pytest.approx(0.5)
  assert fitted.median_time(fitted.critical_lr(horizon)) == pytest.approx(horizon)


# (law, a, b, sigma, horizon of the runs, seeds, the horizon whose lr* is checked, the rate
# whose T50 and failure probability at the checked horizon are checked). The first is the drift
# experiment as fitted (slope -4: Pre-LN's at 480-960 steps) predicting twice its horizon; the
# second a Weibull world censored at half of it; the third a noisier law extrapolated 2 decades.
SETTINGS = [
    ("lognormal", 1.0, -4.0, 0.25, 960, 3, 1920.0, 0.05),
    ("weibull", 1.5, -3.5, 0.35, 480, 3, 960.0, 0.1),
    ("lognormal", 0.5, -3.0, 0.5, 960, 4, 1e5, 0.068),
]


@pytest.mark.slow
@pytest.mark.parametrize("setting", SETTINGS, ids=["drift-2x", "weibull-censored", "noisy-1e5"])
def test_intervals_cover_the_true_law_in_simulated_worlds(setting):
  name, a, b, sigma, horizon, seeds, checked, lr = setting
  truth = law.Law(name, a, b, sigma, 0.0, None)
  rng = np.random.default_rng(11)
  covered = {"critical_lr": 0, "median_time": 0, "failure_probability": 0}
  experiments = 0
  while experiments < 200:
    data = _world(a, b, sigma, name, rng, horizon, seeds)
    try:
      fitted = law.fit(data, name)
    except ValueError:  # failures at fewer than 2 rates: no law (not counted)
      continue
    experiments += 1
    for key, (low, high), true in (
        ("critical_lr", fitted.critical_lr_interval(checked), truth.critical_lr(checked)),
        ("median_time", fitted.median_time_interval(lr), truth.median_time(lr)),
        ("failure_probability", fitted.failure_probability_interval(lr, checked),
         truth.failure_probability(lr, checked))):
      covered[key] += int(not low > true) * int(not high < true)  # an open end covers
  rates = {key: count / experiments for key, count in covered.items()}
  assert all(rate >= 0.90 for rate in rates.values()), rates


def test_lognormal_and_weibull_are_chosen_by_their_likelihood():
  rng = np.random.default_rng(5)
  worlds = [_world(1.2, -3.5, 0.3, "weibull", rng, horizon=2000, seeds=6) for _ in range(3)]
  chosen, totals = law.choose_law(worlds)
  assert chosen == "weibull" and totals["weibull"] > totals["lognormal"]
  worlds = [_world(1.2, -3.5, 0.3, "lognormal", rng, horizon=2000, seeds=6) for _ in range(3)]
  assert law.choose_law(worlds)[0] == "lognormal"


@pytest.mark.slow
def test_the_floor_is_found_where_there_is_one_and_not_where_there_is_none():
  rng = np.random.default_rng(7)
  lrs = np.geomspace(0.02, 0.3, 10)
  x = np.repeat(lrs, 5)
  floored = np.exp(1.0 - 3.0 * np.log10(np.maximum(x - 0.04, 1e-12)) +
                   0.2 * rng.standard_normal(len(x)))
  floored[x <= 0.04] = np.inf  # at or below the floor nothing fails
  failed = floored <= 3000
  found = law.fit_floor(law.Data.of(x, np.where(failed, floored, 3000), failed), "lognormal")
  assert found.p < 0.01 and found.low <= 0.04 <= found.high
  # The law without a floor fitted to a world without one: the floor's test is a one-sided
  # likelihood ratio on the boundary, rejecting at about its level (checked over worlds).
  rejected = 0
  for _ in range(40):
    plain = _world(1.0, -4.0, 0.25, "lognormal", rng, horizon=960)
    rejected += law.fit_floor(plain, "lognormal", points=30).p < 0.05
  assert rejected <= 6  # 40 x 0.05 = 2 expected; binomial P(>= 7) < 0.01


def test_tests_between_arms_find_a_shift_and_keep_their_level():
  rng = np.random.default_rng(9)
  a = _world(1.0, -4.0, 0.25, "lognormal", rng, horizon=960, seeds=4)
  shifted = _world(2.0, -4.0, 0.25, "lognormal", rng, horizon=960, seeds=4)  # e-fold longer
  assert law.same_law_lrt(a, shifted, "lognormal")[1] < 0.01
  assert law.same_slope_lrt(a, shifted, "lognormal")[1] > 0.01  # same slope in the world
  assert law.stratified_logrank_permutation(a, shifted, permutations=300) < 0.01
  # Arms drawn from one law: the likelihood-ratio test's p is uniform (checked over worlds).
  ps = [law.same_law_lrt(_world(1.0, -4.0, 0.25, "lognormal", rng, 960),
                         _world(1.0, -4.0, 0.25, "lognormal", rng, 960), "lognormal")[1]
        for _ in range(60)]
  assert sum(p < 0.05 for p in ps) <= 8  # 3 expected; binomial P(>= 9) < 0.01
  assert scipy_stats.kstest(ps, "uniform").pvalue > 0.001


def test_a_covariate_scaling_the_time_as_tau_is_recovered():
  # Failure time proportional to tau = 1 / (lr x wd) at two weight decays: the covariate
  # log10(wd) has coefficient -ln 10 in ln T; the test of c = -ln 10 keeps it, c = 0 rejects it.
  rng = np.random.default_rng(13)
  arms = []
  for decay in (0.01, 0.1):
    x = np.repeat(np.log10(LRS), 4)
    t = np.exp(1.0 - math.log(10) * (x + math.log10(decay)) + 0.2 * rng.standard_normal(len(x)))
    failed = t <= 5000
    arms.append(law.Data.of(10 ** x, np.where(failed, t, 5000), failed))
  covariate = [math.log10(0.01), math.log10(0.1)]
  estimate, _, p_tau = law.covariate_lrt(arms, covariate, "lognormal", -math.log(10))
  _, _, p_none = law.covariate_lrt(arms, covariate, "lognormal", 0.0)
  assert estimate == pytest.approx(-math.log(10), abs=0.3)
  assert p_tau > 0.05 and p_none < 1e-6


def test_data_are_checked():
  with pytest.raises(ValueError, match="times must be finite and > 0"):
    law.Data.of([0.1], [0], [True])
  with pytest.raises(ValueError, match="a law needs failures at 2 or more"):
    law.fit(law.Data.of([0.1, 0.1, 0.01], [5, 7, 100], [True, True, False]))


def test_held_out_runs_that_outlive_the_law_are_a_shift_and_those_that_follow_it_are_not():
  rng = np.random.default_rng(17)
  fitted = _world(1.0, -4.0, 0.25, "lognormal", rng, horizon=960)
  same = _world(1.0, -4.0, 0.25, "lognormal", rng, horizon=1920, lrs=LRS[1:4])
  longer = _world(2.5, -4.0, 0.25, "lognormal", rng, horizon=1920, lrs=LRS[1:4])
  delta, _, p_longer = law.shift_lrt(fitted, longer, "lognormal")
  assert p_longer < 0.01 and delta > 0.5
  assert law.shift_lrt(fitted, same, "lognormal")[2] > 0.05
  # Its level over worlds where the held-out runs follow the fitted law.
  ps = [law.shift_lrt(_world(1.0, -4.0, 0.25, "lognormal", rng, 960),
                      _world(1.0, -4.0, 0.25, "lognormal", rng, 1920, lrs=LRS[1:4]),
                      "lognormal")[2] for _ in range(60)]
  assert sum(p < 0.05 for p in ps) <= 8  # 3 expected; binomial P(>= 9) < 0.01


@pytest.mark.slow
def test_the_bootstrap_calibrates_the_shift_test_where_chi2_cannot():
  # Every held-out run survived: the shifted law's maximum is at an infinite shift. Under the
  # null (held-out runs from the fitted law) the bootstrap p is about uniform: it keeps its level.
  rng = np.random.default_rng(23)
  ps = []
  for _ in range(12):
    fitted = _world(1.0, -4.0, 0.25, "weibull", rng, horizon=960)
    held = _world(1.0, -4.0, 0.25, "weibull", rng, horizon=1920, lrs=LRS[:2])
    _, statistic, p_chi2, p = law.shift_lrt_bootstrap(fitted, held, "weibull", draws=60, seed=1)
    assert statistic == pytest.approx(law.shift_lrt(fitted, held, "weibull")[1])
    assert 1 / 61 <= p <= 1
    ps.append(p)
  assert sum(p < 0.05 for p in ps) <= 3
  # A held-out set that plainly outlives the law is separated by it too.
  fitted = _world(1.0, -4.0, 0.25, "weibull", rng, horizon=960)
  longer = _world(3.0, -4.0, 0.25, "weibull", rng, horizon=1920, lrs=LRS[2:5])
  assert law.shift_lrt_bootstrap(fitted, longer, "weibull", draws=100)[3] < 0.05
