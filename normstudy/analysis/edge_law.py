"""The edge law judged by what it predicts: candidate forms of the time-to-failure law fitted to
runs seen only up to a horizon H, scored on what the same runs did after H; the critical rate at
MERT's horizon as the spread over the forms; the margin between the edge and the rate that
learns best (issue 84, item 4).

The forms (FORMS), each ln T = a + b log10(lr - floor) + sigma W (normstudy.analysis.law):
  weibull    W minimum-extreme-value (T Weibull), no floor: lr*(H) a power law in H
  lognormal  W normal, no floor
  floor      Weibull with a floor fitted by profile likelihood (law.fit_floor): runs at or
             below it never fail, so lr*(H) falls towards the floor instead of without end
A drift saturating on AdamW's timescale tau = 1 / (lr x wd) is a floor in this family (a rate
below which the saturated value never reaches the limit); it has no form of its own here.

Out of sample (`out_of_sample`): every run's time censored at H (a failure after H is a run
alive at H), each form fitted to that, then scored on the runs alive at H by what they did
next: the log-likelihood of their outcome given survival to H (log f(T) / S(H) for a failure at
T, log S(end) / S(H) for a run alive at its end), the expected failures after H (the sum of
1 - S(planned end) / S(H)) against those observed, and Harrell's concordance between each run's
predicted conditional median and its time. A form is better by 2 or more log-likelihood units
summed over the scored runs; within 2 units, forms are tied.
"""

import dataclasses
import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import law as law_lib
from normstudy.analysis import stats

FORMS = ("weibull", "lognormal", "floor")
_FAMILY = {"weibull": "weibull", "lognormal": "lognormal", "floor": "weibull"}
TIE = 2.0  # log-likelihood units within which two forms are not told apart


@dataclasses.dataclass(frozen=True)
class Fitted:
  """One form fitted to one arm: ln T = a + b log10(lr - floor) + sigma W."""
  form: str
  a: float
  b: float
  sigma: float
  floor: float
  loglik: float

  @property
  def family(self) -> str:
    return _FAMILY[self.form]

  def _z(self, lr, t):
    lr = np.asarray(lr, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
      mu = self.a + self.b * np.log10(lr - self.floor)
    return (np.log(np.asarray(t, dtype=float)) - mu) / self.sigma, lr <= self.floor

  def log_survival(self, lr, t) -> np.ndarray:
    """log P(T > t | lr): 0 at or below the floor."""
    z, safe = self._z(lr, t)
    value, _, _ = law_lib.log_likelihood(self.family, np.zeros_like(z), np.zeros(z.shape, bool),
                                         -z, np.zeros_like(z))
    return np.where(safe, 0.0, value)

  def log_density(self, lr, t) -> np.ndarray:
    """log f(t | lr) (-inf at or below the floor: such a run never fails)."""
    log_t = np.log(np.asarray(t, dtype=float))
    z, safe = self._z(lr, t)
    mu = log_t - z * self.sigma
    value, _, _ = law_lib.log_likelihood(self.family, log_t, np.ones(z.shape, bool), mu,
                                         np.full(z.shape, math.log(self.sigma)))
    return np.where(safe, -np.inf, value)

  def critical_lr(self, horizon: float) -> float:
    """lr*(horizon): half the runs failed by it."""
    w50 = law_lib.median_quantile(self.family)
    return self.floor + 10 ** ((math.log(horizon) - self.a - self.sigma * w50) / self.b)

  def conditional_median(self, lr: float, after: float) -> float:
    """The median failure step of a run at `lr` alive at `after` (inf at or below the floor)."""
    if lr <= self.floor:
      return math.inf
    mu = self.a + self.b * math.log10(lr - self.floor)
    s_after = math.exp(float(self.log_survival(lr, after)))
    w = float(law_lib.quantile(self.family, 1 - s_after / 2))
    return math.exp(mu + self.sigma * w)


def fit(data: law_lib.Data, form: str) -> Fitted:
  """One form fitted to one arm's runs (ValueError: too few failures to place it). The two
  power laws are normstudy.analysis.law's fit; the floor form refits at law.fit_floor's floor."""
  if form != "floor":
    return _of(law_lib.fit(data, form))
  if len(set(data.x[data.event])) < 2:
    raise ValueError("a law needs failures at 2 or more rates")
  floor = law_lib.fit_floor(data, _FAMILY[form]).floor
  lr = 10 ** data.x
  above = lr > floor
  design = np.column_stack([np.ones(int(above.sum())), np.log10(lr[above] - floor)])
  beta, log_sigmas, loglik = law_lib.fit_design(_FAMILY[form], design, np.log(data.t[above]),
                                                data.event[above])
  return Fitted(form, float(beta[0]), float(beta[1]), float(math.exp(log_sigmas[0])), floor,
                loglik)


def _of(law: law_lib.Law) -> Fitted:
  return Fitted(law.law, law.a, law.b, law.sigma, 0.0, law.loglik)


def censored_at(runs: pd.DataFrame, horizon: float) -> law_lib.Data:
  """The runs as they stood at `horizon`: a failure after it, or a run past it, alive there."""
  time = runs.time.to_numpy(float)
  failed = runs.failed.to_numpy(bool) & (time <= horizon)
  return law_lib.Data.of(runs.lr, np.minimum(time, horizon), failed)


OOS_COLUMNS = ("arm", "fit_horizon", "form", "fitted_runs", "fitted_failures", "scored_runs",
               "failures_after", "expected_failures_after", "loglik", "loglik_per_run",
               "c_index", "critical_lr_100k", "tied_with_best")


def out_of_sample(runs: pd.DataFrame, horizons) -> pd.DataFrame:
  """The module docstring's table, per arm, fit horizon and form (OOS_COLUMNS). `runs`: one row
  per run, columns arm, lr, time (failure step, or last step alive), failed, end (the step it
  was planned to reach: what the expected failures after H count up to)."""
  rows = []
  for arm, mine in runs.groupby("arm", sort=False):
    for horizon in horizons:
      seen = censored_at(mine, horizon)
      later = mine[mine.time > horizon]
      if later.empty:
        continue  # nothing after H to score a form by
      scored = []
      for form in FORMS:
        try:
          fitted = fit(seen, form)
        except ValueError:
          continue
        row = {"arm": arm, "fit_horizon": horizon, "form": form, "fitted_runs": len(seen),
               "fitted_failures": seen.failures, "scored_runs": len(later),
               "failures_after": int(later.failed.sum())}
        lr, t = later.lr.to_numpy(float), later.time.to_numpy(float)
        event = later.failed.to_numpy(bool)
        base = fitted.log_survival(lr, np.full(len(lr), horizon))
        own = np.where(event, fitted.log_density(lr, t), fitted.log_survival(lr, t))
        total = float(np.sum(own - base))
        end = fitted.log_survival(lr, later.end.to_numpy(float))
        predicted = [fitted.conditional_median(r, horizon) for r in lr]
        row.update(loglik=total, loglik_per_run=total / len(later),
                   expected_failures_after=float(np.sum(1 - np.exp(end - base))),
                   c_index=stats.concordance(predicted, t, event))
        row["critical_lr_100k"] = fitted.critical_lr(100_000)
        scored.append(row)
      best = max((r["loglik"] for r in scored), default=-math.inf)
      for row in scored:
        row["tied_with_best"] = bool(best - row["loglik"] < TIE) if math.isfinite(best) \
            else np.nan
      rows.extend(scored)
  return pd.DataFrame(rows, columns=list(OOS_COLUMNS))


FORMS_COLUMNS = ("arm", "horizon", "form", "critical_lr", "low", "high", "floor",
                 "loglik")


def critical_lr_forms(runs: pd.DataFrame, horizons) -> pd.DataFrame:
  """Each form fitted to every run of each arm, its lr*(H) at each horizon: with the 95%
  profile interval for the two forms without a floor (law.Law's), the point alone for the
  floor form (its interval at a horizon is not profiled here)."""
  rows = []
  for arm, mine in runs.groupby("arm", sort=False):
    data = law_lib.Data.of(mine.lr, mine.time, mine.failed)
    for form in FORMS:
      try:  # the power laws once, for the point and its profile interval
        profile = law_lib.fit(data, form) if form != "floor" else None
        fitted = _of(profile) if profile else fit(data, form)
      except ValueError:
        continue
      for horizon in horizons:
        low, high = profile.critical_lr_interval(horizon) if profile else (np.nan, np.nan)
        rows.append({"arm": arm, "horizon": horizon, "form": form,
                     "critical_lr": fitted.critical_lr(horizon), "low": low, "high": high,
                     "floor": fitted.floor, "loglik": fitted.loglik})
  return pd.DataFrame(rows, columns=list(FORMS_COLUMNS))


SPREAD_COLUMNS = ("arm", "horizon", "forms", "critical_lr_min", "critical_lr_max",
                  "spread_low", "spread_high")


def spread(forms: pd.DataFrame) -> pd.DataFrame:
  """Per arm and horizon, the spread over forms: the least and largest point estimate and the
  union of the intervals (an open or unprofiled end counts as the points')."""
  rows = []
  for (arm, horizon), mine in forms.groupby(["arm", "horizon"], sort=False):
    ends = pd.concat([mine.critical_lr, mine.low.dropna(), mine.high.dropna()])
    rows.append({"arm": arm, "horizon": horizon, "forms": ",".join(mine.form),
                 "critical_lr_min": mine.critical_lr.min(),
                 "critical_lr_max": mine.critical_lr.max(),
                 "spread_low": ends.min(), "spread_high": ends.max()})
  return pd.DataFrame(rows, columns=list(SPREAD_COLUMNS))


MARGIN_COLUMNS = ("arm", "horizon", "best_lr", "best_lr_low", "best_lr_high",
                  "critical_lr_min", "critical_lr_max", "margin", "margin_low", "margin_high")


def margin(spreads: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
  """margin.csv: per arm and horizon, the edge over the rate that learns best: the spread's
  critical rates over the best rate (`best`: arm, best_lr and the range of rates that learn
  near as well, lr_range_low/high), the interval the spread's ends over the range's."""
  rows = []
  for s in spreads.itertuples():
    mine = best[best.arm == s.arm]
    if mine.empty:
      continue
    b = mine.iloc[0]
    mid = math.sqrt(s.critical_lr_min * s.critical_lr_max)  # the forms' geometric middle
    rows.append({"arm": s.arm, "horizon": s.horizon, "best_lr": b.best_lr,
                 "best_lr_low": b.lr_range_low, "best_lr_high": b.lr_range_high,
                 "critical_lr_min": s.critical_lr_min, "critical_lr_max": s.critical_lr_max,
                 "margin": mid / b.best_lr, "margin_low": s.spread_low / b.lr_range_high,
                 "margin_high": s.spread_high / b.lr_range_low})
  return pd.DataFrame(rows, columns=list(MARGIN_COLUMNS))


def runs_of(drift_table: pd.DataFrame) -> pd.DataFrame:
  """drift.csv's rows (one per run) as out_of_sample's: arm, lr, time, failed, end. A run's
  planned end is the last step its sweep's survivors reached (its directory's first part, fit
  or heldout: each sweep trains every run for the same steps)."""
  failed = drift_table.failure_step.notna()
  time = np.where(failed, drift_table.failure_step, drift_table.censored_at).astype(float)
  sweep = drift_table.run.str.split("/").str[0]
  ends = pd.Series(time).groupby(sweep.to_numpy()).transform("max")
  planned = drift_table.censored_at.groupby(sweep).transform("max")
  end = np.where(planned.notna(), planned, ends)
  return pd.DataFrame({"arm": drift_table.arm, "lr": drift_table.lr, "time": time,
                       "failed": failed.to_numpy(), "end": end.astype(float)})


FIT_HORIZONS = (240, 480, 960)
DRIFT = "drift.csv"
CRITICAL = "critical_lr_law.csv"


def write(workdir: str, best_rates: str | None = None) -> dict:
  """From a drift workdir's drift.csv (normstudy.analysis.horizon_report's, one row per run):
  edge_law_oos.csv (out_of_sample at FIT_HORIZONS), critical_lr_forms.csv (every form at
  critical_lr_law.csv's horizons), the spread over forms added to critical_lr_law.csv
  (columns forms, spread_low, spread_high: recomputed, never appended twice) and, with
  `best_rates` (a learning-rate sweep's summary.csv: arm, best_lr, lr_range_low/high),
  margin.csv. Returns {name: path}."""
  runs = runs_of(pd.read_csv(os.path.join(workdir, DRIFT)))
  critical_path = os.path.join(workdir, CRITICAL)
  critical = pd.read_csv(critical_path)
  horizons = sorted(critical.horizon.unique())
  forms = critical_lr_forms(runs, horizons)
  spreads = spread(forms)
  outputs = {name: os.path.join(workdir, f"{name}.csv")
             for name in ("edge_law_oos", "critical_lr_forms")}
  out_of_sample(runs, FIT_HORIZONS).to_csv(outputs["edge_law_oos"], index=False)
  forms.to_csv(outputs["critical_lr_forms"], index=False)
  critical = critical.drop(columns=[c for c in ("forms", "spread_low", "spread_high")
                                    if c in critical])
  critical = critical.merge(spreads[["arm", "horizon", "forms", "spread_low", "spread_high"]],
                            on=["arm", "horizon"], how="left")
  critical.to_csv(critical_path, index=False)
  outputs["critical_lr_law"] = critical_path
  if best_rates is not None:
    outputs["margin"] = os.path.join(workdir, "margin.csv")
    margin(spreads, pd.read_csv(best_rates)).to_csv(outputs["margin"], index=False)
  return outputs
