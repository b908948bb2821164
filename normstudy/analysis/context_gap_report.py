"""The context gap: how much worse each run predicts its masked segments when every token beyond
a window of them comes from another document (normstudy.context_gap measures it,
context_gap_rows.csv; normstudy.data.splice says how rows are spliced).

  context_gap.csv        per run: arm, seed, window, rows, tokens, loss_intact and loss_spliced
                         (nats per masked token), gap (spliced - intact), and over its rows the
                         paired t-test (t, p) and the exact sign test (rows_worse of
                         rows_differ beyond ROUNDING, sign_p)
  context_gap_tests.csv  per arm: its runs' mean gap with the 95% t interval over seeds; per
                         pair of arms, the difference of gaps paired by seed: paired t-test and
                         the exact paired permutation test, Holm-adjusted over the pairs

A gap is what the model takes from context beyond the window; a model that reads nothing there
has a gap of 0 up to float32 rounding: a spliced row goes through the model in another batch
than its intact row, which moves a row's summed loss by up to about 1e-7 nats per token. The
sign test counts a row whose spliced and intact losses are within ROUNDING nats per token as a
tie.
"""

import itertools
import os

import numpy as np
import pandas as pd

from normstudy.analysis import stats
from normstudy.records import schema

TABLE = "context_gap.csv"
TESTS = "context_gap_tests.csv"
ROUNDING = 1e-5  # nats per token: below it two losses of one row differ by rounding only


def per_run(rows: pd.DataFrame) -> pd.DataFrame:
  """context_gap.csv's table from the per-row measurement."""
  table = []
  for (arm, seed, run, window), group in rows.groupby(["arm", "seed", "run", "window"],
                                                      sort=True):
    tokens = group["tokens"].to_numpy(float)
    intact = group["loss_intact_sum"].to_numpy(float)
    spliced = group["loss_spliced_sum"].to_numpy(float)
    used = tokens > 0
    per_row_intact, per_row_spliced = intact[used] / tokens[used], spliced[used] / tokens[used]
    t, _, p = stats.paired_t(per_row_spliced, per_row_intact)
    differences = per_row_spliced - per_row_intact
    differences[np.abs(differences) < ROUNDING] = 0.0
    worse, differ, sign_p = stats.sign_test(differences, np.zeros_like(differences))
    loss_intact, loss_spliced = intact.sum() / tokens.sum(), spliced.sum() / tokens.sum()
    table.append({"arm": arm, "seed": int(seed), "run": run, "window": int(window),
                  "rows": int(used.sum()), "tokens": int(tokens.sum()),
                  "loss_intact": loss_intact, "loss_spliced": loss_spliced,
                  "gap": loss_spliced - loss_intact, "t": t, "p": p, "rows_worse": worse,
                  "rows_differ": differ, "sign_p": sign_p})
  return pd.DataFrame(table)


def tests(table: pd.DataFrame) -> pd.DataFrame:
  """context_gap_tests.csv's table: each arm's mean gap over seeds, each pair's difference."""
  out = []
  for arm, group in table.groupby("arm", sort=True):
    mean, low, high = stats.mean_interval(group["gap"])
    out.append({"comparison": arm, "n": len(group), "gap": mean, "gap_low": low,
                "gap_high": high})
  pairs = []
  by_arm = {arm: group.set_index("seed")["gap"] for arm, group in table.groupby("arm")}
  for a, b in itertools.combinations(sorted(by_arm), 2):
    seeds = sorted(set(by_arm[a].index) & set(by_arm[b].index))
    x, y = by_arm[a].loc[seeds].to_numpy(), by_arm[b].loc[seeds].to_numpy()
    t, _, p = stats.paired_t(x, y)
    pairs.append({"comparison": f"{a} - {b}", "n": len(seeds), "gap": float(np.mean(x - y)),
                  "t": t, "p": p, "p_permutation": stats.paired_permutation(x, y)})
  for pair, p_holm in zip(pairs, stats.holm([pair["p"] for pair in pairs])):
    pair["p_holm"] = p_holm
  return pd.DataFrame(out + pairs)


def analyze(workdir: str) -> dict:
  """Writes context_gap.csv and context_gap_tests.csv from workdir's context_gap_rows.csv;
  returns their paths."""
  rows = pd.read_csv(os.path.join(workdir, schema.CONTEXT_GAP_ROWS))
  missing = set(schema.CONTEXT_GAP_ROWS_COLUMNS) - set(rows.columns)
  if missing:
    raise ValueError(f"{schema.CONTEXT_GAP_ROWS} lacks the columns {sorted(missing)}")
  table = per_run(rows)
  outputs = {"context_gap": os.path.join(workdir, TABLE),
             "context_gap_tests": os.path.join(workdir, TESTS)}
  table.to_csv(outputs["context_gap"], index=False)
  tests(table).to_csv(outputs["context_gap_tests"], index=False)
  return outputs
