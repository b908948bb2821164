"""Does an arm's advantage depend on the precision? The interaction of two searches of the same
arms and seeds in two dtypes (`make survival` in float16 against `make survival-bf16` or
`make survival-fp32`): for every pair of arms A and B, with c an arm's fitted 50% point
(normstudy.analysis.transition: every probe of the arm),

    interaction = log10(c_A / c_B) in the first search - log10(c_A / c_B) in the other

tested by the likelihood ratio of one log ratio for both searches against one each (every
probe of the four arm-searches; transition.interaction_lrt), the primary test, and beside it
the exact paired permutation test on the seeds' bracket midpoints (per seed s, log10(c_A,s /
c_B,s) in each search); Holm over the pairs. A margin that is fp16 headroom shows as an
interaction; a difference of verdicts ("separated in fp16, not in bfloat16") is not this test.
No t-test: the midpoints sit on the searches' lattice, so coinciding seeds give a variance of 0.

  interaction.csv   group, arm_a, arm_b, ratio (A/B fitted in the first search), other_ratio (in
                    the other), interaction (the fitted ratio of the two ratios), seeds, p_lrt,
                    p_exact, p_lrt_holm, p_exact_holm
"""

import itertools
import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import critical_lr
from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.analysis import transition


def _log_midpoints(points: pd.DataFrame) -> dict:
  """{(group, arm): {seed: log10 critical lr}} of a search's established points."""
  found = points[points.established]
  out = {}
  for row in found.itertuples():
    out.setdefault((row.group, row.arm), {})[row.seed] = math.log10(row.critical_lr)
  return out


def _probes(runs: pd.DataFrame, group, arm) -> tuple:
  return critical_lr._probes(runs[(runs.arm == arm) & (runs.group == group)])


def table(first: pd.DataFrame, other: pd.DataFrame, first_runs: pd.DataFrame,
          other_runs: pd.DataFrame) -> pd.DataFrame:
  """interaction.csv from two searches' points (critical_lr.points_table) and runs (their
  probes: sensitivity.table's, or runs.csv)."""
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
    pairs = [(_probes(runs, group, arm_a), _probes(runs, group, arm_b))
             for runs in (first_runs, other_runs)]
    fits = [[transition.fit(*arm) for arm in pair] for pair in pairs]
    ratios = [10 ** (fa.center - fb.center) if fa is not None and fb is not None else math.nan
              for fa, fb in fits]
    interaction, _, p = transition.interaction_lrt(*pairs)
    rows.append({"group": group, "arm_a": arm_a, "arm_b": arm_b, "ratio": ratios[0],
                 "other_ratio": ratios[1], "interaction": interaction, "seeds": len(seeds),
                 "p_lrt": p, "p_exact": stats.paired_permutation(d_first, d_other)})
  out = pd.DataFrame(rows, columns=["group", "arm_a", "arm_b", "ratio", "other_ratio",
                                    "interaction", "seeds", "p_lrt", "p_exact"])
  out["p_lrt_holm"] = stats.holm(out.p_lrt.tolist()) if len(out) else []
  out["p_exact_holm"] = stats.holm(out.p_exact.tolist()) if len(out) else []
  return out


def observations(table_: pd.DataFrame, first: str, other: str) -> str:
  lines = [f"The interaction of the two searches ({first} against {other}): for each pair, the "
           "fitted ratio of critical learning rates in each and their ratio (the likelihood-ratio "
           "test of one log ratio for both, primary; the exact paired permutation test on the "
           f"seeds' midpoints beside it; Holm over {len(table_)} pairs):"]
  for row in table_.itertuples():
    verdict = stats.verdict_holm("likelihood-ratio test of one ratio", f"{row.seeds} seeds' "
                                 "probes in each", row.p_lrt, row.p_lrt_holm)
    lines.append(f"- {row.arm_a} against {row.arm_b}: {row.ratio:.3g} in {first}, "
                 f"{row.other_ratio:.3g} in {other}, interaction {row.interaction:.3g}, "
                 f"{verdict}; exact p = {stats.format_p(row.p_exact)}, Holm-adjusted "
                 f"{stats.format_p(row.p_exact_holm)}.")
  return "\n".join(lines)


def _search_runs(loaded) -> pd.DataFrame:
  from normstudy.analysis import report
  from normstudy.analysis import sensitivity
  return sensitivity.table(loaded, report.summarize(loaded))


def analyze(first_dir: str, other_dir: str) -> dict:
  """Writes interaction.csv and interaction.md into `other_dir`: the first search's
  (`first_dir`) pairs of arms against the other's; returns the paths."""
  first_loaded, other_loaded = runs_lib.load_runs(first_dir), runs_lib.load_runs(other_dir)
  return write(critical_lr.points_table(first_loaded), critical_lr.points_table(other_loaded),
               _search_runs(first_loaded), _search_runs(other_loaded), first_dir, other_dir)


def write(first, other, first_runs, other_runs, first_dir: str, other_dir: str) -> dict:
  """interaction.csv and interaction.md into `other_dir` from the two searches' points and
  runs."""
  table_ = table(first, other, first_runs, other_runs)
  outputs = {"interaction": os.path.join(other_dir, "interaction.csv"),
             "interaction_observations": os.path.join(other_dir, "interaction.md")}
  table_.to_csv(outputs["interaction"], index=False)
  with open(outputs["interaction_observations"], "w", encoding="utf-8") as f:
    f.write("# Interaction\n\n" + observations(table_, os.path.basename(first_dir.rstrip("/")),
                                               os.path.basename(other_dir.rstrip("/"))) + "\n")
  return outputs


def from_tables(first_dir: str, other_dir: str) -> dict:
  """interaction.csv and .md written again from the two searches' tables
  (critical_lr_points.csv and runs.csv each: critical_lr.from_tables's inputs)."""
  def tables(directory):
    return (critical_lr.read_table(os.path.join(directory, "critical_lr_points.csv")),
            critical_lr.probes_table(directory))
  (first, first_runs), (other, other_runs) = tables(first_dir), tables(other_dir)
  return write(first, other, first_runs, other_runs, first_dir, other_dir)
