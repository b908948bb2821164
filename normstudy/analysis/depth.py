"""Depth: which arms converge as the model gets deeper, and how large their early updates are
(DeepNet's claim, Wang et al. 2022: Post-LN's model update grows with depth early in training and
it then diverges; DeepNorm's alpha/beta bound the update). For a sweep over `model.num_layers`
and seeds at one learning rate (`make depth`, configs/depth.py):

  depth.csv        per arm and depth: runs, converged (finished with its final eval loss below
                   the threshold: the unigram entropy, the loss of a model that uses no context;
                   a run above it has learned nothing but token frequencies), the share,
                   the final eval loss (mean over the runs that ended finite), and the early
                   update size: per run the mean of `update_size` over its recorded steps at a
                   learning rate above 0 (normstudy.core.steps.update_size), over seeds the
                   geometric mean with its 95% t interval (on log10)
  depth_tests.csv  per pair of arms: at each depth Fisher's exact test of the converged counts
                   and Welch's t-test of log10 early update size; over all depths the stratified
                   exact test (depth the stratum); Holm's correction over each kind of test
  depth.png        the converged share and the early update size against depth, per arm
"""

import itertools
import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.records import schema

DEPTH = "model.num_layers"
LR = "optimizer.learning_rate"
FISHER = "Fisher's exact test"
STRATIFIED = "stratified exact test over depths"
WELCH = "Welch's t-test of log10 update size"


def is_depth_sweep(loaded: runs_lib.Runs) -> bool:
  """Whether the runs sweep the depth (two or more values of model.num_layers) at one learning
  rate."""
  points = [facts.info.point for facts in loaded.runs.values()]
  return (len({p.get(DEPTH) for p in points} - {None}) > 1
          and len({p.get(LR) for p in points} - {None}) <= 1)


def early_update_size(loaded: runs_lib.Runs, run: str) -> float:
  """The mean recorded update size over the steps that trained at a learning rate above 0 (the
  warm-up's first step moves nothing), finite values only; NaN if none was recorded."""
  sizes = loaded.series(run, "update_size")
  lrs = loaded.series(run, "lr").reindex(sizes.index)
  values = sizes[(lrs > 0).to_numpy() & np.isfinite(sizes.to_numpy())]
  return float(values.mean()) if len(values) else math.nan


def run_table(loaded: runs_lib.Runs, summary: pd.DataFrame) -> pd.DataFrame:
  """One row per run: run, arm, arm_label, depth, seed, status, final eval loss, converged, the
  early update size, and the run's reference losses."""
  status = dict(zip(summary.run, summary.status))
  rows = []
  for run, facts in loaded.runs.items():
    point = facts.info.point
    eval_loss = loaded.series(run, "eval_loss")
    rows.append({"run": run, "arm": facts.info.arm or run,
                 "arm_label": facts.arm_label, "depth": point.get(DEPTH),
                 "seed": point.get("train.seed"), "status": status.get(run),
                 "final_eval_loss": float(eval_loss.iloc[-1]) if len(eval_loss) else np.nan,
                 "update_size": early_update_size(loaded, run),
                 "unigram_entropy": facts.info.unigram_entropy,
                 "floor": facts.floor})
  runs = pd.DataFrame(rows)
  unigram = runs.unigram_entropy.dropna()
  runs["threshold"] = threshold = float(unigram.iloc[0]) if len(unigram) else np.nan
  runs["converged"] = ((runs.status == schema.FINISHED)
                       & (runs.final_eval_loss < threshold)).astype(bool)
  return runs


def table(runs: pd.DataFrame) -> pd.DataFrame:
  """depth.csv: per arm (in the runs' order) and depth (ascending)."""
  out = []
  for arm in dict.fromkeys(runs.arm):
    for depth in sorted(runs[runs.arm == arm].depth.unique()):
      rows = runs[(runs.arm == arm) & (runs.depth == depth)]
      finite = rows.final_eval_loss[np.isfinite(rows.final_eval_loss)]
      mean, low, high = stats.mean_interval(np.log10(rows.update_size[rows.update_size > 0]))
      out.append({"arm": arm, "label": rows.arm_label.iloc[0], "depth": int(depth),
                  "runs": len(rows), "converged": int(rows.converged.sum()),
                  "share": float(rows.converged.mean()),
                  "final_eval_loss": float(finite.mean()) if len(finite) else np.nan,
                  "update_size": 10 ** mean, "update_size_low": 10 ** low,
                  "update_size_high": 10 ** high, "threshold": rows.threshold.iloc[0]})
  return pd.DataFrame(out)


def tests(runs: pd.DataFrame) -> pd.DataFrame:
  """depth_tests.csv: the module docstring's tests of every pair of arms."""
  arms = list(dict.fromkeys(runs.arm))
  depths = sorted(runs.depth.unique())
  out = []
  for a, b in itertools.combinations(arms, 2):
    strata = []
    for depth in depths:
      ra = runs[(runs.arm == a) & (runs.depth == depth)]
      rb = runs[(runs.arm == b) & (runs.depth == depth)]
      if ra.empty or rb.empty:
        continue
      counts = (int(ra.converged.sum()), len(ra), int(rb.converged.sum()), len(rb))
      strata.append(counts)
      out.append({"arm_a": a, "arm_b": b, "depth": str(depth), "test": FISHER,
                  "n": f"{len(ra)} and {len(rb)}",
                  "difference": counts[0] / counts[1] - counts[2] / counts[3],
                  "p": stats.fisher_exact(*counts)})
      la = np.log10(ra.update_size[ra.update_size > 0])
      lb = np.log10(rb.update_size[rb.update_size > 0])
      _, _, p = stats.welch(la, lb)
      out.append({"arm_a": a, "arm_b": b, "depth": str(depth), "test": WELCH,
                  "n": f"{len(la)} and {len(lb)}",
                  "difference": float(la.mean() - lb.mean()) if len(la) and len(lb) else np.nan,
                  "p": p})
    out.append({"arm_a": a, "arm_b": b, "depth": "all", "test": STRATIFIED,
                "n": f"{sum(s[1] for s in strata)} and {sum(s[3] for s in strata)}",
                "difference": (sum(s[0] for s in strata) / max(sum(s[1] for s in strata), 1)
                               - sum(s[2] for s in strata) / max(sum(s[3] for s in strata), 1)),
                "p": stats.stratified_exact(strata)})
  tested = pd.DataFrame(out, columns=["arm_a", "arm_b", "depth", "test", "n", "difference", "p"])
  tested["p_holm"] = np.nan
  for test in tested.test.unique():
    family = tested.test == test
    tested.loc[family, "p_holm"] = stats.holm(tested.p[family])
  tested["verdict"] = [stats.verdict_holm(r.test, r.n, r.p, r.p_holm)
                       for r in tested.itertuples()]
  return tested


def observations(by_depth: pd.DataFrame, tested: pd.DataFrame) -> str:
  threshold = by_depth.threshold.iloc[0]
  parts = [f"Depth: a run converged if it finished with its final eval loss below "
           f"{threshold:.3f} nats (the unigram entropy: a model that uses no context). The "
           "early update size is each run's mean ||f(x; theta_t+1) - f(x; theta_t)|| over its "
           "recorded steps (the output logits on the first eval batch), the geometric mean over "
           "seeds with its 95% interval. Tests are two-sided with Holm's correction over each "
           f"kind of test (a difference only at Holm-adjusted p < {stats.ALPHA})."]
  for arm, rows in by_depth.groupby("arm", sort=False):
    cells = "; ".join(
        f"{r.depth} layers {r.converged}/{r.runs} converged, update {r.update_size:.3g} "
        f"({r.update_size_low:.3g} to {r.update_size_high:.3g})" for r in rows.itertuples())
    parts.append(f"{rows.label.iloc[0]}: {cells}.")
  lines = [f"- {r.arm_a} against {r.arm_b}, {r.depth} layers" if r.depth != "all" else
           f"- {r.arm_a} against {r.arm_b}, all depths" for r in tested.itertuples()]
  parts.append("\n".join(
      f"{line}, {r.test}: {r.difference:+.3g}, {r.verdict}." for line, r in
      zip(lines, tested.itertuples())))
  return "\n\n".join(parts)


def figure(by_depth: pd.DataFrame, runs: pd.DataFrame):
  from matplotlib.figure import Figure
  from normstudy.analysis.plots import style
  fig = Figure(figsize=(10, 4.2), layout="constrained")
  share_ax, update_ax = fig.subplots(1, 2)
  for i, (arm, rows) in enumerate(by_depth.groupby("arm", sort=False)):
    look = style(i)
    share_ax.plot(rows.depth, rows.share, marker="o", color=look["color"],
                  linestyle=look["linestyle"], label=rows.label.iloc[0])
    update_ax.plot(rows.depth, rows.update_size, marker="o", color=look["color"],
                   linestyle=look["linestyle"], label=rows.label.iloc[0])
    update_ax.fill_between(rows.depth, rows.update_size_low, rows.update_size_high,
                           color=look["color"], alpha=0.15)
    mine = runs[runs.arm == arm]
    update_ax.scatter(mine.depth, mine.update_size, color=look["color"], s=8)
  share_ax.set_ylim(-0.05, 1.05)
  share_ax.set_xlabel("layers")
  share_ax.set_ylabel("share of runs that converged")
  share_ax.set_title(f"Converged (final eval loss < {by_depth.threshold.iloc[0]:.3f})")
  update_ax.set_yscale("log")
  update_ax.set_xlabel("layers")
  update_ax.set_ylabel("early update size ||f(x; theta_t+1) - f(x; theta_t)||")
  update_ax.set_title("Early update size (geometric mean, 95% interval; dots: runs)")
  for ax in (share_ax, update_ax):
    ax.set_xticks(sorted(by_depth.depth.unique()))
    ax.grid(alpha=0.3)
  share_ax.legend(fontsize=7)
  return fig


def analyze(loaded: runs_lib.Runs, summary: pd.DataFrame, workdir: str) -> tuple[dict, str]:
  """Writes depth.csv, depth_tests.csv and depth.png (+ .svg); returns (paths, observations)."""
  from normstudy.analysis.plots import save
  runs = run_table(loaded, summary)
  by_depth = table(runs)
  tested = tests(runs)
  outputs = {"depth_table": os.path.join(workdir, "depth.csv"),
             "depth_tests": os.path.join(workdir, "depth_tests.csv"),
             "depth_figure": os.path.join(workdir, "depth.png")}
  by_depth.to_csv(outputs["depth_table"], index=False)
  tested.to_csv(outputs["depth_tests"], index=False)
  save(figure(by_depth, runs), outputs["depth_figure"])
  return outputs, observations(by_depth, tested)
