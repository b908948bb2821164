"""The ladder's learning-rate sensitivity (normstudy.analysis.ladder_sensitivity, issue 42 item 3)
against a plain transcription of Wortsman et al.'s definition, scipy's tests and an enumerated
permutation test; the ladder file that trains it; and the command that collects its rungs."""

import itertools
import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from normstudy.analysis import ladder_sensitivity
from normstudy.core.experiment import Search
from test_techniques_table import _holm
from normstudy.records import schema

LRS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
ARMS = ("pre_norm_clip1", "post_norm_deepnorm_clip1", "pre_norm_attn_relax_clip1")
SEEDS = (0, 1, 2, 3)
WIDTHS = (16, 32, 64)


def _runs(width: int, rng) -> pd.DataFrame:
  """A rung's runs.csv: a U-shaped curve per arm and seed, the largest rates failed (counted at
  the loss at init, as sensitivity.table does), one failure in the middle of the grid."""
  rows = []
  for a, arm in enumerate(ARMS):
    for seed in SEEDS:
      init = 5.5 + rng.normal(0, 0.01)
      for i, lr in enumerate(LRS):
        loss = 3.0 - 0.1 * math.log2(width) + 0.05 * a + 0.08 * (math.log10(lr) + 2.5) ** 2
        loss += rng.normal(0, 0.05)
        failed = lr >= 0.3 / (1 + a) or (arm == ARMS[2] and seed == 1 and lr == 1e-2)
        rows.append({"run": f"{arm}/seed{seed}_lr{lr:g}", "arm": arm, "arm_label": arm,
                     "learning_rate": lr, "seed": seed,
                     "status": "halted" if failed else "finished",
                     "loss_init": init, "effective_loss": init if failed else min(loss, init),
                     "unigram_entropy": 3.324})
  return pd.DataFrame(rows)


def _wortsman(losses, loss_init) -> float:
  """Wortsman et al. 2023, section 3.1, transcribed: mean over the grid of min(l, l0) minus the
  smallest of them."""
  capped = [min(loss, loss_init) for loss in losses]
  return sum(capped) / len(capped) - min(capped)


def _ladder(seed: int = 0):
  rng = np.random.default_rng(seed)
  return [({"dtype": "float16", "num_layers": 4, "d_model": w, "params": 70 * w * w}, _runs(w, rng))
          for w in WIDTHS]


def test_each_seed_is_wortsmans_sensitivity_and_a_rung_their_mean_with_a_t_interval():
  size, runs = _ladder()[1]
  rows = {r["arm"]: r for r in ladder_sensitivity.rung_rows(runs, size)}
  assert list(rows) == list(ARMS)
  for arm in ARMS:
    curve = runs[runs.arm == arm]
    init = curve.loss_init.mean()
    values = [_wortsman(curve[curve.seed == s].sort_values("learning_rate").effective_loss,
                        init) for s in SEEDS]
    row = rows[arm]
    assert row["lr_sensitivity"] == pytest.approx(np.mean(values))
    low, high = scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values),
                                       scale=scipy_stats.sem(values))
    assert (row["lr_sensitivity_low"], row["lr_sensitivity_high"]) == (
        pytest.approx(low), pytest.approx(high))
    mean_curve = curve.groupby("learning_rate").effective_loss.mean()
    assert row["best_lr"] == mean_curve.idxmin()
    assert row["best_loss"] == pytest.approx(mean_curve.min())
    assert row["failed_runs"] == int((curve.status == "halted").sum())
    assert row["seeds"] == len(SEEDS) and row["runs"] == len(LRS) * len(SEEDS)
  # A seed that missed a grid point has no curve of its own and is left out.
  short = runs.drop(runs[(runs.arm == ARMS[0]) & (runs.seed == 3) & (runs.learning_rate == 1e-2)]
                    .index)
  assert ladder_sensitivity.rung_rows(short, size)[0]["seeds"] == len(SEEDS) - 1


def test_the_tests_are_paired_t_permutation_and_slope_with_holm():
  rungs = _ladder()
  tested = ladder_sensitivity.tests([(size, ladder_sensitivity.per_seed(runs))
                                     for size, runs in rungs])
  value = {}
  for size, runs in rungs:
    for arm in ARMS:
      curve = runs[runs.arm == arm]
      for s in SEEDS:
        value[(size["d_model"], arm, s)] = _wortsman(
            curve[curve.seed == s].sort_values("learning_rate").effective_loss,
            curve.loss_init.mean())
  against = tested[tested.test == "against baseline"]
  assert len(against) == len(WIDTHS) * (len(ARMS) - 1)
  expected_p = []
  for row in against.itertuples():
    a = np.array([value[(row.d_model, row.arm, s)] for s in SEEDS])
    b = np.array([value[(row.d_model, ARMS[0], s)] for s in SEEDS])
    assert row.baseline == ARMS[0] and row.n == len(SEEDS)
    assert row.estimate == pytest.approx(np.mean(a - b))
    assert row.p == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue)
    d = a - b
    sums = [abs(sum(sign * x for sign, x in zip(signs, d)))
            for signs in itertools.product((1, -1), repeat=len(d))]
    assert row.p_permutation == pytest.approx(
        sum(s >= abs(d.sum()) * (1 - 1e-9) for s in sums) / len(sums))
    expected_p.append(row.p)
  np.testing.assert_allclose(against.p_holm, _holm(expected_p))
  # Size: the slope over the rungs' means (n = rungs), and over every seed's value beside it.
  trend = tested[tested.test == "size trend"].set_index("arm")
  x_rungs = [math.log10(70 * w * w) for w in WIDTHS]
  x_seeds = [x for x in x_rungs for _ in SEEDS]
  for arm in ARMS:
    means = [np.mean([value[(w, arm, s)] for s in SEEDS]) for w in WIDTHS]
    line = scipy_stats.linregress(x_rungs, means)
    assert trend.loc[arm, "estimate"] == pytest.approx(line.slope)
    assert trend.loc[arm, "p"] == pytest.approx(line.pvalue)
    assert trend.loc[arm, "n"] == len(WIDTHS) and trend.loc[arm, "n_seeds"] == len(x_seeds)
    y = [value[(w, arm, s)] for w in WIDTHS for s in SEEDS]
    assert trend.loc[arm, "p_seeds"] == pytest.approx(scipy_stats.linregress(x_seeds, y).pvalue)
  np.testing.assert_allclose(trend.p_holm, _holm(list(trend.p)))
  interaction = tested[tested.test == "size x arm"].set_index("arm")
  assert list(interaction.index) == list(ARMS[1:])
  d = [np.mean([value[(w, ARMS[1], s)] - value[(w, ARMS[0], s)] for s in SEEDS]) for w in WIDTHS]
  line = scipy_stats.linregress(x_rungs, d)
  assert interaction.loc[ARMS[1], "estimate"] == pytest.approx(line.slope)
  assert interaction.loc[ARMS[1], "p"] == pytest.approx(line.pvalue)


def _write_grid_rung(directory, model, runs):
  """A rung as `make ladder-sensitivity` leaves it: a grid sweep's sweep.json, one run's
  config.json and the analysis's runs.csv."""
  run = directory / runs.run.iloc[0]
  run.mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"model": model}))
  (directory / "sweep.json").write_text(json.dumps({"runs": [{"name": runs.run.iloc[0]}]}))
  runs.to_csv(directory / schema.RUN_TABLE, index=False)


def test_the_ladder_command_collects_the_grid_rungs(tmp_path):
  import runs as runs_lib
  from configs import ladder_sensitivity as config
  from normstudy.experiments import ladder_runs
  model = json.loads(config.base_config().model.to_json())
  expected = {}
  for size, table in _ladder(seed=1):
    rung = dict(model, d_model=size["d_model"], d_ff=4 * size["d_model"], num_heads=1)
    expected[size["d_model"]] = ladder_sensitivity.rung_rows(
        table, dict(size, params=ladder_runs.parameters(rung)))
    _write_grid_rung(tmp_path / "float16" / f"L4_d{size['d_model']}", rung, table)
  result = runs_lib.run_module("normstudy.ladder", f"--workdir={tmp_path}")
  assert "ladder_sensitivity:" in result.stdout and "ladder_fit" not in result.stdout
  got = pd.read_csv(tmp_path / schema.LADDER_SENSITIVITY)
  assert list(got.columns) == list(schema.LADDER_SENSITIVITY_COLUMNS)
  assert len(got) == len(WIDTHS) * len(ARMS)
  for width, rows in expected.items():
    for row in rows:
      mine = got[(got.arm == row["arm"]) & (got.d_model == width)].iloc[0]
      assert mine.lr_sensitivity == pytest.approx(row["lr_sensitivity"])
      assert mine.params == row["params"]
  tests = pd.read_csv(tmp_path / "ladder_sensitivity_tests.csv")
  assert set(tests.test) == {"against baseline", "size trend", "size x arm"}
  text = (tmp_path / "ladder_sensitivity.md").read_text()
  assert "paired t-test" in text and "exact permutation p" in text
  assert (tmp_path / "ladder_sensitivity.png").stat().st_size > 0


def test_the_sensitivity_ladder_plans_a_learning_rate_grid_per_rung():
  from configs import ladder as search_ladder
  from configs import ladder_sensitivity as config
  from normstudy.experiments import grid
  from normstudy.experiments import ladder_runs
  declared = grid.load_experiment("configs/ladder_sensitivity.py")
  rungs = ladder_runs.plan_rungs("configs/ladder_sensitivity.py", declared)
  assert [(r.dtype, r.num_layers, r.d_model) for r in rungs] == [
      ("float16", layers, width) for layers, width in config.LADDER_RUNGS]
  assert rungs[0].argv == (
      "--config=configs/ladder_sensitivity.py",
      "--axis=optimizer.learning_rate=" + ",".join(f"{lr:g}" for lr in sorted(
          config.LADDER_LEARNING_RATES)),
      "--config.model.dtype=float16", "--config.model.num_layers=4", "--config.model.d_model=16",
      "--config.model.d_ff=64", "--config.model.num_heads=1")
  # The search ladder's arms at the same rungs, trained by the recipe (a decaying schedule), not
  # the survival instrument's constant rate.
  assert config.EXPERIMENT.arms == search_ladder.EXPERIMENT.arms
  assert set(config.LADDER_RUNGS) <= set(search_ladder.LADDER_RUNGS)
  assert config.get_config("pre_norm_clip1").optimizer.schedule == "polynomial"
  assert config.EXPERIMENT.settings["train.num_steps"] == config.NUM_STEPS


@pytest.mark.parametrize("change, message", [
    ({"learning_rates": [1e-3]}, "learning_rates=[0.001] is not allowed"),
    ({"learning_rates": [1e-3, -1.0]}, "at least 2 distinct learning rates > 0"),
    ({"search": Search("optimizer.learning_rate", 0.1, 1.0, rounds=3)},
     "exactly one of search and learning_rates"),
])
def test_a_wrong_sensitivity_ladder_is_refused_in_one_line(change, message):
  import dataclasses
  from normstudy.errors import UserError
  from normstudy.experiments import grid
  from normstudy.experiments import ladder_runs
  declared = grid.load_experiment("configs/ladder_sensitivity.py")
  declared = dataclasses.replace(declared, ladder=dataclasses.replace(declared.ladder, **change))
  with pytest.raises(UserError, match=re.escape(message)):
    ladder_runs.plan_rungs("configs/ladder_sensitivity.py", declared)
