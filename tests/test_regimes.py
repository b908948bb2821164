"""The analyses of the experiments in their own regimes: depth (analysis.depth) and how the runs
of a search ended (analysis.outcomes), on run directories written here, against scipy."""

import itertools
import json
import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from normstudy.analysis import outcomes_table


def _write_depth_runs(tmp_path, cells):
  """arm -> {depth: [(final eval loss or None for a halted run, update size), ...]} (a seed
  each), as a depth sweep writes them."""
  for arm, by_depth in cells.items():
    for depth, seeds in by_depth.items():
      for seed, (final, size) in enumerate(seeds):
        directory = tmp_path / arm / f"layers{depth}_seed{seed}"
        os.makedirs(directory)
        info = {"label": arm, "arm": arm, "arm_label": arm,
                "point": {"model.num_layers": depth, "train.seed": seed},
                "status": "finished" if final is not None else "halted",
                "unigram_entropy": 4.0, "masked_loss_floor": 2.0}
        (directory / "run.json").write_text(json.dumps(info))
        (directory / "config.json").write_text(json.dumps(
            {"model": {"causal": False, "dtype": "float32"}, "optimizer": {"warmup_steps": 1}}))
        # The accumulated update grows by the step's size; telemetry at step 2: what each
        # layer's norms were given (layer i: (i + 1) * size, the MLP's twice the attention's).
        norms = {f"{name}/layer_{i}": (i + 1) * size * factor for i in range(2)
                 for name, factor in (("attn_norm_input_rms", 1), ("mlp_norm_input_rms", 2))}
        records = [{"step": 1, "loss": 5.0, "lr": 0.0, "update_size": 0.0,
                    "accumulated_update": 0.0},
                   {"step": 2, "loss": 4.9, "lr": 1e-3, "update_size": size,
                    "accumulated_update": size, **norms},
                   {"step": 3, "loss": 4.8, "lr": 1e-3, "update_size": 3 * size,
                    "accumulated_update": 2.5 * size},
                   {"step": 4, "loss": 4.7, "lr": 1e-3,
                    **({"eval_loss": final} if final is not None else {})}]
        (directory / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")


@pytest.mark.slow  # the whole analysis, its figure drawn as PNG and SVG
def test_depth_analysis_counts_converged_runs_and_tests_them_exactly(tmp_path):
  from normstudy import analysis
  sizes = {"post_norm": {6: [1.0, 1.2, 0.9, 1.1], 24: [4.0, 5.0, 3.0, 4.5]},
           "deepnorm": {6: [0.5, 0.6, 0.55, 0.5], 24: [0.6, 0.7, 0.5, 0.65]}}
  finals = {"post_norm": {6: [2.5, 2.6, 4.1, 2.4], 24: [None, 4.5, 4.0, 4.2]},
            "deepnorm": {6: [2.5, 2.6, 2.7, 2.4], 24: [2.5, 2.6, 2.7, 2.8]}}
  _write_depth_runs(tmp_path, {arm: {d: list(zip(finals[arm][d], sizes[arm][d]))
                                     for d in (6, 24)} for arm in sizes})
  outputs = analysis.analyze(str(tmp_path))
  table = pd.read_csv(outputs["depth_table"]).set_index(["arm", "depth"])
  # Below the unigram entropy, 4.0: Post-LN converges in 3 of 4 at 6 layers, 0 at 24.
  assert table.loc[("post_norm", 6), "converged"] == 3
  assert table.loc[("post_norm", 24), "converged"] == 0
  assert table.loc[("deepnorm", 24), "converged"] == 4
  # A run's early update size: the mean over its steps at lr > 0 (steps 2 and 3): 2x its size.
  expected = 10 ** np.mean(np.log10(2 * np.array(sizes["post_norm"][24])))
  assert table.loc[("post_norm", 24), "update_size"] == pytest.approx(expected)
  tests = pd.read_csv(outputs["depth_tests"])
  fisher = tests[(tests.depth == "24") & (tests.test == "Fisher's exact test")].iloc[0]
  assert fisher.p == pytest.approx(scipy_stats.fisher_exact([[0, 4], [4, 0]]).pvalue)
  welch = tests[(tests.depth == "24") & tests.test.str.startswith("Welch")].iloc[0]
  assert welch.p == pytest.approx(scipy_stats.ttest_ind(
      np.log10(2 * np.array(sizes["post_norm"][24])),
      np.log10(2 * np.array(sizes["deepnorm"][24])), equal_var=False).pvalue)
  family = tests[tests.test == "Fisher's exact test"]
  ranked = np.sort(family.p.to_numpy())
  assert family.p_holm.min() == pytest.approx(min(1.0, len(ranked) * ranked[0]))
  # The first update: the size at the first step with lr > 0 (step 2), not the mean.
  first = 10 ** np.mean(np.log10(sizes["post_norm"][24]))
  assert table.loc[("post_norm", 24), "first_update_size"] == pytest.approx(first)
  # Progress: from the unigram entropy (4.0) towards the floor (2.0), over finite runs.
  assert table.loc[("deepnorm", 6), "progress"] == pytest.approx(
      np.mean([(4.0 - f) / 2.0 for f in finals["deepnorm"][6]]))
  # Deepest against shallowest per arm, paired by seed: scipy's paired t and the 2^4 signs.
  trend = tests[tests.test.str.contains("deepest") & tests.test.str.contains("first")].set_index(
      "arm_a").loc["post_norm"]
  deep, shallow = np.log10(sizes["post_norm"][24]), np.log10(sizes["post_norm"][6])
  assert trend.p == pytest.approx(scipy_stats.ttest_rel(deep, shallow).pvalue)
  d = deep - shallow
  patterns = [abs(sum(s * x for s, x in zip(signs, d))) >= abs(d.sum()) - 1e-12
              for signs in itertools.product((1, -1), repeat=len(d))]
  assert trend.p_exact == pytest.approx(np.mean(patterns))
  # The series: each recorded step's geometric mean over seeds (step 3 moved 3x step 2).
  series = pd.read_csv(outputs["depth_updates"]).set_index(["arm", "depth", "step"])
  assert series.loc[("post_norm", 24, 3), "update_size"] == pytest.approx(3 * first)
  assert ("post_norm", 24, 1) not in series.index  # lr 0: nothing moved
  assert series.loc[("post_norm", 24, 3), "accumulated_update"] == pytest.approx(2.5 * first)
  # The accumulated update at the last recorded step per run, and its trend over depth.
  assert table.loc[("post_norm", 24), "accumulated_update"] == pytest.approx(2.5 * first)
  accumulated = tests[tests.test.str.contains("accumulated")].set_index("arm_a").loc["post_norm"]
  assert accumulated.p == pytest.approx(scipy_stats.ttest_rel(
      np.log10(2.5 * np.array(sizes["post_norm"][24])),
      np.log10(2.5 * np.array(sizes["post_norm"][6]))).pvalue)
  assert accumulated.difference == pytest.approx(np.mean(deep - shallow))
  # The norm inputs per layer: geometric means over the seeds' values.
  norms = pd.read_csv(outputs["depth_norm_inputs"]).set_index(["arm", "depth", "step", "layer"])
  cell = norms.loc[("deepnorm", 6, 2, 1)]
  assert cell.mlp_norm_input_rms == pytest.approx(
      10 ** np.mean(np.log10(2 * 2 * np.array(sizes["deepnorm"][6]))))
  assert cell.attn_norm_input_rms_runs == 4
  low, high = cell.attn_norm_input_rms_low, cell.attn_norm_input_rms_high
  logs = np.log10(2 * np.array(sizes["deepnorm"][6]))
  half = scipy_stats.t.ppf(0.975, 3) * logs.std(ddof=1) / 2
  assert (low, high) == pytest.approx((10 ** (logs.mean() - half), 10 ** (logs.mean() + half)))
  assert os.path.exists(outputs["depth_figure"])
  text = open(outputs["observations"], encoding="utf-8").read()
  assert "Holm-adjusted p" in text and "0/4 converged" in text


def test_outcomes_count_every_run_that_ended_once():
  runs = pd.DataFrame([
      {"arm": "a", "arm_label": "A", "group": "", "learning_rate": lr, "outcome": kind,
       "recoveries": recoveries, "unigram_entropy": 4.0, "floor": 2.0}
      for lr, kind, recoveries in [
          (1.0, "halted: loss scale", 0), (0.9, "halted: non-finite", 0),
          (0.8, "diverged: non-finite", 1), (0.7, "diverged: loss up", 0),
          (0.6, "in trouble", 0), (0.5, "not learning", 2), (0.4, "not learning", 1),
          (0.1, "learning", 0), (0.2, "unfinished", 0)]])
  table = outcomes_table.table(runs).set_index("outcome")
  assert list(table.index) == list(outcomes_table.CLASSES)
  # Each class once, "in trouble" (ended inside a short non-finite stretch) among them; the
  # unfinished run is in no class.
  assert list(table.runs) == [1, 1, 1, 1, 1, 2, 1, 0]
  assert (table.loc["not learning", "lr_min"], table.loc["not learning", "lr_max"]) == (0.4, 0.5)
  assert table.loc["not learning", "recoveries"] == 3 and table.threshold.iloc[0] == 3.0
  text = outcomes_table.observations(table.reset_index())
  assert "learning 1 (lr 0.1-0.1)" in text and "not learning 2 (lr 0.4-0.5, 3 recoveries)" in text
