"""Headroom: how far each series that can kill a run sits below its number format's limit, in
bits, on every telemetry step of every run, alive or not.

  headroom = log2(limit / |value|)        for an activation series (the limit: the largest
                                          finite value of the run's compute dtype, 65,504 in
                                          float16)
  headroom = log2(loss scale / min_scale) for the gradients of a float16 run with fairseq's
                                          dynamic scaler: halvings left before the floor,
                                          where an overflow halts the run (with min_scale 1
                                          this is the loss scale's log2)

A float16 run fails when a forward value passes 65,504 (the loss goes non-finite) or the scale
reaches its floor (normstudy.records.outcomes): the least headroom over the series reaching 0.
One bit is a factor of 2: a residual stream at 8,188 has 3 bits left.

The series (SERIES), each the largest over the layers at that step (`layer` says which):
  resid_absmax       the residual stream's largest |value| after a block (Pre-LN's killer)
  mlp_preact_absmax  the MLP activation's input (Post-LN's and DeepNorm's killer)
  attn_logit_max     the largest pre-softmax attention score
  output_logit_max   the output head's largest logit
  loss_scale         the gradients' headroom (float16 with a loss scaler only)
  least              the least of the above at that step, `layer` naming its series

The table (`table`, headroom.csv) has the columns COLUMNS: arm, parametrization, width (d_model),
depth (num_layers), step, seed, series, headroom first (issue 84's contract), then the run's
learning rate, dtype, the layer and the run's directory.
"""

import math

import numpy as np
import pandas as pd

from normstudy.records import keys

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65,504
# The largest finite value of each compute dtype (bfloat16: (2 - 2^-7) x 2^127).
LIMITS = {"float16": FLOAT16_MAX, "bfloat16": (2 - 2 ** -7) * 2.0 ** 127,
          "float32": float(np.finfo(np.float32).max)}
PER_LAYER = ("resid_absmax", "mlp_preact_absmax", "attn_logit_max")
GLOBAL = ("output_logit_max",)
LOSS_SCALE = keys.LOSS_SCALE
LEAST = "least"
SERIES = (*PER_LAYER, *GLOBAL, LOSS_SCALE, LEAST)
COLUMNS = ("arm", "parametrization", "width", "depth", "step", "seed", "series", "headroom",
           "learning_rate", "dtype", "layer", "run")


def bits(values, limit: float) -> np.ndarray:
  """log2(limit / |value|); NaN where the value is not finite or 0 (no headroom to measure)."""
  values = np.abs(np.asarray(values, dtype=float))
  with np.errstate(divide="ignore", invalid="ignore"):
    room = np.log2(limit / values)
  return np.where(np.isfinite(room), room, np.nan)


def scale_bits(scales, min_scale: float) -> np.ndarray:
  """log2(loss scale / min_scale): the halvings left before the scaler's floor."""
  scales = np.asarray(scales, dtype=float)
  with np.errstate(divide="ignore", invalid="ignore"):
    room = np.log2(scales / min_scale)
  return np.where(np.isfinite(room), room, np.nan)


def limit_of(dtype: str | None) -> float:
  """The largest finite value of a run's compute dtype (float32 when unrecorded)."""
  return LIMITS.get(dtype or "float32", LIMITS["float32"])


def run_series(loaded, run: str) -> pd.DataFrame:
  """One run's headroom on its telemetry steps: columns step, series, headroom, layer (the layer
  holding the series' largest value; for `least`, the series that is least). Empty without
  telemetry."""
  facts = loaded[run]
  limit = limit_of(facts.dtype)
  frames = {}
  for name in PER_LAYER:
    table = loaded.layer_values(run, name)  # layers x steps
    if table.empty or table.isna().all().all():
      continue
    room = pd.DataFrame(bits(table.to_numpy(), limit), index=table.index, columns=table.columns)
    filled = room.fillna(np.inf)
    least = filled.min(axis=0)
    frames[name] = pd.DataFrame({
        "step": room.columns.to_numpy(), "headroom": least.replace(np.inf, np.nan).to_numpy(),
        "layer": filled.idxmin(axis=0).astype(str).to_numpy()})
  if not frames:
    return pd.DataFrame(columns=["step", "series", "headroom", "layer"])
  steps = np.unique(np.concatenate([f.step.to_numpy() for f in frames.values()]))
  for name in GLOBAL:
    values = loaded.series(run, name)
    if len(values):
      frames[name] = pd.DataFrame({"step": values.index.to_numpy(),
                                   "headroom": bits(values.to_numpy(), limit), "layer": ""})
  if facts.min_scale is not None:
    scale = loaded.series(run, LOSS_SCALE)
    scale = scale[scale.index.isin(steps)]
    if len(scale):
      frames[LOSS_SCALE] = pd.DataFrame({
          "step": scale.index.to_numpy(), "headroom": scale_bits(scale.to_numpy(),
                                                                  facts.min_scale),
          "layer": ""})
  long = pd.concat([f.assign(series=name) for name, f in frames.items()], ignore_index=True)
  wide = long.pivot_table(index="step", columns="series", values="headroom", aggfunc="first")
  wide = wide.reindex(columns=[s for s in SERIES if s in wide.columns])
  least = pd.DataFrame({"step": wide.index.to_numpy(),
                        "headroom": wide.min(axis=1, skipna=True).to_numpy(),
                        "layer": wide.fillna(np.inf).idxmin(axis=1).to_numpy(),
                        "series": LEAST})
  least.loc[least.headroom.isna(), "layer"] = ""
  out = pd.concat([long, least], ignore_index=True)
  out["order"] = out.series.map({s: i for i, s in enumerate(SERIES)})
  out = out.sort_values(["order", "step"], kind="stable").drop(columns="order")
  return out[["step", "series", "headroom", "layer"]].reset_index(drop=True)


def table(loaded) -> pd.DataFrame:
  """headroom.csv: every run's `run_series` with its facts (COLUMNS)."""
  frames = []
  for run, facts in loaded.runs.items():
    rows = run_series(loaded, run)
    if rows.empty:
      continue
    rows.insert(0, "arm", facts.info.arm or run)
    rows.insert(1, "parametrization", facts.parametrization)
    rows.insert(2, "width", facts.d_model)
    rows.insert(3, "depth", facts.num_layers)
    rows.insert(5, "seed", facts.seed)
    rows["learning_rate"] = facts.learning_rate
    rows["dtype"] = facts.dtype
    rows["run"] = run
    frames.append(rows)
  if not frames:
    return pd.DataFrame(columns=list(COLUMNS))
  return pd.concat(frames, ignore_index=True)[list(COLUMNS)]


def observations(rows: pd.DataFrame) -> str:
  """A paragraph per run: its least headroom at its first and last telemetry step, the series
  that held it, and its lowest over the run."""
  lines = []
  for run, mine in rows[rows.series == LEAST].groupby("run", sort=False):
    mine = mine.dropna(subset=["headroom"])
    if mine.empty:
      continue
    first, last = mine.iloc[0], mine.iloc[-1]
    low = mine.loc[mine.headroom.idxmin()]
    lines.append(
        f"- `{run}`: least headroom {first.headroom:.1f} bits at step {first.step:.0f} "
        f"({first.layer}), {last.headroom:.1f} at step {last.step:.0f} ({last.layer}); its "
        f"lowest {low.headroom:.1f} at step {low.step:.0f} ({low.layer}). One bit is a factor "
        f"of 2 below the limit; 0 is failure.")
  if not lines:
    return ""
  return ("Headroom, log2(limit / value), of the series that can kill a float16 run (the "
          "residual stream's, the MLP pre-activations', the attention and output logits' "
          "largest |value|, and the loss scale's halvings before its floor), least over them "
          "(headroom.csv, headroom.png):\n\n" + "\n".join(lines))


def plot(rows: pd.DataFrame, path: str) -> str | None:
  """headroom.png: each run's least headroom against step, one line a run, the series that
  holds it in the legend's label; None without rows."""
  least = rows[rows.series == LEAST].dropna(subset=["headroom"])
  if least.empty:
    return None
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  fig, ax = plt.subplots(figsize=(8, 4.5))
  for run, mine in least.groupby("run", sort=False):
    held = mine.layer.value_counts().index[0]
    ax.plot(mine.step, mine.headroom, label=f"{run} (mostly {held})", lw=1.2)
  ax.axhline(0.0, color="k", lw=0.8)
  ax.set_xlabel("step")
  ax.set_ylabel("least headroom (bits below the limit)")
  ax.set_ylim(bottom=min(0.0, math.floor(least.headroom.min())) - 0.5)
  ax.set_title("Headroom to the number format's limit")
  ax.legend(fontsize=7, loc="best")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
