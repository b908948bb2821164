"""The statistics of the studies against independent computations: Fisher's exact test and
Welch's t-test against scipy's, the logistic fit against a general-purpose optimiser, the
critical learning rate's bootstrap interval against the delta method and its coverage, the masked
loss floor against brute-force enumeration, and the rule that p >= 0.05 is never a difference."""

import itertools
import math
import re

import numpy as np
import pytest
from scipy import optimize
from scipy import special
from scipy import stats as scipy_stats

from normstudy.analysis import stats
from normstudy.data import synthetic


@pytest.mark.parametrize("table", [(0, 6, 5, 9), (2, 2, 0, 2), (1, 3, 3, 3), (4, 10, 4, 10),
                                   (0, 3, 3, 3), (7, 12, 1, 12), (3, 5, 2, 9)])
def test_fisher_exact_matches_scipy(table):
  a_failed, a_runs, b_failed, b_runs = table
  expected = scipy_stats.fisher_exact([[a_failed, a_runs - a_failed],
                                       [b_failed, b_runs - b_failed]]).pvalue
  assert stats.fisher_exact(*table) == pytest.approx(expected, rel=1e-9)


def test_fisher_exact_on_the_issue_s_examples():
  # Pre-LN dying at 3e-1 in 5 of 9 runs against DeepNorm's 0 of 6; 2 of 2 against 0 of 2.
  assert stats.fisher_exact(5, 9, 0, 6) == pytest.approx(0.044, abs=5e-4)
  assert stats.fisher_exact(2, 2, 0, 2) == pytest.approx(1 / 3, rel=1e-9)


def test_welch_matches_scipy():
  rng = np.random.default_rng(3)
  for n_a, n_b in [(2, 2), (3, 3), (3, 5), (8, 4)]:
    a, b = rng.normal(0, 1, n_a), rng.normal(0.5, 2, n_b)
    t, df, p = stats.welch(a, b)
    expected = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert t == pytest.approx(expected.statistic, rel=1e-9)
    assert p == pytest.approx(expected.pvalue, rel=1e-9)
  assert math.isnan(stats.welch([1.0], [2.0, 3.0])[2])


def test_mean_interval_is_the_t_interval():
  values = np.array([3.1, 3.4, 2.9, 3.3])
  mean, low, high = stats.mean_interval(values)
  half = scipy_stats.t.ppf(0.975, 3) * values.std(ddof=1) / 2
  assert (mean, low, high) == pytest.approx((values.mean(), values.mean() - half,
                                             values.mean() + half))


def _synthetic_outcomes(rng, critical_log, slope, lrs, per_lr):
  x = np.repeat(np.log10(lrs), per_lr)
  y = (rng.random(len(x)) < special.expit(slope * (x - critical_log))).astype(int)
  return x, y


def _scipy_fit(x, y):
  """The logistic MLE by a general-purpose optimiser (Nelder-Mead, then BFGS)."""
  def nll(params):
    z = params[0] + params[1] * x
    return -np.sum(y * z - np.logaddexp(0, z))
  start = optimize.minimize(nll, [0.0, 1.0], method="Nelder-Mead").x
  return optimize.minimize(nll, start, method="BFGS").x


def test_logistic_fit_and_critical_lr_match_an_independent_fit():
  rng = np.random.default_rng(0)
  lrs = 10 ** np.arange(-2, 0.26, 0.25)
  x, y = _synthetic_outcomes(rng, critical_log=-1.0, slope=3.0, lrs=lrs, per_lr=20)
  fit = stats.fit_logistic(x, y)
  a, b = _scipy_fit(x, y)
  assert fit.critical_log_lr == pytest.approx(-a / b, abs=1e-4)
  assert fit.loglik == pytest.approx(-_nll_at(x, y, a, b), abs=1e-6)
  estimate = stats.critical_lr(10 ** x, y, samples=400)
  assert math.log10(estimate["critical_lr"]) == pytest.approx(-a / b, abs=1e-4)
  # The bootstrap interval against the delta method on the observed information.
  p = special.expit(a + b * x)
  info = np.array([[np.sum(p * (1 - p)), np.sum(p * (1 - p) * x)],
                   [np.sum(p * (1 - p) * x), np.sum(p * (1 - p) * x * x)]])
  cov = np.linalg.inv(info)
  gradient = np.array([-1 / b, a / b ** 2])
  se = math.sqrt(gradient @ cov @ gradient)
  low, high = math.log10(estimate["critical_lr_low"]), math.log10(estimate["critical_lr_high"])
  assert low == pytest.approx(-a / b - 1.96 * se, abs=0.35 * 1.96 * se)
  assert high == pytest.approx(-a / b + 1.96 * se, abs=0.35 * 1.96 * se)


def _nll_at(x, y, a, b):
  z = a + b * x
  return -np.sum(y * z - np.logaddexp(0, z))


def test_the_bootstrap_interval_covers_the_true_critical_lr():
  rng = np.random.default_rng(1)
  lrs = 10 ** np.arange(-1.5, 0.51, 0.25)
  covered = 0
  trials = 40
  for trial in range(trials):
    x, y = _synthetic_outcomes(rng, critical_log=-0.5, slope=2.5, lrs=lrs, per_lr=6)
    estimate = stats.critical_lr(10 ** x, y, samples=200, seed=trial)
    covered += estimate["critical_lr_low"] <= 10 ** -0.5 <= estimate["critical_lr_high"]
  assert covered >= 0.85 * trials  # nominal 95%; a 40-trial binomial rarely falls below 85%


def test_arms_that_never_or_always_fail_give_bounds_and_separation_a_bracket():
  lrs = np.repeat([0.01, 0.1, 1.0], 3)
  never = stats.critical_lr(lrs, np.zeros(9))
  assert math.isnan(never["critical_lr"]) and never["bound"] == "> 1 (no run failed)"
  always = stats.critical_lr(lrs, np.ones(9))
  assert always["bound"] == "< 0.01 (every run failed)"
  # Complete separation: no point estimate, the bracket the data give, said in words.
  separated = stats.critical_lr(lrs, np.array([0, 0, 0, 0, 0, 0, 1, 1, 1]))
  assert math.isnan(separated["critical_lr"])
  assert (separated["critical_lr_low"], separated["critical_lr_high"]) == pytest.approx((0.1, 1))
  assert separated["bound"] == "between 0.1 and 1 (all 3 seeds)"
  overlapping = stats.critical_lr(lrs, np.array([0, 0, 0, 0, 1, 0, 1, 1, 1]))
  assert overlapping["bound"] == "" and 0.01 < overlapping["critical_lr"] < 1.0


def test_same_curve_lrt_against_independent_fits():
  rng = np.random.default_rng(2)
  lrs = 10 ** np.arange(-2, 0.26, 0.25)
  a = _synthetic_outcomes(rng, -1.5, 3.0, lrs, 8)
  b = _synthetic_outcomes(rng, -0.5, 3.0, lrs, 8)
  statistic, p = stats.same_curve_lrt(a, b)
  pooled = _scipy_fit(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
  expected = 2 * (_nll_at(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]), *pooled)
                  - _nll_at(*a, *_scipy_fit(*a)) - _nll_at(*b, *_scipy_fit(*b)))
  assert statistic == pytest.approx(expected, rel=1e-3)
  assert p == pytest.approx(scipy_stats.chi2.sf(expected, 2), rel=1e-2) and p < 0.05


def test_a_p_value_at_or_above_alpha_is_never_called_a_difference():
  for p in (0.05, 0.19, 0.33, 1.0):
    text = stats.verdict("Welch's t-test", "2 and 2", p)
    assert text.startswith("not separated") and "different" not in text
  assert stats.verdict("Fisher's exact test", "9 and 6", 0.044).startswith("different")


def _write_sweep_runs(tmp_path, outcomes):
  """A learning-rate sweep on disk: arm -> {lr: [failed, ...]} (one run per seed)."""
  import json
  import os
  for arm, by_lr in outcomes.items():
    for lr, failures in by_lr.items():
      for seed, failed in enumerate(failures):
        directory = tmp_path / arm / f"lr{lr:g}_seed{seed}"
        os.makedirs(directory)
        info = {"label": f"{arm} | lr={lr:g}", "arm": arm, "arm_label": arm,
                "point": {"optimizer.learning_rate": lr, "train.seed": seed},
                "status": "halted" if failed else "finished", "entropy_floor": 1.9,
                "unigram_entropy": 4.0, "masked_loss_floor": 1.8}
        if failed:
          info.update(halt_step=2, halt_reason="loss scale at its minimum (0.0001)",
                      nonfinite_at="layer 0 attention scores",
                      nonfinite_site={"layer": 0, "site": "attention scores"})
        (directory / "run.json").write_text(json.dumps(info))
        (directory / "config.json").write_text(json.dumps(
            {"model": {"causal": False, "dtype": "float16"}, "optimizer": {"warmup_steps": 0}}))
        records = [{"step": 1, "loss": 5.0, "loss_scale": 128.0},
                   {"step": 2, "loss": float("nan") if failed else 4.0, "loss_scale": 128.0,
                    **({} if failed else {"eval_loss": 3.9 + 0.01 * seed})}]
        (directory / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")


@pytest.mark.slow  # the whole analysis of a 24-run sweep, every figure drawn as PNG and SVG
def test_survival_observations_state_test_n_and_p_and_claim_only_below_alpha(tmp_path):
  from normstudy import analysis
  _write_sweep_runs(tmp_path, {
      "pre_ln": {0.01: [0, 0, 0], 0.1: [0, 1, 0], 0.3: [1, 1, 1], 1.0: [1, 1, 1]},
      "deepnorm": {0.01: [0, 0, 0], 0.1: [0, 0, 0], 0.3: [0, 0, 0], 1.0: [1, 0, 1]},
  })
  outputs = analysis.analyze(str(tmp_path))
  table = __import__("pandas").read_csv(outputs["survival"])
  assert list(table.columns[:8]) == ["arm", "label", "group", "runs", "failed", "critical_lr",
                                     "critical_lr_low", "critical_lr_high"]
  tests = __import__("pandas").read_csv(outputs["survival_tests"])
  at = tests[tests.learning_rate == 0.3].iloc[0]
  assert at.p == pytest.approx(scipy_stats.fisher_exact([[3, 0], [0, 3]]).pvalue)
  text = open(outputs["observations"], encoding="utf-8").read()
  _check_claims(text)
  assert "likelihood-ratio test" in text


def _check_claims(text):
  """Every 'different'/'differ' claim carries a p below 0.05; every stated p >= 0.05 is 'not
  separated'."""
  for match in re.finditer(r"(not separated|different|differ) \(([^)]*)p = ([0-9.e+-]+)\)", text):
    p = float(match.group(3))
    if match.group(1) == "not separated":
      assert p >= stats.ALPHA, match.group(0)
    else:
      assert p < stats.ALPHA, match.group(0)
  assert "meaningful" not in text and "standard errors" not in text


def _write_speed_runs(tmp_path, finals, train=None):
  """A seed sweep on disk: arm -> final eval loss per seed; `train`: the runs' config.train."""
  import json
  import os
  for arm, values in finals.items():
    for seed, final in enumerate(values):
      directory = tmp_path / arm / f"seed{seed}"
      os.makedirs(directory)
      (directory / "run.json").write_text(json.dumps({
          "label": arm, "arm": arm, "arm_label": arm, "point": {"train.seed": seed},
          "status": "finished", "unigram_entropy": 4.0, "masked_loss_floor": 1.8}))
      (directory / "config.json").write_text(json.dumps(
          {"model": {"causal": False}, **({"train": train} if train else {})}))
      records = [{"step": 50, "loss": 3.9, "eval_loss": 3.95},
                 {"step": 100, "loss": final, "eval_loss": final}]
      (directory / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")


def test_speed_table_uses_welch_where_each_seed_had_its_own_eval_set(tmp_path):
  import pandas as pd
  from normstudy import analysis
  finals = {"pre_ln": [3.0, 3.1, 3.05], "deepnorm": [2.5, 2.6, 2.55], "post_ln": [3.02, 2.98, 3.1]}
  _write_speed_runs(tmp_path, finals)  # runs from before train.eval_seed: each seed its own
  outputs = analysis.analyze(str(tmp_path))
  table = pd.read_csv(outputs["speed"]).set_index("arm")
  # The reference is the first arm found (a sweep's first arm; here by path: deepnorm).
  assert table.loc["deepnorm", "verdict"] == "reference"
  _, p = scipy_stats.ttest_ind(finals["pre_ln"], finals["deepnorm"], equal_var=False)
  assert table.loc["pre_ln", "p"] == pytest.approx(p) and p < 0.05
  _, p = scipy_stats.ttest_ind(finals["post_ln"], finals["deepnorm"], equal_var=False)
  assert table.loc["post_ln", "p"] == pytest.approx(p)
  assert table.loc["deepnorm", "threshold"] == pytest.approx(2.9)
  assert table.loc["deepnorm", "steps_to_threshold"] == 100
  assert table.loc["pre_ln", "reached"] == 0
  assert set(table.eval_set) == {"each seed its own"}
  text = open(outputs["observations"], encoding="utf-8").read()
  _check_claims(text)
  assert "Welch's t-test, n = 3 and 3" in text and "its own eval set" in text


def test_speed_on_a_shared_eval_set_pairs_seeds_with_holm_over_the_arms(tmp_path):
  import pandas as pd
  from normstudy import analysis
  finals = {"a_ref": [3.0, 3.3, 2.9, 3.2, 3.1, 3.4],
            "b_lower": [2.8, 3.15, 2.75, 3.0, 2.95, 3.3],  # lower in every seed, small shift
            "c_mixed": [3.05, 3.25, 2.95, 3.1, 3.2, 3.35]}
  _write_speed_runs(tmp_path, finals, train={"eval_seed": 0, "eval_steps": 32,
                                             "batch_size": 16})
  outputs = analysis.analyze(str(tmp_path))
  table = pd.read_csv(outputs["speed"]).set_index("arm")
  assert set(table.eval_set) == {"shared (512 rows, eval_seed 0)"}
  ref = np.array(finals["a_ref"])
  ps, signs = [], []
  for arm in ("b_lower", "c_mixed"):
    values = np.array(finals[arm])
    assert table.loc[arm, "test"] == "paired t-test" and table.loc[arm, "n"] == "6 seeds"
    p = scipy_stats.ttest_rel(values, ref).pvalue
    assert table.loc[arm, "p"] == pytest.approx(p)
    lower = int((values < ref).sum())
    differ = int((values != ref).sum())
    sign = scipy_stats.binomtest(lower, differ, 0.5).pvalue
    assert (table.loc[arm, "sign_lower"], table.loc[arm, "sign_n"]) == (lower, differ)
    assert table.loc[arm, "sign_p"] == pytest.approx(sign)
    assert table.loc[arm, "difference"] == pytest.approx((values - ref).mean())
    ps.append(p)
    signs.append(sign)
  # Holm over the family of two, by hand: the smaller p times 2, the larger times 1, monotone.
  small, large = sorted(ps)
  expected = {small: min(1, 2 * small), large: min(1, max(2 * small, large))}
  for arm, p in zip(("b_lower", "c_mixed"), ps):
    assert table.loc[arm, "p_holm"] == pytest.approx(expected[p])
  assert table.loc["b_lower", "sign_p"] == pytest.approx(2 / 2 ** 6)
  text = open(outputs["observations"], encoding="utf-8").read()
  _check_claims(text)
  assert "Holm-adjusted p" in text and "paired by seed" in text


def test_speed_tests_every_pair_with_holm_and_an_equivalence_margin(tmp_path):
  import pandas as pd
  from normstudy import analysis
  finals = {"a_ref": [3.0, 3.3, 2.9, 3.2, 3.1, 3.4],
            "b_same": [3.02, 3.28, 2.93, 3.19, 3.12, 3.41],  # close to a: not separated
            "c_lower": [2.2, 2.5, 2.15, 2.4, 2.3, 2.6]}
  _write_speed_runs(tmp_path, finals, train={"eval_seed": 0, "eval_steps": 32,
                                             "batch_size": 16})
  outputs = analysis.analyze(str(tmp_path))
  pairs = pd.read_csv(outputs["speed_tests"]).set_index(["arm_a", "arm_b"])
  assert list(pairs.index) == [("a_ref", "b_same"), ("a_ref", "c_lower"), ("b_same", "c_lower")]
  ps = []
  for (a, b), row in pairs.iterrows():
    x, y = np.array(finals[a]), np.array(finals[b])
    assert row.p == pytest.approx(scipy_stats.ttest_rel(x, y).pvalue)
    assert row.difference == pytest.approx((x - y).mean())
    ps.append(row.p)
  assert list(pairs.p_holm) == pytest.approx(stats.holm(ps))
  same = pairs.loc[("a_ref", "b_same")]
  assert not same.separated
  d = np.array(finals["a_ref"]) - np.array(finals["b_same"])
  half = scipy_stats.t.ppf(0.95, 5) * d.std(ddof=1) / np.sqrt(6)
  assert same.equivalence_margin == pytest.approx(max(abs(d.mean() - half),
                                                      abs(d.mean() + half)))
  assert pairs.loc[("a_ref", "c_lower")].separated
  assert np.isnan(pairs.loc[("a_ref", "c_lower")].equivalence_margin)
  text = open(outputs["observations"], encoding="utf-8").read()
  _check_claims(text)
  assert "equivalent within" in text and "nats at 95%" in text


def test_sign_test_matches_scipys_binomial_test():
  rng = np.random.default_rng(0)
  for _ in range(30):
    n = int(rng.integers(1, 15))
    a, b = rng.integers(0, 3, n), rng.integers(0, 3, n)  # ties dropped
    k, m, p = stats.sign_test(a, b)
    assert (k, m) == (int((a > b).sum()), int((a != b).sum()))
    assert p == (pytest.approx(scipy_stats.binomtest(k, m, 0.5).pvalue) if m else 1.0)


def _brute_force_posteriors(transitions, tokens, mask):
  """p(x_t | visible tokens) by summing the chain's probability over every filling of the
  masked positions."""
  pi = synthetic.stationary_distribution(transitions)
  vocab, length = len(transitions), len(tokens)
  masked = np.flatnonzero(mask)
  out = np.zeros((length, vocab))
  for filling in itertools.product(range(vocab), repeat=len(masked)):
    seq = tokens.copy()
    seq[masked] = filling
    prob = pi[seq[0]] * np.prod([transitions[seq[t - 1], seq[t]] for t in range(1, length)])
    for t in masked:
      out[t, seq[t]] += prob
  return out / out.sum(axis=1, keepdims=True).clip(1e-300)


def test_masked_posteriors_and_floor_match_brute_force_on_a_tiny_chain():
  transitions = synthetic.transition_matrix(4, 2, seed=3)
  rng = np.random.default_rng(0)
  tokens = synthetic.sample_documents(transitions, 6, 7, seed=5)
  mask = rng.random(tokens.shape) < 0.4
  mask[:, 0] = True  # the row's first token (no left neighbour) and runs of masks too
  mask[:, 2:4] = True
  posterior = synthetic.masked_posteriors(transitions, tokens, mask)
  for row in range(len(tokens)):
    expected = _brute_force_posteriors(transitions, tokens[row], mask[row])
    np.testing.assert_allclose(posterior[row][mask[row]], expected[mask[row]], atol=1e-12)
  floor, _ = synthetic.masked_loss_floor(transitions, tokens, mask)
  truth = posterior[np.arange(6)[:, None], np.arange(7)[None, :], tokens]
  assert floor == pytest.approx(-np.log(truth[mask]).mean())
  pi = synthetic.stationary_distribution(transitions)
  assert synthetic.unigram_entropy(transitions) == pytest.approx(-(pi * np.log(pi)).sum())


@pytest.mark.slow  # a sweep's whole analysis
def test_a_sweep_where_no_run_died_draws_no_deaths_figure(tmp_path):
  import os
  from normstudy import analysis
  _write_sweep_runs(tmp_path, {"pre_ln": {0.01: [0, 0], 0.1: [0, 0]},
                               "deepnorm": {0.01: [0, 0], 0.1: [0, 0]}})
  outputs = analysis.analyze(str(tmp_path))
  assert "deaths_figure" not in outputs and not os.path.exists(tmp_path / "deaths.png")
  assert os.path.getsize(outputs["deaths"]) > 0  # the table still says none died


def test_an_unfinished_study_says_so_and_compares_at_a_common_step(tmp_path):
  """Issue 88, item 8: a stopped study's Pre-LN (at step 50) against DeepNorm (at 100) was called
  different by their last eval losses, with no word that the runs were unfinished. The
  observations now name the unfinished runs, and every arm is compared at step 50, the last
  evaluation all reached: the paired tests are those of the step-50 losses."""
  import json
  import pandas as pd
  from normstudy import analysis
  finals = {"a_pre": [3.0, 3.3, 2.9], "b_deep": [2.0, 2.3, 1.9]}
  _write_speed_runs(tmp_path, finals, train={"eval_seed": 0, "eval_steps": 32,
                                             "batch_size": 16, "num_steps": 100})
  at_50 = {"a_pre": [3.9, 3.95, 3.85], "b_deep": [3.91, 3.96, 3.84]}
  for arm in finals:
    for seed in range(3):
      directory = tmp_path / arm / f"seed{seed}"
      records = [{"step": 50, "loss": at_50[arm][seed], "eval_loss": at_50[arm][seed]}]
      if arm == "b_deep":  # finished; a_pre stopped (preempted) at step 50
        records.append({"step": 100, "loss": finals[arm][seed], "eval_loss": finals[arm][seed]})
      else:
        info = json.loads((directory / "run.json").read_text())
        (directory / "run.json").write_text(json.dumps({**info, "status": "preempted"}))
      (directory / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
  outputs = analysis.analyze(str(tmp_path))
  text = open(outputs["observations"], encoding="utf-8").read()
  assert "## Unfinished runs" in text
  assert "3 of 6 runs stopped before their last step: a_pre/seed0 (step 50 of 100)" in text
  assert "every run is compared at step 50" in text
  pairs = pd.read_csv(outputs["speed_tests"]).iloc[0]
  x, y = np.array(at_50["a_pre"]), np.array(at_50["b_deep"])
  assert pairs.difference == pytest.approx((x - y).mean())
  assert pairs.p == pytest.approx(scipy_stats.ttest_rel(x, y).pvalue)


def test_an_arm_of_one_run_says_it_has_too_few_for_an_interval(tmp_path):
  """Issue 88, item 8: a half-finished sweep's observations said "95% CI nan to nan" for an arm
  with one evaluated run. They say the run count is too few for an interval, and keep the
  interval (the t interval of scipy, checked here) for the arm of three."""
  from normstudy import analysis
  finals = {"a_pre": [3.0, 3.3, 2.9], "b_deep": [2.0]}
  _write_speed_runs(tmp_path, finals, train={"eval_seed": 0, "eval_steps": 32,
                                             "batch_size": 16, "num_steps": 100})
  text = open(analysis.analyze(str(tmp_path))["observations"], encoding="utf-8").read()
  assert "nan" not in text
  assert "(1 run: too few for an interval)" in text
  x = np.array(finals["a_pre"])
  low, high = scipy_stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy_stats.sem(x))
  assert f"(95% CI {low:.3f} to {high:.3f}, 3 runs)" in text
