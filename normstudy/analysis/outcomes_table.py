"""How each run of a learning-rate search or sweep ended (outcomes.csv): per arm (and group) and
outcome, the runs, their learning rates' range and the recoveries among them.

The outcomes are the failure rule's (normstudy.records.outcomes, judged from each run's records
when it is loaded): halted by the loss scale or non-finite, diverged non-finite or with its loss
up (what the search counts as failing), and, for runs that survived, learning, not learning
(alive but at or above the learning threshold: halfway from the unigram entropy to the loss
floor, on the plateau of a model that uses no context) or alive (no threshold known). A
critical learning rate is where runs stop surviving, not where they stop learning.
"""

import numpy as np
import pandas as pd

from normstudy.analysis import runs as runs_lib
from normstudy.records import outcomes as outcomes_lib

# Every outcome a run that ended can have, in the failure rule's order.
CLASSES = tuple(k for k in outcomes_lib.KINDS if k != outcomes_lib.UNFINISHED)


def table(runs: pd.DataFrame) -> pd.DataFrame:
  """outcomes.csv from sensitivity.table's runs (those that ended: every outcome but
  unfinished)."""
  threshold = runs_lib.learning_threshold(runs)
  runs = runs[runs.outcome != outcomes_lib.UNFINISHED]
  rows = []
  for (group, arm), mine in runs.groupby(["group", "arm"], sort=False):
    for name in CLASSES:
      these = mine[mine.outcome == name]
      rows.append({"arm": arm, "label": mine.arm_label.iloc[0], "group": group,
                   "outcome": name, "runs": len(these),
                   "lr_min": these.learning_rate.min() if len(these) else np.nan,
                   "lr_max": these.learning_rate.max() if len(these) else np.nan,
                   "recoveries": int(these.recoveries.sum()) if len(these) else 0,
                   "threshold": threshold})
  return pd.DataFrame(rows)


def observations(outcomes: pd.DataFrame) -> str:
  lines = [f"How the runs ended (outcomes.csv; the failure rule, normstudy.records.outcomes: a "
           "run fails when it halts or its loss stays non-finite or above its start for "
           f"{outcomes_lib.PERSIST_STEPS} steps to its end; a stretch of skipped or non-finite "
           "steps it went on from is a recovery; not learning: finished at or above "
           f"{outcomes.threshold.iloc[0]:.3f} nats, halfway from the unigram entropy to the "
           "loss floor):"]
  for (group, arm), mine in outcomes.groupby(["group", "arm"], sort=False):
    seen = mine[mine.runs > 0]
    parts = [f"{r.outcome} {r.runs} (lr {r.lr_min:.3g}-{r.lr_max:.3g}"
             + (f", {r.recoveries} recover{'y' if r.recoveries == 1 else 'ies'}"
                if r.recoveries else "") + ")" for r in seen.itertuples()]
    lines.append(f"- {mine.label.iloc[0]}" + (f" ({group})" if group else "") + ": "
                 + "; ".join(parts) + ".")
  return "\n".join(lines)
