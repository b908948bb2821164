"""Figures of a learning-rate sweep: sensitivity curves, attention logits, how runs die.

All read the per-run table of `normstudy.analysis.sensitivity.table`; one panel per value of the
sweep's other axes (depth, say), one colour per arm, the same colour in every figure.
"""

import os

import numpy as np
import pandas as pd

from normstudy.analysis import sensitivity
from normstudy.analysis.plots import save
from normstudy.analysis.plots import style

FLOAT16_MAX = 65504.0
KIND_COLORS = {"attention scores": "tab:red", "attention output": "tab:orange",
               "residual stream after attention": "tab:blue",
               "residual stream after the MLP": "tab:cyan",
               "residual stream": "tab:blue", "MLP pre-activation": "tab:green",
               "MLP output": "tab:olive", "output logits": "tab:purple", "embedding": "tab:brown",
               "backward pass only": "tab:gray", "not located": "black"}


def _panels(runs: pd.DataFrame, height: float = 4.2, rows: int = 1):
  from matplotlib.figure import Figure
  groups = list(dict.fromkeys(runs.group))
  beside = 3.2 if runs.arm.nunique() > INSET_LEGEND_MAX_ARMS else 0.0  # room for the legend
  fig = Figure(figsize=(6.2 * len(groups) + beside, height * rows + 0.4), layout="constrained")
  axes = fig.subplots(rows, len(groups), squeeze=False, sharey="row")
  return fig, groups, axes


# More arms than this: the legend goes beside the panels, where it covers no curve.
INSET_LEGEND_MAX_ARMS = 6


def _legend(fig, ax, handles, arms: int):
  if arms <= INSET_LEGEND_MAX_ARMS:
    ax.legend(handles=handles, fontsize=7)
  elif ax is fig.axes[0]:
    fig.legend(handles=handles, fontsize=7, loc="outside right upper")


def _arm_styles(runs: pd.DataFrame) -> dict:
  return {arm: style(i) for i, arm in enumerate(dict.fromkeys(runs.arm))}


def _lr_axis(ax, runs):
  ax.set_xscale("log")
  lrs = sorted(runs.learning_rate.unique())
  ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs], fontsize=8)
  ax.minorticks_off()
  ax.set_xlabel("peak learning rate")
  ax.grid(alpha=0.3)


def sensitivity_figure(runs: pd.DataFrame):
  """Final eval loss against learning rate (log x), one line per arm through the mean over seeds
  (a failed run counted at its loss at init, as the metric counts it), the seeds' min-max as a
  band, every halted or diverged run as an X at the top of the panel, the entropy floor dashed."""
  from matplotlib.lines import Line2D
  fig, groups, axes = _panels(runs)
  looks = _arm_styles(runs)
  top = float(np.nanmax(runs.loss_init)) + 0.15
  for ax, group in zip(axes[0], groups):
    in_group = runs[runs.group == group]
    arms = list(dict.fromkeys(in_group.arm))
    for i, arm in enumerate(arms):
      curve = in_group[in_group.arm == arm]
      look = looks[arm]
      stats = curve.groupby("learning_rate").effective_loss.agg(["mean", "min", "max"])
      ax.plot(stats.index, stats["mean"], marker="o", markersize=4, linewidth=1.5,
              label=curve.arm_label.iloc[0], **look)
      ax.fill_between(stats.index, stats["min"], stats["max"], color=look["color"], alpha=0.15,
                      linewidth=0)
      failed = curve[curve.status.isin(sensitivity.FAILED)]
      # Failed runs of one learning rate, spread sideways by arm so they stay countable.
      for lr, dead in failed.groupby("learning_rate"):
        offset = 10 ** (0.03 * (i - (len(arms) - 1) / 2))
        ax.plot([lr * offset] * len(dead), top - 0.06 * np.arange(len(dead)), marker="X",
                linestyle="none", markersize=7, color=look["color"], markeredgecolor="black")
    floors = in_group.floor.dropna().unique()
    for floor in floors:
      ax.axhline(floor, color="black", linestyle="--", linewidth=1.0)
    unigram = in_group.unigram_entropy.dropna().unique()
    for value in unigram:
      ax.axhline(value, color="black", linestyle=":", linewidth=0.8)
    init = float(np.nanmean(in_group.loss_init))
    ax.axhline(init, color="gray", linestyle=":", linewidth=1.0)
    _lr_axis(ax, in_group)
    ax.set_title(group or "Final eval loss against learning rate", fontsize=10)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="black", linestyle="--",
                       label=f"loss floor ({floors[0]:.3f})" if len(floors) else "loss floor"),
                Line2D([], [], color="black", linestyle=":",
                       label=f"unigram entropy, no context ({unigram[0]:.3f})" if len(unigram)
                       else "unigram entropy"),
                Line2D([], [], color="gray", linestyle=":", label=f"loss at init ({init:.2f})")]
    if in_group.status.isin(sensitivity.FAILED).any():  # a legend only for what is drawn
      handles.append(Line2D([], [], color="gray", marker="X", linestyle="none",
                            markeredgecolor="black", label="a halted / diverged run"))
    _legend(fig, ax, handles, len(arms))
  axes[0][0].set_ylabel("final eval loss (nats/token), mean and seeds' range")
  fig.suptitle("Learning-rate sensitivity")
  return fig


def attn_logit_figure(runs: pd.DataFrame):
  """Top: the largest attention logit a run reached (over layers and telemetry steps) against
  the learning rate, mean over seeds with the seeds' range, and float16's largest value when a
  run trained in float16. Bottom: the share of runs that halted or diverged at each learning
  rate."""
  fig, groups, axes = _panels(runs, height=3.2, rows=2)
  looks = _arm_styles(runs)
  for column, group in enumerate(groups):
    in_group = runs[runs.group == group]
    logit_ax, share_ax = axes[0][column], axes[1][column]
    arms = list(dict.fromkeys(in_group.arm))
    width = 0.8 / max(len(arms), 1)
    lrs = sorted(in_group.learning_rate.unique())
    for i, arm in enumerate(arms):
      curve = in_group[in_group.arm == arm]
      look = looks[arm]
      logits = curve.groupby("learning_rate").max_attn_logit.agg(["mean", "min", "max"])
      logit_ax.plot(logits.index, logits["mean"], marker="o", markersize=4,
                    label=curve.arm_label.iloc[0], **look)
      logit_ax.fill_between(logits.index, logits["min"], logits["max"], color=look["color"],
                            alpha=0.15, linewidth=0)
      share = curve.groupby("learning_rate").status.agg(
          lambda s: s.isin(sensitivity.FAILED).mean()).reindex(lrs, fill_value=0.0)
      positions = np.arange(len(lrs)) + (i - (len(arms) - 1) / 2) * width
      share_ax.bar(positions, share.to_numpy(), width=width, color=look["color"],
                   label=curve.arm_label.iloc[0])
    if np.isfinite(in_group.max_attn_logit).any():
      logit_ax.set_yscale("log")
    if (in_group.dtype == "float16").any():
      logit_ax.axhline(FLOAT16_MAX, color="black", linestyle=":", linewidth=1.0,
                       label="float16 max (65504)")
    _lr_axis(logit_ax, in_group)
    logit_ax.set_title(group or "Largest attention logit", fontsize=10)
    _legend(fig, logit_ax, logit_ax.get_legend_handles_labels()[0], len(arms))
    share_ax.set_xticks(np.arange(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=8)
    share_ax.set_ylim(0, 1.05)
    share_ax.set_xlabel("peak learning rate")
    share_ax.grid(alpha=0.3, axis="y")
  axes[0][0].set_ylabel("max attention logit")
  axes[1][0].set_ylabel("share of runs halted / diverged")
  fig.suptitle("Attention logits and failures against learning rate")
  return fig


# Panels per row of the deaths figure when the sweep has no axis besides learning rate and seed.
DEATH_PANELS_PER_ROW = 4


def deaths_figure(runs: pd.DataFrame, died: pd.DataFrame):
  """How runs die: a panel per arm (a row per value of the other axes, or rows of four), at
  each learning rate a bar of the runs that halted or diverged, stacked by where each first went
  non-finite, the layers written on."""
  from matplotlib.figure import Figure
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch
  arms = list(dict.fromkeys(runs.arm))
  groups = list(dict.fromkeys(runs.group))
  panels = [(group, arm) for group in groups for arm in arms]
  columns = len(arms) if len(groups) > 1 else min(len(arms), DEATH_PANELS_PER_ROW)
  rows = -(-len(panels) // columns)
  fig = Figure(figsize=(3.2 * columns, 2.8 * rows + 0.8), layout="constrained")
  axes = fig.subplots(rows, columns, squeeze=False, sharey=True).ravel()
  lrs = sorted(runs.learning_rate.unique())
  used = set()
  for ax, (group, arm) in zip(axes, panels):
    rows_ = died[(died.arm == arm) & (died.group == group)]
    bottom = np.zeros(len(lrs))
    for kind in sensitivity.DEATH_KINDS:
      of_kind = rows_[rows_.kind == kind]
      if of_kind.empty:
        continue
      used.add(kind)
      counts = of_kind.groupby("learning_rate")["count"].sum().reindex(lrs, fill_value=0)
      ax.bar(np.arange(len(lrs)), counts.to_numpy(), bottom=bottom, color=KIND_COLORS[kind])
      for x, lr in enumerate(lrs):
        layers = sorted({int(v) for v in of_kind[of_kind.learning_rate == lr].layer.dropna()})
        if layers and counts[lr]:
          ax.text(x, bottom[x] + counts[lr] / 2, ",".join(f"L{v}" for v in layers),
                  ha="center", va="center", fontsize=6, color="white")
      bottom += counts.to_numpy()
    total = runs[(runs.arm == arm) & (runs.group == group)].groupby("learning_rate").size()
    ax.plot(np.arange(len(lrs)), total.reindex(lrs, fill_value=0).to_numpy(), "k_",
            markersize=14)
    ax.set_xticks(np.arange(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7, rotation=45)
    label = runs[runs.arm == arm].arm_label.iloc[0]
    ax.set_title(label + (f"\n{group}" if group else ""), fontsize=8)
    ax.set_xlabel("peak learning rate", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.set_ylim(0, total.max() + 0.5)
  for i, ax in enumerate(axes):
    if i >= len(panels):
      ax.set_visible(False)
    elif i % columns == 0:
      ax.set_ylabel("runs halted / diverged")
  handles = [Patch(color=KIND_COLORS[k], label=k) for k in sensitivity.DEATH_KINDS if k in used]
  handles.append(Line2D([], [], color="black", marker="_", linestyle="none", markersize=12,
                        label="runs at this lr"))
  fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=8)
  fig.suptitle("Where runs first went non-finite\n(L<i>: layer)" if columns == 1 else
               "Where runs first went non-finite (L<i>: layer)", fontsize=10)
  return fig


def plot_all(runs: pd.DataFrame, died: pd.DataFrame, workdir: str) -> dict:
  """lr_sensitivity.png, lr_attn_logit.png and deaths.png (each with an .svg) in `workdir`."""
  outputs = {
      "lr_sensitivity": save(sensitivity_figure(runs), os.path.join(workdir, "lr_sensitivity.png")),
      "lr_attn_logit": save(attn_logit_figure(runs), os.path.join(workdir, "lr_attn_logit.png")),
  }
  if len(died) and died["count"].sum() > 0:  # no empty figure for a sweep where none died
    outputs["deaths_figure"] = save(deaths_figure(runs, died),
                                    os.path.join(workdir, "deaths.png"))
  return outputs
