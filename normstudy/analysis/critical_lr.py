"""The critical learning rate found by search (normstudy.core.search): per point its final bracket,
per arm (and value of the other axes, the `group`) the geometric mean over seeds, and pairwise
comparisons of arms.

  critical_lr.csv        arm, label, group, seeds (points whose bracket was established),
                         beyond (points whose critical value lies outside every bracket tried),
                         rounds, critical_lr (geometric mean of the seeds' bracket midpoints),
                         critical_lr_low, critical_lr_high (95% t interval on log10 midpoints),
                         spread_decades (the seeds' sample standard deviation of log10
                         midpoints), bracket_decades (the widest final bracket, in decades)
  critical_lr_points.csv per point: arm, group, seed, low, high, established, critical_lr
  critical_lr_tests.csv  every pair of arms in a group: the paired t-test on log10 critical
                         learning rates when both arms have the same seeds (else Welch's),
                         the ratio of geometric means, p, Holm-adjusted p over the whole
                         family, and for each pair not separated the factor within which the
                         two are equivalent at 95% (two one-sided tests on the midpoints,
                         stats.equivalence_factor, widened by both arms' mean bracket
                         half-width: a midpoint is known only to within its bracket)
  critical_lr.png        each seed's bracket and the arms' geometric means with their intervals

A point's estimate is its bracket's geometric midpoint, a known resolution (bracket_decades)
rather than a fitted value: the t interval treats the midpoints as the seeds' critical values.
"""

import itertools
import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.records import schema

SEED_FIELD = "train.seed"


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


def table(points: pd.DataFrame) -> pd.DataFrame:
  rows = []
  for (group, arm), at in points.groupby(["group", "arm"], sort=False):
    found = at[at.established]
    logs = np.log10(found.critical_lr.to_numpy())
    mean, low, high = stats.mean_interval(logs)
    rows.append({
        "arm": arm, "label": at.label.iloc[0], "group": group, "seeds": len(found),
        "beyond": int((~at.established).sum()), "rounds": int(at.rounds.max()),
        "critical_lr": 10 ** mean if len(logs) else math.nan,
        "critical_lr_low": 10 ** low, "critical_lr_high": 10 ** high,
        "spread_decades": float(logs.std(ddof=1)) if len(logs) > 1 else math.nan,
        "bracket_decades": float(np.log10(found.high / found.low).max()) if len(found)
        else math.nan})
  return pd.DataFrame(rows)


def compare(a: pd.DataFrame, b: pd.DataFrame) -> dict:
  """The test of two arms' log10 critical learning rates (their established points): paired
  by seed when both have the same seeds, else Welch's."""
  a = a[a.established].sort_values("seed")
  b = b[b.established].sort_values("seed")
  la, lb = np.log10(a.critical_lr.to_numpy()), np.log10(b.critical_lr.to_numpy())
  paired = len(a) > 1 and list(a.seed) == list(b.seed)
  tested = stats.mean_difference(la, lb, paired)
  diff = tested["difference"]
  return {"test": "paired t on log10 critical lr" if paired else "Welch t on log10 critical lr",
          "n_a": len(la), "n_b": len(lb), "ratio": 10 ** diff if np.isfinite(diff) else math.nan,
          "t": tested["t"], "df": tested["df"], "p": tested["p"],
          "equivalence_factor": stats.equivalence_factor(diff, tested["se"], tested["df"])
          * 10 ** (_half_width(a) + _half_width(b))}


def _half_width(points: pd.DataFrame) -> float:
  """The mean half-width of the points' brackets in decades: how far a seed's true critical
  value may lie from the midpoint the tests use, so an equivalence margin on midpoints widens by
  the two arms' half-widths (with equal seeds' brackets of 1/16 decade, a factor 1.155)."""
  return float(np.log10(points.high / points.low).mean() / 2) if len(points) else math.nan


def tests(points: pd.DataFrame) -> pd.DataFrame:
  rows = []
  for group, at in points.groupby("group", sort=False):
    arms = list(dict.fromkeys(at.arm))
    for arm_a, arm_b in itertools.combinations(arms, 2):
      rows.append({"group": group, "arm_a": arm_a, "arm_b": arm_b,
                   **compare(at[at.arm == arm_a], at[at.arm == arm_b])})
  out = pd.DataFrame(rows, columns=["group", "arm_a", "arm_b", "test", "n_a", "n_b", "ratio",
                                    "t", "df", "p", "equivalence_factor"])
  out["p_holm"] = stats.holm(out.p.tolist()) if len(out) else []
  out["separated"] = out.p_holm < stats.ALPHA
  # A margin is what "not separated" bounds; for a separated pair it means nothing.
  out.loc[out.separated, "equivalence_factor"] = math.nan
  return out


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
  ax.set_xlabel("critical learning rate: each seed's final bracket (grey) and the arms'\n"
                "geometric mean with its 95% t interval (blue)")
  ax.grid(alpha=0.3, axis="x", which="both")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def observations(by_arm: pd.DataFrame, compared: pd.DataFrame) -> str:
  lines = []
  for _, row in by_arm.iterrows():
    where = f" ({row.group})" if row.group else ""
    if row.seeds == 0:
      lines.append(f"- {row.label}{where}: no seed's critical learning rate lies in the "
                   f"brackets tried ({row.beyond} beyond).")
      continue
    interval = (f", 95% t interval {row.critical_lr_low:.3g}-{row.critical_lr_high:.3g}"
                if np.isfinite(row.critical_lr_low) else "")
    lines.append(f"- {row.label}{where}: critical learning rate {row.critical_lr:.3g} "
                 f"(geometric mean of {row.seeds} seeds{interval}; seed-to-seed spread "
                 f"{row.spread_decades:.2f} decades; brackets at most "
                 f"{row.bracket_decades:.2f} decades wide)"
                 + (f"; {row.beyond} seed(s) beyond the brackets" if row.beyond else "") + ".")
  for _, row in compared.iterrows():
    n = (f"{row.n_a} seeds, paired" if row.test.startswith("paired")
         else f"{row.n_a} and {row.n_b}")
    text = stats.verdict_holm(row.test, n, row.p, row.p_holm)
    margin = (f"; equivalent within a factor {row.equivalence_factor:.3g} at 95% (two one-sided "
              "tests)" if np.isfinite(row.equivalence_factor) else "")
    lines.append(f"- {row.arm_a} against {row.arm_b}"
                 + (f" ({row.group})" if row.group else "")
                 + f": ratio {row.ratio:.3g}, {text}{margin}.")
  return "\n".join(lines)


def analyze(loaded: runs_lib.Runs, workdir: str):
  """Writes the files of the module docstring into `workdir`; returns (outputs, text)."""
  points = points_table(loaded)
  by_arm = table(points)
  compared = tests(points)
  outputs = {"critical_lr": os.path.join(workdir, "critical_lr.csv"),
             "critical_lr_points": os.path.join(workdir, "critical_lr_points.csv"),
             "critical_lr_tests": os.path.join(workdir, "critical_lr_tests.csv")}
  by_arm.to_csv(outputs["critical_lr"], index=False)
  points.to_csv(outputs["critical_lr_points"], index=False)
  compared.to_csv(outputs["critical_lr_tests"], index=False)
  outputs["critical_lr_figure"] = plot(points, by_arm, os.path.join(workdir, "critical_lr.png"))
  return outputs, observations(by_arm, compared)
