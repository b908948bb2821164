"""Exact and small-sample statistics for the studies: what a comparison of a few seeds can say.

Every comparison the analysis writes goes through `verdict`, which names the test, the sample
sizes and the p-value, and calls a difference a difference only at p < ALPHA; otherwise "not
separated". Tests:

  fisher_exact(a_failed, a_runs, b_failed, b_runs)   Fisher's exact test of two failure shares
                                                     (two-sided: the sum of the probabilities of
                                                     every table no more likely than the one
                                                     observed, margins fixed; Fisher 1935)
  welch(a, b)                                        Welch's t-test of two means (unequal
                                                     variances, Welch-Satterthwaite degrees of
                                                     freedom; Welch 1947)
  fit_logistic(log_lr, failed)                       the logistic curve of failure against
                                                     log10(learning rate), by maximum likelihood
  same_curve_lrt(a, b)                               likelihood-ratio test of one curve for two
                                                     arms against one each (chi-square, 2 df)
  critical_lr(lrs, failed)                           the learning rate at 50% failure with a
                                                     bootstrap 95% interval over runs
  stratified_exact(tables)                           the exact conditional test of two arms'
                                                     failure shares stratified by learning rate
                                                     (every stratum's margins fixed; the
                                                     arm's total failures against the
                                                     convolution of the strata's hypergeometric
                                                     laws; two-sided as fisher_exact)
  paired_t(a, b)                                     Student's paired t-test (mean difference of
                                                     pairs against 0, n - 1 df)
  mean_difference(a, b, paired)                      the difference of means, its standard error
                                                     and its test (paired t or Welch)
  sign_test(a, b)                                    the exact two-sided sign test of paired
                                                     values (ties dropped; binomial, 1/2)
  paired_permutation(a, b)                           the exact paired permutation test (every
                                                     sign pattern of the differences)
  holm(ps)                                           Holm's step-down adjustment of a family of
                                                     p-values (Holm 1979)
  equivalence_margin(...)                            the smallest margin within which two means
                                                     are equivalent by two one-sided tests at
                                                     ALPHA (Schuirmann 1987): the 90% interval
                                                     of the difference; equivalence_factor the
                                                     same for log10 values, as a factor

Needs numpy and scipy only (scipy comes with jax), so the analysis stays free of the training
stack.
"""

import dataclasses
import math

import numpy as np
from scipy import special
from scipy import stats as scipy_stats

ALPHA = 0.05
# Under complete separation (every run below some learning rate survives, every run above it
# fails) the likelihood keeps rising with the slope; capping it (per decade of learning rate)
# puts the curve's midpoint between the last learning rate without failures and the first with
# only failures, and the interval is widened to that whole bracket (`critical_lr`).
MAX_SLOPE = 40.0
BOOTSTRAP_SAMPLES = 1000


def verdict(test: str, n: str, p: float, what: str = "different") -> str:
  """'different (Fisher's exact test, n = 9 and 6, p = 0.044)' when p < ALPHA, else
  'not separated (...)': the one wording of every comparison."""
  detail = f"{test}, n = {n}, p = {format_p(p)}"
  if not np.isfinite(p):
    return f"not tested ({test}, n = {n}: too few runs)"
  return f"{what} ({detail})" if p < ALPHA else f"not separated ({detail})"


def format_p(p: float) -> str:
  if not np.isfinite(p):
    return "n/a"
  return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def fisher_exact(a_failed: int, a_runs: int, b_failed: int, b_runs: int) -> float:
  """Two-sided p-value of Fisher's exact test for the 2x2 table [[a_failed, a_runs - a_failed],
  [b_failed, b_runs - b_failed]]: with the margins fixed, the failures in arm a follow the
  hypergeometric law; p sums the probabilities of every table at most as likely as the one
  seen (with a relative tolerance of 1e-7 for ties, as R and scipy use)."""
  failed, total = a_failed + b_failed, a_runs + b_runs
  if a_runs == 0 or b_runs == 0:
    return math.nan

  def probability(k):
    return math.comb(a_runs, k) * math.comb(b_runs, failed - k) / math.comb(total, failed)

  seen = probability(a_failed)
  low, high = max(0, failed - b_runs), min(a_runs, failed)
  p = sum(q for q in map(probability, range(low, high + 1)) if q <= seen * (1 + 1e-7))
  return min(1.0, p)


def welch(a, b) -> tuple[float, float, float]:
  """(t, degrees of freedom, two-sided p) of Welch's t-test of mean(a) against mean(b); NaN
  when either sample has fewer than 2 values. Equal samples with no spread give p = 1."""
  a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
  if len(a) < 2 or len(b) < 2:
    return math.nan, math.nan, math.nan
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  if va + vb == 0:  # no spread: the means are equal (p = 1) or nothing could separate more
    same = a.mean() == b.mean()
    return (0.0 if same else math.copysign(math.inf, a.mean() - b.mean())), math.nan, float(same)
  t = (a.mean() - b.mean()) / math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  return t, df, float(2 * scipy_stats.t.sf(abs(t), df))


def stratified_exact(tables) -> float:
  """Two-sided p of the exact conditional test for [(a_failed, a_runs, b_failed, b_runs)] per
  stratum: with each stratum's margins fixed, arm a's failures in a stratum are hypergeometric,
  their total T the convolution over strata; p sums P(T = t) over every t at most as likely as
  the observed total (relative tolerance 1e-7). One stratum: Fisher's exact test. NaN without
  a stratum both arms ran."""
  tables = [t for t in tables if t[1] > 0 and t[3] > 0]
  if not tables:
    return math.nan
  law = {0: 1.0}
  observed = 0
  for a_failed, a_runs, b_failed, b_runs in tables:
    failed, total = a_failed + b_failed, a_runs + b_runs
    ks = range(max(0, failed - b_runs), min(a_runs, failed) + 1)
    stratum = {k: math.comb(a_runs, k) * math.comb(b_runs, failed - k) / math.comb(total, failed)
               for k in ks}
    joined = {}
    for t, p in law.items():
      for k, q in stratum.items():
        joined[t + k] = joined.get(t + k, 0.0) + p * q
    law = joined
    observed += a_failed
  seen = law[observed]
  return min(1.0, sum(p for p in law.values() if p <= seen * (1 + 1e-7)))


def paired_t(a, b) -> tuple[float, float, float]:
  """(t, degrees of freedom, two-sided p) of the paired t-test of a against b (equal-length,
  paired by position); NaN for fewer than 2 pairs; p = 1 for identical pairs."""
  d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
  if len(d) < 2:
    return math.nan, math.nan, math.nan
  sd = d.std(ddof=1)
  if sd == 0:
    same = d.mean() == 0
    return (0.0 if same else math.copysign(math.inf, d.mean())), len(d) - 1.0, float(same)
  t = d.mean() / (sd / math.sqrt(len(d)))
  return t, len(d) - 1.0, float(2 * scipy_stats.t.sf(abs(t), len(d) - 1))


def mean_difference(a, b, paired: bool) -> dict:
  """The difference of mean(a) and mean(b) with its test: `paired` (a and b paired by position)
  the paired t-test, else Welch's. {"difference", "se" (its standard error), "t", "df", "p"};
  NaN where the samples are too small. What equivalence_margin needs besides the p."""
  a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
  if paired:
    t, df, p = paired_t(a, b)
    d = a - b
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
    diff = float(d.mean()) if len(d) else math.nan
  else:
    t, df, p = welch(a, b)
    se = (math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
          if len(a) > 1 and len(b) > 1 else math.nan)
    diff = float(a.mean() - b.mean()) if len(a) and len(b) else math.nan
  return {"difference": diff, "se": se, "t": t, "df": df, "p": p}


def sign_test(a, b) -> tuple[int, int, float]:
  """(pairs with a > b, pairs that differ, two-sided exact p) of the sign test of a against b
  (paired by position): under no difference the count of a > b among the n pairs that differ is
  Binomial(n, 1/2); p = min(1, 2 P(X <= min(k, n - k))). p = 1 when no pair differs."""
  d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
  d = d[d != 0]
  k, n = int((d > 0).sum()), len(d)
  if n == 0:
    return 0, 0, 1.0
  tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2 ** n
  return k, n, min(1.0, 2 * tail)


def paired_permutation(a, b) -> float:
  """Two-sided p of the exact paired permutation test of a against b (paired by position;
  Fisher 1935): under no difference each pair's difference is as likely negated, so p is the
  share of the 2^n sign patterns whose |sum of differences| is at least the observed one (a
  relative tolerance of 1e-9 for ties). Exact up to n = 20 pairs (2^20 patterns); NaN without
  a pair. With n pairs its smallest p is 2 / 2^n: 6 pairs cannot go below 0.031."""
  d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
  n = len(d)
  if n == 0 or n > 20:
    return math.nan
  signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
  sums = np.abs(signs @ d)
  observed = abs(d.sum())
  return float(np.mean(sums >= observed * (1 - 1e-9) - 1e-12))


def verdict_holm(test: str, n: str, p: float, p_holm: float, what: str = "different") -> str:
  """`verdict` judged on the Holm-adjusted p, with the raw p beside it: 'different (test, n =
  .., p = 0.004, Holm-adjusted p = 0.02)'."""
  text = verdict(test, n, p_holm, what)
  if not np.isfinite(p_holm):
    return text
  return text.replace(f"p = {format_p(p_holm)})",
                      f"p = {format_p(p)}, Holm-adjusted p = {format_p(p_holm)})")


def holm(ps) -> list:
  """Holm-adjusted p-values, in the order given: the i-th smallest of m is multiplied by
  m - i (i from 0), made non-decreasing along that order, capped at 1; NaN stays NaN and does
  not count in m."""
  ps = [float(p) for p in ps]
  tested = sorted((p, i) for i, p in enumerate(ps) if np.isfinite(p))
  out, running = list(ps), 0.0
  for rank, (p, i) in enumerate(tested):
    running = max(running, min(1.0, (len(tested) - rank) * p))
    out[i] = running
  return out


def equivalence_margin(diff: float, se: float, df: float) -> float:
  """The smallest margin m such that two one-sided t-tests at ALPHA (Schuirmann 1987) show a
  difference of means within (-m, m): max(|lower|, |upper|) of the difference's 1 - 2 ALPHA
  (90%) t interval, `diff` +- t(1 - ALPHA, df) `se`. NaN if df or se is not finite."""
  if not (np.isfinite(df) and np.isfinite(se)):
    return math.nan
  half = scipy_stats.t.ppf(1 - ALPHA, df) * se
  return float(max(abs(diff - half), abs(diff + half)))


def equivalence_factor(diff: float, se: float, df: float) -> float:
  """equivalence_margin for a difference of means of log10 values, as a factor: two arms'
  geometric means within a factor m = 10 ** margin of each other."""
  return float(10 ** equivalence_margin(diff, se, df))


def mean_interval(values, level: float = 0.95) -> tuple[float, float, float]:
  """(mean, low, high): the mean and its t interval over the values (NaN bounds for n < 2)."""
  values = np.asarray(values, dtype=float)
  mean = float(values.mean()) if len(values) else math.nan
  if len(values) < 2:
    return mean, math.nan, math.nan
  half = scipy_stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(
      len(values))
  return mean, mean - half, mean + half


@dataclasses.dataclass(frozen=True)
class Logistic:
  """P(fail | lr) = sigmoid(intercept + slope * (log10(lr) - center)), and its log-likelihood."""
  intercept: float
  slope: float
  center: float
  loglik: float

  @property
  def critical_log_lr(self) -> float:
    """log10 of the learning rate at 50% failure (NaN for a flat curve)."""
    return self.center - self.intercept / self.slope if self.slope else math.nan


def _loglik(a, b, x, y):
  z = a + b * x
  return float(np.sum(y * z - np.logaddexp(0.0, z)))


def _newton(x, y, weights, iterations: int = 100):
  """Maximum-likelihood (intercept, slope) of logistic curves of y against x, one per row of
  `weights` [B, n] (case weights: a bootstrap resample is a row of counts), by Newton's method,
  all rows at once. Steps are clipped to 5; the slope is held within +-MAX_SLOPE, and a row whose
  slope sits at the cap takes Newton steps in the intercept alone."""
  share = np.clip((weights * y).sum(1) / weights.sum(1), 1e-3, 1 - 1e-3)
  a, b = np.log(share / (1 - share)), np.zeros(len(weights))
  for _ in range(iterations):
    p = special.expit(a[:, None] + b[:, None] * x)
    r, h = weights * (y - p), weights * p * (1 - p) + 1e-12
    g0, g1 = r.sum(1), (r * x).sum(1)
    h00, h01, h11 = h.sum(1), (h * x).sum(1), (h * x * x).sum(1)
    det = h00 * h11 - h01 ** 2 + 1e-12
    da, db = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
    capped = (np.abs(b) >= MAX_SLOPE - 1e-9) & (np.sign(db) == np.sign(b))
    da, db = np.where(capped, g0 / h00, da), np.where(capped, 0.0, db)
    da, db = np.clip(da, -5, 5), np.clip(db, -5, 5)
    a, b = a + da, np.clip(b + db, -MAX_SLOPE, MAX_SLOPE)
    if max(np.abs(da).max(), np.abs(db).max()) < 1e-10:
      break
  return a, b


def fit_logistic(log_lr, failed) -> Logistic:
  """The maximum-likelihood logistic curve of `failed` (0/1 per run) against `log_lr` (log10 of
  each run's learning rate), the slope held within +-MAX_SLOPE per decade (see MAX_SLOPE)."""
  x0 = np.asarray(log_lr, dtype=float)
  y = np.asarray(failed, dtype=float)
  center = float(x0.mean())
  a, b = _newton(x0 - center, y, np.ones((1, len(y))))
  return Logistic(float(a[0]), float(b[0]), center, _loglik(a[0], b[0], x0 - center, y))


def same_curve_lrt(a: tuple, b: tuple) -> tuple[float, float]:
  """(statistic, p) of the likelihood-ratio test that two arms' (log_lr, failed) outcomes
  follow one logistic curve rather than one each: 2 (ll_a + ll_b - ll_pooled), chi-square with
  2 degrees of freedom."""
  pooled = fit_logistic(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
  separate = fit_logistic(*a).loglik + fit_logistic(*b).loglik
  statistic = max(0.0, 2 * (separate - pooled.loglik))
  return statistic, float(scipy_stats.chi2.sf(statistic, 2))


def critical_lr(lrs, failed, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> dict:
  """The learning rate at which half the runs fail, from one arm's runs (`lrs`, `failed`):

    critical_lr           10^(the logistic fit's 50% point), or NaN when the grid does not
                          bracket it or the outcomes are completely separated by the learning
                          rate (every run below some learning rate survives, every run from it
                          fails): the data then place the critical value only between two grid
                          points, and a fitted point would be the midpoint of the cell
    critical_lr_low/high  a 95% percentile-bootstrap interval (runs resampled with replacement,
                          `samples` times); under complete separation the bracket [the highest
                          learning rate with no failure, the lowest with only failures]
    bound                 "" when estimated, else "> {max lr} (no run failed)", "< {min lr}
                          (every run failed)" or, under complete separation, "between {low} and
                          {high} (all {n} seeds)" (n the runs at each of the two)
  """
  lrs = np.asarray(lrs, dtype=float)
  y = np.asarray(failed, dtype=float)
  x = np.log10(lrs)
  out = {"runs": len(y), "failed": int(y.sum()), "critical_lr": math.nan,
         "critical_lr_low": math.nan, "critical_lr_high": math.nan, "bound": ""}
  if y.sum() == 0:
    return {**out, "bound": f"> {lrs.max():g} (no run failed)"}
  if y.sum() == len(y):
    return {**out, "bound": f"< {lrs.min():g} (every run failed)"}
  bracket = _separation_bracket(x, y)
  if bracket is not None:
    low, high = 10 ** bracket[0], 10 ** bracket[1]
    counts = {int((x == b).sum()) for b in bracket}
    runs = f"all {counts.pop()} seeds" if len(counts) == 1 else "all runs"
    return {**out, "critical_lr_low": low, "critical_lr_high": high,
            "bound": f"between {low:.3g} and {high:.3g} ({runs})"}
  fit = fit_logistic(x, y)
  centre = min(max(fit.critical_log_lr, x.min()), x.max()) if fit.slope > 0 else math.nan
  rng = np.random.default_rng(seed)
  counts = np.stack([np.bincount(rng.integers(0, len(y), len(y)), minlength=len(y))
                     for _ in range(samples)]).astype(float)
  boot_a, boot_b = _newton(x - fit.center, y, counts)
  failures = counts @ y
  with np.errstate(divide="ignore", invalid="ignore"):
    crossing = fit.center - boot_a / boot_b
  draws = np.where(failures == 0, x.max(), np.where(
      failures == counts.sum(1), x.min(),
      np.where(boot_b > 0, np.clip(crossing, x.min(), x.max()), np.nan)))
  low, high = np.nanpercentile(draws, [2.5, 97.5]) if np.isfinite(draws).any() else (
      math.nan, math.nan)
  return {**out, "critical_lr": 10 ** centre, "critical_lr_low": 10 ** low,
          "critical_lr_high": 10 ** high}


def _separation_bracket(x, y):
  """(highest log lr with no failure, lowest with only failures) when the outcomes are
  completely separated by the learning rate, else None."""
  survivors, failures = x[y == 0], x[y == 1]
  if survivors.max() < failures.min():
    return float(survivors.max()), float(failures.min())
  return None


@dataclasses.dataclass(frozen=True)
class LineFit:
  """A least-squares line y = beta[0] + beta[1] x: its coefficients, their Newey-West covariance
  (2 x 2), the residuals' variance (n - 2 in the denominator) and the degrees of freedom."""
  beta: np.ndarray
  covariance: np.ndarray
  residual_variance: float
  df: int


def newey_west(x, y, lags: int | None = None) -> LineFit:
  """Least squares of y on x with Newey and West's (1987) autocorrelation-consistent covariance
  (a Bartlett kernel, lags floor(4 (n / 100)^(2/9)) by default; the small-sample factor
  n / (n - 2)): consecutive telemetry steps of one run are not independent draws."""
  x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
  n = len(x)
  design = np.column_stack([np.ones(n), x])
  beta, *_ = np.linalg.lstsq(design, y, rcond=None)
  residual = y - design @ beta
  lags = int(4 * (n / 100) ** (2 / 9)) if lags is None else lags
  scores = design * residual[:, None]
  meat = scores.T @ scores
  for lag in range(1, min(lags, n - 1) + 1):
    weight = 1 - lag / (lags + 1)
    cross = scores[lag:].T @ scores[:-lag]
    meat += weight * (cross + cross.T)
  bread = np.linalg.inv(design.T @ design)
  covariance = bread @ meat @ bread * n / max(n - 2, 1)
  return LineFit(beta=beta, covariance=covariance,
                 residual_variance=float(residual @ residual) / max(n - 2, 1), df=n - 2)


def concordance(predicted, time, event) -> float:
  """Harrell's C: over pairs whose order is known (the shorter time is a failure), the share in
  which the shorter time has the earlier prediction (ties in the prediction count one half);
  NaN without such a pair."""
  predicted, time = np.asarray(predicted, dtype=float), np.asarray(time, dtype=float)
  event = np.asarray(event, dtype=bool)
  concordant, comparable = 0.0, 0
  for i in range(len(time)):
    if not event[i]:
      continue
    for j in range(len(time)):
      if time[i] < time[j]:
        comparable += 1
        if predicted[i] < predicted[j]:
          concordant += 1.0
        elif predicted[i] == predicted[j]:
          concordant += 0.5
  return concordant / comparable if comparable else math.nan
