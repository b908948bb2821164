"""When will a run overflow? Each series' headroom (normstudy.analysis.headroom) fitted as a
trend over its steps so far, and when the series first reaches 0, with an interval.

A trend (TRENDS) is a straight line in the headroom h (bits) against
  log_step  x = ln(step): the series' value grows as a power of the step (h falls by the same
            number of bits every doubling of the step);
  step      x = step: the value grows exponentially in the step (a fixed number of bits per
            step, the drift's shape near the edge: normstudy.analysis.drift_series).
fitted by least squares to the points after the warm-up (the rate still rising is no drift),
with Newey and West's covariance (consecutive telemetry steps are correlated). A series fails
at its first point at or below 0, not where its line does: its scatter about the line reaches 0
first. So the forecast simulates the series' future (`_first_passages`): the line drawn from
its coefficients' uncertainty, the points about it AR(1) with the scatter and lag-1
correlation of the residuals so far, one point every telemetry interval. `crossing` is the
median first passage over DRAWS futures, `early` and `late` its 2.5% and 97.5% quantiles (inf:
not before HORIZON_CAP steps); `trend_crossing` where the line itself reaches 0.

A run's forecast is its earliest-crossing series (a run fails when its first series does).
`validate` scores forecasts made from a fraction of each run's planned steps against what then
happened (normstudy.forecast --validate): Harrell's concordance index over runs (failure steps,
survivors censored at their end), the share of outcomes inside their interval, and the share of
runs whose fail-by-the-end call was right.
"""

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.analysis import headroom as headroom_lib
from normstudy.analysis import stats

TRENDS = ("log_step", "step")
DEFAULT_TREND = "log_step"
MIN_POINTS = 6
HORIZON_CAP = 1e9  # steps: a crossing beyond it is "never"
CELLS = 2000  # the simulated future's geometric cells, now to HORIZON_CAP
DRAWS = 1000  # simulated futures a forecast
LEVEL = 0.95
# The series a forecast trends (headroom's `least` switches between them).
CANDIDATES = tuple(s for s in headroom_lib.SERIES if s != headroom_lib.LEAST)
FRACTIONS = (0.1, 0.25, 0.5)


@dataclasses.dataclass(frozen=True)
class Forecast:
  """One series' trend and its crossing. `now`: the last step used; `headroom_now`: the
  trend's value there; `bits_per_doubling` (log_step) or `bits_per_1000_steps` (step) as
  `rate`, with its 95% interval; `crossing` the step where the trend reaches 0, `early` and
  `late` its interval (inf: never, or beyond HORIZON_CAP); `trend_crossing` where the fitted
  line itself reaches 0; `scatter` the points' standard deviation about it (bits) and
  `autocorrelation` their lag-1 correlation."""
  series: str
  trend: str
  points: int
  now: float
  headroom_now: float
  rate: float
  rate_low: float
  rate_high: float
  crossing: float
  early: float
  late: float
  trend_crossing: float = math.inf
  scatter: float = 0.0
  autocorrelation: float = 0.0

  @property
  def rate_unit(self) -> str:
    return "bits per doubling of the step" if self.trend == "log_step" else \
        "bits per 1000 steps"


def _x(steps, trend: str) -> np.ndarray:
  steps = np.asarray(steps, dtype=float)
  return np.log(steps) if trend == "log_step" else steps


def _step(x, trend: str):
  return np.exp(x) if trend == "log_step" else x


def fit(steps, headroom, series: str = "", trend: str = DEFAULT_TREND,
        draws: int = DRAWS, seed: int = 0) -> Forecast | None:
  """The trend of one series' headroom (`steps` > 0 ascending, NaN points dropped) and when the
  series itself first reaches 0 (module docstring); None with fewer than MIN_POINTS finite
  points. Deterministic for a given `seed`."""
  if trend not in TRENDS:
    raise ValueError(f"trend {trend!r}; allowed: {', '.join(TRENDS)}")
  steps, headroom = np.asarray(steps, dtype=float), np.asarray(headroom, dtype=float)
  keep = np.isfinite(headroom) & (steps > 0)
  steps, headroom = steps[keep], headroom[keep]
  if len(steps) < MIN_POINTS or np.ptp(steps) == 0:
    return None
  x_seen = _x(steps, trend)
  line = stats.newey_west(x_seen, headroom)
  a, b = line.beta
  q = float(scipy_stats.t.ppf(0.5 + LEVEL / 2, line.df))
  per = math.log(2) if trend == "log_step" else 1000.0
  now = float(steps[-1])
  x_now = float(_x([now], trend)[0])
  residual = headroom - (a + b * x_seen)
  sigma = math.sqrt(line.residual_variance)
  phi = _lag1(residual)
  covariance = _covariance(line, x_seen, phi)
  se_b = math.sqrt(max(covariance[1, 1], 0.0))
  spacing = float(np.median(np.diff(steps)))
  passages = _first_passages(line.beta, covariance, line.df, trend, now, sigma, phi, spacing,
                             draws, seed)
  # Order statistics, no interpolation: a share of futures never crossing is inf, not NaN.
  early, crossing, late = np.quantile(passages, [(1 - LEVEL) / 2, 0.5, (1 + LEVEL) / 2],
                                      method="inverted_cdf")
  root = -a / b if b < 0 else math.inf
  trend_crossing = (float(_step(root, trend))
                    if root <= float(_x([HORIZON_CAP], trend)[0]) else math.inf)
  return Forecast(series=series, trend=trend, points=len(steps), now=now,
                  headroom_now=float(a + b * x_now), rate=float(b * per),
                  rate_low=float((b - q * se_b) * per), rate_high=float((b + q * se_b) * per),
                  crossing=float(crossing), early=float(early), late=float(late),
                  trend_crossing=trend_crossing,
                  scatter=sigma, autocorrelation=phi)


def _lag1(residual) -> float:
  """The residuals' lag-1 autocorrelation as an AR(1) coefficient, with Kendall's (1954)
  small-sample bias, -(1 + 3 phi) / n, added back; in [0, 0.99]."""
  centred = residual - residual.mean()
  denominator = float(centred @ centred)
  if denominator == 0:
    return 0.0
  phi = (centred[1:] @ centred[:-1]) / denominator
  return float(np.clip(phi + (1 + 3 * phi) / len(residual), 0.0, 0.99))


def _covariance(line, x, phi: float) -> np.ndarray:
  """The coefficients' covariance: the larger (by the slope's variance) of Newey and West's and
  the classical one times AR(1)'s variance inflation (1 + phi) / (1 - phi) (a Bartlett kernel
  with few lags understates a strong correlation in short series)."""
  design = np.column_stack([np.ones(len(x)), x])
  classical = np.linalg.inv(design.T @ design) * line.residual_variance * (1 + phi) / (1 - phi)
  return classical if classical[1, 1] > line.covariance[1, 1] else line.covariance


def _first_passages(beta, covariance, df: int, trend: str, now: float, sigma: float,
                    phi: float, spacing: float, draws: int, seed: int) -> np.ndarray:
  """`draws` simulated first steps after `now` at which the series reaches 0 (inf: not before
  HORIZON_CAP): the line's coefficients drawn from their multivariate t law (`df` degrees of
  freedom, `covariance`), the points about it AR(1) with the residuals' scatter `sigma` and
  coefficient `phi`, one point every `spacing` steps. The future is cut into CELLS geometric cells; a cell holding n points
  holds about m = n (1 - phi) / (1 + phi) independent ones, and the lowest of m standard
  normals is drawn exactly from its law, P(min > z) = (1 - Phi(z))^m (cells independent)."""
  rng = np.random.default_rng(seed)
  edges = np.geomspace(now, HORIZON_CAP, CELLS + 1)
  ends = edges[1:]
  effective = np.diff(edges) / spacing * (1 - phi) / (1 + phi)
  normal = rng.multivariate_normal(np.zeros(2), covariance, size=draws, method="eigh",
                                   check_valid="ignore")
  betas = beta + normal / np.sqrt(rng.chisquare(max(df, 1), size=(draws, 1)) / max(df, 1))
  x_end = _x(ends, trend)
  # The line at each cell's end: its lowest in the cell for a falling line; a rising line
  # never crosses by its mean, only by its scatter, which the cell's start would bound better:
  # the lower of the two ends.
  x_start = _x(edges[:-1], trend)
  mean = np.minimum(betas[:, :1] + betas[:, 1:] * x_end, betas[:, :1] + betas[:, 1:] * x_start)
  uniform = rng.uniform(size=mean.shape)
  # min of m standard normals: Phi^-1(1 - (1 - u)^(1/m)), written with log1p/expm1 for tiny m.
  tail = -np.expm1(np.log1p(-uniform) / effective)
  lowest = sigma * scipy_stats.norm.ppf(np.clip(tail, 1e-300, 1.0))
  reached = mean + lowest <= 0
  first = np.where(reached.any(axis=1), np.argmax(reached, axis=1), -1)
  return np.where(first >= 0, ends[np.maximum(first, 0)], math.inf)


def run_forecasts(rows: pd.DataFrame, after: float = 0.0, until: float = math.inf,
                  trend: str = DEFAULT_TREND) -> list:
  """Each candidate series' Forecast from one run's headroom rows (headroom.run_series' columns
  step, series, headroom), from the points with after < step <= until; series with too few
  points are left out."""
  out = []
  for series in CANDIDATES:
    mine = rows[(rows.series == series) & (rows.step > after) & (rows.step <= until)]
    mine = mine.sort_values("step")
    forecast = fit(mine.step.to_numpy(), mine.headroom.to_numpy(), series, trend)
    if forecast is not None:
      out.append(forecast)
  return out


def earliest(forecasts: list) -> Forecast | None:
  """The run's forecast: its series that crosses first (by the point forecast, then by the
  early edge)."""
  if not forecasts:
    return None
  return min(forecasts, key=lambda f: (f.crossing, f.early))


VALIDATION_COLUMNS = ("fraction", "trend", "runs", "failed", "c_index", "in_interval",
                      "failed_in_interval", "survivors_consistent", "call_right",
                      "log10_ratio_median")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What happened to a run: its headroom rows, its failure step (None: alive), its last step,
  its planned steps and its warm-up."""
  rows: pd.DataFrame
  failed_at: int | None
  last_step: int
  num_steps: int
  warmup: int


def forecast_at(outcome: Outcome, fraction: float, trend: str) -> Forecast | None:
  """The run's forecast from its points after the warm-up up to `fraction` of its planned
  steps; None if it had failed by then or had too few points."""
  until = fraction * outcome.num_steps
  if outcome.failed_at is not None and outcome.failed_at <= until:
    return None
  return earliest(run_forecasts(outcome.rows, after=outcome.warmup, until=until, trend=trend))


def validate(outcomes: dict, fractions=FRACTIONS, trends=TRENDS) -> tuple:
  """(the validation table, VALIDATION_COLUMNS, one row per fraction and trend; the forecasts,
  one row per run, fraction and trend) of forecasts made at each fraction of each run's planned
  steps against what happened. A failed run is inside its interval when early <= failure step
  <= late; a survivor when late > its last step (the interval allows it to be alive). The call
  "fails by its end": the point crossing at or before its planned end."""
  rows, table = [], []
  for fraction in fractions:
    for trend in trends:
      made = []
      for run, outcome in outcomes.items():
        forecast = forecast_at(outcome, fraction, trend)
        if forecast is None:
          continue
        failed = outcome.failed_at is not None
        time = outcome.failed_at if failed else outcome.last_step
        inside = (forecast.early <= time <= forecast.late) if failed else \
            forecast.late > time
        made.append({"run": run, "fraction": fraction, "trend": trend,
                     "series": forecast.series, "now": forecast.now,
                     "crossing": forecast.crossing, "early": forecast.early,
                     "late": forecast.late, "failed": failed, "time": time,
                     "inside": inside,
                     "call_right": (forecast.crossing <= outcome.num_steps) == failed})
      rows.extend(made)
      made = pd.DataFrame(made)
      if made.empty:
        table.append({"fraction": fraction, "trend": trend, "runs": 0, "failed": 0})
        continue
      failed = made[made.failed]
      finite = failed[np.isfinite(failed.crossing)]
      table.append({
          "fraction": fraction, "trend": trend, "runs": len(made), "failed": len(failed),
          "c_index": stats.concordance(made.crossing, made.time, made.failed),
          "in_interval": float(made.inside.mean()),
          "failed_in_interval": float(failed.inside.mean()) if len(failed) else math.nan,
          "survivors_consistent": (float(made[~made.failed].inside.mean())
                                   if (~made.failed).any() else math.nan),
          "call_right": float(made.call_right.mean()),
          "log10_ratio_median": (float(np.median(np.log10(finite.crossing / finite.time)))
                                 if len(finite) else math.nan)})
  return (pd.DataFrame(table, columns=list(VALIDATION_COLUMNS)),
          pd.DataFrame(rows))


def describe(forecast: Forecast) -> str:
  """One line of normstudy.forecast's output."""

  def when(step):
    return f"beyond {HORIZON_CAP:.0e}" if math.isinf(step) else f"{step:,.0f}"

  if math.isinf(forecast.crossing):
    shape = ("falls but reaches 0 only beyond step " f"{HORIZON_CAP:.0e}" if forecast.rate < 0
             else "does not fall")
    verdict = (f"{shape}; the 95% interval's earliest: {when(forecast.early)}")
  else:
    verdict = (f"reaches 0 at step {when(forecast.crossing)} (95% interval "
               f"{when(forecast.early)} to {when(forecast.late)})")
  return (f"{forecast.series:<18} {forecast.headroom_now:5.1f} bits at step "
          f"{forecast.now:,.0f}, {forecast.rate:+.3f} ({forecast.rate_low:+.3f} to "
          f"{forecast.rate_high:+.3f}) {forecast.rate_unit}: {verdict}")
