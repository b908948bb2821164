"""The critical learning rate found by search (normstudy.experiments.search): per arm (and value of the
other axes, the `group`) the transition fitted to every probe the search made
(normstudy.analysis.transition), per point its final bracket, pairwise comparisons of arms, and
the critical learning rate at shorter horizons read off the same runs.

  critical_lr.csv        arm, label, group, seeds (points whose bracket was established),
                         beyond (points whose critical value lies outside every bracket tried),
                         rounds, critical_lr with critical_lr_low and critical_lr_high (the
                         learning rate where the fitted P(fail) crosses 50%, its 95%
                         profile-likelihood interval), spread_decades (the seeds' sample
                         standard deviation of log10 bracket midpoints), bracket_decades (the
                         widest final bracket), transition_decades with transition_low and
                         transition_high (the fitted width from 10% to 90% failing, in decades),
                         probes and failed (the runs the fit saw)
  critical_lr_points.csv per point: arm, group, seed, low, high, established, critical_lr (its
                         bracket's geometric midpoint)
                         and one_cell: the probes completely separated (every failure above
                         every survival), so the 50% point is known only to lie in the one
                         cell of the lattice between them; probing inside it says more
  critical_lr_tests.csv  every pair of arms in a group: the likelihood-ratio test that the two
                         transitions share one 50% point over every probe of both (p_lrt, the
                         primary test; `separated` where its Holm-adjusted p < 0.05), the exact
                         paired permutation test on the seeds' log10 midpoints beside it
                         (p_exact), the ratio of the fitted critical learning rates and of the
                         seeds' geometric mean midpoints, each p Holm-adjusted over the family;
                         for each pair not separated, the factor within which the two are
                         equivalent at 95% (two one-sided likelihood-ratio tests on the log
                         ratio's profile: transition.equivalence_factor). No t-test: the
                         midpoints sit on the search's lattice, so coinciding seeds give a
                         variance of 0 and p-values near 0 that the likelihood does not support
  critical_lr_horizons.csv  arm, horizon, critical_lr, critical_lr_low, critical_lr_high (and
                         the group, label, transition width, probes and failures): the fit with
                         each run judged at 120, 240 and 480 steps (those its runs reach) by the
                         failure rule on its records up to there
  critical_lr_horizon_tests.csv  every pair of arms at each horizon: the ratio of fitted critical
                         learning rates, the likelihood-ratio test of one shared 50% point with
                         Holm over the pairs at that horizon, and whether the order matches the
                         longest horizon's
  critical_lr.png        each seed's bracket and the arms' fitted critical learning rates with
                         their intervals
"""

import itertools
import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.analysis import transition
from normstudy.records import rundir
from normstudy.records import schema

SEED_FIELD = "train.seed"
# Horizons (steps) the critical learning rate is also read at, those the runs reach.
HORIZONS = (120, 240, 480)
LRT = "likelihood-ratio test of one 50% point"


def is_search(loaded: runs_lib.Runs) -> bool:
  return loaded.search is not None


def points_table(loaded: runs_lib.Runs) -> pd.DataFrame:
  """One row per point of the search: its final bracket and estimate."""
  search = loaded.search
  labels = {facts.info.arm: facts.arm_label for facts in loaded.runs.values()}
  rows = []
  for point in search.points:
    final = point.brackets[-1] if point.brackets else schema.BracketRecord(
        search.low, search.high, established=False)
    values = dict(point.point)
    seed = values.pop(SEED_FIELD, None)
    group = ", ".join(f"{k}={v}" for k, v in values.items())
    established = bool(final.established)
    rows.append({"point": point.name, "arm": point.arm,
                 "label": labels.get(point.arm) or point.arm, "group": group,
                 "seed": seed, "low": final.low, "high": final.high,
                 "established": established, "rounds": len(point.brackets),
                 "critical_lr": math.sqrt(final.low * final.high) if established
                 else math.nan})
  return pd.DataFrame(rows)


def _probes(runs: pd.DataFrame) -> tuple:
  """(log10 learning rates, failed) of a set of sensitivity.table's runs that ended."""
  ended = runs[runs.outcome != "unfinished"]
  return (np.log10(ended.learning_rate.to_numpy(dtype=float)),
          ended.status.isin(schema.FAILED).to_numpy().astype(float))


def _fitted(fit, prefix="critical_lr") -> dict:
  """A transition's columns (NaN when it lies beyond the probes)."""
  if fit is None:
    return {prefix: math.nan, f"{prefix}_low": math.nan, f"{prefix}_high": math.nan,
            "transition_decades": math.nan, "transition_low": math.nan,
            "transition_high": math.nan, "one_cell": False}
  return {prefix: 10 ** fit.center, f"{prefix}_low": 10 ** fit.center_low,
          f"{prefix}_high": 10 ** fit.center_high, "transition_decades": fit.width,
          "transition_low": fit.width_low, "transition_high": fit.width_high,
          "one_cell": one_cell(fit)}


def one_cell(fit) -> bool:
  """Whether the probes are completely separated: the likelihood rises with the slope to its
  cap, so the 50% point is placed only within the lattice cell between the highest survival
  and the lowest failure."""
  return bool(fit.width <= transition.WIDTH_PER_SLOPE / transition.MAX_SLOPE * (1 + 1e-6))


def table(points: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
  """critical_lr.csv: per arm and group the bisection's points and the transition fitted to
  every probe of the arm among `runs` (sensitivity.table's)."""
  rows = []
  for (group, arm), at in points.groupby(["group", "arm"], sort=False):
    found = at[at.established]
    logs = np.log10(found.critical_lr.to_numpy())
    x, y = _probes(runs[(runs.arm == arm) & (runs.group == group)])
    rows.append({
        "arm": arm, "label": at.label.iloc[0], "group": group, "seeds": len(found),
        "beyond": int((~at.established).sum()), "rounds": int(at.rounds.max()),
        **_fitted(transition.fit(x, y)),
        "spread_decades": float(logs.std(ddof=1)) if len(logs) > 1 else math.nan,
        "bracket_decades": float(np.log10(found.high / found.low).max()) if len(found)
        else math.nan,
        "probes": len(y), "failed": int(y.sum())})
  return pd.DataFrame(rows, columns=[
      "arm", "label", "group", "seeds", "beyond", "rounds", "critical_lr", "critical_lr_low",
      "critical_lr_high", "spread_decades", "bracket_decades", "transition_decades",
      "transition_low", "transition_high", "probes", "failed", "one_cell"])


def compare(a: pd.DataFrame, b: pd.DataFrame) -> dict:
  """Two arms' established points side by side: the ratio of the seeds' geometric mean
  midpoints (descriptive) and, paired by seed when both have the same seeds, the exact paired
  permutation test on their log10 midpoints (every sign pattern: no variance to vanish when
  seeds coincide on the search's lattice, as a t-test's does)."""
  a = a[a.established].sort_values("seed")
  b = b[b.established].sort_values("seed")
  la, lb = np.log10(a.critical_lr.to_numpy()), np.log10(b.critical_lr.to_numpy())
  paired = len(a) > 1 and list(a.seed) == list(b.seed)
  diff = float(la.mean() - lb.mean()) if len(la) and len(lb) else math.nan
  return {"n_a": len(la), "n_b": len(lb), "ratio": 10 ** diff if np.isfinite(diff) else math.nan,
          "p_exact": stats.paired_permutation(la, lb) if paired else math.nan}


def _fitted_ratio(runs, group, arm_a, arm_b) -> dict:
  """The ratio of two arms' fitted critical learning rates, the likelihood-ratio test that they
  share one 50% point, and the factor within which two one-sided likelihood-ratio tests show
  them equivalent (transition.equivalence_factor)."""
  a = _probes(runs[(runs.arm == arm_a) & (runs.group == group)])
  b = _probes(runs[(runs.arm == arm_b) & (runs.group == group)])
  fa, fb = transition.fit(*a), transition.fit(*b)
  ratio = 10 ** (fa.center - fb.center) if fa is not None and fb is not None else math.nan
  return {"fitted_ratio": ratio, "p_lrt": transition.same_center_lrt(a, b)[1],
          "equivalence_factor": transition.equivalence_factor(a, b)}


TEST_COLUMNS = ["group", "arm_a", "arm_b", "n_a", "n_b", "ratio", "p_exact", "fitted_ratio",
                "p_lrt", "equivalence_factor"]


def tests(points: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
  """critical_lr_tests.csv: every pair of arms in a group. The likelihood-ratio test of one 50%
  point over every probe of both arms is primary (`separated`: its Holm-adjusted p < ALPHA);
  the exact paired permutation test on the seeds' midpoints beside it; each Holm-adjusted over
  the pairs. For a pair not separated, the equivalence factor: the smallest ratio the two
  one-sided likelihood-ratio tests rule out."""
  rows = []
  for group, at in points.groupby("group", sort=False):
    arms = list(dict.fromkeys(at.arm))
    for arm_a, arm_b in itertools.combinations(arms, 2):
      rows.append({"group": group, "arm_a": arm_a, "arm_b": arm_b,
                   **compare(at[at.arm == arm_a], at[at.arm == arm_b]),
                   **_fitted_ratio(runs, group, arm_a, arm_b)})
  out = pd.DataFrame(rows, columns=TEST_COLUMNS)
  out["p_exact_holm"] = stats.holm(out.p_exact.tolist()) if len(out) else []
  out["p_lrt_holm"] = stats.holm(out.p_lrt.tolist()) if len(out) else []
  out["separated"] = out.p_lrt_holm < stats.ALPHA
  # A margin is what "not separated" bounds; for a separated pair it means nothing.
  out.loc[out.separated, "equivalence_factor"] = math.nan
  return out


def _horizons(loaded: runs_lib.Runs, runs: pd.DataFrame) -> list:
  """HORIZONS that every run reaches, and the runs' own horizon (their num_steps) if not among
  them."""
  steps = [loaded[run].num_steps for run in runs.run if loaded[run].num_steps]
  if not steps:
    return []
  last = min(steps)
  return [h for h in HORIZONS if h < last] + [last]


def horizons(loaded: runs_lib.Runs, runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
  """(critical_lr_horizons.csv, critical_lr_horizon_tests.csv): each arm's transition fitted
  with every run judged at each horizon (runs_lib.outcome_at), and every pair's ratio and
  likelihood-ratio test there."""
  ended = runs[runs.outcome != "unfinished"]
  chosen = _horizons(loaded, ended)
  failed = {h: {run: loaded_outcome.failed for run, loaded_outcome in (
      (run, runs_lib.outcome_at(loaded, run, h)) for run in ended.run)} for h in chosen}
  rows, fits = [], {}
  for (group, arm), at in ended.groupby(["group", "arm"], sort=False):
    x = np.log10(at.learning_rate.to_numpy(dtype=float))
    for h in chosen:
      y = np.array([failed[h][run] for run in at.run], dtype=float)
      fits[(group, arm, h)] = (x, y, transition.fit(x, y))
      rows.append({"arm": arm, "horizon": h, **_fitted(fits[(group, arm, h)][2]),
                   "group": group, "label": at.arm_label.iloc[0], "probes": len(y),
                   "failed": int(y.sum())})
  by_horizon = pd.DataFrame(rows, columns=[
      "arm", "horizon", "critical_lr", "critical_lr_low", "critical_lr_high", "group", "label",
      "transition_decades", "transition_low", "transition_high", "probes", "failed"])
  return by_horizon, _horizon_tests(fits, chosen)


def _horizon_tests(fits: dict, chosen: list) -> pd.DataFrame:
  rows = []
  keys = list(dict.fromkeys((group, arm) for group, arm, _ in fits))
  for h in chosen:
    family = []
    for (ga, arm_a), (gb, arm_b) in itertools.combinations(keys, 2):
      if ga != gb:
        continue
      xa, ya, fa = fits[(ga, arm_a, h)]
      xb, yb, fb = fits[(gb, arm_b, h)]
      longest_a, longest_b = fits[(ga, arm_a, chosen[-1])][2], fits[(gb, arm_b, chosen[-1])][2]
      log_ratio = fa.center - fb.center if fa is not None and fb is not None else math.nan
      longest = (longest_a.center - longest_b.center
                 if longest_a is not None and longest_b is not None else math.nan)
      family.append({"group": ga, "arm_a": arm_a, "arm_b": arm_b, "horizon": h,
                     "ratio": 10 ** log_ratio,
                     "p_lrt": transition.same_center_lrt((xa, ya), (xb, yb))[1],
                     "same_order": bool(np.sign(log_ratio) == np.sign(longest))
                     if np.isfinite(log_ratio) and np.isfinite(longest) else math.nan})
    holm = stats.holm([row["p_lrt"] for row in family])
    rows += [{**row, "p_lrt_holm": p} for row, p in zip(family, holm)]
  return pd.DataFrame(rows, columns=["group", "arm_a", "arm_b", "horizon", "ratio", "p_lrt",
                                     "p_lrt_holm", "same_order"])


def plot(points: pd.DataFrame, by_arm: pd.DataFrame, path: str) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  keys = list(dict.fromkeys(zip(by_arm.group, by_arm.arm)))
  from matplotlib.ticker import FuncFormatter
  fig, ax = plt.subplots(figsize=(9, 0.6 * len(keys) + 1.8))
  for y, (group, arm) in enumerate(keys):
    at = points[(points.group == group) & (points.arm == arm) & points.established]
    jitter = np.linspace(-0.2, 0.2, len(at)) if len(at) > 1 else np.zeros(len(at))
    for dy, (_, row) in zip(jitter, at.iterrows()):
      ax.plot([row.low, row.high], [y + dy, y + dy], color="0.6", lw=1)
      ax.plot(row.critical_lr, y + dy, "o", color="0.4", ms=3)
    summary = by_arm[(by_arm.group == group) & (by_arm.arm == arm)].iloc[0]
    if np.isfinite(summary.critical_lr):
      low, high = summary.critical_lr_low, summary.critical_lr_high
      if np.isfinite(low):
        ax.plot([low, high], [y, y], color="C0", lw=3, alpha=0.6)
      ax.plot(summary.critical_lr, y, "D", color="C0")
  ax.set_yticks(range(len(keys)))
  ax.set_yticklabels([f"{by_arm[(by_arm.group == g) & (by_arm.arm == a)].label.iloc[0]}"
                      + (f" ({g})" if g else "") for g, a in keys], fontsize=8)
  ax.set_xscale("log")
  plain = FuncFormatter(lambda value, _: f"{value:g}")  # 0.3, not 3 x 10^-1
  ax.xaxis.set_major_formatter(plain)
  ax.xaxis.set_minor_formatter(plain)
  ax.tick_params(axis="x", which="minor", labelsize=7)
  ax.set_xlabel("critical learning rate: each seed's final bracket (grey) and the arms' 50%\n"
                "point of the transition fitted to every probe, with its 95% interval (blue)")
  ax.grid(alpha=0.3, axis="x", which="both")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def observations(by_arm: pd.DataFrame, compared: pd.DataFrame, by_horizon: pd.DataFrame,
                 horizon_tests: pd.DataFrame) -> str:
  lines = [f"The critical learning rate is where the transition fitted to every probe of an arm "
           f"crosses 50% failing (a logistic in log10 lr, normstudy.analysis.transition), with "
           f"its 95% profile-likelihood interval; the transition's width runs from 10% to 90% "
           f"failing. A run fails by the failure rule (normstudy.records.outcomes). Pairs of "
           f"arms: the {LRT} over every probe of both arms (primary) and the exact paired "
           f"permutation test on the seeds' log10 bracket midpoints beside it, each with Holm's "
           f"correction over the pairs; a difference only where the primary test's Holm p < "
           f"{stats.ALPHA}. (No t-test: the midpoints sit on the search's lattice, so seeds that "
           "coincide give a variance of 0.)"]
  for _, row in by_arm.iterrows():
    where = f" ({row.group})" if row.group else ""
    if not np.isfinite(row.critical_lr):
      lines.append(f"- {row.label}{where}: its {row.failed} failures of {row.probes} probes "
                   "place no transition inside the learning rates tried.")
      continue
    cell = (" in one cell: its probes are completely separated, so the rate lies between the "
            "highest survival and the lowest failure and nowhere more precisely" if row.one_cell
            else "")
    lines.append(f"- {row.label}{where}: critical learning rate {row.critical_lr:.3g}{cell} (95% "
                 f"interval {row.critical_lr_low:.3g}-{row.critical_lr_high:.3g}; {row.failed} "
                 f"of {row.probes} probes failed), transition {row.transition_decades:.2f} "
                 f"decades wide ({row.transition_low:.2f}-{row.transition_high:.2f}); "
                 f"{row.seeds} seeds' brackets, at most {row.bracket_decades:.2f} decades wide, "
                 f"spread {row.spread_decades:.2f} decades"
                 + (f"; {row.beyond} seed(s) beyond the brackets" if row.beyond else "") + ".")
  probes = dict(zip(zip(by_arm.group, by_arm.arm), by_arm.probes))
  for _, row in compared.iterrows():
    n = (f"{probes.get((row.group, row.arm_a), 'the')} and "
         f"{probes.get((row.group, row.arm_b), 'the')} probes of {row.n_a} and {row.n_b} seeds")
    text = stats.verdict_holm(LRT, n, row.p_lrt, row.p_lrt_holm)
    exact = (f"; exact paired permutation test on the seeds' midpoints p = "
             f"{stats.format_p(row.p_exact)}, Holm-adjusted {stats.format_p(row.p_exact_holm)}"
             if np.isfinite(row.p_exact) else "")
    margin = ""
    if np.isfinite(row.equivalence_factor):
      margin = (f"; equivalent within a factor {row.equivalence_factor:.3g} at 95% (two "
                "one-sided likelihood-ratio tests: a larger ratio either way is ruled out)")
    elif row.equivalence_factor == math.inf:
      margin = "; no equivalence bound (the log ratio's profile stays high to the grid's edge)"
    lines.append(f"- {row.arm_a} against {row.arm_b}"
                 + (f" ({row.group})" if row.group else "")
                 + f": fitted ratio {row.fitted_ratio:.3g} (seeds' midpoints {row.ratio:.3g}), "
                 f"{text}{exact}{margin}.")
  lines += _horizon_lines(by_horizon, horizon_tests)
  return "\n".join(lines)


def _horizon_lines(by_horizon: pd.DataFrame, horizon_tests: pd.DataFrame) -> list:
  if by_horizon.empty or by_horizon.horizon.nunique() < 2:
    return []
  lines = ["", "The same runs judged at shorter horizons (critical_lr_horizons.csv): the critical "
           "learning rate at " + ", ".join(f"{h}" for h in sorted(by_horizon.horizon.unique()))
           + " steps:"]
  for (group, arm), rows in by_horizon.groupby(["group", "arm"], sort=False):
    values = ", ".join(f"{r.critical_lr:.3g}" if np.isfinite(r.critical_lr) else "beyond"
                       for r in rows.sort_values("horizon").itertuples())
    lines.append(f"- {rows.label.iloc[0]}" + (f" ({group})" if group else "") + f": {values}.")
  if len(horizon_tests):
    flips = horizon_tests[horizon_tests.same_order == False]  # noqa: E712 (NaN is no flip)
    lines.append(f"Pairs whose order differs from the longest horizon's: {len(flips)} of "
                 f"{len(horizon_tests)} (pair x horizon); separated at a horizon ({LRT}, "
                 f"Holm over its pairs): "
                 f"{int((horizon_tests.p_lrt_holm < stats.ALPHA).sum())}.")
  return lines


def analyze(loaded: runs_lib.Runs, runs: pd.DataFrame, workdir: str):
  """Writes the files of the module docstring into `workdir` from the search's record and its
  runs (sensitivity.table's); returns (outputs, text)."""
  points = points_table(loaded)
  by_arm = table(points, runs)
  compared = tests(points, runs)
  by_horizon, horizon_tests = horizons(loaded, runs)
  outputs = {"critical_lr": os.path.join(workdir, schema.CRITICAL_LR),
             "critical_lr_points": os.path.join(workdir, "critical_lr_points.csv"),
             "critical_lr_tests": os.path.join(workdir, "critical_lr_tests.csv"),
             "critical_lr_horizons": os.path.join(workdir, "critical_lr_horizons.csv"),
             "critical_lr_horizon_tests": os.path.join(workdir,
                                                       "critical_lr_horizon_tests.csv")}
  by_arm.to_csv(outputs["critical_lr"], index=False)
  points.to_csv(outputs["critical_lr_points"], index=False)
  compared.to_csv(outputs["critical_lr_tests"], index=False)
  by_horizon.to_csv(outputs["critical_lr_horizons"], index=False)
  horizon_tests.to_csv(outputs["critical_lr_horizon_tests"], index=False)
  outputs["critical_lr_figure"] = plot(points, by_arm, os.path.join(workdir, "critical_lr.png"))
  return outputs, observations(by_arm, compared, by_horizon, horizon_tests)


def probes_table(workdir: str) -> pd.DataFrame:
  """Every probe of a search as its tables hold it: runs.csv (arm, group, learning_rate, status,
  outcome), or, where an older analysis wrote none, sweep.json's runs (each run's arm, point and
  status; its failure rule's outcome where recorded). NoRunsError without either."""
  path = os.path.join(workdir, schema.RUN_TABLE)
  if os.path.exists(path):
    return read_table(path)
  record = rundir.read_json(os.path.join(workdir, schema.SWEPT))
  if not record.get("runs"):
    raise runs_lib.NoRunsError(f"{workdir!r} holds neither runs.csv nor a sweep.json with runs")
  rows = []
  # A run a search trained in two rounds is listed in each: one directory, one probe.
  for run in {run["name"]: run for run in record["runs"]}.values():
    point = dict(run["point"])
    lr = point.pop("optimizer.learning_rate")
    point.pop(SEED_FIELD, None)
    outcome = run.get("outcome")
    status = run["status"]
    if outcome is not None:  # the failure rule's verdict, where the sweep recorded it
      status = (schema.HALTED if outcome.startswith("halted") else schema.DIVERGED
                if outcome.startswith("diverged") else status)
    rows.append({"run": run["name"], "arm": run["arm"],
                 "group": ", ".join(f"{k}={v}" for k, v in point.items()),
                 "learning_rate": float(lr), "status": status,
                 "outcome": outcome or status})
  return pd.DataFrame(rows)


def read_table(path: str) -> pd.DataFrame:
  """A committed table, its `group` column text ("" where a search has no other axes)."""
  table = pd.read_csv(path, dtype={"group": str})
  if "group" in table:
    table["group"] = table["group"].fillna("")
  return table


def from_tables(workdir: str) -> dict:
  """critical_lr.csv and critical_lr_tests.csv written again from what an analysed search
  directory holds as tables (critical_lr_points.csv: each seed's bracket; every probe's
  learning rate and status: probes_table), without its runs' records: how a committed search is
  re-analysed after its records are gone (`normstudy.analyze --from_tables`). Returns the
  paths; NoRunsError when either table is missing."""
  points_path = os.path.join(workdir, "critical_lr_points.csv")
  if not os.path.exists(points_path):
    raise runs_lib.NoRunsError(f"{workdir!r} holds no critical_lr_points.csv: --from_tables "
                               "needs an analysed search's tables")
  points = read_table(points_path)
  runs = probes_table(workdir)
  outputs = {"critical_lr": os.path.join(workdir, schema.CRITICAL_LR),
             "critical_lr_tests": os.path.join(workdir, "critical_lr_tests.csv")}
  by_arm, compared = table(points, runs), tests(points, runs)
  by_arm.to_csv(outputs["critical_lr"], index=False)
  compared.to_csv(outputs["critical_lr_tests"], index=False)
  observations_path = os.path.join(workdir, "observations.md")
  horizon_paths = [os.path.join(workdir, f"critical_lr_horizon{s}.csv") for s in ("s", "_tests")]
  if os.path.exists(observations_path):
    by_horizon, horizon_tests = (read_table(path) if os.path.exists(path) else pd.DataFrame()
                                 for path in horizon_paths)
    text = observations(by_arm, compared, by_horizon, horizon_tests)
    if _replace_section(observations_path, text):
      outputs["observations"] = observations_path
  return outputs


SECTION = "## Critical learning rate (search)\n\n"


def _replace_section(path: str, text: str) -> bool:
  """Replaces the critical learning rate's paragraphs of an observations.md (from its heading to
  the outcomes' paragraph or the next section) with `text`; False when it has no such section."""
  with open(path, encoding="utf-8") as f:
    held = f.read()
  start = held.find(SECTION)
  if start < 0:
    return False
  body = start + len(SECTION)
  ends = [i for i in (held.find("\n\nHow the runs ended", body), held.find("\n\n## ", body))
          if i >= 0]
  end = min(ends) if ends else len(held)
  with open(path, "w", encoding="utf-8") as f:
    f.write(held[:body] + text + held[end:])
  return True
