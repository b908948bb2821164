"""The headroom ladder: how far each arm's series sit below float16's limit at the rates that
learn, as a law in width, depth and step, checked on held-out rungs and extrapolated to MERT's
24 x 1024 x 100K (configs/headroom_ladder.py; issue 84, item 2).

Every rung of the ladder (a directory below the ladder's holding headroom.csv, written by the
rung's analysis: normstudy.analysis.headroom) gives each run's headroom in bits per telemetry
step. Per arm, parametrization, learning rate and series (the least over the series among them),
the law is the plane

    headroom = c0 + c_width ln(width) + c_depth ln(depth) + c_step ln(step)

fitted by least squares to every run's points after its warm-up (a run's points after it
failed are NaN and drop out), with the coefficients' covariance clustered by run (CR1: a run's
points are one draw, not hundreds; t quantiles on runs - 1 degrees of freedom). Coefficients
are in bits per e-fold; `per_doubling` columns give them per doubling.

  headroom_fit.csv          the law per group: coefficients, their 95% intervals, runs, points,
                            and the range of width, depth and step it saw
  headroom_prediction.csv   written before the held-out rungs train (normstudy.ladder with a
                            file declaring HEADROOM_HELDOUT; never rewritten): the law fitted
                            without them, its mean and 95% prediction interval (the mean's
                            uncertainty and the runs' scatter about it) at each held-out rung's
                            last telemetry step
  headroom_heldout.csv      the prediction beside what the held-out runs measured there (their
                            mean over runs), and whether it fell inside the interval
  headroom_extrapolation.csv  the law fitted to every rung, at the target (24 x 1024 x 100,000
                            by default): the mean, its 95% interval, whether the interval
                            reaches 0, and how far the target lies beyond the data (the factor
                            over the largest width, depth and step seen)
"""

import math
import os

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.analysis import headroom as headroom_lib
from normstudy.records import rundir

HEADROOM_FILE = "headroom.csv"
PREDICTION = "headroom_prediction.csv"
GROUP = ("arm", "parametrization", "learning_rate", "series")
TERMS = ("width", "depth", "step")
MIN_RUNS = 3  # clusters needed for a clustered covariance with at least 2 degrees of freedom


def collect(workdir: str, skip=()) -> pd.DataFrame:
  """Every rung's headroom.csv below `workdir` (not those under a directory in `skip`, paths
  relative to `workdir`), with each row's `rung` (its directory relative to `workdir`), `run`
  as the run's path relative to `workdir`, and `warmup` (the run's warm-up steps, from its
  config)."""
  frames = []
  for root, dirs, files in os.walk(workdir):
    dirs.sort()
    rung = os.path.relpath(root, workdir)
    if any(rung == s or rung.startswith(s + os.sep) for s in skip):
      dirs[:] = []
      continue
    if HEADROOM_FILE in files and root != workdir:
      rows = pd.read_csv(os.path.join(root, HEADROOM_FILE))
      rows["rung"] = rung
      rows["warmup"] = rows.run.map(lambda run, root=root: _warmup(os.path.join(root, run)))
      rows["run"] = [os.path.join(rung, run) for run in rows.run]  # unique across rungs
      frames.append(rows)
      dirs[:] = []  # a rung's runs are not rungs
  if not frames:
    return pd.DataFrame(columns=[*headroom_lib.COLUMNS, "rung", "warmup"])
  return pd.concat(frames, ignore_index=True)


def _warmup(run_dir: str) -> int:
  return int(rundir.read_config(run_dir).get("optimizer", {}).get("warmup_steps", 0))


def _design(rows: pd.DataFrame) -> np.ndarray:
  return np.column_stack([np.ones(len(rows)), np.log(rows.width.to_numpy(float)),
                          np.log(rows.depth.to_numpy(float)),
                          np.log(rows.step.to_numpy(float))])


class Law:
  """One group's plane (module docstring): `beta` [c0, c_width, c_depth, c_step], its clustered
  covariance, the scatter of run means about it, runs (clusters), points and the data's range.
  Terms the data do not vary (one width, say) are fixed at 0 and `varied` says which vary."""

  def __init__(self, rows: pd.DataFrame):
    rows = rows[(rows.step > rows.warmup) & np.isfinite(rows.headroom)]
    self.runs = rows.run.nunique()
    self.points = len(rows)
    self.varied = [rows[t].nunique() > 1 for t in TERMS]
    self.range = {t: (float(rows[t].min()), float(rows[t].max())) if len(rows) else (np.nan,) * 2
                  for t in TERMS}
    columns = [0] + [i + 1 for i, v in enumerate(self.varied) if v]
    self.beta = np.full(4, np.nan)
    self.covariance = np.full((4, 4), np.nan)
    self.run_scatter = np.nan
    self.df = max(self.runs - 1, 0)
    if self.runs < MIN_RUNS or self.points <= len(columns):
      return
    x = _design(rows)[:, columns]
    y = rows.headroom.to_numpy(float)
    bread = np.linalg.pinv(x.T @ x)
    coef = bread @ x.T @ y
    residual = y - x @ coef
    meat = np.zeros((len(columns), len(columns)))
    for _, idx in rows.groupby("run", sort=False).indices.items():
      score = x[idx].T @ residual[idx]
      meat += np.outer(score, score)
    g, n, k = self.runs, self.points, len(columns)
    scale = g / (g - 1) * (n - 1) / (n - k)  # CR1
    covariance = bread @ meat @ bread * scale
    self.beta = np.zeros(4)
    self.beta[columns] = coef
    self.covariance = np.zeros((4, 4))
    self.covariance[np.ix_(columns, columns)] = covariance
    # The runs' own scatter about the plane: each run's mean residual (what a new run adds).
    means = pd.Series(residual).groupby(rows.run.to_numpy()).mean()
    self.run_scatter = float(means.std(ddof=1)) if len(means) > 1 else 0.0

  @property
  def fitted(self) -> bool:
    return bool(np.isfinite(self.beta).all())

  def quantile(self) -> float:
    return float(scipy_stats.t.ppf(0.975, max(self.df, 1)))

  def at(self, width: float, depth: float, step: float, new_run: bool = False) -> tuple:
    """(mean, low, high) at one point: the 95% interval of the mean, or with `new_run` of one
    new run's mean there (the runs' scatter added)."""
    if not self.fitted:
      return (np.nan,) * 3
    x = np.array([1.0, math.log(width), math.log(depth), math.log(step)])
    for i, varied in enumerate(self.varied):
      if not varied:
        x[i + 1] = 0.0  # a fixed term: its coefficient is 0 and its level is in c0
    mean = float(x @ self.beta)
    variance = float(x @ self.covariance @ x) + (self.run_scatter ** 2 if new_run else 0.0)
    half = self.quantile() * math.sqrt(max(variance, 0.0))
    return mean, mean - half, mean + half

  def coefficient(self, i: int) -> tuple:
    """(value, low, high) of coefficient i (0: c0, 1-3: TERMS') per e-fold."""
    half = self.quantile() * math.sqrt(max(self.covariance[i, i], 0.0))
    return float(self.beta[i]), float(self.beta[i] - half), float(self.beta[i] + half)


def laws(rows: pd.DataFrame) -> dict:
  """{group (GROUP's values): Law} over the rows."""
  return {key: Law(mine) for key, mine in rows.groupby(list(GROUP), sort=False)}


def fit_table(fitted: dict) -> pd.DataFrame:
  """headroom_fit.csv: per group its coefficients per doubling with 95% intervals, runs,
  points and the range it saw."""
  out = []
  for key, law in fitted.items():
    row = dict(zip(GROUP, key), runs=law.runs, points=law.points)
    c0, low, high = law.coefficient(0)
    row.update(intercept=c0, intercept_low=low, intercept_high=high)
    for i, term in enumerate(TERMS, start=1):
      value, low, high = law.coefficient(i)
      per = math.log(2)
      row.update({f"{term}_per_doubling": value * per, f"{term}_low": low * per,
                  f"{term}_high": high * per, f"{term}_min": law.range[term][0],
                  f"{term}_max": law.range[term][1]})
    out.append(row)
  return pd.DataFrame(out)


def predict(fitted: dict, points: pd.DataFrame) -> pd.DataFrame:
  """headroom_prediction.csv: per group and point, the law's mean and the 95% interval of one
  new run's mean there."""
  out = []
  for key, law in fitted.items():
    for p in points.itertuples():
      mean, low, high = law.at(p.width, p.depth, p.step, new_run=True)
      out.append({**dict(zip(GROUP, key)), "width": p.width, "depth": p.depth,
                  "step": p.step, "predicted": mean, "low": low, "high": high})
  return pd.DataFrame(out)


def judge(prediction: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
  """headroom_heldout.csv: each prediction beside the held-out runs' mean headroom at its step
  (the nearest telemetry step at or before it), their number, and whether it is inside."""
  out = []
  for p in prediction.itertuples():
    mine = rows[(rows.arm == p.arm) & (rows.parametrization == p.parametrization)
                & np.isclose(rows.learning_rate, p.learning_rate) & (rows.series == p.series)
                & (rows.width == p.width) & (rows.depth == p.depth) & (rows.step <= p.step)]
    mine = mine[np.isfinite(mine.headroom)]
    if mine.empty:
      measured, runs = np.nan, 0
    else:
      last = mine[mine.step == mine.step.max()]
      measured, runs = float(last.headroom.mean()), last.run.nunique()
    out.append({**p._asdict(), "measured": measured, "runs": runs,
                "inside": bool(p.low <= measured <= p.high) if runs else np.nan})
  frame = pd.DataFrame(out)
  return frame.drop(columns=["Index"]) if "Index" in frame else frame


def extrapolate(fitted: dict, width: int, depth: int, step: int) -> pd.DataFrame:
  """headroom_extrapolation.csv: per group the law at the target, the mean's 95% interval,
  whether its low end reaches 0 (float16's limit within the interval), and the target's factor
  over the largest width, depth and step the law saw."""
  out = []
  for key, law in fitted.items():
    mean, low, high = law.at(width, depth, step)
    out.append({**dict(zip(GROUP, key)), "width": width, "depth": depth, "step": step,
                "headroom": mean, "low": low, "high": high,
                "reaches_zero": bool(low <= 0) if np.isfinite(low) else np.nan,
                "width_beyond": width / law.range["width"][1],
                "depth_beyond": depth / law.range["depth"][1],
                "step_beyond": step / law.range["step"][1],
                "varied": ",".join(t for t, v in zip(TERMS, law.varied) if v)})
  return pd.DataFrame(out)


def write_prediction(workdir: str, heldout: list) -> pd.DataFrame:
  """headroom_prediction.csv in `workdir`, from the rungs trained so far, at each held-out
  (width, depth, step) in `heldout`; an existing one is read back, never rewritten (it was made
  before the held-out runs trained)."""
  path = os.path.join(workdir, PREDICTION)
  if os.path.exists(path):
    return pd.read_csv(path)
  points = pd.DataFrame(heldout, columns=["width", "depth", "step"])
  rows = collect(workdir)
  prediction = predict(laws(rows), points)
  if prediction.empty or not np.isfinite(prediction.predicted).any():
    return prediction  # nothing trained to predict from (--print_config): no file
  prediction.to_csv(path, index=False)
  return prediction


def analyze(workdir: str, width: int, depth: int, step: int) -> dict:
  """Writes headroom_fit.csv and headroom_extrapolation.csv (every rung; the target
  width x depth x step), and headroom_heldout.csv when a prediction was made; returns their
  paths ({} without a rung holding headroom.csv)."""
  rows = collect(workdir)
  if rows.empty:
    return {}
  fitted = laws(rows)
  outputs = {"headroom_fit": os.path.join(workdir, "headroom_fit.csv"),
             "headroom_extrapolation": os.path.join(workdir, "headroom_extrapolation.csv")}
  fit_table(fitted).to_csv(outputs["headroom_fit"], index=False)
  extrapolate(fitted, width, depth, step).to_csv(outputs["headroom_extrapolation"],
                                                 index=False)
  prediction = os.path.join(workdir, PREDICTION)
  if os.path.exists(prediction):
    outputs["headroom_heldout"] = os.path.join(workdir, "headroom_heldout.csv")
    judge(pd.read_csv(prediction), rows).to_csv(outputs["headroom_heldout"], index=False)
  return outputs
