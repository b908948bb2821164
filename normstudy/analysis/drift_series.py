"""The drift that kills a run, measured directly: which telemetry series reaches its limit, how
fast it grows, and whether its first quarter predicts when it gets there.

float16 failure in these runs is a drift (docs/results.md, "Failure as a drift"): a series grows
roughly exponentially until it crosses float16's largest value, 65,504, or the loss scale falls
to its floor. The candidates (CANDIDATES) are every per-layer series with a float16 limit (the
residual stream's absmax, the largest attention logit, the MLP pre-activation's absmax), the
output logits' largest, and the loss scale (its limit the config's min_scale, approached from
above). A failed run's *killing series* is the candidate with the least headroom, log10(limit /
value) (for the loss scale log10(value / min_scale)), at its last telemetry step before it
failed; an arm's is the one that kills most of its failed runs (`killers`), read from the runs,
not assumed. Then per run (failed or not) of the arm:

  slope_per_100_steps   the least-squares slope of log10(series) on steps / 100 over the
                        run's telemetry after its warm-up and before its failure: decades per
                        100 steps; low and high its 95% interval with Newey and West's (1987)
                        autocorrelation-consistent standard error (consecutive telemetry
                        steps of one run are not independent draws)
  predicted_failure_step  where the line fitted to the first quarter of the run's planned
                        steps (after warm-up; the run alive at the quarter's end, 4 points or
                        more) reaches the limit; inf when that line does not rise
  failure_step          the failure rule's step (normstudy.records.outcomes), NaN if it
                        survived (then `censored_at`, its last step)
"""

import math

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.analysis import headroom as headroom_lib
from normstudy.analysis import stats
from normstudy.records import keys

FLOAT16_MAX = headroom_lib.FLOAT16_MAX
# (telemetry metric, per layer): series whose float16 limit is FLOAT16_MAX, and the loss scale.
CANDIDATES = (("resid_absmax", True), ("attn_logit_max", True), ("mlp_preact_absmax", True),
              ("output_logit_max", False))
LOSS_SCALE = keys.LOSS_SCALE
MIN_POINTS = 4
COLUMNS = ("arm", "lr", "seed", "series", "slope_per_100_steps", "low", "high",
           "predicted_failure_step", "failure_step", "censored_at", "points", "run")


def _candidates(loaded, run: str) -> dict:
  """{series name: pd.Series by step} of a run's candidate series: `resid_absmax/layer_3`, ...,
  `output_logit_max`, `loss_scale`."""
  out = {}
  for metric, per_layer in CANDIDATES:
    if per_layer:
      table = loaded.layer_values(run, metric)
      for layer, row in table.iterrows():
        out[keys.layer_key(metric, int(layer))] = row.dropna()
    else:
      values = loaded.series(run, metric)
      if len(values):
        out[metric] = values
  scale = loaded.series(run, LOSS_SCALE)
  if len(scale):
    out[LOSS_SCALE] = scale
  return out


def headroom(name: str, values, min_scale: float) -> np.ndarray:
  """Decades left before the limit: log10(65,504 / |value|), or for the loss scale
  log10(value / min_scale); NaN where the value is not finite (normstudy.analysis.headroom's
  bits, in decades)."""
  room = (headroom_lib.scale_bits(values, min_scale) if name == LOSS_SCALE
          else headroom_lib.bits(values, FLOAT16_MAX))
  return room / math.log2(10)


def killer(loaded, run: str, failed_at: int, min_scale: float) -> str | None:
  """The series with the least headroom at the run's last telemetry step before `failed_at`
  (None without telemetry before it)."""
  best, least = None, math.inf
  for name, values in _candidates(loaded, run).items():
    before = values[values.index < failed_at]
    if name == LOSS_SCALE:
      # The scale is logged every step the loss is; compare at the telemetry step.
      telemetry = [i for i in loaded.layer_values(run, "resid_absmax").columns if i < failed_at]
      before = before[before.index <= max(telemetry)] if telemetry else before.iloc[:0]
    if not len(before):
      continue
    room = headroom(name, before.iloc[-1:], min_scale)[0]
    if np.isfinite(room) and room < least:
      best, least = name, room
  return best


def newey_west_slope(x, y, lags: int | None = None) -> tuple[float, float, float, float]:
  """Least squares of y on x: (slope, intercept, the slope's Newey-West standard error, degrees
  of freedom n - 2) (normstudy.analysis.stats.newey_west)."""
  fit = stats.newey_west(x, y, lags)
  return (float(fit.beta[1]), float(fit.beta[0]),
          float(math.sqrt(max(fit.covariance[1, 1], 0.0))), fit.df)


def _log_values(name: str, values: pd.Series, min_scale: float) -> pd.Series:
  """The series on one scale that rises to log10(65,504) at its limit: log10|value| for the
  float16 series, log10(65,504) minus the headroom for the loss scale (rising as it falls)."""
  room = headroom(name, values.to_numpy(), min_scale)
  return pd.Series(math.log10(FLOAT16_MAX) - room, index=values.index)


def run_drift(loaded, run: str, series: str, warmup: int, num_steps: int, failed_at,
              min_scale: float) -> dict:
  """drift.csv's measures of one run for `series` (the module docstring)."""
  values = _candidates(loaded, run).get(series)
  out = {"slope_per_100_steps": np.nan, "low": np.nan, "high": np.nan,
         "predicted_failure_step": np.nan, "points": 0}
  if values is None:
    return out
  end = failed_at if failed_at is not None else math.inf
  logs = _log_values(series, values, min_scale)
  logs = logs[(logs.index > warmup) & (logs.index < end)].dropna()
  limit = math.log10(FLOAT16_MAX)  # both kinds rise towards it (_log_values)
  out["points"] = len(logs)
  if len(logs) >= MIN_POINTS:
    slope, _, se, df = newey_west_slope(logs.index / 100.0, logs.to_numpy())
    half = float(scipy_stats.t.ppf(0.975, df)) * se
    out.update(slope_per_100_steps=slope, low=slope - half, high=slope + half)
  quarter = num_steps / 4
  early = logs[logs.index <= quarter]
  if len(early) >= MIN_POINTS and end > quarter:
    slope, intercept, _, _ = newey_west_slope(early.index / 100.0, early.to_numpy())
    out["predicted_failure_step"] = (100 * (limit - intercept) / slope if slope > 0
                                     else math.inf)
  return out


def killers(loaded, runs: pd.DataFrame, min_scales: dict) -> pd.DataFrame:
  """Per arm and candidate series: how many of the arm's failed runs it killed (the least
  headroom before failure). `runs`: sensitivity.table's rows (arm, run, failed_at, ...);
  `min_scales` {run: the loss scale's floor}."""
  rows = []
  for arm, mine in runs.groupby("arm", sort=False):
    failed = mine[mine.failed_at.notna()]
    counts = {}
    for r in failed.itertuples():
      name = killer(loaded, r.run, int(r.failed_at), min_scales[r.run])
      counts[name or "none"] = counts.get(name or "none", 0) + 1
    for name, count in sorted(counts.items(), key=lambda kv: -kv[1]):
      rows.append({"arm": arm, "series": name, "runs": count, "failed_runs": len(failed)})
  return pd.DataFrame(rows, columns=["arm", "series", "runs", "failed_runs"])


def table(loaded, runs: pd.DataFrame, killed: pd.DataFrame, min_scales: dict,
          warmups: dict, num_steps: dict) -> pd.DataFrame:
  """drift.csv: one row per run, for its arm's killing series (the most frequent in
  `killed`)."""
  chosen = {arm: rows.series.iloc[0] for arm, rows in killed.groupby("arm", sort=False)
            if rows.series.iloc[0] != "none"}
  out = []
  for r in runs.itertuples():
    if r.arm not in chosen:
      continue
    failed_at = int(r.failed_at) if pd.notna(r.failed_at) else None
    measured = run_drift(loaded, r.run, chosen[r.arm], warmups[r.run], num_steps[r.run],
                         failed_at, min_scales[r.run])
    out.append({"arm": r.arm, "lr": r.learning_rate, "seed": r.seed, "series": chosen[r.arm],
                **measured, "failure_step": failed_at if failed_at is not None else np.nan,
                "censored_at": np.nan if failed_at is not None else r.last_step,
                "run": r.run})
  return pd.DataFrame(out, columns=list(COLUMNS))


def rate_law(drift: pd.DataFrame) -> pd.DataFrame:
  """Per arm: the drift rate's power of the learning rate, slope_per_100_steps ~ lr^k, by least
  squares of log10(slope) on log10(lr) over runs whose slope is positive (k with its 95% t
  interval and n); with failure at a fixed distance below the limit, the failure time then
  scales as lr^-k (the law's b should be -k ln 10)."""
  rows = []
  for arm, mine in drift.groupby("arm", sort=False):
    rising = mine[mine.slope_per_100_steps > 0]
    row = {"arm": arm, "runs": len(rising), "k": np.nan, "k_low": np.nan, "k_high": np.nan}
    if rising.lr.nunique() >= 2 and len(rising) >= 3:
      fit = scipy_stats.linregress(np.log10(rising.lr), np.log10(rising.slope_per_100_steps))
      half = float(scipy_stats.t.ppf(0.975, len(rising) - 2)) * fit.stderr
      row.update(k=fit.slope, k_low=fit.slope - half, k_high=fit.slope + half)
    rows.append(row)
  return pd.DataFrame(rows, columns=["arm", "runs", "k", "k_low", "k_high"])


PREDICTION_COLUMNS = ("arm", "failed_predicted", "log10_ratio_median", "log10_ratio_q1",
                      "log10_ratio_q3", "spearman", "spearman_p", "survivors_predicted",
                      "survivors_predicted_beyond_end")


def prediction_summary(drift: pd.DataFrame) -> pd.DataFrame:
  """Per arm: of the runs with a first-quarter prediction, the failed ones' median and
  interquartile range of log10(predicted / observed failure step), Spearman's correlation of
  the two (with its p and n), and how many survivors the prediction put beyond their end."""
  rows = []
  for arm, mine in drift.groupby("arm", sort=False):
    predicted = mine[mine.predicted_failure_step.notna()]
    failed = predicted[predicted.failure_step.notna()]
    finite = failed[np.isfinite(failed.predicted_failure_step)]
    ratio = np.log10(finite.predicted_failure_step / finite.failure_step)
    rho, p = (scipy_stats.spearmanr(finite.predicted_failure_step, finite.failure_step)
              if len(finite) >= 3 else (np.nan, np.nan))
    alive = predicted[predicted.failure_step.isna()]
    rows.append({"arm": arm, "failed_predicted": len(failed),
                 "log10_ratio_median": float(np.median(ratio)) if len(ratio) else np.nan,
                 "log10_ratio_q1": float(np.quantile(ratio, 0.25)) if len(ratio) else np.nan,
                 "log10_ratio_q3": float(np.quantile(ratio, 0.75)) if len(ratio) else np.nan,
                 "spearman": float(rho), "spearman_p": float(p),
                 "survivors_predicted": len(alive),
                 "survivors_predicted_beyond_end": int(
                     (alive.predicted_failure_step > alive.censored_at).sum())})
  return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS))
