"""The drift experiment's report (`make drift`, configs/drift.py): time to failure as the
quantity, a law over the horizon, the held-out horizon, the drift measured directly, weight
decay, and the arms compared by their laws.

Reads a drift workdir (normstudy.experiments.drift_runs writes it): `drift.json` (the declared
experiment: its law arms, weight-decay arms, held-out arms and horizon), the fit's runs under
`fit/`, the prediction `horizon_prediction.csv` (written from the fit before any held-out run
trained) and the held-out runs under `heldout/<arm>/`. Writes into the workdir:

  law_fit.csv            per arm: the law (log-normal or Weibull, one for all arms, chosen by
                         the summed likelihood: both columns), a, b, sigma, runs, failures, T50
                         at the recipe's and MERT's rates with intervals, the floor test
  critical_lr_law.csv    arm, horizon, critical_lr, low, high, extrapolated (the horizon beyond
                         every fitted run's), at HORIZONS (MERT's 100K steps last)
  law_tests.csv          per pair of law arms: one law (3 df) and one slope (1 df) by likelihood
                         ratio, the stratified log-rank permutation test beside them; per pair
                         of weight decays the same; the tau test and the floor tests; each
                         family Holm-adjusted
  horizon_prediction.csv the prediction (written before the held-out runs, never rewritten)
  horizon_heldout.csv    arm, horizon, lr, predicted failure fraction (low, high), measured,
                         inside; and the horizon-free prediction (the 480-step transition)
  drift.csv              per run: the killing series' slope, its interval, the failure step
                         predicted from the first quarter and the observed one
                         (normstudy.analysis.drift_series); drift_killers.csv, drift_rates.csv
                         and drift_predictions.csv summarise it
  drift.png, drift.md    the figure and the observations, every comparison with its test, n, p
"""

import itertools
import math
import os

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.analysis import drift_series
from normstudy.analysis import edge_law
from normstudy.analysis import law as law_lib
from normstudy.analysis import report
from normstudy.analysis import runs as runs_lib
from normstudy.analysis import sensitivity
from normstudy.analysis import stats
from normstudy.analysis import transition
from normstudy.records import keys
from normstudy.records import rundir
from normstudy.records import schema

PLAN = schema.DRIFT_PLAN
FIT = schema.DRIFT_FIT
HELDOUT = schema.DRIFT_HELDOUT
PREDICTION = schema.DRIFT_PREDICTION
MERT_STEPS = 100_000  # MERT's pre-training (Li et al. 2023): 100K updates at lr 1.5e-3
MERT_LR = 1.5e-3
RECIPE_LR = 3e-3  # the miniature's recipe (configs/seed_figure.py)
HORIZONS = (120, 240, 480, 960, 1920, 10_000, MERT_STEPS)
HORIZON_FREE = 480  # the survival experiment's horizon: what a horizon-free reading assumes
PERMUTATIONS = 2000
SHIFT_DRAWS = 1000  # the held-out shift test's parametric bootstrap (law.shift_lrt_bootstrap)


def read_plan(workdir: str) -> dict:
  plan = rundir.read_json(os.path.join(workdir, PLAN))
  if not plan:
    raise runs_lib.NoRunsError(f"{workdir!r} holds no {PLAN}: not a drift workdir (make drift)")
  return plan


def runs_table(workdir: str) -> tuple:
  """(loaded runs, one row per run: sensitivity.table's columns and weight_decay, min_scale,
  warmup, num_steps, last_step, failed, time: the failure step or, alive, the last step)."""
  loaded = runs_lib.load_runs(workdir)
  runs = sensitivity.table(loaded, report.summarize(loaded))
  runs = runs[runs.outcome != "unfinished"].copy()
  extra = {"weight_decay": [], "min_scale": [], "warmup": [], "num_steps": [], "last_step": []}
  for run in runs.run:
    config = rundir.RunDir(os.path.join(workdir, run)).saved_config()
    optimizer = config.get("optimizer", {})
    extra["weight_decay"].append(float(optimizer.get("weight_decay", 0.0)))
    extra["min_scale"].append(float(optimizer.get("loss_scale", {}).get("min_scale", 1.0)))
    extra["warmup"].append(int(optimizer.get("warmup_steps", 0)))
    extra["num_steps"].append(int(config.get("train", {}).get("num_steps", 0)))
    loss = loaded.series(run, keys.LOSS)
    extra["last_step"].append(int(loss.index.max()) if len(loss) else 0)
  for name, values in extra.items():
    runs[name] = values
  runs["failed"] = runs.failed_at.notna()
  runs["time"] = np.where(runs.failed, runs.failed_at.fillna(0), runs.last_step).astype(float)
  return loaded, runs.reset_index(drop=True)


def data_of(rows: pd.DataFrame) -> law_lib.Data:
  return law_lib.Data.of(rows.learning_rate, np.maximum(rows.time, 1.0), rows.failed)


def law_arms(plan: dict, runs: pd.DataFrame) -> list:
  """The arms a law is fitted to, in order: the declared law arms, then the weight decays' (one
  family for all of them, chosen over all: the prediction and the report choose alike)."""
  present = set(runs.arm)
  return [arm for arm in dict.fromkeys([*plan["arms"], *plan["decay_arms"]]) if arm in present]


def fit_laws(runs: pd.DataFrame, arms) -> tuple:
  """(the law chosen by the summed likelihood over `arms`, {law: summed log-likelihood},
  {arm: Law}); arms whose failures cannot place a law are left out."""
  datasets = {arm: data_of(runs[runs.arm == arm]) for arm in arms}
  placeable = {arm: d for arm, d in datasets.items() if len(set(d.x[d.event])) >= 2}
  chosen, totals = law_lib.choose_law(list(placeable.values()))
  return chosen, totals, {arm: law_lib.fit(d, chosen) for arm, d in placeable.items()}


def critical_table(laws: dict, longest: dict) -> pd.DataFrame:
  """critical_lr_law.csv: each arm's lr*(H) at HORIZONS with its 95% profile interval;
  `extrapolated` where H exceeds the arm's longest run (`longest`)."""
  rows = []
  for arm, fitted in laws.items():
    for horizon in HORIZONS:
      low, high = fitted.critical_lr_interval(horizon)
      rows.append({"arm": arm, "horizon": horizon,
                   "critical_lr": float(fitted.critical_lr(horizon)), "low": low,
                   "high": high, "extrapolated": bool(horizon > longest[arm]),
                   "law": fitted.law})
  return pd.DataFrame(rows, columns=["arm", "horizon", "critical_lr", "low", "high",
                                     "extrapolated", "law"])


def fit_table(runs: pd.DataFrame, laws: dict, floors: dict, labels: dict) -> pd.DataFrame:
  """law_fit.csv (module docstring)."""
  rows = []
  for arm, fitted in laws.items():
    mine = runs[runs.arm == arm]
    t50_recipe = fitted.median_time_interval(RECIPE_LR)
    t50_mert = fitted.median_time_interval(MERT_LR)
    floor = floors[arm]
    rows.append({
        "arm": arm, "label": labels[arm], "weight_decay": float(mine.weight_decay.iloc[0]),
        "law": fitted.law, "a": fitted.a, "b": fitted.b, "sigma": fitted.sigma,
        "runs": fitted.runs, "failures": fitted.failures, "longest_run": int(mine.time.max()),
        "loglik": fitted.loglik,
        **{f"loglik_{name}": law_lib.fit(fitted.data, name).loglik for name in law_lib.LAWS},
        "t50_at_recipe": float(fitted.median_time(RECIPE_LR)),
        "t50_at_recipe_low": t50_recipe[0], "t50_at_recipe_high": t50_recipe[1],
        "t50_at_mert": float(fitted.median_time(MERT_LR)),
        "t50_at_mert_low": t50_mert[0], "t50_at_mert_high": t50_mert[1],
        "floor": floor.floor, "floor_low": floor.low, "floor_high": floor.high,
        "floor_p": floor.p})
  frame = pd.DataFrame(rows)
  frame["floor_p_holm"] = stats.holm(frame.floor_p.tolist())
  return frame


def _pair_rows(family: str, runs: pd.DataFrame, arms, chosen: str) -> list:
  rows = []
  for arm_a, arm_b in itertools.combinations(arms, 2):
    a, b = data_of(runs[runs.arm == arm_a]), data_of(runs[runs.arm == arm_b])
    n = f"{len(a)} and {len(b)}"
    base = {"family": family, "arm_a": arm_a, "arm_b": arm_b, "n": n}
    statistic, p = law_lib.same_law_lrt(a, b, chosen)
    rows.append({**base, "test": "likelihood-ratio test of one law (3 df)",
                 "statistic": statistic, "p": p})
    statistic, p = law_lib.same_slope_lrt(a, b, chosen)
    rows.append({**base, "test": "likelihood-ratio test of one slope in log lr (1 df)",
                 "statistic": statistic, "p": p})
    p = law_lib.stratified_logrank_permutation(a, b, PERMUTATIONS)
    rows.append({**base, "test": "log-rank test stratified by lr, exact permutation "
                 f"({PERMUTATIONS} draws)", "statistic": np.nan, "p": p})
  return rows


def tests_table(runs: pd.DataFrame, plan: dict, chosen: str, fits: pd.DataFrame,
                heldout: pd.DataFrame | None = None) -> pd.DataFrame:
  """law_tests.csv: pairs of law arms and of weight decays (one law, one slope, the permutation
  log-rank), the tau test over the decayed arms, each arm's floor test, and per held-out arm
  whether its held-out runs follow the law fitted without them (law.shift_lrt); Holm within
  each (family, test)."""
  rows = _pair_rows("arms", runs, plan["arms"], chosen)
  for arm in plan["heldout"]["arms"]:
    held = heldout[heldout.arm == arm] if heldout is not None and len(heldout) else []
    if len(held):
      fitted = data_of(runs[runs.arm == arm])
      delta, statistic, p_chi2, p = law_lib.shift_lrt_bootstrap(fitted, data_of(held), chosen,
                                                                SHIFT_DRAWS)
      rows.append({"family": "held-out horizon", "arm_a": arm, "arm_b": "",
                   "n": f"{len(fitted)} and {len(held)}",
                   "test": "likelihood-ratio test that the held-out runs follow the law fitted "
                   f"without them (a shift of their ln T; parametric bootstrap, {SHIFT_DRAWS} "
                   "draws)", "statistic": statistic, "p": p, "estimate": delta,
                   "p_asymptotic": p_chi2})
  decays = plan["decay_arms"]
  rows += _pair_rows("weight decay", runs, list(decays), chosen)
  decayed = [arm for arm, wd in decays.items() if wd > 0]
  if len(decayed) >= 2:
    datasets = [data_of(runs[runs.arm == arm]) for arm in decayed]
    covariate = [math.log10(decays[arm]) for arm in decayed]
    n = " and ".join(str(len(d)) for d in datasets)
    for value, what in ((-math.log(10), "failure time proportional to tau = 1/(lr x wd)"),
                        (0.0, "failure time independent of weight decay")):
      estimate, statistic, p = law_lib.covariate_lrt(datasets, covariate, chosen, value)
      rows.append({"family": "tau", "arm_a": decayed[0], "arm_b": decayed[-1], "n": n,
                   "test": f"likelihood-ratio test: {what} (1 df)", "statistic": statistic,
                   "p": p, "estimate": estimate})
  for r in fits.itertuples():
    rows.append({"family": "floor", "arm_a": r.arm, "arm_b": "", "n": str(r.runs),
                 "test": "likelihood-ratio test of a floor > 0 (one-sided, boundary)",
                 "statistic": np.nan, "p": r.floor_p, "estimate": r.floor})
  frame = pd.DataFrame(rows)
  frame["p_holm"] = np.nan
  for _, family in frame.groupby(["family", "test"]):
    frame.loc[family.index, "p_holm"] = stats.holm(family.p.tolist())
  frame["verdict"] = [stats.verdict_holm(t, n, p, ph) for t, n, p, ph in
                      zip(frame.test, frame.n, frame.p, frame.p_holm)]
  return frame


# --- The held-out horizon: predicted before it is run, then measured.


def heldout_rates(fitted: law_lib.Law, horizon: int, fractions) -> list:
  """The learning rates at which `fitted` predicts each of `fractions` failing by `horizon`,
  rounded to 4 significant digits."""
  out = []
  for fraction in fractions:
    w = float(law_lib.quantile(fitted.law, fraction))
    x = (math.log(horizon) - fitted.a - fitted.sigma * w) / fitted.b
    out.append(float(f"{10 ** x:.4g}"))
  return out


def horizon_free(runs: pd.DataFrame, arm: str):
  """The logistic transition of `arm`'s fit runs judged at HORIZON_FREE steps (failed by
  then; at their end, if shorter): what the survival experiment's critical rate says, read as
  if it held at every horizon."""
  mine = runs[runs.arm == arm]
  horizon = min(HORIZON_FREE, int(mine.num_steps.min()))
  failed = (mine.failed & (mine.time <= horizon)).to_numpy(dtype=float)
  return transition.fit(np.log10(mine.learning_rate.to_numpy(dtype=float)), failed)


def prediction_table(runs: pd.DataFrame, laws: dict, plan: dict) -> pd.DataFrame:
  """horizon_prediction.csv: per held-out arm and rate, the law's failure fraction by the
  held-out horizon with its interval, lr*(horizon) with its interval, and the horizon-free
  prediction."""
  held = plan["heldout"]
  horizon = int(held["steps"])
  rows = []
  for arm in held["arms"]:
    fitted = laws[arm]
    free = horizon_free(runs, arm)
    critical = fitted.critical_lr_interval(horizon)
    for lr in heldout_rates(fitted, horizon, held["fractions"]):
      low, high = fitted.failure_probability_interval(lr, horizon)
      rows.append({"arm": arm, "horizon": horizon, "lr": lr,
                   "predicted": float(fitted.failure_probability(lr, horizon)),
                   "low": low, "high": high,
                   "critical_lr": float(fitted.critical_lr(horizon)),
                   "critical_lr_low": critical[0], "critical_lr_high": critical[1],
                   "horizon_free_predicted": float(free.probability(math.log10(lr)))
                   if free is not None else np.nan,
                   "horizon_free_critical_lr": 10 ** free.center if free is not None
                   else np.nan, "law": fitted.law})
  return pd.DataFrame(rows)


def _count_range(runs: int, low: float, high: float) -> tuple[int, int]:
  """The failures out of `runs` a predicted probability in [low, high] allows at 95%: from the
  2.5% point of Binomial(runs, low) to the 97.5% point of Binomial(runs, high)."""
  return (int(scipy_stats.binom.ppf(0.025, runs, low)),
          int(scipy_stats.binom.ppf(0.975, runs, high)))


def heldout_table(prediction: pd.DataFrame, heldout: pd.DataFrame) -> pd.DataFrame:
  """horizon_heldout.csv: each predicted (arm, lr) against its held-out runs: measured failure
  fraction, inside (the failures within the count range the predicted interval allows,
  _count_range), the same for the horizon-free prediction, and the runs' failure steps."""
  rows = []
  for p in prediction.itertuples():
    mine = heldout[(heldout.arm == p.arm) & np.isclose(heldout.learning_rate, p.lr)]
    n, k = len(mine), int(mine.failed.sum())
    low, high = _count_range(n, p.low, p.high)
    free_low, free_high = _count_range(n, p.horizon_free_predicted, p.horizon_free_predicted)
    steps = ",".join(str(int(t)) for t in sorted(mine[mine.failed].time))
    rows.append({"arm": p.arm, "horizon": p.horizon, "lr": p.lr, "predicted": p.predicted,
                 "low": p.low, "high": p.high, "runs": n, "failed": k,
                 "measured": k / n if n else np.nan, "inside": bool(n and low <= k <= high),
                 "horizon_free_predicted": p.horizon_free_predicted,
                 "horizon_free_inside": bool(n and free_low <= k <= free_high),
                 "failure_steps": steps})
  return pd.DataFrame(rows)


def heldout_likelihood(prediction: pd.DataFrame, heldout: pd.DataFrame) -> dict:
  """The held-out runs' binomial log-likelihood under the law's predicted fractions and under
  the horizon-free ones (higher: the better prediction), summed over the held-out points."""
  law_ll = free_ll = 0.0
  for p in prediction.itertuples():
    mine = heldout[(heldout.arm == p.arm) & np.isclose(heldout.learning_rate, p.lr)]
    n, k = len(mine), int(mine.failed.sum())
    law_ll += scipy_stats.binom.logpmf(k, n, min(max(p.predicted, 1e-9), 1 - 1e-9))
    free_ll += scipy_stats.binom.logpmf(k, n, min(max(p.horizon_free_predicted, 1e-9),
                                                  1 - 1e-9))
  return {"law": float(law_ll), "horizon_free": float(free_ll)}


def predict(workdir: str) -> pd.DataFrame:
  """The held-out prediction: horizon_prediction.csv as written, or, before any held-out run,
  computed from the fit and written (never rewritten: a prediction made after the runs it
  predicts would test nothing)."""
  path = os.path.join(workdir, PREDICTION)
  if os.path.exists(path):
    return pd.read_csv(path)
  plan = read_plan(workdir)
  _, runs = runs_table(os.path.join(workdir, FIT))
  _, _, laws = fit_laws(runs, law_arms(plan, runs))
  missing = [arm for arm in plan["heldout"]["arms"] if arm not in laws]
  if missing:
    raise ValueError(f"no law for held-out arm(s) {', '.join(missing)}: too few failures")
  prediction = prediction_table(runs, laws, plan)
  prediction.to_csv(path + ".tmp", index=False)
  os.replace(path + ".tmp", path)
  return prediction


def _heldout_runs(workdir: str, arms) -> tuple:
  """(the loaded held-out runs per arm, their rows joined) of the held-out directories that
  hold runs."""
  loaded, frames = {}, []
  for arm in arms:
    directory = os.path.join(workdir, HELDOUT, arm)
    if not os.path.isdir(directory):
      continue
    try:
      loaded[arm], rows = runs_table(directory)
    except runs_lib.NoRunsError:
      continue
    frames.append(rows)
  return loaded, (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())


def _drift_rows(loaded, runs: pd.DataFrame, killed: pd.DataFrame, prefix: str) -> pd.DataFrame:
  """drift_series.table of runs named relative to their own directory, `prefix` (relative to
  the drift workdir) put before each run's name."""
  table = drift_series.table(loaded, runs, killed, dict(zip(runs.run, runs.min_scale)),
                             dict(zip(runs.run, runs.warmup)), dict(zip(runs.run, runs.num_steps)))
  table["run"] = [os.path.join(prefix, r) for r in table.run]
  return table


def drift_tables(loaded, runs, heldout_loaded, heldout) -> dict:
  """drift.csv and its summaries (normstudy.analysis.drift_series) over the fit's and the
  held-out runs, each arm's killing series read from its fit runs."""
  killed = drift_series.killers(loaded, runs, dict(zip(runs.run, runs.min_scale)))
  fit = _drift_rows(loaded, runs, killed, FIT)
  frames = [fit]
  for arm, mine in heldout_loaded.items():
    rows = heldout[heldout.arm == arm]
    frames.append(_drift_rows(mine, rows, killed, os.path.join(HELDOUT, arm)))
  drift = pd.concat(frames, ignore_index=True)
  return {"drift": drift, "drift_killers": killed, "drift_rates": drift_series.rate_law(fit),
          "drift_predictions": drift_series.prediction_summary(drift)}


def analyze(workdir: str, best_rates: str | None = None) -> dict:
  """Every table, the figure and the observations of a drift workdir (module docstring), then
  the edge law's forms judged out of sample and the margin over `best_rates`' best-learning
  rates (normstudy.analysis.edge_law); returns {name: path}."""
  plan = read_plan(workdir)
  loaded, runs = runs_table(os.path.join(workdir, FIT))
  labels = {arm: rows.arm_label.iloc[0] for arm, rows in runs.groupby("arm", sort=False)}
  chosen, totals, laws = fit_laws(runs, law_arms(plan, runs))
  floors = {arm: law_lib.fit_floor(fitted.data, chosen) for arm, fitted in laws.items()}
  fits = fit_table(runs, laws, floors, labels)
  longest = {arm: float(runs[runs.arm == arm].num_steps.max()) for arm in laws}
  heldout_loaded, heldout = _heldout_runs(workdir, plan["heldout"]["arms"])
  tables = {"law_fit": fits, "critical_lr_law": critical_table(laws, longest),
            "law_tests": tests_table(runs, plan, chosen, fits, heldout)}
  prediction_path = os.path.join(workdir, PREDICTION)
  prediction = pd.read_csv(prediction_path) if os.path.exists(prediction_path) else None
  if prediction is not None and len(heldout):
    tables["horizon_heldout"] = heldout_table(prediction, heldout)
  tables.update(drift_tables(loaded, runs, heldout_loaded, heldout))
  outputs = {}
  for name, frame in tables.items():
    outputs[name] = os.path.join(workdir, f"{name}.csv")
    frame.to_csv(outputs[name], index=False)
  outputs["figure"] = plot(runs, laws, tables, labels, os.path.join(workdir, "drift.png"),
                           heldout)
  text = observations(runs, heldout, chosen, totals, tables, labels, plan, prediction)
  outputs["observations"] = os.path.join(workdir, "drift.md")
  with open(outputs["observations"], "w", encoding="utf-8") as f:
    f.write(text + "\n")
  outputs.update(edge_law.write(workdir, best_rates))
  return outputs


# --- The figure and the observations.


def plot(runs: pd.DataFrame, laws: dict, tables: dict, labels: dict, path: str,
         heldout: pd.DataFrame | None = None) -> str:
  """drift.png: (left) each run's failure step against its learning rate, survivors as open
  marks at their end (triangles: the fit's runs; squares: the held-out runs), with each arm's
  fitted median T50(lr); (middle) lr*(H) against the
  horizon with its 95% band, MERT's rate and 100K steps marked; (right) the killing series'
  slope per 100 steps against the learning rate."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
  colors = dict(zip(laws, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
  lr_grid = np.geomspace(1e-3, 0.3, 100)
  for arm, fitted in laws.items():
    mine = runs[runs.arm == arm]
    color = colors[arm]
    failed, alive = mine[mine.failed], mine[~mine.failed]
    axes[0].scatter(failed.learning_rate, failed.time, s=14, color=color)
    axes[0].scatter(alive.learning_rate, alive.time, s=22, facecolors="none", edgecolors=color,
                    marker="^")
    axes[0].plot(lr_grid, fitted.median_time(lr_grid), color=color, label=labels[arm], lw=1.2)
    if heldout is not None and len(heldout):
      held = heldout[heldout.arm == arm]
      axes[0].scatter(held[held.failed].learning_rate, held[held.failed].time, s=18,
                      color=color, marker="s")
      axes[0].scatter(held[~held.failed].learning_rate, held[~held.failed].time, s=26,
                      facecolors="none", edgecolors=color, marker="s")
    critical = tables["critical_lr_law"]
    rows = critical[critical.arm == arm]
    horizons = np.geomspace(100, MERT_STEPS, 60)
    axes[1].plot(horizons, fitted.critical_lr(horizons), color=color, label=labels[arm])
    axes[1].errorbar(rows.horizon, rows.critical_lr,
                     yerr=[rows.critical_lr - rows.low.fillna(rows.critical_lr),
                           rows.high.fillna(rows.critical_lr) - rows.critical_lr],
                     fmt="o", ms=3, color=color, capsize=2, lw=0.8)
  for ax in axes[:2]:
    ax.set_xscale("log")
    ax.set_yscale("log")
  axes[0].axvline(MERT_LR, color="gray", ls=":", lw=1)
  axes[0].axhline(MERT_STEPS, color="gray", ls=":", lw=1)
  axes[0].set_xlabel("learning rate")
  axes[0].set_ylabel("failure step (open: alive at its end; squares held out), fitted T50")
  axes[0].set_ylim(5, 3e6)
  axes[0].legend(fontsize=7, loc="upper right")
  axes[1].axhline(MERT_LR, color="gray", ls=":", lw=1, label="MERT's lr 1.5e-3")
  axes[1].axhline(RECIPE_LR, color="gray", ls="--", lw=1, label="the recipe's lr 3e-3")
  axes[1].axvline(MERT_STEPS, color="gray", ls="-.", lw=1, label="MERT's 100K steps")
  axes[1].set_xlabel("horizon H (steps)")
  axes[1].set_ylabel("critical learning rate lr*(H), 95% profile interval")
  axes[1].legend(fontsize=7)
  drift = tables["drift"]
  for arm in laws:
    mine = drift[(drift.arm == arm) & drift.slope_per_100_steps.notna()]
    if len(mine):
      axes[2].errorbar(mine.lr * (1 + 0.02 * mine.seed), mine.slope_per_100_steps,
                       yerr=[mine.slope_per_100_steps - mine.low,
                             mine.high - mine.slope_per_100_steps], fmt="o", ms=3,
                       color=colors[arm], capsize=2, lw=0.7,
                       label=f"{labels[arm]}: {mine.series.iloc[0]}")
  axes[2].set_xscale("log")
  axes[2].axhline(0, color="gray", lw=0.8)
  axes[2].set_xlabel("learning rate")
  axes[2].set_ylabel("killing series: decades (log10) per 100 steps")
  axes[2].legend(fontsize=7)
  fig.suptitle("Failure as a drift: time to failure against the learning rate, and the critical "
               "rate at any horizon")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _lr(value: float) -> str:
  return f"{value:.2g}" if math.isfinite(value) else "open"


def _interval(low: float, high: float) -> str:
  return f"{_lr(low)} to {_lr(high)}"


def observations(runs, heldout, chosen, totals, tables, labels, plan, prediction) -> str:
  """drift.md: the law, the horizons, the held-out test, the drift, weight decay and the arms'
  comparison, every comparison with its test, n and p."""
  fits, critical, tests = tables["law_fit"], tables["critical_lr_law"], tables["law_tests"]
  other = [law for law in law_lib.LAWS if law != chosen][0]
  lines = [f"# Failure as a drift ({len(runs)} runs of at most "
           f"{int(runs.num_steps.max())} steps)", "",
           f"The law: ln T = a + b log10(lr) + sigma W, {chosen} (summed log-likelihood "
           f"{totals[chosen]:.1f} against {totals[other]:.1f} for the {other} law over "
           f"{len(fits)} arms; both have 3 parameters an arm), fitted with every survivor "
           "right-censored at its end (normstudy.analysis.law).", ""]
  for r in fits.itertuples():
    rows = critical[critical.arm == r.arm].set_index("horizon")
    at = lambda h: (f"{rows.critical_lr[h]:.2g} ({_interval(rows.low[h], rows.high[h])})")
    lines.append(
        f"- {r.label}: {r.failures} of {r.runs} runs failed by step {r.longest_run}; "
        f"b = {r.b:.2f}, sigma = {r.sigma:.2f}. lr*(H): {at(480)} at 480 steps, {at(960)} at "
        f"960, {at(1920)} at 1920 (extrapolated), {at(MERT_STEPS)} at MERT's 100K steps "
        f"(extrapolated {math.log10(MERT_STEPS / r.longest_run):.1f} decades). Median time "
        f"to failure at MERT's 1.5e-3: {r.t50_at_mert:.3g} steps "
        f"({_interval(r.t50_at_mert_low, r.t50_at_mert_high)}).")
  lines += ["", _heldout_text(tables, prediction, heldout, runs, plan), "", _drift_text(tables, labels), "",
            _decay_text(fits, tests, labels, plan), "", _pairs_text(tests, labels)]
  return "\n".join(lines)


def _heldout_text(tables, prediction, heldout, runs, plan) -> str:
  if "horizon_heldout" not in tables:
    return ("The held-out horizon: not run yet" + (
        "; predicted (horizon_prediction.csv) before it." if prediction is not None else "."))
  held = tables["horizon_heldout"]
  inside, free_inside = int(held.inside.sum()), int(held.horizon_free_inside.sum())
  ll = heldout_likelihood(prediction, heldout)
  fractions = ", ".join(f"{100 * f:g}%" for f in plan["heldout"]["fractions"])
  free = min(HORIZON_FREE, int(runs.num_steps.min()))
  none = float(np.prod([(1 - p) ** n for p, n in zip(held.predicted, held.runs)]))
  expected = float(np.sum(held.predicted * held.runs))
  shift = tables["law_tests"]
  shift = shift[shift.family == "held-out horizon"]
  censored = {arm: not rows.failed.any() for arm, rows in heldout.groupby("arm")}
  shifts = "; ".join(
      f"{r.arm_a}: " + ("every held-out run survived, so the shift's estimate runs to the edge; "
                        if censored.get(r.arm_a) else f"ln T {r.estimate:+.2f}; ") + r.verdict
      for r in shift.itertuples())
  counts = (f" {int(held.failed.sum())} of {int(held.runs.sum())} held-out runs failed where the "
            f"law's point predictions expected {expected:.1f} (probability of so few or fewer "
            f"under them: {stats.format_p(none) if held.failed.sum() == 0 else 'n/a'}); refitted with "
            f"the held-out runs, a shift of their failure times: {shifts}.") if len(held) else ""
  return (f"The held-out horizon ({int(held.horizon.iloc[0])} steps, "
          f"{held.horizon.iloc[0] / runs.num_steps.max():g} times the longest fitted run; "
          f"{int(held.runs.sum())} runs at {len(held)} (arm, rate) points, the rates placed "
          f"where the law predicted {fractions} failing, predicted in horizon_prediction.csv "
          f"before they trained): the law's prediction held at {inside} of {len(held)} points "
          "(the failures within the 95% range its interval allows: a weak check where the "
          "interval is wide); the horizon-free reading "
          f"(the {free}-step transition taken to hold at every horizon) at {free_inside} of "
          f"{len(held)}. Binomial log-likelihood of the held-out failures: {ll['law']:.2f} "
          f"under the law, {ll['horizon_free']:.2f} horizon-free." + counts)


def _drift_text(tables, labels) -> str:
  killed, rates = tables["drift_killers"], tables["drift_rates"]
  predicted = tables["drift_predictions"]
  lines = ["The drift (drift.csv): each failed run's killing series is the candidate with the "
           "least headroom below its float16 limit at its last telemetry step before failure."]
  for arm, rows in killed.groupby("arm", sort=False):
    top = rows.iloc[0]
    rate = rates[rates.arm == arm]
    pred = predicted[predicted.arm == arm]
    text = (f"- {labels.get(arm, arm)}: {top.series} in {top.runs} of {top.failed_runs} failed "
            "runs" + (f" (then {rows.series.iloc[1]}, {rows.runs.iloc[1]})" if len(rows) > 1
                      else ""))
    if len(rate) and np.isfinite(rate.k.iloc[0]):
      text += (f"; its slope grows as lr^{rate.k.iloc[0]:.2f} (95% "
               f"{rate.k_low.iloc[0]:.2f} to {rate.k_high.iloc[0]:.2f}, n = {rate.runs.iloc[0]} "
               "runs)")
    if len(pred) and pred.failed_predicted.iloc[0]:
      p = pred.iloc[0]
      if np.isfinite(p.log10_ratio_median):
        text += (f"; the first quarter's line puts the failure step a median factor "
                 f"{10 ** abs(p.log10_ratio_median):.2f} "
                 f"{'late' if p.log10_ratio_median > 0 else 'early'} (log10 ratio IQR "
                 f"{p.log10_ratio_q1:.2f} to {p.log10_ratio_q3:.2f}; Spearman's rho of "
                 f"predicted and observed {p.spearman:.2f}, p = {stats.format_p(p.spearman_p)}, "
                 f"n = {p.failed_predicted} failed runs)")
      else:
        text += (f"; in its first quarter the series does not rise in any of the "
                 f"{p.failed_predicted} runs that failed later, so the quarter predicts nothing")
    lines.append(text + ".")
  return "\n".join(lines)


def _decay_text(fits, tests, labels, plan) -> str:
  decays = plan["decay_arms"]
  lines = ["Weight decay (decoupled, times the rate, as fairseq's Adam; AdamW's timescale tau = "
           f"1/(lr x wd); MERT's at lr 1.5e-3 and wd 0.01: {1 / (MERT_LR * 0.01):,.0f} steps, "
           f"so its 100K steps are {MERT_STEPS * MERT_LR * 0.01:.1f} tau):"]
  for arm, wd in decays.items():
    row = fits[fits.arm == arm]
    if not len(row):
      continue
    r = row.iloc[0]
    floor = tests[(tests.family == "floor") & (tests.arm_a == arm)].iloc[0]
    lines.append(f"- weight decay {wd:g}: floor {r.floor:.2g} "
                 f"({_interval(r.floor_low, r.floor_high)}); a floor > 0 "
                 + floor.verdict.replace("different", "separated") + ".")
  for r in tests[tests.family == "tau"].itertuples():
    held = "rejected" if r.p_holm < stats.ALPHA else "not rejected"
    lines.append(f"- {r.test.replace('likelihood-ratio test: ', 'Is the ')}? The fitted "
                 f"coefficient of log10(wd) in ln T is {r.estimate:.2f} (tau scaling: "
                 f"{-math.log(10):.2f}; none: 0); {held} ({r.verdict.split(' (', 1)[1]}.")
  for r in tests[(tests.family == "weight decay") & tests.test.str.contains("one law")
                 ].itertuples():
    lines.append(f"- {decays[r.arm_a]:g} against {decays[r.arm_b]:g}: {r.verdict}.")
  return "\n".join(lines)


def _pairs_text(tests, labels) -> str:
  lines = ["The arms compared by their laws (likelihood ratio primary, Holm over the pairs; the "
           "stratified log-rank permutation test beside it):"]
  arms = tests[tests.family == "arms"]
  for (a, b), rows in arms.groupby(["arm_a", "arm_b"], sort=False):
    by = rows.set_index("test")
    law_row = by[by.index.str.contains("one law")].iloc[0]
    slope_row = by[by.index.str.contains("one slope")].iloc[0]
    perm_row = by[by.index.str.contains("log-rank")].iloc[0]
    lines.append(f"- {labels.get(a, a)} against {labels.get(b, b)}: one law "
                 f"{law_row.verdict}; one slope {slope_row.verdict}; log-rank permutation "
                 f"p = {stats.format_p(perm_row.p)} (Holm {stats.format_p(perm_row.p_holm)}).")
  return "\n".join(lines)
