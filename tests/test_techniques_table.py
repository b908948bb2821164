"""The techniques table (normstudy.analysis.techniques_report): each technique against its baseline by
the likelihood-ratio test of one 50% point, Holm over the family, margins only where not
separated, and the costs read from the recipe sweep; checked against plain recomputations."""

import math
import os
import types

import numpy as np
import pandas as pd
import pytest

from normstudy.analysis import techniques_report
from normstudy.analysis import transition
from normstudy.records import keys


def _search(centres: dict, seeds=(0, 1, 2)):
  """(critical_lr.csv, critical_lr_points.csv, runs.csv) of a simulated search: each arm's runs
  fail above its centre but for one failure below and one survival above (a noisy transition),
  each seed's bracket straddling the centre."""
  rng = np.random.default_rng(0)
  runs, points, found = [], [], []
  for arm, centre in centres.items():
    lrs = centre * 10 ** np.linspace(-0.6, 0.6, 25)
    for i, lr in enumerate(lrs):
      failed = (lr > centre) != (i in (10, 14))  # one flip either side
      runs.append({"run": f"{arm}/{i}", "arm": arm, "learning_rate": lr,
                   "status": "halted" if failed else "finished",
                   "outcome": "failed" if failed else "alive"})
    for seed in seeds:
      mid = centre * 10 ** rng.normal(0, 0.05)
      points.append({"arm": arm, "seed": seed, "low": mid / 1.2, "high": mid * 1.2,
                     "established": True, "critical_lr": mid})
    x = np.log10([r["learning_rate"] for r in runs if r["arm"] == arm])
    y = np.array([r["status"] == "halted" for r in runs if r["arm"] == arm], dtype=float)
    fit = transition.fit(x, y)
    found.append({"arm": arm, "label": arm.upper(), "critical_lr": 10 ** fit.center,
                  "critical_lr_low": 10 ** fit.center_low,
                  "critical_lr_high": 10 ** fit.center_high})
  return pd.DataFrame(found), pd.DataFrame(points), pd.DataFrame(runs)


def _holm(ps):
  order = sorted(range(len(ps)), key=lambda i: ps[i])
  out, running = [0.0] * len(ps), 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
    out[i] = running
  return out


def test_each_technique_is_tested_against_its_baseline_with_holm_over_the_family():
  centres = {"baseline": 0.3, "wide": 1.5, "same": 0.31}
  baselines = {"wide": "baseline", "same": "baseline"}
  rows = []
  for dtype in ("float16", "float32"):
    found, points, runs = _search(centres)
    rows += techniques_report.compare_searches(found, points, runs, baselines, dtype)
  costs = pd.DataFrame({"loss_at_recipe": [3.0, 2.5, 3.1], "step_time": [1.0, 1.5, 0.9]},
                       index=["baseline", "wide", "same"])
  table = techniques_report.table(rows, costs)
  assert list(table.columns[:13]) == techniques_report.TECHNIQUE_COLUMNS
  assert len(table) == 4
  probes = {arm: (np.log10(runs[runs.arm == arm].learning_rate.to_numpy()),
                  (runs[runs.arm == arm].status == "halted").to_numpy(dtype=float))
            for arm in centres}
  raw = {}
  for arm in ("wide", "same"):
    expected_p = transition.same_center_lrt(probes[arm], probes["baseline"])[1]
    centre = transition.fit(*probes[arm]).center - transition.fit(*probes["baseline"]).center
    got = table[(table.technique == arm) & (table.dtype == "float32")].iloc[0]
    assert got.p == pytest.approx(expected_p) and got.ratio == pytest.approx(10 ** centre)
    assert got.baseline == "baseline" and got.label == arm.upper()
    raw[arm] = expected_p
  # Holm over all four rows (two techniques x two dtypes), by a plain transcription.
  family = [raw[t] for t in table.technique]
  np.testing.assert_allclose(table.p_holm, _holm(family))
  wide = table[table.technique == "wide"].iloc[0]
  same = table[table.technique == "same"].iloc[0]
  assert wide.separated and math.isnan(wide.margin)  # a margin bounds only the not separated
  assert not same.separated and same.margin > 1
  assert wide.ratio > 3 and wide.step_time_ratio == pytest.approx(1.5)
  assert same.loss_at_recipe == 3.1 and same.loss_at_recipe_baseline == 3.0
  # Rows are ranked within a dtype by the ratio, largest first.
  assert list(table.technique) == ["wide", "same", "wide", "same"]


def test_step_times_are_median_seconds_per_token_after_the_compiling_interval():
  tps = {"a/seed0": [10.0, 1000.0, 800.0, 1250.0], "a/seed1": [5.0, 500.0, 500.0, 500.0],
         "b/seed0": [7.0, 400.0, 400.0, 400.0]}
  loaded = types.SimpleNamespace(
      names=list(tps),
      series=lambda run, metric: pd.Series(tps[run] if metric == keys.TOKENS_PER_SEC else []),
      __getitem__=None)

  class Loaded(types.SimpleNamespace):
    def __getitem__(self, run):
      return types.SimpleNamespace(info=types.SimpleNamespace(arm=run.split("/")[0]))

  loaded = Loaded(names=loaded.names, series=loaded.series)
  times = techniques_report.step_times(loaded, loaded.names)
  assert times["a/seed0"] == pytest.approx(1 / 1000.0)  # median of 1/1000, 1/800, 1/1250
  speed = pd.DataFrame({"arm": ["a", "b"], "final_eval_loss": [3.0, 2.0],
                        "final_eval_loss_low": [2.9, 1.9], "final_eval_loss_high": [3.1, 2.1]})
  costs = techniques_report.recipe_costs(speed, loaded)
  assert costs.loc["a", "step_time"] == pytest.approx(np.median([1 / 1000.0, 1 / 500.0]))
  assert costs.loc["b", "loss_at_recipe"] == 2.0


def test_the_techniques_command_refuses_a_directory_without_searches(tmp_path):
  import runs
  refused = runs.run_module("normstudy.techniques", f"--workdir={tmp_path}", check=False)
  assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
  assert "holds no analysed search" in refused.stderr
  assert list(tmp_path.iterdir()) == []


def test_the_summary_has_one_row_per_technique_and_a_column_per_dtype():
  rows = []
  for dtype in ("float16", "float32"):
    found, points, runs = _search({"baseline": 0.3, "wide": 1.5})
    rows += techniques_report.compare_searches(found, points, runs, {"wide": "baseline"}, dtype)
  table = techniques_report.table(rows, None)
  wide = techniques_report.summary(table).set_index("arm").loc["wide"]
  for dtype in ("float16", "float32"):
    row = table[table.dtype == dtype].iloc[0]
    assert wide[f"ratio_{dtype}"] == row.ratio and wide[f"p_holm_{dtype}"] == row.p_holm
  assert wide.baseline == "baseline"


def test_spike_handling_pairs_runs_by_rate_and_seed_and_tests_each_measure():
  rows = []
  for arm, failed_at, spikes, final in (("baseline", [30, 40, 50], [2, 3, 1], [3.0, 3.2, 3.1]),
                                        ("skip_spikes", [35, 48, 52], [0, 1, 1],
                                         [2.9, 3.0, 3.05])):
    for seed in range(3):
      rows.append({"arm": arm, "learning_rate": 1.0, "seed": seed, "status": "halted",
                   "outcome": "halted: loss scale", "failed_at": failed_at[seed],
                   "loss_spikes": 0, "final_loss": math.nan})
      rows.append({"arm": arm, "learning_rate": 0.1, "seed": seed, "status": "finished",
                   # survived without learning: a survivor all the same
                   "outcome": "not learning" if seed == 0 else "alive",
                   "failed_at": math.nan, "loss_spikes": spikes[seed], "final_loss": final[seed]})
  rows.append({"arm": "skip_spikes", "learning_rate": 0.3, "seed": 0, "status": "finished",
               "outcome": "alive", "failed_at": math.nan, "loss_spikes": 9,
               "final_loss": 1.0})  # no partner
  runs = pd.DataFrame(rows)
  table = techniques_report.spike_table(techniques_report.spike_handling(
      runs, ["skip_spikes", "update_clip"], {"skip_spikes": "baseline",
                                             "update_clip": "baseline"}, "float16"))
  got = table.set_index("measure")
  assert list(table.technique.unique()) == ["skip_spikes"]  # update_clip has no runs
  ttf = got.loc["time to failure (step)"]
  assert ttf.pairs == 3 and ttf.difference == pytest.approx(np.mean([5, 8, 2]))
  # All three differences positive: the exact two-sided p is 2 / 2^3.
  assert ttf.p == pytest.approx(0.25)
  spikes = got.loc["loss spikes"]
  assert spikes.pairs == 6 and spikes.technique_mean == pytest.approx(2 / 6)
  assert spikes.baseline_mean == pytest.approx(6 / 6)
  final = got.loc["final loss of survivors"]
  assert final.pairs == 3 and final.difference == pytest.approx(np.mean([-0.1, -0.2, -0.05]))
  np.testing.assert_allclose(table.p_holm, _holm(list(table.p)))
  assert all(v.startswith("not separated") for v in table.verdict)


def test_runs_that_fail_are_compared_by_steps_survived_with_survivors_counted_to_their_end(
    tmp_path):
  """configs/spike_failure.py's measures: every pair's steps before failure (a survivor's are
  its steps), whether it failed, and the time to failure of pairs that both failed; checked
  against the pairs written out by hand and the permutation p by enumeration."""
  import itertools
  import runs as runs_lib
  # (status, failed_at, steps) per seed at one rate: baseline, then update_clip.
  baseline = [("halted", 100, 104), ("halted", 150, 152), ("finished", None, 400),
              ("diverged", 300, 400)]
  clipped = [("halted", 130, 131), ("finished", None, 400), ("finished", None, 400),
             ("halted", 250, 260)]
  rows = []
  for arm, runs_ in (("baseline", baseline), ("update_clip", clipped)):
    for seed, (status, failed_at, steps) in enumerate(runs_):
      rows.append({"arm": arm, "learning_rate": 0.05, "seed": seed, "dtype": "float16",
                   "status": status, "outcome": "alive" if status == "finished" else status,
                   "failed_at": math.nan if failed_at is None else failed_at, "steps": steps,
                   "loss_spikes": seed, "largest_spike": 1.0, "spike_skips": 0})
  pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
  result = runs_lib.run_module("normstudy.techniques", f"--workdir={tmp_path}",
                               "--config=configs/spike_failure.py")
  assert "spike_handling:" in result.stdout
  table = pd.read_csv(tmp_path / "spike_handling.csv").set_index("measure")
  assert list(table.index) == [m for m, _, _ in techniques_report.FAILURE_MEASURES]
  lasted = table.loc["steps before failure, survivors to their end"]
  d = np.array([130 - 100, 400 - 150, 400 - 400, 250 - 300], float)
  assert lasted.pairs == 4 and lasted.difference == pytest.approx(d.mean())
  assert lasted.baseline_mean == pytest.approx(np.mean([100, 150, 400, 300]))
  sums = [abs(np.dot(signs, d)) for signs in itertools.product((1, -1), repeat=len(d))]
  assert lasted.p == pytest.approx(np.mean([x >= abs(d.sum()) * (1 - 1e-9) for x in sums]))
  share = table.loc["runs that failed (share)"]
  assert share.technique_mean == pytest.approx(2 / 4) and share.baseline_mean == pytest.approx(3 / 4)
  both = table.loc["time to failure (step)"]
  assert both.pairs == 2 and both.difference == pytest.approx(np.mean([30, -50]))
  written = (tmp_path / "spike_handling.csv").read_bytes()
  config = tmp_path / "failure.py"
  config.write_text(open(os.path.join(runs_lib.REPO, "configs", "spike_failure.py")).read()
                    .replace('measures="failure"', 'measures="fail"'))
  refused = runs_lib.run_module("normstudy.techniques", f"--workdir={tmp_path}",
                                f"--config={config}", check=False)
  assert refused.returncode != 0 and refused.stderr.strip().count("\n") == 0
  assert (tmp_path / "spike_handling.csv").read_bytes() == written  # nothing overwritten
  assert "measures='fail' is not allowed; allowed: recovery, failure" in refused.stderr


def test_a_grid_of_long_runs_gets_the_spike_handling_table_with_recovery_measures(tmp_path):
  """configs/spike_handling.py's grid (no search): normstudy.techniques writes spike_handling.csv
  alone, with the recovery measures, each an exact paired permutation test checked here by
  enumerating the sign patterns."""
  import itertools
  import runs as runs_lib
  rng = np.random.default_rng(5)
  rows = []
  for arm in ("baseline", "skip_spikes", "update_clip"):
    for lr in (3e-3, 1e-2):
      for seed in range(4):
        rows.append({"arm": arm, "learning_rate": lr, "seed": seed, "dtype": "float16",
                     "status": "finished", "outcome": "alive", "failed_at": math.nan,
                     "loss_spikes": int(rng.integers(0, 4)), "final_loss": rng.normal(2.6, .1),
                     "largest_spike": rng.uniform(0, 6), "final_eval_loss": rng.normal(2.5, .1),
                     "spike_skips": int(rng.integers(0, 3)) if arm == "skip_spikes" else 0})
  runs = pd.DataFrame(rows)
  runs.to_csv(tmp_path / "runs.csv", index=False)
  result = runs_lib.run_module("normstudy.techniques", f"--workdir={tmp_path}",
                               "--config=configs/spike_handling.py")
  assert "spike_handling:" in result.stdout
  table = pd.read_csv(tmp_path / "spike_handling.csv")
  assert set(table.measure) == {m for m, _, _ in techniques_report.RECOVERY_MEASURES}
  row = table[(table.technique == "update_clip")
              & (table.measure == "final eval loss of survivors")].iloc[0]
  mine = runs[runs.arm == "update_clip"].sort_values(["learning_rate", "seed"])
  base = runs[runs.arm == "baseline"].sort_values(["learning_rate", "seed"])
  d = mine.final_eval_loss.to_numpy() - base.final_eval_loss.to_numpy()
  assert row.pairs == 8 and row.difference == pytest.approx(d.mean())
  sums = [abs(np.dot(signs, d)) for signs in itertools.product((1, -1), repeat=len(d))]
  assert row.p == pytest.approx(np.mean([s >= abs(d.sum()) * (1 - 1e-9) for s in sums]))
  withheld = table[(table.technique == "skip_spikes")
                   & (table.measure == "updates skip-step withheld")].iloc[0]
  assert withheld.technique_mean == pytest.approx(
      runs[runs.arm == "skip_spikes"].spike_skips.mean()) and withheld.baseline_mean == 0
  assert table[table.measure == "time to failure (step)"].pairs.eq(0).all()  # nothing failed
  tested = table.p.notna()  # no pair failed, so time to failure has no p and no Holm count
  np.testing.assert_allclose(table.p_holm[tested], _holm(list(table.p[tested])))
