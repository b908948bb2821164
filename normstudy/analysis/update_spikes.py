"""Do update-norm spikes come before loss spikes? (issue 43; marin #1368/#1390 saw update-norm
spikes precede loss spikes, which skipping steps then did not prevent.)

Per run, the loss spikes (normstudy.analysis.detectors.spikes, as the summary counts them) and
the update-norm spikes: the same detector on log10 of the recorded `update_norm` (the step's
whole update), with a margin of UPDATE_MARGIN decades (a doubling above its trend) or its noise
rule, whichever is larger. A loss spike at step s is *preceded* when an update-norm spike starts
at a step in [s - PRECEDE_STEPS, s - 1]: the update of step t first shows in the loss of step
t + 1. spikes.csv, one row per run that recorded update norms:

  run, label, loss_spikes, update_spikes, preceded (loss spikes preceded by an update spike),
  loss_spike_steps, update_spike_steps (space-separated first steps)

and a sentence for the observations: over all runs, the share of loss spikes preceded, beside
the share expected by chance (the fraction of the logged steps that lie within PRECEDE_STEPS
after some update-norm spike start), with the exact binomial test of the one against the other.
"""

import math
import os

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from normstudy.analysis import detectors
from normstudy.analysis import runs as runs_lib
from normstudy.records import keys

UPDATE_MARGIN = math.log10(2.0)
PRECEDE_STEPS = 10
COLUMNS = ["run", "label", "loss_spikes", "update_spikes", "preceded", "loss_spike_steps",
           "update_spike_steps", "steps", "steps_after_update_spikes"]


def _after(steps: np.ndarray, starts: list) -> np.ndarray:
  """Which of `steps` lie in [start + 1, start + PRECEDE_STEPS] of some start."""
  hit = np.zeros(len(steps), bool)
  for start in starts:
    hit |= (steps > start) & (steps <= start + PRECEDE_STEPS)
  return hit


def table(loaded: runs_lib.Runs) -> pd.DataFrame:
  """spikes.csv's rows (empty when no run recorded update norms)."""
  rows = []
  for run, facts in loaded.runs.items():
    norms = loaded.series(run, keys.UPDATE_NORM)
    norms = norms[np.isfinite(norms.to_numpy(dtype=float)) & (norms.to_numpy(dtype=float) > 0)]
    if norms.empty:
      continue
    loss_starts = [e["step"] for e in detectors.spikes(loaded.series(run, keys.LOSS))]
    update_starts = [e["step"] for e in detectors.spikes(np.log10(norms), UPDATE_MARGIN)]
    steps = np.asarray(loaded.series(run, keys.LOSS).index)
    preceded = int(_after(np.asarray(loss_starts), update_starts).sum()) if loss_starts else 0
    rows.append({"run": run, "label": facts.label, "loss_spikes": len(loss_starts),
                 "update_spikes": len(update_starts), "preceded": preceded,
                 "loss_spike_steps": " ".join(map(str, loss_starts)),
                 "update_spike_steps": " ".join(map(str, update_starts)),
                 "steps": len(steps),
                 "steps_after_update_spikes": int(_after(steps, update_starts).sum())})
  return pd.DataFrame(rows, columns=COLUMNS)


def test(spiked: pd.DataFrame) -> dict:
  """Over all runs: loss spikes, how many preceded, the chance share (steps after update
  spikes / steps) and the two-sided exact binomial p of preceded against it."""
  n = int(spiked.loss_spikes.sum())
  k = int(spiked.preceded.sum())
  chance = float(spiked.steps_after_update_spikes.sum() / max(spiked.steps.sum(), 1))
  p = float(scipy_stats.binomtest(k, n, chance).pvalue) if n and 0 < chance < 1 else math.nan
  return {"loss_spikes": n, "preceded": k, "chance": chance, "p": p}


def analyze(loaded: runs_lib.Runs, workdir: str) -> tuple[dict, str]:
  """Writes spikes.csv when runs recorded update norms; returns (paths, observations)."""
  from normstudy.analysis import stats
  spiked = table(loaded)
  if spiked.empty:
    return {}, ""
  path = os.path.join(workdir, "spikes.csv")
  spiked.to_csv(path, index=False)
  got = test(spiked)
  if not got["loss_spikes"]:
    return {"spikes": path}, ("Update-norm spikes: no loss spike in any run; "
                              f"{int(spiked.update_spikes.sum())} update-norm spike(s).")
  text = (f"Update-norm spikes before loss spikes: {got['preceded']} of {got['loss_spikes']} loss "
          f"spikes had an update-norm spike start within the {PRECEDE_STEPS} steps before "
          f"them, against {got['chance']:.0%} of logged steps by chance (exact binomial test, "
          f"n = {got['loss_spikes']}, p = {stats.format_p(got['p'])}).")
  return {"spikes": path}, text
