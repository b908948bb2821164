"""normstudy.experiments.search and the statistics of its report, against independent computations: the
bisection in a simulated monotone world (failure a known function of the learning rate), its
interval's coverage over simulated seeds, Holm's adjustment, the paired t-test and the
equivalence margin; and the command end to end on a tiny model, extended by more rounds."""

import json
import math
import re
import os

import numpy as np
import pytest
from scipy import stats as scipy_stats

from normstudy import errors
from normstudy.analysis import critical_lr
from normstudy.analysis import transition
from normstudy.analysis import stats
from normstudy.experiments import search
import runs


def world(thresholds):
  """A stand-in program per point: a run fails exactly when its learning rate reaches the
  point's threshold."""
  def train_round(k, todo):
    del k
    return {p: {v: v >= thresholds[p] for v in values} for p, values in todo.items()}
  return train_round


@pytest.mark.parametrize("true", [0.0123, 0.3, 0.99, 1.7, 42.0])
def test_the_search_brackets_a_known_threshold(true):
  spec = search.Search.parse("optimizer.learning_rate:0.1,1", 6)
  history = search.run(spec, ["p"], world({"p": true}))["p"]
  final = history[-1]
  assert final.established and final.low < true <= final.high
  widenings = final.widenings
  assert widenings == (0 if 0.1 < true <= 1 else 1 if 0.01 < true <= 10 else 2)
  # Each bisection round halves the bracket in log space.
  bisections = spec.rounds - 1 - widenings
  width = math.log10(final.high / final.low)
  assert width == pytest.approx(1.0 / 2 ** bisections, rel=1e-4)
  assert len(history) == spec.rounds


def test_a_threshold_beyond_every_widening_is_reported_beyond():
  spec = search.Search.parse("optimizer.learning_rate:0.1,1", 5)
  final = search.run(spec, ["p"], world({"p": 1e6}))["p"][-1]
  assert search.gave_up(final) and not final.established
  assert final.low == 10.0 and final.high == 100.0  # the last bracket it tried


def test_the_interval_covers_the_true_critical_lr_at_least_90_percent_of_the_time():
  rng = np.random.default_rng(0)
  true_log, spread, seeds, trials = math.log10(0.42), 0.05, 6, 400
  spec = search.Search.parse("optimizer.learning_rate:0.1,1", 6)
  covered = 0
  for _ in range(trials):
    thresholds = {f"s{i}": 10 ** rng.normal(true_log, spread) for i in range(seeds)}
    history = search.run(spec, list(thresholds), world(thresholds))
    mids = [math.log10(h[-1].midpoint) for h in history.values()]
    _, low, high = stats.mean_interval(mids)
    covered += low <= true_log <= high
  assert covered / trials >= 0.90, covered / trials


def test_bad_search_flags_are_one_line():
  for text, message in (("optimizer.learning_rate", "is not FIELD:LOW,HIGH"),
                        ("optimizer.learning_rate:1,0.1", "allowed: 0 < LOW < HIGH"),
                        ("optimizer.learning_rate:a,b", "must be numbers")):
    with pytest.raises(errors.UserError, match=message):
      search.Search.parse(text, 3)
  with pytest.raises(errors.UserError, match=r"--rounds=0 is not allowed"):
    search.Search.parse("optimizer.learning_rate:0.1,1", 0)
  # Once refused after the plan, in Python's words, or locked against itself (issue 45).
  for text, message in (
      ("model.num_layers:1,8", "model.num_layers holds int values, which bisection cannot"),
      ("model.causal:0.1,1", "model.causal holds bool values"),
      ("train.seed:1,100", "train.seed holds int values"),
      ("model.colour:1,2", "model.colour is not a config field"),
      ("optimizer.learning_rate:0.1,0.1000001", "at most 6 significant digits")):
    with pytest.raises(errors.UserError, match=re.escape(message)):
      search.Search.parse(text, 3)
  # The last round's bracket, (HIGH / LOW)^(1 / 2^(rounds - 1)), must stay apart at 6 digits.
  most = search.max_rounds(0.1, 1)
  assert 10 ** (1 / 2 ** (most - 1)) - 1 > 1e-4 >= 10 ** (1 / 2 ** most) - 1
  search.Search.parse("optimizer.learning_rate:0.1,1", most)
  with pytest.raises(errors.UserError, match=f"--rounds={most + 1} is not allowed for "
                     r"\[0.1, 1\]; allowed: 1 to " + str(most)):
    search.Search.parse("optimizer.learning_rate:0.1,1", most + 1)


def test_holm_equals_a_hand_computation():
  ps = [0.01, 0.04, 0.03, math.nan, 0.005]
  # Sorted: 0.005 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1), made non-decreasing.
  expected = [0.03, 0.06, 0.06, math.nan, 0.02]
  got = stats.holm(ps)
  assert np.allclose(got, expected, equal_nan=True)


def test_the_stratified_exact_test_equals_enumeration():
  import itertools
  tables = [(0, 3, 3, 3), (1, 3, 2, 3), (2, 4, 1, 2)]

  def hyper(k, a_runs, b_runs, failed):
    return (math.comb(a_runs, k) * math.comb(b_runs, failed - k)
            / math.comb(a_runs + b_runs, failed))
  # Every table with the strata's margins: arm a's failures per stratum, brute force.
  ranges = [range(max(0, fa + fb - nb), min(na, fa + fb) + 1) for fa, na, fb, nb in tables]
  law = {}
  for ks in itertools.product(*ranges):
    prob = math.prod(hyper(k, na, nb, fa + fb) for k, (fa, na, fb, nb) in zip(ks, tables))
    law[sum(ks)] = law.get(sum(ks), 0.0) + prob
  seen = law[sum(t[0] for t in tables)]
  expected = sum(p for p in law.values() if p <= seen * (1 + 1e-7))
  assert stats.stratified_exact(tables) == pytest.approx(expected)
  # One stratum is Fisher's exact test.
  assert stats.stratified_exact([(0, 3, 3, 3)]) == pytest.approx(
      scipy_stats.fisher_exact([[0, 3], [3, 0]]).pvalue)


def test_the_paired_t_test_equals_scipys():
  a = [0.1, 0.35, -0.2, 0.4, 0.05, 0.3]
  b = [0.0, 0.2, -0.1, 0.1, 0.0, 0.25]
  t, df, p = stats.paired_t(a, b)
  ref = scipy_stats.ttest_rel(a, b)
  assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue) and df == 5


def test_the_equivalence_factor_makes_both_one_sided_tests_just_reject():
  diff, se, df = 0.03, 0.02, 5
  m = stats.equivalence_factor(diff, se, df)
  margin = math.log10(m)
  # Two one-sided tests of |difference| < margin: H0 diff <= -margin and H0 diff >= margin.
  p_low = scipy_stats.t.sf((diff + margin) / se, df)
  p_high = scipy_stats.t.cdf((diff - margin) / se, df)
  assert max(p_low, p_high) == pytest.approx(stats.ALPHA, abs=1e-9)
  assert stats.equivalence_factor(diff, se, df) > 10 ** abs(diff)


def _probe_rows(arm, center, rng, n=30, slope=15.0, group=""):
  """Probes of one arm whose failures follow a logistic in log10 lr around `center`."""
  import pandas as pd
  x = rng.uniform(center - 0.5, center + 0.5, n)
  failed = rng.random(n) < 1 / (1 + np.exp(-slope * (x - center)))
  return pd.DataFrame({"run": [f"{arm}/{i}" for i in range(n)], "arm": arm, "group": group,
                       "learning_rate": 10 ** x,
                       "status": np.where(failed, "halted", "finished"),
                       "outcome": np.where(failed, "halted: loss scale", "not learning")})


def test_arms_are_compared_by_the_likelihood_ratio_with_the_exact_test_beside_it():
  import pandas as pd
  rows = []
  for arm, shift, noises in (("a", 0.0, [0.0, 0.05, -0.04, 0.01]),
                             ("b", 0.02, [0.01, 0.03, -0.05, 0.04])):
    for seed, noise in enumerate(noises):
      lr = 10 ** (-0.4 + noise + shift)
      rows.append({"arm": arm, "group": "", "seed": seed, "established": True,
                   "critical_lr": lr, "low": lr / 1.01, "high": lr * 1.01, "rounds": 5,
                   "label": arm})
  points = pd.DataFrame(rows)
  rng = np.random.default_rng(2)
  probes = pd.concat([_probe_rows("a", -0.4, rng), _probe_rows("b", -0.38, rng)])
  compared = critical_lr.tests(points, probes)
  row = compared.iloc[0]
  # No t-test on the lattice midpoints: its columns are gone.
  assert not {"t", "df", "p", "p_holm", "test"} & set(compared.columns)
  la = np.log10(points[points.arm == "a"].critical_lr)
  lb = np.log10(points[points.arm == "b"].critical_lr)
  # The exact paired permutation test beside it: every sign pattern, as scipy enumerates them.
  assert row.p_exact == pytest.approx(scipy_stats.permutation_test(
      (la.to_numpy(), lb.to_numpy()), lambda x, y: np.mean(x - y), permutation_type="samples",
      n_resamples=np.inf).pvalue)
  assert row.ratio == pytest.approx(10 ** (la.mean() - lb.mean()))
  a = critical_lr._probes(probes[probes.arm == "a"])
  b = critical_lr._probes(probes[probes.arm == "b"])
  assert row.p_lrt == pytest.approx(transition.same_center_lrt(a, b)[1])
  # Not separated by the primary test: the margin is the likelihood's two one-sided tests.
  assert not row.separated and row.p_lrt_holm >= 0.05
  assert row.equivalence_factor == pytest.approx(transition.equivalence_factor(a, b))


@pytest.mark.slow
def test_a_search_trained_whole_or_in_shares_records_its_brackets_and_continues(tmp_path):
  """One search, trained whole and, round by round, in shares apart (the same runs and bits),
  then extended by a round; one test, as both halves read the same trained search."""
  args = ("--config=configs/seed_figure.py:pre_norm_clip1",
          "--search=optimizer.learning_rate:0.001,10", "--axis=train.seed=0", "--workers=1",
          *runs.tiny_args(tmp_path / "tfds", num_steps=30, every=15))
  # Shared apart, one program per run, so round 1's two runs (one program when trained whole)
  # fall to two shares.
  in_shares = (*args, "--rounds=2", "--max_runs_per_program=1")
  workdir = tmp_path / "search"
  first = runs.run_inline("normstudy.sweep", *args, f"--workdir={workdir}", "--rounds=2")
  assert "search: optimizer.learning_rate in [0.001, 10] for each of 1 point(s), 2 round(s)" \
      in first.stdout
  sweep = runs.read_json(workdir / "sweep.json")
  brackets = sweep["search"]["points"][0]["brackets"]
  assert len(brackets) == 2 and brackets[0]["low"] == 0.001 and brackets[0]["high"] == 10
  assert [r["name"] for r in sweep["runs"]][:2] == ["lr0.001_seed0", "lr10_seed0"]
  assert all("--config.optimizer.learning_rate=" in r["command"] for r in sweep["runs"])
  table = (workdir / "critical_lr.csv").read_text().splitlines()
  assert table[0].startswith("arm,label,group,seeds,beyond,rounds,critical_lr,critical_lr_low,"
                             "critical_lr_high,spread_decades")
  # Each round's outcome, re-derived from the runs' records, gives the recorded bracket.
  status = {r["name"]: r["status"] for r in sweep["runs"]}
  assert status["lr10_seed0"] == "halted" or brackets[0]["established"] is False

  # The same search's rounds shared apart. Round 2 depends on round 1's outcomes: refused in
  # one line, nothing written.
  shared = tmp_path / "shared"
  early = runs.run_inline("normstudy.sweep", *in_shares, f"--workdir={shared}",
                          "--round=2", "--programs=1/2", check=False)
  assert early.returncode == 2 and "Traceback" not in early.stderr
  assert early.stderr.strip().splitlines()[-1] == (
      "error: --round=2: round 1 of the search has 2 run(s) not trained yet; train its shares "
      "first (--round=1 --programs=I/N)")
  assert not shared.exists()
  outputs = {}
  for round_, share in [(1, 1), (1, 2), (2, 1), (2, 2)]:
    out = runs.run_inline("normstudy.sweep", *in_shares, f"--workdir={shared}",
                          f"--round={round_}", f"--programs={share}/2").stdout
    assert not (shared / "sweep.json").exists()  # the whole search's, afterwards
    outputs[round_, share] = out.splitlines()
  assert "share 1/2 of round 1: programs 1" in outputs[1, 1]
  assert "share 2/2 of round 1: programs 2" in outputs[1, 2]
  assert outputs[1, 2][-1] == "share 2/2 of round 1: runs 1 finished" or \
      outputs[1, 2][-1] == "share 2/2 of round 1: runs 1 halted"
  assert "share 2/2 of round 2: programs none left to train" in outputs[2, 2]
  assert outputs[2, 2][-1] == "share 2/2 of round 2: nothing to train"
  last = runs.run_inline("normstudy.sweep", *in_shares, f"--workdir={shared}")
  assert "finished earlier, skipped" in last.stderr
  recorded = runs.read_json(shared / "sweep.json")
  assert recorded["search"] == sweep["search"]
  names = [r["name"] for r in sweep["runs"]]
  assert len(names) == 3 and names == [r["name"] for r in recorded["runs"]]
  for name in names:
    assert runs.trajectory(shared / name) == runs.trajectory(workdir / name), name
  assert (shared / "critical_lr.csv").read_text() == (workdir / "critical_lr.csv").read_text()

  # The whole search extended by a round: the trained runs skipped, one run more.
  mtimes = {p: os.path.getmtime(workdir / p / "metrics.jsonl") for p in status}
  more = runs.run_inline("normstudy.sweep", *args, f"--workdir={workdir}", "--rounds=3")
  assert "finished earlier, skipped" in more.stderr
  again = runs.read_json(workdir / "sweep.json")
  assert len(again["search"]["points"][0]["brackets"]) == 3
  assert again["search"]["points"][0]["brackets"][:2] == brackets
  assert len(again["runs"]) == len(sweep["runs"]) + 1
  assert all(os.path.getmtime(workdir / p / "metrics.jsonl") == t for p, t in mtimes.items())
  assert json.loads((workdir / again["runs"][-1]["name"] / "run.json").read_text())["status"]
  alone = runs.run_inline("normstudy.sweep", args[0], f"--workdir={workdir}",
                          "--axis=train.seed=0", "--rounds=3", check=False)
  assert alone.returncode == 2
  assert alone.stderr.strip().splitlines()[-1] == "error: --rounds=3 needs --search=FIELD:LOW,HIGH"
  # sweep.json says how each run ended, by the failure rule the search judged it by.
  assert all(r["outcome"] for r in again["runs"])
  assert {r["outcome"].startswith(("halted", "diverged")) for r in again["runs"]} == {True, False}
  # A search's interaction with another search of the same arms (here: itself).
  runs.run_inline("normstudy.analyze", f"--workdir={workdir}", f"--against={workdir}")
  assert (workdir / "interaction.csv").read_text().startswith("group,arm_a,arm_b,ratio,")
  no_search = runs.run_inline("normstudy.analyze", f"--workdir={workdir}",
                              f"--against={tmp_path}", check=False)
  assert no_search.returncode == 2 and no_search.stderr.strip().splitlines()[-1] == (
      f"error: --against={tmp_path} holds no search (a sweep.json with `search`, written by "
      "normstudy.sweep --search)")


@pytest.mark.parametrize("extra,message", [
    (("--search=optimizer.learning_rate:0.1,1", "--programs=1/2"),
     "--programs=1/2 with --search needs --round=K (the round to share, 1..5): a round's runs "
     "depend on the outcomes of the rounds before"),
    (("--search=optimizer.learning_rate:0.1,1", "--round=1"),
     "--round=1 needs --programs=I/N (without it the search trains every round itself)"),
    (("--search=optimizer.learning_rate:0.1,1", "--rounds=2", "--round=3", "--programs=1/2"),
     "--round=3 is not allowed; allowed: 1..2 (--rounds=2)"),
    (("--axis=train.seed=0,1", "--round=1", "--programs=1/2"),
     "--round=1 needs --search=FIELD:LOW,HIGH"),
])
def test_sharing_a_search_names_what_it_needs(tmp_path, extra, message):
  workdir = tmp_path / "never"
  result = runs.run_module("normstudy.sweep", "--config=configs/seed_figure.py:pre_norm_clip1",
                           f"--workdir={workdir}", *extra, check=False)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == f"error: {message}"
  assert not workdir.exists()


def test_the_interaction_of_two_searches_is_the_likelihood_ratio_of_one_log_ratio():
  """interaction.csv: per pair the fitted ratio in each search and the likelihood-ratio test of
  one log ratio for both (primary), the exact permutation test on the seeds' midpoints beside
  it (scipy's, by hand)."""
  import pandas as pd
  from normstudy.analysis import interaction
  rng = np.random.default_rng(7)
  means = {"fp16": {"a": -0.4, "b": -0.8, "c": -0.5}, "bf16": {"a": -0.5, "b": -0.5, "c": -0.5}}
  logs = {name: {arm: rng.normal(mean, 0.05, 6) for arm, mean in arms.items()}
          for name, arms in means.items()}

  def points(name):
    return pd.DataFrame([{"group": "", "arm": arm, "seed": seed, "established": True,
                          "critical_lr": 10 ** value}
                         for arm, values in logs[name].items()
                         for seed, value in enumerate(values)])

  probes = {name: pd.concat([_probe_rows(arm, mean, rng, n=40) for arm, mean in arms.items()])
            for name, arms in means.items()}
  table = interaction.table(points("fp16"), points("bf16"), probes["fp16"],
                            probes["bf16"]).set_index(["arm_a", "arm_b"])
  assert list(table.index) == [("a", "b"), ("a", "c"), ("b", "c")]
  assert not {"t", "df", "p", "p_holm"} & set(table.columns)
  d16 = logs["fp16"]["a"] - logs["fp16"]["b"]
  d_bf = logs["bf16"]["a"] - logs["bf16"]["b"]
  row = table.loc[("a", "b")]
  fits = {name: {arm: transition.fit(*critical_lr._probes(probes[name][probes[name].arm == arm]))
                 for arm in "ab"} for name in means}
  assert row.seeds == 6 and row.ratio == pytest.approx(
      10 ** (fits["fp16"]["a"].center - fits["fp16"]["b"].center))
  # The interaction is the ratio of the two fitted ratios, to the profile grid's step.
  assert math.log10(row.interaction) == pytest.approx(
      math.log10(row.ratio / row.other_ratio), abs=3 * transition.GRID_STEP)
  assert row.p_exact == pytest.approx(scipy_stats.permutation_test(
      (d16, d_bf), lambda x, y: np.mean(x - y), permutation_type="samples",
      n_resamples=np.inf).pvalue)
  # a/b is 0.4 decades in fp16 and 0 in bf16: an interaction; a/c is 0.1 and 0: smaller.
  assert row.p_lrt < 1e-3 and table.loc[("a", "c")].p_lrt > row.p_lrt
  ranked = sorted(table.p_lrt)
  assert table.p_lrt_holm.min() == pytest.approx(min(1.0, 3 * ranked[0]))




@pytest.mark.slow
def test_the_committed_search_re_derives_from_its_tables_byte_for_byte(tmp_path):
  """docs/survival's critical_lr.csv and critical_lr_tests.csv are what --from_tables writes from
  its critical_lr_points.csv and runs.csv: the committed numbers are reproducible without the
  runs' records."""
  import shutil
  source = os.path.join(runs.REPO, "docs", "survival")
  for name in ("critical_lr_points.csv", "runs.csv"):
    shutil.copy(os.path.join(source, name), tmp_path / name)
  result = runs.run_inline("normstudy.analyze", f"--workdir={tmp_path}", "--from_tables")
  assert "critical_lr_tests:" in result.stdout
  for name in ("critical_lr.csv", "critical_lr_tests.csv"):
    assert (tmp_path / name).read_bytes() == open(os.path.join(source, name), "rb").read(), name
  refused = runs.run_module("normstudy.analyze", f"--workdir={tmp_path / 'none'}",
                            "--from_tables", check=False)
  assert refused.returncode == 2 and "Traceback" not in refused.stderr
