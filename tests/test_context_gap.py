"""The context gap (normstudy.context_gap): a model's masked segments predicted on intact rows and
on rows whose tokens beyond +-2 come from elsewhere."""

import csv
import os

import numpy as np
import pandas as pd
import pytest

from normstudy.analysis import context_gap_report as analysis
from normstudy.experiments import grid
from normstudy.records import schema
import inprocess
import runs


def _trained(tmp_path):
  """configs/attention.py's two arms (with and without attention), tiny, two seeds each, on the
  context language; returns the sweep's directory."""
  path = os.path.join(runs.REPO, "configs", "attention.py")
  root = tmp_path / "attention"
  trained = []
  for arm in ("attention", "no_attention"):
    for p in grid.points(path, arm, {"train.seed": [0, 1]}, {}):
      with p.config.unlocked():
        p.config.model.update(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=16,
                              vocab_size=32, conv_pos_groups=2)
        p.config.train.update(batch_size=4, num_steps=30, eval_every=30, eval_steps=2,
                              checkpoint_every=30, telemetry_every=0, tensorboard=False)
        p.config.data.update(data_dir=str(tmp_path / "tfds"), train_tokens=16384,
                             validation_tokens=4096)
        p.config.optimizer.warmup_steps = 3
      trained.append(grid.Run(f"{arm}/{p.name}", p.config, str(root / arm / p.name), arm,
                              point=p.point))
  statuses = inprocess.train_programs(trained, str(root))
  assert set(statuses.values()) == {schema.FINISHED}
  return root, trained


@pytest.mark.slow
def test_the_gap_is_zero_without_attention_and_the_intact_loss_is_the_eval_loss(tmp_path):
  root, trained = _trained(tmp_path)
  result = runs.run_inline("normstudy.context_gap", f"--workdir={root}")
  assert "context_gap_tests:" in result.stdout
  table = pd.read_csv(root / analysis.TABLE)
  assert len(table) == 4
  for run in trained:
    row = table[table["run"] == run.name].iloc[0]
    # The intact side is the loop's own evaluation: the same rows, masks and parameters.
    final = [r for r in runs.records(run.directory) if "eval_loss" in r][-1]
    assert row["loss_intact"] == pytest.approx(final["eval_loss"], rel=1e-5)
    if run.arm == "no_attention":  # sees +-2 tokens only: the same losses up to rounding
      assert abs(row["gap"]) < 1e-6 and row["rows_differ"] == 0
    else:
      assert abs(row["gap"]) > 1e-5 and row["rows_differ"] > 0
  rows = pd.read_csv(root / schema.CONTEXT_GAP_ROWS)
  assert list(rows.columns) == list(schema.CONTEXT_GAP_ROWS_COLUMNS)
  assert (rows.groupby("run").size() == 8).all()  # eval_steps x batch_size rows per run
  tests = pd.read_csv(root / analysis.TESTS).set_index("comparison")
  pair = tests.loc["attention - no_attention"]
  gaps = table.set_index(["arm", "seed"])["gap"]
  d = np.array([gaps["attention", s] - gaps["no_attention", s] for s in (0, 1)])
  assert pair["n"] == 2 and pair["gap"] == pytest.approx(d.mean())
  # The exact permutation test, enumerated: the 4 sign patterns of the 2 seeds' differences.
  sums = [abs(a * d[0] + b * d[1]) for a in (1, -1) for b in (1, -1)]
  assert pair["p_permutation"] == pytest.approx(np.mean([x >= abs(d.sum()) - 1e-12
                                                         for x in sums]))


def test_the_per_run_table_is_its_rows_summed(tmp_path):
  # Two runs' rows written out by hand: losses per token are the sums over all rows' tokens,
  # and the tests over rows are the paired t-test and the exact sign test of the rows' means.
  rows = []
  for run, shift in (("a/seed0", 0.5), ("b/seed0", 0.0)):
    for r, (tokens, intact) in enumerate([(4, 8.0), (2, 3.0), (6, 9.0), (3, 3.3)]):
      rows.append({"run": run, "arm": run.split("/")[0], "seed": 0, "window": 2, "row": r,
                   "tokens": tokens, "loss_intact_sum": intact,
                   "loss_spliced_sum": intact + shift * tokens * (1 + r % 2)})
  with open(tmp_path / schema.CONTEXT_GAP_ROWS, "w", newline="") as f:
    writer = csv.DictWriter(f, schema.CONTEXT_GAP_ROWS_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  analysis.analyze(str(tmp_path))
  table = pd.read_csv(tmp_path / analysis.TABLE).set_index("run")
  a = table.loc["a/seed0"]
  assert a["loss_intact"] == pytest.approx(23.3 / 15)
  assert a["gap"] == pytest.approx(0.5 * (4 + 2 * 2 + 6 + 3 * 2) / 15)
  assert a["rows_worse"] == 4 and a["rows_differ"] == 4 and a["sign_p"] == pytest.approx(0.125)
  from scipy import stats as scipy_stats
  per_row = np.array([0.5, 1.0, 0.5, 1.0])  # each row's gap per token
  assert a["p"] == pytest.approx(scipy_stats.ttest_1samp(per_row, 0.0).pvalue)
  b = table.loc["b/seed0"]
  assert b["gap"] == 0.0 and b["rows_differ"] == 0 and b["sign_p"] == 1.0


def test_without_runs_or_floors_is_one_line(tmp_path):
  """--workdir (runs to measure) or --floors (the language alone, what benchmarks/
  context_language.py printed) is needed; neither is one line naming both."""
  refused = runs.run_module("normstudy.context_gap", check=False)
  assert refused.returncode == 2 and refused.stderr.strip() == (
      "error: --workdir=DIR is required (a directory of finished runs), or --floors for the "
      "language's floors")
