"""Instability detectors on recorded trajectories: loss and gradient-norm spikes, divergence,
fp16 loss-scale collapse, and the observations of one run as numbers.

Definitions (docs/reference.md, "Stability telemetry and observations"):
- A step spikes when its value exceeds the rolling median of the previous SPIKE_WINDOW logged
  steps by more than max(SPIKE_MIN_MARGIN, SPIKE_NOISE_FACTOR * sigma), sigma the step-to-step
  noise (the rolling median of |successive differences| / (0.6745 sqrt 2), which a falling trend
  does not inflate). It uses what history there is, from SPIKE_MIN_HISTORY earlier points on, so
  a spike in the first logged steps is seen too; consecutive spiking steps form one spike.
  Gradient norms are compared on a log scale with a margin of at least log(5).
- Failure (halted, or diverged: a non-finite loss, or a loss above its start after warm-up, that
  persists to the end) and recovery: the failure rule, normstudy.records.outcomes, which a search
  judges its runs by; a spike that recovers is a spike, not a divergence.
- Loss-scale collapse: halvings of the fp16 scale, their rate per 1K steps, the lowest scale.
"""

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.records import schema

SPIKE_WINDOW = 50
SPIKE_MIN_HISTORY = 3
SPIKE_MIN_MARGIN = 0.25
SPIKE_NOISE_FACTOR = 6.0
GRAD_SPIKE_LOG_MARGIN = float(np.log(5.0))


def spikes(values: pd.Series, min_margin: float = SPIKE_MIN_MARGIN,
           window: int = SPIKE_WINDOW) -> list[dict]:
  """Spike events of a series indexed by step: [{"step", "end_step", "excursion"}] where
  excursion is the largest excess over the trend (the rolling median) during the event."""
  finite = values[np.isfinite(values.to_numpy(dtype=float))]
  trend = finite.shift(1).rolling(window, min_periods=SPIKE_MIN_HISTORY).median()
  # For Gaussian noise, median |x_t - x_{t-1}| = 0.6745 * sqrt(2) * sigma. With fewer than two
  # differences the noise is unknown and the fixed margin decides alone.
  sigma = finite.diff().abs().shift(1).rolling(window, min_periods=2).median() / (
      0.6745 * np.sqrt(2))
  excess = finite - trend
  margin = np.maximum(min_margin, SPIKE_NOISE_FACTOR * sigma.fillna(0.0))
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


def lowest_scale_after_first_fall(scale: pd.Series) -> float:
  """The lowest fp16 loss scale from the scaler's first fall (its first overflow) on: the level
  overflows drove it to, not a step of its climb from the initial scale (which min over the run
  reports: 256 for every seed-figure run, whose scales settled at 2^15-2^16); the lowest overall
  when it never fell, NaN without a scale."""
  values = scale.to_numpy(dtype=float)
  if not len(values):
    return np.nan
  fell = np.flatnonzero(values[1:] < values[:-1])
  return float(np.nanmin(values[fell[0] + 1:] if len(fell) else values))


def observe(loaded: runs_lib.Runs, run: str) -> dict:
  """The stability observations of one run, as numbers; its status, outcome and recoveries as
  the failure rule judges them (normstudy.records.outcomes)."""
  facts = loaded[run]
  loss = loaded.series(run, "loss")
  grad_norm = loaded.series(run, "grad_norm")
  loss_spikes = spikes(loss)
  positive = grad_norm[grad_norm > 0]
  grad_spikes = spikes(np.log(positive), min_margin=GRAD_SPIKE_LOG_MARGIN)
  clipped = loaded.series(run, "clipped")
  ended = facts.outcome
  return {
      "status": facts.status,
      "outcome": ended.kind,
      "recoveries": ended.recoveries,
      "loss_spikes": len(loss_spikes),
      "first_spike_step": loss_spikes[0]["step"] if loss_spikes else None,
      "largest_spike": max((e["excursion"] for e in loss_spikes), default=0.0),
      "spike_events": loss_spikes,
      "diverged_at": ended.failed_at if facts.status == schema.DIVERGED else None,
      "grad_norm_spikes": len(grad_spikes),
      "first_grad_spike_step": grad_spikes[0]["step"] if grad_spikes else None,
      "clipped_fraction": float(clipped.mean()) if len(clipped) else 0.0,
      **scale_collapses(loaded.series(run, "loss_scale")),
  }
