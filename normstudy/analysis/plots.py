"""Figures: the study's comparison figure and the per-layer telemetry figures.

Drawn on bare matplotlib Figures (no pyplot), so a notebook's inline backend is left alone. Each
figure is saved as PNG (the file the analyses' outputs name) and, beside it, in the vector
formats $NORMSTUDY_FIGURE_FORMATS lists (normstudy.records.schema.figure_formats: SVG by
default).
"""

import os

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.records import names
from normstudy.records import schema

# The seed figure's colours, in its legend order; line styles tell overlapping curves apart.
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:pink", "tab:purple", "tab:brown",
          "tab:gray", "tab:olive", "tab:cyan", "tab:red")
LINESTYLES = ("-", "--", "-.", ":")
DEFAULT_SMOOTHING = 0.8

# Per-layer telemetry drawn by plot_layers: metric -> (title, axis label, log scale).
# Per-head telemetry drawn by plot_heads: metric -> title.
HEAD_PLOTS = {"attn_logit_max": "Largest attention logit of each head and layer"}
LAYER_PLOTS = {
    "attn_logit_max": ("Largest attention logit per layer", "max pre-softmax score", False),
    "act_rms": ("Residual-stream RMS after each layer", "RMS", True),
    "resid_absmax": ("Largest |residual stream| after each layer", "max |x|", True),
    "mlp_preact_absmax": ("Largest |MLP pre-activation| per layer", "max |h|", True),
    "attn_entropy": ("Mean attention entropy per layer", "entropy (nats)", False),
    "grad_norm": ("Gradient norm per layer", "L2 norm", True),
}
LINE_PLOT_MAX_LAYERS = 8


def style(i: int) -> dict:
  return {"color": COLORS[i % len(COLORS)],
          "linestyle": LINESTYLES[(i // len(COLORS) + i) % len(LINESTYLES)]}


# Thousands on a step axis from this many steps on: the paper's 0-100K axis reads 20K ... 100K;
# a 1000-step run's reads 0 ... 1000, not 0 ... 800 1K.
THOUSANDS_FROM = 10_000


def step_ticks(values) -> list:
  """Step tick labels in one unit across the axis: thousands (20K) when its largest tick
  reaches THOUSANDS_FROM, plain steps otherwise (0, 200, ..., 1000)."""
  values = list(values)
  return [_step_label(v, values) for v in values]


def _step_label(value, axis_ticks) -> str:
  thousands = max((abs(v) for v in axis_ticks), default=0) >= THOUSANDS_FROM
  return f"{value / 1000:g}K" if thousands and value else f"{value:g}"


def _step_formatter():
  """A matplotlib Formatter of a step axis by step_ticks: it is given every tick of the axis
  (set_locs) before it labels one."""
  from matplotlib.ticker import Formatter

  class StepFormatter(Formatter):
    ticks = ()

    def set_locs(self, locs):  # kept here: Formatter.locs is deprecated (matplotlib 3.11)
      self.ticks = tuple(locs)

    def __call__(self, x, pos=None):
      return _step_label(x, self.ticks or [x])

  return StepFormatter()


def arm_legend_labels(labels: list, seeds: list) -> list:
  """Legend entries of arms drawn over seeds: each label with its seed count, and without a
  trailing "| Run N" (which beside "(3 seeds)" reads as a contradiction) where the labels stay
  distinct without it; where they would not, "Run N" becomes "arm N"."""
  bare = [names.without_run_number(label) for label in labels]
  if len(set(bare)) < len(bare):
    bare = [names.RUN_NUMBER.sub(r" | arm \1", label) for label in labels]
  return [f"{label} ({n} seed{'s' * (n != 1)})" for label, n in zip(bare, seeds)]


def save(fig, path: str) -> str:
  """Saves `fig` as `path` (PNG) and the same name in each of schema.figure_formats() (SVG by
  default); returns `path`."""
  formats = schema.figure_formats()
  fig.savefig(path, dpi=120)
  for fmt in formats:
    fig.savefig(f"{os.path.splitext(path)[0]}.{fmt}")
  return path


def _mark_end(ax, values: pd.Series, color, stopped: bool):
  """A marker on the last finite point of a curve that ended early (halted or diverged)."""
  finite = values[np.isfinite(values.to_numpy(dtype=float))]
  if stopped and len(finite):
    ax.plot(finite.index[-1], finite.iloc[-1], marker="X", markersize=9, color=color,
            markeredgecolor="black", linestyle="none", zorder=5)


def plot_comparison(loaded: runs_lib.Runs, path: str,
                    smoothing: float = DEFAULT_SMOOTHING) -> str:
  """Saves `comparison_figure` as `path` (and .svg); returns `path`."""
  return save(comparison_figure(loaded, smoothing), path)


def reference_lines(facts: runs_lib.Run) -> set:
  """The reference losses that apply to a run, as (value, label, linestyle): the unigram
  entropy H(pi) (a model that uses no context: the early plateau); for a causal model the
  entropy rate (its floor), for masked prediction the Bayes-optimal masked loss (its floor)."""
  lines, info = set(), facts.info
  if info.unigram_entropy is not None:
    value = round(info.unigram_entropy, 6)
    lines.add((value, f"unigram entropy H(pi), no context ({value:.3f})", ":"))
  if not facts.causal and info.masked_loss_floor is not None:
    value = round(info.masked_loss_floor, 6)
    lines.add((value, f"Bayes-optimal masked loss ({value:.3f})", "--"))
  elif info.entropy_floor is not None:
    value = round(info.entropy_floor, 6)
    lines.add((value, f"entropy rate ({value:.3f} nats/token)", "--"))
  return lines


def has_floor(facts: runs_lib.Run) -> bool:
  """Whether the run's data know its loss floor (the synthetic languages do; real text does
  not)."""
  info = facts.info
  return info.entropy_floor is not None or (not facts.causal
                                            and info.masked_loss_floor is not None)


def _comparison_axes(loaded: runs_lib.Runs):
  """(figure, loss axes, loss-scale axes or None when no run scaled its loss)."""
  from matplotlib.figure import Figure
  table = loaded.table
  scaled = loaded.has_metric("loss_scale") and bool(
      (table[table.metric == "loss_scale"].value > 1).any())
  fig = Figure(figsize=(9, 7 if scaled else 5), layout="constrained")
  if scaled:
    loss_ax, scale_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
  else:
    loss_ax, scale_ax = fig.subplots(1, 1), None
  return fig, loss_ax, scale_ax


def _finish_comparison(loss_ax, scale_ax, handles: list, floorless: bool, smoothing: float):
  """The legend (`handles`, and a note when no floor is drawn), labels, scales and grids."""
  from matplotlib.lines import Line2D
  if floorless:
    handles.append(Line2D([], [], linestyle="none",
                          label="no exact loss floor (real text): none drawn"))
  loss_ax.legend(handles=handles, fontsize=8)
  loss_ax.set_ylabel("Loss (nats/token)" + (f", EMA {smoothing:g}" if smoothing > 0 else ""))
  loss_ax.set_title("Training Loss Comparison")
  loss_ax.grid(alpha=0.3)
  bottom = scale_ax if scale_ax is not None else loss_ax
  if scale_ax is not None:
    scale_ax.set_yscale("log", base=2)
    scale_ax.set_ylabel("Loss Scale (fp16)")
    scale_ax.grid(alpha=0.3)
  bottom.set_xlabel("Training Step")
  bottom.xaxis.set_major_formatter(_step_formatter())


def _spread(series: list) -> pd.DataFrame:
  """median, min and max over runs of their values at each step (the runs present there)."""
  frame = pd.concat(series, axis=1)
  return pd.DataFrame({"median": frame.median(axis=1), "low": frame.min(axis=1),
                       "high": frame.max(axis=1)})


def comparison_figure(loaded: runs_lib.Runs, smoothing: float = DEFAULT_SMOOTHING):
  """The study's figure: training loss (with eval loss and the entropy floor), and, when any run
  trained in float16, the dynamic loss scale (log2). A run that halted or diverged ends with an
  X at its last finite point. Arms trained over several seeds (runs.seed_groups) are drawn as the
  median over their seeds at each step, with the range (lowest to highest seed) shaded."""
  groups = runs_lib.seed_groups(loaded)
  if groups is not None:
    return _seeds_figure(loaded, groups, smoothing)
  from matplotlib.lines import Line2D

  fig, loss_ax, scale_ax = _comparison_axes(loaded)
  floors = set()
  any_stopped = floorless = False
  for i, (run, facts) in enumerate(loaded.runs.items()):
    look = style(i)
    label = facts.label
    raw = loaded.series(run, "loss")
    stopped = (facts.status == schema.HALTED
               or not np.isfinite(raw.to_numpy(dtype=float)).all())
    any_stopped |= stopped
    if smoothing > 0:  # the raw curve stays visible behind its average
      loss_ax.plot(raw.index, raw.values, color=look["color"], linewidth=0.5, alpha=0.2)
    loss = runs_lib.smooth(raw, smoothing)
    loss_ax.plot(loss.index, loss.values, label=label, linewidth=1.3, **look)
    _mark_end(loss_ax, loss, look["color"], stopped)
    eval_loss = loaded.series(run, "eval_loss")
    if len(eval_loss):
      loss_ax.plot(eval_loss.index, eval_loss.values, color=look["color"], linestyle="none",
                   marker="o", markersize=4, markerfacecolor="white")
    if scale_ax is not None:
      scale = loaded.series(run, "loss_scale")
      scale_ax.plot(scale.index, scale.values, linewidth=1.0, **look)
      _mark_end(scale_ax, scale, look["color"], stopped)
    floors.update(reference_lines(facts))
    floorless |= not has_floor(facts)
  for value, label, linestyle in sorted(floors):
    loss_ax.axhline(value, color="black", linestyle=linestyle, linewidth=1.0, label=label)
  handles, _ = loss_ax.get_legend_handles_labels()
  handles.append(Line2D([], [], color="gray", linestyle="none", marker="o",
                        markerfacecolor="white", label="eval loss"))
  if any_stopped:
    handles.append(Line2D([], [], color="gray", linestyle="none", marker="X",
                          markeredgecolor="black", label="halted / diverged here"))
  _finish_comparison(loss_ax, scale_ax, handles, floorless, smoothing)
  return fig


def _seeds_figure(loaded: runs_lib.Runs, groups: dict, smoothing: float):
  """comparison_figure for arms over seeds: per arm the median (smoothed) training loss over its
  seeds with their range shaded, the eval losses' median as circles, the loss scale's median
  and range, and an X where a seed halted or diverged."""
  from matplotlib.lines import Line2D

  fig, loss_ax, scale_ax = _comparison_axes(loaded)
  floors, any_stopped, floorless = set(), False, False
  legend = arm_legend_labels(
      [loaded.runs[m[0]].info.arm_label or loaded.runs[m[0]].label for m in groups.values()],
      [len(m) for m in groups.values()])
  for i, (arm, members) in enumerate(groups.items()):
    look = style(i)
    losses = [runs_lib.smooth(loaded.series(run, "loss"), smoothing) for run in members]
    spread = _spread(losses)
    loss_ax.fill_between(spread.index, spread.low, spread.high, color=look["color"], alpha=0.15,
                         linewidth=0)
    loss_ax.plot(spread.index, spread["median"], linewidth=1.3,
                 label=legend[i], **look)
    evals = [loaded.series(run, "eval_loss") for run in members]
    if any(len(e) for e in evals):
      eval_median = _spread([e for e in evals if len(e)])["median"]
      loss_ax.plot(eval_median.index, eval_median.values, color=look["color"], linestyle="none",
                   marker="o", markersize=4, markerfacecolor="white")
    for run, loss in zip(members, losses):
      raw = loaded.series(run, "loss")
      stopped = (loaded.runs[run].status == schema.HALTED
                 or not np.isfinite(raw.to_numpy(dtype=float)).all())
      any_stopped |= stopped
      _mark_end(loss_ax, loss, look["color"], stopped)
    if scale_ax is not None:
      scales = _spread([loaded.series(run, "loss_scale") for run in members])
      scale_ax.fill_between(scales.index, scales.low, scales.high, color=look["color"],
                            alpha=0.15, linewidth=0)
      scale_ax.plot(scales.index, scales["median"], linewidth=1.0, **look)
    for run in members:
      floors.update(reference_lines(loaded.runs[run]))
      floorless |= not has_floor(loaded.runs[run])
  for value, label, linestyle in sorted(floors):
    loss_ax.axhline(value, color="black", linestyle=linestyle, linewidth=1.0, label=label)
  handles, _ = loss_ax.get_legend_handles_labels()
  handles.append(Line2D([], [], color="gray", linestyle="none", marker="o",
                        markerfacecolor="white", label="eval loss (median over seeds)"))
  handles.append(Line2D([], [], color="gray", linewidth=6, alpha=0.3,
                        label="range over seeds (line: median)"))
  if any_stopped:
    handles.append(Line2D([], [], color="gray", linestyle="none", marker="X",
                          markeredgecolor="black", label="a seed halted / diverged here"))
  _finish_comparison(loss_ax, scale_ax, handles, floorless, smoothing)
  return fig


def plot_layers(loaded: runs_lib.Runs, workdir: str) -> dict:
  """layers_<metric>.png for each per-layer telemetry metric recorded: one panel per run, a line
  per layer for stacks of up to 8 layers, a layer x step heatmap for deeper ones."""
  from matplotlib.colors import LogNorm
  from matplotlib.colors import Normalize
  from matplotlib.figure import Figure

  written = {}
  for metric, (title, unit, log) in LAYER_PLOTS.items():
    tables = {run: loaded.layer_values(run, metric) for run in loaded.names}
    tables = {run: t for run, t in tables.items() if not t.empty}
    if not tables:
      continue
    values = np.concatenate([t.to_numpy().ravel() for t in tables.values()])
    values = values[np.isfinite(values)]
    deep = max(len(t) for t in tables.values()) > LINE_PLOT_MAX_LAYERS
    columns = min(len(tables), 4)
    rows = -(-len(tables) // columns)
    fig = Figure(figsize=(3.8 * columns + (1.2 if deep else 0), 3.0 * rows + 0.6),
                 layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True).ravel()
    image = None
    for ax, (run, table) in zip(axes, tables.items()):
      steps = table.columns.to_numpy()
      if deep:
        positive = len(values) and values.min() > 0
        norm = (LogNorm(values.min(), values.max()) if log and positive
                else Normalize(values.min(), values.max()) if len(values) else None)
        image = ax.imshow(table.to_numpy(), aspect="auto", origin="lower", norm=norm,
                          cmap="viridis", interpolation="nearest",
                          extent=(steps.min(), steps.max(), -0.5, len(table) - 0.5))
        ax.set_ylabel("layer")
      else:
        cmap = __import__("matplotlib").colormaps["viridis"]
        for layer, row in table.iterrows():
          ax.plot(steps, row.to_numpy(), linewidth=1.0, label=f"layer {layer}",
                  color=cmap(layer / max(len(table) - 1, 1)))
        if log and len(values) and values.min() > 0:
          ax.set_yscale("log")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
      ax.set_title(loaded[run].label, fontsize=8)
      ax.set_xlabel("Training Step")
      ax.xaxis.set_major_formatter(_step_formatter())
    for ax in axes[len(tables):]:
      ax.set_visible(False)
    if deep and image is not None:
      fig.colorbar(image, ax=axes[:len(tables)].tolist(), label=unit)
    elif not deep:
      axes[0].legend(fontsize=7)
    fig.suptitle(title)
    path = os.path.join(workdir, f"layers_{metric}.png")
    written[f"layers_{metric}"] = save(fig, path)
  return written


def plot_heads(loaded: runs_lib.Runs, workdir: str, metric: str = "attn_logit_max") -> dict:
  """heads_<metric>.png when per-head telemetry was recorded: one panel per run, a layer x head
  heatmap of the largest value over the run's telemetry steps (log colour scale when every
  value is positive), so a head whose logits grow stands out from its layer."""
  from matplotlib.colors import LogNorm
  from matplotlib.colors import Normalize
  from matplotlib.figure import Figure
  tables = {run: loaded.head_values(run, metric) for run in loaded.names}
  tables = {run: t for run, t in tables.items() if not t.empty}
  if not tables:
    return {}
  grids = {}
  for run, table in tables.items():
    largest = table.max(axis=1, skipna=True)
    grid = largest.unstack("head")
    grids[run] = grid
  values = np.concatenate([g.to_numpy().ravel() for g in grids.values()])
  values = values[np.isfinite(values)]
  positive = len(values) and values.min() > 0
  norm = (LogNorm(values.min(), values.max()) if positive
          else Normalize(values.min(), values.max()) if len(values) else None)
  columns = min(len(grids), 4)
  rows = -(-len(grids) // columns)
  fig = Figure(figsize=(3.6 * columns + 1.2, 2.8 * rows + 0.6), layout="constrained")
  axes = fig.subplots(rows, columns, squeeze=False).ravel()
  image = None
  for ax, (run, grid) in zip(axes, grids.items()):
    image = ax.imshow(grid.to_numpy(), aspect="auto", origin="lower", norm=norm,
                      cmap="viridis", interpolation="nearest")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    ax.set_title(loaded[run].label, fontsize=8)
  for ax in axes[len(grids):]:
    ax.set_visible(False)
  if image is not None:
    fig.colorbar(image, ax=axes[:len(grids)].tolist(), label="largest over the run")
  fig.suptitle(HEAD_PLOTS.get(metric, metric))
  path = os.path.join(workdir, f"heads_{metric}.png")
  return {f"heads_{metric}": save(fig, path)}
