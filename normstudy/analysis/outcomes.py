"""How each run of a learning-rate search or sweep ended, one class per run (outcomes.csv):

  halted: loss scale      float16's loss scale reached its floor (fairseq's loss-scale collapse)
  halted: non-finite      a non-finite gradient stopped it (float32/bfloat16, no loss scaling)
  diverged: non-finite    it finished, but its loss went non-finite (recorded, not halted)
  diverged: loss up       it finished with every logged loss after warm-up above its first
                          (normstudy.records.schema.diverged_at)
  not learning            it finished without diverging, with its final eval loss at or above
                          the learning threshold (halfway from the unigram entropy to the loss
                          floor): alive, but on the plateau of a model that uses no context
  learning                it finished below the threshold
The first four are what the search counts as failing; "not learning" is alive by that judgement,
so a critical learning rate is where runs stop surviving, not where they stop learning.
Per arm (and group) and class: the runs and their learning rates' range.
"""

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.records import schema

CLASSES = ("halted: loss scale", "halted: non-finite", "diverged: non-finite",
           "diverged: loss up", "not learning", "learning")


def outcome(row, threshold: float) -> str:
  """The class of one run of sensitivity.table's rows."""
  if row.status == schema.HALTED:
    return CLASSES[0] if "loss scale" in str(row.halt_reason) else CLASSES[1]
  if row.status == schema.DIVERGED:
    return CLASSES[2] if not np.isfinite(row.final_eval_loss) else CLASSES[3]
  if not np.isfinite(row.final_eval_loss) or row.final_eval_loss >= threshold:
    return CLASSES[4]
  return CLASSES[5]


def table(runs: pd.DataFrame) -> pd.DataFrame:
  """outcomes.csv from sensitivity.table's runs (those that finished training or stopped)."""
  threshold = runs_lib.learning_threshold(runs)
  runs = runs[runs.status != schema.RUNNING]
  classes = [outcome(row, threshold) for row in runs.itertuples()]
  runs = runs.assign(outcome=classes)
  rows = []
  for (group, arm), mine in runs.groupby(["group", "arm"], sort=False):
    for name in CLASSES:
      these = mine[mine.outcome == name]
      rows.append({"arm": arm, "label": mine.arm_label.iloc[0], "group": group,
                   "outcome": name, "runs": len(these),
                   "lr_min": these.learning_rate.min() if len(these) else np.nan,
                   "lr_max": these.learning_rate.max() if len(these) else np.nan,
                   "threshold": threshold})
  return pd.DataFrame(rows)


def observations(outcomes: pd.DataFrame) -> str:
  lines = [f"How the runs ended (outcomes.csv; not learning: finished at or above "
           f"{outcomes.threshold.iloc[0]:.3f} nats, halfway from the unigram entropy to the "
           "loss floor):"]
  for (group, arm), mine in outcomes.groupby(["group", "arm"], sort=False):
    seen = mine[mine.runs > 0]
    parts = [f"{r.outcome} {r.runs} (lr {r.lr_min:.3g}-{r.lr_max:.3g})" for r in seen.itertuples()]
    lines.append(f"- {mine.label.iloc[0]}" + (f" ({group})" if group else "") + ": "
                 + "; ".join(parts) + ".")
  return "\n".join(lines)
