"""Survival of a learning-rate sweep: the share of runs that fail (halt or diverge) against the
learning rate, per arm, and the learning rate at which half of them do.

Reads the per-run table of `normstudy.analysis.sensitivity.table` (one row per run: arm, group,
learning_rate, seed, status, attention logits). Per arm (and value of the sweep's other axes, the
`group`, e.g. a depth):

  survival.csv    arm, label, group, runs, failed, critical_lr, critical_lr_low,
                  critical_lr_high (stats.critical_lr: logistic fit by maximum likelihood,
                  bootstrap 95% interval over runs), bound (an arm that never or always fails in
                  the grid: the critical learning rate lies beyond it; or whose runs the
                  learning rate separates completely: "between 0.316 and 0.562 (all 3 seeds)",
                  critical_lr empty and low/high the bracket), and per learning rate
                  `failed@<lr>` as "k/n"
  survival_tests.csv   every pair of arms in a group: Fisher's exact test at each learning rate,
                  the exact conditional test stratified by learning rate (stats.stratified_exact;
                  `strata_carrying`: the learning rates whose shares differ) and the
                  likelihood-ratio test of one curve against two, each of the last two with
                  `p_holm`, Holm-adjusted over its family (every pair of arms)
  survival.png    failure share against learning rate with the fitted curves and the critical
                  learning rates; the largest attention logit at a fixed step against learning
                  rate (Wortsman et al.'s characteristic curve) with the 1e4 line
"""

import itertools
import os

import numpy as np
import pandas as pd
from scipy import special

from normstudy.analysis import runs as runs_lib
from normstudy.analysis import stats
from normstudy.records import schema

FAILED = schema.FAILED
# Above this the attention logits are broken (Wortsman et al. 2023, section 3.2.1: attention
# logit growth; logits of order 1e4 make the softmax one-hot).
BROKEN_LOGIT = 1e4


def _curves(runs: pd.DataFrame):
  return {key: rows for key, rows in runs.groupby(["group", "arm"], sort=False)}


def _failed(rows: pd.DataFrame) -> np.ndarray:
  return rows.status.isin(FAILED).to_numpy().astype(int)


def _label(rows: pd.DataFrame, group: str) -> str:
  return rows.arm_label.iloc[0] + (f", {group}" if group else "")


def table(runs: pd.DataFrame) -> pd.DataFrame:
  """One row per arm (and group): the survival table described in the module's docstring."""
  rows = []
  for (group, arm), curve in _curves(runs).items():
    estimate = stats.critical_lr(curve.learning_rate.to_numpy(), _failed(curve))
    row = {"arm": arm, "label": _label(curve, group), "group": group, **estimate}
    for lr, at in curve.groupby("learning_rate"):
      row[f"failed@{lr:g}"] = f"{int(_failed(at).sum())}/{len(at)}"
    rows.append(row)
  return pd.DataFrame(rows)


def tests(runs: pd.DataFrame) -> pd.DataFrame:
  """Pairwise comparisons of arms within a group: one row per test (Fisher's exact test at each
  learning rate both arms ran, and the likelihood-ratio test of one failure curve for both),
  with n, p and the verdict (stats.verdict)."""
  out = []
  curves = _curves(runs)
  for group in dict.fromkeys(g for g, _ in curves):
    arms = [(arm, rows) for (g, arm), rows in curves.items() if g == group]
    for (arm_a, a), (arm_b, b) in itertools.combinations(arms, 2):
      base = {"group": group, "arm_a": arm_a, "arm_b": arm_b,
              "label_a": _label(a, group), "label_b": _label(b, group)}
      strata = []  # (a failed, a runs, b failed, b runs) per learning rate both arms ran
      for lr in sorted(set(a.learning_rate) & set(b.learning_rate)):
        fa, fb = _failed(a[a.learning_rate == lr]), _failed(b[b.learning_rate == lr])
        strata.append((int(fa.sum()), len(fa), int(fb.sum()), len(fb)))
        p = stats.fisher_exact(*strata[-1])
        out.append({**base, "test": "Fisher's exact test", "learning_rate": lr,
                    "a": f"{int(fa.sum())}/{len(fa)}", "b": f"{int(fb.sum())}/{len(fb)}",
                    "n": f"{len(fa)} and {len(fb)}", "p": p})
      # The learning rates whose failure shares differ: what carries the contrast.
      carrying = sum(1 for fa, na, fb, nb in strata if fa * nb != fb * na)
      out.append({**base, "test": "exact conditional test stratified by learning rate",
                  "learning_rate": np.nan, "a": f"{sum(t[0] for t in strata)}/"
                  f"{sum(t[1] for t in strata)}", "b": f"{sum(t[2] for t in strata)}/"
                  f"{sum(t[3] for t in strata)}", "n": f"{sum(t[1] for t in strata)} and "
                  f"{sum(t[3] for t in strata)}", "p": stats.stratified_exact(strata),
                  "strata_carrying": carrying})
      outcomes = [(np.log10(r.learning_rate.to_numpy()), _failed(r)) for r in (a, b)]
      statistic, p = stats.same_curve_lrt(*outcomes)
      out.append({**base, "test": "likelihood-ratio test (one curve vs two, 2 df)",
                  "learning_rate": np.nan, "a": f"{int(outcomes[0][1].sum())}/{len(a)}",
                  "b": f"{int(outcomes[1][1].sum())}/{len(b)}", "n": f"{len(a)} and {len(b)}",
                  "p": p, "statistic": statistic})
  frame = pd.DataFrame(out)
  if len(frame):
    # Holm over each family of curve-level tests (every pair, one test kind); Fisher's tests
    # at single learning rates keep their raw p.
    frame["p_holm"] = np.nan
    for _, family in frame[frame.learning_rate.isna()].groupby("test"):
      frame.loc[family.index, "p_holm"] = stats.holm(family.p.tolist())
    frame["verdict"] = [stats.verdict(t, n, p) for t, n, p in zip(frame.test, frame.n, frame.p)]
  return frame


def _critical_text(row) -> str:
  if row.bound:
    return f"critical learning rate {row.bound}"
  return (f"critical learning rate {row.critical_lr:.3g} (95% bootstrap interval "
          f"{row.critical_lr_low:.3g} to {row.critical_lr_high:.3g})")


def observations(runs: pd.DataFrame, survival: pd.DataFrame, tests_: pd.DataFrame,
                 logit_step) -> str:
  """Sentences with the numbers and, for every comparison, its test, n and p."""
  lrs = sorted(runs.learning_rate.unique())
  parts = [f"Survival: {len(runs)} runs, learning rates {lrs[0]:g} to {lrs[-1]:g} "
           f"({len(lrs)} values), {runs.seed.nunique()} seed(s). A run fails when it halts or "
           "diverges. The critical learning rate is where a logistic fit of failure against "
           f"log10(learning rate) crosses 50% ({stats.BOOTSTRAP_SAMPLES} bootstrap resamples of "
           f"the runs give its 95% interval). A difference is claimed only at p < {stats.ALPHA}."]
  for row in survival.itertuples():
    parts.append(f"{row.label}: {row.failed} of {row.runs} runs failed; {_critical_text(row)}.")
  if len(tests_):
    curves = tests_[tests_.learning_rate.isna()]
    for row in curves.itertuples():
      holm = (f" (Holm-adjusted over the {row.test} family: p = "
              f"{stats.format_p(row.p_holm)})" if np.isfinite(row.p_holm) else "")
      carried = (f"; {int(row.strata_carrying)} learning rate(s) carry the contrast"
                 if "stratified" in row.test else "")
      parts.append(f"{row.label_a} against {row.label_b}: failure "
                   f"{row.verdict.replace('different', 'differ')}{carried}{holm}.")
    fisher = tests_[tests_.learning_rate.notna() & (tests_.p < stats.ALPHA)]
    for row in fisher.itertuples():
      parts.append(f"At lr {row.learning_rate:g}: {row.label_a} failed {row.a}, {row.label_b} "
                   f"{row.b}: {row.verdict}.")
    if not len(fisher):
      parts.append("At no single learning rate does Fisher's exact test separate two arms "
                   f"(smallest p = {stats.format_p(tests_[tests_.learning_rate.notna()].p.min())}"
                   ").")
  if logit_step is not None and runs.attn_logit_at_step.notna().any():
    broken = runs[runs.attn_logit_at_step > BROKEN_LOGIT]
    parts.append(f"Largest attention logit at step {logit_step}: above {BROKEN_LOGIT:g} in "
                 f"{len(broken)} of {runs.attn_logit_at_step.notna().sum()} runs that reached it"
                 + (": " + ", ".join(f"{arm} ({n})" for arm, n in
                                     broken.groupby("arm_label").size().items())
                    if len(broken) else "") + ".")
  return "\n\n".join(parts)


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def figure(runs: pd.DataFrame, survival: pd.DataFrame, logit_step):
  """Failure share against learning rate (points: the share per learning rate; lines: the
  logistic fits; error bars at 50%: the critical learning rates with their intervals) and,
  beside it, the largest attention logit at `logit_step` against learning rate with the 1e4
  line. One row of panels per group."""
  from matplotlib.figure import Figure
  from normstudy.analysis.plots import style
  groups = list(dict.fromkeys(runs.group))
  fig = Figure(figsize=(12.5, 4.4 * len(groups) + 0.6), layout="constrained")
  axes = fig.subplots(len(groups), 2, squeeze=False, sharex="row")
  looks = {arm: {**style(i), "marker": MARKERS[i % len(MARKERS)]}
           for i, arm in enumerate(dict.fromkeys(runs.arm))}
  for (share_ax, logit_ax), group in zip(axes, groups):
    arms = [(arm, curve) for (g, arm), curve in _curves(runs).items() if g == group]
    for i, (arm, curve) in enumerate(arms):
      est = survival[(survival.arm == arm) & (survival.group == group)].iloc[0]
      # Intervals stacked around 50% so that equal ones stay visible.
      height = 0.5 + 0.035 * (i - (len(arms) - 1) / 2)
      _draw_arm(share_ax, logit_ax, curve, est, looks[arm], _label(curve, group), height)
    share_ax.set_ylim(-0.05, 1.05)
    share_ax.set_ylabel("share of runs halted or diverged")
    share_ax.axhline(0.5, color="gray", linewidth=0.6, linestyle=":")
    share_ax.set_title("Survival" + (f" ({group})" if group else "") +
                       ": failure share, logistic fit, critical lr (95% CI)", fontsize=9)
    share_ax.legend(fontsize=7)
    logit_ax.axhline(BROKEN_LOGIT, color="black", linestyle="--", linewidth=0.8,
                     label=f"{BROKEN_LOGIT:g}: attention broken")
    if (runs.attn_logit_at_step > 0).any():
      logit_ax.set_yscale("log")
    else:
      logit_ax.text(0.5, 0.5, "no attention telemetry recorded", transform=logit_ax.transAxes,
                    ha="center")
    logit_ax.set_ylabel(f"largest attention logit at step {logit_step}")
    logit_ax.set_title("Attention logit growth (runs alive at that step)", fontsize=9)
    logit_ax.legend(fontsize=7)
    for ax in (share_ax, logit_ax):
      ax.set_xscale("log")
      ax.set_xlabel("learning rate")
      ax.grid(alpha=0.3)
  return fig


def _draw_arm(share_ax, logit_ax, curve, est, look, label, height):
  color = look["color"]
  shares = curve.groupby("learning_rate").status.apply(lambda s: s.isin(FAILED).mean())
  share_ax.plot(shares.index, shares.to_numpy(), linestyle="none", marker=look["marker"],
                color=color, label=label)
  lrs = curve.learning_rate
  grid = np.logspace(np.log10(lrs.min()), np.log10(lrs.max()), 200)
  fit = stats.fit_logistic(np.log10(lrs), _failed(curve))
  share_ax.plot(grid, special.expit(fit.intercept + fit.slope * (np.log10(grid) - fit.center)),
                color=color, linestyle=look["linestyle"], linewidth=1.2)
  if np.isfinite(est.critical_lr):
    share_ax.errorbar([est.critical_lr], [height], color=color, capsize=3, marker="|",
                      xerr=[[est.critical_lr - est.critical_lr_low],
                            [est.critical_lr_high - est.critical_lr]])
  elif np.isfinite(est.critical_lr_low):  # complete separation: the bracket, no point
    share_ax.plot([est.critical_lr_low, est.critical_lr_high], [height, height], color=color,
                  marker="|", markersize=8)
  reached = curve[curve.attn_logit_at_step.notna()]
  logit_ax.plot(reached.learning_rate, reached.attn_logit_at_step, linestyle="none",
                marker=look["marker"], color=color, alpha=0.7, label=label)
  medians = reached.groupby("learning_rate").attn_logit_at_step.median()
  logit_ax.plot(medians.index, medians.to_numpy(), color=color, linestyle=look["linestyle"],
                linewidth=1)


def logits_at_step(loaded: runs_lib.Runs, runs: pd.DataFrame):
  """(step, runs with `attn_logit_at_step`): the largest attention logit over layers at the
  first telemetry step of the sweep (NaN for runs that stopped before it)."""
  records = loaded.table
  logits = records[records.metric.str.startswith("attn_logit_max/layer_")]
  if logits.empty:
    return None, runs.assign(attn_logit_at_step=np.nan)
  step = int(logits.step.min())
  at = logits[logits.step == step].groupby("run").value.max()
  return step, runs.assign(attn_logit_at_step=runs.run.map(at).astype(float))


def analyze(loaded: runs_lib.Runs, runs: pd.DataFrame, workdir: str) -> tuple[dict, str]:
  """Writes survival.csv, survival_tests.csv and survival.png (+ .svg); returns (paths,
  observations)."""
  from normstudy.analysis.plots import save
  step, runs = logits_at_step(loaded, runs)
  survival = table(runs)
  tests_ = tests(runs)
  outputs = {"survival": os.path.join(workdir, "survival.csv"),
             "survival_tests": os.path.join(workdir, "survival_tests.csv")}
  survival.to_csv(outputs["survival"], index=False)
  tests_.to_csv(outputs["survival_tests"], index=False)
  outputs["survival_figure"] = save(figure(runs, survival, step),
                                    os.path.join(workdir, "survival.png"))
  return outputs, observations(runs, survival, tests_, step)
