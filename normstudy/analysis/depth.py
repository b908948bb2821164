"""Depth: which arms converge as the model gets deeper, and how large their early updates are
(DeepNet's claim, Wang et al. 2022: Post-LN's model update grows with depth early in training and
it then diverges; DeepNorm's alpha/beta bound the update). For a sweep over `model.num_layers`
and seeds at one learning rate (`make depth`, configs/depth.py):

  depth.csv        per arm and depth: runs, converged (finished with its final eval loss below
                   the threshold: the unigram entropy, the loss of a model that uses no context;
                   a run above it has learned nothing but token frequencies), the share,
                   the final eval loss (mean over the runs that ended finite), progress (how far
                   the final eval loss got from the unigram entropy towards the floor, 0 to 1,
                   mean over finite runs: "converged" can mean a few percent of the way), the
                   early update size: per run the mean of `update_size` over its recorded steps
                   at a learning rate above 0 (normstudy.core.steps.update_size), and the first
                   update size: `update_size` at the first step whose learning rate is above 0
                   (DeepNet's measure at the very beginning of training, where Wang et al.'s
                   Figure 3 puts Post-LN's growth with depth), and the accumulated update:
                   `accumulated_update`, ||f(x; theta_t) - f(x; theta_0)||, at the run's last
                   recorded step; over seeds each is the geometric mean with its 95% t
                   interval (on log10)
  depth_tests.csv  per pair of arms: at each depth Fisher's exact test of the converged counts
                   and Welch's t-tests of log10 early and of log10 first update size; over all
                   depths the stratified exact test (depth the stratum); per arm its deepest
                   against its shallowest depth, paired by seed, the paired t-tests of log10
                   first update size and of log10 accumulated update, each with the exact paired permutation test beside it
                   (`p_exact`; with n seeds it cannot go below 2 / 2^n); Holm's correction over
                   each kind of test
  depth_updates.csv per arm, depth and recorded step: the update size's and the accumulated
                   update's (||f(x; theta_t) - f(x; theta_0)||) geometric means over seeds
                   with their 95% intervals, the series DeepNet's Figure 3 draws
  depth_norm_inputs.csv per arm, depth, telemetry step and layer: the RMS of what the layer's
                   attention and MLP norms are given (Post-LN's alpha x + F(x)), geometric
                   mean over seeds with its 95% interval
  depth.png        the converged share and the first update size against depth; the update
                   size, the accumulated update and the last layer's norm input against step;
                   every layer's norm input at the first telemetry step; per arm
"""

import itertools
import math
import os

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.records import keys
from normstudy.records import schema

DEPTH = "model.num_layers"
LR = "optimizer.learning_rate"
FISHER = "Fisher's exact test"
STRATIFIED = "stratified exact test over depths"
WELCH = "Welch's t-test of log10 update size"
WELCH_FIRST = "Welch's t-test of log10 first update size"
DEPTH_TREND = "paired t-test of log10 first update size, deepest against shallowest"
DEPTH_TREND_ACCUMULATED = ("paired t-test of log10 accumulated update at the last measured step, "
                           "deepest against shallowest")


def is_depth_sweep(loaded: runs_lib.Runs) -> bool:
  """Whether the runs sweep the depth (two or more values of model.num_layers) at one learning
  rate."""
  points = [facts.info.point for facts in loaded.runs.values()]
  return (len({p.get(DEPTH) for p in points} - {None}) > 1
          and len({p.get(LR) for p in points} - {None}) <= 1)


def _moving_sizes(loaded: runs_lib.Runs, run: str) -> pd.Series:
  """The run's finite recorded `update_size` values at steps whose learning rate is above 0
  (the warm-up's first step moves nothing), by step."""
  sizes = loaded.series(run, "update_size")
  lrs = loaded.series(run, "lr").reindex(sizes.index)
  return sizes[(lrs > 0).to_numpy() & np.isfinite(sizes.to_numpy())]


def early_update_size(loaded: runs_lib.Runs, run: str) -> float:
  """The mean recorded update size over the steps that trained at a learning rate above 0, finite
  values only; NaN if none was recorded."""
  values = _moving_sizes(loaded, run)
  return float(values.mean()) if len(values) else math.nan


def first_update_size(loaded: runs_lib.Runs, run: str) -> float:
  """`update_size` at the first recorded step whose learning rate is above 0 and whose size is
  finite (the first update that moves the model); NaN if none was recorded."""
  values = _moving_sizes(loaded, run)
  return float(values.iloc[0]) if len(values) else math.nan


def last_accumulated_update(loaded: runs_lib.Runs, run: str) -> float:
  """`accumulated_update` at the run's last recorded finite value (step train.update_size_steps
  for a run that lived so long): how far the model moved from its initialisation over the
  measured steps; NaN if none was recorded."""
  values = loaded.series(run, keys.ACCUMULATED_UPDATE)
  values = values[np.isfinite(values.to_numpy())]
  return float(values.iloc[-1]) if len(values) else math.nan


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
                 "first_update_size": first_update_size(loaded, run),
                 "accumulated_update": last_accumulated_update(loaded, run),
                 "unigram_entropy": facts.info.unigram_entropy,
                 "floor": facts.floor})
  runs = pd.DataFrame(rows)
  unigram = runs.unigram_entropy.dropna()
  runs["threshold"] = threshold = float(unigram.iloc[0]) if len(unigram) else np.nan
  runs["converged"] = ((runs.status == schema.FINISHED)
                       & (runs.final_eval_loss < threshold)).astype(bool)
  runs["progress"] = (threshold - runs.final_eval_loss) / (threshold - runs.floor)
  return runs


def _geometric(values) -> tuple[float, float, float]:
  """(geometric mean, 95% low, high) of the positive values (a t interval on log10)."""
  values = np.asarray(values, dtype=float)
  mean, low, high = stats.mean_interval(np.log10(values[values > 0]))
  return 10 ** mean, 10 ** low, 10 ** high


def table(runs: pd.DataFrame) -> pd.DataFrame:
  """depth.csv: per arm (in the runs' order) and depth (ascending)."""
  out = []
  for arm in dict.fromkeys(runs.arm):
    for depth in sorted(runs[runs.arm == arm].depth.unique()):
      rows = runs[(runs.arm == arm) & (runs.depth == depth)]
      finite = np.isfinite(rows.final_eval_loss)
      early = _geometric(rows.update_size)
      first = _geometric(rows.first_update_size)
      accumulated = _geometric_or_nan(rows.accumulated_update)
      out.append({"arm": arm, "label": rows.arm_label.iloc[0], "depth": int(depth),
                  "runs": len(rows), "converged": int(rows.converged.sum()),
                  "share": float(rows.converged.mean()),
                  "final_eval_loss": (float(rows.final_eval_loss[finite].mean())
                                      if finite.any() else np.nan),
                  "update_size": early[0], "update_size_low": early[1],
                  "update_size_high": early[2], "threshold": rows.threshold.iloc[0],
                  "progress": float(rows.progress[finite].mean()) if finite.any() else np.nan,
                  "first_update_size": first[0], "first_update_low": first[1],
                  "first_update_high": first[2], "accumulated_update": accumulated[0],
                  "accumulated_update_low": accumulated[1],
                  "accumulated_update_high": accumulated[2]})
  return pd.DataFrame(out)


UPDATE_MEASURES = (keys.UPDATE_SIZE, keys.ACCUMULATED_UPDATE)
NORM_INPUTS = ("attn_norm_input_rms", "mlp_norm_input_rms")


def _geometric_or_nan(values) -> tuple[float, float, float]:
  values = np.asarray(values, dtype=float)
  return _geometric(values) if (values > 0).any() else (np.nan, np.nan, np.nan)


def update_series(loaded: runs_lib.Runs, runs: pd.DataFrame) -> pd.DataFrame:
  """depth_updates.csv: per arm, depth and recorded step (learning rate above 0), the update
  size's and the accumulated update's geometric mean over the seeds with its 95% interval
  (NaN for runs recorded before accumulated_update existed)."""
  out = []
  for (arm, depth), rows in runs.groupby(["arm", "depth"], sort=False):
    measured = {key: pd.DataFrame({run: loaded.series(run, key) for run in rows.run})
                for key in UPDATE_MEASURES}
    steps = measured[keys.UPDATE_SIZE].index
    lrs = pd.DataFrame({run: loaded.series(run, "lr") for run in rows.run}).reindex(steps)
    for step in steps:
      moving = (lrs.loc[step] > 0).to_numpy()
      moved = measured[keys.UPDATE_SIZE].loc[step][moving]
      moved = moved[np.isfinite(moved.to_numpy())]
      if not len(moved):
        continue
      row = {"arm": arm, "label": rows.arm_label.iloc[0], "depth": int(depth),
             "step": int(step), "runs": len(moved)}
      for key, table in measured.items():
        values = table.reindex(steps).loc[step][moving]
        row[key], row[f"{key}_low"], row[f"{key}_high"] = _geometric_or_nan(
            values[np.isfinite(values.to_numpy())])
      out.append(row)
  return pd.DataFrame(out, columns=["arm", "label", "depth", "step", "runs"] + [
      f"{key}{end}" for key in UPDATE_MEASURES for end in ("", "_low", "_high")])


def norm_input_series(loaded: runs_lib.Runs, runs: pd.DataFrame) -> pd.DataFrame:
  """depth_norm_inputs.csv: per arm, depth, telemetry step and layer, the RMS of what the
  layer's attention and MLP norms were given (normstudy.records.keys: Post-LN's alpha x + F(x),
  the LayerNorm input DeepNet follows), each the geometric mean over the seeds whose value is
  finite, with its 95% interval. Empty without that telemetry."""
  out = []
  for (arm, depth), rows in runs.groupby(["arm", "depth"], sort=False):
    tables = {name: {run: loaded.layer_values(run, name) for run in rows.run}
              for name in NORM_INPUTS}
    cells = sorted({(int(step), int(layer)) for by_run in tables.values()
                    for table in by_run.values() for layer in table.index
                    for step in table.columns})
    for step, layer in cells:
      row = {"arm": arm, "label": rows.arm_label.iloc[0], "depth": int(depth), "step": step,
             "layer": layer}
      for name, by_run in tables.items():
        values = np.array([t.loc[layer, step] for t in by_run.values()
                           if layer in t.index and step in t.columns], dtype=float)
        values = values[np.isfinite(values)]
        row[f"{name}_runs"] = len(values)
        row[name], row[f"{name}_low"], row[f"{name}_high"] = _geometric_or_nan(values)
      out.append(row)
  return pd.DataFrame(out, columns=["arm", "label", "depth", "step", "layer"] + [
      f"{name}{end}" for name in NORM_INPUTS for end in ("_runs", "", "_low", "_high")])


def _log_sizes(rows, column):
  values = rows[column]
  return np.log10(values[values > 0])


def _depth_trends(runs: pd.DataFrame, depths: list) -> list:
  """Per arm: its deepest against its shallowest depth, paired by seed (seeds at both), in the
  first update size and (runs that recorded it) the accumulated update."""
  out = []
  if len(depths) < 2:
    return out
  for test, column in ((DEPTH_TREND, "first_update_size"),
                       (DEPTH_TREND_ACCUMULATED, "accumulated_update")):
    for arm in dict.fromkeys(runs.arm):
      rows = runs[(runs.arm == arm) & (runs[column] > 0)]
      deep = rows[rows.depth == depths[-1]].set_index("seed")[column]
      shallow = rows[rows.depth == depths[0]].set_index("seed")[column]
      seeds = sorted(set(deep.index) & set(shallow.index))
      if test == DEPTH_TREND_ACCUMULATED and not seeds:
        continue  # runs from before accumulated_update was recorded
      a, b = np.log10(deep[seeds].to_numpy()), np.log10(shallow[seeds].to_numpy())
      _, _, p = stats.paired_t(a, b)
      out.append({"arm_a": arm, "arm_b": arm, "depth": f"{depths[-1]} vs {depths[0]}",
                  "test": test, "n": str(len(seeds)),
                  "difference": float((a - b).mean()) if seeds else np.nan, "p": p,
                  "p_exact": stats.paired_permutation(a, b)})
  return out


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
      for test, column in ((WELCH, "update_size"), (WELCH_FIRST, "first_update_size")):
        la, lb = _log_sizes(ra, column), _log_sizes(rb, column)
        _, _, p = stats.welch(la, lb)
        out.append({"arm_a": a, "arm_b": b, "depth": str(depth), "test": test,
                    "n": f"{len(la)} and {len(lb)}",
                    "difference": (float(la.mean() - lb.mean()) if len(la) and len(lb)
                                   else np.nan), "p": p})
    out.append({"arm_a": a, "arm_b": b, "depth": "all", "test": STRATIFIED,
                "n": f"{sum(s[1] for s in strata)} and {sum(s[3] for s in strata)}",
                "difference": (sum(s[0] for s in strata) / max(sum(s[1] for s in strata), 1)
                               - sum(s[2] for s in strata) / max(sum(s[3] for s in strata), 1)),
                "p": stats.stratified_exact(strata)})
  out += _depth_trends(runs, depths)
  tested = pd.DataFrame(out, columns=["arm_a", "arm_b", "depth", "test", "n", "difference", "p",
                                      "p_exact"])
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
           f"{threshold:.3f} nats (the unigram entropy: a model that uses no context); progress "
           "is how far its final eval loss got from there towards the floor (0 to 1). The "
           "first update size is ||f(x; theta_t+1) - f(x; theta_t)|| (the output logits on the "
           "first eval batch) at the first step whose learning rate is above 0, the early one "
           "its mean over the recorded steps, the accumulated update ||f(x; theta_t) - "
           "f(x; theta_0)|| its value at the last recorded step; each the geometric mean over "
           "seeds with its 95% interval. Tests are two-sided with Holm's correction over each kind of test (a "
           f"difference only at Holm-adjusted p < {stats.ALPHA})."]
  for arm, rows in by_depth.groupby("arm", sort=False):
    cells = "; ".join(
        f"{r.depth} layers {r.converged}/{r.runs} converged (progress {r.progress:.2f}), "
        f"first update {r.first_update_size:.3g} ({r.first_update_low:.3g} to "
        f"{r.first_update_high:.3g}), early update {r.update_size:.3g} "
        f"({r.update_size_low:.3g} to {r.update_size_high:.3g})"
        + (f", accumulated update {r.accumulated_update:.3g} ({r.accumulated_update_low:.3g} "
           f"to {r.accumulated_update_high:.3g})" if np.isfinite(r.accumulated_update) else "")
        for r in rows.itertuples())
    parts.append(f"{rows.label.iloc[0]}: {cells}.")
  lines = []
  for r in tested.itertuples():
    if r.test in (DEPTH_TREND, DEPTH_TREND_ACCUMULATED):
      lines.append(f"- {r.arm_a}, {r.depth} layers, {r.test}: {r.difference:+.3g} decades "
                   f"({10 ** r.difference:.3g}x), {r.verdict}; exact paired permutation p = "
                   f"{stats.format_p(r.p_exact)}.")
      continue
    where = f"{r.depth} layers" if r.depth != "all" else "all depths"
    lines.append(f"- {r.arm_a} against {r.arm_b}, {where}, {r.test}: {r.difference:+.3g}, "
                 f"{r.verdict}.")
  parts.append("\n".join(lines))
  return "\n\n".join(parts)


def figure(by_depth: pd.DataFrame, runs: pd.DataFrame, series: pd.DataFrame,
           norm_inputs: pd.DataFrame):
  from matplotlib.figure import Figure
  from normstudy.analysis.plots import style
  fig = Figure(figsize=(15, 8.4), layout="constrained")
  (share_ax, update_ax, series_ax), (accumulated_ax, norm_ax, layers_ax) = fig.subplots(2, 3)
  depths = sorted(by_depth.depth.unique())
  widths = {depth: 0.8 + 1.6 * i / max(len(depths) - 1, 1) for i, depth in enumerate(depths)}
  for i, (arm, rows) in enumerate(by_depth.groupby("arm", sort=False)):
    look = style(i)
    share_ax.plot(rows.depth, rows.share, marker="o", color=look["color"],
                  linestyle=look["linestyle"], label=rows.label.iloc[0])
    update_ax.plot(rows.depth, rows.first_update_size, marker="o", color=look["color"],
                   linestyle=look["linestyle"], label=rows.label.iloc[0])
    update_ax.fill_between(rows.depth, rows.first_update_low, rows.first_update_high,
                           color=look["color"], alpha=0.15)
    mine = runs[runs.arm == arm]
    update_ax.scatter(mine.depth, mine.first_update_size, color=look["color"], s=8)
    for depth, steps in series[series.arm == arm].groupby("depth"):
      series_ax.plot(steps.step, steps.update_size, color=look["color"],
                     linestyle=look["linestyle"], lw=widths[depth],
                     label=f"{rows.label.iloc[0]}, {depth} layers")
      accumulated_ax.plot(steps.step, steps.accumulated_update, color=look["color"],
                          linestyle=look["linestyle"], lw=widths[depth])
    for depth, cells in norm_inputs[norm_inputs.arm == arm].groupby("depth"):
      # The deepest layer's MLP norm input over steps; every layer's at the first telemetry step.
      last = cells[cells.layer == cells.layer.max()]
      norm_ax.plot(last.step, last.mlp_norm_input_rms, color=look["color"],
                   linestyle=look["linestyle"], lw=widths[depth])
      first = cells[cells.step == cells.step.min()]
      layers_ax.plot(first.layer + 1, first.mlp_norm_input_rms, color=look["color"],
                     linestyle=look["linestyle"], lw=widths[depth], marker=".")
  share_ax.set_ylim(-0.05, 1.05)
  share_ax.set_xlabel("layers")
  share_ax.set_ylabel("share of runs that converged")
  share_ax.set_title(f"Converged (final eval loss < {by_depth.threshold.iloc[0]:.3f})")
  update_ax.set_yscale("log")
  update_ax.set_xlabel("layers")
  update_ax.set_ylabel("first update size ||f(x; theta_t+1) - f(x; theta_t)||, lr > 0")
  update_ax.set_title("First update (geometric mean, 95% interval; dots: runs)")
  series_ax.set_yscale("log")
  series_ax.set_xlabel("step")
  series_ax.set_ylabel("update size (geometric mean over seeds)")
  series_ax.set_title("Update size by step (thicker: deeper)")
  series_ax.legend(fontsize=6, ncol=2)
  accumulated_ax.set_yscale("log")
  accumulated_ax.set_xlabel("step")
  accumulated_ax.set_ylabel("accumulated update ||f(x; theta_t) - f(x; theta_0)||")
  accumulated_ax.set_title("Accumulated update by step (thicker: deeper)")
  norm_ax.set_yscale("log")
  norm_ax.set_xlabel("step")
  norm_ax.set_ylabel("RMS of the last layer's MLP norm input")
  norm_ax.set_title("What the last norm is given, by step")
  layers_ax.set_yscale("log")
  layers_ax.set_xlabel("layer")
  layers_ax.set_ylabel("RMS of the MLP norm input")
  step = norm_inputs.step.min() if len(norm_inputs) else None
  layers_ax.set_title(f"What each layer's MLP norm is given, step {step}")
  for ax in (share_ax, update_ax):
    ax.set_xticks(depths)
  for ax in (share_ax, update_ax, series_ax, accumulated_ax, norm_ax, layers_ax):
    ax.grid(alpha=0.3)
  share_ax.legend(fontsize=7)
  return fig


def analyze(loaded: runs_lib.Runs, summary: pd.DataFrame, workdir: str) -> tuple[dict, str]:
  """Writes depth.csv, depth_tests.csv, depth_updates.csv and depth.png (+ .svg); returns
  (paths, observations)."""
  from normstudy.analysis.plots import save
  runs = run_table(loaded, summary)
  by_depth = table(runs)
  tested = tests(runs)
  series = update_series(loaded, runs)
  norm_inputs = norm_input_series(loaded, runs)
  outputs = {"depth_table": os.path.join(workdir, "depth.csv"),
             "depth_tests": os.path.join(workdir, "depth_tests.csv"),
             "depth_updates": os.path.join(workdir, "depth_updates.csv"),
             "depth_norm_inputs": os.path.join(workdir, "depth_norm_inputs.csv"),
             "depth_figure": os.path.join(workdir, "depth.png")}
  by_depth.to_csv(outputs["depth_table"], index=False)
  tested.to_csv(outputs["depth_tests"], index=False)
  series.to_csv(outputs["depth_updates"], index=False)
  norm_inputs.to_csv(outputs["depth_norm_inputs"], index=False)
  save(figure(by_depth, runs, series, norm_inputs), outputs["depth_figure"])
  return outputs, observations(by_depth, tested)
