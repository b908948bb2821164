"""Does an arm's advantage depend on the precision? The interaction of two searches of the same
arms and seeds in two dtypes (`make survival` in float16 against `make survival-bf16` or
`make survival-fp32`): for every pair of arms A and B and every seed s, with c the seed's
critical learning rate (its final bracket's geometric midpoint),

    interaction_s = log10(c_A,s / c_B,s) in the first search - log10(c_A,s / c_B,s) in the other

and its mean over the seeds both searches established, tested against 0 paired by seed (the
t-test and the exact paired permutation test; Holm over the pairs). A margin that is fp16
headroom shows as an interaction; a difference of verdicts ("separated in fp16, not in bfloat16")
is not this test.

  interaction.csv   group, arm_a, arm_b, ratio (A/B in the first search), other_ratio (in the
                    other), interaction (the ratio of the two ratios, geometric mean over
                    seeds), seeds, t, df, p, p_holm, p_exact, p_exact_holm
"""

import itertools
import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import critical_lr
from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats


def _log_midpoints(points: pd.DataFrame) -> dict:
  """{(group, arm): {seed: log10 critical lr}} of a search's established points."""
  found = points[points.established]
  out = {}
  for row in found.itertuples():
    out.setdefault((row.group, row.arm), {})[row.seed] = math.log10(row.critical_lr)
  return out


def table(first: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
  """interaction.csv from two searches' points (critical_lr.points_table)."""
  a_logs, b_logs = _log_midpoints(first), _log_midpoints(other)
  keys = [key for key in a_logs if key in b_logs]
  rows = []
  for (group, arm_a), (group_b, arm_b) in itertools.combinations(keys, 2):
    if group != group_b:
      continue
    seeds = sorted(set(a_logs[(group, arm_a)]) & set(a_logs[(group, arm_b)])
                   & set(b_logs[(group, arm_a)]) & set(b_logs[(group, arm_b)]))
    d_first = np.array([a_logs[(group, arm_a)][s] - a_logs[(group, arm_b)][s] for s in seeds])
    d_other = np.array([b_logs[(group, arm_a)][s] - b_logs[(group, arm_b)][s] for s in seeds])
    t, df, p = stats.paired_t(d_first, d_other)
    mean = lambda d: 10 ** d.mean() if len(d) else math.nan  # noqa: E731
    rows.append({"group": group, "arm_a": arm_a, "arm_b": arm_b, "ratio": mean(d_first),
                 "other_ratio": mean(d_other),
                 "interaction": mean(d_first - d_other), "seeds": len(seeds), "t": t, "df": df,
                 "p": p, "p_exact": stats.paired_permutation(d_first, d_other)})
  out = pd.DataFrame(rows, columns=["group", "arm_a", "arm_b", "ratio", "other_ratio",
                                    "interaction", "seeds", "t", "df", "p", "p_exact"])
  out["p_holm"] = stats.holm(out.p.tolist()) if len(out) else []
  out["p_exact_holm"] = stats.holm(out.p_exact.tolist()) if len(out) else []
  return out


def observations(table_: pd.DataFrame, first: str, other: str) -> str:
  lines = [f"The interaction of the two searches ({first} against {other}): for each pair, the "
           "ratio of critical learning rates in each, and their ratio paired by seed (paired "
           f"t-test and exact permutation test, Holm over {len(table_)} pairs):"]
  for row in table_.itertuples():
    verdict = stats.verdict_holm("paired t on the seeds' interactions", f"{row.seeds} seeds",
                                 row.p, row.p_holm)
    lines.append(f"- {row.arm_a} against {row.arm_b}: {row.ratio:.3g} in {first}, "
                 f"{row.other_ratio:.3g} in {other}, interaction {row.interaction:.3g}, "
                 f"{verdict}; exact p = {stats.format_p(row.p_exact)}, Holm-adjusted "
                 f"{stats.format_p(row.p_exact_holm)}.")
  return "\n".join(lines)


def analyze(first_dir: str, other_dir: str) -> dict:
  """Writes interaction.csv and interaction.md into `other_dir`: the first search's
  (`first_dir`) pairs of arms against the other's; returns the paths."""
  first = critical_lr.points_table(runs_lib.load_runs(first_dir))
  other = critical_lr.points_table(runs_lib.load_runs(other_dir))
  table_ = table(first, other)
  outputs = {"interaction": os.path.join(other_dir, "interaction.csv"),
             "interaction_observations": os.path.join(other_dir, "interaction.md")}
  table_.to_csv(outputs["interaction"], index=False)
  with open(outputs["interaction_observations"], "w", encoding="utf-8") as f:
    f.write("# Interaction\n\n" + observations(table_, os.path.basename(first_dir.rstrip("/")),
                                               os.path.basename(other_dir.rstrip("/"))) + "\n")
  return outputs
