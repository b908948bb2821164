"""Turn run directories into the comparison figure and a summary table (importable in Colab).

  df = load_runs("runs/seed_figure")      # long form: run, label, step, metric, value
  plot_comparison(df, "fig.png")          # loss + loss scale against the training step
  summarize(df)                           # one row per run
"""

import json
import os

import numpy as np
import pandas as pd

from normstudy import metrics as metrics_lib

STUDY_FILE = "study.json"  # written by normstudy.study: the variants in the config file's order

# The seed figure's colours, in its legend order.
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:pink", "tab:purple", "tab:brown",
          "tab:gray", "tab:olive", "tab:cyan", "tab:red")


def _read_json(path):
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)




RUN_FILES = (metrics_lib.FILENAME, "config.json", "run.json", STUDY_FILE)


def localize(workdir: str, cache_dir: str | None = None, force_copy: bool = False) -> str:
  """A local directory with the run files of `workdir` (metrics, configs; no checkpoints).

  Local paths are returned as they are; `gs://...` (any path TensorFlow's gfile reads) is copied
  to `cache_dir` (default: a fresh temporary directory) first, so pandas and matplotlib can read it.
  """
  if "://" not in workdir and not force_copy:
    return workdir
  import tempfile
  import tensorflow as tf  # gfile reads gs://; imported only for remote paths
  local_root = cache_dir or tempfile.mkdtemp(prefix="normstudy_")
  for root, dirs, files in tf.io.gfile.walk(workdir):
    dirs[:] = [d for d in dirs if d.rstrip("/") != "checkpoints"]
    relative = os.path.relpath(root, workdir) if root != workdir else ""
    for name in files:
      if name in RUN_FILES:
        os.makedirs(os.path.join(local_root, relative), exist_ok=True)
        tf.io.gfile.copy(os.path.join(root, name), os.path.join(local_root, relative, name),
                         overwrite=True)
  return local_root


def find_runs(workdir: str) -> list[str]:
  """Run directories (those holding metrics.jsonl) below `workdir`: a study's variants in its
  config file's order (the legend order), then any others sorted by path."""
  runs = []
  for root, dirs, files in os.walk(workdir):
    dirs[:] = sorted(d for d in dirs if d != "checkpoints")
    if metrics_lib.FILENAME in files:
      runs.append(root)
  order = _read_json(os.path.join(workdir, STUDY_FILE)).get("variants", [])
  rank = {os.path.normpath(os.path.join(workdir, v)): i for i, v in enumerate(order)}
  return sorted(runs, key=lambda r: (rank.get(os.path.normpath(r), len(rank)), r))


def load_runs(workdir: str) -> pd.DataFrame:
  """Every run below `workdir` as a long table: run, label, step, metric, value.

  `run` is the run's path relative to `workdir`; `label` its `config.label` (else the run name).
  Run-level facts (entropy floor, warm-up steps) are in `df.attrs["runs"][run]`.
  """
  frames, infos = [], {}
  for run_dir in find_runs(workdir):
    run = os.path.relpath(run_dir, workdir)
    records = list(metrics_lib.read_records(os.path.join(run_dir, metrics_lib.FILENAME)))
    if not records:
      continue
    info = _read_json(os.path.join(run_dir, "run.json"))
    config = _read_json(os.path.join(run_dir, "config.json"))
    label = config.get("label") or info.get("label") or run
    infos[run] = {
        "label": label,
        "entropy_floor": info.get("entropy_floor"),
        "warmup_steps": config.get("optimizer", {}).get("warmup_steps", 0),
        "num_steps": config.get("train", {}).get("num_steps"),
    }
    wide = pd.DataFrame.from_records(records)
    long = wide.melt(id_vars="step", var_name="metric", value_name="value").dropna(
        subset=["value"])
    long["value"] = long["value"].astype(float)
    long.insert(0, "label", label)
    long.insert(0, "run", run)
    frames.append(long)
  columns = ["run", "label", "step", "metric", "value"]
  df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
  df = df[columns]
  df.attrs["runs"] = infos
  return df


def series(df: pd.DataFrame, run: str, metric: str) -> pd.Series:
  """One run's metric as a Series indexed by step."""
  rows = df[(df.run == run) & (df.metric == metric)]
  return pd.Series(rows.value.to_numpy(), index=rows.step.to_numpy(), name=metric)


def smooth(values: pd.Series, weight: float) -> pd.Series:
  """TensorBoard-style exponential moving average (weight 0 = raw), debiased at the start."""
  if weight <= 0:
    return values
  out, last, norm = [], 0.0, 0.0
  for v in values.to_numpy():
    if np.isfinite(v):
      last = weight * last + (1 - weight) * v
      norm = weight * norm + (1 - weight)
    out.append(last / norm if norm else np.nan)
  return pd.Series(out, index=values.index, name=values.name)


def _k_formatter(value, _):
  return f"{value / 1000:g}K"


DEFAULT_SMOOTHING = 0.8


def plot_comparison(df: pd.DataFrame, path: str, smoothing: float = DEFAULT_SMOOTHING) -> str:
  """The study's figure: loss (top, with the entropy floor) and fp16 loss scale (bottom, log2)."""
  # A bare Figure draws without pyplot, so a notebook's inline backend is left alone.
  from matplotlib.figure import Figure
  from matplotlib.ticker import FuncFormatter

  infos = df.attrs.get("runs", {})
  fig = Figure(figsize=(9, 7))
  loss_ax, scale_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
  floors = set()
  for i, run in enumerate(df.run.unique()):
    color = COLORS[i % len(COLORS)]
    label = infos.get(run, {}).get("label", run)
    raw = series(df, run, "loss")
    markevery = max(1, len(raw) // 40)
    style = dict(color=color, marker="o", markersize=2.5, linewidth=1.0, markevery=markevery)
    if smoothing > 0:  # the raw curve stays visible behind its average
      loss_ax.plot(raw.index, raw.values, color=color, linewidth=0.6, alpha=0.25)
    loss = smooth(raw, smoothing)
    loss_ax.plot(loss.index, loss.values, label=label, **style)
    scale = series(df, run, "loss_scale")
    scale_ax.plot(scale.index, scale.values, label=label, **style)
    floor = infos.get(run, {}).get("entropy_floor")
    if floor is not None:
      floors.add(round(floor, 6))
  for floor in sorted(floors):
    loss_ax.axhline(floor, color="black", linestyle="--", linewidth=1.0,
                    label=f"entropy floor ({floor:.3f} nats/token)")
  loss_ax.set_ylabel("Training Loss" + (f" (EMA {smoothing:g})" if smoothing > 0 else ""))
  loss_ax.set_title("Training Loss Comparison")
  loss_ax.grid(alpha=0.3)
  loss_ax.legend(fontsize=8)
  scale_ax.set_yscale("log", base=2)
  scale_ax.set_ylabel("Loss Scale (fp16)")
  scale_ax.set_xlabel("Training Step")
  scale_ax.grid(alpha=0.3)
  scale_ax.xaxis.set_major_formatter(FuncFormatter(_k_formatter))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


# Spike detection (documented in the README, "Observations"): a step spikes when its value exceeds
# the rolling median of the previous SPIKE_WINDOW logged steps by more than
# max(SPIKE_MIN_MARGIN, SPIKE_NOISE_FACTOR * sigma), sigma the step-to-step noise estimated from
# the rolling median of |successive differences| (robust to the trend of a falling loss);
# consecutive spiking steps form one spike. Gradient norms are compared on a log scale, with a
# margin of at least log(5).
SPIKE_WINDOW = 50
SPIKE_MIN_PERIODS = 10
SPIKE_MIN_MARGIN = 0.25
SPIKE_NOISE_FACTOR = 6.0
GRAD_SPIKE_LOG_MARGIN = float(np.log(5.0))


def spikes(values: pd.Series, min_margin: float = SPIKE_MIN_MARGIN,
           window: int = SPIKE_WINDOW) -> list[dict]:
  """Spike events of a series indexed by step: [{"step", "end_step", "excursion"}] where
  excursion is the largest excess over the trend (the rolling median) during the event."""
  finite = values[np.isfinite(values.to_numpy(dtype=float))]
  trend = finite.shift(1).rolling(window, min_periods=SPIKE_MIN_PERIODS).median()
  # For Gaussian noise, median |x_t - x_{t-1}| = 0.6745 * sqrt(2) * sigma.
  sigma = finite.diff().abs().shift(1).rolling(window, min_periods=SPIKE_MIN_PERIODS).median() / (
      0.6745 * np.sqrt(2))
  excess = finite - trend
  margin = np.maximum(min_margin, SPIKE_NOISE_FACTOR * sigma)
  flagged = (excess > margin).to_numpy()
  events, current = [], None
  for step, is_spike, value in zip(finite.index, flagged, excess.to_numpy()):
    if is_spike:
      if current is None:
        current = {"step": int(step), "end_step": int(step), "excursion": float(value)}
      else:
        current["end_step"] = int(step)
        current["excursion"] = max(current["excursion"], float(value))
    elif current is not None:
      events.append(current)
      current = None
  if current is not None:
    events.append(current)
  return events


def divergence_step(loss: pd.Series, warmup_steps: int):
  """First step with a non-finite loss, or after warm-up with a loss above the first logged
  loss; None if the run never diverged."""
  values = loss.to_numpy(dtype=float)
  bad = ~np.isfinite(values)
  if len(values):
    bad |= (loss.index.to_numpy() > warmup_steps) & (values > values[0])
  return int(loss.index[bad][0]) if bad.any() else None


def scale_collapses(scale: pd.Series) -> dict:
  """Halvings of the fp16 loss scale: count, rate per 1K steps, and the lowest scale a halving
  reached with its step (None when the scale never fell)."""
  values = scale.to_numpy(dtype=float)
  fell = np.flatnonzero(values[1:] < values[:-1]) + 1 if len(values) > 1 else np.array([], int)
  span = max(int(scale.index.max()), 1) if len(values) else 1
  lowest = None
  if len(fell):
    at = fell[np.argmin(values[fell])]
    lowest = (float(values[at]), int(scale.index[at]))
  return {"scale_halvings": len(fell), "halvings_per_1k": 1000.0 * len(fell) / span,
          "lowest_scale": lowest[0] if lowest else np.nan,
          "lowest_scale_step": lowest[1] if lowest else None}


def observe(df: pd.DataFrame, run: str) -> dict:
  """The stability observations of one run, as numbers."""
  info = df.attrs.get("runs", {}).get(run, {})
  loss = series(df, run, "loss")
  grad_norm = series(df, run, "grad_norm")
  loss_spikes = spikes(loss)
  log_grad = np.log(grad_norm[grad_norm > 0])
  grad_spikes = spikes(log_grad, min_margin=GRAD_SPIKE_LOG_MARGIN)
  clipped = series(df, run, "clipped")
  return {
      "loss_spikes": len(loss_spikes),
      "first_spike_step": loss_spikes[0]["step"] if loss_spikes else None,
      "largest_spike": max((e["excursion"] for e in loss_spikes), default=0.0),
      "spike_events": loss_spikes,
      "diverged_at": divergence_step(loss, info.get("warmup_steps", 0)),
      "grad_norm_spikes": len(grad_spikes),
      "first_grad_spike_step": grad_spikes[0]["step"] if grad_spikes else None,
      "clipped_fraction": float(clipped.mean()) if len(clipped) else 0.0,
      **scale_collapses(series(df, run, "loss_scale")),
  }


def summarize(df: pd.DataFrame) -> pd.DataFrame:
  """One row per run: label, steps, final/min loss, max loss after warm-up, final eval loss,
  skipped steps, lowest and final loss scale, and the observation counts (see `observe`)."""
  infos = df.attrs.get("runs", {})
  rows = []
  for run in df.run.unique():
    info = infos.get(run, {})
    loss = series(df, run, "loss")
    after_warmup = loss[loss.index > info.get("warmup_steps", 0)]
    eval_loss = series(df, run, "eval_loss")
    scale = series(df, run, "loss_scale")
    skipped_total = series(df, run, "skipped_total")
    seen = observe(df, run)
    rows.append({
        "run": run,
        "label": info.get("label", run),
        "steps": int(loss.index.max()),
        "final_loss": loss.iloc[-1],
        "min_loss": loss.min(),
        "max_loss_after_warmup": after_warmup.max() if len(after_warmup) else np.nan,
        "final_eval_loss": eval_loss.iloc[-1] if len(eval_loss) else np.nan,
        "skipped_steps": int(skipped_total.iloc[-1]) if len(skipped_total) else 0,
        "min_loss_scale": scale.min(),
        "final_loss_scale": scale.iloc[-1],
        "entropy_floor": info.get("entropy_floor"),
        "loss_spikes": seen["loss_spikes"],
        "first_spike_step": seen["first_spike_step"],
        "largest_spike": seen["largest_spike"],
        "diverged_at": seen["diverged_at"],
        "scale_halvings": seen["scale_halvings"],
        "halvings_per_1k": seen["halvings_per_1k"],
        "grad_norm_spikes": seen["grad_norm_spikes"],
        "clipped_fraction": seen["clipped_fraction"],
    })
  return pd.DataFrame(rows)


def _times(count: int) -> str:
  return "once" if count == 1 else f"{count} times"


def _steps(step) -> str:
  return f"{step / 1000:.1f}K" if step >= 1000 else str(int(step))


def _power_of_two(value: float) -> str:
  exponent = np.log2(value) if value > 0 else np.nan
  return f"2^{int(exponent)}" if np.isfinite(exponent) and exponent == int(exponent) \
      else f"{value:g}"


def layer_values(df: pd.DataFrame, run: str, metric: str) -> pd.DataFrame:
  """Telemetry `metric/layer_<i>` of a run as a table: rows = layers, columns = steps."""
  rows = df[(df.run == run) & df.metric.str.startswith(f"{metric}/layer_")]
  if rows.empty:
    return pd.DataFrame()
  table = rows.assign(layer=rows.metric.str.rsplit("_", n=1).str[-1].astype(int)).pivot(
      index="layer", columns="step", values="value")
  return table.sort_index()


def describe_run(df: pd.DataFrame, run: str) -> str:
  """A few sentences with numbers and steps about one run, generated from its records."""
  info = df.attrs.get("runs", {}).get(run, {})
  seen = observe(df, run)
  loss = series(df, run, "loss")
  eval_loss = series(df, run, "eval_loss")
  parts = [f"Trained {_steps(loss.index.max())} steps; final loss {loss.iloc[-1]:.3f}"
           + (f", final eval loss {eval_loss.iloc[-1]:.3f}" if len(eval_loss) else "")
           + (f" (entropy floor {info['entropy_floor']:.3f})" if info.get("entropy_floor")
              else "") + "."]
  if seen["loss_spikes"]:
    parts.append(f"Loss spiked {_times(seen['loss_spikes'])}, "
                 f"first at step {_steps(seen['first_spike_step'])}, largest "
                 f"+{seen['largest_spike']:.2f} above trend.")
  else:
    parts.append("No loss spikes.")
  if seen["diverged_at"] is not None:
    parts.append(f"It diverged at step {_steps(seen['diverged_at'])}.")
  scale = series(df, run, "loss_scale")
  if len(scale) and scale.max() > 1 and seen["scale_halvings"]:
    parts.append(f"The fp16 loss scale was halved {_times(seen['scale_halvings'])} "
                 f"({seen['halvings_per_1k']:.1f} per 1K steps) and fell as low as "
                 f"{_power_of_two(seen['lowest_scale'])} at step "
                 f"{_steps(seen['lowest_scale_step'])}; final {_power_of_two(scale.iloc[-1])}.")
  elif len(scale) and scale.max() > 1:
    parts.append(f"The fp16 loss scale never fell (final {_power_of_two(scale.iloc[-1])}).")
  skipped = series(df, run, "skipped_total")
  if len(skipped) and skipped.iloc[-1]:
    parts.append(f"{int(skipped.iloc[-1])} updates were skipped for non-finite gradients.")
  parts.append(f"Gradient clipping acted on {seen['clipped_fraction']:.0%} of logged steps"
               + (f"; the gradient norm spiked {_times(seen['grad_norm_spikes'])}, first at step "
                  f"{_steps(seen['first_grad_spike_step'])}." if seen["grad_norm_spikes"]
                  else "; no gradient-norm spikes."))
  logits = layer_values(df, run, "attn_logit_max")
  if not logits.empty:
    layer, step = np.unravel_index(np.nanargmax(logits.to_numpy()), logits.shape)
    parts.append(f"The largest attention logit was {logits.to_numpy()[layer, step]:.1f} "
                 f"(layer {logits.index[layer]}, step {_steps(logits.columns[step])}).")
  rms = layer_values(df, run, "act_rms")
  if not rms.empty and rms.shape[1] > 1:
    last = rms.iloc[-1]
    parts.append(f"Activation RMS after the last layer went from {last.iloc[0]:.2f} to "
                 f"{last.iloc[-1]:.2f}.")
  return " ".join(parts)


def compare_runs(summary: pd.DataFrame) -> str:
  """Sentences comparing runs, from the summary table."""
  if len(summary) < 2:
    return "Only one run; nothing to compare."
  parts = []
  by_eval = summary.dropna(subset=["final_eval_loss"]).sort_values("final_eval_loss")
  if len(by_eval) >= 2:
    best, worst = by_eval.iloc[0], by_eval.iloc[-1]
    parts.append(f"Lowest final eval loss: {best.label} ({best.final_eval_loss:.3f}); highest: "
                 f"{worst.label} ({worst.final_eval_loss:.3f}), a gap of "
                 f"{worst.final_eval_loss - best.final_eval_loss:.3f}.")
  most, fewest = summary.loss_spikes.max(), summary.loss_spikes.min()
  if most == fewest:
    parts.append("No run had a loss spike." if most == 0 else
                 f"Every run had {int(most)} loss spike{'s' if most > 1 else ''}.")
  else:
    spiky = summary[summary.loss_spikes == most]
    calm = summary[summary.loss_spikes == fewest]
    parts.append(f"Most loss spikes: {', '.join(spiky.label)} ({int(most)}); fewest: "
                 f"{', '.join(calm.label)} ({int(fewest)}).")
  diverged = summary[summary.diverged_at.notna()]
  parts.append(f"Diverged: {', '.join(diverged.label)}." if len(diverged) else
               "No run diverged.")
  if (summary.scale_halvings > 0).any():
    final = summary.sort_values("final_loss_scale").iloc[0]
    halved = summary.sort_values("scale_halvings", ascending=False).iloc[0]
    parts.append(f"Most loss-scale halvings: {halved.label} ({int(halved.scale_halvings)}); "
                 f"lowest final loss scale: {final.label} "
                 f"({_power_of_two(final.final_loss_scale)}).")
  clipped = summary.sort_values("clipped_fraction", ascending=False)
  parts.append("Share of steps clipped: " + ", ".join(
      f"{row.label} {row.clipped_fraction:.0%}" for row in clipped.itertuples()) + ".")
  return " ".join(parts)


def write_observations(df: pd.DataFrame, summary: pd.DataFrame, path: str) -> str:
  lines = ["# Observations", "",
           f"Generated by normstudy.analysis from {len(summary)} run(s). A loss spike is a "
           f"step more than max({SPIKE_MIN_MARGIN}, {SPIKE_NOISE_FACTOR:g} sigma) above the "
           f"median of the previous {SPIKE_WINDOW} logged steps, sigma the step-to-step noise; "
           "consecutive such steps count once.", ""]
  for run, label in zip(summary.run, summary.label):
    lines += [f"## {label}", "", describe_run(df, run), ""]
  lines += ["## Comparison", "", compare_runs(summary), ""]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return path


HEATMAP_METRICS = ("attn_logit_max", "act_rms", "grad_norm")


def plot_layer_heatmaps(df: pd.DataFrame, workdir: str) -> dict:
  """layers_<metric>.png for each telemetry metric present: layer x step, one panel per run."""
  from matplotlib.colors import LogNorm
  from matplotlib.colors import Normalize
  from matplotlib.figure import Figure
  from matplotlib.ticker import FuncFormatter

  infos = df.attrs.get("runs", {})
  written = {}
  for metric in HEATMAP_METRICS:
    tables = {run: layer_values(df, run, metric) for run in df.run.unique()}
    tables = {run: t for run, t in tables.items() if not t.empty}
    if not tables:
      continue
    values = np.concatenate([t.to_numpy().ravel() for t in tables.values()])
    values = values[np.isfinite(values)]
    # One colour scale for all panels; logarithmic when every value is positive.
    norm = (LogNorm(values.min(), values.max()) if len(values) and values.min() > 0
            else Normalize(values.min(), values.max()) if len(values) else None)
    fig = Figure(figsize=(3.6 * len(tables) + 1.2, 3.2), layout="constrained")
    axes = fig.subplots(1, len(tables), squeeze=False, sharey=True)
    for ax, (run, table) in zip(axes[0], tables.items()):
      steps = table.columns.to_numpy()
      image = ax.imshow(table.to_numpy(), aspect="auto", origin="lower", norm=norm,
                        cmap="viridis", interpolation="nearest",
                        extent=(steps.min(), steps.max(), -0.5, len(table) - 0.5))
      ax.set_title(infos.get(run, {}).get("label", run), fontsize=8)
      ax.set_xlabel("Training Step")
      ax.xaxis.set_major_formatter(FuncFormatter(_k_formatter))
      ax.set_yticks(range(len(table)))
      ax.set_yticklabels([str(i) for i in table.index])
    axes[0][0].set_ylabel("Layer")
    fig.colorbar(image, ax=axes[0].tolist(), label=metric)
    fig.suptitle(f"Per-layer {metric}")
    path = os.path.join(workdir, f"layers_{metric}.png")
    fig.savefig(path, dpi=110)
    written[f"layers_{metric}"] = path
  return written


class NoRunsError(ValueError):
  """A directory holds no run to analyse."""


def analyze(workdir: str, smoothing: float = DEFAULT_SMOOTHING) -> dict:
  """Writes loss_comparison.png, summary.csv, observations.md and (with telemetry)
  layers_<metric>.png into `workdir`; returns their paths."""
  df = load_runs(workdir)
  if df.empty:
    raise NoRunsError(f"no run with a metrics.jsonl below {workdir!r}")
  figure = plot_comparison(df, os.path.join(workdir, "loss_comparison.png"), smoothing)
  table = os.path.join(workdir, "summary.csv")
  summary = summarize(df)
  summary.to_csv(table, index=False)
  observations = write_observations(df, summary, os.path.join(workdir, "observations.md"))
  return {"figure": figure, "summary": table, "observations": observations,
          **plot_layer_heatmaps(df, workdir)}
