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

# The seed figure's colours, in its legend order.
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:pink", "tab:purple", "tab:brown",
          "tab:gray", "tab:olive", "tab:cyan", "tab:red")


def _read_json(path):
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


STUDY_FILE = "study.json"  # written by normstudy.study: the variants in the config file's order


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
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import FuncFormatter

  infos = df.attrs.get("runs", {})
  fig, (loss_ax, scale_ax) = plt.subplots(
      2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
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
  plt.close(fig)
  return path


def summarize(df: pd.DataFrame) -> pd.DataFrame:
  """One row per run: label, steps, final/min loss, max loss after warm-up, final eval loss,
  skipped steps, lowest and final loss scale."""
  infos = df.attrs.get("runs", {})
  rows = []
  for run in df.run.unique():
    info = infos.get(run, {})
    loss = series(df, run, "loss")
    after_warmup = loss[loss.index > info.get("warmup_steps", 0)]
    eval_loss = series(df, run, "eval_loss")
    scale = series(df, run, "loss_scale")
    skipped_total = series(df, run, "skipped_total")
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
    })
  return pd.DataFrame(rows)


class NoRunsError(ValueError):
  """A directory holds no run to analyse."""


def analyze(workdir: str, smoothing: float = DEFAULT_SMOOTHING) -> dict:
  """Writes loss_comparison.png and summary.csv into `workdir`; returns their paths."""
  df = load_runs(workdir)
  if df.empty:
    raise NoRunsError(f"no run with a metrics.jsonl below {workdir!r}")
  figure = plot_comparison(df, os.path.join(workdir, "loss_comparison.png"), smoothing)
  table = os.path.join(workdir, "summary.csv")
  summarize(df).to_csv(table, index=False)
  return {"figure": figure, "summary": table}
